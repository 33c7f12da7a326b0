"""onnx_optax.onnx against ONNX's ReferenceEvaluator and the NumPy reference.

Expected values come from ``onnx.reference.ReferenceEvaluator`` (ONNX's own
NumPy implementation) and, where it cannot serve, from
``onnx_optax.reference``; never from this package's own output, except in
the equivalence tests (``from_node`` vs ``run_node``, jit vs eager), which
compare two paths of the package with each other.

Tolerance: element by element, the sum of two rigorous rounding-error bounds
from ``onnx_optax.conformance.tolerance``: the bound of our computation in
the tensors' dtype (``implementation_context``) plus the bound of the
evaluator's (float32: the same context, the evaluator performs the same
float32 operations or more accurate float64 ones; float64:
``evaluator_context``, which counts its float32 attribute scalars). It
covers the one known order difference: the evaluator's Adam computes
``r_adjusted * (v_new / h_sqrt)`` where the schema's text (and
``onnx_optax.rules``) reads ``R_adjusted * V_new / H_sqrt``.

Known evaluator fact handled here: its multi-tensor Adam casts every output
to float32, even for float64 inputs. Those cases are compared with
``onnx_optax.reference`` in float64 instead (tolerance: our bound plus the
reference's float64 bound), and the evaluator's float32 outputs only at
float32 accuracy.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

onnx = pytest.importorskip("onnx", reason="run_node and from_node need the onnx extra")
from onnx import NodeProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax import onnx as ox  # noqa: E402
from onnx_optax import reference  # noqa: E402
from onnx_optax.conformance import tolerance  # noqa: E402

DOMAIN = "ai.onnx.preview.training"
STATE = {"Momentum": ("V",), "Adagrad": ("H",), "Adam": ("V", "H")}
RULE = {"Momentum": "momentum", "Adagrad": "adagrad", "Adam": "adam"}
SCHEMA_DEFAULTS = {  # What the schema stores (float32 values), read from onnx below.
  op: {
    name: helper.get_attribute_value(a.default_value)
    for name, a in onnx.defs.get_schema(op, 1, DOMAIN).attributes.items()
    if a.default_value.name
  }
  for op in STATE
}


def _f32(x: float) -> float:
  """The attribute value a node stores (ONNX FLOAT attributes are float32)."""
  return float(np.float32(x))


def _attributes(op: str, mode: str, rng: np.random.Generator, omit: bool) -> dict:
  if op == "Momentum":  # All required by the schema: nothing can be omitted.
    return dict(
      alpha=_f32(rng.uniform(0, 1)),
      beta=_f32(rng.uniform(0.5, 1)),
      mode=mode,
      norm_coefficient=_f32(rng.uniform(0, 0.1)),
    )
  if omit:
    return {}
  if op == "Adagrad":
    return dict(
      decay_factor=_f32(rng.uniform(0, 0.5)),
      epsilon=_f32(10 ** rng.uniform(-7, -5)),
      norm_coefficient=_f32(rng.uniform(0, 0.1)),
    )
  return dict(
    alpha=_f32(rng.uniform(0.5, 0.99)),
    beta=_f32(rng.uniform(0.9, 0.9999)),
    epsilon=_f32(10 ** rng.uniform(-7, -5)),
    norm_coefficient=_f32(rng.uniform(0, 0.1)),
    norm_coefficient_post=_f32(rng.uniform(0, 0.1)),
  )


def _node(op: str, n: int, attributes: dict) -> NodeProto:
  blocks = ("X", "G", *STATE[op])
  inputs = ["R", "T"] + [f"{b}{i}" for b in blocks for i in range(n)]
  outputs = [f"{b}{i}_new" for b in ("X", *STATE[op]) for i in range(n)]
  return helper.make_node(op, inputs, outputs, domain=DOMAIN, **attributes)


def _inputs(op: str, n: int, T: int, dtype, scale: str, rng: np.random.Generator) -> list[np.ndarray]:
  """R, T and the blocks. ``scale="tiny"``: gradients ~1e-7, so Sqrt(H_new) ~ epsilon."""
  g = 1e-7 if scale == "tiny" else 1.0
  shapes = [(3,), (2, 2), ()][:n] if n > 1 else [(4,)]
  X = [rng.normal(size=s).astype(dtype) for s in shapes]
  G = [(g * rng.normal(size=s)).astype(dtype) for s in shapes]
  state = []
  for name in STATE[op]:
    if name == "H":  # Accumulated squares: non-negative, of the gradients' size squared.
      state.append([(g * g * rng.uniform(0, 2, size=s)).astype(dtype) for s in shapes])
    else:
      state.append([(g * rng.normal(size=s)).astype(dtype) for s in shapes])
  R = np.asarray(rng.uniform(0.01, 0.5), dtype)
  return [R, np.asarray(T, np.int64), *X, *G, *itertools.chain(*state)]


def _bounds(op: str, context, inputs: list, attributes: dict) -> list[np.ndarray]:
  """The error bound of every output, in ONNX's order."""
  R, T, *tensors = inputs
  k = 2 + len(STATE[op])
  n = len(tensors) // k
  per_tensor = [
    tolerance.bounds(
      RULE[op],
      context,
      float(R),
      int(T),
      tensors[i],
      tensors[n + i],
      [tensors[(2 + j) * n + i] for j in range(len(STATE[op]))],
      **attributes,
    )
    for i in range(n)
  ]
  return [per_tensor[i][j] for j in range(1 + len(STATE[op])) for i in range(n)]


