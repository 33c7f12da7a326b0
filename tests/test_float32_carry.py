"""The PyTorch-order twins: against the NumPy expectations, against torch.optim, and carried in float32.

* Each twin equals its NumPy expectation (onnx_optax/reference.py, written from PyTorch's
  ``_single_tensor_*`` functions) in float64 to 1e-13, and in float32 to the bit wherever
  PyTorch's CPU kernel and NumPy agree (everywhere but MKL's square root, which NumPy does not
  reproduce: the Adam and Adagrad checks allow one ulp in a few elements).
* Each twin continues a torch.optim run in float64 to 1e-12.
* The table of benchmarks/carried_float32.py, on smaller runs: a run carried to JAX after 100
  steps stays within ``max(4 ulp, 2 x PyTorch's own spread)`` of the run that never left
  PyTorch after 400 more, in float32 and with bfloat16 parameters; its bitwise-equal fraction
  is held to a floor measured here (XLA permits these fractions, not 100 %: see
  docs/interop.md, "Float32 runs carried from PyTorch").
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import onnx_optax
from onnx_optax import reference

_SCRIPT = pathlib.Path(__file__).parent.parent / "benchmarks" / "carried_float32.py"
_spec = importlib.util.spec_from_file_location("carried_float32", _SCRIPT)
assert _spec is not None and _spec.loader is not None
carried = importlib.util.module_from_spec(_spec)
sys.modules["carried_float32"] = carried  # dataclasses look their module up
_spec.loader.exec_module(carried)

# name -> (twin factory, NumPy expectation, state fields, hyperparameters)
SGD_CASES: dict[str, dict] = {
  "sgd plain": dict(lr=0.05),
  "sgd momentum dampening wd": dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3),
  "sgd nesterov maximize": dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01, maximize=True),
}
ADAGRAD_CASES: dict[str, dict] = {
  "adagrad": dict(lr=0.05),
  "adagrad all": dict(
    lr=0.05, lr_decay=0.01, weight_decay=1e-2, eps=1e-6, maximize=True, initial_accumulator_value=0.3
  ),
}
ADAM_CASES: dict[str, dict] = {
  "adam": dict(lr=1e-2),
  "adam coupled": dict(lr=1e-2, weight_decay=0.05, betas=(0.8, 0.99)),
  "adamw": dict(lr=1e-2, weight_decay=0.05, decoupled_weight_decay=True, maximize=True),
  "adamw lerp's other branch": dict(
    lr=1e-2, weight_decay=0.05, decoupled_weight_decay=True, betas=(0.3, 0.9)
  ),
}


def _data(steps, dtype, n=257, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(n).astype(dtype)
  grads = [(0.3 * rng.standard_normal(n)).astype(dtype) for _ in range(steps)]
  return x, grads


def _twin(kind, hyper):
  hyper = dict(hyper)
  lr = hyper.pop("lr")
  if kind == "sgd":
    return onnx_optax.pytorch_sgd(lr, **hyper)
  if kind == "adagrad":
    return onnx_optax.pytorch_adagrad(lr, **hyper)
  return onnx_optax.pytorch_adam(lr, **hyper)


def _expected(kind, hyper, x, grads, dtype):
  """The NumPy expectation over ``grads``, from a fresh state."""
  hyper = dict(hyper)
  lr = hyper.pop("lr")
  if kind == "sgd":
    full = dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False) | hyper
    buf = None
    for count, g in enumerate(grads):
      x, buf = reference.pytorch_sgd(lr, count, x, g, buf, **full, dtype=dtype)
    return x
  if kind == "adagrad":
    initial = hyper.pop("initial_accumulator_value", 0.0)
    full = dict(lr_decay=0.0, eps=1e-10, weight_decay=0.0, maximize=False) | hyper
    state_sum = np.full_like(x, initial)
    for count, g in enumerate(grads):
      x, state_sum = reference.pytorch_adagrad(lr, count, x, g, state_sum, **full, dtype=dtype)
    return x
  full = (
    dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False, maximize=False) | hyper
  )
  m, v = np.zeros_like(x), np.zeros_like(x)
  for count, g in enumerate(grads):
    x, m, v = reference.pytorch_adam(lr, count, x, g, m, v, **full, dtype=dtype)
  return x


def _jax_run(tx, x, grads):
  x = jnp.asarray(x)
  state = tx.init(x)

  @jax.jit
  def step(x, state, g):
    updates, state = tx.update(g, state, x)
    return optax.apply_updates(x, updates), state

  for g in grads:
    x, state = step(x, state, jnp.asarray(g))
  return np.asarray(x)


ALL: list[tuple[str, str, dict]] = [("sgd", n, h) for n, h in SGD_CASES.items()]
ALL += [("adagrad", n, h) for n, h in ADAGRAD_CASES.items()]
ALL += [("adam", n, h) for n, h in ADAM_CASES.items()]


@pytest.mark.parametrize("kind, name, hyper", ALL, ids=[n for _, n, _ in ALL])
def test_twin_is_its_numpy_expectation_float64(kind, name, hyper):
  x, grads = _data(30, np.float64)
  with jax.enable_x64(True):
    ours = _jax_run(_twin(kind, hyper), x, grads)
  expected = _expected(kind, hyper, x, grads, np.float64)
  np.testing.assert_allclose(ours, expected, rtol=1e-13, atol=1e-13)


def _rule_run(kind, hyper, x, grads):
  """The rule's own new parameters (``onnx_optax.rules``), step by step, jitted: no additive update."""
  from onnx_optax import rules
  from onnx_optax.transforms import _scalars_in

  hyper = dict(hyper)
  lr, maximize = hyper.pop("lr"), hyper.pop("maximize", False)
  if kind == "sgd":
    full = dict(momentum=0.0, dampening=0.0, weight_decay=0.0) | hyper
    nesterov = full.pop("nesterov", False)
    scalars, state = (lambda c: rules.pytorch_sgd_scalars(lr, c, **full)), [jnp.zeros_like(x)]
    part = lambda s, X, G, S: rules.pytorch_sgd_elementwise(s, X, G, *S, nesterov=nesterov, maximize=maximize)  # noqa: E731
  elif kind == "adagrad":
    initial = hyper.pop("initial_accumulator_value", 0.0)
    full = dict(lr_decay=0.0, eps=1e-10, weight_decay=0.0) | hyper
    scalars, state = (lambda c: rules.pytorch_adagrad_scalars(lr, c, **full)), [jnp.full_like(x, initial)]
    part = lambda s, X, G, S: rules.pytorch_adagrad_elementwise(s, X, G, *S, maximize=maximize)  # noqa: E731
  else:
    beta1, beta2 = hyper.pop("betas", (0.9, 0.999))
    full = dict(eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False) | hyper
    scalars = lambda c: rules.pytorch_adam_scalars(lr, c, beta1=beta1, beta2=beta2, **full)  # noqa: E731
    state = [jnp.zeros_like(x), jnp.zeros_like(x)]
    small = abs(1 - beta1) < 0.5
    part = lambda s, X, G, S: rules.pytorch_adam_elementwise(s, X, G, *S, maximize=maximize, lerp_small=small)  # noqa: E731

  @jax.jit
  def step(count, X, G, S):
    X_new, *S_new = part(_scalars_in(scalars(count), X.dtype), X, G, S)
    return X_new, S_new

  # The rules' arithmetic: X_new itself where the transform returns an update.
  with (
    mock.patch.object(rules, "_in_place", lambda x_new, X: x_new.astype(X.dtype)),
    mock.patch.object(rules, "_added", lambda x, q, X, dt, G: (x + q).astype(X.dtype)),
  ):
    X = jnp.asarray(x)
    for count, g in enumerate(grads):
      X, state = step(count, X, jnp.asarray(g), state)
  return np.asarray(X)


