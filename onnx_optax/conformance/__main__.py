"""``python -m onnx_optax.conformance``: run the suite, print the report.

Usage::

    python -m onnx_optax.conformance [--platform cpu|gpu|tpu] [--json FILE]
        [--markdown FILE] [--rule RULE] [--dtype DTYPE] [--no-onnx] [--no-large] [--pinned]

``--rule`` takes a rule of the suite, or a function's name for all of its variants
(``momentum``: ``momentum_standard`` and ``momentum_nesterov``; :func:`rule_names`).

Exit codes (one per outcome, :data:`EXIT_CODES`):

* 0: every selected case was checked and passed;
* 1: a case failed;
* 2: usage error (an unknown option or value, an output path that cannot be
  written: checked before the run starts);
* 3: a requested platform is not there;
* 4: nothing was checked (every selected case skipped, e.g. ``--dtype
  float64`` on a device without float64);
* 5: every case passed, but a report file could not be written after the
  run (the other report is written and the verdict printed all the same);
* 6: the run itself raised (a bug, or a broken installation): the traceback
  is printed, and no verdict.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from typing import TextIO

from onnx_optax.conformance import cases, devices, report
from onnx_optax.conformance.cases import DTYPES

__all__ = ["EXIT_CODES", "main", "rule_names"]

PASSED, FAILED, USAGE, NO_PLATFORM, NOTHING_CHECKED, NOT_WRITTEN, CRASHED = 0, 1, 2, 3, 4, 5, 6

#: Exit code -> outcome, as ``--help`` lists them.
EXIT_CODES = {
  PASSED: "every selected case was checked and passed",
  FAILED: "a case failed",
  USAGE: "usage error (unknown option or value; an output path that cannot be written, checked "
  "before the run)",
  NO_PLATFORM: "a requested platform is not there",
  NOTHING_CHECKED: "nothing was checked (every selected case skipped, e.g. --dtype float64 on a "
  "device without float64)",
  NOT_WRITTEN: "every case passed but a report file could not be written (the other one is written, "
  "the verdict printed)",
  CRASHED: "the run itself raised (a bug or a broken installation; the traceback is printed, no verdict)",
}


def rule_names() -> dict[str, tuple[str, ...]]:
  """What ``--rule`` accepts, each with the suite rules it selects, in the suite's order: each of
  the suite's rules by its own name, and before its first variant a function's name (``momentum``),
  which selects all of its variants.

  Example:
    >>> rule_names()["momentum"], rule_names()["momentum_nesterov"], rule_names()["adam"]
    (('momentum_standard', 'momentum_nesterov'), ('momentum_nesterov',), ('adam',))
  """
  suite = cases.suite_rules()
  accepted: dict[str, tuple[str, ...]] = {}
  for name in cases.names():
    function = suite[name].rule.name
    if function != name:
      accepted[function] = (*accepted.get(function, ()), name)
    accepted[name] = (name,)
  return accepted


def _variants_help(accepted: dict[str, tuple[str, ...]]) -> str:
  return "; ".join(f"{name}: {', '.join(rules)}" for name, rules in accepted.items() if rules != (name,))


def unwritable(path: str) -> str | None:
  """Why ``path`` cannot be written as a report file, or None if it can (nothing is created)."""
  if os.path.isdir(path):
    return "is a directory"
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    return f"its directory {parent} does not exist"
  if os.path.exists(path):
    return None if os.access(path, os.W_OK) else "is not writable"
  return None if os.access(parent, os.W_OK) else f"its directory {parent} is not writable"


def _write(what: str, path: str, write: Callable[[str], None]) -> bool:
  try:
    write(path)
  except OSError as e:
    print(f"could not write the {what} report to {path}: {e}", file=sys.stderr)
    return False
  return True


class Progress:
  """The run's progress on ``stream``, never a result (the table has those): a bar redrawn in place
  where ``stream`` is a terminal, otherwise a plain line at every tenth of the cases."""

  def __init__(self, stream: TextIO, width: int = 30) -> None:
    self.stream, self.width = stream, width
    self.terminal = stream.isatty()
    self.start = time.perf_counter()
    self.tenths: dict[str, int] = {}

  def __call__(self, platform: str, done: int, total: int) -> None:
    seconds = time.perf_counter() - self.start
    if self.terminal:
      filled = self.width * done // max(total, 1)
      bar = "#" * filled + "." * (self.width - filled)
      end = "\n" if done >= total else ""
      print(
        f"\r{platform} [{bar}] {done}/{report.count(total, 'case')}, {seconds:.0f} s",
        end=end,
        file=self.stream,
        flush=True,
      )
      return
    tenth = 10 * done // max(total, 1)
    if tenth > self.tenths.get(platform, 0):
      self.tenths[platform] = tenth
      print(
        f"{platform}: {done}/{report.count(total, 'case')} checked, {seconds:.0f} s",
        file=self.stream,
        flush=True,
      )


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m onnx_optax.conformance",
    description="Checks the onnx_optax rules against the float64 NumPy reference (and ONNX's own "
    "references when onnx is installed) on every JAX platform, in units of the "
    "rounding-error tolerance.",
    epilog="exit codes: " + "; ".join(f"{code}: {what}" for code, what in EXIT_CODES.items()),
  )
  parser.add_argument(
    "--platform",
    choices=("cpu", "gpu", "tpu"),
    action="append",
    help="platform to check (repeatable); default: every platform JAX finds",
  )
  parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
  parser.add_argument("--markdown", metavar="FILE", help="write the report as Markdown")
  accepted = rule_names()
  parser.add_argument(
    "--rule",
    choices=accepted,
    action="append",
    help="rule to check (repeatable); default: all. A function's name checks all of its variants ("
    + _variants_help(accepted)
    + "). Filters ONNX's references too",
  )
  parser.add_argument(
    "--dtype",
    choices=DTYPES,
    action="append",
    help="dtype to check (repeatable); default: all. Filters ONNX's references too",
  )
  parser.add_argument("--no-onnx", action="store_true", help="skip ONNX's backend cases and evaluator")
  parser.add_argument("--no-large", action="store_true", help="skip the 10^6-element cases")
  parser.add_argument(
    "--quiet", action="store_true", help="no progress on stderr (a bar on a terminal, else plain lines)"
  )
  parser.add_argument(
    "--pinned",
    action="store_true",
    help="charge the documented constants (k = 1 on CPU, K_TRANSCENDENTAL for log and expm1) instead "
    "of the device's measured arithmetic and scalars; for comparison only",
  )
  args = parser.parse_args(argv)  # Exits 2 (USAGE) on an unknown option or value.

  for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
    why = path and unwritable(path)
    if why:
      print(f"{flag} {path}: {why}; nothing was run", file=sys.stderr)
      return USAGE
  found = devices.platforms()
  platforms = args.platform or found
  missing = [p for p in platforms if p not in found]
  if missing:
    print(f"JAX finds no {', '.join(missing)} device (found: {', '.join(found)})", file=sys.stderr)
    return NO_PLATFORM
  # A function's name as its variants; a rule named twice (``momentum``, ``momentum_nesterov``) runs once.
  rules = list(dict.fromkeys(rule for name in args.rule or () for rule in accepted[name]))
  log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
  progress = None if args.quiet else Progress(sys.stderr)
  try:
    result = report.run(
      platforms,
      include_onnx=not args.no_onnx,
      large=not args.no_large,
      rules=rules or cases.names(),
      dtypes=args.dtype or DTYPES,
      log=log,
      pinned=args.pinned,
      progress=progress,
    )
  except Exception:  # noqa: BLE001 -- any crash: not a failed case, which exits 1.
    traceback.print_exc()
    print("the conformance run raised: no verdict", file=sys.stderr)
    return CRASHED
  print(report.format_table(result), flush=True)
  command = "python -m onnx_optax.conformance " + shlex.join(argv if argv is not None else sys.argv[1:])
  written = True
  if args.json:
    written &= _write("JSON", args.json, lambda path: report.write_json(result, path))
  if args.markdown:
    written &= _write(
      "Markdown", args.markdown, lambda path: report.write_markdown(result, path, command.strip())
    )
  if result["verdict"] == report.NOTHING_CHECKED:
    return NOTHING_CHECKED
  if result["verdict"] == report.FAILED:
    return FAILED
  return PASSED if written else NOT_WRITTEN


if __name__ == "__main__":
  sys.exit(main())
