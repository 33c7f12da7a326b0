"""``pytorch_sgd``'s bound model (``_single_tensor_sgd``'s order): its bounds and its per-update scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import alpha, host, in_place_update, stored_like_params
from onnx_optax.conformance.tolerance import Context

__all__ = ["pytorch_sgd_bounds", "pytorch_sgd_scalars"]


def pytorch_sgd_bounds(c: Context, R, T, X, G, buf, *, momentum, dampening, weight_decay, nesterov):
  """``_single_tensor_sgd``: ``grad + weight_decay * X``, the buffer, ``X + (-lr) * grad``."""
  X, G, buf = c.exact(X), c.exact(G), c.exact(buf)
  g = G if weight_decay == 0 else stored_like_params(c, c.add(c.mul(X, alpha(c, weight_decay)), G))
  buf_new = buf
  if momentum != 0:
    if T == 0:
      buf_new = g  # The first step copies the gradient.
    else:
      decayed = c.mul(buf, c.const(momentum))
      buf_new = c.add(g if dampening == 0 else c.mul(g, host(c, 1 - dampening)), decayed)
    g = c.add(c.mul(buf_new, c.const(momentum)), g) if nesterov else buf_new
  X_new = c.sub(X, c.mul(g, c.const(R)))
  X_out, U = in_place_update(c, X, X_new)
  return X_out, c.store(buf_new), U


def pytorch_sgd_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  return {"R": R}  # -lr and 1 - dampening are Python floats.


tolerance.register_model("pytorch_sgd", bounds=pytorch_sgd_bounds, scalars=pytorch_sgd_scalars)
