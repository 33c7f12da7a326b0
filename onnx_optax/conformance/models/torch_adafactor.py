"""``pytorch_adafactor``'s bound model (``_single_tensor_adafactor``'s order): its bounds and its scalars.

Not element-wise: the norms and the row and column means are sums over a tensor, so the model
takes one tensor in its own shape (``Rule.reduces``: the check evaluates it leaf by leaf), and
its state fields in theirs. A sum of ``n`` terms computed in any order (PyTorch's reductions and
XLA's differ) is within ``gamma(n - 1) = (n - 1) k u / (1 - (n - 1) k u)`` of the sum of the
terms' magnitudes, plus the terms' own errors and an underflow per addition (Higham, "Accuracy
and Stability of Numerical Algorithms", 4.2): :func:`_sum`. Every operation of a 16-bit case is
charged at its dtype's unit roundoff, though the twin and PyTorch add in float32 (a larger bound,
never a smaller one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import host, in_place_update, stored_like_params
from onnx_optax.conformance.tolerance import K_TRANSCENDENTAL, Bounded, Context, scalar_context

__all__ = ["pytorch_adafactor_bounds", "pytorch_adafactor_scalars"]


def _sum(c: Context, a: Bounded, axis: Any) -> Bounded:
  """``a`` summed over ``axis`` (kept) in ``c``'s arithmetic, in any order."""
  v = np.sum(a.v, axis=axis, keepdims=True)
  n = a.v.size if axis is None else a.v.shape[axis]
  k = (n - 1) * c.k_add * c.u
  gamma = k / (1 - k) if k < 1 else np.inf
  e = np.sum(a.e, axis=axis, keepdims=True) + gamma * np.sum(np.abs(a.v) + a.e, axis=axis, keepdims=True)
  return Bounded(v, e + (n - 1) * c.tiny)


def _norm(c: Context, a: Bounded, axis: Any = None) -> Bounded:
  """``torch.norm(a, dim=axis, keepdim=True)``: the root of the sum of the squares."""
  return c.sqrt(_sum(c, c.mul(a, a), axis))


def _clamped(a: Bounded, floor: Bounded) -> Bounded:
  """``a.clamp(min=floor)``: max is 1-Lipschitz, so its error is at most the larger of the two."""
  return Bounded(np.maximum(a.v, floor.v), np.maximum(a.e, floor.e))


def _lerp(c: Context, start: Bounded, end: Bounded, weight: Bounded) -> Bounded:
  """``start.lerp_(end, weight)``: either of PyTorch's two branches (the computed weight picks it)."""
  diff = c.sub(end, start)
  small = c.add(c.mul(weight, diff), start)
  large = c.add(c.mul(c.sub(weight, c.exact(1.0)), diff), end)
  # The value by the exact weight's branch (PyTorch's, and the expectation's); the error either's.
  return Bounded(small.v if abs(float(weight.v)) < 0.5 else large.v, np.maximum(small.e, large.e))


def _power(s: Context, step: float, exponent: float) -> Bounded:
  """``step ** exponent`` in the scalar context: ``pow`` as ``exp(exponent log step)``, each within
  :data:`K_TRANSCENDENTAL` ulps and the product rounded (NumPy's float64 within one ulp)."""
  value = step**exponent
  if s.hyper_dtype is None:
    return Bounded(np.float64(value), np.float64(2 * s.u * value))
  x = abs(exponent * math.log(step))
  return Bounded(
    np.float64(value), np.float64(((K_TRANSCENDENTAL + 3) * (1 + x) + K_TRANSCENDENTAL) * s.u * value)
  )


def _python_max(floor: Bounded, a: Bounded) -> Bounded:
  """Python's ``max(floor, a)`` of two scalars, 1-Lipschitz as :func:`_clamped`."""
  return _clamped(a, floor)


def _python_min(a: Bounded, b: Bounded) -> Bounded:
  """Python's ``min(a, b)`` of two scalars: 1-Lipschitz, its error at most the larger of the two."""
  return Bounded(np.minimum(a.v, b.v), np.maximum(a.e, b.e))


def _scalar(a: Bounded) -> Bounded:
  """A norm kept as a tensor of one element (``keepdim``), as the scalar ``.item()`` reads."""
  return Bounded(a.v.reshape(()), a.e.reshape(()))


