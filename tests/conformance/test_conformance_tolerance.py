"""The tolerance model: it bounds IEEE evaluations, sees cancellation, and is tight."""

from __future__ import annotations

import dataclasses
import decimal

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from onnx_optax import reference
from onnx_optax.conformance import cases as grid_lib
from onnx_optax.conformance import devices, tolerance
from onnx_optax.conformance.arithmetic import DECIMAL
from onnx_optax.conformance.cases import RULES, TWINS, dtypes_of
from onnx_optax.conformance.models import ort as ort_model

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


def _model_and_expectation(case, context_of):
  """The model's tracked values of every output of ``case`` and the NumPy expectation's."""
  from onnx_optax.conformance import check
  from onnx_optax.conformance.cases import numpy_dtype

  X, G, state = case.inputs()
  received_in = grid_lib.received_dtype_of(case.rule, case.dtype, case.state_dtype)
  R, hyper = devices.received(case.learning_rate, case.hyper, received_in)
  want = check.expected(case.rule, R, case.T, X, G, state, hyper)
  want_u = check.expected_update(case.rule, R, case.T, X, G, state, hyper)
  state_dtype = case.state_dtype and numpy_dtype(case.state_dtype)
  context = context_of(case, numpy_dtype(case.dtype), state_dtype, received_in)
  for leaf, (x, g) in enumerate(zip(X, G)):
    s = [block[leaf] for block in state]
    got = tolerance.evaluate(case.base_rule, context, case.learning_rate, case.T, x, g, s, **case.hyper)
    yield [b.v for b in got], [*want[leaf], want_u[leaf]], np.abs(np.asarray(x, np.float64))


def _with_exact_scalars(case, dtype, state_dtype, received_in):
  """The implementation's context as the runner builds it, its per-update scalars read from the
  formulas the runner measures (:mod:`onnx_optax.conformance.scalars`) evaluated exactly, error 0:
  the values those formulas give are the spec's (a formula with ``1 + beta**T`` for ``1 -
  beta**T`` only widened the tolerance, and passed every other check)."""
  from onnx_optax.conformance import scalars

  measured = {name: tolerance.Bounded(float(v), 0.0) for name, v in scalars.exact_case(case).items()}
  return tolerance.implementation_context(dtype, "cpu", state_dtype, None, received_in, scalars=measured)


CONTEXTS = {
  "implementation": lambda case, d, s, r: tolerance.implementation_context(d, "cpu", s, None, r),
  "implementation, the measured scalars' formulas": _with_exact_scalars,
  "expectation": lambda case, d, s, r: tolerance.reference_context(received_dtype=r),
}


@pytest.mark.parametrize("context", sorted(CONTEXTS))
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_model_tracks_the_spec_values(rule, dtype, context):
  """The values the model propagates are the spec's outputs: its bounds follow the spec's formula.

  Every case of the conformance grid (without the 10^6-element ones): each
  output's tracked exact value (``Bounded.v``, float64 in the rule's order,
  ``1 - beta**T`` as ``-expm1(T log beta)`` in the implementation's context)
  agrees with :mod:`onnx_optax.reference` from the hyperparameters as
  received, and ``U``'s with the extended-precision ``X_new - X``. A bound
  propagated through a wrong operation, a wrong branch (``T = 0``,
  ``correct_bias``, ``weight_decay = 0``, ``norm_coefficient_post``) or a
  wrong constant moves a value: planted, ``1.0 -> 2.0`` for ORT's
  uncorrected bias (a mutation-run survivor) fails here by a factor of 2.
  """
  from onnx_optax.conformance.cases import cases

  # The grid's weight decays are 0, 0.01 and 5, its post decays 0, 0.02 and 0.25; the first
  # bias-corrected update (T = 1) and the largest count, whose float(T) rounds in float32.
  coefficients = ("weight_decay", "norm_coefficient_post")
  grid = _with_edges(cases(rule, dtype, large=False), coefficients, (1, 2**31 - 1))
  _assert_tracks(grid, CONTEXTS[context])