@pytest.mark.parametrize("kind, name, hyper", ALL, ids=[n for _, n, _ in ALL])
def test_rule_is_its_numpy_expectation_float32(kind, name, hyper):
  """float32, step-dependent scalars in float64 (x64): the rule rounds where the expectation does.

  NumPy's square root and XLA's are both correctly rounded, so what may remain is the float64
  emulation of the FMA in the expectation (a double rounding, about 2^-29 per operation).
  """
  x, grads = _data(30, np.float32)
  with jax.enable_x64(True):
    ours = _rule_run(kind, hyper, x, grads)
  expected = _expected(kind, hyper, x, grads, np.float32)
  assert ours.dtype == np.float32
  assert np.mean(ours == expected) >= 0.999, np.mean(ours == expected)


@pytest.mark.parametrize("kind, name, hyper", ALL, ids=[n for _, n, _ in ALL])
def test_transform_is_its_numpy_expectation_float32(kind, name, hyper):
  """Through ``optax.apply_updates``: ``X + U`` cannot reach ``X_new`` where a step shrinks a
  parameter by more than half (``X_new`` finer than the spacing of ``X``); elsewhere bitwise."""
  x, grads = _data(30, np.float32)
  with jax.enable_x64(True):
    ours = _jax_run(_twin(kind, hyper), x, grads)
  expected = _expected(kind, hyper, x, grads, np.float32)
  assert np.mean(ours == expected) >= 0.9, np.mean(ours == expected)
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def _torch_run(kind, hyper, x, grads, dtype):
  hyper = dict(hyper)
  p = torch.nn.Parameter(torch.from_numpy(x.copy()))
  decoupled = hyper.pop("decoupled_weight_decay", False)
  cls = {
    "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.AdamW if decoupled else torch.optim.Adam,
  }[kind]
  opt = cls([p], foreach=False, **hyper)
  for g in grads:
    p.grad = torch.from_numpy(g.copy())
    opt.step()
  return p.detach().numpy()


