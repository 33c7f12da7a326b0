"""The suite has teeth: deliberately wrong variants of each rule are caught.

Each rule mutant is a copy of one part of a rule of :mod:`onnx_optax.rules`
(the per-update ``scalars`` or the per-leaf ``elementwise``, whichever holds
the mistake) with one plausible mistake. It replaces that part on the
registry's :class:`~onnx_optax.registry.Rule` object
(``monkeypatch.setattr(rule, "elementwise", wrong)``: the engine looks both
up there when it traces), so the mutant runs through the very path the suite
checks (the Optax transform, jit, ``apply_updates``), and the suite's cases
of that rule must fail in every dtype where the mistake changes the result.
A part is named ``"<rule>_scalars"`` or ``"<rule>_elementwise"`` below
(:func:`_target`); ``"_one_minus_power"`` is the shared
:func:`onnx_optax._numerics.one_minus_power`.

Transform mutants break the Optax layer instead (the count, the schedule,
the state's dtype) by wrapping the engine's :func:`onnx_optax._engine.transform`
or replacing what it calls; they must fail every rule's cases in every dtype.

Where a mutant cannot be wrong in some dtype, the test says why and asserts
that it is bit-identical there instead (``EQUIVALENT``). The margin (the
worst ratio error / tolerance of the case that catches a mutant) is printed
by ``python tests/conformance/test_conformance_teeth.py``, over every case,
and recorded in docs/conformance.md.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from onnx_optax import _engine, _numerics, registry, rules
from onnx_optax.conformance import cases as grid
from onnx_optax.conformance import check

_omp, _sqrt, _one_minus, _is_zero = (
  _numerics.one_minus_power,
  _numerics.sqrt,
  _numerics.one_minus,
  _numerics.is_static_zero,
)


def _target(part: str) -> tuple[Any, str]:
  """Where a part is planted: ``"adam_elementwise"`` is the registered Rule ``adam``'s
  ``elementwise``; ``"_one_minus_power"`` the numerics' ``one_minus_power``."""
  if part == "_one_minus_power":
    return _numerics, "one_minus_power"
  rule, _, attribute = part.rpartition("_")
  return registry.get(rule), attribute


def _plant(mp: pytest.MonkeyPatch, parts: dict[str, Any]) -> None:
  for part, mutant in parts.items():
    mp.setattr(*_target(part), mutant)


def _g_regularized(s, X, G, l2: str):
  """``G_regularized`` as the spec has it, with the sign flipped, or without L2 (``after``)."""
  if X is None or l2 == "after":
    return G
  if l2 == "sign":
    return G - s.norm_coefficient * X
  return s.norm_coefficient * X + G


# -- Momentum -------------------------------------------------------------------------


def _momentum_scalars(R, T, *, alpha, beta, norm_coefficient, first_step_rule=True, t_shift=0):
  T = jnp.asarray(T) + t_shift
  beta_adjusted = jnp.where(T > 0, beta, 1) if first_step_rule else jnp.asarray(beta)
  return rules.MomentumScalars(R, alpha, beta_adjusted, norm_coefficient)


def _momentum_elementwise(s, X, G, V, *, mode, nesterov_uses_old_v=False, l2="spec"):
  G_regularized = _g_regularized(s, X, G, l2)
  V_new = s.alpha * V + s.beta_adjusted * G_regularized
  # "after": L2 added to the step, after the momentum, instead of to G.
  decay = s.norm_coefficient * X if l2 == "after" and X is not None else 0
  if mode == "standard":
    return -(s.R * (V_new + decay)), V_new
  return -(s.R * (G_regularized + decay + s.alpha * (V if nesterov_uses_old_v else V_new))), V_new


def momentum_first_step_rule_dropped(*a, **k):
  return _momentum_scalars(*a, **k, first_step_rule=False)


def momentum_T_off_by_one(*a, **k):
  return _momentum_scalars(*a, **k, t_shift=-1)


def momentum_nesterov_old_V(*a, **k):
  return _momentum_elementwise(*a, **k, nesterov_uses_old_v=True)


def momentum_l2_sign(*a, **k):
  return _momentum_elementwise(*a, **k, l2="sign")


def momentum_l2_after_momentum(*a, **k):
  return _momentum_elementwise(*a, **k, l2="after")


# -- Adagrad --------------------------------------------------------------------------


def _adagrad_scalars(R, T, *, decay_factor, epsilon, norm_coefficient, t_shift=0):
  r = R / (1 + (jnp.asarray(T) + t_shift) * decay_factor)
  return rules.AdagradScalars(r, epsilon, norm_coefficient)


def _adagrad_elementwise(s, X, G, H, *, eps_in_sqrt=False, l2="spec"):
  G_regularized = _g_regularized(s, X, G, l2)
  H_new = H + G_regularized * G_regularized
  H_adaptive = jnp.sqrt(H_new + s.epsilon) if eps_in_sqrt else _sqrt(H_new) + s.epsilon
  # "after": L2 left out of the accumulator, added to the step's gradient only.
  numerator = s.norm_coefficient * X + G if l2 == "after" and X is not None else G_regularized
  return -(s.r * numerator / H_adaptive), H_new


