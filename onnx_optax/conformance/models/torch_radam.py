"""``pytorch_radam``'s bound model (``_single_tensor_radam``'s order): its bounds and its scalars."""

from __future__ import annotations

import math
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
from onnx_optax.conformance.tolerance import Bounded, Context, scalar_context, unit_roundoff

__all__ = ["pytorch_radam_bounds", "pytorch_radam_scalars"]


def _rho_exact(beta2: float, step: int) -> tuple[float, float]:
  """PyTorch's ``rho_t`` and ``rect`` (Python float64, as ``_single_tensor_radam``)."""
  rho_inf = 2 / (1 - beta2) - 1
  rho_t = rho_inf - 2 * step * (beta2**step) / (1 - beta2**step)
  ratio = (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
  return rho_t, math.sqrt(max(ratio, 0.0)) if rho_t > 5 else 0.0


def pytorch_radam_bounds(
  c: Context, R, T, X, G, m, v, *, betas, eps, weight_decay, decoupled_weight_decay=False, decoupled=None
):
  """The lerp, ``mul_`` + ``addcmul_``, ``exp_avg / bias_correction1`` (a true division), ``* lr``;
  past ``rho_t > 5`` times ``reciprocal(sqrt(v) + eps) * sqrt(bias_correction2)`` and ``rect``;
  ``X - step``. ``decoupled``: ``decoupled_weight_decay`` as Adam's model names it."""
  decoupled_weight_decay = decoupled_weight_decay if decoupled is None else decoupled
  s = scalar_context(c)
  b1, b2 = (float(b) for b in betas)
  complement = s.power_complement if np.dtype(s.dtype) == np.float64 else s.one_minus_power
  bc1 = c.to_elementwise(c.value("bias_correction1", lambda: complement(b1, T + 1)))
  bc2_sqrt = c.to_elementwise(c.value("bias_correction2_sqrt", lambda: s.sqrt(complement(b2, T + 1))))
  rho_t, rect = _rho_exact(b2, int(T) + 1)
  # rho_t cancels (rho_inf - 2 step beta2^step / bc2): its error is rho_inf's scale in ulps.
  u = unit_roundoff(s.dtype)
  rho_e = 16 * u * (2 / (1 - b2))
  rho = c.value("rho_t", lambda: Bounded(np.float64(rho_t), np.float64(rho_e)))
  sensitivity = 0.5 * (1 / max(rho_t - 4, 1e-3) + 1 / max(rho_t - 2, 1e-3) + 1 / rho_t) if rho_t > 4 else 0.0
  rect_b = c.to_elementwise(
    c.value("rect", lambda: Bounded(np.float64(rect), np.float64(rect * (rho_e * sensitivity + 8 * u))))
  )
  X, G, m, v = c.exact(X), c.exact(G), c.exact(m), c.exact(v)
  x, g = X, G
  if weight_decay != 0:
    if decoupled_weight_decay:  # param.mul_(1 - lr * weight_decay)
      x = stored_like_params(c, c.mul(X, host(c, 1 - R * weight_decay)))
    else:
      g = stored_like_params(c, c.add(c.mul(X, alpha(c, weight_decay)), G))
  weight = host(c, 1 - b1)
  if abs(1 - b1) < 0.5:  # lerp: start + weight * (end - start)
    m_new = c.add(c.mul(weight, c.sub(g, m)), m)
  else:  # end + (weight - 1) * (end - start)
    m_new = c.add(c.mul(c.sub(weight, c.exact(1.0)), c.sub(g, m)), g)
  v_new = c.add(c.mul(c.mul(host(c, 1 - b2), g), g), c.mul(v, c.const(b2)))
  scaled = c.mul(c.div(m_new, bc1), c.const(R))
  if float(np.max(rho.v)) > 5:
    adaptive = c.mul(c.div(c.exact(1.0), c.add(c.sqrt(v_new), c.const(eps))), bc2_sqrt)
    step = c.mul(c.mul(scaled, adaptive), rect_b)
  else:
    step = scaled
  if (decoupled_weight_decay and weight_decay != 0) or narrow_params(c):  # in place: X_new - X
    X_out, U = in_place_update(c, X, c.sub(x, step))
  else:
    X_out = c.finish(X, step)
    U = c.update_of(X, X_out, step)
  return X_out, c.store(m_new), c.store(v_new), U


def pytorch_radam_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """PyTorch's ``1 - beta1 ** step``, ``(1 - beta2 ** step) ** 0.5``, ``rho_t`` and ``rect`` (``step
  = T + 1``), written from ``_single_tensor_radam``: its ``beta2 ** step`` a power in float64,
  ``1 - bias_correction2`` in float32 (the twin's documented float32 scalars)."""
  beta1, beta2 = (float(b) for b in raw["betas"])
  bc1 = o.pytorch_power_complement(beta1, T)
  bc2 = o.pytorch_power_complement(beta2, T)
  rho_inf = 2 / (1 - beta2) - 1
  below = (rho_inf - 4) * (rho_inf - 2)
  if isinstance(T, int):  # exact decimals
    exact = type(bc2).from_float
    power = o.power(exact(beta2), T)
    step: Any = T + 1
    rho_inf_v, below_v = exact(rho_inf), exact(below)
  else:  # on the device, in the scalar dtype (float64 under x64, else float32)
    import jax.numpy as jnp

    dtype = jnp.result_type(float)
    step = jnp.asarray(T, dtype) + 1
    power = jnp.asarray(beta2, dtype) ** step if dtype == jnp.float64 else 1 - bc2
    rho_inf_v, below_v = jnp.asarray(rho_inf, dtype), jnp.asarray(below, dtype)
  rho_t = rho_inf_v - 2 * step * power / bc2
  ratio = (rho_t - 4) * (rho_t - 2) * rho_inf_v / (below_v * rho_t)
  return {
    "R": R,
    "bias_correction1": bc1,
    "bias_correction2_sqrt": o.sqrt(bc2),
    "rho_t": rho_t,
    "rect": o.where(rho_t > 5, o.sqrt(o.where(ratio > 0, ratio, 0 * ratio)), 0 * ratio),
  }


tolerance.register_model("pytorch_radam", bounds=pytorch_radam_bounds, scalars=pytorch_radam_scalars)