@pytest.mark.parametrize("kind, name, hyper", ALL, ids=[n for _, n, _ in ALL])
def test_twin_is_torch_optim_float64(kind, name, hyper):
  x, grads = _data(30, np.float64)
  with jax.enable_x64(True):
    ours = _jax_run(_twin(kind, hyper), x, grads)
  theirs = _torch_run(kind, hyper, x, grads, np.float64)
  np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


# -- the carried float32 table ----------------------------------------------------------------

STEPS, MOVE_AT = 500, 100
SHAPES = ((32, 16), (97,), (7,))

#: The smallest bitwise-equal fraction of each configuration's carried run, measured
#: (CPU, torch 2.13, jax 0.10): a floor a little under what is seen, so that a lost rounding
#: (an FMA where PyTorch rounds, ONNX Runtime's 1 - beta) fails it.
BITWISE_FLOOR = {
  "AdamW (lr 1e-3, wd 0.01)": 0.75,
  "Adam (coupled wd 0.01)": 0.75,
  "SGD (momentum 0.9, dampening 0.1, wd 1e-3)": 0.95,
  "SGD Nesterov (momentum 0.9, wd 1e-3)": 0.95,
  "Adagrad (lr_decay 1e-3, wd 1e-3)": 0.7,
  "bf16/bf16 AdamW": 0.95,
  "bf16/bf16 Adam (coupled wd)": 0.95,
  "bf16/f32 SGD (momentum, dampening, wd)": 0.9,
  "bf16/f32 SGD Nesterov": 0.9,
  "bf16/f32 Adagrad (lr_decay, wd)": 0.9,
}


@pytest.mark.parametrize("config", carried.CONFIGS + carried.BF16_CONFIGS, ids=lambda c: c.name)
def test_carried_run_within_pytorch_spread(config):
  torch.set_num_threads(1)
  result = carried.row(config, steps=STEPS, move_at=MOVE_AT, shapes=SHAPES, mappings=("twins",))
  ulps, bitwise = result["twins"]
  allowed = max(4.0, 2 * carried.spread(result))
  print(f"{config.name}: twins {ulps:.2f} ulp, {100 * bitwise:.1f}% bitwise; PyTorch's spread {result}")
  assert ulps <= allowed, (ulps, allowed, result)
  assert bitwise >= BITWISE_FLOOR[config.name], (bitwise, result)


def test_parameters_are_needed_where_the_step_reads_them():
  """SGD's update is written in place and AdamW's decay reads the parameters: without
  ``params`` they refuse, naming the fix; Adam and Adagrad without decay need none (their
  update is the addend of PyTorch's ``addcdiv_``), except for bfloat16 parameters, which
  PyTorch updates in float32 and rounds once."""
  x, g = jnp.array([1.0, -2.0]), jnp.array([0.5, 0.25])
  for tx in (
    onnx_optax.pytorch_sgd(0.1),
    onnx_optax.pytorch_adamw(0.1),
    onnx_optax.pytorch_adagrad(0.1, weight_decay=0.1),
  ):
    with pytest.raises(ValueError, match=r"needs the parameters: call update\(grads, state, params\)"):
      tx.update(g, tx.init(x))
  for tx in (onnx_optax.pytorch_adam(0.1), onnx_optax.pytorch_adagrad(0.1), onnx_optax.keras_adam(0.1)):
    state = tx.init(x)
    without, _ = tx.update(g, state)
    with_params, _ = tx.update(g, state, x)
    assert np.array_equal(np.asarray(without), np.asarray(with_params))
  tx = onnx_optax.pytorch_adam(0.1)
  xb = x.astype(jnp.bfloat16)
  with pytest.raises(ValueError, match=r"bfloat16 parameters are updated in float32 and rounded once"):
    tx.update(g.astype(jnp.bfloat16), tx.init(xb))
  from onnx_optax import rules

  s = rules.pytorch_adagrad_scalars(0.1, 0, lr_decay=0.0, eps=1e-10, weight_decay=0.1)
  with pytest.raises(ValueError, match="weight_decay multiplies the parameters"):
    rules.pytorch_adagrad_elementwise(s, None, g, jnp.zeros(2), maximize=False)
  s = rules.pytorch_adam_scalars(
    0.1, 0, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, decoupled_weight_decay=False
  )
  with pytest.raises(ValueError, match="weight_decay multiplies the parameters"):
    rules.pytorch_adam_elementwise(s, None, g, jnp.zeros(2), jnp.zeros(2), maximize=False, lerp_small=True)
  s = rules.pytorch_sgd_scalars(0.1, 0, momentum=0.0, dampening=0.0, weight_decay=0.0)
  with pytest.raises(ValueError, match="writes the parameters in place"):
    rules.pytorch_sgd_elementwise(s, None, g, jnp.zeros(2), nesterov=False, maximize=False)
