"""``pytorch_rprop``'s bound model (``_single_tensor_rprop``'s order): its bounds and its scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import in_place_update, narrow_params
from onnx_optax.conformance.tolerance import Bounded, Context

__all__ = ["pytorch_rprop_bounds", "pytorch_rprop_scalars"]


def _steps(c: Context, S: Bounded, factor: np.ndarray, etas, step_sizes) -> Bounded:
  """``clamp(step_size * factor, min, max)``: the product rounded once, the bounds as the dtype holds
  them (the clamp moves a value by no more than its error, or to a bound's rounded value)."""
  low, high = (c.const(float(b)) for b in step_sizes)
  minus, plus = (c.const(float(e)) for e in etas)
  f = Bounded(
    np.where(factor == etas[1], plus.v, np.where(factor == etas[0], minus.v, 1.0)),
    np.where(factor == etas[1], plus.e, np.where(factor == etas[0], minus.e, 0.0)),
  )
  grown = c.mul(S, f)
  return Bounded(np.clip(grown.v, low.v, high.v), np.maximum(grown.e, max(float(low.e), float(high.e))))


def pytorch_rprop_bounds(c: Context, R, T, X, G, P, S, *, etas, step_sizes, maximize=False):
  """The sign of ``g * prev`` picks each element's factor; the step size times it, clamped; the
  gradient zeroed where the sign changed; ``X - sign(g) * step_size`` (one rounding: the product is
  exact). Where the rounded product ``g * prev`` may be 0 while the exact one is not (an underflow,
  or a flushed operand), PyTorch's and the twin's factor may be 1 instead: the difference of the two
  outcomes is charged there, to every output."""
  X, G, P, S = c.exact(X), c.exact(G), c.exact(P), c.exact(S)
  if maximize:
    G = c.exact(-G.v)
  etas = tuple(float(e) for e in etas)
  product = c.mul(G, P)  # grad.mul(prev): recorded, so that subnormal operands skip the order check
  sign = np.sign(product.v)
  exact_zero = (G.v == 0) | (P.v == 0)
  unsure = (~exact_zero) & (product.e >= np.abs(product.v))  # the rounded product may be 0

  def outcome(sign: np.ndarray) -> tuple[Bounded, Bounded, Bounded]:
    factor = np.where(sign > 0, etas[1], np.where(sign < 0, etas[0], 1.0))
    step = _steps(c, S, factor, etas, step_sizes)
    g = np.where(sign < 0, 0.0, G.v)
    move = Bounded(np.sign(g) * step.v, np.abs(np.sign(g)) * step.e)
    return move, Bounded(g), step

  move, prev_new, step_new = outcome(sign)
  if np.any(unsure):
    other = outcome(np.where(unsure, 0.0, sign))
    for b, o in zip((move, prev_new, step_new), other):
      b.e = np.where(unsure, np.maximum(b.e, o.e) + np.abs(o.v - b.v), b.e)
  if narrow_params(c):  # Narrow parameters: X - move in the compute dtype, written in place.
    X_out, U = in_place_update(c, X, c.sub(X, move))
  else:
    X_out = c.finish(X, move)
    U = c.update_of(X, X_out, move)
  return X_out, c.store(prev_new), c.store(step_new), U


def pytorch_rprop_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """Rprop computes no scalar: ``lr`` itself (read by ``init`` only)."""
  return {"R": R}


tolerance.register_model("pytorch_rprop", bounds=pytorch_rprop_bounds, scalars=pytorch_rprop_scalars)
