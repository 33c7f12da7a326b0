"""The conformance suite reads the registry: a rule registered from outside the package is checked.

A tiny rule, sign SGD (``U = -R * sign(G)``), is written here as a rule module would write it
(its two parts, its state, its transform through the engine, its :class:`~onnx_optax.registry.Rule`),
with its NumPy expectation (:func:`onnx_optax.reference.register`) and its bound model
(:func:`onnx_optax.conformance.tolerance.register_model`). Registered, and with no other edit,
the conformance grid has its cases, ``run_case`` checks them, the report and the command have
its rows, and a wrong element-wise part planted on its Rule fails them; unregistered, it is gone.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from onnx_optax import _engine, reference, registry
from onnx_optax.conformance import __main__ as cli
from onnx_optax.conformance import cases as grid
from onnx_optax.conformance import check, report, tolerance

NAME = "sign_sgd"


# -- the rule, as its module would write it ----------------------------------------------------


class SignSGDScalars(NamedTuple):
  R: Any


def sign_sgd_scalars(R, T):
  del T
  return SignSGDScalars(R)


def sign_sgd_elementwise(s, X, G):
  del X
  return (-(s.R * jnp.sign(G)),)


class SignSGDState(NamedTuple):
  count: Any


def sign_sgd(learning_rate, *, initial_count: int = 0, state_dtype: Any = None):
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, {})


RULE = registry.Rule(
  name=NAME,
  transform=sign_sgd,
  state=SignSGDState,
  fields=(),
  hyperparameters={},
  scalars=sign_sgd_scalars,
  elementwise=sign_sgd_elementwise,
  bind=lambda rule, hyper: (rule.scalars, rule.elementwise),
  minimum_count=0,
  policy=_engine.SPEC,
  conformance=registry.Conformance(
    hyper={}, tests=registry.TestConfig({}), edges=(registry.Edge("R=1", {"R": 1.0}),)
  ),
)


# -- its NumPy expectation and its bound model, written from its spec ---------------------------


def sign_sgd_expectation(R, T, X, G, *, dtype=np.float64):
  """``X_new = X - R * sign(G)``."""
  del T
  X, G, R = (np.asarray(v, dtype if dtype is not None else np.asarray(X).dtype) for v in (X, G, R))
  return (X - R * np.sign(G),)


def sign_sgd_bounds(c: tolerance.Context, R, T, X, G):
  """``R * sign(G)`` (one rounding of a product with an exact sign), then ``X - step``."""
  X, G = c.exact(X), c.exact(G)
  step = c.mul(c.rate(R), tolerance.Bounded(np.sign(G.v)))
  X_new = c.finish(X, step)
  return X_new, c.update_of(X, X_new, step)


def sign_sgd_formulas(o, R, T, h, raw):
  return {"R": R}


@pytest.fixture
def sign_sgd_registered():
  registry.register(RULE)
  reference.register(NAME, sign_sgd_expectation, state=0)
  tolerance.register_model(NAME, bounds=sign_sgd_bounds, scalars=sign_sgd_formulas)
  try:
    yield RULE
  finally:
    registry.unregister(NAME)
    reference.unregister(NAME)
    tolerance.unregister_model(NAME)


def test_a_rule_registered_from_outside_is_in_the_grid_and_passes(sign_sgd_registered):
  assert NAME in grid.names() and NAME in grid.RULES and NAME not in grid.TWINS
  assert grid.dtypes_of(NAME) == grid.DTYPES
  for dtype in ("float32", "bfloat16"):
    cases = grid.cases(NAME, dtype, large=False)
    names = [c.name for c in cases]
    narrow = f"state_dtype={grid.NARROW_STATE[dtype]}"
    assert {"pytree", "T=0", "gradient=0", "R=1", "schedule", narrow} <= set(names), names
    results = list(check.results(cases))
    assert all(r.passed for r in results), [(r.name, r.worst, r.where, r.error) for r in results]
    assert max(r.worst for r in results) > 0  # Something was compared.
  result = report.run(["cpu"], include_onnx=False, large=False, rules=[NAME], dtypes=["float32"])
  (row,) = result["rows"]
  assert (
    row["rule"] == NAME and row["passed"] and row["cases"] == len(grid.cases(NAME, "float32", large=False))
  )
  assert result["verdict"] == report.PASSED
  quiet = ["--platform", "cpu", "--rule", NAME, "--dtype", "float32", "--no-large", "--no-onnx", "--quiet"]
  assert cli.main(quiet) == cli.PASSED


def test_the_reports_grid_has_it_by_default(sign_sgd_registered, monkeypatch):
  """Every rule of the registry by default, this one with its own cases (no device needed)."""
  ran: list[str] = []

  def record(cases, platform="cpu", pinned=None):
    for case in cases:
      ran.append(case.rule)
      yield check.CaseResult(case.rule, case.dtype, case.name, platform, 0.0, "")

  monkeypatch.setattr(check, "results", record)
  result = report.run(["cpu"], include_onnx=False, large=False, pinned=True)
  rows = {(r["rule"], r["dtype"]): r["cases"] for r in result["rows"]}
  assert all(rows[(NAME, d)] == len(grid.cases(NAME, d, large=False)) for d in grid.DTYPES)
  assert ran.count(NAME) == sum(rows[(NAME, d)] for d in grid.DTYPES)


def test_a_wrong_part_planted_on_the_registered_rule_fails(sign_sgd_registered, monkeypatch):
  """``sign(G)`` replaced by ``G`` (plain SGD): the cases whose ``|G| != 1`` fail."""
  monkeypatch.setattr(sign_sgd_registered, "elementwise", lambda s, X, G: (-(s.R * G),))
  results = list(check.results(grid.cases(NAME, "float32", large=False)))
  failed = [r for r in results if not r.passed]
  assert failed and all(not r.error for r in failed) and max(r.worst for r in failed) > 1e3


def test_unregistered_it_is_gone(sign_sgd_registered):
  registry.unregister(NAME)
  try:
    assert NAME not in grid.names()
    with pytest.raises(KeyError, match="no rule named"):
      grid.cases(NAME, "float32")
  finally:
    registry.register(RULE)


def test_the_expectation_and_the_model_are_needed():
  """Registered alone, the rule's cases fail with the missing piece named, never pass unchecked."""
  registry.register(RULE)
  try:
    case = grid.cases(NAME, "float32", large=False)[0]
    with pytest.raises(KeyError, match="no NumPy expectation registered for 'sign_sgd'"):
      got_x, got_state, count, _ = check.run_transform(NAME, "float32", "cpu", 0.05, 5, {}, *case.inputs())
      check.check_outputs(case, "cpu", got_x, got_state, count)
    reference.register(NAME, sign_sgd_expectation, state=0)
    with pytest.raises(KeyError, match="no bound model registered for 'sign_sgd'"):
      check.tolerances(NAME, "float32", "cpu", 0.05, 5, *case.inputs(), {})
  finally:
    registry.unregister(NAME)
    if NAME in reference.RULES:
      reference.unregister(NAME)


def test_optax_sees_a_transform():
  """The rule's transform is an Optax transform like the package's (the engine's)."""
  registry.register(RULE)
  try:
    opt = sign_sgd(0.5)
    params = jnp.array([1.0, 2.0])
    updates, _ = opt.update(jnp.array([-3.0, 0.25]), opt.init(params))
    assert optax.apply_updates(params, updates).tolist() == [1.5, 1.5]
  finally:
    registry.unregister(NAME)
