"""How far a float32 run carried from PyTorch to JAX drifts from the run that never left PyTorch.

For each configuration, on fixed gradients (seeded NumPy, the same for every run):

* the reference: ``STEPS`` steps of the PyTorch optimizer, default implementation (on the CPU:
  the single-tensor ``_single_tensor_*`` functions);
* PyTorch's own spread on the same run: its ``fused=True`` implementation, and
  ``foreach=True``, against the reference;
* the JAX continuations: ``MOVE_AT`` steps in PyTorch, the state carried to JAX, the remaining
  steps there (jitted), with

  - ``spec order``: the rules the bridge returned before the twins (ONNX ``Momentum``, ONNX
    ``Adagrad``, ONNX Runtime's AdamW ``adam_mode=0``, in their specs' order), built here;
  - ``twins``: the PyTorch-order twins (``onnx_optax.pytorch_sgd`` / ``pytorch_adagrad`` /
    ``pytorch_adam`` / ``pytorch_adamw``);
  - ``from_torch``: whatever ``onnx_optax.interop.from_torch`` returns today.

Each comparison prints the largest difference of the final parameters in units of the last
place (ulps) of each leaf's largest magnitude, the largest over the leaves, and the smallest
fraction of elements bitwise equal over the leaves. ``bf16/f32`` rows keep bfloat16 parameters
with a float32 state (PyTorch runs them when its state tensors are float32, SGD and Adagrad;
its Adam refuses mixed dtypes, so the Adam rows keep PyTorch's own bfloat16 state; its fused
SGD and Adagrad refuse the float32 state). "refuses": the implementation or bridge refuses
the configuration.

Usage (from the repository root)::

  python benchmarks/carried_float32.py                     # the table, ~1 min on the CPU
  python benchmarks/carried_float32.py --x64               # step-dependent scalars in float64
  python benchmarks/carried_float32.py --out docs/benchmarks/carried_float32_cpu.txt
  python benchmarks/carried_float32.py --timing            # and step time against Optax

The test ``tests/test_float32_carry.py`` runs the same functions on smaller runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

STEPS = 600
MOVE_AT = 100
SHAPES = ((40, 24), (97,), (5, 3, 7))


@dataclasses.dataclass(frozen=True)
class Config:
  """One row of the table: a PyTorch optimizer and its hyperparameters."""

  name: str
  kind: str  # "SGD", "Adagrad", "Adam", "AdamW"
  hyper: dict
  dtype: str = "float32"  # of the parameters (and gradients)
  state_dtype: str | None = None  # None: PyTorch's (the parameters')


CONFIGS = (
  Config("AdamW (lr 1e-3, wd 0.01)", "AdamW", dict(lr=1e-3, weight_decay=0.01)),
  Config("Adam (coupled wd 0.01)", "Adam", dict(lr=1e-3, weight_decay=0.01)),
  Config(
    "SGD (momentum 0.9, dampening 0.1, wd 1e-3)",
    "SGD",
    dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-3),
  ),
  Config(
    "SGD Nesterov (momentum 0.9, wd 1e-3)",
    "SGD",
    dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3),
  ),
  Config("Adagrad (lr_decay 1e-3, wd 1e-3)", "Adagrad", dict(lr=1e-2, lr_decay=1e-3, weight_decay=1e-3)),
)
BF16_CONFIGS = (
  Config("bf16/bf16 AdamW", "AdamW", dict(lr=1e-3, weight_decay=0.01), "bfloat16"),
  Config("bf16/bf16 Adam (coupled wd)", "Adam", dict(lr=1e-3, weight_decay=0.01), "bfloat16"),
  Config("bf16/f32 SGD (momentum, dampening, wd)", "SGD", CONFIGS[2].hyper, "bfloat16", "float32"),
  Config("bf16/f32 SGD Nesterov", "SGD", CONFIGS[3].hyper, "bfloat16", "float32"),
  Config("bf16/f32 Adagrad (lr_decay, wd)", "Adagrad", CONFIGS[4].hyper, "bfloat16", "float32"),
)


def data(steps: int, shapes=SHAPES, seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
  """Initial parameters and ``steps`` lists of gradients, float32."""
  rng = np.random.default_rng(seed)
  params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
  grads = [[(0.1 * rng.standard_normal(s)).astype(np.float32) for s in shapes] for _ in range(steps)]
  return params, grads


# -- PyTorch -------------------------------------------------------------------------------


def _torch_dtype(name: str) -> Any:
  import torch

  return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]


def torch_optimizer(config: Config, params: list[np.ndarray], impl: str) -> tuple[Any, list[Any]]:
  """A fresh PyTorch optimizer over copies of ``params``; ``impl``: default, foreach or fused."""
  import torch

  ps = [torch.nn.Parameter(torch.from_numpy(p.copy()).to(_torch_dtype(config.dtype))) for p in params]
  flags = {"default": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[impl]
  cls = getattr(torch.optim, config.kind)
  return cls(ps, **config.hyper, **flags), ps


def torch_run(config: Config, opt: Any, ps: list[Any], grads: list[list[np.ndarray]]) -> None:
  """``opt.step()`` once per gradient list (state cast to ``config.state_dtype`` after the first)."""
  import torch

  for k, step_grads in enumerate(grads):
    for p, g in zip(ps, step_grads):
      p.grad = torch.from_numpy(g).to(p.dtype)
    opt.step()
    if k == 0 and config.state_dtype is not None:
      for p in ps:
        for key, value in opt.state[p].items():
          if key != "step" and torch.is_tensor(value):
            opt.state[p][key] = value.to(_torch_dtype(config.state_dtype))


def to_numpy(tensors: list[Any]) -> list[np.ndarray]:
  """Float32 NumPy copies (every bfloat16 is a float32)."""
  return [t.detach().float().numpy().copy() for t in tensors]


def pytorch_final(config: Config, params, grads, impl: str = "default") -> list[np.ndarray]:
  opt, ps = torch_optimizer(config, params, impl)
  torch_run(config, opt, ps, grads)
  return to_numpy(ps)


# -- JAX continuations ------------------------------------------------------------------------


def _state_arrays(opt: Any, ps: list[Any], keys: tuple[str, ...]) -> list[list[Any]]:
  import jax.numpy as jnp
  import torch

  from onnx_optax.interop.torch import _to_numpy  # the bridge's own conversion (bfloat16 included)

  return [[jnp.asarray(_to_numpy(torch, opt.state[p][key])) for p in ps] for key in keys]


def spec_order(config: Config, opt: Any, ps: list[Any]) -> tuple[Any, Any]:
  """The spec-order rules that ``from_torch`` returned before the twins, and their state."""
  import jax.numpy as jnp
  import optax

  import onnx_optax

  h, kind = config.hyper, config.kind
  if kind == "SGD":
    (buf,) = _state_arrays(opt, ps, ("momentum_buffer",))
    tx = onnx_optax.momentum(
      h["lr"],
      alpha=h["momentum"],
      beta=1.0 - h.get("dampening", 0.0),
      mode="nesterov" if h.get("nesterov") else "standard",
      norm_coefficient=h.get("weight_decay", 0.0),
      initial_count=1,
    )
    return tx, onnx_optax.MomentumState(jnp.int32(1), buf)
  if kind == "Adagrad":
    (sums,) = _state_arrays(opt, ps, ("sum",))
    step = int(opt.state[ps[0]]["step"])
    tx = onnx_optax.adagrad(
      h["lr"],
      decay_factor=h.get("lr_decay", 0.0),
      epsilon=1e-10,
      norm_coefficient=h.get("weight_decay", 0.0),
      initial_count=step,
    )
    return tx, onnx_optax.AdagradState(jnp.int32(step), sums)
  m1, m2 = _state_arrays(opt, ps, ("exp_avg", "exp_avg_sq"))
  step = int(opt.state[ps[0]]["step"])
  wd = h.get("weight_decay", 0.0)
  rule = onnx_optax.ort_adamw(
    h["lr"], weight_decay=wd if kind == "AdamW" else 0.0, epsilon=1e-8, initial_count=step + 1
  )
  state = onnx_optax.OrtAdamWState(jnp.int32(step + 1), m1, m2)
  if kind == "Adam" and wd:
    return optax.chain(optax.add_decayed_weights(wd), rule), (optax.EmptyState(), state)
  return rule, state


def twins(config: Config, opt: Any, ps: list[Any]) -> tuple[Any, Any]:
  """The PyTorch-order twins and PyTorch's state, mapped field for field."""
  import jax.numpy as jnp

  import onnx_optax

  h, kind = dict(config.hyper), config.kind
  lr = h.pop("lr")
  if kind == "SGD":
    (buf,) = _state_arrays(opt, ps, ("momentum_buffer",))
    return onnx_optax.pytorch_sgd(lr, **h, initial_count=1), onnx_optax.PyTorchSGDState(jnp.int32(1), buf)
  step = int(opt.state[ps[0]]["step"])
  if kind == "Adagrad":
    (sums,) = _state_arrays(opt, ps, ("sum",))
    return onnx_optax.pytorch_adagrad(lr, **h, initial_count=step), onnx_optax.PyTorchAdagradState(
      jnp.int32(step), sums
    )
  m1, m2 = _state_arrays(opt, ps, ("exp_avg", "exp_avg_sq"))
  make = onnx_optax.pytorch_adamw if kind == "AdamW" else onnx_optax.pytorch_adam
  return make(lr, **h, initial_count=step), onnx_optax.PyTorchAdamState(jnp.int32(step), m1, m2)


