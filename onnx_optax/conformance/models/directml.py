"""DirectML Adam's bound model: its rounding-error bounds and its per-update scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import one_minus_power
from onnx_optax.conformance.tolerance import Bounded, Context, scalar_context

__all__ = ["directml_adam_bounds", "directml_adam_scalars"]


def directml_adam_bounds(c: Context, R, T, X, G, M, V, *, beta1, beta2, epsilon):
  s = scalar_context(c)

  def bound() -> Bounded:
    Alpha = s.div(s.sqrt(s.one_minus_power(beta2, T)), s.one_minus_power(beta1, T))
    return s.mul(s.const(R), Alpha)

  step_size = c.to_elementwise(c.value("step_size", bound))
  b1, b2, eps = c.const(beta1), c.const(beta2), c.const(epsilon)
  X, G, M, V = c.exact(X), c.exact(G), c.exact(M), c.exact(V)
  M_new = c.add(c.mul(b1, M), c.mul(c.one_minus(beta1, "one_minus_beta1"), G))
  V_new = c.add(c.mul(b2, V), c.mul(c.mul(c.one_minus(beta2, "one_minus_beta2"), G), G))
  step = c.div(c.mul(step_size, M_new), c.add(c.sqrt(V_new), eps))
  X_new = c.finish(X, step)
  return X_new, c.store(M_new), c.store(V_new), c.update_of(X, X_new, step)


def directml_adam_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  Alpha = o.sqrt(one_minus_power(o, h["beta2"], T)) / one_minus_power(o, h["beta1"], T)
  return {
    "R": R,
    "step_size": R * Alpha,
    "one_minus_beta1": 1 - h["beta1"],
    "one_minus_beta2": 1 - h["beta2"],
  }


tolerance.register_model("directml_adam", bounds=directml_adam_bounds, scalars=directml_adam_scalars)