def _assert_within(actual, expected, bounds, what: str) -> None:
  for i, (a, e, b) in enumerate(zip(actual, expected, bounds)):
    a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
    assert a64.shape == e64.shape, f"{what}: output {i} shape {a64.shape} != {e64.shape}"
    err = np.abs(a64 - e64)
    assert np.all(err <= b), (
      f"{what}: output {i} differs by {err.max()} > bound {b.flat[np.argmax(err - b)]}\n{a64}\n{e64}"
    )


def _context(dtype):
  """How our computation rounds, on the platform the tests run on (GPU division and sqrt are approximate)."""
  return tolerance.implementation_context(dtype, jax.default_backend())


def _evaluator_float32_bounds(op, inputs, full):
  """Ours on this platform plus the evaluator's: NumPy on the CPU, float32 operations or more accurate."""
  ours = _bounds(op, _context(np.float32), inputs, full)
  cpu = _bounds(op, tolerance.implementation_context(np.float32, "cpu"), inputs, full)
  return [a + b for a, b in zip(ours, cpu)]


CASES = [
  (op, mode, n, T, omit, dtype, scale)
  for op, mode in (("Momentum", "standard"), ("Momentum", "nesterov"), ("Adagrad", None), ("Adam", None))
  for n in (1, 3)
  for T in (0, 1, 1000)
  for omit in (False, True)
  for dtype in ("float32", "float64")
  for scale in ("normal", "tiny")
  if not (op == "Momentum" and omit)  # Momentum's attributes are all required.
]