@pytest.mark.parametrize("context", sorted(CONTEXTS))
@pytest.mark.parametrize("rule,dtype", [(r, d) for r in TWINS for d in dtypes_of(r)])
def test_twin_model_tracks_the_framework_values(rule, dtype, context):
  """The twins' bounds follow their frameworks' formulas: every twin case (and each at ``T = 0``,
  1 and the int32 maximum), the model's tracked values agree with ``reference.pytorch_*`` and,
  for Keras's Adam, ``reference.directml_adam`` at ``T + 1``. Planted: the bound's
  ``bias_correction2`` at ``T`` instead of ``T + 1`` fails here. The coefficients the models
  branch on at 0 (``weight_decay``, ``lr_decay``, SGD's ``dampening``) are also run at 1, so
  that no branch keyed on a number hides (planted, Adagrad's ``lr_decay == 1`` for ``== 0`` and
  SGD's ``dampening == 1`` for ``== 0``, mutation-run survivors: fail)."""
  from onnx_optax.conformance.cases import cases

  coefficients = ("weight_decay", "lr_decay", "dampening")
  grid = _with_edges(cases(rule, dtype), coefficients, (0, 1, 2**31 - 1))
  _assert_tracks(grid, CONTEXTS[context])


def _with_edges(grid, coefficients, counts):
  """``grid``, then each case again with each of ``coefficients`` it has at 1 (in turn, so that
  the later ones are also taken with the earlier at 1), then each case at the default ``T = 5``
  at each of ``counts``. The models branch on these coefficients at 0: at 1 as well, no branch
  keyed on another number hides (a mutant's ``weight_decay == 1`` for ``== 0``)."""
  from onnx_optax.conformance.cases import replace

  for key in coefficients:
    grid = grid + [replace(c, hyper={**c.hyper, key: 1.0}) for c in grid if key in c.hyper]
  return grid + [replace(c, T=T) for c in grid if c.T == 5 for T in counts]


def _assert_tracks(grid, context):
  """Each case's tracked values (the model's) agree with its expectation's, within float64
  evaluations of one formula in two orders: a few ulp of the largest term, and |X| for X_new and
  U (X_new - X cancels)."""
  checked = 0
  for case in grid:
    for got, want, size_x in _model_and_expectation(case, context):
      assert len(got) == len(want), case.id
      for k, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w, np.float64)
        scale = np.abs(w) + (size_x if k in (0, len(got) - 1) else 0.0)
        assert np.all(np.abs(g - w) <= 1e-12 * scale + 1e-300), (case.id, k, np.max(np.abs(g - w)))
        checked += 1
  assert checked > 50


def test_approximate_division_allows_one_and_a_half_float32_ulp():
  """Off the CPU, ``k_div`` and ``k_sqrt`` allow 1.5 ulp of float32 (3 u32) on top of the
  rounding to ``d``: ``k u = u + 3 u32`` for every dtype but float64 (IEEE on GPUs). The scalar
  context computes in float32 there: its own ``k = 1 + 3 = 4``."""
  for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
    for platform in ("gpu", "tpu"):
      c = tolerance.implementation_context(dtype, platform)
      assert c.k_div * c.u == c.k_sqrt * c.u == pytest.approx(c.u + 3 * U32, rel=1e-15, abs=0)
      assert c.scalar.k_div == c.scalar.k_sqrt == 4
  assert tolerance.implementation_context(np.float32, "cpu").k_sqrt == 1


def test_contexts_are_immutable():
  """A context is a value: shared by every case of a run, it cannot be changed by one of them."""
  import dataclasses

  c = tolerance.implementation_context(np.float32)
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.u = 0.0


