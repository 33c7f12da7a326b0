"""The rules against other frameworks' optimizers over many steps (issue 11, item 6).

ONNX's backend test cases all have ``T = 0``; the terms that need ``T > 0``
(Momentum's ``beta_adjusted``, Adagrad's decayed rate, the Adam rules' bias
corrections) meet an independent implementation here, run for STEPS updates:

* ONNX Momentum = ``torch.optim.SGD(lr=R, momentum=alpha, dampening=1 - beta,
  weight_decay=norm_coefficient, nesterov)``: torch's first step stores the
  undamped gradient, as ``beta_adjusted = 1`` at ``T = 0`` does. torch
  refuses Nesterov with non-zero dampening, so Nesterov runs with ``beta = 1``.
* ONNX Adagrad = ``torch.optim.Adagrad(lr=R, lr_decay=decay_factor,
  eps=epsilon, weight_decay=norm_coefficient, initial_accumulator_value=0)``,
  with ONNX's ``T`` = torch's step - 1.
* ONNX Runtime's AdamW, mode 0 = ``torch.optim.AdamW(lr, betas=(alpha, beta),
  eps=epsilon, weight_decay)``, ``step`` from 1; with
  ``optax.add_decayed_weights(wd)`` before it and no decay of its own, it is
  ``torch.optim.Adam(weight_decay=wd)`` (L2 in the gradient).
* DirectML Adam = Keras 3's ``keras.optimizers.Adam(learning_rate, beta_1,
  beta_2, epsilon)``: ``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` times
  ``m / (sqrt(v) + epsilon)``, epsilon outside the bias correction, ``t`` from
  1. ONNX Adam started at ``T = 1`` (``initial_count=1``) without its L2 terms
  is the same rule.

The inputs are identical on both sides: float32 parameters and gradients
(exact in float64) and hyperparameters that are dyadic fractions, exact in
float32 and with ``1 - (1 - beta) == beta`` exactly, so that no
hyperparameter is rounded differently by the two frameworks. The gradients
are a fixed sequence (signs and magnitudes over three decades), not a
function of the iterate, so that rounding errors are not amplified by the
dynamics and the trajectory bound of ``rule_configs.trajectory_tolerances``
applies (its docstring has the derivation).

* float64: ours and theirs each within that bound with ``u = 2**-53``, so
  within twice of it of each other: a few 1e-13 to 1e-12 here.
* float32: our float32 run against their float64 run, within our float32
  bound plus their float64 one. Their own float32 runs are not compared:
  their rounding (Keras's ``1 - pow(beta, t)``, for instance, loses ``u /
  (1 - beta)`` to cancellation where ours uses ``expm1``) is theirs to bound.
"""

from __future__ import annotations

import os

# Keras 3 picks its backend once, at import, from KERAS_BACKEND; the JAX
# backend is the one installed with the project (TensorFlow is not). setdefault
# leaves a user's choice alone; the test below says so if it is not JAX.
os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from rule_configs import trajectory_tolerances  # noqa: E402

import onnx_optax  # noqa: E402

STEPS = 100
N = 12
U64, U32 = 2.0**-53, 2.0**-24
VERBOSE = False  # python tests/test_independent_references.py prints the margins


def _inputs(seed):
  """Starting parameters and STEPS gradients, float32 values."""
  rng = np.random.default_rng(seed)
  X0 = rng.normal(size=N).astype(np.float32)
  magnitude = 10.0 ** rng.uniform(-2, 1, size=(STEPS, 1))
  grads = (rng.normal(size=(STEPS, N)) * magnitude).astype(np.float32)
  return X0, grads


def _ours(opt, X0, grads, dtype):
  """The trajectory (STEPS, N) of an onnx_optax transform, one jitted update per step."""
  with jax.enable_x64(dtype == np.float64):
    x = jnp.asarray(X0, dtype)
    state = opt.init(x)
    update = jax.jit(opt.update)
    path = []
    for g in grads:
      u, state = update(jnp.asarray(g, dtype), state, x)
      x = optax.apply_updates(x, u)
      assert x.dtype == dtype
      path.append(np.asarray(x, np.float64))
  return np.array(path)


