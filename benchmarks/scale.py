"""Model-sized trees: trace, lower and compile time, kernels and step time per leaf.

For each rule and each tree this script builds the donated, jitted step
``params, state = step(params, state, grads)`` (``opt.update`` then
``optax.apply_updates``, ``jax.jit(step, donate_argnums=(0, 1))``) of
onnx_optax and of Optax's nearest built-in (``optax.sgd(momentum=...,
nesterov=...)``, ``optax.adagrad``, ``optax.adam``; ``optax.adamw`` and
``optax.sgd`` for ONNX Runtime's AdamW and SGD) and measures, in one
process, interleaved (each repeat measures both libraries, in alternating
order) and repeated (medians):

* the **trace**, **lower** and **compile** times, separately:
  ``jax.jit(step, ...).trace(...)``, ``.lower()``, ``.compile()`` of a fresh
  step function after ``jax.clear_caches()``, so that every sample compiles
  from scratch, as the first step of a training run does;
* what the program holds per leaf: the equations of the traced jaxpr, the
  lines of the lowered StableHLO, and the **kernels** of the compiled program
  (every instruction of the optimized HLO's entry computation that runs
  something: a fusion, an unfused op, a copy; XLA:CPU loops, GPU kernels);
* the **temporary bytes** of the donated step
  (``compile().memory_analysis().temp_size_in_bytes``), to see whether they
  grow with the number of leaves;
* the **step time** on real buffers, onnx_optax and Optax interleaved.

Ratios are onnx_optax over Optax: **below 1, onnx_optax is faster** (the
opposite of ``run.py``'s columns; here the question is what onnx_optax costs).

Trees (``--trees``): ``16M`` (one leaf of 16M float32), ``mix10``, ``mix100``,
``mix1000`` and ``mix10k``. The ``mix`` trees are model-like: blocks of 25
leaves (attention and MLP matrices, biases, norm scales, a small convolution,
odd shapes, a scalar; 16 distinct shapes). ``mix10`` is the first 10 leaves
of a block of width 128; ``mix100`` and ``mix1000`` are 4 and 40 blocks of
width 128 (``mix1000`` is ``run.py``'s tree, 8.2M elements); ``mix10k`` is
400 blocks of width 32 (10,000 leaves, 8.0M elements: ten times the leaves at
the same size, so that what grows is the cost per leaf).

Usage (from the repository root)::

  python benchmarks/scale.py                                  # 1k tree + 16M, all rules (~15 min, 2 cores)
  python benchmarks/scale.py --rules adam --trees mix1000 --repeats 3
  python benchmarks/scale.py --trees mix100,mix1000,mix10k --repeats 1 --no-step   # growth per leaf
  python benchmarks/scale.py --device gpu --json out.json --text out.txt
  python benchmarks/scale.py --trees mix10,mix100,mix1000 --no-step --plot compile.png   # the plot
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# JAX takes 75% of a GPU's memory at start by default; leave room for others.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# run.py puts the checkout on sys.path when onnx_optax is not installed.
from run import RULES, onnx_optimizer, optax_optimizer

import onnx_optax

TREES = ("16M", "mix10", "mix100", "mix1000", "mix10k")
#: The contenders; ``--baseline`` appends "baseline" (another onnx_optax).
LIBRARIES: list[str] = ["onnx_optax", "optax"]
MAKERS: dict[str, Callable[[str], optax.GradientTransformation]] = {
  "onnx_optax": onnx_optimizer,
  "optax": optax_optimizer,
}


#: What a compile sample times: wall-clock and process CPU seconds.
TIMES = (
  "trace_s",
  "lower_s",
  "compile_s",
  "total_s",
  "trace_cpu_s",
  "lower_cpu_s",
  "compile_cpu_s",
  "total_cpu_s",
)


def rotation(r: int) -> list[str]:
  """The contenders in the order of repeat ``r``: each goes first in turn."""
  k = r % len(LIBRARIES)
  return LIBRARIES[k:] + LIBRARIES[:k]


_BASELINE: list[Any] = []


def baseline_module() -> Any:
  """The baseline's package, once :func:`add_baseline` has added it."""
  return _BASELINE[-1]


