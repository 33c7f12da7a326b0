"""ONNX ``Adagrad``'s bound model: its rounding-error bounds and its per-update scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.tolerance import Context, scalar_context

__all__ = ["adagrad_bounds", "adagrad_scalars"]


def adagrad_bounds(c: Context, R, T, X, G, H, *, decay_factor, epsilon, norm_coefficient):
  s = scalar_context(c)
  T_ = s.const(float(T), received=False)  # T is an integer: its rounding to float is arithmetic.
  r = c.value("r", lambda: s.div(s.const(R), s.add(s.exact(1.0), s.mul(T_, s.const(decay_factor)))))
  r, nc, eps = c.to_elementwise(r), c.const(norm_coefficient), c.const(epsilon)
  X, G, H = c.exact(X), c.exact(G), c.exact(H)
  G_regularized = c.add(c.mul(nc, X), G)
  H_new = c.add(H, c.mul(G_regularized, G_regularized))
  H_adaptive = c.add(c.sqrt(H_new), eps)
  step = c.div(c.mul(r, G_regularized), H_adaptive)
  X_new = c.finish(X, step)
  return X_new, c.store(H_new), c.update_of(X, X_new, step)


def adagrad_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  return {"R": R, "r": R / (1 + T * h["decay_factor"])}


tolerance.register_model("adagrad", bounds=adagrad_bounds, scalars=adagrad_scalars)