def adagrad_epsilon_in_sqrt(*a, **k):
  return _adagrad_elementwise(*a, **k, eps_in_sqrt=True)


def adagrad_T_off_by_one(*a, **k):
  return _adagrad_scalars(*a, **k, t_shift=1)


def adagrad_l2_sign(*a, **k):
  return _adagrad_elementwise(*a, **k, l2="sign")


def adagrad_l2_after_accumulator(*a, **k):
  return _adagrad_elementwise(*a, **k, l2="after")


# -- ONNX Adam ------------------------------------------------------------------------


class _OptaxAdamScalars(NamedTuple):
  """AdamScalars plus what Optax's epsilon placement needs: R and both bias corrections."""

  R_adjusted: Any
  alpha: Any
  beta: Any
  one_minus_alpha: Any
  one_minus_beta: Any
  epsilon: Any
  norm_coefficient: Any
  one_minus_post: Any
  R: Any
  bias_1: Any
  bias_2: Any


def _adam_scalars(
  R,
  T,
  *,
  alpha,
  beta,
  epsilon,
  norm_coefficient,
  norm_coefficient_post,
  t_shift=0,
  correct_at_0=False,
  optax_epsilon=False,
):
  T = jnp.asarray(T) + t_shift
  T_used = jnp.maximum(T, 1)
  bias_1, bias_2 = _omp(alpha, T_used), _omp(beta, T_used)
  corrected = (T > 0) | correct_at_0
  R_adjusted = jnp.where(corrected, R * jnp.sqrt(bias_2) / bias_1, R)
  post = None if _is_zero(norm_coefficient_post) else _one_minus(norm_coefficient_post)
  s = rules.AdamScalars(
    R_adjusted, alpha, beta, _one_minus(alpha), _one_minus(beta), epsilon, norm_coefficient, post
  )
  if optax_epsilon:
    return _OptaxAdamScalars(*s, R, jnp.where(corrected, bias_1, 1), jnp.where(corrected, bias_2, 1))
  return s


def _adam_elementwise(
  s, X, G, V, H, *, eps_in_sqrt=False, optax_epsilon=False, drop_post=False, l2="spec", rounded_decays=()
):
  G_regularized = _g_regularized(s, X, G, l2)
  # The mistake rules._one_minus prevents: 1 - decay after rounding the decay to X's dtype.
  one_minus_alpha = 1 - s.alpha if "alpha" in rounded_decays else s.one_minus_alpha
  one_minus_beta = 1 - s.beta if "beta" in rounded_decays else s.one_minus_beta
  V_new = s.alpha * V + one_minus_alpha * G_regularized
  H_new = s.beta * H + one_minus_beta * G_regularized * G_regularized
  if optax_epsilon:  # optax.adam: epsilon added to the bias-corrected sqrt(H).
    step = s.R * (V_new / s.bias_1) / (jnp.sqrt(H_new / s.bias_2) + s.epsilon)
  else:
    H_sqrt = jnp.sqrt(H_new + s.epsilon) if eps_in_sqrt else _sqrt(H_new) + s.epsilon
    step = s.R_adjusted * V_new / H_sqrt
  if l2 == "after" and X is not None:  # AdamW-like: decay added after the moments.
    step = step + s.R_adjusted * s.norm_coefficient * X
  if s.one_minus_post is None or drop_post:
    return -step, V_new, H_new
  X_final = s.one_minus_post * (X - step)
  return X_final - X, V_new, H_new


def adam_epsilon_in_sqrt(*a, **k):
  return _adam_elementwise(*a, **k, eps_in_sqrt=True)


def adam_T_off_by_one(*a, **k):
  return _adam_scalars(*a, **k, t_shift=1)


def adam_optax_epsilon_scalars(*a, **k):
  return _adam_scalars(*a, **k, optax_epsilon=True)


def adam_optax_epsilon(*a, **k):
  return _adam_elementwise(*a, **k, optax_epsilon=True)


def adam_bias_correction_at_T0(*a, **k):
  return _adam_scalars(*a, **k, correct_at_0=True)


def adam_norm_coefficient_post_dropped(*a, **k):
  return _adam_elementwise(*a, **k, drop_post=True)


def adam_l2_sign(*a, **k):
  return _adam_elementwise(*a, **k, l2="sign")


def adam_l2_after_moments(*a, **k):
  return _adam_elementwise(*a, **k, l2="after")


def adam_beta_rounded_before_one_minus(*a, **k):
  return _adam_elementwise(*a, **k, rounded_decays=("beta",))


def adam_alpha_rounded_before_one_minus(*a, **k):
  return _adam_elementwise(*a, **k, rounded_decays=("alpha",))


# -- DirectML Adam --------------------------------------------------------------------


class _OptaxDirectMLScalars(NamedTuple):
  step_size: Any
  beta1: Any
  beta2: Any
  one_minus_beta1: Any
  one_minus_beta2: Any
  epsilon: Any
  learning_rate: Any
  bias_1: Any
  bias_2: Any


