"""What XLA makes of one optimizer step: loops over the parameters and bytes moved.

For each rule this compiles the donated step ``params, state = step(params,
state, grads)`` of onnx_optax and of Optax's nearest built-in for one float32
leaf of ``n`` elements (abstract shapes: nothing is allocated) and prints

* ``loops``: the fusions of the compiled program whose output or operands
  have ``n`` elements, each one pass over memory (``compile().as_text()``);
* ``B/elem``: the bytes the compiled program reads and writes per element
  (``compile().cost_analysis()["bytes accessed"] / n``), against the minimum
  of a single pass, ``(3 + 2k) * 4`` (read X, G and k state tensors, write X
  and the state);
* the same with XLA:CPU's sibling multi-output fusion switched on
  (``--xla_backend_extra_options=xla_cpu_use_multi_output_fusion``), which
  merges loops that read the same inputs;
* whether, with ``norm_coefficient == 0``, the step reads the parameters
  only once (in the final ``X + U``): the zeros that the transforms pass for
  ``X`` must fold away (``0 * 0 + G`` is ``G``).

Usage: ``python benchmarks/hlo.py [--size 16M] [--device cpu|gpu] [--dump DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import optax

try:
  import onnx_optax
except ImportError:  # Run from a checkout without installing.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import onnx_optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import RULES, STATE_TENSORS, onnx_optimizer, optax_optimizer  # noqa: E402

MULTI_OUTPUT_FLAG = "--xla_backend_extra_options=xla_cpu_use_multi_output_fusion"


def compiled_step(opt, n: int, device):
  """The donated, jitted ``step`` for one leaf of ``n`` float32 elements."""
  sharding = jax.sharding.SingleDeviceSharding(device)
  params = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sharding)
  state = jax.eval_shape(opt.init, params)
  state = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), state)

  def step(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params)
  return lowered.compile()


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][a-z0-9-]*)\((.*?)\)")
_NOT_A_PASS = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant"}


def analyse(compiled, n: int) -> dict:
  """Loops over ``n`` elements, bytes per element, reads of the parameters."""
  text = compiled.as_text()
  entry = text[text.index("\nENTRY") :].splitlines()[1:]
  size = f"[{n}]"
  loops, param_reads, params_name = [], 0, None
  for line in entry:
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    name, shape, opcode, operands = m.groups()
    if opcode == "parameter" and operands == "0":
      params_name = name
    # Every instruction with an n-element result is one pass over memory: a
    # fusion (XLA's loop) or an unfused element-wise op or copy.
    if size in shape and opcode not in _NOT_A_PASS:
      loops.append(f"{opcode} -> {shape}")
    if params_name and opcode not in _NOT_A_PASS and f"%{params_name}" in re.split(r"[,\s]+", operands):
      param_reads += 1
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return {
    "loops": len(loops),
    "bytes_per_elem": cost["bytes accessed"] / n,
    "param_reads": param_reads,
    "text": text,
  }


def rows(n: int, device, dump: str | None) -> None:
  """One line per rule and library, for the XLA flags of this process."""
  flags = "multi-output" if MULTI_OUTPUT_FLAG in os.environ.get("XLA_FLAGS", "") else "default"
  for rule in RULES:
    minimum = (3 + 2 * STATE_TENSORS[rule]) * 4
    for library, make in (("onnx_optax", onnx_optimizer), ("optax", optax_optimizer)):
      a = analyse(compiled_step(make(rule), n, device), n)
      print(
        f"{rule:14} {library:10} {flags:13} {a['loops']:5d} {a['bytes_per_elem']:7.1f} "
        f"{minimum:7d} {a['param_reads']:7d}",
        flush=True,
      )
      if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, f"{rule}.{library}.{flags}.hlo.txt"), "w") as f:
          f.write(a["text"])


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--size", default="16M", help="elements in the leaf, e.g. 16M")
  ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
  ap.add_argument("--dump", default=None, help="write each compiled program's HLO text to this folder")
  ap.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  n = int(args.size[:-1]) << 20 if args.size.endswith("M") else int(args.size)
  device = jax.devices(args.device)[0]
  if args.rows_only:
    rows(n, device, args.dump)
    return
  print(
    f"jax {jax.__version__}, optax {optax.__version__}, {device.device_kind}, one leaf of {n} float32; "
    f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
  )
  print()
  header = f"{'rule':14} {'library':10} {'flags':13} {'loops':>5} {'B/elem':>7} {'minimum':>7} {'X reads':>7}"
  print(header)
  print("-" * len(header))
  rows(n, device, args.dump)
  if device.platform == "cpu" and MULTI_OUTPUT_FLAG not in os.environ.get("XLA_FLAGS", ""):
    # XLA reads XLA_FLAGS once per process (the option cannot be passed to
    # compile()): the multi-output variant runs in a child process.
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + MULTI_OUTPUT_FLAG).strip())
    subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--rows-only", "--size", args.size, "--device", args.device]
      + (["--dump", args.dump] if args.dump else []),
      env=env,
      check=True,
    )
  # norm_coefficient: a Python 0 must not read X beyond the final X + U; a
  # non-zero coefficient reads it in the state update too.
  print()
  for coefficient in (0.0, 0.1):
    opt = onnx_optax.momentum(1e-3, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=coefficient)
    a = analyse(compiled_step(opt, n, device), n)
    zeros = len(re.findall(r"f32\[\] constant\(0\)", a["text"]))
    print(
      f"momentum norm_coefficient={coefficient}: {a['loops']} loops, {a['bytes_per_elem']:.1f} B/elem, "
      f"X read by {a['param_reads']} instruction(s), f32 zero constants in the program: {zeros}"
    )


if __name__ == "__main__":
  main()
