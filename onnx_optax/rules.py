"""The update rules, written once each, in the names and order of docs/spec.md.

This is the only place in the package where the arithmetic of the rules
(ONNX's three, DirectML's Adam, ONNX Runtime's AdamW and SGD) is written. The
Optax transforms (:mod:`onnx_optax.transforms`) and the ONNX interface
(:mod:`onnx_optax.onnx`) call these functions; they never restate a formula.
The NumPy expectations (:mod:`onnx_optax.reference`) are written
independently, from the spec, so that they can catch mistakes here.

Each rule is written in two parts, which together are the spec's formula in
the spec's order:

* ``<rule>_scalars(R, T, **hyperparameters)``: the scalars that depend only on
  the hyperparameters and ``T`` (the bias corrections, Adagrad's decayed rate,
  Momentum's ``beta_adjusted``, the decays' ``1 - beta``), a ``NamedTuple``.
  A pytree of many leaves needs them once per update, not once per leaf.
* ``<rule>_elementwise(scalars, X, G, *state, **static)``: the element-wise
  work on one tensor, with the scalars already rounded to ``X``'s dtype by
  :func:`like`.

The single-tensor function ``<rule>(R, T, X, G, *state, ...)`` is the two
composed, and is what the ONNX interface calls.

Conventions shared by every rule:

* Each function updates **one tensor** ``X`` with its gradient ``G`` and its
  state tensors. Pytrees and ONNX's variadic blocks are loops around it.
* Each returns ``(U, *new_state)`` where ``U`` is the additive update:
  ``X + U`` is the spec's ``X_new``. For rules whose spec reads
  ``X_new = X - S``, ``U`` is ``-(S)`` computed in the spec's order, and
  ``X + U`` equals ``X - S`` to the bit (IEEE ``x + (-y)`` is ``x - y``).
  This is what lets ``optax.apply_updates(params, updates)`` reproduce the
  spec exactly. The one exception is ONNX Adam with a non-zero
  ``norm_coefficient_post``, documented in :func:`adam`.
* The scalars are computed in the dtype the hyperparameters arrive in
  (float32 for Python floats and for Optax's injected hyperparameters;
  float64 under ``jax_enable_x64``) and rounded once to ``X``'s dtype.
  Computing ``1 - beta**T`` in float16 would lose most of its digits, and
  this keeps a float16 or bfloat16 update as accurate as its own arithmetic
  allows. The bias corrections' ``1 - beta^T`` is evaluated as
  ``-expm1(T * log(beta))`` (see :func:`_one_minus_power`): the spec's
  number, without cancellation. The decays' ``1 - beta`` are such scalars
  too (see :func:`_one_minus`).
* Every element-wise operation runs in ``X``'s dtype; callers that want a
  wider compute dtype cast ``X``, ``G`` and the state before the call (the
  Optax transforms do, see ``state_dtype``).
* ``X=None`` in an element-wise part means that the parameters are not read:
  the caller knows ``norm_coefficient`` is the Python number 0, and the spec's
  ``0 * X + G`` is ``G`` for every finite ``X``. The Optax transforms use it;
  the single-tensor functions always read ``X``.
* ``T`` is an integer scalar (array or Python int). Branches on ``T > 0`` use
  :func:`jax.numpy.where`, so every rule is jittable and has no Python
  control flow on traced values.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
from collections.abc import Iterator
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike, DTypeLike

__all__ = [
  "ADAM_MODES",
  "MODES",
  "AdagradScalars",
  "AdamScalars",
  "DirectMLAdamScalars",
  "KerasAdamScalars",
  "MomentumScalars",
  "OrtAdamWScalars",
  "OrtSGDScalars",
  "PyTorchAdagradScalars",
  "PyTorchAdamScalars",
  "PyTorchSGDScalars",
  "adagrad",
  "adagrad_elementwise",
  "adagrad_scalars",
  "adam",
  "adam_elementwise",
  "adam_scalars",
  "directml_adam",
  "directml_adam_elementwise",
  "directml_adam_scalars",
  "keras_adam_elementwise",
  "keras_adam_scalars",
  "like",
  "momentum",
  "momentum_elementwise",
  "momentum_scalars",
  "ort_adamw",
  "ort_adamw_elementwise",
  "ort_adamw_scalars",
  "ort_sgd",
  "ort_sgd_elementwise",
  "ort_sgd_scalars",
  "pytorch_adagrad_elementwise",
  "pytorch_adagrad_scalars",
  "pytorch_adam_elementwise",
  "pytorch_adam_scalars",
  "pytorch_sgd_elementwise",
  "pytorch_sgd_scalars",
]

#: The values of ONNX Momentum's ``mode`` attribute.
MODES = ("standard", "nesterov")

#: The values of ONNX Runtime AdamWOptimizer's ``adam_mode`` attribute: 0 is PyTorch's
#: ``torch.optim.AdamW``, 1 is Hugging Face's ``transformers.AdamW``.
ADAM_MODES = (0, 1)

Scalars = TypeVar("Scalars", bound=tuple)


def like(scalars: Scalars, dtype: DTypeLike) -> Scalars:
  """Rounds each scalar of a rule once to ``dtype``, the element-wise dtype.

  ``None`` fields (a term the rule leaves out) stay ``None``.
  """
  return jax.tree.map(lambda s: jnp.asarray(s, dtype=dtype), scalars)


def _one_minus(decay: ArrayLike) -> Array:
  """``1 - decay``, in the hyperparameters' dtype.

  A scalar like the bias corrections, so it is rounded to ``X``'s dtype once,
  after the subtraction: bfloat16 rounds ``beta = 0.999`` to 1.0, and
  ``1 - bfloat16(beta)`` would be 0, so that ``H`` never saw a gradient. In
  float32 ``1 - float32(beta)`` is exact (Sterbenz), so float32 results are
  those of a runtime that evaluates ``(1 - beta)`` in float32, as ONNX's do.
  """
  return 1 - jnp.asarray(decay)


@jax.custom_jvp
def _one_minus_power(beta: ArrayLike, T: ArrayLike) -> Array:
  """``1 - beta^T``, evaluated as ``-expm1(T * log(beta))``.

  The same number, without the cancellation of ``1 - beta**T``: for
  ``beta = 0.999`` the direct form loses about ``1 / (T * (1 - beta))`` ulps
  (hundreds in float32), this form a few. ``beta = 0`` gives 1 and
  ``beta = 1`` gives 0, as the direct form does for ``T > 0``.
  """
  return -jnp.expm1(T * jnp.log(beta))


@_one_minus_power.defjvp
def _one_minus_power_jvp(primals, tangents):
  # d(1 - beta^T) / d beta = -T * beta^(T - 1), written out: differentiating
  # the expm1 form gives (expm1(x) + 1) * T / beta, which cancels when
  # beta^T << 1 (error ~ T * ulp / beta) and is 0 * inf = NaN at beta = 0.
  beta, T = primals
  beta_dot, _ = tangents
  return _one_minus_power(beta, T), -T * jnp.power(beta, T - 1) * beta_dot


#: True while a caller traces element-wise parts whose derivative it supplies itself
#: (see :func:`_plain_sqrt`); :func:`_sqrt` is then a plain square root.
_PLAIN_SQRT: contextvars.ContextVar[bool] = contextvars.ContextVar("onnx_optax_plain_sqrt", default=False)


@contextlib.contextmanager
def _plain_sqrt(plain: bool = True) -> Iterator[None]:
  """Within this context :func:`_sqrt` is ``jnp.sqrt``: the same values, JAX's own derivative.

  For a caller that wraps many element-wise calls in one ``jax.custom_jvp``
  whose rule differentiates them again outside this context (with the safe
  derivative): the Optax transforms do, so that a tree of a thousand leaves
  traces and lowers one ``custom_jvp`` per update instead of one per leaf.
  ``_plain_sqrt(False)`` restores the safe derivative inside such a context.
  """
  token = _PLAIN_SQRT.set(plain)
  try:
    yield
  finally:
    _PLAIN_SQRT.reset(token)


def _sqrt(H: Array) -> Array:
  """``Sqrt(H)`` of a second-moment tensor, differentiated as 0 at ``H = 0``.

  ``H = 0`` wherever ``G_regularized`` has been exactly 0 at every update so
  far (a dead unit, an unused embedding row). There ``d Sqrt(H)`` is
  infinite, a zero cotangent makes inf * 0 = NaN, and that NaN poisons every
  meta-gradient (``jax.grad`` through updates w.r.t. a hyperparameter). 0 is a
  subgradient of ``|G| = Sqrt(G^2)``, at every order (Hessians through an
  update are finite too). The value is ``jnp.sqrt(H)``: the rule
  changes only the derivative, so a step that is not differentiated costs
  one square root per element and nothing more. Within :func:`_plain_sqrt`
  (a caller that supplies the derivative itself) it is ``jnp.sqrt(H)``.
  """
  return jnp.sqrt(H) if _PLAIN_SQRT.get() else _safe_sqrt(H)


@jax.custom_jvp
def _safe_sqrt(H: Array) -> Array:
  """``jnp.sqrt(H)`` with the derivative 0 at ``H = 0`` (see :func:`_sqrt`)."""
  return jnp.sqrt(H)


@_safe_sqrt.defjvp
def _safe_sqrt_jvp(primals, tangents):
  (H,) = primals
  (H_dot,) = tangents
  # The root is the safe one again, so that the derivative of this rule (a
  # second derivative, a Hessian-vector product) differentiates it as 0 at
  # H = 0 too: with jnp.sqrt, d root = inf there, times the 0 cotangent of
  # the unused branch, is NaN, and every second derivative through the
  # update would be NaN. The same holds at every order. A first derivative
  # does not differentiate this rule: there _safe_sqrt(H) is jnp.sqrt(H),
  # and the program is the one a plain root gives (a where-based root here
  # would add operations to every first-order meta-gradient: 25% more
  # optimized HLO on 100 leaves of ONNX Adam).
  root = _safe_sqrt(H)
  zero = H == 0
  # The tangent is linear in H_dot (so that it transposes) and has no 0/0
  # on either branch: the cotangent of the unused branch is 0 / 2, not 0 / 0.
  return root, jnp.where(zero, 0, H_dot / (2 * jnp.where(zero, 1, root)))


def _is_static(value: Any, number: float) -> bool:
  """True for a Python (not traced) number equal to ``number``."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and value == number