def test_float64_one_minus_power_is_one_pow_ulp_and_a_subtraction():
  """The expectation's ``1 - beta**T``: ``pow`` within one ulp (2u of the power), then one
  rounding of the subtraction, as the module docstring says; and the actual error is within it."""
  from fractions import Fraction

  ref = tolerance.reference_context()
  u = 2.0**-53
  for beta, T in ((0.9, 5), (0.999, 3), (0.5, 40)):
    b = ref.one_minus_power(beta, T)
    power = beta**T
    assert float(b.v[()]) == 1 - power
    pow_error = 2 * u * power
    want = pow_error + u * (abs(b.v[()]) + pow_error) + ref.tiny
    assert float(b.e[()]) == pytest.approx(want, rel=1e-12, abs=0)  # approx's default abs is 1e-12.
    actual = abs(Fraction(1.0 - power) - (1 - Fraction(beta) ** T))
    assert actual <= b.e[()]


def test_ort_adam_mode_0_without_bias_correction_is_refused():
  """ONNX Runtime refuses ``adam_mode=0, correct_bias=0`` (so does ``onnx_optax.ort_adamw``): the
  model has no bound for it rather than one for a rule nobody runs."""
  X = np.array([1.0])
  hyper = dict(alpha=0.9, beta=0.999, epsilon=1e-8, weight_decay=0.0, correct_bias=False)
  ref = tolerance.reference_context()
  with pytest.raises(ValueError, match="correct_bias"):
    tolerance.bounds("ort_adamw", ref, 0.1, 1, X, X, [X, X], adam_mode=0, **hyper)
  assert len(tolerance.bounds("ort_adamw", ref, 0.1, 1, X, X, [X, X], adam_mode=1, **hyper)) == 3


@pytest.mark.parametrize("beta, T", [(0.9, 1), (0.999, 7), (0.5, 3), (0.999, 10**6)])
def test_float32_one_minus_power_charges_what_the_docstring_says(beta, T):
  """The implementation's ``-expm1(T log beta)`` in float32, ``beta`` not pre-rounded: the
  rounding of ``beta`` to float32 exactly (``e0``), then ``K_TRANSCENDENTAL`` u for ``log`` and
  one u each for ``float(T)`` and the product, all amplified by ``expm1``'s condition number
  ``|x e^x / expm1(x)|``, and ``K_TRANSCENDENTAL`` u for ``expm1``."""
  s = tolerance.implementation_context(np.float32).scalar
  b = s.one_minus_power(beta, T)
  x, x_exact = T * np.log(float(np.float32(beta))), T * np.log(beta)
  v = -np.expm1(x_exact)  # 1 - beta**T
  e0 = abs(-np.expm1(x) - v)  # the rounding of beta to float32, through the power
  condition = abs(x * np.exp(x) / np.expm1(x))
  k = (tolerance.K_TRANSCENDENTAL + 2) * condition + tolerance.K_TRANSCENDENTAL
  want = e0 + k * U32 * (abs(v) + e0) + s.tiny
  assert float(b.v[()]) == pytest.approx(v, rel=1e-12, abs=0)
  assert float(b.e[()]) == pytest.approx(want, rel=1e-12, abs=0)