def _directml_scalars(learning_rate, T, *, beta1, beta2, epsilon, t_shift=0, optax_epsilon=False):
  T = jnp.asarray(T) + t_shift
  bias_1, bias_2 = _omp(beta1, T), _omp(beta2, T)
  s = rules.DirectMLAdamScalars(
    learning_rate * (jnp.sqrt(bias_2) / bias_1), beta1, beta2, _one_minus(beta1), _one_minus(beta2), epsilon
  )
  if optax_epsilon:
    return _OptaxDirectMLScalars(*s, learning_rate, bias_1, bias_2)
  return s


def _directml_elementwise(s, X, G, M, V, *, eps_in_sqrt=False, optax_epsilon=False, rounded_decays=()):
  one_minus_beta1 = 1 - s.beta1 if "beta1" in rounded_decays else s.one_minus_beta1
  one_minus_beta2 = 1 - s.beta2 if "beta2" in rounded_decays else s.one_minus_beta2
  M_new = s.beta1 * M + one_minus_beta1 * G
  V_new = s.beta2 * V + one_minus_beta2 * G * G
  if optax_epsilon:
    return -(s.learning_rate * (M_new / s.bias_1) / (jnp.sqrt(V_new / s.bias_2) + s.epsilon)), M_new, V_new
  root = jnp.sqrt(V_new + s.epsilon) if eps_in_sqrt else _sqrt(V_new) + s.epsilon
  return -(s.step_size * M_new / root), M_new, V_new


def directml_epsilon_in_sqrt(*a, **k):
  return _directml_elementwise(*a, **k, eps_in_sqrt=True)


def directml_T_off_by_one(*a, **k):
  return _directml_scalars(*a, **k, t_shift=-1)


def directml_optax_epsilon_scalars(*a, **k):
  return _directml_scalars(*a, **k, optax_epsilon=True)


def directml_optax_epsilon(*a, **k):
  return _directml_elementwise(*a, **k, optax_epsilon=True)


def directml_beta2_rounded_before_one_minus(*a, **k):
  return _directml_elementwise(*a, **k, rounded_decays=("beta2",))


def directml_beta1_rounded_before_one_minus(*a, **k):
  return _directml_elementwise(*a, **k, rounded_decays=("beta1",))


# -- ONNX Runtime AdamW (issue 18, item 4) ------------------------------------------------

_ort_scalars, _ort_elementwise = rules.ort_adamw_scalars, rules.ort_adamw_elementwise


def _ort_adamw_scalars(
  R, T, *, adam_mode, correct_bias, mode_as=None, ignore_correct_bias=False, t_shift=0, **k
):
  """ORT AdamW's scalars for ``mode_as`` (default: its own mode), ``correct_bias`` forced on, or T shifted."""
  mode = adam_mode if mode_as is None else mode_as
  correct = bool(correct_bias) or ignore_correct_bias
  s = _ort_scalars(R, jnp.asarray(T) + t_shift, adam_mode=mode, correct_bias=correct or mode == 0, **k)
  if not correct and mode == 0:  # Mode 0 needs the correction; without it the corrections are 1.
    s = s._replace(alpha_correction=1, one_over_beta_correction=1)
  if mode_as is not None and s.weight_decay is not None and s.lr_weight_decay is None:
    s = s._replace(lr_weight_decay=jnp.multiply(R, s.weight_decay))
  return s


def _ort_adamw_elementwise(
  s, X, G, M1, M2, *, adam_mode, mode_as=None, decay="spec", eps_in_sqrt=False, sqrt_bc=True
):
  """ORT AdamW's element-wise part, in the other mode, the decay moved, epsilon in the root, or
  the second bias correction without its square root."""
  mode = adam_mode if mode_as is None else mode_as
  M1_new = s.alpha * M1 + s.one_minus_alpha * G
  M2_new = s.beta * M2 + s.one_minus_beta * G * G
  if mode == 0:
    inv = s.one_over_beta_correction
    if not sqrt_bc:
      root = _sqrt(M2_new) * inv + (0 if eps_in_sqrt else s.epsilon)
    elif eps_in_sqrt:
      root = jnp.sqrt(M2_new * inv + s.epsilon)
    else:
      root = _sqrt(M2_new * inv) + s.epsilon
    step = (s.lr * M1_new) / (s.alpha_correction * root)
    before = decay == "spec"
  else:
    lr_corrected = s.lr_corrected  # Mode 1's dropped root is in _ort_lr_corrected_without_sqrt.
    root = jnp.sqrt(M2_new + s.epsilon) if eps_in_sqrt else _sqrt(M2_new) + s.epsilon
    step = lr_corrected * M1_new / root
    before = decay != "spec"
  if s.weight_decay is None:
    return -step, M1_new, M2_new
  lr_wd = s.lr * s.weight_decay if s.lr_weight_decay is None else s.lr_weight_decay
  if before:  # Mode 0's place: W shrinks before the step.
    W = X - X * s.lr * s.weight_decay
    return (W - step) - X, M1_new, M2_new
  W = X - step  # Mode 1's place: the updated W shrinks.
  return (W - lr_wd * W) - X, M1_new, M2_new