def bridge(config: Config, opt: Any, ps: list[Any]) -> tuple[Any, Any]:
  """``onnx_optax.interop.from_torch`` as it is."""
  import jax.numpy as jnp

  from onnx_optax.interop import from_torch

  params = [jnp.asarray(x) for x in _state_arrays_params(ps)]
  return from_torch(opt, params)


def _state_arrays_params(ps: list[Any]) -> list[np.ndarray]:
  import torch

  from onnx_optax.interop.torch import _to_numpy

  return [_to_numpy(torch, p) for p in ps]


MAPPINGS: dict[str, Callable[[Config, Any, list[Any]], tuple[Any, Any]]] = {
  "spec order": spec_order,
  "twins": twins,
  "from_torch": bridge,
}


def carried_final(config: Config, params, grads, mapping: str, move_at: int = MOVE_AT) -> list[np.ndarray]:
  """``move_at`` steps in PyTorch (default implementation), then the rest in JAX."""
  import jax
  import jax.numpy as jnp
  import optax

  opt, ps = torch_optimizer(config, params, "default")
  torch_run(config, opt, ps, grads[:move_at])
  tx, state = MAPPINGS[mapping](config, opt, ps)
  x = [jnp.asarray(a) for a in _state_arrays_params(ps)]

  @jax.jit
  def step(x, state, g):
    updates, state = tx.update(g, state, x)
    return optax.apply_updates(x, updates), state

  dtype = jnp.dtype(config.dtype)
  for step_grads in grads[move_at:]:
    x, state = step(x, state, [jnp.asarray(g, dtype) for g in step_grads])
  return [np.asarray(a, np.float32) for a in x]


