"""``pytorch_adamax``'s bound model (``_single_tensor_adamax``'s order): its bounds and its scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import (
  alpha,
  host,
  in_place_update,
  narrow_params,
  stored_like_params,
)
from onnx_optax.conformance.tolerance import Bounded, Context, scalar_context

__all__ = ["pytorch_adamax_bounds", "pytorch_adamax_scalars"]


def _maximum(a: Bounded, b: Bounded) -> Bounded:
  """``max(a, b)``: exact (no rounding), and off by no more than the larger operand error."""
  return Bounded(np.maximum(a.v, b.v), np.maximum(a.e, b.e))


def pytorch_adamax_bounds(c: Context, R, T, X, G, m, u, *, betas, eps, weight_decay, maximize=False):
  """The lerp of the mean, ``max(beta2 * exp_inf, |g| + eps)``, then ``X - clr * m / exp_inf`` with
  ``clr = lr / (1 - beta1^step)`` (float64 under x64, else float32)."""
  s = scalar_context(c)
  b1, b2 = (float(b) for b in betas)
  complement = s.power_complement if np.dtype(s.dtype) == np.float64 else s.one_minus_power
  clr = c.to_elementwise(c.value("clr", lambda: s.div(s.const(R), complement(b1, T + 1))))
  X, G, m, u = c.exact(X), c.exact(G), c.exact(m), c.exact(u)
  if maximize:
    G = c.exact(-G.v)
  g = G if weight_decay == 0 else stored_like_params(c, c.add(c.mul(X, alpha(c, weight_decay)), G))
  weight = host(c, 1 - b1)
  if abs(1 - b1) < 0.5:  # lerp: start + weight * (end - start)
    m_new = c.add(c.mul(weight, c.sub(g, m)), m)
  else:  # end + (weight - 1) * (end - start)
    m_new = c.add(c.mul(c.sub(weight, c.exact(1.0)), c.sub(g, m)), g)
  bound = stored_like_params(c, c.add(Bounded(np.abs(g.v), g.e), alpha(c, eps)))
  u_new = _maximum(c.mul(u, c.const(b2)), bound)
  step = c.div(c.mul(clr, m_new), u_new)
  if narrow_params(c):  # Narrow parameters: X - step in the compute dtype, written in place.
    X_out, U = in_place_update(c, X, c.sub(X, step))
  else:
    X_out = c.finish(X, step)
    U = c.update_of(X, X_out, step)
  return X_out, c.store(m_new), c.store(u_new), U


def pytorch_adamax_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """``clr = lr / (1 - beta1^step)``, ``step = T + 1``."""
  beta1 = float(raw["betas"][0])
  return {"R": R, "clr": R / o.pytorch_power_complement(beta1, T)}


tolerance.register_model("pytorch_adamax", bounds=pytorch_adamax_bounds, scalars=pytorch_adamax_scalars)