def _ort_lr_corrected_without_sqrt(R, T, *, adam_mode, correct_bias, **k):
  """Mode 1's ``lr * beta_correction / alpha_correction`` (the square root dropped)."""
  s = _ort_scalars(R, T, adam_mode=adam_mode, correct_bias=correct_bias, **k)
  if adam_mode == 1 and correct_bias:
    T = jnp.asarray(T)
    s = s._replace(lr_corrected=R * _omp(k["beta"], T) / _omp(k["alpha"], T))
  return s


def ort_adamw_modes_swapped_scalars(R, T, *, adam_mode, **k):
  return _ort_adamw_scalars(R, T, adam_mode=adam_mode, mode_as=1 - adam_mode, **k)


def ort_adamw_modes_swapped(s, X, G, M1, M2, *, adam_mode):
  return _ort_adamw_elementwise(s, X, G, M1, M2, adam_mode=adam_mode, mode_as=1 - adam_mode)


def ort_adamw_decay_moved(*a, **k):
  return _ort_adamw_elementwise(*a, **k, decay="moved")


def ort_adamw_correct_bias_ignored(*a, **k):
  return _ort_adamw_scalars(*a, **k, ignore_correct_bias=True)


def ort_adamw_epsilon_in_sqrt(*a, **k):
  return _ort_adamw_elementwise(*a, **k, eps_in_sqrt=True)


def ort_adamw_T_off_by_one(*a, **k):
  return _ort_adamw_scalars(*a, **k, t_shift=1)


def ort_adamw_bias_correction_sqrt_dropped(*a, **k):
  return _ort_adamw_elementwise(*a, **k, sqrt_bc=False)


_ORT_MODES = ("ort_adamw_mode0", "ort_adamw_mode1")
_ORT_MUTANTS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
  (
    "ort_adamw_modes_swapped",
    _ORT_MODES,
    {"ort_adamw_scalars": ort_adamw_modes_swapped_scalars, "ort_adamw_elementwise": ort_adamw_modes_swapped},
  ),
  ("ort_adamw_decay_moved", _ORT_MODES, {"ort_adamw_elementwise": ort_adamw_decay_moved}),
  # Mode 0 always corrects the bias (ONNX Runtime refuses correct_bias=0 there).
  (
    "ort_adamw_correct_bias_ignored",
    ("ort_adamw_mode1",),
    {"ort_adamw_scalars": ort_adamw_correct_bias_ignored},
  ),
  ("ort_adamw_epsilon_in_sqrt", _ORT_MODES, {"ort_adamw_elementwise": ort_adamw_epsilon_in_sqrt}),
  ("ort_adamw_T_off_by_one", _ORT_MODES, {"ort_adamw_scalars": ort_adamw_T_off_by_one}),
  (
    "ort_adamw_bias_correction_sqrt_dropped",
    _ORT_MODES,
    {
      "ort_adamw_scalars": _ort_lr_corrected_without_sqrt,
      "ort_adamw_elementwise": ort_adamw_bias_correction_sqrt_dropped,
    },
  ),
]


# -- small errors: a step scalar 32 ulp off, a step 1e-5 too large, 1 - beta^T cancelling ---


def _ulps_up(x, n: int):
  """``x`` moved ``n`` units in the last place away from zero, in its own (scalar) dtype."""
  x = jnp.asarray(x)
  bits = {4: jnp.int32, 8: jnp.int64}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(x, bits) + n, x.dtype)


#: The scalar of each rule that scales its step: the learning rate (Momentum), the decayed
#: rate ``r`` (Adagrad), ``R_adjusted`` (ONNX Adam), ``LearningRate * Alpha`` (DirectML).
_STEP_SCALAR = {
  "momentum": "R",
  "adagrad": "r",
  "adam": "R_adjusted",
  "directml_adam": "step_size",
  # ORT AdamW: the step's T-dependent scalar, alpha_correction (mode 0) or lr_corrected (mode 1).
  "ort_adamw": "alpha_correction|lr_corrected",
  "ort_sgd": "lr",
}
_ORIGINAL = {
  name: getattr(*_target(name))
  for rule in _STEP_SCALAR
  for name in (f"{rule}_scalars", f"{rule}_elementwise")
}


def _scalar_32_ulp_off(rule: str):
  """The rule's per-update step scalar computed 32 ulp (of its dtype) above the spec's number."""
  original, field = _ORIGINAL[f"{rule}_scalars"], _STEP_SCALAR[rule]

  def scalars(*a, **k):
    s = original(*a, **k)
    name = next(f for f in field.split("|") if getattr(s, f) is not None)
    return s._replace(**{name: _ulps_up(getattr(s, name), 32)})

  return scalars


def _step_too_large(rule: str, factor: float = 1 + 1e-5):
  """The rule's update ``U`` made relatively ``1e-5`` too large (in ``U``'s dtype)."""
  original = _ORIGINAL[f"{rule}_elementwise"]

  def elementwise(*a, **k):
    U, *state = original(*a, **k)
    return (U * factor, *state)

  return elementwise


