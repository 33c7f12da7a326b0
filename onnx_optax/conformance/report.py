"""Runs the whole suite and writes the report (text table, JSON, Markdown)."""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform as host_platform
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import optax

import onnx_optax
from onnx_optax.conformance import arithmetic, check, devices
from onnx_optax.conformance import cases as cases_lib
from onnx_optax.conformance.check import CaseResult

__all__ = ["count", "format_markdown", "format_table", "run", "verdict", "write_json", "write_markdown"]

NO_FLOAT64 = "skipped: TPUs have no float64 arithmetic"


def count(n: int, noun: str, plural: str | None = None) -> str:
  """``n`` and ``noun``, in the plural (default ``noun + "s"``) unless ``n`` is 1.

  Example:
    >>> count(1, "rule"), count(2, "rule"), count(0, "case")
    ('1 rule', '2 rules', '0 cases')
  """
  return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _onnx_version() -> str | None:
  try:
    import onnx
  except ImportError:
    return None
  return onnx.__version__


def _jaxlib_version() -> str | None:
  try:
    import jaxlib
  except ImportError:
    return None
  return getattr(jaxlib, "__version__", None)


def processor_name() -> str:
  """The CPU model (``device_kind`` of a CPU device is just "cpu")."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return host_platform.processor() or "unknown"


def _device_name(platform: str) -> str:
  kind = str(devices.device(platform).device_kind)
  if platform == "cpu":
    cores = os.cpu_count()
    return (
      f"{kind} ({processor_name()}, {count(cores, 'logical core') if cores else 'logical cores unknown'})"
    )
  return f"{kind} (x{len(jax.devices(platform))})"


def _row(platform: str, rule: str, dtype: str, results: list[CaseResult]) -> dict[str, Any]:
  worst = max(results, key=lambda r: r.worst)
  failures = [f"{r.name}: {_why(r)} ({r.worst:.3g})" for r in results if not r.passed]
  limits = [f"{r.name}: {r.unchecked} unchecked, {r.limit}" for r in results if r.unchecked and r.limit]
  skipped = sorted({r.order_skipped for r in results if r.order_skipped})
  return dict(
    platform=platform,
    rule=rule,
    dtype=dtype,
    cases=len(results),
    worst=worst.worst,
    worst_case=worst.name,
    where=worst.where,
    loose=sum(r.loose for r in results),
    unchecked=sum(r.unchecked for r in results),
    limits=limits,
    passed=all(r.passed for r in results),
    failures=failures,
    scalar_error=max(r.scalar_error for r in results),
    order=sum(r.order_checked for r in results),
    order_skipped=skipped,
  )


def _why(r: CaseResult) -> str:
  if r.error:
    return r.error
  if r.worst > 1:
    return r.where
  if r.order:
    return f"not PyTorch's float32 order: {r.order}"
  if not r.count_ok:
    return "count not advanced to T + 1"
  if r.wrong_dtypes:
    return r.wrong_dtypes
  return f"{count(r.unchecked, 'element')} unchecked (infinite tolerance) and no documented limit"


def run(
  platforms: Sequence[str] | None = None,
  *,
  include_onnx: bool = True,
  large: bool = True,
  rules: Sequence[str] | None = None,
  dtypes: Sequence[str] = cases_lib.DTYPES,
  log: Callable[[str], None] | None = None,
  pinned: bool = False,
  progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
  """Runs every case on every platform; returns the report as a JSON-able dict.

  Args:
    platforms: default every platform JAX finds (``cpu``, ``gpu``, ``tpu``).
    include_onnx: also run ONNX's backend test cases and the
      ReferenceEvaluator comparison (when ``onnx`` is importable).
    large: include the 10^6-element case of each rule and dtype.
    rules, dtypes: restrict the grid (suite rules, ``cases.names()``, default all of them;
      ``cases.DTYPES``); a rule runs in its own dtypes only (``cases.dtypes_of``).
    log: called with a line of what the run is doing (measuring, ONNX's references); no
      result: those are the table's.
    progress: called with ``(platform, cases checked, cases of the platform)`` after each row and
      each of ONNX's references; its count is the verdict's: the grid's cases and ONNX's references.
    pinned: charge the documented constants (``K_TRANSCENDENTAL``, ``k = 1`` on
      CPU) instead of each device's measured arithmetic and each case's
      measured scalars (``check.PINNED``); for comparison only.
  """
  log = log or (lambda line: None)
  platforms = list(platforms or devices.platforms())
  rules = list(rules) if rules is not None else list(cases_lib.names())
  onnx_version = _onnx_version()  # Reported even with include_onnx=False: "not installed" must be true.
  report: dict[str, Any] = dict(
    date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    jax=jax.__version__,
    jaxlib=_jaxlib_version(),
    optax=optax.__version__,
    numpy=np.__version__,
    onnx=onnx_version,
    onnx_optax=onnx_optax.__version__,
    python=sys.version.split()[0],
    host=host_platform.platform(),
    devices={p: _device_name(p) for p in platforms},
    constants="pinned" if pinned else "measured",
    arithmetic={},
    rows=[],
    onnx_rows=[],
    skipped=[],
    not_run=not_run(rules, dtypes),
  )
  start = time.perf_counter()
  previous, check.PINNED = check.PINNED, pinned
  try:
    for platform in platforms:
      # The arithmetic is measured on the checks' thread while the first programs compile.
      _run_platform(
        report, platform, rules, dtypes, large, include_onnx and onnx_version is not None, log, progress
      )
      if not pinned:
        report["arithmetic"][platform] = check.measured_arithmetic(platform).as_json()
  finally:
    check.PINNED = previous
  report["seconds"] = round(time.perf_counter() - start, 1)
  checked = report["rows"] + report["onnx_rows"]
  report["checked"] = sum(r["cases"] for r in report["rows"]) + len(report["onnx_rows"])
  report["passed"] = bool(checked) and all(r["passed"] for r in checked)
  report["verdict"] = verdict(report)
  return report


def _run_platform(
  report: dict[str, Any],
  platform: str,
  rules: Sequence[str],
  dtypes: Sequence[str],
  large: bool,
  include_onnx: bool,
  log: Callable[[str], None],
  progress: Callable[[str, int, int], None] | None = None,
) -> None:
  """The grid's rows, then ONNX's references, of one platform, appended to ``report``.

  ``progress`` counts both, as the verdict does: the total is known before the first case runs.
  """
  grid: list[tuple[str, str, list[cases_lib.Case]]] = []
  for rule in rules:
    for dtype in dtypes:
      if dtype not in cases_lib.dtypes_of(rule):
        continue  # Not in the grid (a twin in float16 or bfloat16): no row.
      if dtype == "float64" and not devices.has_float64(platform):
        report["skipped"].append(dict(platform=platform, rule=rule, dtype=dtype, reason=NO_FLOAT64))
        continue
      grid.append((rule, dtype, cases_lib.cases(rule, dtype, large=large)))
  references = _onnx_references(report, platform, rules, dtypes) if include_onnx else []
  grid_total = sum(len(row_cases) for _, _, row_cases in grid)
  total = grid_total + len(references)
  what = f"{count(grid_total, 'case')} of {count(len(grid), 'rule-and-dtype row')}"
  if references:
    what += f", {len(references)} of ONNX's own references"
  log(f"{platform}: {count(total, 'case')} ({what}); measuring the arithmetic, compiling")
  # One stream of every case, so that the next row's programs compile while a row is checked.
  stream = check.results([c for _, _, row_cases in grid for c in row_cases], platform)
  done = 0
  for rule, dtype, row_cases in grid:
    results = [next(stream) for _ in row_cases]
    report["rows"].append(_row(platform, rule, dtype, results))
    done += len(results)
    if progress is not None:
      progress(platform, done, total)
  if references:
    log(f"{platform}: ONNX's own references")
  for reference in references:
    report["onnx_rows"].append(reference())
    done += 1
    if progress is not None:
      progress(platform, done, total)


def _onnx_references(
  report: dict[str, Any], platform: str, rules: Sequence[str], dtypes: Sequence[str]
) -> list[Callable[[], dict[str, Any]]]:
  """ONNX's references of the selected rules and dtypes on ``platform``, each a call that runs it
  and gives its row; those this platform cannot run are appended to ``report["skipped"]``."""
  from onnx_optax.conformance import onnx_references as refs

  found: list[Callable[[], dict[str, Any]]] = []
  backend = refs.backend_cases()
  for name in refs.BACKEND_CASES:
    rule, dtype = refs.backend_case_rule(backend[name])
    if rule in rules and dtype in dtypes:
      run = functools.partial(refs.run_backend_case, name, platform, backend)
      found.append(
        functools.partial(_reference_row, platform, "onnx backend test case", rule, run, name=name)
      )
  for label, node, inputs in refs.evaluator_cases():
    rule = refs.node_rule(node)
    if rule not in rules or "float64" not in dtypes:
      continue
    if not devices.has_float64(platform):
      report["skipped"].append(dict(platform=platform, rule=label, dtype="float64", reason=NO_FLOAT64))
      continue
    run = functools.partial(refs.run_evaluator_case, label, node, inputs, platform)
    found.append(
      functools.partial(_reference_row, platform, "onnx ReferenceEvaluator", rule, run, dtype="float64")
    )
  return found


def _reference_row(
  platform: str,
  source: str,
  rule: str,
  run: Callable[[], CaseResult],
  name: str | None = None,
  dtype: str | None = None,
) -> dict[str, Any]:
  """Runs one of ONNX's references; its row (``name`` and ``dtype`` default to the result's)."""
  r = run()
  return dict(
    platform=platform,
    source=source,
    name=name or r.name,
    rule=rule,
    dtype=dtype or r.dtype,
    worst=r.worst,
    unchecked=r.unchecked,
    passed=r.passed,
    error=r.error,
  )


#: Why a framework twin's grid leaves a dtype out, by the kind of its binding
#: (:class:`~onnx_optax.registry.Binding`) and the dtype: the reasons beside each rule's
#: ``Conformance.dtypes``, in the report's words.
WHY_NOT: dict[tuple[str, str], str] = {
  ("keras", "float16"): "Keras computes in the variable's dtype: a float16 variable takes a float16 "
  "step, which the twin's grid does not model (float32 and float64 only)",
  ("keras", "bfloat16"): "Keras computes in the variable's dtype: in bfloat16 beta_2 = 0.999 rounds "
  "to 1 and the default Adam does not move a variable (Keras 3.15.1 on JAX); float32 and float64 only",
}


def why_not(rule: str, dtype: str) -> str:
  """Why the grid does not check suite rule ``rule`` in ``dtype`` (not one of its ``dtypes_of``)."""
  declared = cases_lib.dtypes_of(rule)
  declaration = cases_lib.suite_rule(rule).rule
  if declaration.conformance is not None and dtype in declaration.conformance.why_not:
    return declaration.conformance.why_not[dtype]
  for binding in declaration.bindings:
    if (binding.kind, dtype) in WHY_NOT:
      return WHY_NOT[binding.kind, dtype]
  return f"not among the dtypes its conformance declares ({', '.join(declared)}); no reason given"


def not_run(rules: Sequence[str], dtypes: Sequence[str]) -> list[dict[str, str]]:
  """The selected rule-and-dtype combinations the grid has no row for, each with the reason."""
  return [
    dict(rule=rule, dtype=dtype, reason=why_not(rule, dtype))
    for rule in rules
    for dtype in dtypes
    if dtype not in cases_lib.dtypes_of(rule)
  ]


#: The verdicts of a run, in the words the report prints.
PASSED, FAILED, NOTHING_CHECKED = "PASSED", "FAILED", "NOTHING CHECKED"


def verdict(report: dict[str, Any]) -> str:
  """``PASSED`` (cases checked, all passed), ``FAILED`` (one failed) or ``NOTHING CHECKED``.

  A run that checked no case (every row skipped: ``--dtype float64`` on a
  device without float64) has no verdict to give: it never reads as passed.
  """
  rows = report["rows"] + report["onnx_rows"]
  if not rows:
    return NOTHING_CHECKED
  return PASSED if all(r["passed"] for r in rows) else FAILED


def _mark(passed: bool) -> str:
  return "pass" if passed else "FAIL"


def _order(row: dict[str, Any]) -> str:
  """The cases of a row compared to the bit with the framework's float32 order; ``-`` for none."""
  return str(row["order"]) if row.get("order") else "-"