def _torch(make, X0, grads):
  """The float64 trajectory of a torch.optim optimizer on the same gradients."""
  p = torch.nn.Parameter(torch.tensor(X0, dtype=torch.float64))
  opt = make([p])
  path = []
  for g in grads:
    p.grad = torch.tensor(g, dtype=torch.float64)
    opt.step()
    path.append(p.detach().numpy().copy())
  return np.array(path)


def _keras(make, X0, grads):
  """The float64 trajectory of a Keras 3 optimizer (JAX backend) on the same gradients."""
  assert keras.backend.backend() == "jax", (
    f"this test needs Keras's JAX backend, KERAS_BACKEND={os.environ.get('KERAS_BACKEND')!r} "
    f"selected {keras.backend.backend()!r}"
  )
  with jax.enable_x64(True):
    variable = keras.Variable(np.asarray(X0, np.float64), dtype="float64")
    opt = make()
    opt.build([variable])
    path = []
    for g in grads:
      opt.apply_gradients([(jnp.asarray(g, jnp.float64), variable)])
      path.append(np.asarray(variable.value, np.float64))
    assert variable.value.dtype == jnp.float64
  return np.array(path)


def _check(rule, hyper, lr, T0, X0, grads, make_ours, theirs):
  """Ours in float64 and float32 against their float64 trajectory ``theirs``."""
  X0_64 = [np.asarray(X0, np.float64)]
  xs = [[x] for x in theirs]
  tol64 = np.array(trajectory_tolerances(rule, hyper, lr, X0_64, xs, U64, T0))
  tol32 = np.array(trajectory_tolerances(rule, hyper, lr, X0_64, xs, U32, T0))
  assert tol64[-1] < 1e-10  # the float64 bound is a tight one: 6e-13 to 2e-11 here
  ours64 = _ours(make_ours(), X0, grads, np.float64)
  ours32 = _ours(make_ours(), X0, grads, np.float32)
  err64 = np.abs(ours64 - theirs).max(axis=1)
  err32 = np.abs(ours32 - theirs).max(axis=1)
  # Both runs move: the comparison is not between two standing parameters.
  assert np.abs(theirs[-1] - np.asarray(X0, np.float64)).max() > 100 * tol32[-1]
  bad64 = np.flatnonzero(err64 > 2 * tol64)
  assert bad64.size == 0, f"float64 step {bad64[0]}: {err64[bad64[0]]:.3e} > {2 * tol64[bad64[0]]:.3e}"
  bad32 = np.flatnonzero(err32 > tol32 + tol64)
  assert bad32.size == 0, f"float32 step {bad32[0]}: {err32[bad32[0]]:.3e} > {tol32[bad32[0]]:.3e}"
  if VERBOSE:
    print(
      f"{rule:14s} {hyper}: float64 max|diff| {err64.max():.1e}, bound {2 * tol64[-1]:.1e}; "
      f"float32 max|diff| {err32.max():.1e}, bound {tol32[-1]:.1e}; worst step at "
      f"{(err32 / (tol32 + tol64)).max():.2f} of its bound; moved {np.abs(theirs[-1] - X0).max():.2f}"
    )


# ----------------------------------------------------------------------------
# ONNX Momentum = torch.optim.SGD with dampening


@pytest.mark.parametrize("mode,beta", [("standard", 0.75), ("standard", 1.0), ("nesterov", 1.0)])
def test_momentum_is_torch_sgd_with_dampening(mode, beta):
  R, alpha, c = 2.0**-5, 0.875, 2.0**-6
  X0, grads = _inputs(1)
  hyper = dict(alpha=alpha, beta=beta, mode=mode, norm_coefficient=c)
  theirs = _torch(
    lambda p: torch.optim.SGD(
      p, lr=R, momentum=alpha, dampening=1 - beta, weight_decay=c, nesterov=mode == "nesterov"
    ),
    X0,
    grads,
  )
  _check("momentum", hyper, R, 0, X0, grads, lambda: onnx_optax.momentum(R, **hyper), theirs)


def test_torch_refuses_nesterov_with_dampening():
  """Why Nesterov is compared at beta = 1 only: torch has no damped Nesterov."""
  with pytest.raises(ValueError, match="dampening"):
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9, dampening=0.25, nesterov=True)