def test_transcendental_allowance_is_two_ulps():
  """``K_TRANSCENDENTAL``: two ulps (4 u) for each of XLA's float32 ``log`` and ``expm1``, as
  documented; XLA's ``log`` is measured within it here (its ``expm1`` is not: see
  docs/mutation.md, "A finding")."""
  import jax
  import jax.numpy as jnp

  assert tolerance.K_TRANSCENDENTAL == 4.0
  x = np.concatenate([np.linspace(1e-6, 1, 20001), np.linspace(1, 1e3, 20001)]).astype(np.float32)
  want = np.log(x.astype(np.float64))
  ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
  assert np.max(np.abs(np.asarray(jax.jit(jnp.log)(x), np.float64) - want) / ulp) <= 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_pinned_power_complement_bounds_the_frameworks_pow(dtype):
  """Keras's ``1 - beta ** (float(count) + 1)`` and PyTorch's float64 ``1 - beta ** step``, a
  ``pow`` then a subtraction, computed on this CPU (jitted, ``T`` a run-time value) lie within the
  pinned model's ``Context.power_complement`` of the exact value, from ``beta`` as received, where
  the subtraction cancels (``beta`` near 1) and where it does not, up to a ``T`` whose power
  underflows. Planted, the ``-expm1(T log beta)`` bound (``one_minus_power``) in its place: at
  ``beta = 0.999``, ``T = 2`` the device's error is 11 (float32) and 13 (float64) times that
  bound; fails."""
  c = tolerance.implementation_context(dtype, "cpu", received_dtype=dtype).scalar
  with jax.enable_x64(dtype == np.float64):
    complement = jax.jit(lambda b, T: 1 - jnp.power(b, T.astype(b.dtype) + 1))
    for beta in (0.9, 0.999, 1 - 2.0**-20, 0.5):
      b = dtype(beta)
      for T in (1, 2, 10, 1000, 10**5, 10**6):
        got = float(complement(jnp.asarray(b), jnp.asarray(T - 1, jnp.int32)))
        exact = 1 - DECIMAL.power(decimal.Decimal(float(b)), T)  # 45 digits.
        error = abs(decimal.Decimal(got) - exact)
        assert error <= decimal.Decimal(float(c.power_complement(beta, T).e)), (beta, T)


@pytest.mark.parametrize("value", [0.001, 0.5, 0.95, 3.0])
def test_a_host_scalar_charges_two_float64_roundings(value):
  """A scalar a framework computes in Python (``1 - beta2``, ``1 - lr * weight_decay``) carries the
  error of ``models._shared.host``'s docstring, two float64 roundings ``2 u64 |v|``, before its one
  rounding to the element-wise dtype (an expectation keeps the float64 number). Planted, ``2 u64 /
  |v|``, a thousand times too loose at 0.001, passed the twins' teeth: fails here."""
  from onnx_optax.conformance.models._shared import host

  got = host(tolerance.reference_context(), value)
  assert (got.v, got.e) == (value, 2 * 2.0**-53 * value)
  # In float32: that error, then one rounding (u = 2**-24) of the value.
  impl = host(tolerance.implementation_context(np.float32), value)
  assert float(impl.e) == pytest.approx(2 * 2.0**-53 * value + 2.0**-24 * value, rel=1e-9, abs=0)


def test_a_decay_that_rounds_to_one_in_float32_has_a_finite_bound():
  """``beta = 1 - 2**-30`` is 1.0 in float32: ``T log(beta)`` is 0 there, where ``expm1``'s
  condition number is its limit 1 (not ``0 / 0``); the computed ``1 - beta**T`` is 0, off by
  the exact value, which the bound charges."""
  beta = 1 - 2.0**-30
  s = tolerance.implementation_context(np.float32).scalar
  b = s.one_minus_power(beta, 3)
  v = float(b.v[()])  # 1 - beta**3, computed 0: e0 = v, condition 1, k = 2 K + 2
  want = v + (2 * tolerance.K_TRANSCENDENTAL + 2) * U32 * (v + v) + s.tiny
  assert v == pytest.approx(1 - beta**3, rel=1e-9, abs=0)
  assert float(b.e[()]) == pytest.approx(want, rel=1e-12, abs=0)


