"""Step time of onnx_optax against Optax's built-ins and PyTorch, in one run.

For each rule and each tree size this script times one optimizer step

* of onnx_optax: ``params, state = step(params, state, grads)``, jitted with
  ``donate_argnums=(0, 1)`` so that the parameters and the state are updated
  in place, the update applied with ``optax.apply_updates`` inside the jit;
* of Optax's nearest built-in (``optax.sgd(momentum=..., nesterov=...)``,
  ``optax.adagrad``, ``optax.adam``; ``optax.adamw`` and ``optax.sgd`` for
  ONNX Runtime's AdamW and SGD), jitted and donated the same way;
* of PyTorch's matching optimizer (``torch.optim.SGD``, ``Adagrad``, ``Adam``,
  ``AdamW``)
  with ``foreach=True`` and, where PyTorch supports it for that optimizer on
  that device, ``fused=True``;

all interleaved round-robin in the same process (each repeat times every
contender once, in a rotating order), and reports the median per contender as
a ratio to onnx_optax (above 1: onnx_optax is faster). Interleaving and
medians are what make the ratios trustworthy on a shared machine: a burst of
load from another process hits every contender of the same repeat alike.

An optimizer step is memory-bound: the script divides the minimum traffic of a
step (read parameters, gradients and ``k`` state tensors, write parameters and
state: ``(3 + 2k) * n * 4`` bytes for float32) by the step time, and compares
it with the bandwidth of a plain pass over as many elements, timed in the same
repeats as the optimizers (a jitted, donated JAX copy and axpy,
``torch.Tensor.copy_`` and ``Tensor.add_``; the fastest of them is the
reference).

It also prints, from ``jax.jit(step, donate_argnums=(0, 1)).lower(...)
.compile().memory_analysis()``, the state size over the parameter size and
the temporary buffer of each onnx_optax step, and the compile time (lower +
compile) of every jitted step, the 1,000-leaf tree's in the summary.

Usage (from the repository root)::

  python benchmarks/run.py                       # everything, CPU, ~10 min on 2 cores
  python benchmarks/run.py --rules adam --sizes 1M,16M --repeats 5   # quick
  python benchmarks/run.py --device gpu --json out.json --markdown out.md

Requires ``torch`` for the PyTorch columns (``--no-torch`` skips them).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# JAX takes 75% of a GPU's memory at start by default; PyTorch shares the GPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

try:
  import onnx_optax  # noqa: E402
except ImportError:  # Run from a checkout without installing: use the checkout's package.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import onnx_optax  # noqa: E402

RULES = ("momentum", "nesterov", "adagrad", "adam", "directml_adam", "ort_adamw", "ort_sgd")
SIZES = ("1M", "16M", "64M", "500x64x64", "mix1000")

#: Number of state tensors per parameter (``k``).
STATE_TENSORS = {
  "momentum": 1,
  "nesterov": 1,
  "adagrad": 1,
  "adam": 2,
  "directml_adam": 2,
  "ort_adamw": 2,
  "ort_sgd": 0,
}

LR = 1e-3
WD = 1e-4  # AdamW's weight decay (Optax's default), read from the parameters by every contender


# --------------------------------------------------------------------------- trees


def tree_shapes(size: str) -> list[tuple[int, ...]]:
  """The leaf shapes of one benchmark size.

  ``mix1000`` is model-like: 40 blocks of 25 leaves (attention and MLP
  matrices, biases, norms, a small convolution, a scalar), 16 distinct shapes,
  about 8M elements. XLA:CPU compiles one kernel per distinct fusion, so a
  tree whose 1,000 shapes are all different compiles for about a minute with
  Optax and with onnx_optax alike (see docs/benchmarks.md).
  """
  if size.endswith("M") and size[:-1].isdigit():
    return [(int(size[:-1]) << 20,)]
  if size == "500x64x64":
    return [(64, 64)] * 500
  if size == "mix1000":
    attention = [(128, 128)] * 4 + [(128,)] * 4  # q, k, v, o and their biases
    norms = [(128,)] * 4  # two norms (scale, bias)
    mlp = [(128, 512), (512,), (512, 128), (128,)]
    conv = [(3, 3, 16, 16), (16,), (3, 3, 16, 16), (16,)]  # a small convolution
    odd = [(64, 32), (32,), (5, 5, 3, 8), (8,), ()]  # odd shapes, a scalar
    block = attention + norms + mlp + conv + odd
    assert len(block) == 25
    return block * 40
  raise ValueError(f"unknown size {size!r}; known: {SIZES} or <n>M")


def make_trees(shapes, device) -> tuple[dict, dict]:
  """Deterministic float32 parameters ~N(0, 1) and gradients ~N(0, 1e-3)."""
  key = jax.random.key(0)
  params, grads = {}, {}
  for i, shape in enumerate(shapes):
    kp, kg = jax.random.split(jax.random.fold_in(key, i))
    name = f"leaf{i:04d}"
    params[name] = jax.device_put(jax.random.normal(kp, shape, jnp.float32), device)
    grads[name] = jax.device_put(1e-3 * jax.random.normal(kg, shape, jnp.float32), device)
  return params, grads


# --------------------------------------------------------------------------- optimizers


def onnx_optimizer(rule: str) -> optax.GradientTransformation:
  """onnx_optax with the hyperparameters of the Optax / PyTorch counterparts."""
  if rule in ("momentum", "nesterov"):
    mode = "standard" if rule == "momentum" else "nesterov"
    return onnx_optax.momentum(LR, alpha=0.9, beta=1.0, mode=mode, norm_coefficient=0.0)
  if rule == "adagrad":
    return onnx_optax.adagrad(LR, epsilon=1e-6)
  if rule == "adam":
    return onnx_optax.adam(LR, alpha=0.9, beta=0.999, epsilon=1e-8)
  if rule == "directml_adam":
    return onnx_optax.directml_adam(LR, beta1=0.9, beta2=0.999, epsilon=1e-8)
  if rule == "ort_adamw":
    return onnx_optax.ort_adamw(LR, alpha=0.9, beta=0.999, epsilon=1e-8, weight_decay=WD, adam_mode=0)
  if rule == "ort_sgd":
    return onnx_optax.ort_sgd(LR)
  raise ValueError(rule)


def optax_optimizer(rule: str) -> optax.GradientTransformation:
  """Optax's nearest built-in."""
  if rule in ("momentum", "nesterov"):
    return optax.sgd(LR, momentum=0.9, nesterov=rule == "nesterov")
  if rule == "adagrad":
    return optax.adagrad(LR, eps=1e-6)
  if rule == "ort_adamw":
    return optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=WD)
  if rule == "ort_sgd":
    return optax.sgd(LR)
  return optax.adam(LR, b1=0.9, b2=0.999, eps=1e-8)


