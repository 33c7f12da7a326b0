"""``pytorch_nadam``'s bound model (``_single_tensor_nadam``'s order): its bounds and its scalars."""

from __future__ import annotations

import decimal
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_optax.conformance import arithmetic, tolerance
from onnx_optax.conformance.models._shared import (
  alpha,
  in_place_update,
  stored_like_params,
)
from onnx_optax.conformance.models._shared import host as host_scalar
from onnx_optax.conformance.tolerance import (
  K_TRANSCENDENTAL,
  Bounded,
  Context,
  scalar_context,
)

__all__ = ["pytorch_nadam_bounds", "pytorch_nadam_scalars"]

#: ``mu_product``'s own dtype in the grid (``Field.dtypes``' first: PyTorch's scalar dtype).
_U_PRODUCT = 2.0**-24
_TINY_PRODUCT = 2.0**-149


def _mu(beta1: float, momentum_decay: float, step: int) -> float:
  """PyTorch's ``beta1 * (1 - 0.5 * 0.96 ** (step * momentum_decay))`` (Python float64)."""
  return beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))


def _mu_bound(s: Context, beta1: float, momentum_decay: float, step: int) -> Bounded:
  """``mu`` as the scalar context computes it: ``pow`` (its exponent ``step * momentum_decay``
  rounded once, ``log(0.96)`` times it the condition), ``1 - 0.5 power`` and ``* beta1``, each
  rounded once, ``beta1`` and ``momentum_decay`` as received."""
  value = _mu(beta1, momentum_decay, step)
  power = 0.96 ** (step * momentum_decay)
  u = s.u
  x = abs(step * momentum_decay * math.log(0.96))
  power_e = ((K_TRANSCENDENTAL + 3) * (1 + x) + K_TRANSCENDENTAL) * u * power
  e = beta1 * 0.5 * power_e + 4 * u * abs(value)
  return Bounded(np.float64(value), np.float64(e))