def _is_static_zero(value: Any) -> bool:
  """True for a Python (not traced) number that is zero."""
  return _is_static(value, 0)


def _regularized(norm_coefficient: Array, X: Array | None, G: Array) -> Array:
  """``G_regularized = norm_coefficient * X + G`` (``G`` when ``X`` is not read)."""
  return G if X is None else norm_coefficient * X + G


# -- Momentum ------------------------------------------------------------------------


class MomentumScalars(NamedTuple):
  """The per-update scalars of ONNX ``Momentum``.

  ``beta_adjusted`` is None when ``beta`` is the Python number 1: it is 1 at
  every ``T`` then, and ``1 * G_regularized`` is ``G_regularized`` to the bit
  (``optax.sgd``'s momentum, PyTorch's ``dampening = 0``), so the factor is
  not traced per leaf.
  """

  R: Any
  alpha: Any
  beta_adjusted: Any
  norm_coefficient: Any


def momentum_scalars(
  R: ArrayLike,
  T: ArrayLike,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  norm_coefficient: ArrayLike,
) -> MomentumScalars:
  """``beta_adjusted = T > 0 ? beta : 1``, and the hyperparameters."""
  beta_adjusted = None if _is_static(beta, 1) else jnp.where(jnp.asarray(T) > 0, beta, 1)
  return MomentumScalars(R, alpha, beta_adjusted, norm_coefficient)


