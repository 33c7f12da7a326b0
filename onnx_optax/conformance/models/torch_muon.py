"""``pytorch_muon``'s bound model (``_single_tensor_muon``'s order): the arithmetic around the iteration.

The Newton–Schulz iteration is not element-wise and runs in bfloat16: no element-wise bound
model reaches it. The expectation (``reference.pytorch_muon``) forms the iteration's input in
PyTorch's own arithmetic and runs the iteration with every bfloat16 result correctly rounded,
so the iteration's output ``O`` is taken here as exact: a single bfloat16 element of the twin's
``O`` off the expectation's moves ``X_new`` by ``lr * ratio * ulp_bf16(O)`` (about 1e-4 on the
grid), thousands of times this model's bound, and fails the report. The report therefore checks
the iteration to the bit against the correctly rounded bfloat16 iteration, and the float32 and
float64 arithmetic around it (the buffer's lerp, ``param.mul_``, ``param.add_``) within this
bound. ``|O|`` enters only the rounding of ``X_new``: it is bounded by ``O_MAX`` (the quintic's
largest value over the singular values it reaches, 1.2 for PyTorch's coefficients, with a margin)
times ``RATIO_MAX``, the largest ``adjust_lr`` factor of the grid's shapes (``sqrt(13)``,
the 13 x 1 case) — constants of the grid, not a derivation for any shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import host, in_place_update
from onnx_optax.conformance.tolerance import Context

__all__ = ["pytorch_muon_bounds", "pytorch_muon_scalars"]

RATIO_MAX = 13**0.5


def _o_max(coefficients: Any, steps: int) -> float:
  """A bound of the iteration's singular values (and so of every element of its output): from 1.01
  (the normalised input, its norm rounded to bfloat16), per step the largest ``|a t + b t^3 + c
  t^5|`` over ``[0, 1.03 s]``, the 3 % for bfloat16's roundings of the step (a margin, not a
  derivation). The quintic maps ``[0, 1.24]`` into itself for PyTorch's coefficients: the bound
  settles near 1.2 there. A margin on the result instead of the argument compounds past that
  interval and diverges (2e6 after five steps): no bound at all."""
  a, b, c = (float(v) for v in coefficients)
  s = 1.01
  for _ in range(steps):
    t = np.linspace(0.0, 1.03 * s, 4097)
    s = max(s, float(np.max(np.abs(a * t + b * t**3 + c * t**5))))
  return s


def pytorch_muon_bounds(
  c: Context,
  R,
  T,
  X,
  G,
  B,
  *,
  weight_decay,
  momentum,
  nesterov,
  ns_coefficients=(3.4445, -4.7750, 2.0315),
  eps=1e-7,
  ns_steps=5,
  adjust_lr_fn=None,
):
  """The buffer's lerp (PyTorch's two branches), ``param.mul_(1 - lr wd)``, then
  ``param + (-lr ratio) O`` with ``|O| <= O_MAX`` (see the module docstring)."""
  X, G, B = c.exact(X), c.exact(G), c.exact(B)
  weight = host(c, 1 - float(momentum))
  if abs(1 - float(momentum)) < 0.5:  # buf.lerp_(grad, 1 - momentum): start + weight * (end - start)
    B = c.add(c.mul(weight, c.sub(G, B)), B)
  else:  # end + (weight - 1) * (end - start)
    B = c.add(c.mul(c.sub(weight, c.exact(1.0)), c.sub(G, B)), G)
  O = c.exact(-np.sign(X.v) * _o_max(ns_coefficients, ns_steps))  # no cancellation against X
  Xd = X if weight_decay == 0 else c.mul(X, host(c, 1 - R * weight_decay))
  step = c.mul(host(c, R * RATIO_MAX), O)
  X_out, U = in_place_update(c, X, c.sub(Xd, step))
  return X_out, c.store(B), U


def pytorch_muon_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """Muon has no step-dependent scalar: ``lr`` itself, a Python float."""
  return {"R": R}


tolerance.register_model("pytorch_muon", bounds=pytorch_muon_bounds, scalars=pytorch_muon_scalars)