@pytest.mark.parametrize("op, mode, n, T, omit, dtype, scale", CASES)
def test_run_node_agrees_with_reference_evaluator(op, mode, n, T, omit, dtype, scale):
  rng = np.random.default_rng(zlib.crc32(repr((op, mode, n, T, omit, dtype, scale)).encode()))
  attributes = _attributes(op, mode, rng, omit)
  node = _node(op, n, attributes)
  full = {**SCHEMA_DEFAULTS[op], **attributes}  # What both sides run with.
  with jax.enable_x64(dtype == "float64"):
    inputs = _inputs(op, n, T, np.dtype(dtype), scale, rng)
    ours = ox.run_node(node, *inputs)
    assert all(o.dtype == np.dtype(dtype) for o in ours), "outputs keep the tensors' dtype"
    expected = ReferenceEvaluator(node).run(None, dict(zip(node.input, inputs)))
    our_bounds = _bounds(op, _context(np.dtype(dtype)), inputs, full)
    if dtype == "float32":
      _assert_within(ours, expected, _evaluator_float32_bounds(op, inputs, full), "vs ReferenceEvaluator")
    elif op == "Adam" and n > 1:
      # The evaluator's multi-tensor Adam casts its outputs to float32
      # (checked in test_evaluator_multi_tensor_adam_casts_to_float32):
      # compare with the spec in float64, and with the evaluator to float32.
      R, T_, *tensors = inputs
      spec = [
        reference.adam(
          float(R), int(T_), tensors[i], tensors[n + i], tensors[2 * n + i], tensors[3 * n + i], **full
        )
        for i in range(n)
      ]
      spec = [spec[i][j] for j in range(3) for i in range(n)]
      ref_bounds = _bounds(op, tolerance.reference_context(), inputs, full)
      _assert_within(ours, spec, [a + b for a, b in zip(our_bounds, ref_bounds)], "vs reference")
      # Both sides rounded to float32 once (2**-24 relative each, or half the
      # smallest subnormal) on top of our float64 bound and the evaluator's.
      f32 = [np.asarray(o).astype(np.float32) for o in ours]
      ev_bounds = _bounds(op, tolerance.evaluator_context(), inputs, full)
      tiny = float(np.finfo(np.float32).smallest_subnormal)
      _assert_within(
        f32,
        expected,
        [
          2.0**-23 * np.abs(e.astype(np.float64)) + tiny + a + b
          for e, a, b in zip(expected, our_bounds, ev_bounds)
        ],
        "vs evaluator's float32",
      )
    else:
      ev_bounds = _bounds(op, tolerance.evaluator_context(), inputs, full)
      _assert_within(ours, expected, [a + b for a, b in zip(our_bounds, ev_bounds)], "vs ReferenceEvaluator")


def test_tiny_inputs_make_epsilon_matter():
  """The "tiny" cases above are ones where epsilon changes the result."""
  rng = np.random.default_rng(0)
  node = _node("Adagrad", 1, {})
  inputs = _inputs("Adagrad", 1, 1, np.float32, "tiny", rng)
  with_eps = ox.run_node(node, *inputs)[0]
  without = ox.run_node(_node("Adagrad", 1, {"epsilon": 0.0}), *inputs)[0]
  step_with, step_without = inputs[2] - np.asarray(with_eps), inputs[2] - np.asarray(without)
  assert np.all(np.abs(step_with) < 0.9 * np.abs(step_without))


def test_evaluator_multi_tensor_adam_casts_to_float32():
  """The evaluator fact the float64 Adam cases work around (onnx's op_adam.py)."""
  rng = np.random.default_rng(1)
  node = _node("Adam", 2, {})
  with jax.enable_x64(True):
    inputs = _inputs("Adam", 2, 1, np.float64, "normal", rng)
  outputs = ReferenceEvaluator(node).run(None, dict(zip(node.input, inputs)))
  assert all(o.dtype == np.float32 for o in outputs)


def test_evaluator_adam_evaluation_order():
  """The evaluator computes r_adjusted * (v_new / h_sqrt); the schema text R_adjusted * V_new / H_sqrt."""
  from onnx.reference.ops.aionnx_preview_training import op_adam

  assert "r_adjusted * (v_new / h_sqrt)" in inspect.getsource(op_adam)
  assert "R_adjusted * V_new / H_sqrt" in onnx.defs.get_schema("Adam", 1, DOMAIN).doc


def test_onnx_backend_test_cases():
  """ONNX's own expected outputs (test_adam, test_momentum_multiple...) through run_node."""
  import warnings

  from onnx.backend.test.case.node import collect_testcases

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    cases = [
      c
      for c in collect_testcases(None)
      if c.name
      in (
        "test_momentum",
        "test_nesterov_momentum",
        "test_momentum_multiple",
        "test_adagrad",
        "test_adagrad_multiple",
        "test_adam",
        "test_adam_multiple",
      )
    ]
  assert len(cases) == 7
  for case in cases:
    node = case.model.graph.node[0]
    inputs, expected = case.data_sets[0]
    outputs = ox.run_node(node, *inputs)
    for out, exp in zip(outputs, expected, strict=True):
      np.testing.assert_allclose(np.asarray(out, np.float64), exp, rtol=1e-5, atol=1e-7, err_msg=case.name)