def add_baseline(where: str) -> str:
  """Adds another onnx_optax, "baseline", to the contenders; returns its description.

  ``where`` is a folder (a checkout, or the ``onnx_optax`` package folder) or
  a git revision of this checkout (``HEAD~1``, a commit). The package is copied
  under the name ``onnx_optax_baseline`` so that both versions live in one
  process and are measured interleaved: on a busy machine that is the only
  fair before / after comparison.
  """
  import importlib
  import shutil
  import subprocess
  import tempfile

  import run as run_module

  name = "onnx_optax_baseline"
  tmp = tempfile.mkdtemp(prefix="scale_baseline_")
  if os.path.isdir(where):
    src = (
      where
      if os.path.basename(os.path.normpath(where)) == "onnx_optax"
      else os.path.join(where, "onnx_optax")
    )
    shutil.copytree(src, os.path.join(tmp, name), ignore=shutil.ignore_patterns("__pycache__"))
    description = where
    commit_file = os.path.join(os.path.dirname(os.path.normpath(src)), "COMMIT")
    if os.path.exists(commit_file):
      with open(commit_file) as f:
        description = f.read().strip()[:60]
  else:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(
      ["git", "-C", root, "archive", where, "onnx_optax"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
    os.rename(os.path.join(tmp, "onnx_optax"), os.path.join(tmp, name))
    description = subprocess.run(
      ["git", "-C", root, "log", "-1", "--format=%h %s", where], capture_output=True, text=True, check=True
    ).stdout.strip()[:60]
  for folder, _, files in os.walk(os.path.join(tmp, name)):
    for file in files:
      if file.endswith(".py"):
        path = os.path.join(folder, file)
        with open(path) as f:
          text = f.read()
        with open(path, "w") as f:
          f.write(re.sub(r"\bonnx_optax\b", name, text))
  sys.path.insert(0, tmp)
  module = importlib.import_module(name)
  _BASELINE.append(module)

  def make(rule: str) -> optax.GradientTransformation:
    # run.onnx_optimizer holds the hyperparameters; it reads its module's
    # global onnx_optax, swapped for the duration of the call.
    saved = run_module.onnx_optax
    run_module.onnx_optax = module
    try:
      return run_module.onnx_optimizer(rule)
    finally:
      run_module.onnx_optax = saved

  MAKERS["baseline"] = make
  LIBRARIES.append("baseline")
  return description


# --------------------------------------------------------------------------- trees


def block(width: int) -> list[tuple[int, ...]]:
  """One model-like block of 25 leaves, ``width`` the model dimension."""
  w, h = width, 4 * width
  return (
    [(w, w)] * 4
    + [(w,)] * 4  # attention q, k, v, o and their biases
    + [(w,)] * 4  # two norms (scale, bias)
    + [(w, h), (h,), (h, w), (w,)]  # MLP
    + [(3, 3, 16, 16), (16,), (3, 3, 16, 16), (16,)]  # a small convolution
    + [(64, 32), (32,), (5, 5, 3, 8), (8,), ()]
  )  # odd shapes, a scalar


def tree_shapes(tree: str) -> list[tuple[int, ...]]:
  """The leaf shapes of one tree (see the module docstring)."""
  if tree.endswith("M") and tree[:-1].isdigit():
    return [(int(tree[:-1]) << 20,)]
  if tree == "mix10":
    return block(128)[:10]
  if tree == "mix100":
    return block(128) * 4
  if tree == "mix1000":
    return block(128) * 40
  if tree == "mix10k":
    return block(32) * 400
  raise ValueError(f"unknown tree {tree!r}; known: {TREES} or <n>M")


def abstract_tree(shapes, sharding) -> dict:
  """Shapes only: tracing and compiling need no buffers."""
  return {
    f"leaf{i:05d}": jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding) for i, s in enumerate(shapes)
  }


def real_tree(shapes, device, seed: int) -> dict:
  """Float32 buffers ~N(0, scale) on ``device`` (one key per leaf)."""
  scale = 1.0 if seed == 0 else 1e-3
  key = jax.random.key(seed)
  return {
    f"leaf{i:05d}": jax.device_put(scale * jax.random.normal(jax.random.fold_in(key, i), s), device)
    for i, s in enumerate(shapes)
  }


# --------------------------------------------------------------------------- one compile


_ENTRY_OP = re.compile(r"^\s*(?:ROOT )?%\S+ = .+? ([a-z][a-z0-9-]*)\(")
#: Entry instructions that run nothing: buffers and views.
_NOT_A_KERNEL = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant"}


def kernels(compiled) -> dict[str, int]:
  """Instructions of the optimized entry computation that run something, by opcode.

  On XLA:CPU each is a loop (a fusion or an unfused op), on a GPU a kernel
  launch or a library call.
  """
  text = compiled.as_text()
  counts: dict[str, int] = {}
  for line in text[text.index("\nENTRY") :].splitlines()[1:]:
    if line.startswith("}"):
      break
    m = _ENTRY_OP.match(line)
    if m and m.group(1) not in _NOT_A_KERNEL:
      counts[m.group(1)] = counts.get(m.group(1), 0) + 1
  return counts


def count_eqns(jaxpr) -> int:
  """Equations of a jaxpr, with a call (``custom_jvp``, ``jit``) counted as the equations it holds.

  onnx_optax traces the per-leaf loop of an update as one ``custom_jvp``
  (``transforms._leaves_once_differentiated``): counted as one equation, a
  tree of a thousand leaves would read as a handful of equations.
  """
  from jax.extend.core import ClosedJaxpr, Jaxpr

  n = 0
  for eqn in jaxpr.eqns:
    subs = [
      p
      for v in eqn.params.values()
      for p in (v if isinstance(v, (tuple, list)) else (v,))
      if isinstance(p, (ClosedJaxpr, Jaxpr))
    ]
    n += sum(count_eqns(getattr(s, "jaxpr", s)) for s in subs) if subs else 1
  return n


def make_step(opt: optax.GradientTransformation):
  """A fresh step function (a new object: no jit cache can hold it)."""

  def step(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return step


def compile_once(library: str, rule: str, params) -> tuple[dict, Any]:
  """Trace, lower, compile from scratch; the times and what the program holds."""
  jax.clear_caches()
  gc.collect()
  opt = MAKERS[library](rule)
  state = jax.eval_shape(opt.init, params)
  c0, t0 = time.process_time(), time.perf_counter()
  traced = jax.jit(make_step(opt), donate_argnums=(0, 1)).trace(params, state, params)
  c1, t1 = time.process_time(), time.perf_counter()
  lowered = traced.lower()
  c2, t2 = time.process_time(), time.perf_counter()
  compiled = lowered.compile()
  c3, t3 = time.process_time(), time.perf_counter()
  ma = compiled.memory_analysis()
  k = kernels(compiled)
  sample = {
    "trace_s": t1 - t0,
    "lower_s": t2 - t1,
    "compile_s": t3 - t2,
    "total_s": t3 - t0,
    # CPU time of this process (all its threads): what the work costs,
    # nearly blind to the load of other processes on a shared machine.
    "trace_cpu_s": c1 - c0,
    "lower_cpu_s": c2 - c1,
    "compile_cpu_s": c3 - c2,
    "total_cpu_s": c3 - c0,
    "jaxpr_eqns": count_eqns(traced.jaxpr),
    "stablehlo_lines": lowered.as_text().count("\n"),
    "kernels": sum(k.values()),
    "kernel_ops": k,
    "temp_bytes": None if ma is None else ma.temp_size_in_bytes,
    "alias_bytes": None if ma is None else ma.alias_size_in_bytes,
  }
  return sample, compiled


# --------------------------------------------------------------------------- step time


def time_steps(
  compiled: dict[str, Any],
  makers: dict[str, Callable[[], tuple]],
  repeats: int,
  target_s: float,
  pause_s: float,
) -> dict[str, list[float]]:
  """Interleaved step times (seconds per step) of each library's compiled step."""
  boxes, inner = {}, {}
  for name, make in makers.items():
    boxes[name] = list(make())

  def run(name: str, n: int) -> None:
    p, s, g = boxes[name]
    for _ in range(n):
      p, s = compiled[name](p, s, g)
    jax.block_until_ready(p)
    boxes[name][:2] = [p, s]

  for name in makers:
    run(name, 2)  # Warm-up.
    t0 = time.perf_counter()
    run(name, 1)
    inner[name] = max(1, min(1000, int(target_s / max(time.perf_counter() - t0, 1e-6))))
  times: dict[str, list[float]] = {name: [] for name in makers}
  for r in range(repeats):
    for name in rotation(r):
      time.sleep(pause_s)  # Let a spinning thread pool park before the clock starts.
      t0 = time.perf_counter()
      run(name, inner[name])
      times[name].append((time.perf_counter() - t0) / inner[name])
  return times


# --------------------------------------------------------------------------- main


def measure(tree: str, rule: str, repeats: int, step_repeats: int, device, args) -> dict:
  shapes = tree_shapes(tree)
  sharding = jax.sharding.SingleDeviceSharding(device)
  params = abstract_tree(shapes, sharding)
  samples: dict[str, list[dict]] = {lib: [] for lib in LIBRARIES}
  last: dict[str, Any] = {}
  for r in range(repeats):
    for lib in rotation(r):
      sample, last[lib] = compile_once(lib, rule, params)
      samples[lib].append(sample)
  row: dict[str, Any] = {
    "tree": tree,
    "rule": rule,
    "leaves": len(shapes),
    "elements": int(sum(np.prod(s) for s in shapes)),
    "samples": samples,
  }
  med = {lib: {k: statistics.median(s[k] for s in samples[lib]) for k in TIMES} for lib in LIBRARIES}
  for lib in LIBRARIES:
    first = samples[lib][0]
    med[lib].update(
      {
        k: first[k]
        for k in ("jaxpr_eqns", "stablehlo_lines", "kernels", "kernel_ops", "temp_bytes", "alias_bytes")
      }
    )
  row["median"] = med
  if step_repeats:

    def makers_for(lib):
      def make():
        p = real_tree(shapes, device, 0)
        g = real_tree(shapes, device, 1)
        return p, MAKERS[lib](rule).init(p), g

      return make

    times = time_steps(
      last,
      {lib: makers_for(lib) for lib in LIBRARIES},
      step_repeats,
      args.target_ms / 1e3,
      args.pause_ms / 1e3,
    )
    row["step_samples_ms"] = {lib: [1e3 * t for t in ts] for lib, ts in times.items()}
    for lib in LIBRARIES:
      med[lib]["step_ms"] = 1e3 * statistics.median(times[lib])
  last.clear()
  ratios(row)
  return row


def ratios(row: dict) -> None:
  """onnx_optax / optax, and with a baseline, onnx_optax / baseline and baseline / optax."""
  med = row["median"]
  pairs = {"ratio": ("onnx_optax", "optax")}
  if "baseline" in med:
    pairs.update(ratio_to_baseline=("onnx_optax", "baseline"), baseline_ratio=("baseline", "optax"))
  for key, (a, b) in pairs.items():
    row[key] = {k: med[a][k] / med[b][k] for k in (*TIMES, "step_ms") if k in med[a] and med[b][k]}


def table(out: dict) -> str:
  """The text tables: times and ratios, then what the programs hold per leaf."""
  env = out["env"]
  lines = [
    (
      f"jax {env['jax']}, jaxlib {env['jaxlib']}, optax {env['optax']}; {env['device_kind']} "
      f"({env['device']}), {env['cpu_count']} CPU cores ({env['processor']}), {env['machine']}"
    ),
    (
      f"command: {env['command']}; XLA_FLAGS={env['xla_flags']!r}; started {env['started']}; "
      f"onnx_optax commit {env['commit']}; {env.get('wall_s', '(partial run)')} s"
    ),
    (
      f"medians of {env['repeats']} interleaved compiles (fresh function, jax.clear_caches()) and "
      f"{env['step_repeats']} interleaved step samples; ratio = onnx_optax / optax "
      "(below 1: onnx_optax faster)"
    ),
    "",
    (
      f"{'tree':8} {'leaves':>6} {'rule':14} {'trace s':>15} {'lower s':>15} {'compile s':>15} "
      f"{'total s':>17} {'step ms':>19}  CPU-time ratios: trace lower compile total"
    ),
    (
      f"{'':8} {'':>6} {'':14} {'ours/optax  x':>15} {'ours/optax  x':>15} {'ours/optax  x':>15} "
      f"{'ours/optax   x':>17} {'ours/optax    x':>19}"
    ),
  ]
  lines.append("-" * len(lines[-2]))
  lines += comparisons(out, _time_rows)
  lines += _leaf_rows(out)
  return "\n".join(lines) + "\n"


def comparisons(out: dict, rows: Callable[[dict, str, str, str], list[str]]) -> list[str]:
  """The ``rows`` of onnx_optax against Optax, and with ``--baseline`` those of the baseline."""
  lines = rows(out, "onnx_optax", "optax", "ratio")
  if "baseline" in out["env"]:
    lines += ["", f"the same for the baseline, onnx_optax {out['env']['baseline']}, against optax:", ""]
    lines += rows(out, "baseline", "optax", "baseline_ratio")
    lines += ["", "onnx_optax / baseline (below 1: this onnx_optax is faster than the baseline):", ""]
    lines += rows(out, "onnx_optax", "baseline", "ratio_to_baseline")
  return lines


def _time_rows(out: dict, a: str, b: str, key: str) -> list[str]:
  lines = []
  for row in out["rows"]:
    o, t, x = row["median"][a], row["median"][b], row[key]

    def cell(k, w, p, o=o, t=t, x=x):
      return f"{o[k]:{w}.{p}f}/{t[k]:<{w}.{p}f}{x[k]:5.2f}" if k in x else " " * (2 * w + 6)

    cpu = " ".join(
      f"{x[k]:5.2f}" for k in ("trace_cpu_s", "lower_cpu_s", "compile_cpu_s", "total_cpu_s") if k in x
    )
    lines.append(
      f"{row['tree']:8} {row['leaves']:6d} {row['rule']:14} {cell('trace_s', 4, 2)} "
      f"{cell('lower_s', 4, 2)} {cell('compile_s', 4, 2)} {cell('total_s', 5, 2)} "
      f"{cell('step_ms', 6, 2)}  {cpu:>23}"
    )
  return lines


def _leaf_rows(out: dict) -> list[str]:
  lines = [
    "",
    (
      "per leaf (first compile): jaxpr equations, StableHLO lines, kernels of the compiled step "
      "(fusions + unfused ops), temporary bytes of the donated step"
    ),
    "",
    (
      f"{'tree':8} {'leaves':>6} {'rule':14} {'eqns/leaf':>15} {'hlo lines/leaf':>15} "
      f"{'kernels/leaf':>15} {'temp bytes':>19}"
    ),
    (
      f"{'':8} {'':>6} {'':14} {'ours  optax':>15} {'ours  optax':>15} {'ours  optax':>15} "
      f"{'ours    optax':>19}"
    ),
  ]
  lines.append("-" * len(lines[-2]))
  for row in out["rows"]:
    o, t, n = row["median"]["onnx_optax"], row["median"]["optax"], row["leaves"]
    rows = [("", o)] + ([("baseline", row["median"]["baseline"])] if "baseline" in row["median"] else [])
    for label, o in rows:
      lines.append(
        f"{row['tree']:8} {n:6d} {(row['rule'] + ' ' + label).strip():14} "
        f"{o['jaxpr_eqns'] / n:7.1f} {t['jaxpr_eqns'] / n:7.1f} "
        f"{o['stablehlo_lines'] / n:7.1f} {t['stablehlo_lines'] / n:7.1f} "
        f"{o['kernels'] / n:7.3f} {t['kernels'] / n:7.3f} {o['temp_bytes']!s:>9} {t['temp_bytes']!s:>9}"
      )
  return lines


def environment(args, device) -> dict:
  import subprocess

  from run import _cpu_name

  # The onnx_optax that runs: a checkout, or an exported snapshot of one with
  # its commit in a COMMIT file (to measure a commit while the tree changes).
  root = os.path.dirname(os.path.dirname(os.path.abspath(onnx_optax.__file__)))
  try:
    with open(os.path.join(root, "COMMIT")) as f:
      commit = f.read().strip()[:60]
  except OSError:
    try:
      commit = subprocess.run(
        ["git", "-C", root, "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=True
      ).stdout.strip()[:60]
    except (OSError, subprocess.CalledProcessError):
      commit = "unknown"
    if (
      subprocess.run(
        ["git", "-C", root, "diff", "--quiet", "HEAD", "--", "onnx_optax"], check=False, capture_output=True
      ).returncode
      == 1
    ):
      commit += " + uncommitted changes"
  return {
    "python": platform.python_version(),
    "jax": jax.__version__,
    "jaxlib": __import__("jaxlib").__version__,
    "optax": optax.__version__,
    "numpy": np.__version__,
    "device": str(device),
    "device_kind": device.device_kind,
    "cpu_count": os.cpu_count(),
    "machine": platform.platform(),
    "processor": _cpu_name(),
    "commit": commit,
    "onnx_optax_path": os.path.dirname(onnx_optax.__file__),
    "command": " ".join(["python"] + sys.argv),
    "repeats": args.repeats,
    "step_repeats": 0 if args.no_step else args.step_repeats,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
  }


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rules", default=",".join(RULES), help=f"comma-separated, from {RULES}")
  ap.add_argument("--trees", default="16M,mix1000", help=f"comma-separated, from {TREES} or <n>M")
  ap.add_argument("--repeats", type=int, default=3, help="interleaved compiles per library (median)")
  ap.add_argument("--step-repeats", type=int, default=7, help="interleaved step samples per library")
  ap.add_argument("--no-step", action="store_true", help="compile only: no buffers, no step time")
  ap.add_argument("--target-ms", type=float, default=50.0, help="minimum duration of one step sample")
  ap.add_argument("--pause-ms", type=float, default=50.0, help="idle time before each step sample")
  ap.add_argument("--device", default="cpu", help="JAX platform: cpu, gpu, tpu")
  ap.add_argument(
    "--baseline",
    default=None,
    help="another onnx_optax to measure in the same run: a folder or a git revision (HEAD~1)",
  )
  ap.add_argument("--json", default=None, help="write every sample to this file")
  ap.add_argument("--text", default=None, help="write the tables to this file")
  ap.add_argument("--from-json", default=None, help="print the tables of an earlier run's --json file")
  ap.add_argument("--plot", default=None, help="PNG: compile time against leaves (benchmarks/plots.py)")
  args = ap.parse_args(argv)
  if args.from_json:
    with open(args.from_json) as f:
      saved = json.load(f)
    print(table(saved), end="")
    if args.plot:
      from plots import compile_plot

      compile_plot(saved, args.plot)
    return saved
  rules = [r for r in args.rules.split(",") if r]
  trees = [t for t in args.trees.split(",") if t]
  for r in rules:
    if r not in RULES:
      ap.error(f"--rules: unknown rule {r!r}; known: {RULES}")
  for t in trees:
    try:
      tree_shapes(t)
    except ValueError as e:
      ap.error(f"--trees: {e}")
  device = jax.devices(args.device)[0]
  env = environment(args, device)
  if args.baseline:
    env["baseline"] = add_baseline(args.baseline)
  print("# " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
  out: dict[str, Any] = {"env": env, "rows": []}
  t_start = time.perf_counter()
  for tree in trees:
    for rule in rules:
      row = measure(tree, rule, args.repeats, 0 if args.no_step else args.step_repeats, device, args)
      out["rows"].append(row)
      m = row["median"]
      print(
        f"[{time.perf_counter() - t_start:6.0f}s] {tree} {rule}: total "
        f"{m['onnx_optax']['total_s']:.2f}/{m['optax']['total_s']:.2f} s "
        + ", ".join(f"{k} x{v:.2f}" for k, v in row["ratio"].items())
        + f"; kernels {m['onnx_optax']['kernels']}/{m['optax']['kernels']}, temp "
        f"{m['onnx_optax']['temp_bytes']}/{m['optax']['temp_bytes']} B",
        flush=True,
      )
      save(args, out)  # After every row: a run cut short keeps what it measured.
  env["wall_s"] = round(time.perf_counter() - t_start, 1)
  print()
  print(save(args, out))
  if args.plot:
    from plots import compile_plot

    compile_plot(out, args.plot)
  return out


def save(args, out: dict, render: Callable[[dict], str] | None = None) -> str:
  """Writes ``--json`` and ``--text`` (if asked); returns the tables (``render``, default :func:`table`)."""
  text = (render or table)(out)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  if args.text:
    with open(args.text, "w") as f:
      f.write(text)
  return text


if __name__ == "__main__":
  main()
