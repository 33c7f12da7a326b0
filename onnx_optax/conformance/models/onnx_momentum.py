"""ONNX ``Momentum``'s bound model: its rounding-error bounds and its per-update scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.tolerance import Context, scalar_context

__all__ = ["momentum_bounds", "momentum_scalars"]


def momentum_bounds(c: Context, R, T, X, G, V, *, alpha, beta, mode, norm_coefficient):
  s = scalar_context(c)
  beta_adjusted = c.to_elementwise(s.const(beta if T > 0 else 1.0))
  R_, alpha_, nc = c.rate(R), c.const(alpha), c.const(norm_coefficient)
  X, G, V = c.exact(X), c.exact(G), c.exact(V)
  G_regularized = c.add(c.mul(nc, X), G)
  V_new = c.add(c.mul(alpha_, V), c.mul(beta_adjusted, G_regularized))
  if mode == "standard":
    step = c.mul(R_, V_new)
  else:
    step = c.mul(R_, c.add(G_regularized, c.mul(alpha_, V_new)))
  X_new = c.finish(X, step)
  return X_new, c.store(V_new), c.update_of(X, X_new, step)


def momentum_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  return {"R": R}  # beta_adjusted = T > 0 ? beta : 1 is a choice, not arithmetic.


tolerance.register_model("momentum", bounds=momentum_bounds, scalars=momentum_scalars)