# -- jit -------------------------------------------------------------------------------


def test_operator_calls_under_jit():
  rng = np.random.default_rng(2)
  attributes = dict(alpha=0.5, beta=0.75, epsilon=1e-6, norm_coefficient=0.01, norm_coefficient_post=0.02)
  inputs = _inputs("Adam", 2, 3, np.float32, "normal", rng)
  step = jax.jit(ox.adam, static_argnames=tuple(attributes))
  jitted = step(*inputs, **attributes)
  R, T, *tensors = inputs
  spec = [
    reference.adam(float(R), 3, tensors[i], tensors[2 + i], tensors[4 + i], tensors[6 + i], **attributes)
    for i in range(2)
  ]
  spec = [spec[i][j] for j in range(3) for i in range(2)]
  bounds = [
    a + b
    for a, b in zip(
      _bounds("Adam", _context(np.float32), inputs, attributes),
      _bounds("Adam", tolerance.reference_context(), inputs, attributes),
    )
  ]
  _assert_within(jitted, spec, bounds, "jit vs reference")


def test_run_node_under_jit_and_traced_T():
  node = _node("Momentum", 2, dict(alpha=0.9, beta=0.5, mode="nesterov", norm_coefficient=0.0))
  rng = np.random.default_rng(3)
  step = jax.jit(functools.partial(ox.run_node, node))
  for T in (0, 5):  # T is traced: one compilation, both branches of beta_adjusted.
    inputs = _inputs("Momentum", 2, T, np.float32, "normal", rng)
    ours = step(*inputs)
    expected = ReferenceEvaluator(node).run(None, dict(zip(node.input, inputs)))
    full = dict(alpha=0.9, beta=0.5, mode="nesterov", norm_coefficient=0.0)
    _assert_within(ours, expected, _evaluator_float32_bounds("Momentum", inputs, full), "jit run_node")
  assert step._cache_size() == 1


# -- from_node -------------------------------------------------------------------------


@pytest.mark.parametrize(
  "op, attributes",
  [
    ("Momentum", dict(alpha=0.9, beta=0.5, mode="standard", norm_coefficient=0.01)),
    ("Momentum", dict(alpha=0.8, beta=0.7, mode="nesterov", norm_coefficient=0.0)),
    ("Adagrad", {}),
    ("Adagrad", dict(decay_factor=0.1, epsilon=1e-7, norm_coefficient=0.05)),
    ("Adam", {}),
    ("Adam", dict(alpha=0.5, beta=0.75, epsilon=1e-5, norm_coefficient=0.05, norm_coefficient_post=0.1)),
  ],
)
def test_from_node_one_update_equals_one_node_execution(op, attributes):
  rng = np.random.default_rng(4)
  node = _node(op, 2, attributes)
  R = 0.05
  params = {
    "a": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
    "b": jnp.asarray(rng.normal(size=(2, 2)), jnp.float32),
  }
  grads = {
    "a": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
    "b": jnp.asarray(rng.normal(size=(2, 2)), jnp.float32),
  }
  opt = ox.from_node(node, R)
  updates, state = opt.update(grads, opt.init(params), params)
  new_params = optax.apply_updates(params, updates)

  zeros = [jnp.zeros_like(params[k]) for k in ("a", "b")]
  outputs = ox.run_node(
    node,
    np.float32(R),
    np.int64(0),
    params["a"],
    params["b"],
    grads["a"],
    grads["b"],
    *(zeros * len(STATE[op])),
  )
  np.testing.assert_array_equal(new_params["a"], outputs[0])
  np.testing.assert_array_equal(new_params["b"], outputs[1])
  for j, field in enumerate(state[1:]):
    np.testing.assert_array_equal(field["a"], outputs[2 + 2 * j])
    np.testing.assert_array_equal(field["b"], outputs[3 + 2 * j])
  assert int(state.count) == 1
  # And the transform is the one the issue names, with the node's attributes.
  expected = {"Momentum": onnx_optax.momentum, "Adagrad": onnx_optax.adagrad, "Adam": onnx_optax.adam}[op]
  full = {**SCHEMA_DEFAULTS[op], **attributes}
  reference_updates, _ = expected(R, **full).update(grads, expected(R, **full).init(params), params)
  jax.tree.map(np.testing.assert_array_equal, updates, reference_updates)


