"""The numerics of the framework twins: PyTorch's opmath dtype, its stores, its scalars.

The pieces of :mod:`onnx_optax.rules`' PyTorch- and Keras-order twins that are not one
twin's, written once; each follows PyTorch 2.13's own kernels.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike, DTypeLike

__all__ = [
  "added",
  "alpha",
  "divide_by_scalar",
  "host_or_traced",
  "in_place",
  "lerp",
  "neg_zero",
  "opmath",
  "power_complement",
  "rounded_to",
  "scalar_dtype",
  "scalars_in",
  "stored",
]

# The PyTorch-order twins (torch.optim.SGD, Adagrad, Adam, AdamW) are the same rules as ONNX
# Momentum, ONNX Adagrad and ONNX Runtime's AdamW (mode 0) in exact arithmetic, in the order and
# with the scalar conventions of PyTorch 2.13's own kernels (torch/optim/sgd.py
# `_single_tensor_sgd`, adagrad.py `_single_tensor_adagrad`, adam.py `_single_tensor_adam`;
# docs/spec.md, "PyTorch-order twins"), so that a run carried from PyTorch continues in float32
# as PyTorch would have. They are twins with their own names: the ONNX and ONNX Runtime rules
# keep their spec's order.
#
# Conventions (each one PyTorch's):
#
# * Every PyTorch operation (`mul_`, `add_`, `lerp_`, `addcmul_`, `addcdiv_`, `sqrt`, ...)
#   computes in its "opmath" dtype (float32 for float32, bfloat16 and float16 tensors,
#   float64 for float64) and stores its result in its output's dtype: `stored` rounds there.
# * Within one operation the element-wise part follows PyTorch's vectorized CPU code, which
#   uses a fused multiply-add for `add(other, alpha)`, `lerp` and `addcmul` (measured: every
#   element of torch 2.13's CPU results is the FMA's): such a product is written `a * b + c`,
#   and XLA contracts it (XLA:CPU and XLA:GPU allow LLVM's contraction). A product that
#   PyTorch stores before adding (`buf.mul_(momentum).add_(...)`, `param.mul_(1 - lr*wd)`,
#   `exp_avg_sq.mul_(beta2)`) goes through `stored`, whose addition of a run-time -0.0
#   (exact: x + -0.0 is x for every x, signed zeros included) keeps LLVM from contracting it.
# * The scalars are Python floats in PyTorch, computed in float64 (`1 - beta2`,
#   `1 - lr * weight_decay`, `lr / (1 - beta1**step)`, ...) and rounded once to the opmath
#   dtype by the kernel. Here those that depend only on the hyperparameters are computed in
#   float64 on the host when the hyperparameters are Python numbers; those that depend on the
#   step are computed at the update in the widest float dtype JAX has (float64 under
#   `jax_enable_x64`, where they are PyTorch's; else float32, see `power_complement`).


def opmath(*dtypes: Any) -> Any:
  """The dtype PyTorch's CPU kernels compute in: float64 if any tensor is, else float32."""
  return jnp.float64 if any(jnp.dtype(d) == jnp.float64 for d in dtypes) else jnp.float32


def stored(x: Array, dtype: DTypeLike, neg_zero: Array | None = None) -> Array:
  """``x`` (in the opmath dtype) as PyTorch stores an operation's result in ``dtype``.

  Narrower than ``x``: rounded to ``dtype``'s precision and range, subnormals included (round to
  nearest even, as PyTorch's float32 -> float16 and float32 -> bfloat16 conversions), kept in
  ``x``'s dtype; on the CPU by those very conversions, elsewhere by :func:`rounded_to` (XLA:GPU
  may remove a pair of conversions, :func:`rounded_to` says why).

  The same dtype: ``x`` itself, or, for a product that PyTorch stores and then adds
  (``neg_zero`` given), ``x + neg_zero``: a run-time ``-0.0`` that XLA cannot fold, so
  that LLVM does not contract the product into the next addition (``x + -0.0`` is ``x``
  for every ``x``, signed zeros included).
  """
  dtype = jnp.dtype(dtype)
  if dtype != x.dtype:
    # XLA:CPU keeps the pair (it removes a pair of conversions only with its experimental
    # oneDNN custom calls): its hardware conversion, 3x faster than `rounded_to` there.
    converted = lambda x: x.astype(dtype).astype(x.dtype)  # noqa: E731
    return jax.lax.platform_dependent(x, cpu=converted, default=lambda x: rounded_to(x, dtype))
  return x if neg_zero is None else x + neg_zero


def rounded_to(x: Array, dtype: DTypeLike) -> Array:
  """``x`` rounded to the narrower ``dtype`` (nearest even), subnormals included, kept in ``x``'s dtype.

  ``lax.reduce_precision`` is the rounding XLA never removes (``x.astype(dtype).astype(x.dtype)``
  it may: ``xla_allow_excess_precision``, on by default, lets XLA:GPU drop the pair; openxla/xla
  issue 41605), but where ``dtype`` has fewer exponent bits than ``x`` (float16 from float32, any
  narrower dtype from float64) it flushes ``dtype``'s subnormals to zero. Below ``dtype``'s
  smallest normal number ``x`` is therefore rounded to a multiple of its smallest subnormal (a
  power of two: the scaling is exact) with one rounding to the nearest even integer. bfloat16 has
  float32's exponent: ``reduce_precision`` keeps its subnormals.
  """
  info, wide = jnp.finfo(dtype), jnp.finfo(x.dtype)
  rounded = jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)
  if info.nexp >= wide.nexp:
    return rounded
  quantum = float(info.smallest_subnormal)
  subnormal = jax.lax.round(x * (1 / quantum), jax.lax.RoundingMethod.TO_NEAREST_EVEN) * quantum
  return jnp.where(jnp.abs(x) < float(info.smallest_normal), subnormal.astype(x.dtype), rounded)