def torch_optimizer(torch, rule: str, params: list, flavor: str):
  """PyTorch's matching optimizer; ``flavor`` is "foreach" or "fused"."""
  kw = {flavor: True}
  if flavor == "fused":
    kw["foreach"] = False
  if rule in ("momentum", "nesterov"):
    return torch.optim.SGD(params, lr=LR, momentum=0.9, nesterov=rule == "nesterov", **kw)
  if rule == "adagrad":
    return torch.optim.Adagrad(params, lr=LR, eps=1e-6, **kw)
  if rule == "ort_adamw":
    return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD, **kw)
  if rule == "ort_sgd":
    return torch.optim.SGD(params, lr=LR, **kw)
  return torch.optim.Adam(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, **kw)


# --------------------------------------------------------------------------- contenders


@dataclasses.dataclass
class Contender:
  """Something timed: ``run(n)`` does ``n`` steps and waits for them."""

  name: str
  run: Callable[[int], None]
  compile_s: float | None = None
  memory: Any = None
  inner: int = 1
  times: list[float] = dataclasses.field(default_factory=list)
  nbytes: int = 0  # The bytes a copy reference moves per step.
  state_bytes: int = 0  # The optimizer state's floating bytes.

  def sample(self, pause_s: float = 0.0) -> None:
    # PyTorch's OpenMP threads and XLA's thread pool spin for a while after
    # their work ends; on a small machine a spinning pool slows down whoever
    # runs next. The pause lets it park before the clock starts.
    time.sleep(pause_s)
    t0 = time.perf_counter()
    self.run(self.inner)
    self.times.append((time.perf_counter() - t0) / self.inner)

  @property
  def median(self) -> float:
    return statistics.median(self.times)