# ----------------------------------------------------------------------------
# ONNX Adagrad = torch.optim.Adagrad with lr_decay


@pytest.mark.parametrize("decay_factor,c", [(0.125, 2.0**-6), (0.0, 0.0)])
def test_adagrad_is_torch_adagrad_with_lr_decay(decay_factor, c):
  R, eps = 2.0**-4, 0.25
  X0, grads = _inputs(2)
  hyper = dict(decay_factor=decay_factor, epsilon=eps, norm_coefficient=c)
  theirs = _torch(
    lambda p: torch.optim.Adagrad(
      p, lr=R, lr_decay=decay_factor, eps=eps, weight_decay=c, initial_accumulator_value=0
    ),
    X0,
    grads,
  )
  _check("adagrad", hyper, R, 0, X0, grads, lambda: onnx_optax.adagrad(R, **hyper), theirs)


# ----------------------------------------------------------------------------
# DirectML Adam = Keras 3 Adam = ONNX Adam from T = 1


ADAM = [
  (2.0**-7, 0.875, 1 - 2.0**-7, 2.0**-10),  # epsilon small next to sqrt(v)
  (2.0**-5, 0.5, 0.75, 0.25),
]  # epsilon comparable to sqrt(v)


@pytest.mark.parametrize("lr,beta1,beta2,eps", ADAM)
def test_directml_adam_is_keras_adam(lr, beta1, beta2, eps):
  X0, grads = _inputs(3)
  theirs = _keras(
    lambda: keras.optimizers.Adam(learning_rate=lr, beta_1=beta1, beta_2=beta2, epsilon=eps), X0, grads
  )
  hyper = dict(beta1=beta1, beta2=beta2, epsilon=eps)
  _check("directml_adam", hyper, lr, 1, X0, grads, lambda: onnx_optax.directml_adam(lr, **hyper), theirs)


@pytest.mark.parametrize("lr,beta1,beta2,eps", ADAM)
def test_onnx_adam_from_t1_is_keras_adam(lr, beta1, beta2, eps):
  X0, grads = _inputs(4)
  theirs = _keras(
    lambda: keras.optimizers.Adam(learning_rate=lr, beta_1=beta1, beta_2=beta2, epsilon=eps), X0, grads
  )
  hyper = dict(alpha=beta1, beta=beta2, epsilon=eps, norm_coefficient=0.0, norm_coefficient_post=0.0)
  _check("adam", hyper, lr, 1, X0, grads, lambda: onnx_optax.adam(lr, **hyper, initial_count=1), theirs)


def test_onnx_adam_from_t0_is_not_keras_adam():
  """The mapping needs initial_count=1: at T = 0 ONNX Adam skips the bias correction."""
  lr, beta1, beta2, eps = ADAM[0]
  X0, grads = _inputs(4)
  theirs = _keras(
    lambda: keras.optimizers.Adam(learning_rate=lr, beta_1=beta1, beta_2=beta2, epsilon=eps), X0, grads
  )
  ours = _ours(onnx_optax.adam(lr, alpha=beta1, beta=beta2, epsilon=eps), X0, grads, np.float64)
  # First step: ONNX moves by lr (1 - beta1) / sqrt(1 - beta2) = 1.41 lr per element, Keras by lr.
  assert np.abs(ours[0] - theirs[0]).max() > 0.3 * lr
  # And every later step differs too (it is not "equal from the second step"): the moments do not
  # read X, so both runs hold the same ones, and step k's update differs only by the bias
  # correction, taken at T = k - 1 in ONNX and t = k in Keras.
  step_ours, step_theirs = np.diff(ours, axis=0), np.diff(theirs, axis=0)
  # Steps 2 to 5 (the corrections converge as T grows): each at least 1% of Keras's step apart.
  for k in range(1, 5):
    assert np.abs(step_ours[k] - step_theirs[k]).max() > 0.01 * np.abs(step_theirs[k]).max(), k + 1


# ----------------------------------------------------------------------------
# ONNX Runtime AdamW mode 0 = torch.optim.AdamW; + add_decayed_weights = torch.optim.Adam