def _close(got, want):
  return float(np.asarray(got)[()]) == pytest.approx(want, rel=1e-14, abs=0)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_each_operation_charges_the_docstrings_line(platform):
  """The module docstring's table, operation by operation, on operands with known errors:
  propagated errors, then ``k u (|v| + e) + tiny`` (``k_div`` for ``/``, ``k_sqrt`` for the root)."""
  c = tolerance.implementation_context(np.float32, platform)
  u, tiny, B = c.u, c.tiny, tolerance.Bounded
  a, b = B(3.0, 1e-6), B(-2.0, 2e-6)

  def rounded(v, e, k=1.0):
    return e + k * u * (abs(v) + e) + tiny

  assert _close(c.add(a, b).v, 1.0) and _close(c.add(a, b).e, rounded(1.0, 3e-6))
  assert _close(c.sub(a, b).v, 5.0) and _close(c.sub(a, b).e, rounded(5.0, 3e-6))
  assert _close(c.mul(a, b).e, rounded(6.0, 3 * 2e-6 + 2 * 1e-6 + 1e-6 * 2e-6))
  e_div = (2 * 1e-6 + 3 * 2e-6) / (2 * (2 - 2e-6))
  assert _close(c.div(a, b).v, -1.5) and _close(c.div(a, b).e, rounded(1.5, e_div, c.k_div))
  assert np.isinf(c.div(a, B(-2.0, 2.0)).e[()])  # The divisor's error reaches its value,
  assert np.isinf(c.div(B(0.0), B(-2.0, 2.0)).e[()])  # even for an exact 0 (not 0 / 0, not 0).
  assert _close(c.div(B(1.0), b).e, rounded(0.5, 2e-6 / (2 * (2 - 2e-6)), c.k_div))  # b's error;
  assert _close(c.div(B(0.0), b).e, tiny)  # exact 0 / b is exact: only the underflow;
  assert _close(c.div(B(0.0, 1.0), b).e, rounded(0.0, 2 * 1.0 / (2 * (2 - 2e-6)), c.k_div))  # not 0 +- e.
  # A division by a per-update scalar: the reciprocal in the scalar context, rounded to d, and a
  # product; an expectation divides.
  sc, s_b = c.scalar, B(-2.0, 2e-9)
  e_quotient = 2e-9 / (2 * (2 - 2e-9))  # 1 / s_b: (|1| e_b) / (|b| (|b| - e_b))
  e_reciprocal = e_quotient + sc.k_div * sc.u * (0.5 + e_quotient) + sc.tiny  # in the scalar dtype
  e_r = rounded(0.5, e_reciprocal)  # rounded once to d
  assert _close(c.div_by_scalar(a, s_b).e, rounded(1.5, 3 * e_r + 0.5 * 1e-6 + 1e-6 * e_r))
  ref = tolerance.reference_context()
  assert _close(ref.div_by_scalar(a, s_b).e, ref.div(a, s_b).e[()])
  assert _close(c.sqrt(B(4.0, 1e-6)).e, rounded(2.0, 1e-6 / 2, c.k_sqrt))
  assert _close(c.sqrt(B(0.0, 1e-6)).e, rounded(0.0, 1e-3, c.k_sqrt))  # sqrt(e) where the root is 0,
  assert _close(c.sqrt(B(0.0)).e, tiny)  # and 0 for an exact 0 (not 0 / 0).
  for beta in (0.0, 1.0):  # log and expm1 are exact at beta = 0 and 1 (-inf -> -1, 0 -> 0).
    assert float(c.scalar.one_minus_power(beta, 5).e[()]) == 0.0
  s = c.scalar
  assert _close(c.to_elementwise(B(0.1, 1e-9)).e, rounded(0.1, 1e-9))
  one_minus = c.one_minus(0.9)  # 1 - float32(0.9) in float32 (exact, Sterbenz), rounded to float32.
  e_beta = abs(float(np.float32(0.9)) - 0.9)
  inner = e_beta + s.u * (abs(1 - 0.9) + e_beta) + s.tiny
  assert _close(one_minus.v, 1 - 0.9) and _close(one_minus.e, rounded(1 - 0.9, inner))
  assert _close(c.const(0.1).e, abs(float(np.float32(0.1)) - 0.1))