def jax_contender(name, opt, params, grads) -> Contender:
  """A donated, jitted ``step`` of ``opt``; params and state live in a closure."""
  # Own copies: donation invalidates the buffers that go in.
  params = jax.tree.map(jnp.copy, params)
  state = opt.init(params)

  def step(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  t0 = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads).compile()
  compile_s = time.perf_counter() - t0
  box = [params, state]

  def run(n):
    p, s = box
    for _ in range(n):
      p, s = compiled(p, s, grads)
    jax.block_until_ready(p)
    box[:] = [p, s]

  return Contender(
    name, run, compile_s, compiled.memory_analysis(), state_bytes=tree_bytes(state, floating_only=True)
  )


def torch_contender(torch, tdev, rule, flavor, params, grads) -> Contender | None:
  """``opt.step()`` of PyTorch's optimizer, or None if ``flavor`` is unsupported."""
  tparams: list[Any] = []
  for name in sorted(params):
    p = torch.from_numpy(np.array(params[name])).to(tdev)
    p.requires_grad_(True)
    p.grad = torch.from_numpy(np.array(grads[name])).to(tdev)
    tparams.append(p)
  try:
    opt = torch_optimizer(torch, rule, tparams, flavor)
    opt.step()  # Creates the state; raises if the flavor is unsupported here.
  except (RuntimeError, ValueError, TypeError) as e:
    print(f"  torch {flavor} {rule}: unsupported here ({str(e).splitlines()[0][:80]})", file=sys.stderr)
    return None
  sync = torch.cuda.synchronize if tdev.type == "cuda" else (lambda: None)

  def run(n):
    for _ in range(n):
      opt.step()
    sync()

  return Contender(f"torch_{flavor}", run)


def copy_contenders(params_shapes, device, torch, tdev) -> list[Contender]:
  """A plain copy and an axpy over ``n`` float32 elements, JAX and torch.

  The axpy (two reads, one write) is usually the fastest of the four when
  counted in bytes read + written: every write also reads its cache line
  first (write-allocate), which costs a copy relatively more. The fastest of
  them is the reference of the "% copy" columns.
  """
  n = sum(int(np.prod(s)) for s in params_shapes)
  x = jax.device_put(jnp.ones((n,), jnp.float32), device)
  out = []
  # The output reuses the donated first argument's buffer (kept although
  # unused, or jit would drop it and its donation): one read, one write.
  jcopy = jax.jit(lambda dst, src: -src, donate_argnums=0, keep_unused=True).lower(x, x).compile()
  # y <- a * x + y: two reads, one write, the pattern of an optimizer stream.
  jaxpy = jax.jit(lambda y, x: 0.5 * x + y, donate_argnums=0).lower(x, x).compile()
  for name, fn, nbytes in (("jax_copy", jcopy, 8 * n), ("jax_axpy", jaxpy, 12 * n)):
    box = [jnp.copy(x)]

    def run(k, fn=fn, box=box):
      y = box[0]
      for _ in range(k):
        y = fn(y, x)
      jax.block_until_ready(y)
      box[0] = y

    out.append(Contender(name, run, nbytes=nbytes))
  if torch is not None:
    src = torch.ones(n, device=tdev)
    dst = torch.zeros(n, device=tdev)
    sync = torch.cuda.synchronize if tdev.type == "cuda" else (lambda: None)

    def trun(k):
      for _ in range(k):
        dst.copy_(src)
      sync()

    def taxpy(k):
      for _ in range(k):
        dst.add_(src, alpha=0.5)
      sync()

    for name, torch_run, nbytes in (("torch_copy", trun, 8 * n), ("torch_axpy", taxpy, 12 * n)):
      out.append(Contender(name, torch_run, nbytes=nbytes))
  return out