def _one_minus_power_direct(beta, T):
  """``1 - beta**T`` as written: cancels at small ``T`` (80-128 ulp in float32 for beta = 0.999)."""
  return 1 - jnp.power(jnp.asarray(beta), T)


_SMALL = [
  (f"{rule}_{kind}", suite_rules, {f"{rule}_{part}": make(rule)})
  for rule, suite_rules in [
    ("momentum", ("momentum_standard", "momentum_nesterov")),
    ("adagrad", ("adagrad",)),
    ("adam", ("adam",)),
    ("directml_adam", ("directml_adam",)),
    ("ort_adamw", _ORT_MODES),
    ("ort_sgd", ("ort_sgd",)),
  ]
  for kind, part, make in [
    ("scalar_32_ulp_off", "scalars", _scalar_32_ulp_off),
    ("step_1e-5_too_large", "elementwise", _step_too_large),
  ]
]

#: Mutants too small to be wrong in some dtypes, and why: not required to fail there (their
#: margins are printed all the same). Not equivalent: a changed rounding may show in a bit.
BELOW_RESOLUTION: dict[str, tuple[tuple[str, ...], str]] = {
  name: (
    ("float16", "bfloat16"),
    "32 ulp of a float32 scalar (2**-18 relative at most), a relative 1e-5, or the 100 ulp "
    "of float32 by which 1 - beta**T cancels, are below one rounding of float16 (2**-11) "
    "and bfloat16 (2**-8)",
  )
  for name, _, _ in _SMALL
}
BELOW_RESOLUTION["one_minus_power_direct"] = BELOW_RESOLUTION[_SMALL[0][0]]
BELOW_RESOLUTION["ort_adamw_one_minus_power_direct"] = (
  ("float64", "float16", "bfloat16"),
  "as above in float16 and bfloat16; in float64 the expectation itself is the kernel's "
  "1 - float64(beta**T) (reference.ort_adamw), whose own cancellation (2 u64 beta**T, some "
  "400 u64 of 1 - beta**T at T = 5) the tolerance charges, and the direct form stays within it",
)

#: Mutants that must fail at every T of the grid in float32 (issue 17): some case at each T of
#: the rule's grid fails. float64 is not required: where the step is below ``2**-11 |X|``
#: (Adagrad at ``T = 2**31 - 1``: ``|U| ~ 2e-10 |X|``) even the extended-precision expectation
#: ``X_new - X`` of ``U`` carries more than 32 ulp of float64 of ``U`` (its margins are printed).
EVERY_T = tuple(name for name, _, _ in _SMALL)
EVERY_T_DTYPES = ("float32",)


# -- the rule mutants: (name, suite rules, {part of `rules`: replacement}) -------------

_M, _A, _D = "momentum", "adam", "directml_adam"
_BOTH_MODES = ("momentum_standard", "momentum_nesterov")
RULE_MUTANTS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
  ("momentum_first_step_rule_dropped", _BOTH_MODES, {f"{_M}_scalars": momentum_first_step_rule_dropped}),
  ("momentum_T_off_by_one", _BOTH_MODES, {f"{_M}_scalars": momentum_T_off_by_one}),
  ("momentum_nesterov_old_V", ("momentum_nesterov",), {f"{_M}_elementwise": momentum_nesterov_old_V}),
  ("momentum_l2_sign", _BOTH_MODES, {f"{_M}_elementwise": momentum_l2_sign}),
  ("momentum_l2_after_momentum", _BOTH_MODES, {f"{_M}_elementwise": momentum_l2_after_momentum}),
  ("adagrad_epsilon_in_sqrt", ("adagrad",), {"adagrad_elementwise": adagrad_epsilon_in_sqrt}),
  ("adagrad_T_off_by_one", ("adagrad",), {"adagrad_scalars": adagrad_T_off_by_one}),
  ("adagrad_l2_sign", ("adagrad",), {"adagrad_elementwise": adagrad_l2_sign}),
  ("adagrad_l2_after_accumulator", ("adagrad",), {"adagrad_elementwise": adagrad_l2_after_accumulator}),
  ("adam_epsilon_in_sqrt", ("adam",), {f"{_A}_elementwise": adam_epsilon_in_sqrt}),
  ("adam_T_off_by_one", ("adam",), {f"{_A}_scalars": adam_T_off_by_one}),
  (
    "adam_optax_epsilon",
    ("adam",),
    {f"{_A}_scalars": adam_optax_epsilon_scalars, f"{_A}_elementwise": adam_optax_epsilon},
  ),
  ("adam_bias_correction_at_T0", ("adam",), {f"{_A}_scalars": adam_bias_correction_at_T0}),
  (
    "adam_norm_coefficient_post_dropped",
    ("adam",),
    {f"{_A}_elementwise": adam_norm_coefficient_post_dropped},
  ),
  ("adam_l2_sign", ("adam",), {f"{_A}_elementwise": adam_l2_sign}),
  ("adam_l2_after_moments", ("adam",), {f"{_A}_elementwise": adam_l2_after_moments}),
  (
    "adam_beta_rounded_before_one_minus",
    ("adam",),
    {f"{_A}_elementwise": adam_beta_rounded_before_one_minus},
  ),
  (
    "adam_alpha_rounded_before_one_minus",
    ("adam",),
    {f"{_A}_elementwise": adam_alpha_rounded_before_one_minus},
  ),
  ("directml_epsilon_in_sqrt", ("directml_adam",), {f"{_D}_elementwise": directml_epsilon_in_sqrt}),
  ("directml_T_off_by_one", ("directml_adam",), {f"{_D}_scalars": directml_T_off_by_one}),
  (
    "directml_optax_epsilon",
    ("directml_adam",),
    {f"{_D}_scalars": directml_optax_epsilon_scalars, f"{_D}_elementwise": directml_optax_epsilon},
  ),
  (
    "directml_beta2_rounded_before_one_minus",
    ("directml_adam",),
    {f"{_D}_elementwise": directml_beta2_rounded_before_one_minus},
  ),
  (
    "directml_beta1_rounded_before_one_minus",
    ("directml_adam",),
    {f"{_D}_elementwise": directml_beta1_rounded_before_one_minus},
  ),
  # Issue 17: the bias corrections' 1 - beta^T computed as written, which cancels.
  ("one_minus_power_direct", ("adam", "directml_adam"), {"_one_minus_power": _one_minus_power_direct}),
  ("ort_adamw_one_minus_power_direct", _ORT_MODES, {"_one_minus_power": _one_minus_power_direct}),
  *_ORT_MUTANTS,
  *_SMALL,
]

