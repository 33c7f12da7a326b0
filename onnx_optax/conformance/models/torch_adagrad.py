"""``pytorch_adagrad``'s bound model (``_single_tensor_adagrad``'s order): its bounds and its scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import alpha, in_place_update, narrow_params, stored_like_params
from onnx_optax.conformance.tolerance import Context, scalar_context

__all__ = ["pytorch_adagrad_bounds", "pytorch_adagrad_scalars"]


def pytorch_adagrad_bounds(c: Context, R, T, X, G, S, *, lr_decay, eps, weight_decay):
  """``_single_tensor_adagrad``: ``clr`` per update, ``sum += g * g``, ``X - clr * g / (sqrt(sum) + eps)``."""
  s = scalar_context(c)
  if lr_decay == 0:
    clr = c.const(R)  # PyTorch's lr itself, a Python float.
  else:
    T_ = s.const(float(T), received=False)
    clr = c.to_elementwise(
      c.value("clr", lambda: s.div(s.const(R), s.add(s.exact(1.0), s.mul(T_, s.const(lr_decay)))))
    )
  X, G, S = c.exact(X), c.exact(G), c.exact(S)
  g = G if weight_decay == 0 else stored_like_params(c, c.add(c.mul(X, alpha(c, weight_decay)), G))
  S_new = c.add(c.mul(g, g), S)
  step = c.div(c.mul(clr, g), c.add(c.sqrt(S_new), c.const(eps)))
  if narrow_params(c):  # Narrow parameters: X - step in the compute dtype, written in place.
    X_out, U = in_place_update(c, X, c.sub(X, step))
    return X_out, c.store(S_new), U
  X_new = c.finish(X, step)
  return X_new, c.store(S_new), c.update_of(X, X_new, step)


def pytorch_adagrad_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md); ``clr`` only where the bounds
  read it (``lr_decay = 0``: PyTorch's ``lr`` itself, a Python float)."""
  if raw["lr_decay"] == 0:
    return {"R": R}
  return {"R": R, "clr": R / (1 + T * h["lr_decay"])}  # clr = lr / (1 + (step - 1) * lr_decay)


tolerance.register_model("pytorch_adagrad", bounds=pytorch_adagrad_bounds, scalars=pytorch_adagrad_scalars)
