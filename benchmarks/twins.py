"""Step time of each PyTorch twin against its Optax namesake and PyTorch's ``foreach`` step.

For every registered rule that declares a ``Binding("torch", <class>)`` this script times one
optimizer step on float32 parameters (one leaf of ``--size`` elements):

* the twin (``rule.transform(lr)`` at its defaults, PyTorch's), jitted with
  ``donate_argnums=(0, 1)``, the update applied inside the jit;
* its Optax namesake, where the rule declares one (``Binding("optax", <name>)``: the nearest
  Optax transform, which is not always the same rule, docs/from_optax.md), at its defaults,
  jitted and donated the same way;
* ``torch.optim.<class>(..., foreach=True)`` on the same number of elements (``--no-torch``
  skips it); a class that has no ``foreach`` option (its declaration's ``TorchOptimizer.lacks``:
  ``torch.optim.Muon``) is built without it and its ratio marked ``*``,

* with ``--reciprocal``, the twin again with its correctly rounded divisions by a scalar
  (``_pytorch.divide_by_scalar``, which PyTorch's ``tensor / scalar`` computes) replaced by
  XLA's product with the reciprocal (one rounding more): not the twin, a measure of what that
  exactness costs (its column ``x*(1/s)``, over the twin's step like the others),

interleaved round-robin in one process (each repeat times every contender once, in a
rotating order, each after a pause that lets the previous one's threads go idle: ``--pause``),
and prints the median of each as a ratio to the twin (above 1: the twin is faster). Ratios,
not seconds, are the result: the machine is shared, and a burst of load hits every contender of
a repeat alike.

Usage (from the repository root)::

  python benchmarks/twins.py                               # 16M elements, every twin
  python benchmarks/twins.py --size 1M --repeats 5 --rules pytorch_rmsprop
  python benchmarks/twins.py --out docs/benchmarks/twins_cpu.txt
  python benchmarks/twins.py --rules pytorch_adam,pytorch_radam --no-torch --reciprocal
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

try:
  from onnx_optax import _pytorch, registry
except ImportError:  # Run from a checkout without installing: use the checkout's package.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from onnx_optax import _pytorch, registry

LR = 1e-3


def namesake(rule: registry.Rule) -> Callable[[float], optax.GradientTransformation] | None:
  """The Optax transform the rule declares as its namesake (``Binding("optax", "optax.contrib.muon")``)."""
  binding = rule.binding("optax")
  if binding is None:
    return None
  target: Any = optax
  for part in binding.name.removeprefix("optax.").split("."):
    target = getattr(target, part)
  return target


@contextlib.contextmanager
def reciprocal_division():
  """Within it, ``_pytorch.divide_by_scalar(a, b)`` is ``a * (1 / b)``: what XLA makes of ``a / b``.

  For ``--reciprocal`` only, to time what PyTorch's correctly rounded division costs a twin; a
  transform traced inside is not the twin (it rounds once more per division by a scalar).
  """
  exact = _pytorch.divide_by_scalar
  _pytorch.divide_by_scalar = lambda a, b: a * (1 / b)
  try:
    yield
  finally:
    _pytorch.divide_by_scalar = exact


def jax_step(tx: optax.GradientTransformation, n: int) -> Callable[[], None]:
  """One donated, jitted step on ``n`` float32 elements, the parameters as a 2-D leaf when the
  rule takes only matrices (PyTorch's Muon), else 1-D."""
  shape = (n >> 10, 1 << 10)
  key = jax.random.key(0)
  params = jax.random.normal(key, shape, jnp.float32)
  grads = 1e-3 * jax.random.normal(jax.random.fold_in(key, 1), shape, jnp.float32)
  state = tx.init(params)

  def plain(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(plain, donate_argnums=(0, 1))
  box = [params, state]
  box[:] = list(step(*box, grads))  # compiled, and warm
  jax.block_until_ready(box[0])

  def run() -> None:
    box[:] = list(step(*box, grads))
    jax.block_until_ready(box[0])

  return run


def torch_step(cls: str, n: int, foreach: bool = True) -> Callable[[], None] | None:
  """One ``foreach`` step of ``torch.optim.<cls>`` on ``n`` float32 elements (its default step where
  ``foreach`` is False: a class without the option)."""
  try:
    import torch
  except ImportError:
    return None
  g = torch.Generator().manual_seed(0)
  p = torch.nn.Parameter(torch.randn(n >> 10, 1 << 10, generator=g))
  p.grad = 1e-3 * torch.randn(p.shape, generator=g)
  opt = getattr(torch.optim, cls)([p], lr=LR, **({"foreach": True} if foreach else {}))
  opt.step()

  def run() -> None:
    opt.step()

  return run


def median_times(
  contenders: Mapping[str, Callable[[], object]], repeats: int, pause: float = 0.0
) -> dict[str, float]:
  """Each contender timed once per repeat, in a rotating order; the median per contender.

  ``pause`` seconds of sleep before each timed step: what a contender leaves running (PyTorch's
  OpenMP threads wait for work spinning, for a while, after its step) must not be timed as the
  next one's, who follows PyTorch in two of three rotations.
  """
  names = list(contenders)
  times: dict[str, list[float]] = {name: [] for name in names}
  for r in range(repeats):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      time.sleep(pause)
      t0 = time.perf_counter()
      contenders[name]()
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--size", default="16M", help="elements, <n>M (default 16M)")
  parser.add_argument("--repeats", type=int, default=21)
  parser.add_argument("--rules", default="", help="comma-separated twin names (default: every twin)")
  parser.add_argument("--no-torch", action="store_true")
  parser.add_argument(
    "--pause", type=float, default=0.2, help="seconds of sleep before each timed step (default 0.2)"
  )
  parser.add_argument(
    "--reciprocal",
    action="store_true",
    help="also time each twin with its divisions by a scalar as XLA's reciprocal product (column x*(1/s))",
  )
  parser.add_argument("--out", default="", help="also write the table to this file")
  args = parser.parse_args(argv)
  n = int(args.size.removesuffix("M")) << 20
  wanted = set(filter(None, args.rules.split(",")))
  lines = [
    f"benchmarks/twins.py --size {args.size} --repeats {args.repeats} --pause {args.pause}: "
    f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__}, "
    f"optax {optax.__version__}, {jax.devices()[0].platform}",
    "median step time of each contender over the twin's (above 1: the twin is faster)",
    "",
    f"{'twin':<18} {'class':<10} {'twin ms':>8} {'optax namesake':<22} {'ratio':>6} {'torch foreach':>13}"
    + (f" {'x*(1/s)':>8}" if args.reciprocal else ""),
  ]
  print("\n".join(lines), flush=True)
  footnote = ""
  for rule in registry.rules():
    binding = rule.binding("torch")
    if binding is None or (wanted and rule.name not in wanted):
      continue
    contenders = {"twin": jax_step(rule.transform(LR), n)}
    other = namesake(rule)
    if other is not None:
      contenders["optax"] = jax_step(other(LR), n)
    # A class without a foreach option (TorchOptimizer.lacks) is timed at its default step, marked *.
    foreach = binding.torch is None or "foreach" not in binding.torch.lacks
    if args.reciprocal:
      with reciprocal_division():  # traced (and compiled) inside: jax_step runs the step once
        contenders["reciprocal"] = jax_step(rule.transform(LR), n)
    if not args.no_torch:
      step = torch_step(binding.name, n, foreach)
      if step is not None:
        contenders["torch"] = step
    t = median_times(contenders, args.repeats, args.pause)
    ratios = {
      name: f"{t[name] / t['twin']:.2f}" if name in t else "-" for name in ("optax", "torch", "reciprocal")
    }
    if not foreach and "torch" in t:
      ratios["torch"] += "*"
      footnote = "* torch.optim.<class> has no foreach option: its default step"
    declared = rule.binding("optax")
    optax_name = declared.name if declared is not None else "(none)"
    line = (
      f"{rule.name:<18} {binding.name:<10} {1e3 * t['twin']:8.2f} {optax_name:<22} {ratios['optax']:>6} "
      f"{ratios['torch']:>13}" + (f" {ratios['reciprocal']:>8}" if args.reciprocal else "")
    )
    lines.append(line)
    print(line, flush=True)
  if footnote:
    lines += ["", footnote]
    print("\n" + footnote, flush=True)
  if args.out:
    with open(args.out, "w") as f:
      f.write("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
