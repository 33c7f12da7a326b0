"""The transforms against ONNX's own references, on every platform.

Inputs and expected outputs of the backend test cases come from the
installed ``onnx`` package (its case modules generate them); the evaluator
comparisons run ``onnx.reference.ReferenceEvaluator`` on random float64
nodes. The evaluator's known deviations are verified here, so that the
suite notices when ONNX changes them.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX's references need the optional onnx package (the onnx extra)")

from onnx import helper  # noqa: E402

from onnx_optax import reference  # noqa: E402
from onnx_optax.conformance import devices  # noqa: E402
from onnx_optax.conformance import onnx_references as refs  # noqa: E402

PLATFORMS = devices.platforms()


@pytest.fixture(scope="module")
def backend():
  return refs.backend_cases()


@pytest.mark.parametrize("name", refs.BACKEND_CASES)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_onnx_backend_case(backend, platform, name):
  result = refs.run_backend_case(name, platform, backend)
  assert result.passed, (result.worst, result.where, result.error)


def test_backend_cases_come_from_onnx_with_schema_defaults(backend):
  """The Adam case omits norm_coefficient_post: the schema's default (0) applies."""
  node = backend["test_adam"].model.graph.node[0]
  assert "norm_coefficient_post" not in {a.name for a in node.attribute}
  assert refs.attributes(node)["norm_coefficient_post"] == 0.0
  (_, T, *_), _ = backend["test_adam"].data_sets[0]
  assert int(T) == 0  # ONNX's Adam case is the first update, without bias correction.


_EVALUATOR = refs.evaluator_cases()


@pytest.mark.parametrize("index", range(len(_EVALUATOR)), ids=[label for label, _, _ in _EVALUATOR])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_agrees_with_reference_evaluator(platform, index):
  if not devices.has_float64(platform):
    pytest.skip(f"{platform} has no float64; the evaluator comparison is float64")
  label, node, inputs = _EVALUATOR[index]
  result = refs.run_evaluator_case(label, node, inputs, platform)
  assert result.passed, (result.name, result.worst, result.where, result.error)


def test_evaluator_cases_are_multi_tensor_with_defaults():
  labels = [label for label, _, _ in _EVALUATOR]
  assert any("defaults,n=3" in label and "Adam" in label for label in labels)
  assert any("defaults,n=3" in label and "Adagrad" in label for label in labels)
  for _, _, (_, T, *tensors) in _EVALUATOR:
    assert int(T) > 0 and all(x.dtype == np.float64 for x in tensors)


def _adam_node(n):
  names = [f"{b}{i}" for b in "XGVH" for i in range(n)]
  outputs = [f"{x}_new" for x in names[:n] + names[2 * n :]]
  return helper.make_node("Adam", ["R", "T"] + names, outputs, domain=refs.DOMAIN), names


def test_evaluator_multi_tensor_adam_casts_float64_to_float32():
  """A known evaluator bug: its multi-tensor Adam returns float32 for float64 inputs."""
  rng = np.random.default_rng(1)
  node, names = _adam_node(2)
  tensors = [rng.uniform(0.1, 1.0, 3) for _ in names]
  outputs = refs.evaluate(node, [np.array(0.1), np.array(3, np.int64)] + tensors)
  assert all(o.dtype == np.float32 for o in outputs)
  single, _ = _adam_node(1)
  outputs = refs.evaluate(single, [np.array(0.1), np.array(3, np.int64)] + tensors[::2])
  assert all(o.dtype == np.float64 for o in outputs)  # One tensor: no cast.


def test_evaluator_adam_divides_before_multiplying():
  """The evaluator computes r_adjusted * (v_new / h_sqrt); the schema R_adjusted * V_new / H_sqrt.

  Both are within the tolerance; they differ by a rounding in some elements.
  """
  rng = np.random.default_rng(2)
  node, _ = _adam_node(1)
  X, G, V = (rng.uniform(-1, 1, 1000) for _ in range(3))
  H = rng.uniform(0.1, 1.0, 1000)
  R, T = np.array(0.1), np.array(0, np.int64)  # T = 0: R_adjusted = R, no scalar rounding.
  got = refs.evaluate(node, [R, T, X, G, V, H])[0]
  attrs = refs.attributes(node)  # Schema defaults, as the np.float32 the evaluator uses.
  a, b, eps = (np.float32(attrs[k]) for k in ("alpha", "beta", "epsilon"))
  g = np.float32(attrs["norm_coefficient"]) * X + G
  v_new = a * V + (1 - a) * g
  h_sqrt = np.sqrt(b * H + (1 - b) * (g * g)) + eps
  divide_first = X - R * (v_new / h_sqrt)
  schema_order = X - R * v_new / h_sqrt
  np.testing.assert_array_equal(got, divide_first)
  assert (got != schema_order).any()
  spec = reference.adam(R, 0, X, G, V, H, **attrs)[0]
  np.testing.assert_allclose(got, spec, rtol=0, atol=4e-16)  # A rounding or two of |X| <= 1.


def test_evaluator_gets_float_attributes_as_float32():
  """With float64 tensors, the evaluator's 1 - norm_coefficient_post is a float32 number."""
  node, _ = _adam_node(1)
  node = helper.make_node(
    "Adam", list(node.input), list(node.output), domain=refs.DOMAIN, norm_coefficient_post=0.02
  )
  X = np.array([1.0])
  zero = np.array([0.0])
  out = refs.evaluate(node, [np.array(0.0), np.array(1, np.int64), X, zero, zero, np.array([1.0])])[0]
  assert out[0] == np.float64(1 - np.float32(0.02)) * 1.0 != 1 - 0.02
