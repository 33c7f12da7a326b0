"""What several bound models share: the spec's ``1 - beta^T``, and the framework twins' host scalars
and in-place writes (docs/spec.md, "PyTorch-order twins").

The twins follow their frameworks' order (:mod:`onnx_optax.rules`, ``pytorch_*`` and
``keras_adam``), which is also the order of ``reference.pytorch_*``. Their hyperparameters
reach them as Python floats (``Context.received`` is float64): each is rounded once where it
meets a tensor (``const``), and the scalars the frameworks compute in Python (``1 - beta2``,
``1 - dampening``, ``1 - lr * weight_decay``) are float64 numbers rounded once (:func:`host`).
"""

from __future__ import annotations

from typing import Any

from onnx_optax.conformance.tolerance import Bounded, Context

__all__ = ["alpha", "host", "in_place_update", "narrow_params", "one_minus_power", "stored_like_params"]


def one_minus_power(o: Any, beta: Any, T: Any) -> Any:
  """``1 - beta^T`` as the spec's number, written without cancellation: ``-expm1(T log beta)``
  (in the arithmetic ``o`` of a scalar formula)."""
  return -o.expm1(T * o.log(beta))


def host(c: Context, value: float) -> Bounded:
  """A scalar the framework computes in Python float64 (two roundings at most, ``2 u64 |v|``),
  rounded once to ``dtype`` where it meets a tensor (the expectation keeps the float64 number)."""
  return c.to_elementwise(Bounded(value, 2 * 2.0**-53 * abs(value)))


def in_place_update(c: Context, X: Bounded, X_new: Bounded) -> tuple[Bounded, Bounded]:
  """``(X_out, U)`` of a rule that writes ``X_new`` in place (``rules._in_place``).

  ``U = X_new - X`` rounded in ``X``'s dtype (exact where the two are within a factor 2,
  Sterbenz; one rounding otherwise), for the implementation and the expectation alike; the
  implementation's output is then ``X + U`` (``optax.apply_updates``), one rounding more.
  Parameters narrower than the compute dtype (``param``): ``X_new`` is rounded to theirs
  first, as PyTorch stores it, and ``U`` and ``X + U`` are computed there.
  """
  p = c.param or c
  X_new = c.update(X_new)  # Rounded to the parameters' dtype (``param``), else as it is.
  U = p.sub(X_new, X)
  if c.hyper_dtype is None:
    return X_new, U
  return p.add(X, U), U


def narrow_params(c: Context) -> bool:
  """Whether the parameters are narrower than PyTorch's opmath dtype (float32): bfloat16 with a
  float32 state (``param``), or float16 with a float16 state (a 16-bit ``dtype``, each operation
  charged its unit roundoff). PyTorch then adds in float32 and rounds the sum once to the
  parameters' dtype: the twins write it in place (``_pytorch.added``), ``X_new - X``."""
  return c.param is not None or c.u > 2.0**-24


def stored_like_params(c: Context, g: Bounded) -> Bounded:
  """A tensor PyTorch stores in the gradient's (the parameters') dtype: the regularized
  gradient, AdamW's decayed parameter. Rounded to it where it is narrower (``param``)."""
  return c.update(g)


def alpha(c: Context, value: float) -> Bounded:
  """The scalar of PyTorch's ``add(other, alpha=value)`` (``_pytorch.alpha``): ATen rounds it to the
  tensors' own dtype, which for 16-bit parameters (``param``) is narrower than the compute dtype;
  as :meth:`Context.const` elsewhere."""
  return (c.param or c).const(value) if c.param is not None else c.const(value)
