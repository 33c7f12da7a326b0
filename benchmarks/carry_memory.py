"""Memory and time of carrying a saved PyTorch AdamW state into JAX and back, against loading it plainly.

A GPT-2-shaped float32 parameter set of ``--params`` elements (GPT-2's 50257-token vocabulary and
1024 positions, blocks of GPT-2's widths: 768 below 0.2e9 parameters, 1024 below 0.5e9, 1280
below 1e9, else 1600, as many blocks as reach the size), a ``torch.optim.AdamW`` over it after
one step, its ``state_dict()`` saved with ``torch.save`` (and the weights, as a model's
``state_dict()``) to a temporary folder. Then each measurement runs in a fresh Python process
(imports done, its RssAnon noted as the floor), sampled from this process every millisecond
(``/proc/<pid>/status``, RssAnon: memory the process allocated, not the page cache of files it
maps):

* ``baseline``: ``torch.load`` of the state dict, ``jax.device_put`` of each moment (the read),
  then ``torch.save`` of that state dict again (the write);
* ``carry``: ``from_torch_state_dict(path)`` (the file ``torch.load`` maps, docs/interop.md,
  "Memory"), one jitted AdamW step (params and state donated), then
  ``to_torch_state_dict(..., copy=False)`` and ``torch.save`` (the write);
* ``carry dict``: the same from a state dict the caller loaded, ``torch.load(path)`` without
  ``mmap``, written back with copies (``to_torch_state_dict`` by default);
* ``trainer``: the folder as a Hugging Face Trainer checkpoint (``optimizer.pt``, a constant
  ``LambdaLR``'s ``scheduler.pt``, ``trainer_state.json``): ``from_torch_state_dict`` of its
  ``optimizer.pt``, the step, then ``to_trainer_checkpoint`` into a new folder (the write). Its
  read is the same call as ``carry``'s: the two read times are one operation measured twice;
* ``live``: a ``torch.optim.AdamW`` in memory (built and loaded before the read), ``from_torch``,
  the step, ``to_torch`` of the state and the weights (the write). PyTorch's own weights and
  state stay in memory beside JAX's: its least peak is twice the others' minimum.

Both load the weights alike first (``torch.load(..., mmap=True)``, each tensor copied into a
JAX array). The contenders alternate, ``--repeats`` times each. Printed: per contender, the
median peak RssAnon above the floor over the minimum any carry holds (the JAX weights and
state: three float32 tensors per parameter), for the whole run and for the read alone, and the
median time of the read and of the write over the baseline's. The machine is shared: ratios
measured in one run, not seconds, are the result. Where the file and the JAX state do not both fit
in memory (1B parameters on 23 GiB), what the page cache holds of the file when a read starts
decides its time (the file just written, or read by the contender before); ``--cold`` empties
the page cache before each measurement, so that every contender reads the file from the disk.

Usage (from the repository root)::

  python benchmarks/carry_memory.py --params 0.1e9
  python benchmarks/carry_memory.py --params 0.1e9 0.35e9 --out docs/benchmarks/carry_memory_cpu.txt
  python benchmarks/carry_memory.py --params 1e9 --contenders baseline,carry,trainer --repeats 2 --cold \
      --out docs/benchmarks/carry_memory_1b_cpu.txt   # root; 17 GiB free; live would need twice that
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

VOCAB, POSITIONS = 50257, 1024
CONTENDERS = ("baseline", "carry", "carry dict", "trainer", "live")


def gpt2_shapes(n: float) -> dict[str, tuple[int, ...]]:
  """GPT-2's parameter shapes (its names) with as many blocks as bring the total nearest ``n``."""
  d = 768 if n < 0.2e9 else 1024 if n < 0.5e9 else 1280 if n < 1e9 else 1600
  embeddings = (VOCAB + POSITIONS) * d + 2 * d
  per_block = 12 * d * d + 13 * d
  layers = max(1, round((n - embeddings) / per_block))
  shapes: dict[str, tuple[int, ...]] = {"wte.weight": (VOCAB, d), "wpe.weight": (POSITIONS, d)}
  for i in range(layers):
    b = f"h.{i}."
    shapes.update(
      {
        b + "ln_1.weight": (d,),
        b + "ln_1.bias": (d,),
        b + "attn.c_attn.weight": (d, 3 * d),
        b + "attn.c_attn.bias": (3 * d,),
        b + "attn.c_proj.weight": (d, d),
        b + "attn.c_proj.bias": (d,),
        b + "ln_2.weight": (d,),
        b + "ln_2.bias": (d,),
        b + "mlp.c_fc.weight": (d, 4 * d),
        b + "mlp.c_fc.bias": (4 * d,),
        b + "mlp.c_proj.weight": (4 * d, d),
        b + "mlp.c_proj.bias": (d,),
      }
    )
  shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
  return shapes


