"""Does a change leave the compiled step as it was? Compares two onnx_optax's optimized HLO.

For each registered rule (and each of its variants: Momentum's two modes, ONNX
Runtime AdamW's two ``adam_mode``, PyTorch SGD's Nesterov), each dtype and each
tree, compiles the donated step (``scale.make_step``) with this checkout's
onnx_optax and with another revision's (``scale.add_baseline``) and compares
``compile().as_text()`` line by line as a multiset, after removing what names and
source locations change without changing the program (instruction and
computation names, ``metadata={...}``, the stack-frame tables). Equal: the same
instructions, shapes, fusions and constants, so the same step time and the same
bits. The rules run with their test configurations (every term of the formula
non-zero), the same hyperparameters for both revisions.

With ``--compile-tree`` (default ``mix1000``, a model-like tree of 1,000
leaves) it also times the step's trace, lower and compile from scratch
(``jax.clear_caches()`` first) for both revisions, interleaved and repeated
(``--repeats``, alternating which revision goes first), and prints the medians
and their ratio (this checkout over the baseline): compile time is the cost a
change to the engine can add without changing the program.

Usage (from the repository root)::

  python benchmarks/same_program.py HEAD~1                        # every rule, one leaf and mix100
  python benchmarks/same_program.py main --trees mix1000 --rules adam --dtypes float32
  python benchmarks/same_program.py HEAD~1 --trees leaf --compile-tree mix1000 --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import importlib

import jax
import jax.numpy as jnp
import scale

from onnx_optax import registry

_FRAMES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
#: A tree of one leaf beside the model-like trees of ``scale.tree_shapes``.
ONE_LEAF = "leaf"


def normalized(text: str) -> list[str]:
  """The optimized HLO's lines, sorted, without names and source locations."""
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  text = re.sub(r"HloModule \S+", "HloModule", text)
  text = re.sub(r"%[\w\-\.]+", "%", text)
  text = re.sub(r"\b(fused_computation|wrapped_\w+|fusion|region)[\w\.\-]*", r"\1", text)
  return sorted(
    line.strip()
    for line in text.splitlines()
    if line.strip() and not re.match(r"^\s*\d+ [\"{]", line) and not any(f in line for f in _FRAMES)
  )


def configurations() -> dict[str, tuple[str, dict]]:
  """Every rule and variant the registry holds: name -> (transform name, hyperparameters)."""
  out = {}
  for rule in registry.rules():
    assert rule.conformance is not None, rule.name
    tests = rule.conformance.tests
    if not rule.variants:
      out[rule.name] = (rule.name, dict(tests.hyper))
    for variant in rule.variants:
      hyper = dict(variant.tests.hyper) if variant.tests else {**tests.hyper, **variant.hyper}
      out[f"{rule.name}_{variant.suffix}"] = (rule.name, hyper)
    for suffix, more in rule.conformance.more_tests.items():
      out[f"{rule.name}_{suffix}"] = (rule.name, dict(more.hyper))
  return out


def _tree(tree: str, dtype: str) -> dict:
  shapes = [(1000,)] if tree == ONE_LEAF else scale.tree_shapes(tree)
  return {f"leaf{i:05d}": jax.ShapeDtypeStruct(s, jnp.dtype(dtype)) for i, s in enumerate(shapes)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("baseline", help="a git revision or a folder (see scale.py --baseline)")
  ap.add_argument("--trees", default=f"{ONE_LEAF},mix100")
  ap.add_argument("--dtypes", default="float32,bfloat16")
  ap.add_argument("--rules", default="", help="comma-separated names of configurations(); default all")
  ap.add_argument("--compile-tree", default="mix1000", help="the tree timed to compile ('': none)")
  ap.add_argument("--repeats", type=int, default=3, help="interleaved compiles per revision (median)")
  args = ap.parse_args(argv)
  print(f"baseline: {scale.add_baseline(args.baseline)}")
  libraries = {"onnx_optax": importlib.import_module("onnx_optax"), "baseline": scale.baseline_module()}
  chosen = configurations()
  if args.rules:
    chosen = {name: chosen[name] for name in args.rules.split(",")}
  different = 0
  for tree in args.trees.split(","):
    for dtype in args.dtypes.split(","):
      params = _tree(tree, dtype)
      for name, (transform, hyper) in chosen.items():
        texts = {}
        for lib, module in libraries.items():
          opt = getattr(module, transform)(0.01, **hyper)
          state = jax.eval_shape(opt.init, params)
          step = jax.jit(scale.make_step(opt), donate_argnums=(0, 1))
          texts[lib] = normalized(step.lower(params, state, params).compile().as_text() or "")
        same = texts["onnx_optax"] == texts["baseline"]
        different += not same
        verdict = "same program" if same else "DIFFERENT"
        print(f"{tree:7} {dtype:9} {name:22} {verdict} ({len(texts['baseline'])} lines)", flush=True)
  print(f"{different} different" if different else "every program the same")
  if args.compile_tree:
    _compile_times(libraries, chosen, args.compile_tree, args.repeats)
  return 1 if different else 0


def _compile_time(module, transform: str, hyper: dict, params: dict) -> float:
  """Seconds to trace, lower and compile the step from scratch."""
  jax.clear_caches()
  gc.collect()
  opt = getattr(module, transform)(0.01, **hyper)
  state = jax.eval_shape(opt.init, params)
  start = time.perf_counter()
  jax.jit(scale.make_step(opt), donate_argnums=(0, 1)).lower(params, state, params).compile()
  return time.perf_counter() - start


def _compile_times(libraries: dict, chosen: dict, tree: str, repeats: int) -> None:
  """Median compile seconds of both revisions, interleaved, and their ratio (this checkout / baseline)."""
  params = _tree(tree, "float32")
  print(f"\ncompile time, {tree} float32, median of {repeats} interleaved (load {os.getloadavg()[0]:.1f}):")
  print(f"{'rule':22} {'onnx_optax s':>12} {'baseline s':>11} {'ratio':>6}")
  ratios = []
  for name, (transform, hyper) in chosen.items():
    times: dict[str, list[float]] = {lib: [] for lib in libraries}
    for r in range(repeats):
      order = list(libraries) if r % 2 == 0 else list(reversed(libraries))
      for lib in order:
        times[lib].append(_compile_time(libraries[lib], transform, hyper, params))
    ours, base = statistics.median(times["onnx_optax"]), statistics.median(times["baseline"])
    ratios.append(ours / base)
    print(f"{name:22} {ours:12.2f} {base:11.2f} {ours / base:6.2f}", flush=True)
  print(f"median ratio {statistics.median(ratios):.2f} (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
  sys.exit(main())
