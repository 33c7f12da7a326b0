"""The conformance suite under pytest: every rule x dtype, on every platform JAX finds.

Each test runs every case of one rule in one dtype through the Optax
transform on one explicitly chosen device and compares it with the float64
NumPy reference in units of the tolerance model
(:mod:`onnx_optax.conformance.tolerance`).
"""

from __future__ import annotations

import hashlib
import importlib

import numpy as np
import pytest

from onnx_optax import registry
from onnx_optax.conformance import cases as grid
from onnx_optax.conformance import check, devices, report, tolerance

PLATFORMS = devices.platforms()


@pytest.mark.parametrize("dtype", grid.DTYPES)
@pytest.mark.parametrize("rule", grid.RULES)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_rule_conforms(platform, rule, dtype):
  if dtype == "float64" and not devices.has_float64(platform):
    pytest.skip(f"{platform} has no float64 arithmetic; the float32, float16 and bfloat16 cases run")
  results = list(check.results(grid.cases(rule, dtype), platform))  # the row in one program, as the report
  failures = [f"{r.name}: worst {r.worst:.3g} at {r.where} {r.error}" for r in results if not r.passed]
  assert not failures, "\n".join(failures)


def _digest(arrays) -> str:
  h = hashlib.sha256()
  for a in arrays:
    h.update(str(a.dtype).encode() + str(a.shape).encode() + np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def test_every_platform_runs_the_same_cases(monkeypatch):
  """The report runs the same cases, with the same inputs, on every platform.

  The report is run for CPU, GPU and TPU with the case runner replaced by a
  recorder (no device is needed): each platform must get the same case ids in
  the same order, and each case the same input bits, whatever state NumPy's
  global generator is in; TPU runs all of them but the float64 ones, which
  the report lists as skipped with the reason.
  """
  seen: dict[str, list[tuple[str, str]]] = {}

  def record(cases, platform="cpu", pinned=None):
    for case in cases:
      np.random.seed(len(seen.get(platform, [])) + 7 * len(seen))  # Inputs must not depend on it.
      X, G, state = case.inputs()
      seen.setdefault(platform, []).append((case.id, _digest(X + G + [s for block in state for s in block])))
      yield check.CaseResult(case.rule, case.dtype, case.name, platform, 0.0, "")

  monkeypatch.setattr(check, "results", record)
  monkeypatch.setattr(report, "_device_name", lambda platform: platform)
  result = report.run(["cpu", "gpu", "tpu"], include_onnx=False, large=False, pinned=True)  # No device.
  every_rule = grid.RULES + grid.TWINS
  everything = [c.id for r in every_rule for d in grid.dtypes_of(r) for c in grid.cases(r, d, large=False)]
  assert [i for i, _ in seen["cpu"]] == everything and len(set(everything)) == len(everything)
  assert seen["gpu"] == seen["cpu"]
  assert seen["tpu"] == [(i, h) for i, h in seen["cpu"] if "-float64-" not in i]
  skipped = {(s["platform"], s["rule"], s["dtype"]) for s in result["skipped"]}
  assert skipped == {("tpu", r, "float64") for r in every_rule}
  rows = {(r["platform"], r["rule"], r["dtype"]): r["cases"] for r in result["rows"]}
  assert all(
    rows[("cpu", r, d)] == rows[("gpu", r, d)] == len(grid.cases(r, d, large=False))
    for r in every_rule
    for d in grid.dtypes_of(r)
  )


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_no_case_checks_nothing(platform):
  """No case of the grid has an element with an infinite tolerance, on any platform's model.

  An infinite tolerance checks finiteness only (issue 11: bfloat16 Adam's
  huge-gradient and zero-state cases once did). A case may have some only
  with a documented limit of its dtype (``Case.unchecked_limit``): only the
  float16 tiny-gradient cases have one, for TPUs (subnormals flushed; DirectML
  Adam and ORT AdamW mode 0 reach it), and on CPU and GPU no case has any.
  """
  limited = []
  for rule in grid.RULES + grid.TWINS:
    for dtype in grid.dtypes_of(rule):
      for case in grid.cases(rule, dtype, large=False):
        X, G, state = case.inputs()
        tols = check.tolerances(
          case.rule,
          case.dtype,
          platform,
          case.learning_rate,
          case.T,
          X,
          G,
          state,
          case.hyper,
          case.state_dtype,
        )
        if not all(np.isfinite(t).all() for leaf in tols for t in leaf):
          assert platform == "tpu" and case.unchecked_limit and "float16" in case.unchecked_limit, case.id
          limited.append(case.id)
  # ORT AdamW's mode 0 divides M2 (~1e-7 there) by its bias correction: the same limit, and so
  # do PyTorch's Adam, AdamW and RMSprop in float16 (PyTorch's float16 state: the twins' grid),
  # and centred RMSprop's state drawn tight against its bound (a variance below 6.1e-5).
  tpu = ["directml_adam-float16-gradient~epsilon", "ort_adamw_mode0-float16-gradient~epsilon"]
  tpu += [f"{r}-float16-gradient~epsilon" for r in ("pytorch_adam", "pytorch_adam_amsgrad")]
  tpu += [f"{r}-float16-gradient~epsilon" for r in ("pytorch_adamw", "pytorch_adamw_amsgrad")]
  tpu += ["pytorch_rmsprop-float16-gradient~epsilon", "pytorch_rmsprop-float16-state=tight"]
  # NAdam's first second moment through its several operations, from a zero state too.
  tpu += ["pytorch_nadam-float16-state=0,T=0", "pytorch_nadam-float16-gradient~epsilon"]
  assert sorted(limited) == ([] if platform != "tpu" else sorted(tpu))


def test_unchecked_elements_fail_a_case_unless_documented(monkeypatch):
  case = next(c for c in grid.cases("adagrad", "float32") if c.name == "odd")
  assert check.run_case(case).passed
  tolerances = check.tolerances

  def infinite_for_x(*args, **kwargs):
    return [(np.full(np.shape(t[0]), np.inf), *t[1:]) for t in tolerances(*args, **kwargs)]

  monkeypatch.setattr(check, "tolerances", infinite_for_x)
  result = check.run_case(case)
  assert result.unchecked == 13 and result.worst <= 1 and not result.passed
  documented = check.run_case(grid.replace(case, unchecked_limit="a limit of float32, for this test"))
  assert documented.unchecked == 13 and documented.passed
  table = report.format_table(
    report.run(["cpu"], include_onnx=False, large=False, rules=["adagrad"], dtypes=["float32"])
  )
  assert "elements unchecked (infinite tolerance) and no documented limit" in table and "FAILED" in table


def test_outputs_in_another_dtype_fail():
  case = next(c for c in grid.cases("adam", "bfloat16") if c.name == "state_dtype=float32")
  X, G, state = inputs = case.inputs()
  R = case.learning_rate
  want = check.expected(case.rule, R, case.T, X, G, state, case.hyper)
  # The reference's values, rounded as the transform stores them: in the right dtypes they pass.
  x = [w[0].astype(X[0].dtype) for w in want]
  v, h = ([w[k].astype(np.float32) for w in want] for k in (1, 2))
  assert check.check_outputs(case, "cpu", x, [v, h], case.T + 1, inputs).passed
  wrong = check.check_outputs(case, "cpu", x, [v, [a.astype(X[0].dtype) for a in h]], case.T + 1, inputs)
  assert not wrong.passed and wrong.wrong_dtypes == "H_new in bfloat16, expected float32"
  wrong = check.check_outputs(case, "cpu", [a.astype(np.float32) for a in x], [v, h], case.T + 1, inputs)
  assert not wrong.passed and "X_final in float32" in wrong.wrong_dtypes


@pytest.mark.parametrize(
  "module",
  [
    "arithmetic",
    "cases",
    "check",
    "devices",
    "onnx_references",
    "order",
    "report",
    "scalars",
    "tolerance",
    "__main__",
  ],
)
def test_public_names_exist(module):
  mod = importlib.import_module(f"onnx_optax.conformance.{module}")
  assert [name for name in getattr(mod, "__all__", []) if not hasattr(mod, name)] == []


def test_grid_covers_the_edges():
  names = {(c.rule, c.name) for r in grid.RULES for c in grid.cases(r, "float32")}
  for rule in ("momentum_standard", "momentum_nesterov", "adagrad", "adam"):
    for name in (
      "T=0",
      "T=1",
      "T=10^6",
      "T=int32max",
      "gradient=0",
      "gradient=huge",
      "pytree",
      "scalar",
      "10^6 elements",
    ):
      assert (rule, name) in names, (rule, name)
  assert ("directml_adam", "T=1") in names and ("directml_adam", "T=int32max") in names
  for rule, name in [
    ("momentum_standard", "alpha=0"),
    ("momentum_standard", "beta=1"),
    ("adam", "alpha=0"),
    ("adam", "beta=1"),
    ("adam", "epsilon=0"),
    ("adagrad", "epsilon=0"),
    ("directml_adam", "epsilon=0"),
    ("adam", "gradient~epsilon"),
    ("adagrad", "gradient~epsilon"),
  ]:
    assert (rule, name) in names, (rule, name)
  # The transform layer: a schedule where T is not the number of updates applied, a state
  # narrower than the parameters, in every dtype.
  for dtype in grid.DTYPES:
    by_rule = {r: {c.name: c for c in grid.cases(r, dtype)} for r in grid.RULES}
    for rule, named in by_rule.items():
      # At T (rather than at T - initial_count) the schedule would give another rate.
      assert any(
        c.schedule_steps and c.learning_rate != c.R * (1 - c.T / c.schedule_steps) for c in named.values()
      ), (rule, dtype)
      narrow = named[f"state_dtype={grid.NARROW_STATE[dtype]}"]
      assert tolerance.promote(
        grid.numpy_dtype(dtype), grid.numpy_dtype(narrow.state_dtype)
      ) != grid.numpy_dtype(narrow.state_dtype), (rule, dtype)


def test_every_declared_edge_is_a_case():
  """Each edge a rule declares is a case of the grid for at least one of its suite rules (an edge
  whose ``"only"`` matches none of the rule's variants would silently never run). Planted, ONNX
  Runtime AdamW's ``correct_bias=0,T=0`` edge restricted to ``adam_mode=2`` left every other test
  passing."""
  run = {(s.rule.name, c.name) for s in grid.suite_rules().values() for c in grid.cases(s.name, "float32")}
  for rule in registry.rules():
    assert rule.conformance is not None
    assert [e.name for e in rule.conformance.edges if (rule.name, e.name) not in run] == [], rule.name


def test_small_X_beside_large_at_every_T():
  """Every T of the grid has a case with |X| of the size of the step, beside |X| ~ 1."""
  for rule in grid.RULES:
    for dtype in grid.DTYPES:
      by_T: dict[int, set[float]] = {}
      for c in grid.cases(rule, dtype):
        by_T.setdefault(c.T, set()).add(c.x_scale)
      assert all(scales >= {1.0, grid.SMALL_X} for scales in by_T.values()), (rule, dtype, by_T)


def test_the_update_itself_is_checked():
  """A step 1e-5 too large fails on U itself (X_new unchanged); the right U passes."""
  case = next(c for c in grid.cases("adam", "float32") if c.name == "T=1")
  X, G, state = inputs = case.inputs()
  got_x, got_state, count, got_u = check.run_transform(
    case.rule, case.dtype, "cpu", case.R, case.T, case.hyper, X, G, state
  )
  assert check.check_outputs(case, "cpu", got_x, got_state, count, inputs, got_u).passed
  wrong_u = [u * np.float32(1 + 1e-5) for u in got_u]
  wrong = check.check_outputs(case, "cpu", got_x, got_state, count, inputs, wrong_u)
  assert not wrong.passed and wrong.where.startswith("U[") and wrong.worst > 2


def test_expectations_use_the_hyperparameters_as_received():
  """float32 cases: the reference gets float32(beta); float64 cases the Python float."""
  assert (
    devices.received_dtype("float32") == np.float32
    and devices.received_dtype("bfloat16", "float32") == np.float32
  )
  assert devices.received_dtype("float32", "float64") == np.float64
  # The twins' hyperparameters are PyTorch's and Keras's Python floats, in every dtype.
  assert grid.received_dtype_of("pytorch_adam", "float32") == np.float64
  assert grid.received_dtype_of("adam", "float32") == np.float32
  R, hyper = devices.received(0.05, {"beta": 0.999, "mode": "standard"}, np.float32)
  assert R == float(np.float32(0.05)) and hyper == {"beta": float(np.float32(0.999)), "mode": "standard"}


def test_inputs_are_rounded_to_the_dtype_and_states_are_nonzero():
  case = next(c for c in grid.cases("adam", "bfloat16") if c.name == "pytree")
  X, G, (V, H) = case.inputs()
  assert all(x.dtype == grid.numpy_dtype("bfloat16") for x in X + G + V + H)
  assert all((h > 0).all() for h in H) and all((v != 0).all() for v in V)