def make_files(n: float, folder: str) -> int:
  """Saves the weights (``params.pt``) and an AdamW's state dict after one step (``optimizer.pt``)."""
  import torch

  g = torch.Generator().manual_seed(0)
  params = {
    name: torch.nn.Parameter(torch.randn(shape, generator=g) * 0.02) for name, shape in gpt2_shapes(n).items()
  }
  opt = torch.optim.AdamW(params.items(), lr=1e-4, weight_decay=0.1)
  for p in params.values():  # one gradient at a time (a parameter without one is not stepped)
    p.grad = torch.randn(p.shape, generator=g) * 1e-3
    opt.step()
    p.grad = None
  torch.save({k: p.detach() for k, p in params.items()}, os.path.join(folder, "params.pt"))
  torch.save(opt.state_dict(), os.path.join(folder, "optimizer.pt"))
  # The folder is also a Trainer checkpoint: a constant LambdaLR's scheduler.pt, trainer_state.json.
  scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
  torch.save(scheduler.state_dict(), os.path.join(folder, "scheduler.pt"))
  with open(os.path.join(folder, "trainer_state.json"), "w") as f:
    json.dump({"global_step": 1}, f)
  return sum(p.numel() for p in params.values())


def _rss_anon(pid: int | str = "self") -> int:
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("RssAnon:"):
        return int(line.split()[1]) * 1024
  return 0


def _stepper(tx: Any) -> Any:
  """One update with gradients ``1e-3 * params``."""
  import jax

  def step(params: Any, state: Any) -> Any:
    grads = jax.tree.map(lambda p: 1e-3 * p, params)
    updates, state = tx.update(grads, state, params)
    return jax.tree.map(lambda p, u: p + u, params, updates), state

  return step


