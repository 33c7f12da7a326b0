"""``python -m onnx_optax.conformance``: the table, JSON, Markdown and exit codes."""

from __future__ import annotations

import io
import json
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

from onnx_optax import registry
from onnx_optax.conformance import __main__ as cli
from onnx_optax.conformance import cases as cases_lib
from onnx_optax.conformance import check, devices, report
from onnx_optax.conformance.cases import DTYPES
from onnx_optax.conformance.cases import names as grid_names

ADAGRAD = registry.get("adagrad")

SMALL = ["--platform", "cpu", "--rule", "adagrad", "--dtype", "float32", "--no-large", "--no-onnx", "--quiet"]


def test_report_writes_table_json_and_markdown(tmp_path, capsys):
  js, md = tmp_path / "r.json", tmp_path / "r.md"
  assert cli.main(SMALL + ["--json", str(js), "--markdown", str(md)]) == 0
  table = capsys.readouterr().out
  assert "adagrad" in table and "PASSED" in table
  report = json.loads(js.read_text())
  assert report["passed"] and report["jax"] and report["date"] and report["devices"]["cpu"]
  (row,) = report["rows"]
  assert row["rule"] == "adagrad" and row["dtype"] == "float32" and row["cases"] > 10
  assert 0 < row["worst"] <= 1
  text = md.read_text()
  assert "JAX " in text and "| cpu | adagrad | float32 |" in text


def test_report_fails_on_a_wrong_rule(monkeypatch, capsys):
  def wrong(s, X, G, H):
    U, H_new = original(s, X, G, H)
    return U * jnp.asarray(1.001, U.dtype), H_new

  original = ADAGRAD.elementwise
  monkeypatch.setattr(ADAGRAD, "elementwise", wrong)
  assert cli.main(SMALL) == 1
  out = capsys.readouterr().out
  assert "FAIL" in out
  # The summary, before the table, names the failing row.
  assert out.index("Verdict: FAILED: 1 of 1 row fails (adagrad float32") < out.index("device rule")


def test_summary_first_then_explained_columns_then_the_table(capsys):
  """What was checked, on what, the verdict and the arithmetic per dtype come first; every column
  of the table is explained before it; progress (stderr) repeats no row of the table."""
  assert cli.main(SMALL[:-1]) == 0  # Without --quiet: the progress too.
  captured = capsys.readouterr()
  out = captured.out
  order = ["Checked: ", "Verdict: PASSED: all ", "cpu arithmetic", "How to read the table", "device rule"]
  places = [out.index(text) for text in order]
  assert places == sorted(places), places
  summary = out[: out.index("How to read the table")]
  for dtype in ("float32", "float64", "float16", "bfloat16"):
    assert f"  {dtype:<9} div 0.50 sqrt 0.50 mul 0.50 add 0.50: correctly rounded" in summary
  explained = out[out.index("How to read the table") : out.index("device rule")]
  header = out[out.index("device rule") :].splitlines()[0].split()
  for column in header[4:-1]:  # worst .. order (device, rule, dtype, cases and result need no words).
    assert f"  {column} " in explained, column
  assert [name for name, _ in report.COLUMNS] == header[4:-1]
  # Progress: counts only, never a row's rule or result.
  progress = captured.err.splitlines()
  assert progress and any("cases checked" in line for line in progress)
  assert not [line for line in progress if "adagrad" in line or "worst" in line or "pass" in line]


