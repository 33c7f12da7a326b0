"""``pytorch_adadelta``'s bound model (``_single_tensor_adadelta``'s order): its bounds and its scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import alpha, host, in_place_update, stored_like_params
from onnx_optax.conformance.tolerance import Context

__all__ = ["pytorch_adadelta_bounds", "pytorch_adadelta_scalars"]


def pytorch_adadelta_bounds(c: Context, R, T, X, G, S, A, *, rho, eps, weight_decay, maximize=False):
  """``mul_`` + ``addcmul_`` of the mean of squared gradients, the roots of both means plus ``eps``,
  their quotient times the gradient, ``mul_`` + ``addcmul_`` of the mean of squared steps, then
  ``X - lr * delta`` written in place."""
  X, G, S, A = c.exact(X), c.exact(G), c.exact(S), c.exact(A)
  if maximize:
    G = c.exact(-G.v)
  g = G if weight_decay == 0 else stored_like_params(c, c.add(c.mul(X, alpha(c, weight_decay)), G))
  r = float(rho)
  S_new = c.add(c.mul(c.mul(host(c, 1 - r), g), g), c.mul(S, c.const(r)))
  std = c.sqrt(c.add(S_new, c.const(eps)))
  delta = c.mul(c.div(c.sqrt(c.add(A, c.const(eps))), std), g)
  A_new = c.add(c.mul(c.mul(host(c, 1 - r), delta), delta), c.mul(A, c.const(r)))
  X_out, U = in_place_update(c, X, c.sub(X, c.mul(delta, c.const(R))))
  return X_out, c.store(S_new), c.store(A_new), U


def pytorch_adadelta_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """Adadelta has no step-dependent scalar: ``lr`` itself, a Python float."""
  return {"R": R}


tolerance.register_model("pytorch_adadelta", bounds=pytorch_adadelta_bounds, scalars=pytorch_adadelta_scalars)
