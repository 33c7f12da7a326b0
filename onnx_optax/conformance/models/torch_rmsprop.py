"""``pytorch_rmsprop``'s bound model (``_single_tensor_rmsprop``'s order): its bounds and its scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models import _shared
from onnx_optax.conformance.models._shared import host, in_place_update, narrow_params, stored_like_params
from onnx_optax.conformance.tolerance import Context

__all__ = ["pytorch_rmsprop_bounds", "pytorch_rmsprop_scalars"]


def pytorch_rmsprop_bounds(c: Context, R, T, X, G, S, B, A, *, alpha, eps, weight_decay, momentum, centered):
  """``mul_`` + ``addcmul_`` of the mean of squares, the lerp of the mean (centred), the root of
  their difference plus ``eps``, then the buffer's ``mul_`` + ``addcdiv_`` and ``X - lr * buf``
  (momentum), or ``X - lr * g / avg``."""
  X, G, S, B, A = c.exact(X), c.exact(G), c.exact(S), c.exact(B), c.exact(A)
  g = G if weight_decay == 0 else stored_like_params(c, c.add(c.mul(X, _shared.alpha(c, weight_decay)), G))
  a = float(alpha)
  S_new = c.add(c.mul(c.mul(host(c, 1 - a), g), g), c.mul(S, c.const(a)))
  A_new = A
  if centered:
    weight = host(c, 1 - a)
    if abs(1 - a) < 0.5:  # lerp: start + weight * (end - start)
      A_new = c.add(c.mul(weight, c.sub(g, A)), A)
    else:  # end + (weight - 1) * (end - start)
      A_new = c.add(c.mul(c.sub(weight, c.exact(1.0)), c.sub(g, A)), g)
    avg = c.add(c.sqrt(c.sub(S_new, c.mul(A_new, A_new))), c.const(eps))
  else:
    avg = c.add(c.sqrt(S_new), c.const(eps))
  B_new = B
  if momentum > 0:
    B_new = c.add(c.mul(B, c.const(momentum)), c.div(g, avg))
    X_out, U = in_place_update(c, X, c.sub(X, c.mul(B_new, c.const(R))))
    return X_out, c.store(S_new), c.store(B_new), c.store(A_new), U
  step = c.div(c.mul(c.const(R), g), avg)
  if narrow_params(c):  # Narrow parameters: X - step in the compute dtype, written in place.
    X_out, U = in_place_update(c, X, c.sub(X, step))
  else:
    X_out = c.finish(X, step)
    U = c.update_of(X, X_out, step)
  return X_out, c.store(S_new), c.store(B_new), c.store(A_new), U


def pytorch_rmsprop_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """RMSprop has no step-dependent scalar: ``lr`` itself, a Python float."""
  return {"R": R}


tolerance.register_model("pytorch_rmsprop", bounds=pytorch_rmsprop_bounds, scalars=pytorch_rmsprop_scalars)
