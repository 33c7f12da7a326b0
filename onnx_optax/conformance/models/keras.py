"""``keras_adam``'s bound model (Keras's ``Adam.update_step``): its bounds and its per-update scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import host
from onnx_optax.conformance.models.directml import directml_adam_bounds
from onnx_optax.conformance.tolerance import Bounded, Context, scalar_context

__all__ = ["keras_adam_bounds", "keras_adam_scalars"]


def keras_adam_bounds(c: Context, R, T, X, G, m, v, *, beta_1, beta_2, epsilon):
  """Keras's ``Adam.update_step`` (``T`` its ``iterations``); its expectation is DirectML Adam
  at ``T + 1`` (``directml_adam_bounds`` bounds that)."""
  if c.hyper_dtype is None:
    return directml_adam_bounds(c, R, T + 1, X, G, m, v, beta1=beta_1, beta2=beta_2, epsilon=epsilon)
  s = scalar_context(c)

  def bound() -> Bounded:
    root = s.sqrt(s.power_complement(beta_2, T + 1))
    return s.div(s.mul(s.const(R), root), s.power_complement(beta_1, T + 1))

  alpha = c.to_elementwise(c.value("alpha", bound))
  X, G, m, v = c.exact(X), c.exact(G), c.exact(m), c.exact(v)
  m_new = c.add(m, c.mul(c.sub(G, m), host(c, 1 - beta_1)))
  v_new = c.add(v, c.mul(c.sub(c.mul(G, G), v), host(c, 1 - beta_2)))
  step = c.div(c.mul(m_new, alpha), c.add(c.sqrt(v_new), c.const(epsilon)))
  X_new = c.finish(X, step)
  return X_new, c.store(m_new), c.store(v_new), c.update_of(X, X_new, step)


def keras_adam_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  alpha = R * o.sqrt(1 - o.power(h["beta_2"], T)) / (1 - o.power(h["beta_1"], T))
  return {"R": R, "alpha": alpha}


tolerance.register_model("keras_adam", bounds=keras_adam_bounds, scalars=keras_adam_scalars)