def momentum_elementwise(
  s: MomentumScalars,
  X: Array | None,
  G: Array,
  V: Array,
  *,
  mode: str,
) -> tuple[Array, Array]:
  """The element-wise part of ONNX ``Momentum``::

      G_regularized = norm_coefficient * X + G
      V_new         = alpha * V + beta_adjusted * G_regularized
      standard:  X_new = X - R * V_new
      nesterov:  X_new = X - R * (G_regularized + alpha * V_new)

  Returns ``(U, V_new)``; ``mode`` is ``"standard"`` or ``"nesterov"``.
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  G_regularized = _regularized(s.norm_coefficient, X, G)
  V_new = s.alpha * V + (G_regularized if s.beta_adjusted is None else s.beta_adjusted * G_regularized)
  if mode == "standard":
    return -(s.R * V_new), V_new
  return -(s.R * (G_regularized + s.alpha * V_new)), V_new


def momentum(
  R: ArrayLike,
  T: ArrayLike,
  X: Array,
  G: Array,
  V: Array,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  mode: str,
  norm_coefficient: ArrayLike,
) -> tuple[Array, Array]:
  """ONNX ``Momentum`` (ai.onnx.preview.training, v1) on one tensor.

  ``T`` is the number of updates already conducted (0 at the first), so the
  first update uses ``beta_adjusted = 1``::

      G_regularized = norm_coefficient * X + G
      beta_adjusted = T > 0 ? beta : 1
      V_new         = alpha * V + beta_adjusted * G_regularized
      standard:  X_new = X - R * V_new
      nesterov:  X_new = X - R * (G_regularized + alpha * V_new)

  Returns:
    ``(U, V_new)`` with ``X + U == X_new`` to the bit.
  """
  s = momentum_scalars(R, T, alpha=alpha, beta=beta, norm_coefficient=norm_coefficient)
  return momentum_elementwise(like(s, X.dtype), X, G, V, mode=mode)


# -- Adagrad -------------------------------------------------------------------------


class AdagradScalars(NamedTuple):
  """The per-update scalars of ONNX ``Adagrad``."""

  r: Any
  epsilon: Any
  norm_coefficient: Any


def adagrad_scalars(
  R: ArrayLike,
  T: ArrayLike,
  *,
  decay_factor: ArrayLike,
  epsilon: ArrayLike,
  norm_coefficient: ArrayLike,
) -> AdagradScalars:
  """``r = R / (1 + T * decay_factor)``, and the hyperparameters.

  With ``decay_factor`` the Python number 0, ``r`` is ``R``: ``R / 1`` to the
  bit, and nothing that depends on ``T`` is traced.
  """
  r = R if _is_static_zero(decay_factor) else R / (1 + jnp.asarray(T) * decay_factor)
  return AdagradScalars(r, epsilon, norm_coefficient)


def adagrad_elementwise(
  s: AdagradScalars,
  X: Array | None,
  G: Array,
  H: Array,
) -> tuple[Array, Array]:
  """The element-wise part of ONNX ``Adagrad``::

      G_regularized = norm_coefficient * X + G
      H_new         = H + G_regularized * G_regularized
      H_adaptive    = Sqrt(H_new) + epsilon
      X_new         = X - r * G_regularized / H_adaptive

  ``r * G_regularized / H_adaptive`` is evaluated left to right, as the
  spec's C-like pseudo code reads: ``(r * G_regularized) / H_adaptive``.
  Returns ``(U, H_new)``.
  """
  G_regularized = _regularized(s.norm_coefficient, X, G)
  H_new = H + G_regularized * G_regularized
  H_adaptive = _sqrt(H_new) + s.epsilon
  return -(s.r * G_regularized / H_adaptive), H_new


def adagrad(
  R: ArrayLike,
  T: ArrayLike,
  X: Array,
  G: Array,
  H: Array,
  *,
  decay_factor: ArrayLike,
  epsilon: ArrayLike,
  norm_coefficient: ArrayLike,
) -> tuple[Array, Array]:
  """ONNX ``Adagrad`` (ai.onnx.preview.training, v1) on one tensor::

      r             = R / (1 + T * decay_factor)
      G_regularized = norm_coefficient * X + G
      H_new         = H + G_regularized * G_regularized
      H_adaptive    = Sqrt(H_new) + epsilon
      X_new         = X - r * G_regularized / H_adaptive

  Returns:
    ``(U, H_new)`` with ``X + U == X_new`` to the bit.
  """
  s = adagrad_scalars(R, T, decay_factor=decay_factor, epsilon=epsilon, norm_coefficient=norm_coefficient)
  return adagrad_elementwise(like(s, X.dtype), X, G, H)


# -- ONNX Adam -----------------------------------------------------------------------


class AdamScalars(NamedTuple):
  """The per-update scalars of ONNX ``Adam``.

  ``one_minus_post`` is None when ``norm_coefficient_post`` is the Python
  number 0: then ``X_final`` is ``X_new`` and the additive update is exact.
  """

  R_adjusted: Any
  alpha: Any
  beta: Any
  one_minus_alpha: Any
  one_minus_beta: Any
  epsilon: Any
  norm_coefficient: Any
  one_minus_post: Any


def adam_scalars(
  R: ArrayLike,
  T: ArrayLike,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  epsilon: ArrayLike,
  norm_coefficient: ArrayLike,
  norm_coefficient_post: ArrayLike,
) -> AdamScalars:
  """``R_adjusted = T > 0 ? R * Sqrt(1 - beta^T) / (1 - alpha^T) : R``, the decays' ``1 - alpha``,
  ``1 - beta``, ``1 - norm_coefficient_post``, and the hyperparameters."""
  T = jnp.asarray(T)
  # Both branches of a `where` are evaluated; T = 0 in the bias correction
  # would be 0/0, whose NaN poisons gradients taken through the `where`.
  T_positive = jnp.where(T > 0, T, 1)
  R_adjusted = jnp.where(
    T > 0, R * jnp.sqrt(_one_minus_power(beta, T_positive)) / _one_minus_power(alpha, T_positive), R
  )
  one_minus_post = None if _is_static_zero(norm_coefficient_post) else _one_minus(norm_coefficient_post)
  return AdamScalars(
    R_adjusted, alpha, beta, _one_minus(alpha), _one_minus(beta), epsilon, norm_coefficient, one_minus_post
  )


def adam_elementwise(
  s: AdamScalars,
  X: Array | None,
  G: Array,
  V: Array,
  H: Array,
) -> tuple[Array, Array, Array]:
  """The element-wise part of ONNX ``Adam``::

      G_regularized = norm_coefficient * X + G
      V_new         = alpha * V + (1 - alpha) * G_regularized
      H_new         = beta * H + (1 - beta) * G_regularized * G_regularized
      H_sqrt        = Sqrt(H_new) + epsilon
      X_new         = X - R_adjusted * V_new / H_sqrt
      X_final       = (1 - norm_coefficient_post) * X_new

  Returns ``(U, V_new, H_new)``, ``U`` as in :func:`adam`.
  """
  G_regularized = _regularized(s.norm_coefficient, X, G)
  V_new = s.alpha * V + s.one_minus_alpha * G_regularized
  H_new = s.beta * H + s.one_minus_beta * G_regularized * G_regularized
  H_sqrt = _sqrt(H_new) + s.epsilon
  if s.one_minus_post is None:
    return -(s.R_adjusted * V_new / H_sqrt), V_new, H_new
  if X is None:
    raise ValueError("norm_coefficient_post multiplies X: the parameters must be read")
  X_new = X - s.R_adjusted * V_new / H_sqrt
  X_final = s.one_minus_post * X_new
  return X_final - X, V_new, H_new


def adam(
  R: ArrayLike,
  T: ArrayLike,
  X: Array,
  G: Array,
  V: Array,
  H: Array,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  epsilon: ArrayLike,
  norm_coefficient: ArrayLike,
  norm_coefficient_post: ArrayLike,
) -> tuple[Array, Array, Array]:
  """ONNX ``Adam`` (ai.onnx.preview.training, v1) on one tensor::

      G_regularized = norm_coefficient * X + G
      V_new         = alpha * V + (1 - alpha) * G_regularized
      H_new         = beta * H + (1 - beta) * G_regularized * G_regularized
      H_sqrt        = Sqrt(H_new) + epsilon
      R_adjusted    = T > 0 ? R * Sqrt(1 - beta^T) / (1 - alpha^T) : R
      X_new         = X - R_adjusted * V_new / H_sqrt
      X_final       = (1 - norm_coefficient_post) * X_new

  ``R_adjusted * V_new / H_sqrt`` is ``(R_adjusted * V_new) / H_sqrt``, the
  order of the operator schema's text (ONNX's NumPy reference evaluates
  ``R_adjusted * (V_new / H_sqrt)``; the two differ by one rounding).

  Returns:
    ``(U, V_new, H_new)``. When ``norm_coefficient_post`` is the Python
    number 0, ``X_final == X_new`` and ``X + U == X_new`` to the bit. Otherwise
    no additive ``U`` can reproduce the multiplication exactly: ``U`` is
    ``X_final - X``, and ``X + U`` equals ``X_final`` to the bit whenever
    ``X_final`` and ``X`` are within a factor of two of each other (Sterbenz'
    lemma makes the subtraction exact), and in general within one ulp of
    ``max(|X|, |X_final|)`` (the subtraction's rounding and the addition's).
  """
  s = adam_scalars(
    R,
    T,
    alpha=alpha,
    beta=beta,
    epsilon=epsilon,
    norm_coefficient=norm_coefficient,
    norm_coefficient_post=norm_coefficient_post,
  )
  return adam_elementwise(like(s, X.dtype), X, G, V, H)


# -- DirectML Adam -------------------------------------------------------------------


class DirectMLAdamScalars(NamedTuple):
  """The per-update scalars of DirectML's Adam: ``LearningRate * Alpha`` and the decays."""

  step_size: Any
  beta1: Any
  beta2: Any
  one_minus_beta1: Any
  one_minus_beta2: Any
  epsilon: Any