# -- the comparison ------------------------------------------------------------------------------


def compare(
  ours: list[np.ndarray], reference: list[np.ndarray], dtype: str = "float32"
) -> tuple[float, float]:
  """``(max ulps, min bitwise fraction)`` over the leaves; an ulp is the spacing of the leaf's
  largest magnitude in ``dtype``."""
  import ml_dtypes

  np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
  ulps, equal = 0.0, 1.0
  for a, b in zip(ours, reference):
    top = np.asarray(np.max(np.abs(b)), np_dtype)
    spacing = (
      float(np.spacing(top))
      if np_dtype != ml_dtypes.bfloat16
      else float(2.0 ** (np.floor(np.log2(float(top))) - 7))
    )
    ulps = max(ulps, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / spacing)
    equal = min(equal, float(np.mean(a.view(np.uint32) == b.view(np.uint32))))
  return ulps, equal


def row(
  config: Config, steps: int = STEPS, move_at: int = MOVE_AT, shapes=SHAPES, mappings=tuple(MAPPINGS)
) -> dict:
  """Every comparison of one configuration: ``{column: (ulps, bitwise fraction)}``."""
  params, grads = data(steps, shapes)
  reference = pytorch_final(config, params, grads)
  out: dict[str, Any] = {}
  for impl in ("fused", "foreach"):
    try:
      out[f"torch {impl}"] = compare(pytorch_final(config, params, grads, impl), reference, config.dtype)
    except RuntimeError as e:  # fused kernels refuse a float32 state for bfloat16 parameters
      out[f"torch {impl}"] = str(e)
  for mapping in mappings:
    try:
      out[mapping] = compare(carried_final(config, params, grads, mapping, move_at), reference, config.dtype)
    except ValueError:  # a bridge that refuses the configuration (its message: in the tests)
      out[mapping] = "refused"
  return out


def spread(result: dict) -> float:
  """PyTorch's own spread: the larger of fused and foreach against the default, in ulps."""
  return max(result[c][0] for c in ("torch fused", "torch foreach") if isinstance(result[c], tuple))


