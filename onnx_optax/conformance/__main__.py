"""``python -m onnx_optax.conformance``: run the suite, print the report.

Usage::

    python -m onnx_optax.conformance [--platform cpu|gpu|tpu] [--json FILE]
        [--markdown FILE] [--rule RULE] [--dtype DTYPE] [--no-onnx] [--no-large]

Exits 0 when every case passes, 1 when one fails, 2 when the requested
platform is not there.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from onnx_optax.conformance import check, report
from onnx_optax.conformance.cases import DTYPES, RULES


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m onnx_optax.conformance",
    description="Checks the onnx_optax rules against the float64 NumPy reference (and ONNX's own "
    "references when onnx is installed) on every JAX platform, in units of the "
    "rounding-error tolerance.",
  )
  parser.add_argument(
    "--platform",
    choices=("cpu", "gpu", "tpu"),
    action="append",
    help="platform to check (repeatable); default: every platform JAX finds",
  )
  parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
  parser.add_argument("--markdown", metavar="FILE", help="write the report as Markdown")
  parser.add_argument(
    "--rule", choices=RULES, action="append", help="rule to check (repeatable); default: all"
  )
  parser.add_argument(
    "--dtype", choices=DTYPES, action="append", help="dtype to check (repeatable); default: all"
  )
  parser.add_argument("--no-onnx", action="store_true", help="skip ONNX's backend cases and evaluator")
  parser.add_argument("--no-large", action="store_true", help="skip the 10^6-element cases")
  parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
  args = parser.parse_args(argv)

  found = check.platforms()
  platforms = args.platform or found
  missing = [p for p in platforms if p not in found]
  if missing:
    print(f"JAX finds no {', '.join(missing)} device (found: {', '.join(found)})", file=sys.stderr)
    return 2
  log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
  result = report.run(
    platforms,
    include_onnx=not args.no_onnx,
    large=not args.no_large,
    rules=args.rule or RULES,
    dtypes=args.dtype or DTYPES,
    log=log,
  )
  print(report.format_table(result))
  if args.json:
    report.write_json(result, args.json)
  if args.markdown:
    command = "python -m onnx_optax.conformance " + shlex.join(argv if argv is not None else sys.argv[1:])
    with open(args.markdown, "w") as f:
      f.write(report.format_markdown(result, command.strip()))
  return 0 if result["passed"] else 1


if __name__ == "__main__":
  sys.exit(main())
