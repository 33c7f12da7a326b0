"""The tolerance model: it bounds IEEE evaluations, sees cancellation, and is tight."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnx_optax import reference
from onnx_optax.conformance import tolerance

U32 = 2.0**-24


def _momentum_in(dtype, R, T, X, G, V, alpha, beta, norm_coefficient):
  """Momentum in NumPy ``dtype`` (IEEE per operation), the implementation's policy."""
  c = lambda v: np.asarray(v, dtype)  # noqa: E731 -- hyperparameters rounded to the dtype.
  beta_adjusted = c(np.float32(beta if T > 0 else 1.0))
  G_regularized = c(norm_coefficient) * X + G
  V_new = c(alpha) * V + beta_adjusted * G_regularized
  return X - c(R) * V_new, V_new


def _adagrad_in(dtype, R, T, X, G, H, decay_factor, epsilon, norm_coefficient):
  c = lambda v: np.asarray(v, dtype)  # noqa: E731
  r = np.float32(R) / (np.float32(1) + np.float32(T) * np.float32(decay_factor))  # In float32, once.
  G_regularized = c(norm_coefficient) * X + G
  H_new = H + G_regularized * G_regularized
  return X - c(r) * G_regularized / (np.sqrt(H_new) + c(epsilon)), H_new


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_bound_holds_for_an_independent_ieee_evaluation(dtype):
  rng = np.random.default_rng(0)
  n = 20000
  X, G, V = (rng.uniform(-2, 2, n).astype(dtype) for _ in range(3))
  H = rng.uniform(0.01, 1, n).astype(dtype)
  impl, ref = tolerance.implementation_context(dtype), tolerance.reference_context()
  hyper = dict(alpha=0.9, beta=0.8, norm_coefficient=0.01)
  got = _momentum_in(dtype, 0.05, 3, X, G, V, **hyper)
  want = reference.momentum(0.05, 3, X, G, V, mode="standard", **hyper)
  tols = [
    a + b
    for a, b in zip(
      tolerance.bounds("momentum", impl, 0.05, 3, X, G, [V], mode="standard", **hyper),
      tolerance.bounds("momentum", ref, 0.05, 3, X, G, [V], mode="standard", **hyper),
    )
  ]
  for g, w, t in zip(got, want, tols):
    assert (np.abs(g.astype(np.float64) - w) <= t).all()
  hyper = dict(decay_factor=0.1, epsilon=1e-3, norm_coefficient=0.01)
  got = _adagrad_in(dtype, 0.05, 7, X, G, H, **hyper)
  want = reference.adagrad(0.05, 7, X, G, H, **hyper)
  tols = [
    a + b
    for a, b in zip(
      tolerance.bounds("adagrad", impl, 0.05, 7, X, G, [H], **hyper),
      tolerance.bounds("adagrad", ref, 0.05, 7, X, G, [H], **hyper),
    )
  ]
  for g, w, t in zip(got, want, tols):
    ratio = np.abs(g.astype(np.float64) - w) / t
    assert ratio.max() <= 1
    assert ratio.max() > 0.05  # Not vacuous: the bound is of the size of the error.


def test_cancellation_is_bounded_by_the_operands():
  """X - R*V_new with R*V_new close to X: the bound is u|X|, not u|X - step|."""
  X, G, V = np.array([1.0]), np.array([0.0]), np.array([1.0 + 2**-20])
  e_x, _ = tolerance.bounds(
    "momentum",
    tolerance.implementation_context(np.float32),
    1.0,
    0,
    X,
    G,
    [V],
    alpha=1.0,
    beta=1.0,
    mode="standard",
    norm_coefficient=0.0,
  )
  x_new = 1.0 - (1.0 + 2**-20)
  assert e_x[0] > 0.5 * U32 * 1.0 > 100 * U32 * abs(x_new)


def test_bound_is_tight_for_exact_hyperparameters():
  """Exactly representable hyperparameters: a few roundings of the operands, no more."""
  X, G, V = np.array([1.5]), np.array([0.75]), np.array([-0.5])
  e_x, e_v = tolerance.bounds(
    "momentum",
    tolerance.implementation_context(np.float32),
    0.5,
    2,
    X,
    G,
    [V],
    alpha=0.5,
    beta=0.5,
    mode="standard",
    norm_coefficient=0.0,
  )
  # Every operation's rounding counted once, at its operands' size (|G| = 0.75 the largest).
  assert e_v[0] <= 3 * U32 * 0.75
  assert e_x[0] <= 3 * U32 * 1.5