def test_narrow_parameters_and_state_are_rounded_where_the_docstring_says():
  """float16 parameters with float32 state: ``U`` rounded to float16 and added there; bfloat16
  state with float32 parameters: the new state rounded to bfloat16; nothing else rounds twice."""
  B = tolerance.Bounded
  wide = tolerance.implementation_context(np.float16, state_dtype=np.float32)
  half = tolerance.implementation_context(np.float16)
  X, U = B(1.0), B(-0.25, 1e-7)
  assert wide.u == 2.0**-24 and wide.param.u == half.u and wide.state is None
  assert _close(wide.update(U).e, 1e-7 + half.u * (0.25 + 1e-7) + half.tiny)
  assert _close(wide.apply(X, U).e, (lambda e: e + half.u * (0.75 + e) + half.tiny)(wide.update(U).e[()]))
  assert _close(wide.finish(X, B(0.25, 1e-7)).e, wide.apply(X, U).e[()])
  assert _close(wide.store(U).e, 1e-7)
  narrow = tolerance.implementation_context(np.float32, state_dtype=ml_dtypes.bfloat16)
  assert narrow.param is None and _close(narrow.update(U).e, 1e-7)
  assert _close(narrow.store(U).e, 1e-7 + 2.0**-8 * (0.25 + 1e-7) + narrow.state.tiny)
  # An expectation's U is X_new - X (one more rounding); an implementation's is -step, unrounded.
  ref, impl = tolerance.reference_context(), tolerance.implementation_context(np.float32)
  step = B(0.25, 1e-7)
  assert _close(impl.update_of(X, B(0.75, 2e-7), step).e, 1e-7)
  assert _close(ref.update_of(X, B(0.75, 2e-7), step).e, 2e-7 + ref.u * (0.25 + 2e-7) + ref.tiny)


def test_reference_contexts_are_ieee_in_their_dtype():
  """The expectation's arithmetic: ``u = 2**-53`` (float64) or ``2**-64`` (x87's 64-bit
  significand), gradual underflow within half a subnormal, no approximate ops."""
  from onnx_optax.conformance.check import EXTENDED

  for dtype in (np.float64, EXTENDED):
    info = np.finfo(dtype)
    ref = tolerance.reference_context(dtype)
    assert ref.u == 2.0 ** -(info.nmant + 1) and ref.k_div == ref.k_sqrt == 1
    # Half a subnormal, held as the least positive float64 (half of that is 0 in float64).
    assert float(info.smallest_subnormal) / 2 <= ref.tiny == 5e-324
    assert ref.scalar.u == ref.u and ref.scalar.tiny == ref.tiny


def test_ort_corrections_are_the_scalar_one_minus_power_in_the_implementation():
  """ONNX Runtime AdamW's ``1 - beta^step``: the implementation computes it as every rule's
  scalar (``-expm1``, in the scalar context), the expectation as a float64 ``pow`` (one ulp)
  subtracted in its own dtype (x87's too: ``reference.ort_adamw`` forms the power in float64)."""
  from onnx_optax.conformance.check import EXTENDED

  impl = tolerance.implementation_context(np.float32, received_dtype=np.float32)
  got, want = ort_model._ort_correction(impl, 0.999, 3), impl.scalar.one_minus_power(0.999, 3)
  assert float(got.e[()]) == float(want.e[()]) and float(got.v[()]) == float(want.v[()])
  ext = tolerance.reference_context(EXTENDED)
  power = 0.999**3
  got = ort_model._ort_correction(ext, 0.999, 3)
  pow_error = 2 * 2.0**-53 * power
  want_e = pow_error + ext.u * (abs(1 - power) + pow_error) + ext.tiny
  assert float(got.e[()]) == pytest.approx(want_e, rel=1e-12, abs=0)


