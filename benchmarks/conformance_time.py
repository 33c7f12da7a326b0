"""The wall time of the conformance report, this checkout against another revision, interleaved.

Runs ``python -m onnx_optax.conformance`` of this checkout and of a baseline
revision (``git archive``-d to a temporary folder, so that both run from a
clean copy of their own package) as subprocesses, alternating which goes first
in each round, and prints, per run, the wall time, the XLA compilations (JAX's
``/jax/core/compile/backend_compile_duration`` events, counted in the run's own
process), the cases checked and the load average around it; then the median
wall time of each, their ratio, and the compile counts.

Then where each run's time went, in the run's own process: the process's CPU
time (user and system), the durations of JAX's events summed (compiling, over
the pool of compiling threads; tracing; lowering to MLIR), and the CPU time of
the checks (``check.check_outputs``, measured on the checking thread).

Usage::

    python benchmarks/conformance_time.py [--baseline REV] [--rounds N] [-- REPORT ARGS...]

``REPORT ARGS`` go to both reports (default: none, the full report as
``python -m onnx_optax.conformance`` runs it). The machine is shared: run it
when it is quiet, and read the load beside each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Runs the report in this process and prints one JSON line: wall time, compilations, exit code.
_RUNNER = """
import json, resource, runpy, sys, threading, time
import jax.monitoring
EVENTS = {"/jax/core/compile/backend_compile_duration": "compile",
          "/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}
figures = dict(compiles=0, compile=0.0, trace=0.0, lower=0.0, checks=0.0)
lock = threading.Lock()
def listen(event, duration, **kwargs):
  if event in EVENTS:
    with lock:
      figures[EVENTS[event]] += duration
      if EVENTS[event] == "compile":
        figures["compiles"] += 1
jax.monitoring.register_event_duration_secs_listener(listen)
from onnx_optax.conformance import check
checked = getattr(check, "check_outputs", None)
if checked is not None:
  def check_outputs(*args, **kwargs):
    start = time.thread_time()
    try:
      return checked(*args, **kwargs)
    finally:
      with lock:
        figures["checks"] += time.thread_time() - start
  check.check_outputs = check_outputs
sys.argv = ["onnx_optax.conformance", *sys.argv[1:]]
start, code = time.perf_counter(), 0
try:
  runpy.run_module("onnx_optax.conformance", run_name="__main__")
except SystemExit as e:
  code = e.code or 0
usage = resource.getrusage(resource.RUSAGE_SELF)
figures.update(seconds=time.perf_counter() - start, code=code, user=usage.ru_utime, system=usage.ru_stime)
print("BENCHMARK " + json.dumps(figures), file=sys.stderr, flush=True)
"""


def _export(revision: str) -> tuple[str, str]:
  """``(folder, description)``: the baseline's package, from ``git archive``."""
  folder = tempfile.mkdtemp(prefix="conformance_baseline_")
  archive = subprocess.run(
    ["git", "-C", ROOT, "archive", revision, "onnx_optax"], capture_output=True, check=True
  )
  subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
  description = subprocess.run(
    ["git", "-C", ROOT, "log", "-1", "--format=%h %s", revision], capture_output=True, text=True, check=True
  ).stdout.strip()
  return folder, description[:70]


def _run(path: str, args: list[str]) -> dict:
  """One report, its package first on the path; its figures and the load around it."""
  env = dict(os.environ, PYTHONPATH=path, KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "jax"))
  before = os.getloadavg()[0]
  wall = time.perf_counter()
  proc = subprocess.run(
    [sys.executable, "-c", _RUNNER, *args], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True
  )
  wall = time.perf_counter() - wall
  lines = [line for line in proc.stderr.splitlines() if line.startswith("BENCHMARK ")]
  if not lines:
    raise RuntimeError(f"the report did not finish:\n{proc.stderr[-3000:]}")
  figures = json.loads(lines[-1].removeprefix("BENCHMARK "))
  checked = [line for line in proc.stdout.splitlines() if "cases checked" in line]
  figures.update(
    process_seconds=wall,
    load=(before, os.getloadavg()[0]),
    verdict=checked[-1] if checked else proc.stdout[-200:],
  )
  return figures


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--baseline", default="main", help="the revision to compare with (default: main)")
  parser.add_argument("--rounds", type=int, default=3, help="runs of each, interleaved (default: 3)")
  parser.add_argument("report_args", nargs="*", help="arguments of both reports (after --)")
  args = parser.parse_args()
  baseline, description = _export(args.baseline)
  head = subprocess.run(
    ["git", "-C", ROOT, "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=True
  ).stdout.strip()[:70]
  dirty = subprocess.run(
    ["git", "-C", ROOT, "status", "--porcelain", "onnx_optax"], capture_output=True, text=True
  )
  contenders = {
    "this checkout": (ROOT, head + (" (with uncommitted changes)" if dirty.stdout.strip() else "")),
    "baseline": (baseline, description),
  }
  print(f"python -m onnx_optax.conformance {' '.join(args.report_args)}".rstrip())
  print(f"host: {os.cpu_count()} logical cores; {args.rounds} rounds, interleaved")
  for name, (_, what) in contenders.items():
    print(f"  {name}: {what}")
  runs: dict[str, list[dict]] = {name: [] for name in contenders}
  for round_ in range(args.rounds):
    order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
    for name in order:
      r = _run(contenders[name][0], args.report_args)
      runs[name].append(r)
      print(
        f"round {round_ + 1} {name:<14} {r['seconds']:7.1f} s  {r['compiles']:5d} compilations  "
        f"load {r['load'][0]:.2f} -> {r['load'][1]:.2f}  exit {r['code']}  {r['verdict'].strip()}\n"
        f"        CPU {r['user']:.1f} s user + {r['system']:.1f} s system; compiling {r['compile']:.1f} s "
        f"(summed over threads), tracing {r['trace']:.1f} s, lowering {r['lower']:.1f} s, "
        f"checks {r['checks']:.1f} s of CPU",
        flush=True,
      )
  medians = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
  print()
  for name, rs in runs.items():
    print(
      f"{name:<14} median {medians[name]:7.1f} s (min {min(r['seconds'] for r in rs):.1f}), "
      f"{rs[0]['compiles']} compilations"
    )
  print(f"baseline / this checkout: {medians['baseline'] / medians['this checkout']:.2f}x")


if __name__ == "__main__":
  main()