def directml_adam_scalars(
  learning_rate: ArrayLike,
  T: ArrayLike,
  *,
  beta1: ArrayLike,
  beta2: ArrayLike,
  epsilon: ArrayLike,
) -> DirectMLAdamScalars:
  """``Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)``, ``LearningRate * Alpha``, ``1 - Beta1``,
  ``1 - Beta2``, and the hyperparameters.

  ``LearningRate * Alpha * M_new / D`` is evaluated left to right, so
  ``LearningRate * Alpha`` is a scalar product.
  """
  T = jnp.asarray(T)
  Alpha = jnp.sqrt(_one_minus_power(beta2, T)) / _one_minus_power(beta1, T)
  return DirectMLAdamScalars(
    learning_rate * Alpha, beta1, beta2, _one_minus(beta1), _one_minus(beta2), epsilon
  )


def directml_adam_elementwise(
  s: DirectMLAdamScalars,
  X: Array | None,
  G: Array,
  M: Array,
  V: Array,
) -> tuple[Array, Array, Array]:
  """The element-wise part of DirectML's Adam (``X`` is not read: no weight decay)::

      M_new = Beta1 * M + (1 - Beta1) * G
      V_new = Beta2 * V + (1 - Beta2) * G * G
      X_new = X - LearningRate * Alpha * M_new / (sqrt(V_new) + Epsilon)

  Returns ``(U, M_new, V_new)``.
  """
  del X
  M_new = s.beta1 * M + s.one_minus_beta1 * G
  V_new = s.beta2 * V + s.one_minus_beta2 * G * G
  return -(s.step_size * M_new / (_sqrt(V_new) + s.epsilon)), M_new, V_new


def directml_adam(
  X: Array,
  M: Array,
  V: Array,
  G: Array,
  T: ArrayLike,
  *,
  learning_rate: ArrayLike,
  beta1: ArrayLike,
  beta2: ArrayLike,
  epsilon: ArrayLike,
) -> tuple[Array, Array, Array]:
  """DirectML ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` on one tensor.

  Operands in DirectML's order (parameters, first moment, second moment,
  gradient, training step)::

      M_new = Beta1 * M + (1 - Beta1) * G
      V_new = Beta2 * V + (1 - Beta2) * G * G
      Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)
      X_new = X - LearningRate * Alpha * M_new / (sqrt(V_new) + Epsilon)

  ``T`` must be at least 1: at ``T = 0`` ``Alpha`` is 0/0 and the result is
  NaN (callers with concrete values reject it before calling).
  ``LearningRate * Alpha * M_new / D`` is evaluated left to right, so
  ``LearningRate * Alpha`` is a scalar product.

  Returns:
    ``(U, M_new, V_new)`` with ``X + U == X_new`` to the bit.
  """
  s = directml_adam_scalars(learning_rate, T, beta1=beta1, beta2=beta2, epsilon=epsilon)
  return directml_adam_elementwise(like(s, X.dtype), X, G, M, V)


# -- ONNX Runtime AdamWOptimizer (com.microsoft) ---------------------------------------


class OrtAdamWScalars(NamedTuple):
  """The per-update scalars of ONNX Runtime's ``AdamWOptimizer``.

  ``alpha_correction`` and ``one_over_beta_correction`` (``adam_mode = 0``
  only) are 1 without bias correction (``correct_bias = 0``).
  ``lr_corrected`` and ``lr_weight_decay`` (``lr * weight_decay``, a scalar
  product in the kernel) are used by ``adam_mode = 1`` only.

  ``M2 / beta_correction`` is evaluated as ``M2 * (1 / beta_correction)``:
  XLA rewrites a division by a broadcast scalar into that product anyway (on
  the CPU, eager or jitted), so the rule says it, and the reciprocal is a
  scalar of the update. It is one rounding more than the kernel's quotient.

  ``weight_decay`` is None when it is the Python number 0: the decay
  ``W - W * lr * 0`` is ``W`` to the bit for finite ``W``, so it is not
  traced and the update is a single subtraction.
  """

  lr: Any
  alpha: Any
  beta: Any
  one_minus_alpha: Any
  one_minus_beta: Any
  epsilon: Any
  weight_decay: Any
  alpha_correction: Any
  one_over_beta_correction: Any
  lr_corrected: Any
  lr_weight_decay: Any


def _check_adam_mode(adam_mode: Any, correct_bias: Any) -> None:
  """``adam_mode`` in {0, 1}; ``correct_bias`` in {0, 1} and 1 in mode 0, as ONNX Runtime enforces."""
  integer = isinstance(adam_mode, numbers.Integral) and not isinstance(adam_mode, bool)
  if not integer or adam_mode not in ADAM_MODES:
    raise ValueError(f"adam_mode must be 0 (PyTorch's AdamW) or 1 (Hugging Face's AdamW), got {adam_mode!r}")
  if not isinstance(correct_bias, numbers.Integral) or correct_bias not in (0, 1):
    raise ValueError(f"correct_bias must be a bool (or 0 / 1), got {correct_bias!r}")
  if adam_mode == 0 and not correct_bias:
    raise ValueError(
      "correct_bias=False with adam_mode=0: ONNX Runtime's AdamWOptimizer refuses this pair "
      "(mode 0 is PyTorch's AdamW, which always corrects the bias); use adam_mode=1 for no correction"
    )