#: What each column of the table says and what a reader concludes from it, as the report prints it.
COLUMNS = (
  (
    "worst",
    "the largest |got - expected| / tolerance over the row's cases and elements (expected: the "
    "float64 NumPy reference; tolerance: the rounding error the arithmetic allows). A case passes at "
    "<= 1. Near 1 is normal, not a warning: the bound is tight where one rounding dominates, and the "
    "worst of many elements comes close to it; a wrong formula lands far above 1.",
  ),
  (
    "loose",
    "elements whose tolerance is as large as the expected value itself: cancellation (e.g. "
    "alpha*V + beta*G near 0, or ORT AdamW's U = W_new - X) leaves no digit that rounding guarantees "
    "there. Counted, not failures. In float16 and bfloat16 a passing row may have thousands or, for "
    "ORT AdamW's U, most of the 10^6 elements: one rounding of |X| is as large as the step there. "
    "In float32 and float64 expect none or a few.",
  ),
  (
    "unchecked",
    "elements with an infinite tolerance (checked for finiteness only): must be 0; a "
    "case with any fails unless it documents that limit of its dtype (listed under its row).",
  ),
  (
    "scalars",
    "the largest error of the per-update scalars (bias corrections, 1 - beta, the step "
    "size) as this device computed them, relative, in units of the roundoff u of their dtype. The "
    "tolerance charges exactly this error, so a large figure is not a failure: the framework twins "
    "compute 1 - beta^t by a power and a subtraction, which cancels (tens to hundreds of u). It "
    "would be a problem near 1/u (float32: 1.7e7), where a scalar keeps no correct digit and its "
    "rows' tolerances stop constraining the result.",
  ),
  (
    "order",
    "the cases also compared to the bit with the framework's own float32 order (PyTorch's "
    "twins, on arithmetic that is correctly rounded); '-': none.",
  ),
)