def pytorch_nadam_bounds(
  c: Context,
  R,
  T,
  X,
  G,
  p,
  m,
  v,
  *,
  betas,
  eps,
  weight_decay,
  momentum_decay,
  decoupled_weight_decay=False,
  decoupled=None,
):
  """``mu_product * mu`` in ``mu_product``'s own dtype; the lerp, ``mul_`` + ``addcmul_``,
  ``(exp_avg_sq / bias_correction2).sqrt() + eps``; the two step sizes ``-lr (1 - mu) / (1 -
  mu_product)`` and ``-lr mu_next / (1 - mu_product mu_next)`` per tensor; two ``addcdiv_``,
  written in place. ``decoupled``: ``decoupled_weight_decay`` as Adam's model names it."""
  decoupled_weight_decay = decoupled_weight_decay if decoupled is None else decoupled
  s = scalar_context(c)
  b1, b2 = (float(b) for b in betas)
  md, step = float(momentum_decay), int(T) + 1
  complement = s.power_complement if np.dtype(s.dtype) == np.float64 else s.one_minus_power
  bc2 = c.to_elementwise(c.value("bias_correction2", lambda: complement(b2, step)))
  mu_s = c.value("mu", lambda: _mu_bound(s, b1, md, step))
  mu_next_s = c.value("mu_next", lambda: _mu_bound(s, b1, md, step + 1))
  X, G, m, v, p = c.exact(X), c.exact(G), c.exact(m), c.exact(v), c.exact(p)
  # mu_product *= mu in mu_product's dtype (float32, the expectation's too): the value as stored,
  # float32(mu_product * float32(mu)), which PyTorch's and the expectation's are; its error the
  # device's mu's, then a float32 ulp where either rounding to float32 may part.
  mu = c.to_elementwise(mu_s)
  stored = (p.v.astype(np.float32) * np.float32(mu.v)).astype(np.float64)
  e = np.abs(p.v) * (mu.e + 2 * _U_PRODUCT * np.abs(mu.v)) + 2 * _U_PRODUCT * np.abs(stored) + _TINY_PRODUCT
  p_new = Bounded(stored, e)
  x, g = X, G
  if weight_decay != 0:
    if decoupled_weight_decay:  # param.mul_(1 - lr * weight_decay)
      x = stored_like_params(c, c.mul(X, host_scalar(c, 1 - R * weight_decay)))
    else:
      g = stored_like_params(c, c.add(c.mul(X, alpha(c, weight_decay)), G))
  weight = host_scalar(c, 1 - b1)
  if abs(1 - b1) < 0.5:  # lerp: start + weight * (end - start)
    m_new = c.add(c.mul(weight, c.sub(g, m)), m)
  else:  # end + (weight - 1) * (end - start)
    m_new = c.add(c.mul(c.sub(weight, c.exact(1.0)), c.sub(g, m)), g)
  v_new = c.add(c.mul(c.mul(host_scalar(c, 1 - b2), g), g), c.mul(v, c.const(b2)))
  denom = c.add(c.sqrt(c.div(v_new, bc2)), c.const(eps))
  # The step sizes (positive here): the numerators per update in the scalar dtype, rounded once
  # to the compute dtype, the divisions by 1 - mu_product per tensor in it.
  lr = s.const(R)
  grad_num = c.to_elementwise(s.mul(lr, s.sub(s.exact(1.0), mu_s)))
  avg_num = c.to_elementwise(s.mul(lr, mu_next_s))
  grad_size = c.div(grad_num, c.sub(c.exact(1.0), p_new))
  p_next = c.mul(p_new, c.to_elementwise(mu_next_s))
  avg_size = c.div(avg_num, c.sub(c.exact(1.0), p_next))
  x = stored_like_params(c, c.sub(x, c.div(c.mul(grad_size, g), denom)))  # addcdiv_(grad, denom)
  x = c.sub(x, c.div(c.mul(avg_size, m_new), denom))  # addcdiv_(exp_avg, denom)
  X_out, U = in_place_update(c, X, x)
  return X_out, p_new, c.store(m_new), c.store(v_new), U


def pytorch_nadam_scalars(
  o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]
) -> dict[str, Any]:
  """PyTorch's ``1 - beta2 ** step``, ``mu`` and ``mu_next`` (``step = T + 1``), written from
  ``_single_tensor_nadam``: ``beta1 * (1 - 0.5 * 0.96 ** (step * momentum_decay))`` at ``step``
  and ``step + 1``, a power in the scalar dtype."""
  beta1, beta2 = (float(b) for b in raw["betas"])
  md = float(raw["momentum_decay"])
  bc2 = o.pytorch_power_complement(beta2, T)
  if isinstance(T, int):  # exact decimals
    D = decimal.Decimal
    ctx = arithmetic.DECIMAL

    def exact(step: int) -> Any:
      power = ctx.power(D(0.96), ctx.multiply(D(step), h["momentum_decay"])) if md else D(1)
      return ctx.multiply(D(beta1), ctx.subtract(D(1), ctx.multiply(D("0.5"), power)))

    mus = exact(T + 1), exact(T + 2)
  else:  # on the device, in the scalar dtype (float64 under x64, else float32)
    import jax.numpy as jnp

    dtype = jnp.result_type(float)
    step = jnp.asarray(T, dtype) + 1

    def on_device(step: Any) -> Any:
      power = jnp.asarray(0.96, dtype) ** (step * jnp.asarray(h["momentum_decay"], dtype))
      return jnp.asarray(beta1, dtype) * (1 - 0.5 * power)

    mus = on_device(step), on_device(step + 1)
  return {"R": R, "bias_correction2": bc2, "mu": mus[0], "mu_next": mus[1]}


tolerance.register_model("pytorch_nadam", bounds=pytorch_nadam_bounds, scalars=pytorch_nadam_scalars)