def ort_adamw_scalars(
  R: ArrayLike,
  T: ArrayLike,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  epsilon: ArrayLike,
  weight_decay: ArrayLike,
  adam_mode: int,
  correct_bias: bool | int,
) -> OrtAdamWScalars:
  """The bias corrections, ``lr_corrected``, ``1 - alpha``, ``1 - beta``, ``lr * weight_decay``::

      correct_bias = 1:  alpha_correction = 1 - alpha^step
                         beta_correction  = 1 - beta^step
                         lr_corrected     = lr * Sqrt(beta_correction) / alpha_correction
      correct_bias = 0:  alpha_correction = beta_correction = 1, lr_corrected = lr

  ``T`` is the kernel's ``step`` input: 1 at the first update. The bias
  corrections are the spec's numbers in the hyperparameters' dtype, without
  cancellation (:func:`_one_minus_power`); the CPU kernel rounds
  ``pow(alpha, step)`` to float32 before subtracting it from 1 (docs/spec.md,
  section 5, says what that changes).
  """
  _check_adam_mode(adam_mode, correct_bias)
  alpha_correction: Any
  beta_correction: Any
  lr_corrected: Any
  if correct_bias:
    T = jnp.asarray(T)
    alpha_correction = _one_minus_power(alpha, T)
    beta_correction = _one_minus_power(beta, T)
    lr_corrected = R * jnp.sqrt(beta_correction) / alpha_correction
  else:
    alpha_correction, beta_correction, lr_corrected = 1, 1, R
  decay = None if _is_static_zero(weight_decay) else weight_decay
  return OrtAdamWScalars(
    R,
    alpha,
    beta,
    _one_minus(alpha),
    _one_minus(beta),
    epsilon,
    decay,
    alpha_correction if adam_mode == 0 else None,
    1 / beta_correction if adam_mode == 0 else None,
    lr_corrected if adam_mode == 1 else None,
    # jnp: two Python floats would multiply in float64, an injected pair in float32.
    None if decay is None or adam_mode == 0 else jnp.multiply(R, decay),
  )


def ort_adamw_elementwise(
  s: OrtAdamWScalars,
  X: Array | None,
  G: Array,
  M1: Array,
  M2: Array,
  *,
  adam_mode: int,
) -> tuple[Array, Array, Array]:
  """The element-wise part of ONNX Runtime's ``AdamWOptimizer``, in the kernel's order::

      adam_mode = 0 (PyTorch's AdamW):
        W     = W - W * lr * weight_decay
        M1    = alpha * M1 + (1 - alpha) * G
        M2    = beta * M2 + (1 - beta) * G * G
        W_new = W - (lr * M1) / (alpha_correction * (Sqrt(M2 / beta_correction) + epsilon))
      adam_mode = 1 (Hugging Face's AdamW):
        M1    = alpha * M1 + (1 - alpha) * G
        M2    = beta * M2 + (1 - beta) * G * G
        W     = W - lr_corrected * M1 / (Sqrt(M2) + epsilon)
        W_new = W - (lr * weight_decay) * W

  ``M2 / beta_correction`` is ``M2 * (1 / beta_correction)`` (see
  :class:`OrtAdamWScalars`); every other operation is the kernel's, in its
  order.

  Returns ``(U, M1_new, M2_new)``. Without weight decay (``s.weight_decay``
  None) ``U`` is the negated step and ``X + U`` is ``W_new`` to the bit;
  otherwise ``U = W_new - X``, exact whenever ``W_new`` and ``X`` are within
  a factor of two of each other (Sterbenz), within one ulp of
  ``max(|X|, |W_new|)`` in general.
  """
  if adam_mode not in ADAM_MODES:
    raise ValueError(f"adam_mode must be 0 or 1, got {adam_mode!r}")
  decays = s.weight_decay is not None
  if decays and X is None:
    raise ValueError("weight_decay multiplies W: the parameters must be read")
  M1_new = s.alpha * M1 + s.one_minus_alpha * G
  M2_new = s.beta * M2 + s.one_minus_beta * G * G
  if adam_mode == 0:
    # M2 / beta_correction, as M2 * (1 / beta_correction): see OrtAdamWScalars.
    step = (s.lr * M1_new) / (s.alpha_correction * (_sqrt(M2_new * s.one_over_beta_correction) + s.epsilon))
    if not decays:
      return -step, M1_new, M2_new
    W = X - X * s.lr * s.weight_decay
    return (W - step) - X, M1_new, M2_new
  step = s.lr_corrected * M1_new / (_sqrt(M2_new) + s.epsilon)
  if not decays:
    return -step, M1_new, M2_new
  W = X - step
  return (W - s.lr_weight_decay * W) - X, M1_new, M2_new


def ort_adamw(
  R: ArrayLike,
  T: ArrayLike,
  X: Array,
  G: Array,
  M1: Array,
  M2: Array,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  epsilon: ArrayLike,
  weight_decay: ArrayLike,
  adam_mode: int,
  correct_bias: bool | int,
) -> tuple[Array, Array, Array]:
  """ONNX Runtime ``AdamWOptimizer`` (com.microsoft, v1) on one tensor.

  ``R`` is the kernel's ``lr`` input, ``T`` its ``step`` (1 at the first
  update), ``M1`` / ``M2`` its ``momentums_1`` / ``momentums_2``::

      alpha_correction = correct_bias ? 1 - alpha^step : 1     (likewise beta)
      adam_mode = 0 (PyTorch's AdamW):
        W     = W - W * lr * weight_decay
        M1    = alpha * M1 + (1 - alpha) * G
        M2    = beta * M2 + (1 - beta) * G * G
        W_new = W - (lr * M1) / (alpha_correction * (Sqrt(M2 / beta_correction) + epsilon))
      adam_mode = 1 (Hugging Face's AdamW):
        lr_corrected = lr * Sqrt(beta_correction) / alpha_correction
        M1, M2 as above
        W     = W - lr_corrected * M1 / (Sqrt(M2) + epsilon)
        W_new = W - lr * weight_decay * W

  This is not ``optax.adamw``: see :func:`onnx_optax.ort_adamw`.

  Returns:
    ``(U, M1_new, M2_new)``, ``U`` as in :func:`ort_adamw_elementwise`.
  """
  s = ort_adamw_scalars(
    R,
    T,
    alpha=alpha,
    beta=beta,
    epsilon=epsilon,
    weight_decay=weight_decay,
    adam_mode=adam_mode,
    correct_bias=correct_bias,
  )
  return ort_adamw_elementwise(like(s, X.dtype), X, G, M1, M2, adam_mode=adam_mode)


# -- ONNX Runtime SGDOptimizerV2 (com.microsoft) ---------------------------------------


class OrtSGDScalars(NamedTuple):
  """The per-update scalar of ONNX Runtime's ``SGDOptimizerV2``: ``lr``."""

  lr: Any


def ort_sgd_scalars(R: ArrayLike, T: ArrayLike) -> OrtSGDScalars:
  """``lr``; ``T`` is not read (the operator has no update count)."""
  del T
  return OrtSGDScalars(R)


def ort_sgd_elementwise(s: OrtSGDScalars, X: Array | None, G: Array) -> tuple[Array]:
  """The element-wise part of ``SGDOptimizerV2``: ``W_new = W + (-lr * G)``.

  Returns ``(U,)`` with ``U = -lr * G`` (the negation is of the scalar, exact),
  so ``X + U`` is the kernel's ``W_new`` to the bit. ``X`` is not read.
  """
  del X
  return (-s.lr * G,)


def ort_sgd(R: ArrayLike, T: ArrayLike, X: Array, G: Array) -> tuple[Array]:
  """ONNX Runtime ``SGDOptimizerV2`` (com.microsoft, v1) on one tensor::

      W_new = W + (-lr * G)

  Returns:
    ``(U,)`` with ``X + U == W_new`` to the bit.
  """
  return ort_sgd_elementwise(like(ort_sgd_scalars(R, T), X.dtype), X, G)