def _ratio_cell(ratio: dict[str, float], k: str) -> str:
  return f"{ratio[k]:.2f}" if k in ratio else "n/a"


def calibrate(contenders: list[Contender], target_s: float) -> None:
  """Warms each contender up and picks its steps per sample (>= target_s)."""
  for c in contenders:
    c.run(2)
    t0 = time.perf_counter()
    c.run(1)
    dt = max(time.perf_counter() - t0, 1e-6)
    c.inner = max(1, min(1000, int(target_s / dt)))


def interleave(contenders: list[Contender], repeats: int, pause_s: float) -> None:
  """Round-robin: every repeat samples every contender, in a rotating order."""
  for r in range(repeats):
    k = r % len(contenders)
    for c in contenders[k:] + contenders[:k]:
      c.sample(pause_s)


# --------------------------------------------------------------------------- main


def nbytes_min(shapes, rule: str) -> int:
  """The traffic of a step that touches each tensor once (float32)."""
  n = sum(int(np.prod(s)) for s in shapes)
  return (3 + 2 * STATE_TENSORS[rule]) * 4 * n


def tree_bytes(tree, floating_only: bool = False) -> int:
  """Bytes of a tree's arrays (only the floating ones: not the count)."""
  return sum(
    x.size * x.dtype.itemsize
    for x in jax.tree.leaves(tree)
    if not floating_only or jnp.issubdtype(x.dtype, jnp.floating)
  )


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rules", default=",".join(RULES), help=f"comma-separated, from {RULES}")
  ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, from {SIZES} or <n>M")
  ap.add_argument("--repeats", type=int, default=7, help="interleaved samples per contender (median)")
  ap.add_argument("--target-ms", type=float, default=20.0, help="minimum duration of one sample")
  ap.add_argument(
    "--pause-ms",
    type=float,
    default=50.0,
    help="idle time before each sample, for spinning thread pools to park",
  )
  ap.add_argument("--device", default="cpu", choices=("cpu", "gpu", "tpu"))
  ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch columns")
  ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all cores)")
  ap.add_argument("--json", default=None, help="write all results to this file")
  ap.add_argument("--markdown", default=None, help="write the tables to this file")
  ap.add_argument("--plot", default=None, help="PNG: step time against size (one-leaf sizes; plots.py)")
  args = ap.parse_args(argv)
  rules = [r for r in args.rules.split(",") if r]
  sizes = [s for s in args.sizes.split(",") if s]
  for r in rules:
    if r not in RULES:
      ap.error(f"--rules: unknown rule {r!r}; known: {RULES}")
  for s in sizes:
    try:
      tree_shapes(s)
    except ValueError as e:
      ap.error(f"--sizes: {e}")

  device = jax.devices(args.device)[0]
  torch: Any = None
  tdev: Any = None
  if not args.no_torch:
    import torch  # noqa: PLC0415 (optional dependency)

    torch.set_num_threads(args.threads or os.cpu_count())
    if args.device == "tpu":
      ap.error("--device tpu: PyTorch has no TPU columns here (use --no-torch)")
    tdev = torch.device("cuda" if args.device == "gpu" else "cpu")
    if tdev.type == "cuda" and not torch.cuda.is_available():
      ap.error("--device gpu: this torch has no CUDA (use --no-torch)")
  env = {
    "python": platform.python_version(),
    "jax": jax.__version__,
    "jaxlib": __import__("jaxlib").__version__,
    "optax": optax.__version__,
    "numpy": np.__version__,
    "torch": None if torch is None else torch.__version__,
    "device": str(device),
    "device_kind": device.device_kind,
    "cpu_count": os.cpu_count(),
    "machine": platform.platform(),
    "processor": _cpu_name(),
    "torch_threads": None if torch is None else torch.get_num_threads(),
    "command": " ".join(["python"] + sys.argv),
    "repeats": args.repeats,
    "pause_ms": args.pause_ms,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
  }
  print("# " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
  t_start = time.perf_counter()
  results: list[dict[str, Any]] = []
  copies: dict[str, Any] = {}
  memory: list[Any] = []
  for size in sizes:
    shapes = tree_shapes(size)
    params, grads = make_trees(shapes, device)
    copy = copy_contenders(shapes, device, torch, tdev)
    calibrate(copy, args.target_ms / 1e3)
    copies[size] = {c.name: [] for c in copy}
    for rule in rules:
      cs = [
        jax_contender("onnx_optax", onnx_optimizer(rule), params, grads),
        jax_contender("optax", optax_optimizer(rule), params, grads),
      ]
      if torch is not None:
        for flavor in ("foreach", "fused"):
          c = torch_contender(torch, tdev, rule, flavor, params, grads)
          if c is not None:
            cs.append(c)
      calibrate(cs, args.target_ms / 1e3)
      # The copies run in the same repeats as the optimizers: the load of the
      # machine changes within a run, and "% copy" must compare like with like.
      for c in copy:
        c.times = []
      interleave(cs + copy, args.repeats, args.pause_ms / 1e3)
      row_copy = {c.name: c.nbytes / c.median / 1e9 for c in copy}
      for name, bw in row_copy.items():
        copies[size][name].append(bw)
      copy_bw = max(row_copy.values())
      base = cs[0].median
      nbytes = nbytes_min(shapes, rule)
      row = {
        "rule": rule,
        "size": size,
        "leaves": len(shapes),
        "elements": sum(int(np.prod(s)) for s in shapes),
        "onnx_optax_ms": 1e3 * base,
        "ratio": {c.name: c.median / base for c in cs[1:]},
        "ms": {c.name: 1e3 * c.median for c in cs},
        "samples_ms": {c.name: [1e3 * t for t in c.times] for c in cs},
        "min_bytes": nbytes,
        "copy_GBps": copy_bw,
        "copies_GBps": row_copy,
        "GBps": {c.name: nbytes / c.median / 1e9 for c in cs},
        "compile_s": {c.name: c.compile_s for c in cs if c.compile_s is not None},
      }
      results.append(row)
      ma, P, S = cs[0].memory, tree_bytes(params), cs[0].state_bytes
      memory.append(
        {
          "rule": rule,
          "size": size,
          "param_bytes": P,
          "state_bytes": S,
          "k": S / P,
          "argument_bytes": ma.argument_size_in_bytes,
          "temp_bytes": ma.temp_size_in_bytes,
          "alias_bytes": ma.alias_size_in_bytes,
          "output_bytes": ma.output_size_in_bytes,
        }
      )
      print(
        f"[{time.perf_counter() - t_start:6.0f}s] {size} {rule}: onnx_optax {1e3 * base:.3f} ms, "
        + ", ".join(f"{k} x{v:.2f}" for k, v in row["ratio"].items())
        + f", {100 * row['GBps']['onnx_optax'] / copy_bw:.0f}% of copy ({copy_bw:.1f} GB/s)",
        flush=True,
      )
      del cs
      gc.collect()
      # Written after every row, so that a run cut short by a time limit
      # still leaves what it measured.
      save(args, {"env": env, "results": results, "copy_GBps": copies, "memory": memory})
    del params, grads, copy
    gc.collect()
  env["wall_s"] = round(time.perf_counter() - t_start, 1)
  out = {"env": env, "results": results, "copy_GBps": copies, "memory": memory}
  print()
  print(save(args, out))
  if args.plot:
    from plots import step_plot

    step_plot(out, args.plot)
  return out


def save(args, out: dict) -> str:
  """Writes ``--json`` and ``--markdown`` (if asked for); returns the tables."""
  md = markdown(out)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  if args.markdown:
    with open(args.markdown, "w") as f:
      f.write(md)
  return md


def _cpu_name() -> str:
  from onnx_optax.conformance.report import processor_name  # The one CPU-model probe.

  return processor_name()


def markdown(out: dict) -> str:
  """The tables: step times, memory, compile times."""
  env, rows = out["env"], out["results"]
  lines = [
    f"Device: {env['device_kind']} ({env['device']}), {env['cpu_count']} CPU cores ({env['processor']}); "
    f"jax {env['jax']}, optax {env['optax']}, torch {env['torch']}; median of {env['repeats']} "
    f"interleaved samples; {env.get('wall_s', '(partial run)')} s.",
    f"Command: `{env['command']}`" + (f" with `XLA_FLAGS={env['xla_flags']}`" if env["xla_flags"] else ""),
    "",
    "Step time of onnx_optax, and the other contenders' as a ratio to it (above 1: onnx_optax is faster). "
    "GB/s: minimum traffic of a step ((3 + 2k) x 4 bytes per element) over its time; "
    "% copy: that over the fastest plain pass (copy or axpy) over as many elements, interleaved with the "
    "optimizers in the same repeats.",
    "",
    "| rule | size | onnx_optax ms | optax | torch foreach | torch fused | onnx_optax GB/s | % copy "
    "| torch fused % copy |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    ratio, gbps = r["ratio"], r["GBps"]
    fmt = functools.partial(_ratio_cell, ratio)
    fused = f"{100 * gbps['torch_fused'] / r['copy_GBps']:.0f}%" if "torch_fused" in gbps else "n/a"
    lines.append(
      f"| {r['rule']} | {r['size']} | {r['onnx_optax_ms']:.3f} | {fmt('optax')} | {fmt('torch_foreach')} "
      f"| {fmt('torch_fused')} | {gbps['onnx_optax']:.1f} | {100 * gbps['onnx_optax'] / r['copy_GBps']:.0f}% "
      f"| {fused} |"
    )
  names = list(next(iter(out["copy_GBps"].values())))
  lines += [
    "",
    "Copy bandwidth (GB/s, bytes read + written over time; median over the rules' blocks, "
    "in which the copies are interleaved with the optimizers):",
    "",
    "| size | " + " | ".join(names) + " |",
    "|---|" + "---:|" * len(names),
  ]
  for size, bw in out["copy_GBps"].items():
    if all(bw[k] for k in names):
      lines.append(f"| {size} | " + " | ".join(f"{statistics.median(bw[k]):.1f}" for k in names) + " |")
  lines += [
    "",
    "Memory of the donated onnx_optax step (`compile().memory_analysis()`): state = k x params, "
    "temporary buffer, and the bytes of output aliased to (written in place of) the inputs.",
    "",
    "| rule | size | params MiB | state / params (k) | temp bytes | aliased / (params + state) |",
    "|---|---|---:|---:|---:|---:|",
  ]
  for m in out["memory"]:
    lines.append(
      f"| {m['rule']} | {m['size']} | {m['param_bytes'] / 2**20:.1f} | {m['k']:.3f} | {m['temp_bytes']} "
      f"| {m['alias_bytes'] / (m['param_bytes'] + m['state_bytes']):.3f} |"
    )
  comp = [r for r in rows if r["compile_s"]]
  if comp:
    lines += [
      "",
      "Compile time (lower + compile, seconds) of the jitted step:",
      "",
      "| rule | size | leaves | onnx_optax s | optax s |",
      "|---|---|---:|---:|---:|",
    ]
    for r in comp:
      if r["leaves"] >= 500:
        cs = r["compile_s"]
        lines.append(
          f"| {r['rule']} | {r['size']} | {r['leaves']} | {cs['onnx_optax']:.2f} | {cs['optax']:.2f} |"
        )
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
