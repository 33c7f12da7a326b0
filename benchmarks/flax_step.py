"""A whole Flax NNX training step: compile and step time, onnx_optax against Optax.

The model is a small transformer encoder (``--blocks`` blocks, default 24, of
pre-norm multi-head attention and MLP, 16 parameter leaves each, plus token
and position embeddings, a final norm and a head: 390 parameter leaves at 24
blocks). One training step (forward, backward, ``nnx.Optimizer(model, tx,
wrt=nnx.Param).update(model, grads)``) is one function of the split
``(model, optimizer)`` state, jitted with ``donate_argnums=0`` so that the
parameters and the optimizer state are updated in place.

For each rule, onnx_optax's transform and Optax's nearest built-in
(``optax.adam`` for both Adams, ``optax.sgd(momentum=...)``,
``optax.adagrad``) are measured in one process, interleaved (alternating
order), repeated, medians:

* trace, lower and compile time of the step, separately, each sample from a
  fresh function after ``jax.clear_caches()``;
* kernels of the compiled step (``scale.kernels``);
* step time on a batch of tokens.

Ratios are onnx_optax over Optax: **below 1, onnx_optax is faster**.

Usage (from the repository root; needs ``flax``)::

  python benchmarks/flax_step.py                       # adam; ~3 min on 2 cores
  python benchmarks/flax_step.py --rules momentum,nesterov,adagrad,adam,directml_adam --repeats 3
  python benchmarks/flax_step.py --device gpu --json out.json --text out.txt
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flax
from run import RULES
from scale import (
  LIBRARIES,
  MAKERS,
  TIMES,
  add_baseline,
  comparisons,
  count_eqns,
  environment,
  kernels,
  ratios,
  rotation,
  save,
)


class Block(nnx.Module):
  """Pre-norm encoder block: attention and an MLP, each with a residual."""

  def __init__(self, width: int, heads: int, rngs: nnx.Rngs):
    self.norm1 = nnx.LayerNorm(width, rngs=rngs)
    self.attention = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(width, rngs=rngs)
    self.up = nnx.Linear(width, 4 * width, rngs=rngs)
    self.down = nnx.Linear(4 * width, width, rngs=rngs)

  def __call__(self, x):
    x = x + self.attention(self.norm1(x))
    return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class Encoder(nnx.Module):
  """Token and position embeddings, ``blocks`` blocks, a final norm, a head."""

  def __init__(self, vocab: int, length: int, width: int, heads: int, blocks: int, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab, width, rngs=rngs)
    self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (length, width)))
    self.blocks = nnx.List([Block(width, heads, rngs) for _ in range(blocks)])
    self.norm = nnx.LayerNorm(width, rngs=rngs)
    self.head = nnx.Linear(width, vocab, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.position[...]
    for block in self.blocks:
      x = block(x)
    return self.head(self.norm(x))


def build(library: str, rule: str, args) -> tuple[Any, Any, Any]:
  """The graph definition, the donated state and the step function."""
  model = Encoder(args.vocab, args.length, args.width, args.heads, args.blocks, nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, MAKERS[library](rule), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))

  def step(state, tokens, labels):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
      logits = model(tokens)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss

  return graphdef, state, step


def batch(args):
  key = jax.random.key(1)
  tokens = jax.random.randint(key, (args.batch, args.length), 0, args.vocab)
  return tokens, jnp.roll(tokens, -1, axis=1)


def compile_once(library: str, rule: str, args, tokens, labels) -> tuple[dict, Any, Any]:
  jax.clear_caches()
  gc.collect()
  _, state, step = build(library, rule, args)
  c0, t0 = time.process_time(), time.perf_counter()
  traced = jax.jit(step, donate_argnums=0).trace(state, tokens, labels)
  c1, t1 = time.process_time(), time.perf_counter()
  lowered = traced.lower()
  c2, t2 = time.process_time(), time.perf_counter()
  compiled = lowered.compile()
  c3, t3 = time.process_time(), time.perf_counter()
  k = kernels(compiled)
  ma = compiled.memory_analysis()
  sample = {
    "trace_s": t1 - t0,
    "lower_s": t2 - t1,
    "compile_s": t3 - t2,
    "total_s": t3 - t0,
    "trace_cpu_s": c1 - c0,
    "lower_cpu_s": c2 - c1,
    "compile_cpu_s": c3 - c2,
    "total_cpu_s": c3 - c0,
    "jaxpr_eqns": count_eqns(traced.jaxpr),
    "kernels": sum(k.values()),
    "kernel_ops": k,
    "temp_bytes": None if ma is None else ma.temp_size_in_bytes,
  }
  return sample, compiled, state


def measure(rule: str, args, tokens, labels) -> dict:
  samples: dict[str, list[dict]] = {lib: [] for lib in LIBRARIES}
  compiled, states = {}, {}
  for r in range(args.repeats):
    for lib in rotation(r):
      sample, compiled[lib], states[lib] = compile_once(lib, rule, args, tokens, labels)
      samples[lib].append(sample)
  model = Encoder(args.vocab, args.length, args.width, args.heads, args.blocks, nnx.Rngs(0))
  leaves = len(jax.tree.leaves(nnx.state(model, nnx.Param)))
  med = {lib: {k: statistics.median(s[k] for s in samples[lib]) for k in TIMES} for lib in LIBRARIES}
  for lib in LIBRARIES:
    med[lib].update({k: samples[lib][0][k] for k in ("jaxpr_eqns", "kernels", "temp_bytes")})
  row: dict[str, Any] = {"rule": rule, "param_leaves": leaves, "samples": samples, "median": med}
  if args.step_repeats:
    boxes = {lib: [states[lib]] for lib in LIBRARIES}
    losses = {}

    def run(lib, n):
      s = boxes[lib][0]
      for _ in range(n):
        s, loss = compiled[lib](s, tokens, labels)
      losses[lib] = float(loss)
      boxes[lib][0] = s

    inner = {}
    for lib in LIBRARIES:
      run(lib, 2)
      t0 = time.perf_counter()
      run(lib, 1)
      inner[lib] = max(1, int(args.target_ms / 1e3 / max(time.perf_counter() - t0, 1e-6)))
    times: dict[str, list[float]] = {lib: [] for lib in LIBRARIES}
    for r in range(args.step_repeats):
      for lib in rotation(r):
        time.sleep(args.pause_ms / 1e3)
        t0 = time.perf_counter()
        run(lib, inner[lib])
        times[lib].append((time.perf_counter() - t0) / inner[lib])
    row["step_samples_ms"] = {lib: [1e3 * t for t in ts] for lib, ts in times.items()}
    row["final_loss"] = losses
    for lib in LIBRARIES:
      med[lib]["step_ms"] = 1e3 * statistics.median(times[lib])
  ratios(row)
  return row


def table(out: dict) -> str:
  env = out["env"]
  lines = [
    (
      f"jax {env['jax']}, jaxlib {env['jaxlib']}, optax {env['optax']}, flax {env['flax']}; "
      f"{env['device_kind']} ({env['device']}), {env['cpu_count']} CPU cores ({env['processor']})"
    ),
    (
      f"command: {env['command']}; XLA_FLAGS={env['xla_flags']!r}; started {env['started']}; "
      f"onnx_optax commit {env['commit']}; {env.get('wall_s', '(partial run)')} s"
    ),
    (
      f"model: {env['model']}; medians of {env['repeats']} interleaved compiles (fresh function, "
      f"jax.clear_caches()) and {env['step_repeats']} interleaved step samples; ratio = onnx_optax / optax "
      "(below 1: onnx_optax faster)"
    ),
    "",
    (
      f"{'rule':14} {'leaves':>6} {'trace s':>15} {'lower s':>15} {'compile s':>17} {'total s':>17} "
      f"{'step ms':>17} {'kernels':>11}  CPU-time ratios: trace lower compile total"
    ),
  ]
  lines.append("-" * len(lines[-1]))
  lines += comparisons(out, _rows)
  return "\n".join(lines) + "\n"


def _rows(out: dict, a: str, b: str, key: str) -> list[str]:
  lines = []
  for row in out["rows"]:
    o, t, x = row["median"][a], row["median"][b], row[key]

    def cell(k, w, o=o, t=t, x=x):
      return f"{o[k]:{w}.2f}/{t[k]:<{w}.2f}{x[k]:5.2f}" if k in x else " " * (2 * w + 6)

    lines.append(
      f"{row['rule']:14} {row['param_leaves']:6d} {cell('trace_s', 4)} {cell('lower_s', 4)} "
      f"{cell('compile_s', 5)} {cell('total_s', 5)} {cell('step_ms', 5)} "
      f"{o['kernels']:5d}/{t['kernels']:<5d}  " + " ".join(f"{x[k]:5.2f}" for k in TIMES[4:] if k in x)
    )
  return lines


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rules", default="adam", help=f"comma-separated, from {RULES}")
  ap.add_argument("--repeats", type=int, default=3, help="interleaved compiles per library (median)")
  ap.add_argument("--step-repeats", type=int, default=7, help="interleaved step samples per library")
  ap.add_argument("--blocks", type=int, default=24)
  ap.add_argument("--width", type=int, default=64)
  ap.add_argument("--heads", type=int, default=4)
  ap.add_argument("--length", type=int, default=64, help="tokens per sequence")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--vocab", type=int, default=256)
  ap.add_argument("--target-ms", type=float, default=100.0, help="minimum duration of one step sample")
  ap.add_argument("--pause-ms", type=float, default=50.0, help="idle time before each step sample")
  ap.add_argument("--device", default="cpu", help="JAX platform: cpu, gpu, tpu")
  ap.add_argument(
    "--baseline",
    default=None,
    help="another onnx_optax to measure in the same run: a folder or a git revision (HEAD~1)",
  )
  ap.add_argument("--json", default=None)
  ap.add_argument("--text", default=None)
  ap.add_argument("--from-json", default=None, help="print the table of an earlier run's --json file")
  args = ap.parse_args(argv)
  if args.from_json:
    with open(args.from_json) as f:
      saved = json.load(f)
    print(table(saved), end="")
    return saved
  args.no_step = args.step_repeats == 0
  rules = [r for r in args.rules.split(",") if r]
  for r in rules:
    if r not in RULES:
      ap.error(f"--rules: unknown rule {r!r}; known: {RULES}")
  device = jax.devices(args.device)[0]
  env = environment(args, device)
  if args.baseline:
    env["baseline"] = add_baseline(args.baseline)
  env["flax"] = flax.__version__
  env["model"] = (
    f"{args.blocks} blocks, width {args.width}, {args.heads} heads, MLP {4 * args.width}, "
    f"vocab {args.vocab}, batch {args.batch} x {args.length} tokens, float32"
  )
  print("# " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
  out: dict[str, Any] = {"env": env, "rows": []}
  t_start = time.perf_counter()
  with jax.default_device(device):
    tokens, labels = batch(args)
    for rule in rules:
      row = measure(rule, args, tokens, labels)
      out["rows"].append(row)
      m = row["median"]
      print(
        f"[{time.perf_counter() - t_start:6.0f}s] {rule}: {row['param_leaves']} leaves, total "
        f"{m['onnx_optax']['total_s']:.2f}/{m['optax']['total_s']:.2f} s, "
        + ", ".join(f"{k} x{v:.2f}" for k, v in row["ratio"].items()),
        flush=True,
      )
      save(args, out, table)
  env["wall_s"] = round(time.perf_counter() - t_start, 1)
  print()
  print(save(args, out, table))
  return out


if __name__ == "__main__":
  main()
