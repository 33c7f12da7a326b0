"""Scheduled PyTorch runs through the state dicts: each step's learning rate PyTorch's.

* Into JAX: a ``learning_rate`` schedule receives the transform's count as a Python int's
  quotient would need it (int64 under ``jax_enable_x64``), so the recipe of docs/interop.md,
  ``lambda n: base * f(n + step)``, computes PyTorch's float64 rate: the carried run equals
  PyTorch's to 1e-12. A rate rounded to float32 for float64 parameters is refused, and the
  advice of the refusal, followed, gives the exact run.

The expectation is always PyTorch's own run, N + M steps.
"""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch_runs
from interop_data import gradients, initial
from torch.optim import lr_scheduler

import onnx_optax
from onnx_optax.interop import from_torch, from_torch_state_dict

N, M = 3, 4
WARMUP, TOTAL = 4, 12


def _factor(step):
  """transformers' get_linear_schedule_with_warmup factor, as PyTorch's LambdaLR evaluates it."""
  if step < WARMUP:
    return float(step) / float(max(1, WARMUP))
  return max(0.0, float(TOTAL - step) / float(max(1, TOTAL - WARMUP)))


OPTIMIZERS = {
  "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
  "Adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1),
  "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01),
}


def _saved(obj):
  """``obj`` through ``torch.save`` and ``torch.load``, as a file holds it."""
  buffer = io.BytesIO()
  torch.save(obj, buffer)
  buffer.seek(0)
  return torch.load(buffer, weights_only=True)


def _warmup_run(kind, steps):
  """PyTorch's run with the Trainer's linear warmup (a LambdaLR); the parameters after each step."""
  ps = torch_runs.torch_parameters(initial(np.float64))
  opt = OPTIMIZERS[kind](ps)
  scheduler = lr_scheduler.LambdaLR(opt, _factor)
  records = []
  for step_grads in gradients(steps, np.float64):
    for p, g in zip(ps, step_grads):
      p.grad = torch.from_numpy(g)
    opt.step()
    scheduler.step()
    records.append([p.detach().numpy().copy() for p in ps])
  return ps, opt, records


def test_a_schedule_receives_an_int64_count_under_x64():
  """The count a schedule receives: int64 under x64 (``n / 4`` is float64, as PyTorch's rate), int32 without
  (no int64 there); in both engines (an ONNX rule and a PyTorch-order twin)."""
  for x64, want in ((True, "int64"), (False, "int32")):
    with jax.enable_x64(x64):
      for make in (
        lambda s: onnx_optax.pytorch_sgd(s, momentum=0.9),
        lambda s: onnx_optax.momentum(s, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0),
      ):
        seen = []

        def schedule(n, seen=seen):
          seen.append((n.dtype.name, (n / 4).dtype.name))
          return 0.1 * (n + 1) / 4

        tx = make(schedule)
        params = jnp.ones(2)
        jax.jit(tx.update)(jnp.ones(2), tx.init(params), params)
        assert seen == [(want, "float64" if x64 else "float32")], seen


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_the_documented_schedule_recipe_is_exact_in_float64(kind):
  """N PyTorch steps with the Trainer's warmup, the state dict saved, M JAX steps with the schedule as
  docs/interop.md writes it (``base * f(n + step)``, integer arithmetic on ``n``): PyTorch's run to 1e-12.
  With an int32 count the rate was float32: 1.5e-8 relative off at the first step."""
  with jax.enable_x64(True):
    ps, opt, records = _warmup_run(kind, N)
    saved = _saved(opt.state_dict())
    _, _, want = _warmup_run(kind, N + M)
    base, step = saved["param_groups"][0]["initial_lr"], N

    def schedule(n):
      t = n + step
      return base * jnp.where(t < WARMUP, t / WARMUP, jnp.maximum(0.0, (TOTAL - t) / (TOTAL - WARMUP)))

    params = [jnp.asarray(p.detach().numpy()) for p in ps]
    tx, state = from_torch_state_dict(saved, params, learning_rate=schedule)
    params, _ = torch_runs.jax_steps(tx, state, params, gradients(N + M, np.float64)[N:])
    for x, y in zip(params, want[-1]):
      np.testing.assert_allclose(np.asarray(x), y, rtol=1e-12)


def test_a_rate_narrower_than_the_parameters_is_refused_and_the_advice_works():
  """A schedule that casts its count to int32 computes a float32 rate for float64 parameters: refused
  when the transform evaluates it (under jit), with the advice to use n as passed; followed, the run is
  PyTorch's to 1e-12. float32 parameters take a float32 rate."""
  with jax.enable_x64(True):
    ps, opt, _ = _warmup_run("SGD", N)
    saved = _saved(opt.state_dict())
    _, _, want = _warmup_run("SGD", N + M)
    base = saved["param_groups"][0]["initial_lr"]

    def factor(t):
      return jnp.where(t < WARMUP, t / WARMUP, jnp.maximum(0.0, (TOTAL - t) / (TOTAL - WARMUP)))

    params = [jnp.asarray(p.detach().numpy()) for p in ps]
    tx, state = from_torch_state_dict(
      saved, params, learning_rate=lambda n: base * factor(n.astype(jnp.int32) + N)
    )
    with pytest.raises(TypeError) as refused:
      jax.jit(tx.update)([jnp.zeros_like(x) for x in params], state, params)
    message = str(refused.value)
    assert "learning_rate's value is a float32 array for float64 parameters" in message
    assert "write n, not n.astype(jnp.int32)" in message
    tx, state = from_torch_state_dict(
      saved, params, learning_rate=lambda n: base * factor(n + N)
    )  # as advised
    params, _ = torch_runs.jax_steps(tx, state, params, gradients(N + M, np.float64)[N:])
    for x, y in zip(params, want[-1]):
      np.testing.assert_allclose(np.asarray(x), y, rtol=1e-12)

    p32 = torch.nn.Parameter(torch.ones(2))
    tx, state = from_torch(
      torch.optim.SGD([p32], lr=0.1), [jnp.ones(2, jnp.float32)], learning_rate=lambda n: jnp.float32(0.1)
    )
    jax.jit(tx.update)([jnp.ones(2, jnp.float32)], state, [jnp.ones(2, jnp.float32)])