def test_every_combination_not_run_is_named_with_its_reason(capsys):
  """A rule-and-dtype combination outside the rule's declared dtypes is listed with why."""
  assert (
    cli.main(["--rule", "keras_adam", "--dtype", "float16", "--dtype", "bfloat16", "--no-onnx", "--quiet"])
    == cli.NOTHING_CHECKED
  )
  out = capsys.readouterr().out
  assert "Not run:" in out
  assert "  keras_adam float16: Keras computes in the variable's dtype" in out
  assert "  keras_adam bfloat16: Keras computes in the variable's dtype" in out
  result = report.run(["cpu"], include_onnx=False, rules=["keras_adam"], dtypes=["bfloat16"])
  assert result["rows"] == [] and [r["rule"] for r in result["not_run"]] == ["keras_adam"]
  # Every combination the full grid leaves out has its reason, none the fallback.
  # Every combination the full grid leaves out has its reason, none the fallback: one row per suite
  # rule and dtype outside the dtypes its declaration gives (Keras's 16-bit ones, the PyTorch twins'
  # float16 among them).
  reasons = report.not_run(grid_names(), DTYPES)
  left_out = {(n, d) for n in grid_names() for d in DTYPES if d not in cases_lib.dtypes_of(n)}
  assert {(r["rule"], r["dtype"]) for r in reasons} == left_out
  assert {("keras_adam", "float16"), ("keras_adam", "bfloat16")} <= left_out
  assert all("no reason given" not in r["reason"] for r in reasons)
  # Every PyTorch twin is checked in float16 (PyTorch's own float16 state, on the CPU), and left
  # out of another dtype only with the reason its declaration gives (Adafactor's bfloat16).
  torch_twins = {r.name for r in registry.rules() if any(b.kind == "torch" for b in r.bindings)}
  assert torch_twins and not {rule for rule, dtype in left_out if dtype == "float16"} & torch_twins
  for r in reasons:
    if r["rule"] in torch_twins:
      assert r["reason"] == registry.get(r["rule"]).conformance.why_not[r["dtype"]], r


def test_a_combination_without_a_declared_reason_says_so(monkeypatch):
  monkeypatch.setattr(report, "WHY_NOT", {})
  (row,) = report.not_run(["keras_adam"], ["bfloat16"])
  assert row["reason"] == "not among the dtypes its conformance declares (float32, float64); no reason given"


def test_arithmetic_beyond_correct_rounding_is_said():
  lines = report.arithmetic_lines(
    [
      dict(op="div", dtype="bfloat16", ulp=0.5, flushes_operands=False),
      dict(op="sqrt", dtype="bfloat16", ulp=0.75, flushes_operands=True),
    ]
  )
  assert lines == [
    "bfloat16  div 0.50 sqrt 0.75: NOT correctly rounded (IEEE 754: <= 0.50; sqrt beyond; charged)",
    "subnormal operands read as 0 in bfloat16 (charged by the tolerance)",
  ]


class _Stream(io.StringIO):
  def __init__(self, terminal: bool) -> None:
    super().__init__()
    self.terminal = terminal

  def isatty(self) -> bool:
    return self.terminal


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_otherwise():
  bar = cli.Progress(_Stream(terminal=True), width=10)
  for done in (3, 7, 10):
    bar("cpu", done, 10)
  text = bar.stream.getvalue()
  assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
  assert "\rcpu [###.......] 3/10 cases" in text and "\rcpu [##########] 10/10 cases" in text
  plain = cli.Progress(_Stream(terminal=False))
  for done in range(1, 101):
    plain("cpu", done, 100)
  lines = plain.stream.getvalue().splitlines()
  assert len(lines) == 10 and "\r" not in plain.stream.getvalue()  # One line per tenth.
  assert lines[0].startswith("cpu: 10/100 cases checked") and lines[-1].startswith("cpu: 100/100 cases")


def test_missing_platform_exits_3(monkeypatch, capsys):
  monkeypatch.setattr(devices, "platforms", lambda: ["cpu"])  # Whatever this machine has.
  assert cli.main(["--platform", "tpu", "--quiet"]) == cli.NO_PLATFORM == 3
  assert "finds no" in capsys.readouterr().err


def test_module_runs_as_a_command():
  out = subprocess.run(
    [sys.executable, "-m", "onnx_optax.conformance", "--help"], capture_output=True, text=True, check=True
  ).stdout
  assert "--platform" in out and "--json" in out and "--markdown" in out