def alpha(value: Any, dtype: DTypeLike) -> Any:
  """A scalar as PyTorch's ``add`` kernel takes it: ``add(other, alpha=value)``, ``add_(value)``.

  ATen's CPU ``add`` converts its scalar to the tensors' own dtype (``scalar_t``: the common
  dtype ``dtype`` of the operands) before its fused multiply-add in float32: for bfloat16 and
  float16 tensors it is rounded once more, through float32 as ``c10::Half(float)`` and
  ``c10::BFloat16(float)`` round a double (``weight_decay=0.01`` is 0.010009765625 in
  bfloat16; ``eps=1e-8`` is 0 in float16). For float32 and float64 tensors ``value`` itself
  (already in the opmath dtype). PyTorch's other kernels (``mul``, ``div``, ``lerp``,
  ``addcmul``, ``addcdiv``) take their scalar in the opmath dtype.
  """
  dtype = jnp.dtype(dtype)
  if value is None or jnp.finfo(dtype).bits >= 32:
    return value
  return stored(jnp.asarray(value, jnp.float32), dtype)


def in_place(x_new: Array, X: Array) -> Array:
  """The additive update of a rule that writes ``X_new`` in place: ``X_new - X`` in ``X``'s dtype.

  ``X + (X_new - X)`` is ``X_new`` to the bit when the two are within a factor of two of each
  other (Sterbenz); where a step shrinks a parameter below half its magnitude ``X_new`` may be
  finer than the spacing of ``X``, out of reach of any addition to ``X``: one rounding off.
  Where the two are equal the update is ``-0.0`` (``X + -0.0`` is ``X``, a ``-0.0`` too), infinite
  ones included: a parameter that overflowed to ``inf`` (float16: beyond 65504) stays ``inf`` as
  in PyTorch, not ``inf + (inf - inf)``, NaN.
  """
  x_new = x_new.astype(X.dtype)
  return jnp.where(x_new == X, jnp.asarray(-0.0, X.dtype), x_new - X)


def added(x: Array | None, q: Array, X: Array | None, dt: Any, G: Array) -> Array:
  """The update of a rule whose last operation is PyTorch's ``param + q`` (``addcdiv_``).

  In the parameters' own dtype ``q`` itself is the update: ``optax.apply_updates`` adds it
  to ``X`` with the one rounding of PyTorch's sum. For parameters narrower than the opmath
  dtype PyTorch adds in float32 and rounds once to the parameters' dtype, which an update
  rounded to that dtype cannot: ``X_new - X`` then (``in_place``).
  """
  if G.dtype == dt:
    return q
  if x is None or X is None:
    raise ValueError(
      f"{G.dtype} parameters are updated in float32 and rounded once, in place: call "
      f"update(grads, state, params)"
    )
  return in_place(x + q, X)


def power_complement(beta: float, step: Array, dtype: DTypeLike) -> Array:
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


def scalar_dtype() -> Any:
  """float64 under ``jax_enable_x64``, else float32: where step-dependent scalars are computed."""
  return jnp.result_type(float)


def host_or_traced(value: Any, f: Any) -> Any:
  """``f(value)`` in Python float64 for a Python number, in JAX for an array."""
  if isinstance(value, numbers.Real) and not isinstance(value, bool):
    return f(float(value))
  return f(jnp.asarray(value))


def neg_zero(count: ArrayLike) -> Array:
  """``-0.0`` computed from the update count at run time (see :func:`stored`)."""
  return jnp.where(jnp.asarray(count) < -1, 1.0, -0.0).astype(scalar_dtype())


def divide_by_scalar(a: Array, b: Array) -> Array:
  """``a / b`` correctly rounded, as PyTorch divides, for a scalar ``b``.

  XLA rewrites a division by a broadcast scalar into a product with its reciprocal (one
  rounding more). Markstein's correction undoes it: with ``r = 1 / b`` (a scalar division, which
  XLA keeps) and ``q = a * r``, the residual ``a - q * b`` is exact as one fused multiply-add
  (XLA contracts it), and ``q + residual * r`` is the correctly rounded quotient.
  """
  r = 1 / b
  q = a * r
  return (a - q * b) * r + q


def lerp(start: Array, end: Array, weight: Any, *, small: bool) -> Array:
  """``start.lerp_(end, weight)`` as PyTorch's vectorized CPU kernel: one fused multiply-add.

  ``small`` (``|weight| < 0.5``, known when the update is traced): ``start + weight * (end -
  start)``; else ``end + (weight - 1) * (end - start)`` (``weight - 1`` is exact in the
  opmath dtype for ``weight`` in ``[0.5, 1]``, Sterbenz).
  """
  if small:
    return weight * (end - start) + start
  return (weight - 1) * (end - start) + end


def scalars_in(s: tuple, dtype: Any) -> tuple:
  """The float scalars of a twin rounded once to ``dtype`` (bool, integer and None fields kept).

  Example:
    >>> import jax.numpy as jnp
    >>> s = scalars_in((0.1, jnp.asarray(True), jnp.asarray(3, jnp.int32), None), jnp.bfloat16)
    >>> [None if v is None else str(v.dtype) for v in s]
    ['bfloat16', 'bool', 'int32', None]
  """

  def one(v):
    kind = getattr(v, "dtype", None)
    if kind is not None and (kind == jnp.bool_ or jnp.issubdtype(kind, jnp.integer)):
      return v
    return jnp.asarray(v, dtype)

  return jax.tree.map(one, s)