#: The width the text report's explanations are wrapped to.
_WIDTH = 100

#: IEEE 754 requires these operations correctly rounded: at most 0.5 ulp.
_IEEE = ("div", "sqrt", "mul", "add")


def arithmetic_lines(errors: list[dict[str, Any]]) -> list[str]:
  """The device's measured arithmetic, one readable line per dtype (from ``report["arithmetic"]``).

  Example:
    >>> arithmetic_lines([dict(op="div", dtype="float32", ulp=0.5, flushes_operands=False),
    ...                   dict(op="log", dtype="float32", ulp=1.1, flushes_operands=True)])
    ['float32   div 0.50: correctly rounded (IEEE 754: <= 0.50); log 1.10 (no IEEE 754 bound: charged)']
  """
  lines = []
  for dtype in cases_lib.DTYPES:
    errs = [e for e in errors if e["dtype"] == dtype]
    if not errs:
      continue
    basic = [e for e in errs if e["op"] in _IEEE]
    other = [e for e in errs if e["op"] not in _IEEE]
    bad = [e for e in basic if e["ulp"] > 0.5 + 1e-9]
    line = f"{dtype:<9} " + " ".join(f"{e['op']} {e['ulp']:.2f}" for e in basic)
    line += (
      ": correctly rounded (IEEE 754: <= 0.50)"
      if not bad
      else (
        ": NOT correctly rounded (IEEE 754: <= 0.50; " + ", ".join(e["op"] for e in bad) + " beyond; charged)"
      )
    )
    if other:
      line += "; " + ", ".join(f"{e['op']} {e['ulp']:.2f}" for e in other) + " (no IEEE 754 bound: charged)"
    lines.append(line)
  flushed = sorted(
    {e["dtype"] for e in errors if e["flushes_operands"] and e["op"] in arithmetic.ELEMENTWISE}
  )
  if flushed:
    lines.append(f"subnormal operands read as 0 in {', '.join(flushed)} (charged by the tolerance)")
  return lines