def test_nothing_checked_is_not_a_pass(monkeypatch, capsys):
  """A run whose every case is skipped (float64 on a device without it) says so and exits 4, not 0."""
  monkeypatch.setattr(devices, "has_float64", lambda platform: False)  # This CPU standing in for a TPU.
  code = cli.main(["--platform", "cpu", "--dtype", "float64", "--rule", "adagrad", "--no-large", "--quiet"])
  out = capsys.readouterr().out
  assert code == cli.NOTHING_CHECKED == 4
  assert "NOTHING CHECKED" in out and "PASSED" not in out


@pytest.mark.parametrize("flag", ["--json", "--markdown"])
@pytest.mark.parametrize("where", ["missing_dir/r.out", "."])
def test_unwritable_path_is_refused_before_the_run(monkeypatch, tmp_path, capsys, flag, where):
  def no_run(*args, **kwargs):
    raise AssertionError("the suite ran before the output paths were checked")

  monkeypatch.setattr(report, "run", no_run)
  path = str(tmp_path / where)
  assert cli.main(SMALL + [flag, path]) == cli.USAGE == 2
  err = capsys.readouterr().err
  assert flag in err and path in err and "nothing was run" in err


def test_failed_write_keeps_the_other_report_and_the_verdict(monkeypatch, tmp_path, capsys):
  def full_disk(result, path):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(report, "write_json", full_disk)
  js, md = tmp_path / "r.json", tmp_path / "r.md"
  assert cli.main(SMALL + ["--json", str(js), "--markdown", str(md)]) == cli.NOT_WRITTEN == 5
  captured = capsys.readouterr()
  assert "PASSED" in captured.out and "could not write the JSON report" in captured.err
  assert "**PASSED**" in md.read_text()


def test_a_failure_outranks_a_failed_write(monkeypatch, tmp_path):
  monkeypatch.setattr(report, "write_json", lambda result, path: (_ for _ in ()).throw(OSError("full")))
  monkeypatch.setattr(ADAGRAD, "elementwise", _wrong_adagrad(ADAGRAD.elementwise))
  assert cli.main(SMALL + ["--json", str(tmp_path / "r.json")]) == cli.FAILED


def _wrong_adagrad(original):
  def wrong(s, X, G, H):
    U, H_new = original(s, X, G, H)
    return U * jnp.asarray(1.001, U.dtype), H_new

  return wrong


def test_usage_error_exits_2(capsys):
  with pytest.raises(SystemExit) as exit_:
    cli.main(["--no-such-flag"])
  assert exit_.value.code == cli.USAGE == 2


def test_exit_codes_are_distinct_and_documented():
  """One code per outcome, each in --help and in docs/conformance.md."""
  assert sorted(cli.EXIT_CODES) == [0, 1, 2, 3, 4, 5, 6]
  codes = [
    cli.PASSED,
    cli.FAILED,
    cli.USAGE,
    cli.NO_PLATFORM,
    cli.NOTHING_CHECKED,
    cli.NOT_WRITTEN,
    cli.CRASHED,
  ]
  assert codes == list(range(7))
  out = subprocess.run(
    [sys.executable, "-m", "onnx_optax.conformance", "--help"], capture_output=True, text=True, check=True
  ).stdout
  help_text = " ".join(out.split())
  docs = (pathlib.Path(__file__).parents[2] / "docs" / "conformance.md").read_text()
  for code, what in cli.EXIT_CODES.items():
    assert f"{code}: {what}" in help_text
    assert f"| {code} |" in docs


def test_a_crash_is_not_a_failed_case(monkeypatch, capsys):
  """The run raising (a bug, a broken installation) exits 6 with the traceback, never 1 ("a case
  failed") nor a verdict."""

  def broken(*args, **kwargs):
    raise RuntimeError("planted")

  monkeypatch.setattr(report, "run", broken)
  assert cli.main(["--rule", "adagrad", "--quiet"]) == cli.CRASHED == 6
  err = capsys.readouterr()
  assert "RuntimeError: planted" in err.err and "no verdict" in err.err
  assert "PASSED" not in err.out and "FAILED" not in err.out


