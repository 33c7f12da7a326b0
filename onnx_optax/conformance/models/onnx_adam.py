"""ONNX ``Adam``'s bound model: its rounding-error bounds and its per-update scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import one_minus_power
from onnx_optax.conformance.tolerance import Bounded, Context, scalar_context

__all__ = ["adam_bounds", "adam_scalars"]


def adam_bounds(
  c: Context, R, T, X, G, V, H, *, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post
):
  s = scalar_context(c)

  def bound() -> Bounded:
    if T > 0:
      return s.div(s.mul(s.const(R), s.sqrt(s.one_minus_power(beta, T))), s.one_minus_power(alpha, T))
    return s.const(R)

  R_adjusted = c.to_elementwise(c.value("R_adjusted", bound))
  alpha_, beta_, eps = c.const(alpha), c.const(beta), c.const(epsilon)
  nc = c.const(norm_coefficient)
  X, G, V, H = c.exact(X), c.exact(G), c.exact(V), c.exact(H)
  G_regularized = c.add(c.mul(nc, X), G)
  V_new = c.add(c.mul(alpha_, V), c.mul(c.one_minus(alpha, "one_minus_alpha"), G_regularized))
  H_new = c.add(
    c.mul(beta_, H), c.mul(c.mul(c.one_minus(beta, "one_minus_beta"), G_regularized), G_regularized)
  )
  H_sqrt = c.add(c.sqrt(H_new), eps)
  step = c.div(c.mul(R_adjusted, V_new), H_sqrt)
  if norm_coefficient_post == 0:
    X_new = c.finish(X, step)
    U = c.update_of(X, X_new, step)
  else:
    X_new = c.mul(c.one_minus(norm_coefficient_post, "one_minus_post"), c.sub(X, step))
    U = c.sub(X_new, X)  # The transform's U = X_final - X (an expectation's too).
    if c.hyper_dtype is not None:  # Then X + U.
      U = c.update(U)
      X_new = c.apply(X, U)
  return X_new, c.store(V_new), c.store(H_new), U


def adam_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  R_adjusted = R * o.sqrt(one_minus_power(o, h["beta"], T)) / one_minus_power(o, h["alpha"], T)
  out = {
    "R": R,
    "R_adjusted": o.where(T > 0, R_adjusted, R),
    "one_minus_alpha": 1 - h["alpha"],
    "one_minus_beta": 1 - h["beta"],
  }
  if raw["norm_coefficient_post"] != 0:
    out["one_minus_post"] = 1 - h["norm_coefficient_post"]
  return out


tolerance.register_model("adam", bounds=adam_bounds, scalars=adam_scalars)