# -- bad input -------------------------------------------------------------------------

MOMENTUM: dict[str, Any] = dict(alpha=0.9, beta=0.5, mode="standard", norm_coefficient=0.0)


def _good(n: int = 1, op: str = "Momentum"):
  rng = np.random.default_rng(5)
  return _inputs(op, n, 1, np.float32, "normal", rng)


@pytest.mark.parametrize(
  "node, error, match",
  [
    (
      helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["Y", "W"], **MOMENTUM),
      ValueError,
      "node.domain",
    ),
    (
      helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["Y", "W"], domain="ai.onnx.ml", **MOMENTUM),
      ValueError,
      "node.domain",
    ),
    (
      helper.make_node("Adadelta", ["R", "T", "X", "G", "V"], ["Y", "W"], domain=DOMAIN),
      ValueError,
      "node.op_type",
    ),
    (
      helper.make_node(
        "Momentum", ["R", "T", "X", "G", "V"], ["Y", "W"], domain=DOMAIN, alpha=0.9, beta=0.5, mode="standard"
      ),
      ValueError,
      "requires 'norm_coefficient'",
    ),
    (
      helper.make_node(
        "Momentum", ["R", "T", "X", "G", "V"], ["Y", "W"], domain=DOMAIN, gamma=0.1, **MOMENTUM
      ),
      ValueError,
      "no attribute 'gamma'",
    ),
    (
      helper.make_node(
        "Momentum", ["R", "T", "X", "G", "V"], ["Y", "W"], domain=DOMAIN, **{**MOMENTUM, "mode": "heavy_ball"}
      ),
      ValueError,
      "mode",
    ),
    (
      helper.make_node(
        "Momentum", ["R", "T", "X", "G", "V"], ["Y", "W"], domain=DOMAIN, **{**MOMENTUM, "alpha": 1}
      ),
      TypeError,
      "'alpha' must be of type FLOAT",
    ),
    (
      helper.make_node("Momentum", ["R", "T", "X", "G"], ["Y", "W"], domain=DOMAIN, **MOMENTUM),
      ValueError,
      "node.input",
    ),
    (
      helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["Y"], domain=DOMAIN, **MOMENTUM),
      ValueError,
      "node.output",
    ),
  ],
)
def test_bad_nodes(node, error, match):
  with pytest.raises(error, match=match):
    ox.run_node(node, *_good())


def test_bad_node_for_from_node_and_opset():
  node = helper.make_node("Adam", ["R", "T", "X", "G", "V", "H"], ["Y", "V2", "H2"], domain=DOMAIN)
  with pytest.raises(TypeError, match="node must be an onnx.NodeProto"):
    ox.run_node(node.SerializeToString(), *_good(op="Adam"))
  with pytest.raises(ValueError, match="opset 2"):
    ox.run_node(node, *_good(op="Adam"), opset=2)
  assert len(ox.run_node(node, *_good(op="Adam"), opset=1)) == 3
  with pytest.raises(ValueError, match="node.domain"):
    ox.from_node(helper.make_node("Adam", ["R", "T", "X", "G", "V", "H"], ["Y", "V2", "H2"]), 0.1)
  with pytest.raises(ValueError, match="node inputs"):
    ox.from_node(helper.make_node("Adam", ["R", "T", "X", "G", "V"], ["Y", "V2"], domain=DOMAIN), 0.1)
  with pytest.raises(ValueError, match="no attribute 'decay'"):
    ox.from_node(
      helper.make_node("Adagrad", ["R", "T", "X", "G", "H"], ["Y", "H2"], domain=DOMAIN, decay=0.1), 0.1
    )