def test_rule_and_dtype_filter_onnx_references(monkeypatch):
  """``--rule``/``--dtype`` select ONNX's backend cases and evaluator nodes too."""
  pytest.importorskip("onnx")
  from onnx_optax.conformance import onnx_references as refs

  ran: list[tuple[str, str]] = []

  def backend(name, platform, cases):
    ran.append(("backend", name))
    return check.CaseResult("r", "float32", name, platform, 0.0, "")

  def evaluator(label, node, inputs, platform):
    ran.append(("evaluator", label))
    return check.CaseResult("r", "float64", label, platform, 0.0, "")

  monkeypatch.setattr(refs, "run_backend_case", backend)
  monkeypatch.setattr(refs, "run_evaluator_case", evaluator)
  monkeypatch.setattr(
    check,
    "run_case",
    lambda case, platform="cpu": check.CaseResult(case.rule, case.dtype, case.name, platform, 0.0, ""),
  )
  result = report.run(["cpu"], large=False, rules=["ort_sgd"], dtypes=["float16"])
  assert ran == [] and result["onnx_rows"] == [] and result["skipped"] == []
  result = report.run(["cpu"], large=False, rules=["adagrad"], dtypes=["float32"])
  assert ran == [("backend", "test_adagrad"), ("backend", "test_adagrad_multiple")]
  ran.clear()
  result = report.run(["cpu"], large=False, rules=["momentum_nesterov"], dtypes=["float64"])
  assert [kind for kind, _ in ran] == ["evaluator", "evaluator"]
  assert all("Momentum(nesterov)" in label for _, label in ran)
  assert {r["rule"] for r in result["onnx_rows"]} == {"momentum_nesterov"}


def _recorded(monkeypatch, worst: float = 0.0) -> None:
  """The grid's cases recorded with this ``worst``, nothing computed; with ``--pinned`` nothing is
  measured either."""

  def results(run_cases, platform="cpu", pinned=None):
    for case in run_cases:
      yield check.CaseResult(case.rule, case.dtype, case.name, platform, worst, "planted")

  monkeypatch.setattr(check, "results", results)


def _into(calls: list[tuple[str, int, int]]):
  return lambda *call: calls.append(call)


def test_progress_counts_what_the_verdict_counts(monkeypatch, capsys):
  """The progress total is the verdict's count: the grid's cases and ONNX's references (backend
  cases and ReferenceEvaluator nodes); those a device cannot run count in neither."""
  pytest.importorskip("onnx")
  from onnx_optax.conformance import onnx_references as refs

  _recorded(monkeypatch)
  monkeypatch.setattr(
    refs,
    "run_backend_case",
    lambda name, platform, cases: check.CaseResult("r", "float32", name, platform, 0.0, ""),
  )
  monkeypatch.setattr(
    refs,
    "run_evaluator_case",
    lambda label, node, inputs, platform: check.CaseResult("r", "float64", label, platform, 0.0, ""),
  )
  rules, dtypes = ["momentum_standard", "momentum_nesterov"], ["float32", "float64"]
  for float64, references in [(True, 3 + 4), (False, 3)]:  # Momentum's backend cases, evaluator nodes.
    monkeypatch.setattr(devices, "has_float64", lambda platform, float64=float64: float64)
    calls: list[tuple[str, int, int]] = []
    result = report.run(["cpu"], large=False, rules=rules, dtypes=dtypes, pinned=True, progress=_into(calls))
    assert len(result["onnx_rows"]) == references
    checked = result["checked"]
    assert checked == sum(r["cases"] for r in result["rows"]) + references
    assert {total for _, _, total in calls} == {checked} and calls[-1] == ("cpu", checked, checked)
    assert [done for _, done, _ in calls] == sorted({done for _, done, _ in calls})
  # The command's last progress line and its verdict: one count.
  argv = ["--platform", "cpu", "--rule", "momentum", "--dtype", "float32", "--no-large", "--pinned"]
  assert cli.main(argv) == cli.PASSED
  captured = capsys.readouterr()
  progress = [line for line in captured.err.splitlines() if "checked" in line]
  (n,) = {int(total) for total in re.findall(r"Verdict: PASSED: all (\d+) cases", captured.out)}
  assert progress[-1].startswith(f"cpu: {n}/{n} cases checked")
  assert f"\nPASSED: {n} cases checked in " in captured.out


