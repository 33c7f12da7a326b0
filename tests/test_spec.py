"""The NumPy reference and the public defaults against ONNX's own sources.

The reference (onnx_optax.reference) is the expectation of every other test,
so it is checked here against sources that share no code with it: the
expected outputs of ONNX's backend test cases for the three operators, and
the attribute defaults of the operator schemas that the `onnx` package ships.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is needed to read ONNX's test cases")
from onnx import helper  # noqa: E402
from onnx.backend.test.case.node import collect_testcases  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax import reference  # noqa: E402

DOMAIN = "ai.onnx.preview.training"
CASES = (
  "test_momentum",
  "test_nesterov_momentum",
  "test_momentum_multiple",
  "test_adagrad",
  "test_adagrad_multiple",
  "test_adam",
  "test_adam_multiple",
)
STATE_BLOCKS = {"Momentum": 1, "Adagrad": 1, "Adam": 2}


@pytest.fixture(scope="module")
def onnx_cases():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Other operators' exporters divide by zero on purpose.
    return {c.name: c for c in collect_testcases(None) if c.name in CASES}


def _attributes(node):
  schema = onnx.defs.get_schema(node.op_type, 1, DOMAIN)
  attrs = {
    name: helper.get_attribute_value(a.default_value)
    for name, a in schema.attributes.items()
    if a.default_value.name
  }
  attrs.update({a.name: helper.get_attribute_value(a) for a in node.attribute})
  return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}


@pytest.mark.parametrize("name", CASES)
def test_reference_reproduces_onnx_test_cases(onnx_cases, name):
  case = onnx_cases[name]
  node = case.model.graph.node[0]
  inputs, expected = case.data_sets[0]
  R, T, *tensors = inputs
  k = 2 + STATE_BLOCKS[node.op_type]
  n = len(tensors) // k
  blocks = [tensors[i * n : (i + 1) * n] for i in range(k)]
  rule = {"Momentum": reference.momentum, "Adagrad": reference.adagrad, "Adam": reference.adam}[node.op_type]
  outputs = [rule(R, int(T), *(b[i] for b in blocks), **_attributes(node)) for i in range(n)]
  got = [out[j] for j in range(len(outputs[0])) for out in outputs]
  assert len(got) == len(expected)
  for g, e in zip(got, expected):
    # ONNX computed its expectations in float32: a few float32 roundings.
    np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)


def _schema_defaults(op):
  schema = onnx.defs.get_schema(op, 1, DOMAIN)
  return {
    name: helper.get_attribute_value(a.default_value)
    for name, a in schema.attributes.items()
    if a.default_value.name
  }


@pytest.mark.parametrize("op,transform", [("Adagrad", onnx_optax.adagrad), ("Adam", onnx_optax.adam)])
def test_defaults_are_the_schema_defaults(op, transform):
  """Schemas store FLOAT attributes in float32; ours are the Python floats."""
  params = inspect.signature(transform).parameters
  defaults = _schema_defaults(op)
  assert defaults  # both schemas have optional attributes
  for name, value in defaults.items():
    assert np.float32(params[name].default) == np.float32(value), name


def test_momentum_attributes_are_required_as_in_the_schema():
  schema = onnx.defs.get_schema("Momentum", 1, DOMAIN)
  params = inspect.signature(onnx_optax.momentum).parameters
  assert not _schema_defaults("Momentum")
  for name, attribute in schema.attributes.items():
    assert attribute.required
    assert params[name].default is inspect.Parameter.empty, name


def test_adagrad_epsilon_follows_the_schema_not_the_seed_text():
  """The seed's text says epsilon defaults to 0.0; the schema says 1e-6."""
  assert np.float32(_schema_defaults("Adagrad")["epsilon"]) == np.float32(1e-6)
  assert inspect.signature(onnx_optax.adagrad).parameters["epsilon"].default == 1e-6


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_additive_update_of_a_multiplicative_rule_is_within_one_ulp_of_the_larger(dtype):
  """docs/spec.md, "The additive update": ``U = X_final - X`` and ``X + U`` against ``X_final``.

  To the bit where the two are within a factor of two (same sign: Sterbenz); in general
  within one ulp of ``max(|X|, |X_final|)``, which is not one rounding of
  ``X_final``: a small ``X_final`` next to a large ``X`` is off by more than
  half an ulp of itself. Sampled with JAX's own arithmetic, on 10^6 pairs.
  """
  import jax.numpy as jnp

  rng = np.random.default_rng(0)
  n = 10**6
  X = (rng.normal(size=n) * 10.0 ** rng.uniform(-2, 2, size=n)).astype(dtype)
  scale = np.where(rng.random(n) < 0.5, rng.uniform(-3, 3, size=n), 10.0 ** rng.uniform(-4, 1, size=n))
  F = (X * scale).astype(dtype)
  Y = np.asarray(jnp.asarray(X) + (jnp.asarray(F) - jnp.asarray(X)))
  finite = np.isfinite(Y) & np.isfinite(F) & (F != 0)
  X, F, Y = X[finite], F[finite].astype(np.float64), Y[finite].astype(np.float64)
  err = np.abs(Y - F)
  X64 = X.astype(np.float64)
  near = (X64 * F > 0) & (np.abs(F) <= 2 * np.abs(X64)) & (np.abs(X64) <= 2 * np.abs(F))  # same sign
  assert near.sum() > n // 10 and np.all(err[near] == 0)
  larger = np.maximum(np.abs(X.astype(np.float64)), np.abs(F)).astype(dtype)
  assert np.all(err <= np.spacing(larger).astype(np.float64))
  assert np.any(err > np.spacing(np.abs(F).astype(dtype)).astype(np.float64) / 2)  # not one rounding of F