def _summary(report: dict[str, Any]) -> list[str]:
  """What was checked, on what, the verdict, the device's arithmetic: the report's first lines."""
  rows, onnx_rows = report["rows"], report["onnx_rows"]
  grid = sum(r["cases"] for r in rows)
  rules = sorted({r["rule"] for r in rows})
  what = f"{count(grid, 'case')} of {count(len(rules), 'rule')} in {count(len(rows), 'rule-and-dtype row')}"
  what += " against the float64 NumPy reference"
  if onnx_rows:
    what += f", and {len(onnx_rows)} of ONNX's own references"
  lines = [
    f"onnx_optax {report['onnx_optax']} conformance report, {report['date']}",
    textwrap.fill(f"Checked: {what}", _WIDTH, subsequent_indent="  "),
    "  on " + "; ".join(f"{p}: {kind}" for p, kind in report["devices"].items()),
    f"  JAX {report['jax']}, optax {report['optax']}, NumPy {report['numpy']}, "
    f"onnx {report['onnx'] or 'not installed'}",
  ]
  checked = rows + onnx_rows
  if report["verdict"] == NOTHING_CHECKED:
    lines.append(f"Verdict: {NOTHING_CHECKED}: every selected case was skipped ({report['seconds']} s)")
  elif report["verdict"] == PASSED:
    worst = max(checked, key=lambda r: r["worst"])
    where = f"{worst['rule']} {worst['dtype']}" if "cases" in worst else worst["name"]
    n = report["checked"]
    within = "the 1 case within its tolerance" if n == 1 else f"all {n} cases within their tolerances"
    lines.append(
      f"Verdict: PASSED: {within} (worst error {worst['worst']:.3f} times its tolerance, {where}; "
      f"a case passes up to 1), in {report['seconds']} s"
    )
  else:
    failed = [r for r in checked if not r["passed"]]
    names = ", ".join(f"{r['rule']} {r['dtype']}" if "cases" in r else r["name"] for r in failed)
    fail = "fails" if len(failed) == 1 else "fail"
    lines.append(
      f"Verdict: FAILED: {len(failed)} of {count(len(checked), 'row')} {fail} ({names}; why: under each row)"
    )
  for p, errors in report.get("arithmetic", {}).items():
    lines.append(f"{p} arithmetic, largest error measured, in ulp (units in the last place):")
    lines += [
      textwrap.fill(line, _WIDTH, initial_indent="  ", subsequent_indent=" " * 12)
      for line in arithmetic_lines(errors)
    ]
  if report.get("constants") == "pinned":
    lines.append("Constants pinned: documented k, K_TRANSCENDENTAL for the scalars (nothing measured)")
  return lines