def table(configs, **kwargs) -> str:
  columns = ("torch fused", "torch foreach", *kwargs.get("mappings", MAPPINGS))
  lines = ["| configuration | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
  for config in configs:
    result = row(config, **kwargs)
    cells = [
      f"{result[c][0]:.1f} ulp, {100 * result[c][1]:.1f}%" if isinstance(result[c], tuple) else "refuses"
      for c in columns
    ]
    lines.append(f"| {config.name} | " + " | ".join(cells) + " |")
    print(lines[-1], flush=True)
  return "\n".join(lines)


# -- Keras 3 Adam ---------------------------------------------------------------------------------

KERAS_HYPER = dict(learning_rate=1e-3)


def keras_final(
  params, grads, mode: str, move_at: int = MOVE_AT, continue_with: Any = None
) -> list[np.ndarray]:
  """Keras 3 ``Adam`` on the JAX backend: ``mode`` "eager" (``optimizer.apply``, one XLA
  computation per operation) or "jit" (``stateless_apply`` under ``jax.jit``, as ``model.fit``
  runs it). ``continue_with``: after ``move_at`` eager steps, ``continue_with(optimizer,
  params)`` gives ``(tx, state)`` (``from_keras``) for the rest, jitted."""
  import jax
  import jax.numpy as jnp
  import keras
  import optax

  variables = [keras.Variable(p.copy()) for p in params]
  opt = keras.optimizers.Adam(**KERAS_HYPER)
  opt.build(variables)
  if mode == "jit":
    apply = jax.jit(opt.stateless_apply)
    opt_vars, values = [v.value for v in opt.variables], [v.value for v in variables]
    for step_grads in grads:
      values, opt_vars = apply(opt_vars, [jnp.asarray(g) for g in step_grads], values)
    return [np.asarray(v) for v in values]
  for step_grads in grads[: move_at if continue_with else len(grads)]:
    opt.apply([np.asarray(g) for g in step_grads], variables)
  if continue_with is None:
    return [np.asarray(v.numpy()) for v in variables]
  x = [jnp.asarray(v.numpy()) for v in variables]
  tx, state = continue_with(opt, x)

  @jax.jit
  def step(x, state, g):
    updates, state = tx.update(g, state, x)
    return optax.apply_updates(x, updates), state

  for step_grads in grads[move_at:]:
    x, state = step(x, state, [jnp.asarray(g) for g in step_grads])
  return [np.asarray(a) for a in x]


def keras_row(steps: int = STEPS, move_at: int = MOVE_AT, shapes=SHAPES) -> dict:
  """Keras Adam: its own spread (jitted against eager), the run carried by ``from_keras`` (the
  twin ``keras_adam``) and by DirectML Adam in its spec's order, each against the eager run
  and against the jitted one."""
  from onnx_optax.interop import from_keras

  params, grads = data(steps, shapes)
  eager = keras_final(params, grads, "eager")
  jitted = keras_final(params, grads, "jit")
  carried = keras_final(params, grads, "eager", move_at, from_keras)
  twin = keras_final(params, grads, "eager", move_at, keras_twin)
  spec = keras_final(params, grads, "eager", move_at, keras_spec_order)
  return {
    "keras jit vs eager": compare(jitted, eager),
    "directml_adam vs eager": compare(spec, eager),
    "from_keras vs eager": compare(carried, eager),
    "from_keras vs jit": compare(carried, jitted),
    "keras_adam vs eager": compare(twin, eager),
  }


def keras_spec_order(opt: Any, x: list[Any]) -> tuple[Any, Any]:
  """``onnx_optax.directml_adam`` (what ``from_keras`` returned before the twin) and its state."""
  import jax.numpy as jnp

  import onnx_optax

  count = int(opt.iterations.numpy()) + 1
  tx = onnx_optax.directml_adam(
    float(opt.learning_rate.numpy()),
    beta1=opt.beta_1,
    beta2=opt.beta_2,
    epsilon=opt.epsilon,
    initial_count=count,
  )
  moments = (
    [jnp.asarray(m.numpy()) for m in opt._momentums],
    [jnp.asarray(v.numpy()) for v in opt._velocities],
  )
  return tx, onnx_optax.DirectMLAdamState(jnp.int32(count), *moments)


def keras_twin(opt: Any, x: list[Any]) -> tuple[Any, Any]:
  """``onnx_optax.keras_adam`` and Keras's state, mapped field for field."""
  import jax.numpy as jnp

  import onnx_optax

  count = int(opt.iterations.numpy())
  tx = onnx_optax.keras_adam(
    float(opt.learning_rate.numpy()),
    beta_1=opt.beta_1,
    beta_2=opt.beta_2,
    epsilon=opt.epsilon,
    initial_count=count,
  )
  moments = (
    [jnp.asarray(m.numpy()) for m in opt._momentums],
    [jnp.asarray(v.numpy()) for v in opt._velocities],
  )
  return tx, onnx_optax.KerasAdamState(jnp.int32(count), *moments)


# -- step time ------------------------------------------------------------------------------------


def timing(n: int = 1 << 20, repeats: int = 15) -> str:
  """Median step time of each twin against the spec-order rule and Optax's nearest, interleaved."""
  import jax
  import jax.numpy as jnp
  import optax

  import onnx_optax

  contenders = {
    "AdamW": {
      "pytorch_adamw": onnx_optax.pytorch_adamw(1e-3),
      "ort_adamw": onnx_optax.ort_adamw(1e-3),
      "optax.adamw": optax.adamw(1e-3, weight_decay=0.01),
    },
    "SGD": {
      "pytorch_sgd": onnx_optax.pytorch_sgd(1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-3),
      "momentum": onnx_optax.momentum(1e-2, alpha=0.9, beta=0.9, mode="standard", norm_coefficient=1e-3),
      "optax.sgd": optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(1e-2, momentum=0.9)),
    },
    "Adagrad": {
      "pytorch_adagrad": onnx_optax.pytorch_adagrad(1e-2, lr_decay=1e-3, weight_decay=1e-3),
      "adagrad": onnx_optax.adagrad(1e-2, decay_factor=1e-3, epsilon=1e-10, norm_coefficient=1e-3),
      "optax.adagrad": optax.chain(optax.add_decayed_weights(1e-3), optax.adagrad(1e-2)),
    },
  }
  lines = [f"step time, {n} float32 elements, median of {repeats} interleaved repeats (ratio to the twin)"]
  key = jax.random.key(0)
  for family, txs in contenders.items():
    runs = {}
    for name, tx in txs.items():

      def step(x, state, g, tx=tx):
        updates, state = tx.update(g, state, x)
        return optax.apply_updates(x, updates), state

      f = jax.jit(step, donate_argnums=(0, 1))
      x = jax.random.normal(key, (n,), jnp.float32)
      g = 0.1 * jax.random.normal(jax.random.key(1), (n,), jnp.float32)
      state = tx.init(x)
      x, state = f(x, state, g)
      jax.block_until_ready(x)
      runs[name] = [f, x, state, g, []]
    for r in range(repeats):
      names = list(runs)
      for name in names[r % len(names) :] + names[: r % len(names)]:
        f, x, state, g, times = runs[name]
        t0 = time.perf_counter()
        for _ in range(10):
          x, state = f(x, state, g)
        jax.block_until_ready(x)
        times.append((time.perf_counter() - t0) / 10)
        runs[name][1:3] = [x, state]
    medians = {name: statistics.median(run[4]) for name, run in runs.items()}
    base = medians[next(iter(txs))]
    lines.append(
      f"  {family}: " + ", ".join(f"{name} {1e3 * t:.3f} ms ({t / base:.2f}x)" for name, t in medians.items())
    )
    print(lines[-1], flush=True)
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--x64", action="store_true", help="jax_enable_x64: step-dependent scalars in float64")
  parser.add_argument("--timing", action="store_true", help="also the step time against Optax")
  parser.add_argument("--keras", action="store_true", help="also Keras 3 Adam (needs KERAS_BACKEND=jax)")
  parser.add_argument("--out", help="write the output to this file as well")
  args = parser.parse_args(argv)
  import jax
  import torch

  torch.set_num_threads(1)
  if args.x64:
    jax.config.update("jax_enable_x64", True)
  header = [
    f"# {' '.join(['python benchmarks/carried_float32.py', *(argv if argv is not None else sys.argv[1:])])}",
    f"# jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}, {platform.machine()}, "
    f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, jax_enable_x64={jax.config.read('jax_enable_x64')}",
    f"# {STEPS} steps on fixed gradients, carried to JAX after {MOVE_AT}; leaves {SHAPES}.",
    "# Each cell: largest difference from the all-PyTorch default run, in ulps of each leaf's",
    "# largest magnitude (the largest over the leaves), and the smallest fraction of bitwise-equal",
    "# elements over the leaves. torch fused / foreach: PyTorch's own spread.",
  ]
  print("\n".join(header), flush=True)
  body = [table(CONFIGS), "", table(BF16_CONFIGS)]
  if args.keras:
    result = keras_row()
    body += [
      "",
      "Keras 3 Adam (lr 1e-3), JAX backend: "
      + ", ".join(f"{k}: {u:.1f} ulp, {100 * b:.1f}%" for k, (u, b) in result.items()),
    ]
    print(body[-1], flush=True)
  if args.timing:
    body += ["", timing()]
  if args.out:
    with open(args.out, "w") as f:
      f.write("\n".join(header + body) + "\n")


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main()