def child(contender: str, folder: str) -> None:
  """One measurement, in its own process: prints ``{"floor": bytes, "phases": {name: [t0, t1]}}``."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  from onnx_optax.interop import (
    from_torch,
    from_torch_state_dict,
    to_torch,
    to_torch_state_dict,
    to_trainer_checkpoint,
  )

  floor = _rss_anon()
  phases: dict[str, list[float]] = {}
  source, target = os.path.join(folder, "optimizer.pt"), os.path.join(folder, f"out_{os.getpid()}.pt")

  def phase(name: str) -> None:
    now = time.time()
    if phases:
      phases[list(phases)[-1]].append(now)
    if name:
      phases[name] = [now]

  phase("weights")
  mapped = torch.load(os.path.join(folder, "params.pt"), mmap=True, weights_only=True)
  params = {k: jnp.array(t.numpy(), copy=True) for k, t in mapped.items()}
  jax.block_until_ready(params)
  if contender == "live":  # PyTorch's model and optimizer, in memory of their own (not the file's)
    live = {k: torch.nn.Parameter(t.clone()) for k, t in mapped.items()}
    opt = torch.optim.AdamW(live.items(), lr=1e-4, weight_decay=0.1)
    opt.load_state_dict(torch.load(source, mmap=True, weights_only=True))
    for entry in opt.state.values():
      entry.update({f: v.clone() for f, v in entry.items()})
  del mapped
  phase("read")
  if contender == "live":
    tx, state = from_torch(opt, params)
    jax.block_until_ready(state)
    phase("step")
    params, state = jax.jit(_stepper(tx), donate_argnums=(0, 1))(params, state)
    jax.block_until_ready(state)
    phase("write")
    to_torch(state, opt, params)
    out = {"state": {0: opt.state[live["wte.weight"]]}}
  elif contender == "baseline":
    saved = torch.load(source, weights_only=True)
    entries = saved["state"].items()
    moments = {(k, f): jax.device_put(v.numpy()) for k, entry in entries for f, v in entry.items() if v.dim()}
    jax.block_until_ready(moments)
    phase("write")
    torch.save(saved, target)
  else:
    # Before this checkout's path and copy= (the figures before the change): a mapped state dict, copies.
    new = "copy" in inspect.signature(to_torch_state_dict).parameters
    carried: Any = source if new else torch.load(source, mmap=True, weights_only=True)
    if contender == "carry dict":
      carried = torch.load(source, weights_only=True)
    tx, state = from_torch_state_dict(carried, params)
    jax.block_until_ready(state)
    phase("step")

    params, state = jax.jit(_stepper(tx), donate_argnums=(0, 1))(params, state)
    jax.block_until_ready(state)
    phase("write")
    if contender == "trainer":
      written = to_trainer_checkpoint(state, folder, target, steps=1, learning_rate=1e-4)
      out = torch.load(written / "optimizer.pt", mmap=True, weights_only=True)
    else:
      like = torch.load(source, mmap=True, weights_only=True) if contender == "carry" else carried
      options: dict[str, Any] = {"copy": contender == "carry dict"} if new else {}
      out = to_torch_state_dict(state, like, **options)
      torch.save(out, target)
    assert np.isfinite(float(out["state"][0]["exp_avg"].sum()))
  phase("")
  if os.path.isdir(target):
    shutil.rmtree(target)
  elif os.path.exists(target):
    os.remove(target)
  print(json.dumps({"floor": floor, "phases": phases}), flush=True)


def measure(contender: str, folder: str) -> dict[str, Any]:
  """Runs :func:`child` in a fresh process, sampling its RssAnon: ``(peak above the floor, phases)``."""
  proc = subprocess.Popen(
    [sys.executable, __file__, "--child", contender, folder], stdout=subprocess.PIPE, text=True
  )
  samples: list[tuple[float, int]] = []
  while proc.poll() is None:
    try:
      samples.append((time.time(), _rss_anon(proc.pid)))
    except (FileNotFoundError, ProcessLookupError):
      break
    time.sleep(0.001)
  out, _ = proc.communicate()
  if proc.returncode:
    raise RuntimeError(f"{contender} failed (exit {proc.returncode})")
  result = json.loads(out.strip().splitlines()[-1])
  phases = result["phases"]
  start = phases["weights"][0]
  peak = max(rss for t, rss in samples if t >= start) - result["floor"]
  read = max((rss for t, rss in samples if phases["read"][0] <= t <= phases["read"][1]), default=0)
  return {
    "peak": peak,
    "read peak": read - result["floor"],
    "read": phases["read"][1] - phases["read"][0],
    "write": phases["write"][1] - phases["write"][0],
  }


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache() -> None:
  """Writes dirty pages out and empties the page cache (``--cold``; root, Linux)."""
  os.sync()
  with open(DROP_CACHES, "w") as f:
    f.write("3\n")


def run_size(n: float, repeats: int, contenders: tuple[str, ...], cold: bool = False) -> list[str]:
  with tempfile.TemporaryDirectory() as folder:
    count = make_files(n, folder)
    minimum = 3 * 4 * count
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    for r in range(repeats):
      order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
      for contender in order:
        if cold:
          drop_page_cache()
        results[contender].append(measure(contender, folder))
    med = {c: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for c, ms in results.items()}
    base = med["baseline"]
    lines = [
      f"{count / 1e6:.1f}M parameters ({len(gpt2_shapes(n))} tensors), minimum {minimum / 2**30:.2f} GiB "
      f"(weights + exp_avg + exp_avg_sq); baseline read {base['read']:.2f} s, write {base['write']:.2f} s",
      f"{'contender':<12} {'peak/min':>9} {'read peak/min':>14} {'read time':>10} {'write time':>11}",
    ]
    for c in contenders:
      m = med[c]
      lines.append(
        f"{c:<12} {m['peak'] / minimum:9.2f} {m['read peak'] / minimum:14.2f} "
        f"{m['read'] / base['read']:10.2f} {m['write'] / base['write']:11.2f}"
      )
    return lines


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--params", type=float, nargs="+", default=[0.1e9], help="sizes, e.g. 0.1e9 0.35e9")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument(
    "--contenders", default=",".join(CONTENDERS), help="comma-separated, baseline first (default: all)"
  )
  parser.add_argument(
    "--cold",
    action="store_true",
    help=f"empty the page cache before each measurement (every read from the disk; root: {DROP_CACHES})",
  )
  parser.add_argument("--out", default="", help="also write the table to this file")
  parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    child(*args.child)
    return 0
  if args.cold and not os.access(DROP_CACHES, os.W_OK):
    parser.error(
      f"--cold empties the page cache through {DROP_CACHES}, which only root may write: run as root"
    )
  import jax
  import torch

  lines = [
    f"benchmarks/carry_memory.py --params {' '.join(f'{n:g}' for n in args.params)} --repeats "
    f"{args.repeats} --contenders {args.contenders}{' --cold' if args.cold else ''}: "
    f"{platform.processor() or platform.machine()}, "
    f"{os.cpu_count()} cores, jax {jax.__version__}, torch {torch.__version__}",
    "medians; peak RssAnon above the process's floor (imports) over the minimum, and time over the "
    "baseline's (torch.load + device_put per tensor; torch.save)",
  ]
  print("\n".join(lines), flush=True)
  for n in args.params:
    block = ["", *run_size(n, args.repeats, tuple(args.contenders.split(",")), args.cold)]
    print("\n".join(block), flush=True)
    lines += block
  if args.out:
    with open(args.out, "w") as f:
      f.write("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