def test_bad_input_count():
  R, T, X, G, V = _good()
  for inputs in ([R, T], [R, T, X, G], [R, T, X, G, V, X]):
    with pytest.raises(ValueError, match=r"Momentum takes 2 \+ 3\*n inputs"):
      ox.momentum(*inputs, **MOMENTUM)
  R, T, *tensors = _good(op="Adam")
  with pytest.raises(ValueError, match=r"Adam takes 2 \+ 4\*n inputs"):
    ox.adam(R, T, *tensors[:3])


def test_bad_blocks():
  R, T, X1, X2, G1, G2, V1, V2 = _good(2)[:8]
  with pytest.raises(ValueError, match=r"G_1 has shape \(2, 2\) but X_1 has shape \(3,\)"):
    ox.momentum(R, T, X1, X2, G2, G1, V1, V2, **MOMENTUM)
  with pytest.raises(ValueError, match="V_2 has shape .* never broadcast"):
    ox.momentum(R, T, X1, X2, G1, G2, V1, V2[:1], **MOMENTUM)
  with pytest.raises(ValueError, match="G_1 has shape"):  # A broadcastable shape is still rejected.
    ox.momentum(R, T, X1, X2, G1[None], G2, V1, V2, **MOMENTUM)
  with pytest.raises(TypeError, match="G_1 has dtype float16 but X_1 has dtype float32"):
    ox.momentum(R, T, X1, X2, G1.astype(np.float16), G2, V1, V2, **MOMENTUM)
  with pytest.raises(TypeError, match="X_2 has dtype int32"):
    ox.momentum(R, T, X1, X2.astype(np.int32), G1, G2, V1, V2, **MOMENTUM)
  with pytest.raises(TypeError, match="V_1 must be an array"):
    ox.momentum(R, T, X1, X2, G1, G2, V1.tolist(), V2, **MOMENTUM)


def test_float64_tensors_need_x64():
  R, T, X, G, V = _good()
  with pytest.raises(TypeError, match="X_1 has dtype float64.*enable_x64"):
    ox.momentum(R, T, X.astype(np.float64), G.astype(np.float64), V.astype(np.float64), **MOMENTUM)


@pytest.mark.parametrize(
  "T, error, match",
  [
    (np.float32(1.0), TypeError, "T must be an integer scalar"),
    (1.0, TypeError, "T must be an integer scalar"),
    (True, TypeError, "T must be an integer scalar"),
    (np.array([1], np.int64), TypeError, r"T must be an integer scalar .*shape \(1,\)"),
    (np.int64(-1), ValueError, "T must be >= 0"),
    (np.array(2**40, np.int64), ValueError, "T = 1099511627776 does not fit int32.*enable_x64"),
    (2**31, ValueError, "does not fit int32"),
  ],
)
def test_bad_T(T, error, match):
  R, _, X, G, V = _good()
  with pytest.raises(error, match=match):
    ox.momentum(R, T, X, G, V, **MOMENTUM)


def test_large_T_under_x64_stays_int64():
  with jax.enable_x64(True):
    rng = np.random.default_rng(6)
    T = 2**40
    inputs = _inputs("Adagrad", 1, T, np.float64, "normal", rng)
    attributes = dict(decay_factor=1e-9, epsilon=1e-6, norm_coefficient=0.0)
    X_new, H_new = ox.adagrad(*inputs, **attributes)
    R, _, X, G, H = inputs
    X_spec, H_spec = reference.adagrad(float(R), T, X, G, H, **attributes)
    bounds = [
      a + b
      for a, b in zip(
        _bounds("Adagrad", _context(np.float64), inputs, attributes),
        _bounds("Adagrad", tolerance.reference_context(), inputs, attributes),
      )
    ]
    _assert_within([X_new, H_new], [X_spec, H_spec], bounds, "T = 2**40 under x64")
    # Truncated to int32, T would be 0 and the decay would vanish.
    assert not np.allclose(X_new, reference.adagrad(float(R), 0, X, G, H, **attributes)[0])