#: Mutants that cannot be wrong in some dtypes, and why. Asserted bit-identical there.
EQUIVALENT: dict[str, tuple[tuple[str, ...], str]] = {
  name: (
    ("float32", "float64"),
    "_numerics.one_minus computes 1 - decay in float32 (float64 under x64), the dtype these "
    "cases compute in, so rounding the decay to it first changes nothing; in float32, "
    "1 - float32(decay) is even exact (Sterbenz' lemma) for decays in [0.5, 1]",
  )
  for name in (
    "adam_beta_rounded_before_one_minus",
    "adam_alpha_rounded_before_one_minus",
    "directml_beta2_rounded_before_one_minus",
    "directml_beta1_rounded_before_one_minus",
  )
}


# -- the transform mutants ---------------------------------------------------------------

_TRANSFORM_SIGNATURE = inspect.signature(_engine.transform)


def _wrapped_transform(change_args=None, change_update=None):
  """A replacement for the engine's ``transform`` that changes its arguments or its update."""
  original = _engine.transform

  def _transform(*args, **kwargs):
    bound = _TRANSFORM_SIGNATURE.bind(*args, **kwargs)
    if change_args is not None:
      change_args(bound.arguments)
    opt = original(*bound.args, **bound.kwargs)
    if change_update is None:
      return opt

    def update(updates, state, params=None, **extra):
      new_updates, new_state = opt.update(updates, state, params, **extra)
      return new_updates, change_update(updates, state, new_state)

    return optax.GradientTransformationExtraArgs(opt.init, update)

  return _transform


def _optax_with(**overrides):
  """``optax`` as the engine sees it, with some functions replaced."""
  proxy = types.SimpleNamespace(
    **{name: getattr(optax, name) for name in dir(optax) if not name.startswith("__")}
  )
  for name, value in overrides.items():
    setattr(proxy, name, value)
  return proxy


def _shift_schedule(by_initial_count: bool, extra: int = 0):
  def change(arguments):
    lr, initial_count = arguments["learning_rate"], arguments["initial_count"]
    if callable(lr):
      shift = (int(initial_count) if by_initial_count else 0) + extra
      arguments["learning_rate"] = lambda n: lr(n + shift)

  return change


def _state_cast(to: str):
  def change(grads, state, new_state):
    def cast(g, s_old, s_new):
      dtype = g.dtype if to == "param" else jnp.promote_types(g.dtype, s_old.dtype)
      return s_new.astype(dtype)

    fields = [jax.tree.map(cast, grads, old, new) for old, new in zip(state[1:], new_state[1:])]
    return type(new_state)(new_state.count, *fields)

  return change


#: (name, {attribute of the engine (`onnx_optax._engine`): replacement factory}, case names to try first).
TRANSFORM_MUTANTS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
  ("count_not_advanced", {"optax": lambda: _optax_with(safe_increment=lambda count: count)}, ()),
  (
    "count_wraps_at_int32_max",
    {"optax": lambda: _optax_with(safe_increment=lambda count: count + 1)},
    ("T=int32max",),
  ),
  (
    "schedule_at_T",
    {"transform": lambda: _wrapped_transform(change_args=_shift_schedule(True))},
    ("schedule",),
  ),
  (
    "schedule_after_the_update",
    {"transform": lambda: _wrapped_transform(change_args=_shift_schedule(False, 1))},
    ("schedule",),
  ),
  (
    "state_in_parameter_dtype",
    {"transform": lambda: _wrapped_transform(change_update=_state_cast("param"))},
    ("state_dtype",),
  ),
  (
    "state_in_compute_dtype",
    {"transform": lambda: _wrapped_transform(change_update=_state_cast("compute"))},
    ("state_dtype",),
  ),
]