def format_table(report: dict[str, Any]) -> str:
  """The report as text: a summary, the columns explained, the table, what was not run, the verdict."""
  lines = _summary(report)
  lines += ["", "How to read the table (one row per rule and dtype):"]
  for name, text in COLUMNS:
    lines.append(textwrap.fill(f"{name:<9} {text}", _WIDTH, initial_indent="  ", subsequent_indent=" " * 12))
  header = (
    f"{'device':<6} {'rule':<18} {'dtype':<9} {'cases':>5} {'worst':>8} {'loose':>7} {'unchecked':>9} "
    f"{'scalars':>8} {'order':>5}  result"
  )
  lines += ["", header, "-" * len(header)]
  for r in report["rows"]:
    lines.append(
      f"{r['platform']:<6} {r['rule']:<18} {r['dtype']:<9} {r['cases']:>5} {r['worst']:>8.3f} "
      f"{r['loose']:>7} {r['unchecked']:>9} {r.get('scalar_error', 0.0):>8.2f} {_order(r):>5}  "
      f"{_mark(r['passed'])}"
    )
    for f in r["failures"] + r["limits"] + [f"order not compared: {w}" for w in r.get("order_skipped", [])]:
      lines.append(f"         {f}")
  not_run_ = report.get("not_run", [])
  if not_run_ or report["skipped"]:
    lines += ["", "Not run:"]
    for r in not_run_:
      lines.append(
        textwrap.fill(
          f"{r['rule']} {r['dtype']}: {r['reason']}", _WIDTH, initial_indent="  ", subsequent_indent="    "
        )
      )
    for r in report["skipped"]:
      lines.append(f"  {r['platform']} {r['rule']} {r['dtype']}: {r['reason']}")
  if report["onnx_rows"]:
    lines.append("")
    lines.append(f"ONNX's own references (onnx {report['onnx']}), worst as above:")
    for r in report["onnx_rows"]:
      lines.append(
        f"{r['platform']:<6} {r['source']:<24} {r['name']:<44} {r['worst']:>8.3f}  "
        f"{_mark(r['passed'])}{'  ' + r['error'] if r['error'] else ''}"
      )
  lines.append("")
  if report["verdict"] == NOTHING_CHECKED:
    lines.append(f"{NOTHING_CHECKED}: every selected case was skipped ({report['seconds']} s)")
  else:
    lines.append(f"{report['verdict']}: {count(report['checked'], 'case')} checked in {report['seconds']} s")
  return "\n".join(lines)