@pytest.mark.parametrize(
  "R, error, match",
  [
    (1, TypeError, "R must be a float scalar"),
    (np.int64(1), TypeError, "R must be a float scalar"),
    (np.array([0.1], np.float32), TypeError, r"R must be a float scalar .*shape \(1,\)"),
    ("0.1", TypeError, "R must be a float scalar"),
    (float("nan"), ValueError, "R must be finite"),
  ],
)
def test_bad_R(R, error, match):
  _, T, X, G, V = _good()
  with pytest.raises(error, match=match):
    ox.momentum(R, T, X, G, V, **MOMENTUM)


def test_bad_attributes_of_the_calls():
  R, T, X, G, V = _good()
  with pytest.raises(ValueError, match="mode must be one of"):
    ox.momentum(R, T, X, G, V, **{**MOMENTUM, "mode": "Nesterov"})
  # One check for mode wherever it is passed (the transform's, the registry's): not a str is a TypeError.
  with pytest.raises(TypeError, match="mode must be a str, one of"):
    ox.momentum(R, T, X, G, V, **{**MOMENTUM, "mode": b"standard"})
  with pytest.raises(TypeError, match="unexpected keyword argument 'gamma'"):
    ox.adagrad(R, T, X, G, V, gamma=0.1)
  with pytest.raises(TypeError, match="alpha must be a real number"):
    ox.momentum(R, T, X, G, V, **{**MOMENTUM, "alpha": "0.9"})
  with pytest.raises(ValueError, match="epsilon must be finite"):
    ox.adagrad(R, T, X, G, V, epsilon=float("inf"))


def test_errors_come_before_any_computation_under_jit():
  """Checks run at trace time: a bad call fails while tracing, before XLA runs anything."""
  R, T, X, G, V = _good()
  step = jax.jit(ox.momentum, static_argnames=tuple(MOMENTUM))
  with pytest.raises(ValueError, match="G_1 has shape"):
    step(R, T, X, G[:2], V, **MOMENTUM)
  with pytest.raises(TypeError, match="T must be an integer scalar"):
    step(R, np.float32(1), X, G, V, **MOMENTUM)


def test_directml_call_is_reexported():
  from onnx_optax import directml

  assert ox.adam_optimizer is directml.adam_optimizer
  assert "adam_optimizer" in ox.__all__


def test_operator_calls_need_jax_alone():
  """Without the onnx package the calls work; run_node says what is missing."""
  import subprocess
  import sys

  code = (
    "import sys; sys.modules['onnx'] = None\n"  # Makes `import onnx` raise ImportError.
    "import numpy as np\n"
    "from onnx_optax import onnx as ox\n"
    "X, V = ox.adagrad(np.float32(0.1), 0, np.ones(2, np.float32), np.ones(2, np.float32),\n"
    "                  np.zeros(2, np.float32), epsilon=0.0)\n"
    "assert np.allclose(X, 0.9), X\n"
    "try:\n"
    "  ox.run_node(object(), 1.0)\n"
    "except ImportError:\n"
    "  print('ok')\n"
  )
  root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
  assert result.stdout.strip() == "ok", result.stderr


def test_evaluator_single_tensor_adam_promotes_x_to_float64():
  """Another evaluator fact (the comparisons cast to float64): ours keeps float32."""
  node = _node("Adam", 1, {})
  inputs = _inputs("Adam", 1, 1, np.float32, "normal", np.random.default_rng(7))
  expected = ReferenceEvaluator(node).run(None, dict(zip(node.input, inputs)))
  assert [e.dtype for e in expected] == [np.float64, np.float32, np.float32]
  assert [o.dtype for o in ox.run_node(node, *inputs)] == [np.float32] * 3
