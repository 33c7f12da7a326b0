"""Numerics and limits (issue 8): non-finite values, the count at its maximum,
long runs, float16 and bfloat16. See docs/numerics.md for the figures.

Expected values come from the NumPy reference (:mod:`onnx_optax.reference`)
or from IEEE arithmetic written out in the test (float16's largest finite
value 65504, its rounding of 1e-8 to 0), never from the transforms' output.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from rule_configs import as_float32_sees as _f32
from rule_configs import first_count as _first_count

import onnx_optax
from onnx_optax import reference
from onnx_optax.conformance import tolerance

INT32_MAX = int(np.iinfo(np.int32).max)
U32 = 2.0**-24  # float32 unit roundoff

# name -> (reference rule, constructor, hyperparameters, learning rate)
CONFIGS = {
  "momentum_standard": (
    "momentum",
    onnx_optax.momentum,
    dict(alpha=0.9, beta=0.9, mode="standard", norm_coefficient=1e-3),
    1e-3,
  ),
  "momentum_nesterov": (
    "momentum",
    onnx_optax.momentum,
    dict(alpha=0.9, beta=0.9, mode="nesterov", norm_coefficient=1e-3),
    1e-3,
  ),
  "adagrad": (
    "adagrad",
    onnx_optax.adagrad,
    dict(decay_factor=1e-4, epsilon=1e-6, norm_coefficient=1e-3),
    1e-2,
  ),
  "adam": (
    "adam",
    onnx_optax.adam,
    dict(alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=1e-3, norm_coefficient_post=1e-5),
    1e-3,
  ),
  "directml_adam": (
    "directml_adam",
    onnx_optax.directml_adam,
    dict(beta1=0.9, beta2=0.999, epsilon=1e-8),
    1e-3,
  ),
}
NAMES = sorted(CONFIGS)


def _reference_step(rule, T, X, G, state, hyper, lr, seen=_f32):
  """One float64 reference step; ``seen``: the hyperparameters as the transform sees them."""
  step, _ = reference.RULES[rule]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # inf - inf, 0/0: the point of some tests
    X_new, *S = step(
      seen(lr),
      T,
      np.asarray(X, np.float64),
      np.asarray(G, np.float64),
      *(np.asarray(s, np.float64) for s in state),
      **{k: seen(v) for k, v in hyper.items()},
    )
  return X_new, S


# ----------------------------------------------------------------------------
# Non-finite gradients


# What one update does to an element whose gradient is NaN or +Inf (from a
# zero state, X = 1): the spec propagates it, and so does every rule.
# (x_new, state...) per rule: NaN in, NaN everywhere; +Inf in: Momentum moves
# X to -Inf with an infinite V, the adaptive rules compute Inf/Inf = NaN.
NON_FINITE = {
  ("momentum", "nan"): ("nan", "nan"),
  ("momentum", "inf"): ("-inf", "inf"),
  ("adagrad", "nan"): ("nan", "nan"),
  ("adagrad", "inf"): ("nan", "inf"),
  ("adam", "nan"): ("nan", "nan", "nan"),
  ("adam", "inf"): ("nan", "inf", "inf"),
  ("directml_adam", "nan"): ("nan", "nan", "nan"),
  ("directml_adam", "inf"): ("nan", "inf", "inf"),
}


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("config", NAMES)
def test_non_finite_gradient_propagates_as_the_spec_says(config, bad):
  rule, make, hyper, lr = CONFIGS[config]
  opt = make(lr, **hyper)
  X = jnp.ones(3)
  G = jnp.array([0.5, float(bad), -0.5])
  state = opt.init(X)
  updates, state = opt.update(G, state, X)
  x_new = np.asarray(optax.apply_updates(X, updates))
  got = [x_new, *(np.asarray(s) for s in state[1:])]
  want_x, want_s = _reference_step(
    rule, _first_count(rule), X, G, [np.zeros(3)] * (len(state) - 1), hyper, lr
  )
  table = NON_FINITE[(rule, bad)]
  for g, w, expected in zip(got, [want_x, *want_s], table):
    assert str(g[1]) == expected and str(w[1]) == expected, (g, w, expected)
    # The other elements are untouched by the bad one: updates are element-wise.
    np.testing.assert_allclose(g[[0, 2]], w[[0, 2]], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("config", NAMES)
def test_apply_if_finite_leaves_params_and_state_untouched(config, bad):
  rule, make, hyper, lr = CONFIGS[config]
  opt = optax.apply_if_finite(make(lr, **hyper), max_consecutive_errors=3)
  params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.ones(3)}
  state = opt.init(params)
  step = jax.jit(opt.update)
  good = {"w": jnp.full((2, 3), 0.25), "b": jnp.array([1.0, -2.0, 0.5])}
  for _ in range(2):  # a state that is not the initial one
    updates, state = step(good, state, params)
    params = optax.apply_updates(params, updates)
  bad_grads = {"w": good["w"].at[1, 2].set(bad), "b": good["b"]}
  updates, new_state = step(bad_grads, state, params)
  new_params = optax.apply_updates(params, updates)
  for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(new_state.inner_state), jax.tree.leaves(state.inner_state)):
    np.testing.assert_array_equal(a, b)  # the count included: a skipped step does not count
  assert int(new_state.notfinite_count) == 1
  # The next good step is the step the skipped one would have been.
  after, _ = step(good, new_state, params)
  direct, _ = step(good, state, params)
  for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(direct)):
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------
# The count at its maximum


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("config", NAMES)
def test_count_at_int32_max_is_finite_right_and_does_not_wrap(config, dtype):
  """Four updates from T = int32 max - 1: T saturates, every update is the spec's.

  Each update is compared with one float64 reference step from the dtype's
  own parameters and state, within the conformance suite's per-element bound
  (``conformance.tolerance``: the rounding of every operation in ``dtype``,
  the hyperparameters' rounding to it, and the reference's own), which is a
  small fraction of the update: a zero or doubled update fails (checked).
  """
  rule, make, hyper, _ = CONFIGS[config]
  # Decay rates that every dtype here can hold below 1 (see the bfloat16 test),
  # and updates that bfloat16 resolves next to |X| = 2 (ONNX Adam's X_final
  # adds two roundings relative to X): a learning rate of 1 and a
  # decay_factor that leaves Adagrad's r = R / (1 + T d) at R / 3.
  hyper = {**hyper, **{k: 0.75 for k in ("beta", "beta2") if k in hyper}}
  hyper = {**hyper, **({"decay_factor": 1e-9} if "decay_factor" in hyper else {})}
  lr = 1.0
  opt = make(lr, **hyper, initial_count=INT32_MAX - 1)
  X = jnp.array([1.0, -2.0, 0.5], dtype)
  G = jnp.array([0.5, 0.25, -1.0], dtype)
  state = opt.init(X)
  S = [np.zeros(3)] * (len(state) - 1)
  x = X
  step = jax.jit(opt.update)
  implementation = tolerance.implementation_context(np.dtype(dtype), jax.devices()[0].platform)
  ref = tolerance.reference_context()
  for k in range(4):
    T = min(INT32_MAX - 1 + k, INT32_MAX)
    assert int(state.count) == T
    updates, state = step(G, state, x)
    assert np.all(np.isfinite(np.asarray(updates, np.float32)))
    X64, G64 = np.asarray(x, np.float64), np.asarray(G, np.float64)
    # The hyperparameters as passed: their rounding to `dtype` is in the bound.
    want, S_want = _reference_step(rule, T, X64, G64, S, hyper, lr, seen=lambda v: v)
    tol = [
      a + b
      for a, b in zip(
        tolerance.bounds(rule, implementation, lr, T, X64, G64, S, **hyper),
        tolerance.bounds(rule, ref, lr, T, X64, G64, S, **hyper),
      )
    ]
    assert all(np.all(np.isfinite(t)) for t in tol)
    step_size = np.abs(want - X64)
    assert np.all(tol[0] < 0.5 * step_size), (tol[0], step_size)  # the check has teeth
    x = optax.apply_updates(x, updates)
    np.testing.assert_array_less(np.abs(np.asarray(x, np.float64) - want), tol[0] + 1e-300)
    S_new = [np.asarray(s, np.float64) for s in state[1:]]
    for got, w, t in zip(S_new, S_want, tol[1:]):
      np.testing.assert_array_less(np.abs(got - w), t + 1e-300)
    S = S_new  # follow the dtype's own state
  assert int(state.count) == INT32_MAX and state.count.dtype == jnp.int32


# ----------------------------------------------------------------------------
# Long runs

N_LONG = 100_000


def _long_run(config, **override):
  """100,000 float32 steps under lax.scan and the float64 reference."""
  rule, make, hyper, lr = CONFIGS[config]
  hyper = {**hyper, **override}
  rng = np.random.default_rng(0)
  n = 8
  # Gradients with a non-zero mean and log-normal step-to-step magnitudes.
  G = (rng.normal(size=(N_LONG, n)) * np.exp(rng.normal(size=(N_LONG, 1)))).astype(np.float32)
  G += np.float32(0.1)
  X0 = rng.normal(size=n).astype(np.float32)
  opt = make(lr, **hyper)

  @jax.jit
  def run(x, gs):
    def step(carry, g):
      x, s = carry
      u, s = opt.update(g, s, x)
      return (x + u, s), None

    return jax.lax.scan(step, (x, opt.init(x)), gs)[0][0]

  x32 = np.asarray(run(jnp.asarray(X0), jnp.asarray(G)), np.float64)
  step, n_state = reference.RULES[rule]
  seen = {k: _f32(v) for k, v in hyper.items()}
  R, T0 = _f32(lr), _first_count(rule)
  X, S, G64 = X0.astype(np.float64), [np.zeros(n)] * n_state, G.astype(np.float64)
  for k in range(N_LONG):
    X, *S = step(R, T0 + k, X, G64[k], *S, **seen)
  return x32, X


@pytest.mark.parametrize("config", NAMES)
def test_100k_float32_steps_stay_near_the_float64_reference(config):
  """The distance after 100,000 steps, against a bound from the error model.

  Per step each element is rounded a few times, each rounding unbiased and
  relative to the largest magnitude around (``max|x|``): the errors add up
  like a random walk, ``~ sqrt(N) * u * max|x|``. The bound allows four
  times that. Measured (docs/numerics.md): 72 to 128 ``u * max|x|``, the
  bound is 1265.

  ONNX Adam's ``norm_coefficient_post = 1e-5`` adds a systematic term: the
  factor ``1 - 1e-5`` rounds to float32 (``0.99998999``), a decay rate
  0.136% too large, applied at every step: ``N * |fl(1 - c) - (1 - c)| *
  max|x|``. Measured 2.2e-3, this term alone 4.1e-3.
  """
  rule, make, hyper, lr = CONFIGS[config]
  x32, x64 = _long_run(config)
  scale = float(np.abs(x64).max())
  bound = 4 * math.sqrt(N_LONG) * U32 * scale
  c = _f32(hyper.get("norm_coefficient_post", 0.0))
  if c:
    bound += N_LONG * abs(float(np.float32(1) - np.float32(c)) - (1 - c)) * scale
  err = float(np.abs(x32 - x64).max())
  assert err <= bound, (err, bound, err / (U32 * scale))
  assert np.all(np.isfinite(x32))


# ----------------------------------------------------------------------------
# float16 and bfloat16


def _adagrad_h(g, steps, dtype, state_dtype=None):
  opt = onnx_optax.adagrad(0.1, state_dtype=state_dtype)
  x = jnp.ones(1, dtype)

  def step(s, _):
    u, s = opt.update(jnp.full(1, g, dtype), s)
    return s, (s.h[0], u[0])

  _, (h, u) = jax.lax.scan(step, opt.init(x), None, length=steps)
  return np.asarray(h, np.float64), np.asarray(u, np.float64)


@pytest.mark.parametrize("g,first_inf", [(8.0, 1024), (16.0, 256), (64.0, 16), (256.0, 1)])
def test_float16_adagrad_accumulator_overflows(g, first_inf):
  """H = n * G^2 passes float16's largest finite value, 65504, and rounds to Inf.

  Exactly representable sums here: H is exact until it overflows at the
  first n with n * G^2 >= 65520 (65504 plus half its spacing of 32). From
  then on every update is -0.0: the parameters silently stop moving.
  """
  assert first_inf == math.ceil(65520 / g**2)
  h, u = _adagrad_h(g, first_inf + 5, jnp.float16)
  np.testing.assert_array_equal(h[: first_inf - 1], g**2 * np.arange(1, first_inf))
  assert np.all(np.isinf(h[first_inf - 1 :]))
  assert np.all(u[first_inf - 1 :] == 0)
  # The documented fix: the state in float32 (compute in float32, H exact here).
  h32, u32 = _adagrad_h(g, first_inf + 5, jnp.float16, state_dtype=jnp.float32)
  n = np.arange(1, first_inf + 6)
  np.testing.assert_array_equal(h32, g**2 * n)
  # Reference: X_new - X = -r * G / (sqrt(n G^2) + eps), rounded to float16.
  want = -0.1 * g / (np.sqrt(g**2 * n) + 1e-6)
  np.testing.assert_allclose(u32, want, rtol=2.0**-11)


@pytest.mark.parametrize(
  "dtype,g,stall", [(jnp.float16, 1.0, 2048.0), (jnp.float16, 0.5, 512.0), (jnp.bfloat16, 1.0, 256.0)]
)
def test_low_precision_adagrad_accumulator_stalls(dtype, g, stall):
  """Below the overflow, H stops growing once G^2 is half its spacing or less.

  With p significant bits that is at ``H = 2^p * G^2`` (ties to even keep
  it there): float16 (p = 11) at 2048 G^2, bfloat16 (p = 8) at 256 G^2. The
  effective learning rate then stops decaying. float32 state keeps growing.
  """
  steps = int(stall / g**2) + 50
  h, _ = _adagrad_h(g, steps, dtype)
  assert h[-1] == stall and h[-50] == stall
  h32, _ = _adagrad_h(g, steps, dtype, state_dtype=jnp.float32)
  assert h32[-1] == g**2 * steps


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_float16_epsilon_1e8_is_zero(dtype):
  """DirectML's default epsilon, 1e-8, is 0 in onnx_optax's float16 arithmetic.

  1e-8 is below half of float16's smallest subnormal (2**-25), and the rule
  adds epsilon in the parameters' dtype: a float16 update with the default
  epsilon is the epsilon = 0 update to the bit, and a zero gradient from a
  zero state gives 0 / (0 + 0) = NaN. bfloat16 has float32's exponent range
  and keeps 1e-8: the same zero gradient gives a zero update, where epsilon =
  0 gives NaN.
  """
  assert 1e-8 < 2.0**-25  # the IEEE fact the float16 behaviour rests on
  x = jnp.ones(4, dtype)
  g = jnp.array([0.0, 0.1, -2.0, 0.5], dtype)

  def update(**kw):
    # beta2 = 0.75: bfloat16 rounds the default 0.999 to 1 (rejected at init).
    opt = onnx_optax.directml_adam(1e-3, beta2=0.75, **kw)
    return np.asarray(opt.update(g, opt.init(x))[0], np.float64)

  default, zero = update(), update(epsilon=0.0)
  assert np.isnan(zero[0]) and np.all(np.isfinite(zero[1:]))
  if dtype == jnp.float16:
    np.testing.assert_array_equal(default, zero)  # NaN where zero has NaN
  else:
    assert default[0] == 0
    np.testing.assert_array_equal(default[1:], zero[1:])  # 1e-8 is below bfloat16's resolution there


# One step from a zero state with lr = 1e-3, decays 0.9 / 0.999, epsilon 1e-8:
# DirectML (T = 1): -lr * Alpha * 0.1 G / (sqrt(1e-3 G^2) + eps), Alpha = sqrt(1e-3) / 0.1;
# ONNX Adam (T = 0, no bias correction): -lr * 0.1 G / (sqrt(1e-3 G^2) + eps).
EPSILON_CASES = {
  "directml_adam": (
    lambda **kw: onnx_optax.directml_adam(1e-3, **kw),
    lambda G: -1e-3 * (math.sqrt(1e-3) / 0.1) * 0.1 * G / (np.sqrt(1e-3 * G**2) + 1e-8),
  ),
  "adam_eps1e-8": (
    lambda **kw: onnx_optax.adam(1e-3, epsilon=1e-8, **kw),
    lambda G: -1e-3 * 0.1 * G / (np.sqrt(1e-3 * G**2) + 1e-8),
  ),
}


@pytest.mark.parametrize("case", sorted(EPSILON_CASES))
def test_float16_adam_epsilon_underflow(case):
  """epsilon = 1e-8 is 0 in float16, and so is (1 - beta) * G^2 for small G.

  A zero gradient gives 0/0 = NaN. A small non-zero one (|G| <~ 5.5e-3,
  where 1e-3 * G^2 underflows) gives M / 0 = -Inf, or NaN once the numerator
  underflows too. Keeping the state in float32 computes in float32, where
  1e-8 exists and the moments do not underflow: the update is the reference's.
  """
  make, expected = EPSILON_CASES[case]
  x = jnp.ones(4, jnp.float16)
  g = jnp.array([0.0, 1e-5, 1e-3, 0.1], jnp.float16)
  opt = make()
  u, _ = opt.update(g, opt.init(x))
  u = np.asarray(u, np.float64)
  assert np.isnan(u[0]) and np.isnan(u[1]) and u[2] == -np.inf and np.isfinite(u[3])
  opt = make(state_dtype=jnp.float32)
  u, _ = opt.update(g, opt.init(x))
  # Computed in float32, rounded once to float16 (relative 2**-11).
  np.testing.assert_allclose(np.asarray(u, np.float64), expected(np.asarray(g, np.float64)), rtol=2.0**-10)


def test_float16_adam_larger_epsilon_avoids_nan():
  """The other fix, if the state must stay float16: an epsilon float16 can hold."""
  opt = onnx_optax.directml_adam(1e-3, epsilon=1e-4)
  x = jnp.ones(3, jnp.float16)
  u, _ = opt.update(jnp.array([0.0, 1e-3, 0.1], jnp.float16), opt.init(x))
  assert np.all(np.isfinite(np.asarray(u, np.float32)))
  assert float(u[0]) == 0


@pytest.mark.parametrize(
  "make,argument",
  [
    (lambda **kw: onnx_optax.adam(1e-3, **kw), "beta"),
    (lambda **kw: onnx_optax.directml_adam(1e-3, **kw), "beta2"),
    (
      lambda **kw: onnx_optax.momentum(
        1e-3, alpha=0.999, beta=1.0, mode="standard", norm_coefficient=0.0, **kw
      ),
      "alpha",
    ),
  ],
)
def test_bfloat16_decay_rate_that_rounds_to_one_is_rejected(make, argument):
  """0.999 is 1.0 in bfloat16: the moment would never decay (a running sum).

  init raises, naming the rate and the leaf; float32 state is the fix.
  """
  assert float(jnp.bfloat16(0.999)) == 1.0
  params = {"w": jnp.ones(2, jnp.bfloat16)}
  with pytest.raises(ValueError, match=rf"(?s){argument}=0.999.*bfloat16.*params\['w'\].*state_dtype"):
    make().init(params)
  make(state_dtype=jnp.float32).init(params)
  make().init({"w": jnp.ones(2, jnp.float16)})  # float16 holds 0.999 (0.99902)


if __name__ == "__main__":
  # The figures of docs/numerics.md: PYTHONPATH=. python tests/test_numerics.py
  for name, override in [(n, {}) for n in NAMES] + [("adam", {"norm_coefficient_post": 0.0})]:
    x32, x64 = _long_run(name, **override)
    scale = float(np.abs(x64).max())
    err = float(np.abs(x32 - x64).max())
    print(
      f"{name:18s} {override or ''} N={N_LONG} max|x32 - x64| = {err:.3e}  max|x64| = {scale:.3e}  "
      f"= {err / (U32 * scale):7.1f} u*max|x|  (bound {4 * math.sqrt(N_LONG):.0f}, "
      "plus the norm_coefficient_post term for adam)"
    )
  for g in (1.0, 4.0, 8.0, 16.0):
    h, u = _adagrad_h(g, 70_000, jnp.float16)
    inf = np.flatnonzero(np.isinf(h))
    stall = np.flatnonzero(np.diff(h) == 0)
    print(
      f"float16 adagrad |G|={g}: H inf from update {inf[0] + 1 if inf.size else None}, "
      f"stops growing at H={h[stall[0]] if stall.size else None}"
    )
  x = jnp.ones(8, jnp.float16)
  g16 = jnp.array([0.0, 1e-5, 1e-3, 5e-3, 5.4e-3, 5.6e-3, 1e-2, 0.1], jnp.float16)
  for label, kw in [("float16 state", {}), ("float32 state", {"state_dtype": jnp.float32})]:
    makers: list[tuple[str, Callable[..., Any]]] = [
      ("directml_adam", onnx_optax.directml_adam),
      ("adam eps=1e-6", lambda lr, **k: onnx_optax.adam(lr, epsilon=1e-6, **k)),
    ]
    for name, make in makers:
      opt = make(1e-3, **kw)
      u, _ = opt.update(g16, opt.init(x))
      print(
        f"float16 {name:14s} {label}: G={np.asarray(g16, np.float32).tolist()} -> "
        f"update={np.asarray(u, np.float32).tolist()}"
      )
