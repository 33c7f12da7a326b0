"""``pytorch_muon``'s bound model (``_single_tensor_muon``'s order): the arithmetic around the iteration.

The Newton–Schulz iteration is not element-wise and runs in bfloat16: no element-wise bound
model reaches it. The expectation (``reference.pytorch_muon``) forms the iteration's input in
PyTorch's own arithmetic and runs the iteration with every bfloat16 result correctly rounded,
and this model takes that output ``O`` as exact (``reference.muon_orthogonalized``, on the
case's tensors in their own dtype): a single bfloat16 element of the twin's ``O`` off the
expectation's moves ``X_new`` by ``lr * ratio * ulp_bf16(O)`` (about 1e-4 on the grid),
thousands of times this model's float32 and float64 bounds, and fails the report. The report
therefore checks the iteration to the bit against the correctly rounded bfloat16 iteration, and
the arithmetic around it (the buffer's lerp, ``param.mul_``, ``param.add_``) within this bound.
The rule reduces over its matrix (``Rule.reduces``): the check evaluates this model one leaf at
a time in its own shape, which gives ``adjust_lr``'s ratio.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_optax.conformance import tolerance
from onnx_optax.conformance.models._shared import host, in_place_update
from onnx_optax.conformance.tolerance import Context
from onnx_optax.reference.pytorch import muon_orthogonalized, muon_ratio

__all__ = ["pytorch_muon_bounds", "pytorch_muon_scalars"]


def _own_dtype(*arrays: Any) -> Any:
  """The narrowest of float16, float32 and float64 that holds every value exactly: the dtype the
  case's tensors had (the check hands the model their values as float64). A float64 case's
  drawn values are not all float32 numbers; where every tensor is 0 the iteration's output is 0
  in any dtype."""
  with np.errstate(over="ignore", invalid="ignore"):
    for dt in (np.float16, np.float32):
      if all(np.array_equal(np.asarray(a, dt).astype(np.float64), a) for a in arrays):
        return dt
  return np.float64


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
  ``param + (-lr ratio) O`` with ``O`` the expectation's iteration output (see the module docstring)."""
  dt = _own_dtype(G, B)
  O, _ = muon_orthogonalized(
    np.asarray(G, dt),
    np.asarray(B, dt),
    momentum=float(momentum),
    nesterov=nesterov,
    ns_coefficients=ns_coefficients,
    ns_steps=ns_steps,
    eps=float(eps),
  )
  ratio = muon_ratio(np.shape(X), adjust_lr_fn)
  X, G, B = c.exact(X), c.exact(G), c.exact(B)
  weight = host(c, 1 - float(momentum))
  if abs(1 - float(momentum)) < 0.5:  # buf.lerp_(grad, 1 - momentum): start + weight * (end - start)
    B = c.add(c.mul(weight, c.sub(G, B)), B)
  else:  # end + (weight - 1) * (end - start)
    B = c.add(c.mul(c.sub(weight, c.exact(1.0)), c.sub(G, B)), G)
  Xd = X if weight_decay == 0 else c.mul(X, host(c, 1 - R * weight_decay))
  step = c.mul(host(c, R * ratio), c.exact(np.asarray(O, np.float64)))
  X_out, U = in_place_update(c, X, c.sub(Xd, step))
  return X_out, c.store(B), U


def pytorch_muon_scalars(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  """Muon has no step-dependent scalar: ``lr`` itself, a Python float."""
  return {"R": R}


tolerance.register_model("pytorch_muon", bounds=pytorch_muon_bounds, scalars=pytorch_muon_scalars)
