"""The numerics every rule shares: scalars rounded once, ``1 - beta`` and ``1 - beta^T`` without
cancellation, and a square root with a derivative that is safe at 0.

The rules compute in two parts (:mod:`onnx_optax.rules`); these are the pieces of their
arithmetic that are not one rule's, written once.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike, DTypeLike

__all__ = [
  "is_static",
  "is_static_zero",
  "like",
  "one_minus",
  "one_minus_power",
  "plain_sqrt",
  "regularized",
  "round_inside",
  "sqrt",
]

Scalars = TypeVar("Scalars", bound=tuple)


def like(scalars: Scalars, dtype: DTypeLike) -> Scalars:
  """Rounds each scalar of a rule once to ``dtype``, the element-wise dtype.

  ``None`` fields (a term the rule leaves out) stay ``None``.
  """
  return jax.tree.map(lambda s: jnp.asarray(s, dtype=dtype), scalars)


def one_minus(decay: ArrayLike) -> Array:
  """``1 - decay``, in the hyperparameters' dtype.

  A scalar like the bias corrections, so it is rounded to ``X``'s dtype once,
  after the subtraction: bfloat16 rounds ``beta = 0.999`` to 1.0, and
  ``1 - bfloat16(beta)`` would be 0, so that ``H`` never saw a gradient. In
  float32 ``1 - float32(beta)`` is exact (Sterbenz), so float32 results are
  those of a runtime that evaluates ``(1 - beta)`` in float32, as ONNX's do.
  """
  return 1 - jnp.asarray(decay)


@jax.custom_jvp
def one_minus_power(beta: ArrayLike, T: ArrayLike) -> Array:
  """``1 - beta^T``, evaluated as ``-expm1(T * log(beta))``.

  The same number, without the cancellation of ``1 - beta**T``: for
  ``beta = 0.999`` the direct form loses about ``1 / (T * (1 - beta))`` ulps
  (hundreds in float32), this form a few. ``beta = 0`` gives 1 and
  ``beta = 1`` gives 0, as the direct form does for ``T > 0``.
  """
  return -jnp.expm1(T * jnp.log(beta))


@one_minus_power.defjvp
def _one_minus_power_jvp(primals, tangents):
  # d(1 - beta^T) / d beta = -T * beta^(T - 1), written out: differentiating
  # the expm1 form gives (expm1(x) + 1) * T / beta, which cancels when
  # beta^T << 1 (error ~ T * ulp / beta) and is 0 * inf = NaN at beta = 0.
  beta, T = primals
  beta_dot, _ = tangents
  return one_minus_power(beta, T), -T * jnp.power(beta, T - 1) * beta_dot


#: True while a caller traces element-wise parts whose derivative it supplies itself
#: (see :func:`plain_sqrt`); :func:`sqrt` is then a plain square root.
_PLAIN_SQRT: contextvars.ContextVar[bool] = contextvars.ContextVar("onnx_optax_plain_sqrt", default=False)


@contextlib.contextmanager
def plain_sqrt(plain: bool = True) -> Iterator[None]:
  """Within this context :func:`sqrt` is ``jnp.sqrt``: the same values, JAX's own derivative.

  For a caller that wraps many element-wise calls in one ``jax.custom_jvp``
  whose rule differentiates them again outside this context (with the safe
  derivative): the Optax transforms do, so that a tree of a thousand leaves
  traces and lowers one ``custom_jvp`` per update instead of one per leaf.
  ``plain_sqrt(False)`` restores the safe derivative inside such a context.
  """
  token = _PLAIN_SQRT.set(plain)
  try:
    yield
  finally:
    _PLAIN_SQRT.reset(token)


def sqrt(H: Array) -> Array:
  """``Sqrt(H)`` of a second-moment tensor, differentiated as 0 at ``H = 0``.

  ``H = 0`` wherever ``G_regularized`` has been exactly 0 at every update so
  far (a dead unit, an unused embedding row). There ``d Sqrt(H)`` is
  infinite, a zero cotangent makes inf * 0 = NaN, and that NaN poisons every
  meta-gradient (``jax.grad`` through updates w.r.t. a hyperparameter). 0 is a
  subgradient of ``|G| = Sqrt(G^2)``, at every order (Hessians through an
  update are finite too). The value is ``jnp.sqrt(H)``: the rule
  changes only the derivative, so a step that is not differentiated costs
  one square root per element and nothing more. Within :func:`plain_sqrt`
  (a caller that supplies the derivative itself) it is ``jnp.sqrt(H)``.
  """
  return jnp.sqrt(H) if _PLAIN_SQRT.get() else safe_sqrt(H)


@jax.custom_jvp
def safe_sqrt(H: Array) -> Array:
  """``jnp.sqrt(H)`` with the derivative 0 at ``H = 0`` (see :func:`sqrt`)."""
  return jnp.sqrt(H)


@safe_sqrt.defjvp
def _safe_sqrt_jvp(primals, tangents):
  (H,) = primals
  (H_dot,) = tangents
  # The root is the safe one again, so that the derivative of this rule (a
  # second derivative, a Hessian-vector product) differentiates it as 0 at
  # H = 0 too: with jnp.sqrt, d root = inf there, times the 0 cotangent of
  # the unused branch, is NaN, and every second derivative through the
  # update would be NaN. The same holds at every order. A first derivative
  # does not differentiate this rule: there safe_sqrt(H) is jnp.sqrt(H),
  # and the program is the one a plain root gives (a where-based root here
  # would add operations to every first-order meta-gradient: 25% more
  # optimized HLO on 100 leaves of ONNX Adam).
  root = safe_sqrt(H)
  zero = H == 0
  # The tangent is linear in H_dot (so that it transposes) and has no 0/0
  # on either branch: the cotangent of the unused branch is 0 / 2, not 0 / 0.
  return root, jnp.where(zero, 0, H_dot / (2 * jnp.where(zero, 1, root)))


def is_static(value: Any, number: float) -> bool:
  """True for a Python (not traced) number equal to ``number``."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and value == number


def is_static_zero(value: Any) -> bool:
  """True for a Python (not traced) number that is zero."""
  return is_static(value, 0)


def regularized(norm_coefficient: Array, X: Array | None, G: Array) -> Array:
  """``G_regularized = norm_coefficient * X + G`` (``G`` when ``X`` is not read)."""
  return G if X is None else norm_coefficient * X + G


def round_inside(x: Array, dtype: DTypeLike) -> Array:
  """``x`` rounded to the narrower ``dtype`` inside a rule's update (``x.astype(dtype)``).

  The one function through which a rule that declares
  :attr:`~onnx_optax.registry.Rule.rounds_inside` (``torch.optim.Muon``'s bfloat16 iteration)
  rounds to a lower precision, called as ``_numerics.round_inside`` (looked up at each call), so
  that a test can take every such rounding as the identity (``monkeypatch.setattr(_numerics,
  "round_inside", lambda x, dtype: x)``): the rule then computes in its input's dtype, and its
  derivatives are those ``jax.grad`` gives the rule itself (``convert_element_type``'s
  straight-through derivative), now of a function a central difference can see. A widening
  (bfloat16 to float32: exact) is no rounding and does not go through it.
  """
  return x.astype(dtype)