def format_markdown(report: dict[str, Any], command: str = "python -m onnx_optax.conformance") -> str:
  """The report as a Markdown page."""
  out = [
    f"# Conformance report: {', '.join(report['devices'].values())}",
    "",
    f"- Date: {report['date']}",
    f"- Devices: {'; '.join(f'{p}: {k}' for p, k in report['devices'].items())}",
    f"- JAX {report['jax']}, optax {report['optax']}, NumPy {report['numpy']}, "
    f"onnx {report['onnx'] or 'not installed'}, onnx_optax {report['onnx_optax']}, "
    f"Python {report['python']}",
    f"- Host: {report['host']}",
    f"- Command: `{command}` ({report['seconds']} s)",
    *_summary_markdown(report),
    "",
    "How to read the table (one row per rule and dtype; the tolerance is the rounding-error bound of "
    "[docs/conformance.md](../conformance.md)):",
    "",
    *(f"- `{name}`: {text}" for name, text in COLUMNS),
    "",
    "| device | rule | dtype | cases | worst | loose | unchecked | scalars | order | result |",
    "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
  ]
  for r in report["rows"]:
    out.append(
      f"| {r['platform']} | {r['rule']} | {r['dtype']} | {r['cases']} | {r['worst']:.3f} | "
      f"{r['loose']} | {r['unchecked']} | {r.get('scalar_error', 0.0):.2f} | {_order(r)} | "
      f"{_mark(r['passed'])} |"
    )
  limits = [(r, f) for r in report["rows"] for f in r["limits"]]
  if limits:
    out += ["", "Documented limits:", ""] + [
      f"- {r['platform']} {r['rule']} {r['dtype']}: {f}" for r, f in limits
    ]
  skipped = [(r, w) for r in report["rows"] for w in r.get("order_skipped", [])]
  if skipped:
    out += ["", "Not compared with the framework's float32 order:", ""] + [
      f"- {r['platform']} {r['rule']} {r['dtype']}: {w}" for r, w in skipped
    ]
  failures = [(r, f) for r in report["rows"] for f in r["failures"]]
  if failures:
    out += ["", "Failures:", ""] + [f"- {r['platform']} {r['rule']} {r['dtype']}: {f}" for r, f in failures]
  if report["onnx_rows"]:
    out += [
      "",
      f"## ONNX's own references (onnx {report['onnx']})",
      "",
      "| device | source | case | worst | result |",
      "|---|---|---|---:|---|",
    ]
    for r in report["onnx_rows"]:
      out.append(
        f"| {r['platform']} | {r['source']} | {r['name']} | {r['worst']:.3f} | {_mark(r['passed'])} |"
      )
  for p, errors in report.get("arithmetic", {}).items():
    out += [
      "",
      f"## Measured arithmetic: {p}",
      "",
      "Each operation jitted on the device over a sweep of every binade (subnormals included), "
      "random pairs and the grid's operands, against the exact result: the largest error in ulp "
      "and relative to the result in units of `u` (`k`; 1: correctly rounded), the largest "
      "absolute error of a result below the smallest normal number beyond that (`underflow`), "
      "whether a subnormal operand is read as 0, and the number of points. The bound uses "
      "`max(k, documented floor)` for the element-wise operations; `log` and `expm1` enter only "
      "the per-update scalars, whose error is measured case by case.",
      "",
      "| op | dtype | max error (ulp) | k (u) | underflow | subnormal operand read as 0 | points |",
      "|---|---|---:|---:|---:|---|---:|",
    ]
    out += [
      f"| {e['op']} | {e['dtype']} | {e['ulp']:.3f} | {e['k']:.3f} | {e['underflow']:.3g} | "
      f"{'yes' if e['flushes_operands'] else 'no'} | {e['n']} |"
      for e in errors
    ]
  if report.get("constants") == "pinned":
    out += ["", "Constants pinned: the documented `k` and `K_TRANSCENDENTAL`; nothing measured."]
  not_run_ = report.get("not_run", [])
  if not_run_ or report["skipped"]:
    out += ["", "## Not run", ""]
    out += [f"- {r['rule']} {r['dtype']}: {r['reason']}" for r in not_run_]
    out += [f"- {s['platform']} {s['rule']} {s['dtype']}: {s['reason']}" for s in report["skipped"]]
  return "\n".join(out) + "\n"


def _summary_markdown(report: dict[str, Any]) -> list[str]:
  """The verdict and each device's arithmetic per dtype, as Markdown list items."""
  verdict_line = next(line for line in _summary(report) if line.startswith("Verdict: "))
  out = [f"- Result: **{report['verdict']}**{verdict_line.removeprefix('Verdict: ' + report['verdict'])}"]
  for p, errors in report.get("arithmetic", {}).items():
    out.append(f"- {p} arithmetic, largest error measured in ulp:")
    out += [f"  - {line}" for line in arithmetic_lines(errors)]
  return out


def write_markdown(
  report: dict[str, Any], path: str, command: str = "python -m onnx_optax.conformance"
) -> None:
  """Writes :func:`format_markdown` to ``path``."""
  text = format_markdown(report, command)
  with open(path, "w") as f:
    f.write(text)


def write_json(report: dict[str, Any], path: str) -> None:
  """Writes the report as JSON to ``path``."""
  with open(path, "w") as f:
    json.dump(report, f, indent=1, default=float)
    f.write("\n")