# -- PyTorch-order twins (torch.optim.SGD, Adagrad, Adam, AdamW) ------------------------
#
# The same rules as ONNX Momentum, ONNX Adagrad and ONNX Runtime's AdamW (mode 0) in exact
# arithmetic, in the order and with the scalar conventions of PyTorch 2.13's own kernels
# (torch/optim/sgd.py `_single_tensor_sgd`, adagrad.py `_single_tensor_adagrad`, adam.py
# `_single_tensor_adam`; docs/spec.md, "PyTorch-order twins"), so that a run carried from
# PyTorch continues in float32 as PyTorch would have. They are twins with their own names:
# the ONNX and ONNX Runtime rules above keep their spec's order.
#
# Conventions (each one PyTorch's):
#
# * Every PyTorch operation (`mul_`, `add_`, `lerp_`, `addcmul_`, `addcdiv_`, `sqrt`, ...)
#   computes in its "opmath" dtype (float32 for float32, bfloat16 and float16 tensors,
#   float64 for float64) and stores its result in its output's dtype: `_stored` rounds there.
# * Within one operation the element-wise part follows PyTorch's vectorized CPU code, which
#   uses a fused multiply-add for `add(other, alpha)`, `lerp` and `addcmul` (measured: every
#   element of torch 2.13's CPU results is the FMA's): such a product is written `a * b + c`,
#   and XLA contracts it (XLA:CPU and XLA:GPU allow LLVM's contraction). A product that
#   PyTorch stores before adding (`buf.mul_(momentum).add_(...)`, `param.mul_(1 - lr*wd)`,
#   `exp_avg_sq.mul_(beta2)`) goes through `_stored`, whose addition of a run-time -0.0
#   (exact: x + -0.0 is x for every x, signed zeros included) keeps LLVM from contracting it.
# * The scalars are Python floats in PyTorch, computed in float64 (`1 - beta2`,
#   `1 - lr * weight_decay`, `lr / (1 - beta1**step)`, ...) and rounded once to the opmath
#   dtype by the kernel. Here those that depend only on the hyperparameters are computed in
#   float64 on the host when the hyperparameters are Python numbers; those that depend on the
#   step are computed at the update in the widest float dtype JAX has (float64 under
#   `jax_enable_x64`, where they are PyTorch's; else float32, see `_pytorch_power_complement`).


def _torch_opmath(*dtypes: Any) -> Any:
  """The dtype PyTorch's CPU kernels compute in: float64 if any tensor is, else float32."""
  return jnp.float64 if any(jnp.dtype(d) == jnp.float64 for d in dtypes) else jnp.float32


def _stored(x: Array, dtype: DTypeLike, neg_zero: Array | None = None) -> Array:
  """``x`` (in the opmath dtype) as PyTorch stores an operation's result in ``dtype``.

  Narrower than ``x``: rounded to ``dtype``'s precision and range, kept in ``x``'s
  dtype (``lax.reduce_precision``, round to nearest even, as PyTorch's conversion).
  The same dtype: ``x`` itself, or, for a product that PyTorch stores and then adds
  (``neg_zero`` given), ``x + neg_zero``: a run-time ``-0.0`` that XLA cannot fold, so
  that LLVM does not contract the product into the next addition (``x + -0.0`` is ``x``
  for every ``x``, signed zeros included).
  """
  dtype = jnp.dtype(dtype)
  if dtype != x.dtype:
    info = jnp.finfo(dtype)
    return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)
  return x if neg_zero is None else x + neg_zero


def _in_place(x_new: Array, X: Array) -> Array:
  """The additive update of a rule that writes ``X_new`` in place: ``X_new - X`` in ``X``'s dtype.

  ``X + (X_new - X)`` is ``X_new`` to the bit when the two are within a factor of two of each
  other (Sterbenz); where a step shrinks a parameter below half its magnitude ``X_new`` may be
  finer than the spacing of ``X``, out of reach of any addition to ``X``: one rounding off.
  """
  return x_new.astype(X.dtype) - X


def _added(x: Array | None, q: Array, X: Array | None, dt: Any, G: Array) -> Array:
  """The update of a rule whose last operation is PyTorch's ``param + q`` (``addcdiv_``).

  In the parameters' own dtype ``q`` itself is the update: ``optax.apply_updates`` adds it
  to ``X`` with the one rounding of PyTorch's sum. For parameters narrower than the opmath
  dtype PyTorch adds in float32 and rounds once to the parameters' dtype, which an update
  rounded to that dtype cannot: ``X_new - X`` then (``_in_place``).
  """
  if G.dtype == dt:
    return q
  if x is None or X is None:
    raise ValueError(
      f"{G.dtype} parameters are updated in float32 and rounded once, in place: call "
      f"update(grads, state, params)"
    )
  return _in_place(x + q, X)


def _pytorch_power_complement(beta: float, step: Array, dtype: DTypeLike) -> Array:
  """PyTorch's bias correction ``1 - beta**step`` (Python floats: float64) in ``dtype``.

  float64: the same expression as PyTorch's. float32 (no ``jax_enable_x64``): ``-expm1(step *
  log(beta))`` with ``log(beta)`` taken on the host in float64 (the float32 ``beta`` is not
  PyTorch's ``beta``): a few float32 ulps from PyTorch's rounded float64 value.
  """
  step = jnp.asarray(step, dtype)
  if jnp.dtype(dtype) == jnp.float64:
    return 1 - jnp.asarray(beta, dtype) ** step
  if beta == 0:
    return jnp.ones((), dtype)
  return -jnp.expm1(step * jnp.asarray(math.log(beta), dtype))


def _scalar_dtype() -> Any:
  """float64 under ``jax_enable_x64``, else float32: where step-dependent scalars are computed."""
  return jnp.result_type(float)


def _host_or_traced(value: Any, f: Any) -> Any:
  """``f(value)`` in Python float64 for a Python number, in JAX for an array."""
  if isinstance(value, numbers.Real) and not isinstance(value, bool):
    return f(float(value))
  return f(jnp.asarray(value))


def _neg_zero(count: ArrayLike) -> Array:
  """``-0.0`` computed from the update count at run time (see :func:`_stored`)."""
  return jnp.where(jnp.asarray(count) < -1, 1.0, -0.0).astype(_scalar_dtype())


def _divide_by_scalar(a: Array, b: Array) -> Array:
  """``a / b`` correctly rounded, as PyTorch divides, for a scalar ``b``.

  XLA rewrites a division by a broadcast scalar into a product with its reciprocal (one
  rounding more). Markstein's correction undoes it: with ``r = 1 / b`` (a scalar division, which
  XLA keeps) and ``q = a * r``, the residual ``a - q * b`` is exact as one fused multiply-add
  (XLA contracts it), and ``q + residual * r`` is the correctly rounded quotient.
  """
  r = 1 / b
  q = a * r
  return (a - q * b) * r + q


class PyTorchSGDScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_sgd`: ``-lr``, ``momentum`` (None when it
  is the Python number 0: plain SGD), ``1 - dampening``, ``weight_decay``; ``first`` (a bool:
  PyTorch has no momentum buffer yet) and ``neg_zero``."""

  neg_lr: Any
  momentum: Any
  one_minus_dampening: Any
  weight_decay: Any
  first: Any
  neg_zero: Any


def pytorch_sgd_scalars(
  lr: ArrayLike, count: ArrayLike, *, momentum: float, dampening: float, weight_decay: float
) -> PyTorchSGDScalars:
  """``-lr``, ``1 - dampening`` (Python float64, as PyTorch's ``alpha``), ``first = count == 0``.

  ``count`` is the number of updates done (PyTorch's SGD keeps a momentum buffer from its
  first step on: ``count > 0`` means there is one). ``1 - dampening`` is None when it is 1.
  """
  one_minus_dampening = _host_or_traced(dampening, lambda d: 1 - d)
  if _is_static(one_minus_dampening, 1):
    one_minus_dampening = None
  return PyTorchSGDScalars(
    _host_or_traced(lr, lambda r: -r),
    None if _is_static_zero(momentum) else momentum,
    one_minus_dampening,
    None if _is_static_zero(weight_decay) else weight_decay,
    jnp.asarray(count) == 0,
    _neg_zero(count),
  )


def pytorch_sgd_elementwise(
  s: PyTorchSGDScalars,
  X: Array | None,
  G: Array,
  buf: Array,
  *,
  nesterov: bool,
  maximize: bool,
) -> tuple[Array, Array]:
  """``torch.optim.SGD``'s step on one tensor, in ``_single_tensor_sgd``'s order::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                   if weight_decay != 0
      buf  = grad.clone() at the first step, else
             buf.mul_(momentum).add_(grad, alpha=1 - dampening)     if momentum != 0
      grad = grad.add(buf, alpha=momentum) if nesterov, else buf    if momentum != 0
      param.add_(grad, alpha=-lr)

  ``X``, ``G`` and ``buf`` in their own dtypes; computes in PyTorch's opmath dtype. Without
  momentum (``s.momentum`` None) ``buf`` is returned as it is. Returns ``(U, buf_new)``:
  ``param.add_`` is one fused multiply-add with the parameter, so the update is ``X_new - X``
  (``_in_place``), in ``X``'s dtype.
  """
  if X is None:
    raise ValueError("this update writes the parameters in place: call update(grads, state, params)")
  dt = _torch_opmath(X.dtype, G.dtype, buf.dtype)
  x, g, nz = X.astype(dt), G.astype(dt), jnp.asarray(s.neg_zero, dt)
  g_dtype = jnp.promote_types(G.dtype, X.dtype)
  if maximize:
    g = -g
  if s.weight_decay is not None:
    g = _stored(x * s.weight_decay + g, g_dtype)
  buf_new = buf
  if s.momentum is not None:
    b = buf.astype(dt)
    decayed = _stored(b * s.momentum, buf.dtype, nz)
    damped = g + decayed if s.one_minus_dampening is None else g * s.one_minus_dampening + decayed
    b_new = jnp.where(s.first, _stored(g, buf.dtype), _stored(damped, buf.dtype))
    buf_new = b_new.astype(buf.dtype)
    g = _stored(b_new * s.momentum + g, jnp.promote_types(g_dtype, buf.dtype)) if nesterov else b_new
  return _in_place(g * s.neg_lr + x, X), buf_new


class PyTorchAdagradScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_adagrad`: ``-clr``, ``eps``, ``weight_decay``."""

  neg_clr: Any
  eps: Any
  weight_decay: Any


def pytorch_adagrad_scalars(
  lr: ArrayLike, count: ArrayLike, *, lr_decay: float, eps: float, weight_decay: float
) -> PyTorchAdagradScalars:
  """``clr = lr / (1 + (step - 1) * lr_decay)`` with ``step = count + 1`` (PyTorch's step after its
  increment), in float64 under ``jax_enable_x64``, else float32."""
  if _is_static_zero(lr_decay):
    neg_clr = _host_or_traced(lr, lambda r: -r)
  else:
    dtype = _scalar_dtype()
    neg_clr = -(jnp.asarray(lr, dtype) / (1 + jnp.asarray(count, dtype) * jnp.asarray(lr_decay, dtype)))
  return PyTorchAdagradScalars(neg_clr, eps, None if _is_static_zero(weight_decay) else weight_decay)


def pytorch_adagrad_elementwise(
  s: PyTorchAdagradScalars,
  X: Array | None,
  G: Array,
  state_sum: Array,
  *,
  maximize: bool,
) -> tuple[Array, Array]:
  """``torch.optim.Adagrad``'s step on one tensor, in ``_single_tensor_adagrad``'s order::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)        if weight_decay != 0
      clr  = lr / (1 + (step - 1) * lr_decay)
      state_sum.addcmul_(grad, grad, value=1)
      std  = state_sum.sqrt().add_(eps)
      param.addcdiv_(grad, std, value=-clr)

  Returns ``(U, sum_new)``: ``U`` is ``addcdiv_``'s addend (``_added``), ``X`` is read
  only for ``weight_decay`` and for parameters narrower than float32 (else it may be None).
  """
  dt = _torch_opmath(G.dtype, state_sum.dtype)
  x, g = None if X is None else X.astype(dt), G.astype(dt)
  if maximize:
    g = -g
  if s.weight_decay is not None:
    if x is None:
      raise ValueError("weight_decay multiplies the parameters: call update(grads, state, params)")
    g = _stored(x * s.weight_decay + g, G.dtype)
  sum_new = _stored(g * g + state_sum.astype(dt), state_sum.dtype)
  std = _stored(_stored(_sqrt(sum_new), state_sum.dtype) + s.eps, state_sum.dtype)
  return _added(x, (s.neg_clr * g) / std, X, dt, G), sum_new.astype(state_sum.dtype)


class PyTorchAdamScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_adam`.

  ``one_minus_beta1`` is the lerp weight ``1 - beta1``, ``decay_factor`` AdamW's
  ``1 - lr * weight_decay`` (None without decoupled decay), ``weight_decay`` Adam's coupled
  coefficient (None without), ``neg_step_size`` ``-lr / bias_correction1``.
  """

  one_minus_beta1: Any
  beta2: Any
  one_minus_beta2: Any
  eps: Any
  decay_factor: Any
  weight_decay: Any
  neg_step_size: Any
  bias_correction2_sqrt: Any
  neg_zero: Any