# -- running the suite on a mutant -------------------------------------------------------


def _results(
  rule: str, dtype: str, first: tuple[str, ...] = (), stop: bool = True, only: tuple[str, ...] | None = None
) -> list[check.CaseResult]:
  """The suite's results for one rule and dtype (no 10^6-element case), ``first`` cases first.

  With ``stop``, up to the first failing case; with ``only``, the cases
  whose names contain one of its strings (the first case if none does).
  """
  cases = grid.cases(rule, dtype, large=False)
  if only is not None:
    cases = [c for c in cases if any(f in c.name for f in only)] or cases[:1]
  cases.sort(key=lambda c: not any(f in c.name for f in first))
  out = []
  # Every case: the rule's rows compiled as one program each, as the report runs them; up to the
  # first failure: case by case (a mutant is mostly caught by the first).
  for case, result in zip(cases, check.results(cases) if not stop else map(check.run_case, cases)):
    # A mutant that crashes would be "caught" for the wrong reason.
    assert not result.error, f"{case.id} raised {result.error}"
    out.append(result)
    if stop and not result.passed:
      break
  return out


def _failure(rule: str, dtype: str, first: tuple[str, ...] = ()) -> check.CaseResult | None:
  failed = [r for r in _results(rule, dtype, first) if not r.passed]
  return failed[0] if failed else None


def _catch_message(r: check.CaseResult) -> str:
  if r.worst > 1:
    return f"{r.name} at {r.worst:.3g} x tolerance"
  return f"{r.name} ({'count' if not r.count_ok else r.wrong_dtypes or 'unchecked'})"


# Every mutant in every dtype, except where EQUIVALENT says it cannot be wrong
# (test_equivalent_mutants_are_bit_identical asserts that instead).
_WRONG_SOMEWHERE = [
  pytest.param(name, suite_rules, parts, dtype, id=f"{name}-{dtype}")
  for name, suite_rules, parts in RULE_MUTANTS
  for dtype in grid.DTYPES
  if dtype not in EQUIVALENT.get(name, ((), ""))[0] + BELOW_RESOLUTION.get(name, ((), ""))[0]
]


@pytest.mark.parametrize("name,suite_rules,parts,dtype", _WRONG_SOMEWHERE)
def test_wrong_variant_is_caught(monkeypatch, name, suite_rules, parts, dtype):
  _plant(monkeypatch, parts)
  for rule in suite_rules:
    failure = _failure(rule, dtype)
    assert failure is not None, f"{name} passes the {rule} {dtype} cases"
    print(f"{name} {rule} {dtype}: caught by {_catch_message(failure)}")


def _worst_per_T(rule: str, dtype: str, stop: bool = True) -> dict[int, float]:
  """Per T of the grid (no 10^6 case), the worst ratio of its cases; with ``stop``, until one fails.

  A case that fails by its count, its dtypes or an unchecked element counts as ``inf``.
  """
  by_T: dict[int, list[grid.Case]] = {}
  for case in grid.cases(rule, dtype, large=False):
    by_T.setdefault(case.T, []).append(case)
  worst = {}
  for T, cases in sorted(by_T.items()):
    worst[T] = 0.0
    for case in cases:
      r = check.run_case(case)
      assert not r.error, f"{case.id} raised {r.error}"
      worst[T] = max(worst[T], r.worst if r.worst > 1 or r.passed else float("inf"))
      if stop and worst[T] > 1:
        break
  return worst


_AT_EVERY_T = [
  pytest.param(name, suite_rules, parts, dtype, id=f"{name}-{dtype}")
  for name, suite_rules, parts in RULE_MUTANTS
  if name in EVERY_T
  for dtype in EVERY_T_DTYPES
]


@pytest.mark.parametrize("name,suite_rules,parts,dtype", _AT_EVERY_T)
def test_small_error_is_caught_at_every_T(monkeypatch, name, suite_rules, parts, dtype):
  """A step scalar 32 ulp off, or a step 1e-5 too large, fails some case at every T of the grid."""
  _plant(monkeypatch, parts)
  for rule in suite_rules:
    worst = _worst_per_T(rule, dtype)
    passed = {T: w for T, w in worst.items() if w <= 1}
    assert not passed, f"{name} passes every {rule} {dtype} case at T = {passed}"
    print(f"{name} {rule} {dtype}: smallest worst ratio over T {min(worst.values()):.3g}")


