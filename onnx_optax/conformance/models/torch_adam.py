"""``pytorch_adam``'s and ``pytorch_adamw``'s bound models (``_single_tensor_adam``'s order)."""

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

__all__ = ["pytorch_adam_bounds", "pytorch_adam_scalars", "pytorch_adamw_bounds"]


def pytorch_adam_bounds(
  c: Context, R, T, X, G, m, v, vmax=None, *, betas, eps, weight_decay, amsgrad=False, decoupled=False
):
  """``_single_tensor_adam`` (``decoupled``: AdamW): the lerp, ``mul_`` + ``addcmul_``, with
  ``amsgrad`` the maximum of ``vmax`` (``max_exp_avg_sq``) and the stored ``v``, the root (of
  that maximum with ``amsgrad``) divided by ``sqrt(1 - beta2^step)`` (a true division),
  ``X - step_size * m / denom``."""
  s = scalar_context(c)
  b1, b2 = (float(b) for b in betas)
  # PyTorch's 1 - beta**step: that expression in float64 (under x64), else -expm1(step log beta).
  # The scalar context is float64 exactly when the case is float64, which is when the runner
  # enables x64 for a twin (its grid has no float64 state with narrower parameters); were they
  # to differ, the float32 -expm1 bound taken instead is the looser one.
  complement = s.power_complement if np.dtype(s.dtype) == np.float64 else s.one_minus_power
  step_size = c.to_elementwise(c.value("step_size", lambda: s.div(s.const(R), complement(b1, T + 1))))
  bc2_sqrt = c.to_elementwise(c.value("bias_correction2_sqrt", lambda: s.sqrt(complement(b2, T + 1))))
  X, G, m, v = c.exact(X), c.exact(G), c.exact(m), c.exact(v)
  x, g = X, G
  if weight_decay != 0:
    if decoupled:  # param.mul_(1 - lr * weight_decay)
      x = stored_like_params(c, c.mul(X, host(c, 1 - R * weight_decay)))
    else:
      g = stored_like_params(c, c.add(c.mul(X, alpha(c, weight_decay)), G))
  weight = host(c, 1 - b1)
  if abs(1 - b1) < 0.5:  # lerp: start + weight * (end - start)
    m_new = c.add(c.mul(weight, c.sub(g, m)), m)
  else:  # end + (weight - 1) * (end - start)
    m_new = c.add(c.mul(c.sub(weight, c.exact(1.0)), c.sub(g, m)), g)
  v_new = c.add(c.mul(c.mul(host(c, 1 - b2), g), g), c.mul(v, c.const(b2)))
  vmax_new = None
  if amsgrad:  # torch.maximum(max_exp_avg_sq, exp_avg_sq): rounds nothing; each operand's error is kept
    stored, old = c.store(v_new), c.exact(vmax)
    vmax_new = Bounded(np.maximum(old.v, stored.v), np.maximum(old.e, stored.e))
  denom = c.add(c.div(c.sqrt(v_new if vmax_new is None else vmax_new), bc2_sqrt), c.const(eps))
  step = c.div(c.mul(step_size, m_new), denom)
  if (decoupled and weight_decay != 0) or narrow_params(c):  # Written in place: X_new - X.
    X_out, U = in_place_update(c, X, c.sub(x, step))
  else:
    X_out = c.finish(X, step)
    U = c.update_of(X, X_out, step)
  state = (c.store(m_new), c.store(v_new), *(() if vmax_new is None else (vmax_new,)))
  return X_out, *state, U


def pytorch_adamw_bounds(c: Context, R, T, X, G, m, v, vmax=None, **hyper):
  return pytorch_adam_bounds(c, R, T, X, G, m, v, vmax, decoupled=True, **hyper)


def pytorch_adam_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  beta1, beta2 = (float(b) for b in raw["betas"])
  return {
    "R": R,
    "step_size": R / o.pytorch_power_complement(beta1, T),
    "bias_correction2_sqrt": o.sqrt(o.pytorch_power_complement(beta2, T)),
  }


tolerance.register_model("pytorch_adam", bounds=pytorch_adam_bounds, scalars=pytorch_adam_scalars)
tolerance.register_model("pytorch_adamw", bounds=pytorch_adamw_bounds, scalars=pytorch_adam_scalars)