def pytorch_adam_scalars(
  lr: ArrayLike,
  count: ArrayLike,
  *,
  beta1: float,
  beta2: float,
  eps: float,
  weight_decay: float,
  decoupled_weight_decay: bool,
) -> PyTorchAdamScalars:
  """PyTorch's scalars, with ``step = count + 1`` (its step after the increment)::

      bias_correction1      = 1 - beta1 ** step
      bias_correction2      = 1 - beta2 ** step
      step_size             = lr / bias_correction1
      bias_correction2_sqrt = bias_correction2 ** 0.5

  and the hyperparameters' ``1 - beta1``, ``1 - beta2``, ``1 - lr * weight_decay`` (Python
  float64 when they are Python numbers, as PyTorch computes them).
  """
  dtype = _scalar_dtype()
  step = jnp.asarray(count, dtype) + 1
  bias_correction1 = _pytorch_power_complement(beta1, step, dtype)
  bias_correction2 = _pytorch_power_complement(beta2, step, dtype)
  decays = not _is_static_zero(weight_decay)
  decay_factor = None
  if decays and decoupled_weight_decay:
    decay_factor = (
      1 - float(lr) * float(weight_decay)
      if isinstance(lr, numbers.Real)
      else 1 - jnp.asarray(lr, dtype) * weight_decay
    )
  return PyTorchAdamScalars(
    1 - beta1,
    beta2,
    1 - beta2,
    eps,
    decay_factor,
    weight_decay if decays and not decoupled_weight_decay else None,
    -(jnp.asarray(lr, dtype) / bias_correction1),
    jnp.sqrt(bias_correction2),
    _neg_zero(count),
  )


def _lerp(start: Array, end: Array, weight: Any, *, small: bool) -> Array:
  """``start.lerp_(end, weight)`` as PyTorch's vectorized CPU kernel: one fused multiply-add.

  ``small`` (``|weight| < 0.5``, known when the update is traced): ``start + weight * (end -
  start)``; else ``end + (weight - 1) * (end - start)`` (``weight - 1`` is exact in the
  opmath dtype for ``weight`` in ``[0.5, 1]``, Sterbenz).
  """
  if small:
    return weight * (end - start) + start
  return (weight - 1) * (end - start) + end


def pytorch_adam_elementwise(
  s: PyTorchAdamScalars,
  X: Array | None,
  G: Array,
  exp_avg: Array,
  exp_avg_sq: Array,
  *,
  maximize: bool,
  lerp_small: bool,
) -> tuple[Array, Array, Array]:
  """``torch.optim.Adam`` / ``AdamW``'s step on one tensor, in ``_single_tensor_adam``'s order::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)               AdamW (decoupled), weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)      Adam (coupled), weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
      param.addcdiv_(exp_avg, denom, value=-step_size)

  ``lerp_small`` is ``|1 - beta1| < 0.5``, the branch of PyTorch's lerp. Returns
  ``(U, exp_avg_new, exp_avg_sq_new)``: ``U`` is ``addcdiv_``'s addend (``_added``),
  ``X_new - X`` for AdamW (``_in_place``). ``X`` is read only for ``weight_decay`` and
  for parameters narrower than float32 (else it may be None).
  """
  dt = _torch_opmath(G.dtype, exp_avg.dtype, exp_avg_sq.dtype)
  x, g, nz = None if X is None else X.astype(dt), G.astype(dt), jnp.asarray(s.neg_zero, dt)
  if x is None and (s.decay_factor is not None or s.weight_decay is not None):
    raise ValueError("weight_decay multiplies the parameters: call update(grads, state, params)")
  if maximize:
    g = -g
  if s.decay_factor is not None:
    x = _stored(x * s.decay_factor, G.dtype, nz)
  if s.weight_decay is not None:
    g = _stored(x * s.weight_decay + g, G.dtype)
  m = _stored(_lerp(exp_avg.astype(dt), g, s.one_minus_beta1, small=lerp_small), exp_avg.dtype)
  v2 = _stored(exp_avg_sq.astype(dt) * s.beta2, exp_avg_sq.dtype, nz)
  v = _stored((s.one_minus_beta2 * g) * g + v2, exp_avg_sq.dtype)
  root = _stored(_sqrt(v), exp_avg_sq.dtype)
  denom = _stored(
    _stored(_divide_by_scalar(root, s.bias_correction2_sqrt), exp_avg_sq.dtype) + s.eps,
    exp_avg_sq.dtype,
    nz,
  )
  q = (s.neg_step_size * m) / denom
  if s.decay_factor is not None:  # AdamW's decayed parameter is stored first: no addition to X.
    assert x is not None and X is not None  # checked above
    return _in_place(x + q, X), m.astype(exp_avg.dtype), v.astype(exp_avg_sq.dtype)
  U = _added(x, q, X, dt, G)
  return U, m.astype(exp_avg.dtype), v.astype(exp_avg_sq.dtype)


# -- Keras-order twin (keras.optimizers.Adam) ------------------------------------------------


class KerasAdamScalars(NamedTuple):
  """The per-update inputs of :func:`onnx_optax.keras_adam`: the learning rate and the count
  (Keras's ``iterations``); Keras computes its scalars from them in each variable's dtype."""

  lr: Any
  count: Any


def keras_adam_scalars(lr: ArrayLike, count: ArrayLike) -> KerasAdamScalars:
  """``(lr, count)``: Keras derives ``alpha`` per variable, in the variable's dtype."""
  return KerasAdamScalars(lr, count)


def keras_adam_elementwise(
  s: KerasAdamScalars,
  X: Array | None,
  G: Array,
  m: Array,
  v: Array,
  *,
  beta_1: float,
  beta_2: float,
  epsilon: float,
) -> tuple[Array, Array, Array]:
  """Keras 3 ``Adam.update_step`` on one variable, its expressions in its order::

      local_step = cast(iterations + 1);  lr = cast(learning_rate)
      alpha = lr * sqrt(1 - cast(beta_2) ** local_step) / (1 - cast(beta_1) ** local_step)
      m += (g - m) * (1 - beta_1)
      v += (square(g) - v) * (1 - beta_2)
      variable -= (m * alpha) / (sqrt(v) + epsilon)

  ``1 - beta_1`` and ``1 - beta_2`` are Python float64 numbers rounded once, as Keras's
  Python arithmetic gives them; the rest is in the variable's dtype. Written as Keras's
  JAX backend writes it, so that XLA compiles it as it compiles Keras's jitted step
  (``model.fit``). ``X`` is not read: ``variable -= step`` is ``X + (-step)`` to the bit.
  Returns ``(U, m_new, v_new)``, in the gradient's (the variable's) dtype.
  """
  del X  # Keras subtracts the step from the variable: the update is the negated step.
  dt = G.dtype
  g = G
  lr = jnp.asarray(s.lr).astype(dt)
  local_step = jnp.asarray(s.count).astype(dt) + jnp.asarray(1, dt)
  beta_1_power = jnp.power(jnp.asarray(beta_1, dt), local_step)
  beta_2_power = jnp.power(jnp.asarray(beta_2, dt), local_step)
  alpha = lr * jnp.sqrt(1 - beta_2_power) / (1 - beta_1_power)
  m_new = m + (g - m) * (1 - beta_1)
  v_new = v + (jnp.square(g) - v) * (1 - beta_2)
  return -((m_new * alpha) / (_sqrt(v_new) + epsilon)), m_new, v_new