@pytest.mark.parametrize("dtype", grid.DTYPES)
@pytest.mark.parametrize("name,patches,first", TRANSFORM_MUTANTS, ids=[m[0] for m in TRANSFORM_MUTANTS])
def test_wrong_transform_is_caught(monkeypatch, name, patches, first, dtype):
  for attribute, make in patches.items():
    monkeypatch.setattr(_engine, attribute, make())
  for rule in grid.RULES:
    if name.startswith("state_in") and not grid.suite_rule(rule).state:
      continue  # ONNX Runtime's SGD keeps no state tensors: no state dtype to get wrong.
    failure = _failure(rule, dtype, first)
    assert failure is not None, f"{name} passes the {rule} {dtype} cases"
    print(f"{name} {rule} {dtype}: caught by {_catch_message(failure)}")


@pytest.mark.parametrize("name", sorted(EQUIVALENT))
def test_equivalent_mutants_are_bit_identical(monkeypatch, name):
  """Where a mutant is declared equivalent, it gives the very bits of the rule, on every case."""
  ((_, suite_rules, parts),) = [m for m in RULE_MUTANTS if m[0] == name]
  dtypes, _ = EQUIVALENT[name]
  for rule in suite_rules:
    for dtype in dtypes:
      for case in grid.cases(rule, dtype, large=False)[:8]:
        inputs = case.inputs()
        args = (case.rule, case.dtype, "cpu", case.R, case.T, case.hyper, *inputs)
        kwargs = {"state_dtype": case.state_dtype, "initial_count": case.initial_count}
        want = check.run_transform(*args, **kwargs)
        with monkeypatch.context() as m:
          _plant(m, parts)
          got = check.run_transform(*args, **kwargs)
        for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
          assert np.asarray(w).tobytes() == np.asarray(g).tobytes(), (name, case.id)


_UNMUTATED = {
  "momentum_nesterov": {"momentum_scalars": _momentum_scalars, "momentum_elementwise": _momentum_elementwise},
  "adagrad": {"adagrad_scalars": _adagrad_scalars, "adagrad_elementwise": _adagrad_elementwise},
  "adam": {"adam_scalars": _adam_scalars, "adam_elementwise": _adam_elementwise},
  "directml_adam": {
    "directml_adam_scalars": _directml_scalars,
    "directml_adam_elementwise": _directml_elementwise,
  },
  **{
    mode: {"ort_adamw_scalars": _ort_adamw_scalars, "ort_adamw_elementwise": _ort_adamw_elementwise}
    for mode in _ORT_MODES
  },
}


@pytest.mark.parametrize("dtype", grid.DTYPES)
@pytest.mark.parametrize("rule", sorted(_UNMUTATED))
def test_unmutated_copies_pass(monkeypatch, rule, dtype):
  """The mutants' common bodies are right: without a mutation they pass the suite, in every dtype."""
  _plant(monkeypatch, _UNMUTATED[rule])
  failed = [f"{r.name}: {r.worst:.3g} {r.where}" for r in _results(rule, dtype, stop=False) if not r.passed]
  assert not failed


def _margins(names: list[str] | None = None) -> None:
  """Prints, per mutant and dtype, the worst error / tolerance over the cases (no 10^6 case).

  Rule mutants: over every case of their rules; for the :data:`EVERY_T` mutants, the smallest
  over the grid's T of the worst ratio at that T (the thinnest T). Transform mutants: over the
  cases named in TRANSFORM_MUTANTS (the others cannot tell), or the first case when none is
  named (a mutant of the count fails every case). ``names``: only these mutants.
  """
  mp = pytest.MonkeyPatch()
  print("| mutant | float32 | float64 | float16 | bfloat16 |\n|---|---:|---:|---:|---:|")
  rows: list[
    tuple[str, tuple[str, ...], Callable[..., list[tuple[Any, str, Any]]], tuple[str, ...] | None]
  ] = [
    (name, suite_rules, lambda parts=parts: [(*_target(k), v) for k, v in parts.items()], None)
    for name, suite_rules, parts in RULE_MUTANTS
  ]
  rows += [
    (name, grid.RULES, lambda patches=patches: [(_engine, k, f()) for k, f in patches.items()], first)
    for name, patches, first in TRANSFORM_MUTANTS
  ]
  for name, suite_rules, patches, only in rows:
    if names and name not in names:
      continue
    cells = []
    for dtype in grid.DTYPES:
      if dtype in EQUIVALENT.get(name, ((), ""))[0]:
        cells.append("equivalent")
        continue
      for target, attribute, value in patches():
        mp.setattr(target, attribute, value)
      worst, other = float("inf") if name in EVERY_T else 0.0, set()
      for rule in suite_rules:
        if name in EVERY_T:
          worst = min(worst, min(_worst_per_T(rule, dtype, stop=False).values()))
          continue
        for r in _results(rule, dtype, stop=False, only=only):
          worst = max(worst, r.worst)
          if not r.count_ok:
            other.add("count")
          if r.wrong_dtypes:
            other.add("dtype")
      mp.undo()
      cell = " + ".join(([f"{worst:.3g}"] if worst > 1 else []) + sorted(other)) or "NOT CAUGHT"
      if dtype in BELOW_RESOLUTION.get(name, ((), ""))[0]:
        cell = f"({worst:.2g}, below resolution)"
      cells.append(cell)
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  import sys

  _margins(sys.argv[1:] or None)