#: A count in the plural after 1 (``1 rules``), in any of the report's phrases.
_ONE_PLURAL = re.compile(r"\b1 (rule|case|row|rule-and-dtype row|element|logical core)s\b|\b1/1 cases\b")


def test_a_count_of_one_is_in_the_singular(monkeypatch, capsys):
  one = cases_lib.cases("adagrad", "float32", large=False)[:1]
  monkeypatch.setattr(cases_lib, "cases", lambda rule, dtype, large=True: one)
  _recorded(monkeypatch)
  assert cli.main(SMALL[:-1] + ["--pinned"]) == cli.PASSED  # Without --quiet: the progress too.
  captured = capsys.readouterr()
  out = captured.out
  assert "Checked: 1 case of 1 rule in 1 rule-and-dtype row against" in out
  assert "Verdict: PASSED: the 1 case within its tolerance (" in out
  assert out.rstrip().splitlines()[-1].startswith("PASSED: 1 case checked in ")
  assert "cpu: 1/1 case checked" in captured.err and "cpu: 1 case " in captured.err  # Progress, log.
  assert "1 rule-and-dtype row" in captured.err
  assert not _ONE_PLURAL.search(out + captured.err), _ONE_PLURAL.search(out + captured.err)
  _recorded(monkeypatch, worst=2.0)
  assert cli.main(SMALL) == cli.FAILED
  assert "Verdict: FAILED: 1 of 1 row fails (adagrad float32; " in capsys.readouterr().out
  bar = cli.Progress(_Stream(terminal=True), width=4)
  bar("cpu", 1, 1)
  assert bar.stream.getvalue().startswith("\rcpu [####] 1/1 case, ")
  monkeypatch.setattr(report.os, "cpu_count", lambda: 1)
  assert report._device_name("cpu").endswith(", 1 logical core)")
  assert report._why(check.CaseResult("r", "float32", "c", "cpu", 0.5, "", unchecked=1)).startswith(
    "1 element unchecked "
  )


def test_counts_above_one_are_in_the_plural(monkeypatch, capsys):
  _recorded(monkeypatch)
  argv = ["--platform", "cpu", "--rule", "adagrad", "--rule", "adam", "--dtype", "float32", "--no-large"]
  assert cli.main(argv + ["--no-onnx", "--pinned", "--quiet"]) == cli.PASSED
  out = capsys.readouterr().out
  assert re.search(r"Checked: \d+ cases of 2 rules in 2 rule-and-dtype rows against", out)
  assert re.search(r"Verdict: PASSED: all \d+ cases within their tolerances \(", out)
  _recorded(monkeypatch, worst=2.0)
  assert cli.main(argv + ["--no-onnx", "--pinned", "--quiet"]) == cli.FAILED
  assert "Verdict: FAILED: 2 of 2 rows fail (adagrad float32, adam float32; " in capsys.readouterr().out
  monkeypatch.setattr(report.os, "cpu_count", lambda: 2)
  assert report._device_name("cpu").endswith(", 2 logical cores)")


def test_the_verdict_line_says_what_its_worst_figure_means(capsys):
  """The worst error is read beside its meaning, on the verdict line itself (before the legend)."""
  assert cli.main(SMALL) == cli.PASSED
  out = capsys.readouterr().out
  (line,) = [line for line in out.splitlines() if line.startswith("Verdict: ")]
  assert re.fullmatch(
    r"Verdict: PASSED: all \d+ cases within their tolerances \(worst error (0\.\d{3}|1\.000) times its "
    r"tolerance, adagrad float32; a case passes up to 1\), in [\d.]+ s",
    line,
  ), line
  assert out.index(line) < out.index("How to read the table")
