"""The conformance suite under pytest: every rule x dtype, on every platform JAX finds.

Each test runs every case of one rule in one dtype through the Optax
transform on one explicitly chosen device and compares it with the float64
NumPy reference in units of the tolerance model
(:mod:`onnx_optax.conformance.tolerance`).
"""

from __future__ import annotations

import pytest

from onnx_optax.conformance import cases as grid
from onnx_optax.conformance import check

PLATFORMS = check.platforms()


@pytest.mark.parametrize("dtype", grid.DTYPES)
@pytest.mark.parametrize("rule", grid.RULES)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_rule_conforms(platform, rule, dtype):
  if dtype == "float64" and not check.has_float64(platform):
    pytest.skip(f"{platform} has no float64 arithmetic; the float32, float16 and bfloat16 cases run")
  results = [check.run_case(c, platform) for c in grid.cases(rule, dtype)]
  failures = [f"{r.name}: worst {r.worst:.3g} at {r.where} {r.error}" for r in results if not r.passed]
  assert not failures, "\n".join(failures)


def test_every_platform_runs_the_same_cases():
  """The grid does not depend on the platform: same names, same inputs."""
  for rule in grid.RULES:
    for dtype in grid.DTYPES:
      names = [c.name for c in grid.cases(rule, dtype)]
      assert len(names) == len(set(names)), (rule, dtype)


def test_grid_covers_the_edges():
  names = {(c.rule, c.name) for r in grid.RULES for c in grid.cases(r, "float32")}
  for rule in ("momentum_standard", "momentum_nesterov", "adagrad", "adam"):
    for name in ("T=0", "T=1", "T=10^6", "T=int32max", "gradient=0", "gradient=huge", "pytree",
                 "scalar", "10^6 elements"):
      assert (rule, name) in names, (rule, name)
  assert ("directml_adam", "T=1") in names and ("directml_adam", "T=int32max") in names
  for rule, name in [("momentum_standard", "alpha=0"), ("momentum_standard", "beta=1"),
                     ("adam", "alpha=0"), ("adam", "beta=1"), ("adam", "epsilon=0"),
                     ("adagrad", "epsilon=0"), ("directml_adam", "epsilon=0"),
                     ("adam", "gradient~epsilon"), ("adagrad", "gradient~epsilon")]:
    assert (rule, name) in names, (rule, name)


def test_inputs_are_rounded_to_the_dtype_and_states_are_nonzero():
  case = next(c for c in grid.cases("adam", "bfloat16") if c.name == "pytree")
  X, G, (V, H) = case.inputs()
  assert all(x.dtype == grid.numpy_dtype("bfloat16") for x in X + G + V + H)
  assert all((h > 0).all() for h in H) and all((v != 0).all() for v in V)