ADAMW = [
  (2.0**-6, 0.875, 1 - 2.0**-7, 2.0**-10, 2.0**-4),  # epsilon small next to sqrt(v)
  (2.0**-5, 0.5, 0.75, 0.25, 2.0**-3),  # epsilon comparable to sqrt(v)
]


@pytest.mark.parametrize("lr,beta1,beta2,eps,wd", ADAMW)
def test_ort_adamw_mode0_is_torch_adamw(lr, beta1, beta2, eps, wd):
  """PyTorch's AdamW: decay W by lr * wd first, then Adam with epsilon outside sqrt(v_hat).

  ONNX Runtime's ``step`` is PyTorch's step after its increment (1 at the first
  update): ``initial_count=1``, the default. float64 within 1e-12 of PyTorch's
  float64 run over STEPS updates; float32 within the trajectory bound.
  """
  X0, grads = _inputs(5)
  theirs = _torch(
    lambda p: torch.optim.AdamW(p, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd), X0, grads
  )
  hyper = dict(alpha=beta1, beta=beta2, epsilon=eps, weight_decay=wd, adam_mode=0)
  _check("ort_adamw", hyper, lr, 1, X0, grads, lambda: onnx_optax.ort_adamw(lr, **hyper), theirs)
  ours64 = _ours(onnx_optax.ort_adamw(lr, **hyper), X0, grads, np.float64)
  assert np.abs(ours64 - theirs).max() <= 1e-12


@pytest.mark.parametrize("lr,beta1,beta2,eps,wd", ADAMW)
def test_ort_adamw_mode0_after_l2_is_torch_adam(lr, beta1, beta2, eps, wd):
  """PyTorch's Adam with weight_decay (L2 added to the gradient) is
  ``optax.chain(optax.add_decayed_weights(wd), ort_adamw(weight_decay=0))``:
  float64 within 1e-12 over STEPS updates."""
  X0, grads = _inputs(6)
  theirs = _torch(
    lambda p: torch.optim.Adam(p, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd), X0, grads
  )
  ours = optax.chain(
    optax.add_decayed_weights(wd),
    onnx_optax.ort_adamw(lr, alpha=beta1, beta=beta2, epsilon=eps, weight_decay=0.0),
  )
  ours64 = _ours(ours, X0, grads, np.float64)
  assert np.abs(ours64 - theirs).max() <= 1e-12
  assert np.abs(theirs[-1] - X0).max() > 0.1  # the run moves
  # Without the L2 term it is another run: the comparison sees the decay.
  plain = _ours(
    onnx_optax.ort_adamw(lr, alpha=beta1, beta=beta2, epsilon=eps, weight_decay=0.0), X0, grads, np.float64
  )
  assert np.abs(plain - theirs).max() > 1e3 * 1e-12


def test_ort_adamw_mode1_is_not_torch_adamw():
  """Mode 1 (Hugging Face's) differs: epsilon outside the bias correction, the decay after the step."""
  lr, beta1, beta2, eps, wd = ADAMW[1]
  X0, grads = _inputs(5)
  theirs = _torch(
    lambda p: torch.optim.AdamW(p, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd), X0, grads
  )
  hyper = dict(alpha=beta1, beta=beta2, epsilon=eps, weight_decay=wd, adam_mode=1)
  ours = _ours(onnx_optax.ort_adamw(lr, **hyper), X0, grads, np.float64)
  assert np.abs(ours - theirs).max() > 1e-4


if __name__ == "__main__":
  # The margins (docs/numerics.md): PYTHONPATH=tests python tests/test_independent_references.py
  VERBOSE = True
  for mode, beta in [("standard", 0.75), ("standard", 1.0), ("nesterov", 1.0)]:
    test_momentum_is_torch_sgd_with_dampening(mode, beta)
  for decay_factor, c in [(0.125, 2.0**-6), (0.0, 0.0)]:
    test_adagrad_is_torch_adagrad_with_lr_decay(decay_factor, c)
  for args in ADAM:
    test_directml_adam_is_keras_adam(*args)
    test_onnx_adam_from_t1_is_keras_adam(*args)
  for adamw_args in ADAMW:
    test_ort_adamw_mode0_is_torch_adamw(*adamw_args)
