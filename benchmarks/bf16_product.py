"""The bfloat16 matrix product of Muon's Newton–Schulz iteration: XLA against PyTorch, on this CPU.

``torch.optim.Muon`` orthogonalises each update with five Newton–Schulz steps of three
bfloat16 matrix products, each accumulated in float32 and rounded once (its CPU ``mm``); the
twin (``pytorch_muon``) computes each as ``jnp.dot`` of bfloat16 matrices with
``preferred_element_type=float32``. On a 16M-element parameter (16384 x 1024, the shape of
``benchmarks/twins.py --size 16M``, transposed to 1024 x 16384 as PyTorch does) the products
are most of the step. This script times them alone, interleaved in one process, medians:

* ``X @ X.T`` (1024 x 16384 by 16384 x 1024) and ``B @ X`` (1024 x 1024 by 1024 x 16384);
* in JAX: bfloat16 inputs accumulated in float32 (the twin's), and float32 inputs (the same
  values) for comparison;
* in PyTorch: ``torch.mm`` of bfloat16 tensors (Muon's), and of float32 tensors.

It prints each contender's median time over the JAX bfloat16 product's (above 1: JAX is
faster) and the CPU flags that decide the bfloat16 rate (``avx512_bf16``, ``amx_bf16``).

Usage (from the repository root)::

  python benchmarks/bf16_product.py --repeats 7 --out docs/benchmarks/bf16_product_cpu.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from twins import median_times  # this folder: the script's own directory is on sys.path


def _cpu_flags() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
  except OSError:
    return "unknown"
  wanted = [flag for flag in flags if flag in ("avx512f", "avx512_bf16", "amx_bf16", "avx_vnni")]
  return " ".join(wanted) or "none of avx512f, avx512_bf16, amx_bf16"


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=1024)
  parser.add_argument("--cols", type=int, default=16384)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--out", default="", help="also write the table to this file")
  args = parser.parse_args(argv)
  import torch

  m, n = args.rows, args.cols
  rng = np.random.default_rng(0)
  x32 = np.asarray(jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16).astype(jnp.float32))
  b32 = np.asarray(jnp.asarray(rng.standard_normal((m, m)) / m, jnp.bfloat16).astype(jnp.float32))
  highest = jax.lax.Precision.HIGHEST

  def jax_products(dtype) -> Callable[[], object]:
    x, b = jnp.asarray(x32, dtype), jnp.asarray(b32, dtype)
    f = jax.jit(
      lambda x, b: (
        jnp.dot(x, x.T, preferred_element_type=jnp.float32, precision=highest),
        jnp.dot(b, x, preferred_element_type=jnp.float32, precision=highest),
      )
    )
    jax.block_until_ready(f(x, b))
    return lambda: jax.block_until_ready(f(x, b))

  def torch_products(dtype) -> Callable[[], object]:
    x, b = torch.from_numpy(x32.copy()).to(dtype), torch.from_numpy(b32.copy()).to(dtype)
    x @ x.T, b @ x  # noqa: B018 -- warm
    return lambda: (x @ x.T, b @ x)

  contenders = {
    "jax bfloat16 (float32 accumulation)": jax_products(jnp.bfloat16),
    "jax float32": jax_products(jnp.float32),
    "torch bfloat16": torch_products(torch.bfloat16),
    "torch float32": torch_products(torch.float32),
  }
  names = list(contenders)
  # twins.py's rotation, with its pause (PyTorch's OpenMP threads spin a while after its own products).
  medians = median_times(contenders, args.repeats, pause=0.2)
  base = medians[names[0]]
  lines = [
    f"benchmarks/bf16_product.py --rows {m} --cols {n} --repeats {args.repeats}: "
    f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, flags: {_cpu_flags()}, "
    f"jax {jax.__version__}, torch {torch.__version__}",
    f"X @ X.T and B @ X, X {m} x {n}, B {m} x {m}; median time over JAX bfloat16's (above 1: JAX faster)",
    "",
    f"{'contender':<38} {'ms':>8} {'ratio':>6}",
  ]
  lines += [f"{name:<38} {1e3 * t:8.1f} {t / base:6.2f}" for name, t in medians.items()]
  print("\n".join(lines))
  if args.out:
    with open(args.out, "w") as f:
      f.write("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
