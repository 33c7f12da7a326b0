"""``pytorch_asgd``'s bound model (``_single_tensor_asgd``'s order): its bounds and its scalars."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import alpha as alpha_of
from onnx_optax.conformance.models._shared import in_place_update, stored_like_params
from onnx_optax.conformance.tolerance import K_TRANSCENDENTAL, Bounded, Context, scalar_context

__all__ = ["pytorch_asgd_bounds", "pytorch_asgd_scalars"]

_U32 = 2.0**-24


def _next_eta_mu(
  c: Context, R: float, T: int, lambd: float, alpha: float, t0: float
) -> tuple[Bounded, Bounded]:
  """PyTorch's next ``eta = lr / (1 + lambd lr step) ** alpha`` and ``mu = 1 / max(1, step - t0)``
  (``step = T + 1``), stored in float32: the scalar context's roundings (its hyperparameters'
  included: a product, a sum, ``pow`` as ``exp(alpha log y)``, a division; a difference and a
  division), then one float32 ulp where the two roundings to float32 may part."""
  step = T + 1
  y = 1 + lambd * R * step
  # The values as stored (float32), which PyTorch's and the expectation's are.
  eta = float(np.float32(R / y**alpha))
  mu = float(np.float32(1 / max(1.0, step - t0)))
  s = scalar_context(c)
  if c.hyper_dtype is None:  # the expectation: Python float64, then PyTorch's float32
    return Bounded(eta, 4 * s.u * eta + 2 * _U32 * eta), Bounded(mu, 2 * s.u * mu + 2 * _U32 * mu)
  pow_k = (2 * K_TRANSCENDENTAL + 3) * (1 + alpha * abs(math.log(y)))
  eta_e = eta * (s.u * (8 + pow_k) + 2 * _U32)
  mu_e = mu * (s.u * (2 * (step + abs(t0)) / max(1.0, step - t0) + 2) + 2 * _U32)
  return Bounded(eta, eta_e), Bounded(mu, mu_e)


def pytorch_asgd_bounds(
  c: Context, R, T, X, G, eta, mu, ax, *, lambd, alpha, t0, weight_decay, maximize=False
):
  """``grad + weight_decay * X``; ``X * (1 - lambd * eta)`` stored; ``+ grad * (-eta)`` (one
  fused rounding); ``ax + (X_new - ax) * mu`` (each stored) where ``mu != 1``, else ``X_new``;
  the next ``eta`` and ``mu``."""
  X, G, ax = c.exact(X), c.exact(G), c.exact(ax)
  if maximize:
    G = c.exact(-G.v)
  # eta and mu: one number per parameter, given per element (each element's parameter's).
  e, m = (np.asarray(v, np.float64) for v in (eta, mu))
  g = G if weight_decay == 0 else stored_like_params(c, c.add(c.mul(X, alpha_of(c, weight_decay)), G))
  s = scalar_context(c)
  # `1 - lambd * eta_value`: Python float64 (the expectation); the scalar dtype in the twin.
  factor = c.to_elementwise(s.sub(s.exact(1.0), s.mul(s.const(lambd), s.exact(e))))
  decayed = stored_like_params(c, c.mul(X, factor))
  X_new = c.add(c.mul(g, _neg_eta(c, e)), decayed)
  X_out, U = in_place_update(c, X, X_new)
  stored = c.update(X_new)  # the parameter as PyTorch stores it, which ax copies or averages
  averaged = c.store(c.add(ax, c.mul(c.sub(stored, ax), c.exact(m))))
  copied = c.store(stored)
  ax_new = Bounded(np.where(m != 1, averaged.v, copied.v), np.where(m != 1, averaged.e, copied.e))
  eta_new, mu_new = _next_eta_mu(c, float(R), int(T), float(lambd), float(alpha), float(t0))
  shape = np.shape(e)
  eta_new, mu_new = (Bounded(np.full(shape, b.v), np.full(shape, b.e)) for b in (eta_new, mu_new))
  return X_out, eta_new, mu_new, ax_new, U


def _neg_eta(c: Context, e: np.ndarray) -> Bounded:
  """``alpha=-eta_value`` of ``param.add_(grad, ...)``: a number per element (its parameter's
  ``eta``), rounded as :func:`~onnx_optax.conformance.models._shared.alpha` rounds a scalar."""
  p = c.param or c
  if p.hyper_dtype is None:
    return Bounded(-e)
  return Bounded(-e, np.abs(np.asarray(-e).astype(p.dtype).astype(np.float64) + e))


def pytorch_asgd_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The next ``eta`` and ``mu`` are bounded analytically (``_next_eta_mu``): ``lr`` alone here."""
  return {"R": R}


tolerance.register_model("pytorch_asgd", bounds=pytorch_asgd_bounds, scalars=pytorch_asgd_scalars)