def test_float32_beta_is_accounted_for():
  """beta = 0.999 in float32 moves 1 - beta**T by ~1000 u at small T; the bound knows it."""
  ctx = tolerance.implementation_context(np.float32).scalar
  b = ctx.one_minus_power(0.999, 1)
  actual = abs((1 - np.float64(np.float32(0.999))) - (1 - 0.999))
  assert actual <= b.e[()] <= actual + 20 * U32 * b.v[()]


def test_gpu_and_tpu_allow_approximate_division_and_subnormal_flushing():
  cpu = tolerance.implementation_context(np.float32, "cpu")
  gpu = tolerance.implementation_context(np.float32, "gpu")
  tpu = tolerance.implementation_context(np.float32, "tpu")
  assert cpu.k_div == 1 and gpu.k_div > 1
  assert tpu.tiny == cpu.tiny == np.finfo(np.float32).smallest_normal  # XLA:CPU flushes too (below).
  half = [tolerance.implementation_context(np.float16, p).tiny for p in ("cpu", "tpu")]
  assert half == [np.finfo(np.float16).smallest_subnormal / 2, np.finfo(np.float16).smallest_normal]
  assert tolerance.implementation_context(np.float64, "gpu").k_div == 1  # IEEE float64 on GPUs.


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_underflow_on_this_backend_is_within_tiny(dtype):
  """A product whose exact value is subnormal: what XLA computes is within ``tiny`` of it.

  XLA:CPU flushes float32 and float64 subnormal results to zero (and
  bfloat16, computed in float32); float16 is computed in float32 and keeps
  its subnormals. The model must charge whichever happens here.
  """
  import jax
  import jax.numpy as jnp

  from onnx_optax.conformance.cases import numpy_dtype

  dt = numpy_dtype(dtype)
  info = ml_dtypes.finfo(dt)
  a = np.asarray(np.sqrt(float(info.smallest_normal)) * 0.75, dt)  # a * a is 0.56 x the smallest normal.
  with jax.enable_x64(dtype == "float64"):
    got = float(jax.jit(lambda x: x * x)(jnp.asarray(a)))
  exact = float(a) ** 2
  c = tolerance.implementation_context(dt, jax.default_backend())
  assert abs(got - exact) <= c.u * exact + c.tiny


def test_received_hyperparameters_charge_only_the_arithmetic():
  """With the expectation computed from float32(beta), 1 - beta**T is charged a few u, not ~1000 u."""
  received = tolerance.implementation_context(np.float32, received_dtype=np.float32).scalar
  b = received.one_minus_power(0.999, 1)
  assert b.v[()] == 1 - float(np.float32(0.999))
  assert b.e[()] <= 12 * U32 * b.v[()]
  c = tolerance.implementation_context(np.float32, received_dtype=np.float32)
  assert c.const(0.9).v[()] == float(np.float32(0.9)) and c.const(0.9).e[()] == 0
  assert c.const(2.0**31 - 1, received=False).e[()] > 0  # float(T) is rounded by the rule: charged.
  # A float16 rule still rounds the float32 value it received: that rounding is charged.
  half = tolerance.implementation_context(np.float16, received_dtype=np.float32).const(0.9)
  assert half.e[()] == abs(float(np.float16(0.9)) - float(np.float32(0.9)))


def test_update_bound_has_no_cancellation_against_X():
  """U = -step is bounded by the step's own roundings, X_new by |X|'s."""
  X, G, V = np.array([1000.0]), np.array([0.75]), np.array([-0.5])
  hyper = dict(alpha=0.5, beta=0.5, mode="standard", norm_coefficient=0.0)
  impl = tolerance.implementation_context(np.float32, received_dtype=np.float32)
  e_x, _, e_u = tolerance.bounds("momentum", impl, 0.5, 2, X, G, [V], update=True, **hyper)
  # R * (alpha V + beta G): charged at its operands' size, 0.5 * (0.25 + 0.375), not at |X|.
  assert e_u[0] <= 4 * U32 * 0.5 * (0.25 + 0.375) and 500 * e_u[0] < e_x[0]
