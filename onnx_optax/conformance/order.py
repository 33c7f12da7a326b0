"""The framework twins compared to the bit with their framework's float32 order.

A twin whose NumPy expectation follows its framework's float32 operation order
(``reference.register(..., framework_order=True)``: PyTorch's twins) is, where the
device's float32 arithmetic is correctly rounded, compared with that expectation
in float32 to the bit: two evaluations of the same operations in the same order
on the same operands, each correctly rounded, give the same bits. A rounding
moved, added or fused shows there even when it is within the tolerance.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnx_optax import reference
from onnx_optax.conformance import tolerance
from onnx_optax.conformance.arithmetic import DeviceArithmetic
from onnx_optax.conformance.cases import Case, base_rule

__all__ = ["flushes", "order_applies", "order_mismatch", "ordered", "touches_subnormals"]


def ordered(rule: str) -> bool:
  """Whether ``rule``'s expectation follows its framework's float32 order (a suite or registered name)."""
  return reference.get(base_rule(rule)).framework_order


_ORDER_OPS = ("add", "mul", "div", "sqrt")


def order_applies(case: Case, arithmetic: DeviceArithmetic | None) -> tuple[bool, str]:
  """``(applies, why not)``: whether :func:`order_mismatch` checks ``case`` on a device of ``arithmetic``.

  It applies to the float32 cases (with a float32 state) of the rules whose expectation follows
  their framework's float32 order (registered with ``framework_order``, :func:`ordered`) where the device's
  measured float32 sum, product, quotient and square root are correctly rounded (0.5 ulp): two
  evaluations of the same operations in the same order on the same operands, each correctly
  rounded, give the same bits, so the bound is zero. Elsewhere the rounding-error bound is the
  check, and ``why not`` says why (empty for a case the comparison is not meant for).

  Example:
    >>> from onnx_optax.conformance.arithmetic import OpError
    >>> from onnx_optax.conformance.cases import cases
    >>> ops = [OpError(op, "float32", 0.5, 1.0, 0.0, False, 9) for op in ("add", "mul", "div")]
    >>> gpu = DeviceArithmetic("gpu", (*ops, OpError("sqrt", "float32", 1.5, 3.0, 0.0, False, 9)))
    >>> order_applies(cases("pytorch_sgd", "float32")[0], gpu)
    (False, 'the float32 arithmetic is not correctly rounded (sqrt 1.50 ulp)')
    >>> order_applies(cases("keras_adam", "float32")[0], gpu)
    (False, '')
  """
  if not ordered(case.rule) or case.dtype != "float32" or case.state_dtype not in (None, "float32"):
    return False, ""
  if arithmetic is None:
    return False, "the pinned model measures no arithmetic"
  off = []
  for op in _ORDER_OPS:
    e = arithmetic.get(op, "float32")
    if e is None or e.ulp > 0.5:
      off.append(f"{op} {'not measured' if e is None else f'{e.ulp:.2f} ulp'}")
  if off:
    return False, f"the float32 arithmetic is not correctly rounded ({', '.join(off)})"
  return True, ""


def _same(got: Any, want: Any) -> np.ndarray:
  """Element-wise: equal float32 values, NaN where NaN is expected."""
  a, b = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return (a == b) | (np.isnan(a) & np.isnan(b))


def order_mismatch(
  case: Case,
  X,
  G,
  state,
  got_x,
  got_state,
  got_u,
  scalars: Mapping[str, tolerance.Bounded],
) -> str:
  """Where a twin's float32 outputs are not its framework's float32 order, ``""`` where they all are.

  The expectation is ``reference.pytorch_*`` in float32: each of PyTorch's operations rounded
  once (a fused multiply-add too), from the case's inputs, with the step-dependent scalars as
  the device computes them from the spec's formula (``scalars``, measured by
  :mod:`~onnx_optax.conformance.scalars`, never by the rule; one expectation per distinct value
  the device gave, and the outputs must be one of them). Each new state tensor must equal it,
  and ``X + U`` its new parameters, or, where the step shrinks a parameter below half its
  magnitude (``X_new`` out of reach of any ``X + U``, ``rules._in_place``), ``U`` its
  ``X_new - X`` rounded once. A rounding moved, added or fused where PyTorch's order does not
  shows here even when it is within the tolerance.
  """
  R, hyper = case.learning_rate, case.hyper
  names = [name for name in scalars if name != "R"]  # R: a Python float (the twins' grid has no schedule)
  got_values = [getattr(scalars[name], "got", ()) or (float(scalars[name].v),) for name in names]
  first = ""
  for values in itertools.product(*got_values):
    given = dict(zip(names, values)) if names else None
    found = _order_differs(case, R, hyper, X, G, state, got_x, got_state, got_u, given)
    if not found:
      return ""
    first = first or found
  return first


def _order_differs(case: Case, R, hyper, X, G, state, got_x, got_state, got_u, given) -> str:
  out_names = case.suite.outputs
  step = reference.get(case.base_rule).step
  for leaf, (x, g) in enumerate(zip(X, G)):
    s = [block[leaf] for block in state]
    want = step(R, case.T, x, g, *s, dtype=np.float32, scalars=given, **hyper)
    x32, E = np.asarray(x, np.float32), np.asarray(want[0], np.float32)
    difference = E - x32  # rounded once, in float32
    with np.errstate(invalid="ignore"):
      reachable = difference.astype(np.float64) == E.astype(np.float64) - x32.astype(np.float64)
    ok = _same(got_x[leaf], E)
    if got_u is not None:
      ok |= ~reachable & _same(got_u[leaf], difference)
    for name, got, expected in [(out_names[0], got_x[leaf], E)] + [
      (out_names[k + 1], got_state[k][leaf], want[k + 1]) for k in range(len(got_state))
    ]:
      bad = np.flatnonzero(~(ok if name == out_names[0] else _same(got, expected)).ravel())
      if bad.size:
        j = int(bad[0])
        return (
          f"{name}[leaf {leaf}, element {j}]: got {float(np.ravel(got)[j])!r}, PyTorch's float32 order "
          f"gives {float(np.ravel(expected)[j])!r} ({bad.size} of {np.size(expected)} elements differ)"
        )
  return ""


def flushes(arithmetic: DeviceArithmetic) -> bool:
  """Whether the device flushes float32 subnormal results or operands (measured)."""
  return arithmetic.tiny("float32", 0.0) > 0 or arithmetic.flushes_operands("float32")


def touches_subnormals(record_into: list[bool]) -> Callable[..., None]:
  """A recorder (:func:`tolerance.recording`) that notes a float32 operand below the smallest normal."""
  normal = float(np.finfo(np.float32).smallest_normal)

  def record(op: str, dtype: Any, *operands: Any) -> None:
    if np.dtype(dtype) == np.float32 and not record_into:
      for v in operands:
        a = np.abs(np.asarray(v, np.float64))
        if np.any((a > 0) & (a < 2 * normal)):
          record_into.append(True)
          return

  return record