def test_the_evaluators_one_minus_is_rounded_to_float32_exactly():
  """ONNX's evaluator computes ``1 - alpha`` from a float32 attribute in float32: the bound is
  that rounding's actual size (0 where Sterbenz' lemma makes it exact); the reference's own
  ``1 - alpha`` in float64 is charged one float64 rounding."""
  ev, ref = tolerance.evaluator_context(), tolerance.reference_context()
  for alpha in (0.9, 0.999, 0.3):
    v = 1.0 - alpha
    assert float(ev.one_minus(alpha).e[()]) == abs(float(np.float32(v)) - v)
    assert float(ev.one_minus(alpha).v[()]) == v
    assert float(ref.one_minus(alpha).e[()]) == pytest.approx(ref.u * abs(v) + ref.tiny, rel=1e-12, abs=0)
  assert float(ev.one_minus(0.75).e[()]) == 0.0  # 0.25: exact in float32


def test_onnx_adam_post_decay_adds_u_to_x():
  """ONNX Adam with ``norm_coefficient_post``: the implementation returns ``U = X_final - X`` and
  adds it back (``X + U``, one more rounding), so its ``X_new`` bound exceeds ``U``'s; an
  expectation computes ``X_new`` first and ``U`` from it, the other way round."""
  X, G, V, H = (np.array([v]) for v in (1.0, 0.5, 0.25, 0.125))
  hyper = dict(alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.02)
  impl = tolerance.implementation_context(np.float32)
  X_new, _, _, U = tolerance.evaluate("adam", impl, 0.1, 3, X, G, [V, H], **hyper)
  assert X_new.e[0] >= U.e[0] + impl.u * abs(X_new.v[0])
  X_new, _, _, U = tolerance.evaluate("adam", tolerance.reference_context(), 0.1, 3, X, G, [V, H], **hyper)
  assert U.e[0] >= X_new.e[0]


def test_the_update_count_is_not_a_received_hyperparameter():
  """``T`` is an integer the rule converts itself: the model's exact value is ``T``, not ``T``
  rounded to the received float32 (2**31 - 1 would be 2**31), and its conversion is charged."""
  c = tolerance.implementation_context(np.float32, received_dtype=np.float32)
  X, G, H, T = np.array([0.0]), np.array([1.0]), np.array([0.0]), 2**31 - 1
  hyper = dict(decay_factor=0.5, epsilon=0.0, norm_coefficient=0.0)
  U = tolerance.evaluate("adagrad", c, 0.5, T, X, G, [H], **hyper)[-1]
  r = float(np.float32(0.5)) / (1 + T * float(np.float32(0.5)))
  assert float(U.v[0]) == pytest.approx(-r, rel=1e-13, abs=0)


@pytest.mark.parametrize(
  "rule", ["adam", "momentum_nesterov", "ort_adamw_mode1", "pytorch_adam", "keras_adam"]
)
def test_bounds_in_chunks_are_the_whole_arrays_bounds(rule, monkeypatch):
  """``check.tolerances`` bounds a large case ``CHUNK`` elements at a time: every bound the same, to
  the bit, as one evaluation of the whole arrays (three leaves of 3,000 elements; chunks of 1,000,
  and of 7, which divides neither a leaf nor the whole). A chunk that took another chunk's gradient
  or state, or lost the tail, fails here (planted: the first chunk's gradient in every chunk, the
  last chunk dropped)."""
  from onnx_optax.conformance import check

  case = next(c for c in grid_lib.cases(rule, "float32", large=False) if c.gradient == "normal")
  case = dataclasses.replace(case, shapes=((3000,), (20, 150), (3000,)))
  X, G, state = case.inputs()

  def bounds():
    return check.tolerances(
      case.rule, case.dtype, "cpu", case.learning_rate, case.T, X, G, state, case.hyper, case.state_dtype
    )

  monkeypatch.setattr(check, "CHUNK", 10**9)
  whole = bounds()
  for chunk in (1000, 7):
    monkeypatch.setattr(check, "CHUNK", chunk)
    for leaf, leaf_whole in zip(bounds(), whole, strict=True):
      for got, want in zip(leaf, leaf_whole, strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