def pytorch_adafactor_bounds(
  c: Context, R, T, X, G, row_var, col_var, variance, *, beta2_decay, eps, d, weight_decay, maximize=False
):
  """``alpha = max(eps2, rms(X)) rho`` from ``X`` before the decay; the decay; the lerps of the row and
  column means of ``G ** 2`` (or of ``G ** 2``), ``row_var @ col_var / max(mean(row_var), eps1)``;
  ``grad / sqrt(max(var, eps1 ** 2))``; its clipped step added, written in place. The scalars
  (``step ** beta2_decay``, ``rho``, the quotients by ``sqrt(numel)``, ``alpha / denom``) are
  Python floats in PyTorch and in the expectation, the scalar dtype's in the implementation."""
  s = scalar_context(c)
  eps1, eps2 = eps
  if eps1 is None:  # the parameters' dtype's: the context's (an expectation's is float64's)
    eps1 = float(ml_dtypes.finfo(c.param.dtype if c.param is not None else c.dtype).eps)
  X, G = c.exact(X), c.exact(G)
  g = Bounded(-G.v, G.e) if maximize else G
  step = float(T) + 1.0
  numel = X.v.size
  weight = c.to_elementwise(_power(s, step, float(beta2_decay)))
  inverse_root = s.div(s.exact(1.0), s.sqrt(s.exact(step)))
  lr = s.const(R)
  rho = _python_min(lr, inverse_root)
  root_numel = s.const(math.sqrt(numel), received=False)
  rms_x = s.div(_scalar(stored_like_params(c, _norm(c, X))), root_numel)
  alpha = s.mul(_python_max(s.const(eps2), rms_x), rho)
  x = X
  if weight_decay != 0:  # param.mul_(1 - lr * weight_decay)
    x = stored_like_params(c, c.mul(X, host(c, 1 - R * weight_decay)))
  if G.v.ndim >= 2:
    r, k = c.exact(row_var), c.exact(col_var)
    # norm(grad, dim).square_().div_(size), each stored in the gradient's dtype
    means = []
    for axis in (-1, -2):
      norm = stored_like_params(c, _norm(c, g, axis))
      square = stored_like_params(c, c.mul(norm, norm))
      means.append(stored_like_params(c, c.div(square, c.exact(float(G.v.shape[axis])))))
    row_mean, col_mean = means
    r, k = _lerp(c, r, row_mean, weight), _lerp(c, k, col_mean, weight)
    var = c.mul(r, k)  # row_var @ col_var
    # mean(dim=-2): a sum and a division (or a product by the reciprocal: one rounding more)
    mean = c.mul(c.div(_sum(c, r, -2), c.exact(float(G.v.shape[-2]))), c.exact(1.0))
    var = c.div(var, _clamped(mean, c.const(eps1, received=False)))
    outputs = (c.store(r), c.store(k), c.exact(variance))
  else:
    v = _lerp(c, c.exact(variance), stored_like_params(c, c.mul(g, g)), weight)  # grad * grad
    var = v
    outputs = (c.exact(row_var), c.exact(col_var), c.store(v))
  var = _clamped(var, c.const(eps1 * eps1, received=False))
  update = c.mul(c.div(c.exact(1.0), c.sqrt(var)), g)  # rsqrt_: 1 / sqrt, then mul_(grad)
  norm_u = _norm(c, update)
  rms_u = s.div(_scalar(norm_u), s.mul(root_numel, s.const(d)))
  denom = _python_max(s.exact(1.0), rms_u)
  step_size = c.to_elementwise(s.div(alpha, denom))
  x_new = c.sub(x, c.mul(step_size, update))  # add_(update, alpha=-alpha / denom): an FMA at most
  X_out, U = in_place_update(c, X, x_new)
  return (X_out, *outputs, U)


def pytorch_adafactor_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """Only the learning rate: PyTorch's other scalars are Python floats of ``step`` and the tensors'
  norms, bounded analytically in :func:`pytorch_adafactor_bounds`."""
  return {"R": R}


tolerance.register_model(
  "pytorch_adafactor", bounds=pytorch_adafactor_bounds, scalars=pytorch_adafactor_scalars
)
