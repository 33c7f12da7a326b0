"""ONNX Runtime's ``AdamWOptimizer`` and ``SGDOptimizerV2``: their bound models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import one_minus_power
from onnx_optax.conformance.tolerance import Bounded, Context, scalar_context

__all__ = ["ort_adamw_bounds", "ort_adamw_scalars", "ort_sgd_bounds", "ort_sgd_scalars"]


def _ort_correction(c: Context, beta: float, T: int) -> Bounded:
  """``1 - beta^step``: the implementation's scalar (``-expm1``); the expectation's ``1 - float64(beta^T)``.

  :func:`onnx_optax.reference.ort_adamw` forms the power in float64 whatever
  its dtype (as the kernel's ``std::pow``), then subtracts it from 1 in its
  dtype: one float64 ``pow`` (one ulp) and one rounding of the context.
  """
  if c.hyper_dtype is not None:
    return scalar_context(c).one_minus_power(beta, T)
  power = float(c.exact_hyper(beta)) ** T
  return c._rounded(np.float64(1.0 - power), np.float64(2 * 2.0**-53 * power))


def ort_adamw_bounds(
  c: Context, R, T, X, G, M1, M2, *, alpha, beta, epsilon, weight_decay, adam_mode, correct_bias
):
  """ONNX Runtime's AdamW in its CPU kernel's order (``rules.ort_adamw``), ``M2 / beta_correction``
  as ``M2 * (1 / beta_correction)`` in the implementation (a per-update reciprocal)."""
  s = scalar_context(c)
  if correct_bias:
    alpha_correction, beta_correction = _ort_correction(c, alpha, T), _ort_correction(c, beta, T)
  elif adam_mode == 0:
    raise ValueError("adam_mode=0 needs correct_bias: ONNX Runtime refuses it without")
  alpha_, beta_, eps, lr = c.const(alpha), c.const(beta), c.const(epsilon), c.rate(R)
  X, G, M1, M2 = c.exact(X), c.exact(G), c.exact(M1), c.exact(M2)
  M1_new = c.add(c.mul(alpha_, M1), c.mul(c.one_minus(alpha, "one_minus_alpha"), G))
  M2_new = c.add(c.mul(beta_, M2), c.mul(c.mul(c.one_minus(beta, "one_minus_beta"), G), G))
  # The scalars below are computed in the scalar context and rounded once to d (for an
  # expectation, s is c and the rounding the identity).
  if adam_mode == 0:
    scaled = c.div_by_scalar(M2_new, beta_correction, "one_over_beta_correction")
    bounded = alpha_correction
    denominator = c.mul(
      c.to_elementwise(c.value("alpha_correction", lambda: bounded)), c.add(c.sqrt(scaled), eps)
    )
    step = c.div(c.mul(lr, M1_new), denominator)
    if weight_decay == 0:
      X_new = c.finish(X, step)
      return X_new, c.store(M1_new), c.store(M2_new), c.update_of(X, X_new, step)
    W = c.sub(X, c.mul(c.mul(X, lr), c.const(weight_decay)))
    W_new = c.sub(W, step)
  else:
    lr_corrected = (
      c.to_elementwise(
        c.value("lr_corrected", lambda: s.div(s.mul(s.const(R), s.sqrt(beta_correction)), alpha_correction))
      )
      if correct_bias
      else lr
    )
    step = c.div(c.mul(lr_corrected, M1_new), c.add(c.sqrt(M2_new), eps))
    if weight_decay == 0:
      X_new = c.finish(X, step)
      return X_new, c.store(M1_new), c.store(M2_new), c.update_of(X, X_new, step)
    lr_weight_decay = c.to_elementwise(
      c.value("lr_weight_decay", lambda: s.mul(s.const(R), s.const(weight_decay)))
    )
    W = c.sub(X, step)
    W_new = c.sub(W, c.mul(lr_weight_decay, W))
  U = c.sub(W_new, X)  # U = W_new - X (an expectation's too), then X + U.
  if c.hyper_dtype is not None:
    U = c.update(U)
    W_new = c.apply(X, U)
  return W_new, c.store(M1_new), c.store(M2_new), U


def ort_adamw_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  out = {"R": R, "one_minus_alpha": 1 - h["alpha"], "one_minus_beta": 1 - h["beta"]}
  if raw["correct_bias"]:
    alpha_correction = one_minus_power(o, h["alpha"], T)
    beta_correction = one_minus_power(o, h["beta"], T)
    if raw["adam_mode"] == 0:
      out["alpha_correction"] = alpha_correction
      out["one_over_beta_correction"] = 1 / beta_correction
    else:
      out["lr_corrected"] = R * o.sqrt(beta_correction) / alpha_correction
  if raw["adam_mode"] == 1 and raw["weight_decay"] != 0:
    out["lr_weight_decay"] = R * h["weight_decay"]
  return out


def ort_sgd_bounds(c: Context, R, T, X, G):
  """``W_new = W + (-lr * G)``: ``U = -lr * G`` (one rounding), then ``X + U``."""
  X, G = c.exact(X), c.exact(G)
  step = c.mul(c.rate(R), G)
  X_new = c.finish(X, step)
  return X_new, c.update_of(X, X_new, step)


def ort_sgd_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """The spec's per-update scalars (the formulas of docs/spec.md)."""
  return {"R": R}


tolerance.register_model("ort_adamw", bounds=ort_adamw_bounds, scalars=ort_adamw_scalars)
tolerance.register_model("ort_sgd", bounds=ort_sgd_bounds, scalars=ort_sgd_scalars)
