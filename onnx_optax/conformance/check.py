"""Runs a case through an Optax transform on a device and checks it.

:func:`run_case` builds the transform and its state (``count = T`` and the
case's state tensors), places everything on the chosen device, applies one
jitted ``update`` + ``optax.apply_updates`` and returns the outputs.
:func:`check_outputs` compares them with :mod:`onnx_optax.reference` in float64
in units of the tolerance of :mod:`onnx_optax.conformance.tolerance`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import onnx_optax
from onnx_optax import reference
from onnx_optax.conformance import arithmetic as arithmetic_lib
from onnx_optax.conformance import scalars as scalars_lib
from onnx_optax.conformance import tolerance
from onnx_optax.conformance.arithmetic import DeviceArithmetic
from onnx_optax.conformance.cases import INT32_MAX, STATE, TWINS, Case, base_rule, numpy_dtype

__all__ = [
  "EXTENDED",
  "ORDERED",
  "OUTPUT_NAMES",
  "CaseResult",
  "Comparison",
  "Outputs",
  "check_outputs",
  "compare",
  "device",
  "expected",
  "expected_update",
  "has_float64",
  "make_transform",
  "order_applies",
  "order_mismatch",
  "platforms",
  "received",
  "received_dtype",
  "received_dtype_of",
  "run_case",
  "run_transform",
  "tolerances",
  "update_dtype",
]

_PLATFORM_ORDER = ("cpu", "gpu", "tpu")


def platforms() -> list[str]:
  """The platforms JAX finds: ``cpu`` always, then ``gpu`` and ``tpu`` if present."""
  found = []
  for platform in _PLATFORM_ORDER:
    try:
      if jax.devices(platform):
        found.append(platform)
    except RuntimeError:  # No backend for this platform.
      pass
  return found


def device(platform: str) -> jax.Device:
  """The first device of a platform, chosen explicitly (not JAX's default)."""
  return jax.devices(platform)[0]


def has_float64(platform: str) -> bool:
  """TPUs have no float64 arithmetic."""
  return platform != "tpu"


def make_transform(
  rule: str,
  R: float | optax.Schedule,
  hyper: dict[str, Any],
  state_dtype: str | None = None,
  initial_count: int | None = None,
) -> optax.GradientTransformationExtraArgs:
  """The Optax transform of a suite rule name with Python-float hyperparameters.

  ``R`` is a float or a schedule; ``state_dtype`` and ``initial_count``
  (None: the transform's default) are passed on.
  """
  extra: dict[str, Any] = {} if state_dtype is None else {"state_dtype": numpy_dtype(state_dtype)}
  if initial_count is not None:
    extra["initial_count"] = initial_count
  makers: dict[str, Callable[..., optax.GradientTransformationExtraArgs]] = {
    "momentum": onnx_optax.momentum,
    "adagrad": onnx_optax.adagrad,
    "adam": onnx_optax.adam,
    "directml_adam": onnx_optax.directml_adam,
    "ort_adamw": onnx_optax.ort_adamw,
    "ort_sgd": onnx_optax.ort_sgd,
    "pytorch_sgd": onnx_optax.pytorch_sgd,
    "pytorch_adagrad": onnx_optax.pytorch_adagrad,
    "pytorch_adam": onnx_optax.pytorch_adam,
    "pytorch_adamw": onnx_optax.pytorch_adamw,
    "keras_adam": onnx_optax.keras_adam,
  }
  return makers[base_rule(rule)](R, **hyper, **extra)


_STATE_CLS = {
  "momentum": onnx_optax.MomentumState,
  "adagrad": onnx_optax.AdagradState,
  "adam": onnx_optax.AdamState,
  "directml_adam": onnx_optax.DirectMLAdamState,
  "ort_adamw": onnx_optax.OrtAdamWState,
  "ort_sgd": onnx_optax.OrtSGDState,
  "pytorch_sgd": onnx_optax.PyTorchSGDState,
  "pytorch_adagrad": onnx_optax.PyTorchAdagradState,
  "pytorch_adam": onnx_optax.PyTorchAdamState,
  "pytorch_adamw": onnx_optax.PyTorchAdamState,
  "keras_adam": onnx_optax.KerasAdamState,
}


def _tree(leaves: list[Any]) -> Any:
  """One leaf: the array itself; several: a nested dict (a multi-leaf pytree)."""
  if len(leaves) == 1:
    return leaves[0]
  return {"a": {"b": leaves[0], "c": leaves[1]}, "d": list(leaves[2:])}  # Flattens in this order.


class Outputs(NamedTuple):
  """What one jitted update returns, as NumPy arrays (see :func:`run_transform`)."""

  X_new: list[np.ndarray]  #: ``optax.apply_updates(params, updates)``, per leaf
  state: list[list[np.ndarray]]  #: the new state tensors, in the spec's order, per leaf
  count: int  # type: ignore[assignment]  # the new count (shadows tuple.count, as the states do)
  U: list[np.ndarray]  #: the updates the transform returned, per leaf


def run_transform(
  rule: str,
  dtype: str,
  platform: str,
  R: float | optax.Schedule,
  T: int,
  hyper: dict[str, Any],
  X: list[np.ndarray],
  G: list[np.ndarray],
  state: list[list[np.ndarray]],
  state_dtype: str | None = None,
  initial_count: int | None = None,
) -> Outputs:
  """One jitted update of ``rule`` on the first ``platform`` device.

  ``R`` is the transform's learning rate (a float or a schedule), the other
  arguments those of :func:`make_transform` and the inputs, in ``dtype``
  (the state in ``state_dtype``).

  Returns:
    ``(X_new, state_new, count, U)``: the new tensors, the new state tensors
    (in the spec's order), the new count and the updates ``U`` the transform
    returned (``X_new = X + U``), as NumPy arrays.
  """
  base = base_rule(rule)
  with jax.enable_x64(np.float64 in (numpy_dtype(dtype), numpy_dtype(state_dtype or dtype))):
    dev = device(platform)
    put = lambda leaves: _tree([jax.device_put(np.asarray(x), dev) for x in leaves])  # noqa: E731
    params, grads = put(X), put(G)
    opt_state = _STATE_CLS[base](jax.device_put(jnp.asarray(T, jnp.int32), dev), *(put(s) for s in state))
    opt = make_transform(rule, R, hyper, state_dtype, initial_count)

    def step(params, grads, opt_state):
      updates, new_state = opt.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), new_state, updates

    with jax.default_device(dev):
      new_params, new_state, updates = jax.jit(step)(params, grads, opt_state)
    placed = {d for leaf in jax.tree.leaves((new_params, new_state, updates)) for d in leaf.devices()}
    if placed != {dev}:  # The platform under test must be the one that computed.
      raise RuntimeError(f"outputs on {placed}, expected {dev}")
    leaves = lambda tree: [np.asarray(x) for x in jax.tree.leaves(tree)]  # noqa: E731
    return Outputs(
      leaves(new_params), [leaves(s) for s in new_state[1:]], int(new_state.count), leaves(updates)
    )


def received_dtype(dtype: str, state_dtype: str | None = None) -> np.dtype:
  """The dtype a Python-float hyperparameter reaches the rule in: float64 under x64, else float32.

  :func:`run_transform` enables x64 when the parameters or the state are
  float64; a Python float then becomes a float64, otherwise a float32.
  """
  x64 = np.float64 in (numpy_dtype(dtype), numpy_dtype(state_dtype or dtype))
  return np.dtype(np.float64 if x64 else np.float32)


def received_dtype_of(rule: str, dtype: str, state_dtype: str | None = None) -> np.dtype:
  """:func:`received_dtype`, but float64 for a twin: PyTorch's and Keras's hyperparameters are
  Python floats, and the twins compute their scalars from them on the host (``1 - beta2`` in
  float64, rounded once), or round each one once where it meets a tensor."""
  return np.dtype(np.float64) if rule in TWINS else received_dtype(dtype, state_dtype)


def received(R: float, hyper: dict[str, Any], dtype: Any) -> tuple[float, dict[str, Any]]:
  """``R`` and the hyperparameters as the rule receives them: each float rounded to ``dtype``.

  The expectation is computed from these values, so that the tolerance
  charges the arithmetic under test, not the rounding of its inputs
  (``tolerance.Context.received``).

  Example:
    >>> received(0.1, {"alpha": 0.9, "mode": "standard"}, np.float32)
    (0.10000000149011612, {'alpha': 0.8999999761581421, 'mode': 'standard'})
  """
  rnd = lambda v: float(np.asarray(v, np.float64).astype(dtype))  # noqa: E731
  return rnd(R), {k: rnd(v) if isinstance(v, float) else v for k, v in hyper.items()}


#: The dtype of the expectation of ``U``: x87 extended precision where NumPy has it (64-bit
#: significand), so that ``X_new - X`` does not lose ``U``'s digits to the cancellation.
EXTENDED = np.dtype(np.longdouble) if np.finfo(np.longdouble).nmant > 52 else np.dtype(np.float64)


def _twin_expected(
  rule: str, R: float, T: int, x, g, s, hyper, dtype: Any, scalars: Mapping[str, float] | None = None
) -> tuple[np.ndarray, ...]:
  """A twin's outputs from its framework's NumPy expectation (:mod:`onnx_optax.reference`).

  PyTorch's rules: ``reference.pytorch_*`` (``count = T``; AdamW is ``pytorch_adam`` with
  ``decoupled_weight_decay``), their step-dependent scalars PyTorch's float64 numbers or, given
  ``scalars``, those. Keras's Adam is DirectML Adam in exact arithmetic (Keras's
  ``m += (g - m) * (1 - beta_1)`` is ``beta_1 m + (1 - beta_1) g``, its ``alpha`` DirectML's
  ``LearningRate * Alpha`` at ``T = count + 1``): ``reference.directml_adam``.
  """
  if rule == "pytorch_sgd":
    X_new, buf = reference.pytorch_sgd(R, T, x, g, s[0], maximize=False, dtype=dtype, **hyper)
    return X_new, (np.asarray(s[0], dtype) if buf is None else buf)  # No momentum: the buffer stays.
  if rule == "pytorch_adagrad":
    return reference.pytorch_adagrad(R, T, x, g, s[0], maximize=False, dtype=dtype, scalars=scalars, **hyper)
  if rule in ("pytorch_adam", "pytorch_adamw"):
    decoupled = rule == "pytorch_adamw"
    return reference.pytorch_adam(
      R, T, x, g, *s, decoupled_weight_decay=decoupled, maximize=False, dtype=dtype, scalars=scalars, **hyper
    )
  b1, b2, eps = hyper["beta_1"], hyper["beta_2"], hyper["epsilon"]
  return reference.directml_adam(
    x, s[0], s[1], g, T + 1, learning_rate=R, beta1=b1, beta2=b2, epsilon=eps, dtype=dtype
  )


def expected(
  rule: str, R: float, T: int, X, G, state, hyper, dtype: Any = np.float64
) -> list[tuple[np.ndarray, ...]]:
  """The spec's outputs per leaf, from :mod:`onnx_optax.reference` in ``dtype`` (float64)."""
  outs = []
  for i, (x, g) in enumerate(zip(X, G)):
    s = [block[i] for block in state]
    if rule in TWINS:
      outs.append(_twin_expected(rule, R, T, x, g, s, hyper, dtype))
    elif rule == "directml_adam":
      outs.append(reference.directml_adam(x, s[0], s[1], g, T, learning_rate=R, dtype=dtype, **hyper))
    else:
      base = base_rule(rule)
      outs.append(reference.RULES[base][0](R, T, x, g, *s, dtype=dtype, **hyper))
  return outs


def expected_update(rule: str, R: float, T: int, X, G, state, hyper) -> list[np.ndarray]:
  """The spec's update ``X_new - X`` per leaf, computed in :data:`EXTENDED`, rounded to float64.

  In float64 ``X_new - X`` would carry ``X_new``'s rounding, ``u |X|``,
  which is far more than ``u |U|`` when the step is small beside ``X``;
  in extended precision that error is ``2**-11`` times smaller.

  A twin's expectation is computed in float64 (``reference.pytorch_*`` emulate PyTorch's fused
  operations through float64 in any dtype but float64): :func:`update_dtype`.
  """
  wide = update_dtype(rule)
  outs = expected(rule, R, T, X, G, state, hyper, dtype=wide)
  return [(np.asarray(out[0], wide) - np.asarray(x, wide)).astype(np.float64) for out, x in zip(outs, X)]


def update_dtype(rule: str) -> np.dtype:
  """The dtype of ``U``'s expectation: :data:`EXTENDED`, float64 for a twin (its ``X_new - X``
  then carries ``X_new``'s float64 rounding, which the expectation's bound charges)."""
  return np.dtype(np.float64) if rule in TWINS else EXTENDED


def tolerances(
  rule: str,
  dtype: str,
  platform: str,
  R: float,
  T: int,
  X,
  G,
  state,
  hyper,
  state_dtype: str | None = None,
  scalar_dtype: str | None = None,
  received_dtype: Any = None,
  *,
  arithmetic: DeviceArithmetic | None = None,
  scalars: Mapping[str, tolerance.Bounded] | None = None,
) -> list[tuple[np.ndarray, ...]]:
  """Per leaf, the tolerance of each output then of ``U``: bound(implementation) + bound(expectation).

  The outputs' expectation is :func:`expected` (float64), ``U``'s is
  :func:`expected_update` (:data:`EXTENDED`, then rounded to float64).
  ``scalar_dtype``: the dtype of the rule's ``T``-dependent scalars when it
  is not the default (see :func:`tolerance.implementation_context`).
  ``received_dtype``: the dtype the hyperparameters were rounded to before
  the expectations got them (:func:`received`); None: the Python floats.
  ``arithmetic``, ``scalars``: the device's measured arithmetic and the
  case's measured per-update scalars (see
  :func:`tolerance.implementation_context`); without them the pinned model.
  """
  base = base_rule(rule)
  if not STATE[rule]:  # No state tensors (ONNX Runtime's SGD): the leaf is computed in its own dtype.
    state_dtype = None
  impl = tolerance.implementation_context(
    numpy_dtype(dtype),
    platform,
    state_dtype and numpy_dtype(state_dtype),
    scalar_dtype and numpy_dtype(scalar_dtype),
    received_dtype,
    arithmetic=arithmetic,
    scalars=scalars,
  )
  ref = tolerance.reference_context(received_dtype=received_dtype)
  ref_u = tolerance.reference_context(update_dtype(rule), received_dtype=received_dtype)
  u64, tiny64 = ref.u, ref.tiny
  R_in, hyper_in = (R, hyper) if received_dtype is None else received(R, hyper, received_dtype)
  outs = []
  for i, (x, g) in enumerate(zip(X, G)):
    s = [block[i] for block in state]
    a = tolerance.bounds(base, impl, R, T, x, g, s, update=True, **hyper)
    b = tolerance.bounds(base, ref, R, T, x, g, s, **hyper)
    e_u = tolerance.bounds(base, ref_u, R, T, x, g, s, update=True, **hyper)[-1]
    # U's expectation is rounded from EXTENDED to float64: one more rounding of |U| <= |U64| + e.
    (U64,) = expected_update(rule, R_in, T, [x], [g], [[t] for t in s], hyper_in)
    e_u = e_u + u64 * (2 * (np.abs(U64) + e_u)) + tiny64
    outs.append((*(p + q for p, q in zip(a, b)), a[-1] + e_u))
  return outs


# -- the twins' float32 order, to the bit -------------------------------------------------------

#: The twins whose expectation (``reference.pytorch_*``) follows their framework's float32
#: operation order, each fused multiply-add rounded once: where the device's arithmetic is
#: correctly rounded their float32 outputs are compared with it to the bit (:func:`order_mismatch`).
#: (Keras's Adam is checked against DirectML's formula, which is not Keras's order.)
ORDERED = ("pytorch_sgd", "pytorch_adagrad", "pytorch_adam", "pytorch_adamw")
_ORDER_OPS = ("add", "mul", "div", "sqrt")


def order_applies(case: Case, arithmetic: DeviceArithmetic | None) -> tuple[bool, str]:
  """``(applies, why not)``: whether :func:`order_mismatch` checks ``case`` on a device of ``arithmetic``.

  It applies to the float32 cases of :data:`ORDERED` (with a float32 state) where the device's
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
  if case.rule not in ORDERED or case.dtype != "float32" or case.state_dtype not in (None, "float32"):
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
  out_names = OUTPUT_NAMES[case.base_rule]
  for leaf, (x, g) in enumerate(zip(X, G)):
    s = [block[leaf] for block in state]
    want = _twin_expected(case.rule, R, case.T, x, g, s, hyper, np.float32, given)
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


def _flushes(arithmetic: DeviceArithmetic) -> bool:
  """Whether the device flushes float32 subnormal results or operands (measured)."""
  return arithmetic.tiny("float32", 0.0) > 0 or arithmetic.flushes_operands("float32")


def _touches_subnormals(record_into: list[bool]) -> Callable[..., None]:
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


class Comparison(NamedTuple):
  """The outcome of :func:`compare` on one output tensor."""

  worst: float  #: largest ``|got - want| / tol``
  at: int  #: flat index of that element
  loose: int  #: elements whose tolerance reaches their magnitude
  unchecked: int  #: finite elements with an infinite tolerance


def compare(got: np.ndarray, want: np.ndarray, tol: np.ndarray) -> Comparison:
  """Worst ``|got - want| / tol``, where, and the elements checked weakly or not at all.

  NaN must match NaN and an infinity the same infinity (ratio 0, else inf).
  Where ``tol`` is infinite the element is checked for nothing but
  finiteness: it is counted as *unchecked*, and a case with any fails
  unless it documents that limit (:attr:`Case.unchecked_limit`). Elements
  whose tolerance reaches the expected value's magnitude (cancellation in
  ``alpha * V + beta * G``) are counted as *loose*: the check holds, but
  guarantees no significant digit there.

  Example:
    >>> import numpy as np
    >>> compare(np.array([1.0, 2.5, 7.0]), np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, np.inf]))
    Comparison(worst=0.5, at=1, loose=1, unchecked=1)
  """
  want = np.asarray(want, np.float64)
  tol = np.broadcast_to(np.asarray(tol, np.float64), want.shape).ravel()
  got = np.broadcast_to(np.asarray(got).astype(np.float64), want.shape).ravel()
  want = want.ravel()
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    diff = np.abs(got - want)
    ratio = np.where(diff == 0, 0.0, diff / tol)
  same_special = (np.isnan(got) & np.isnan(want)) | (np.isinf(want) & (got == want))
  special = ~np.isfinite(got) | ~np.isfinite(want)
  ratio = np.where(special, np.where(same_special, 0.0, np.inf), ratio)
  unbounded = np.isinf(tol) & ~special
  ratio = np.where(unbounded, 0.0, ratio)
  loose = ~special & ~unbounded & (tol >= np.abs(want)) & (want != 0)
  if ratio.size == 0:
    return Comparison(0.0, 0, 0, 0)
  worst = int(np.argmax(ratio))
  return Comparison(float(ratio[worst]), worst, int(loose.sum()), int(unbounded.sum()))


@dataclass
class CaseResult:
  """The outcome of one case on one platform.

  ``worst`` is the largest error over all outputs and elements in units of
  the tolerance (``<= 1`` passes); ``where`` names that element; ``loose``
  counts the elements whose tolerance reaches their magnitude and
  ``unchecked`` those whose tolerance is infinite (see :func:`compare`).
  A case with unchecked elements passes only with ``limit``: the
  documented limit of its dtype that makes them unavoidable
  (:attr:`Case.unchecked_limit`). ``scalar_error``: the largest measured
  error of the case's per-update scalars on the device, in units of the
  scalar dtype's unit roundoff (0 with the pinned model). ``order_checked``:
  the outputs were compared with the twin's framework's float32 order to the
  bit (:func:`order_mismatch`); ``order``: where they differ (a failure);
  ``order_skipped``: why a case of :data:`ORDERED` in float32 was not compared.
  """

  rule: str
  dtype: str
  name: str
  platform: str
  worst: float
  where: str
  loose: int = 0
  count_ok: bool = True
  error: str = ""
  unchecked: int = 0
  limit: str | None = None
  wrong_dtypes: str = ""
  scalar_error: float = 0.0
  order_checked: bool = False
  order: str = ""
  order_skipped: str = ""

  @property
  def passed(self) -> bool:
    return (
      self.worst <= 1.0
      and not self.order
      and self.count_ok
      and not self.error
      and not self.wrong_dtypes
      and (self.unchecked == 0 or bool(self.limit))
    )


OUTPUT_NAMES = {
  "momentum": ("X_new", "V_new"),
  "adagrad": ("X_new", "H_new"),
  "adam": ("X_final", "V_new", "H_new"),
  "directml_adam": ("X_new", "M_new", "V_new"),
  "ort_adamw": ("X_new", "M1_new", "M2_new"),
  "ort_sgd": ("X_new",),
  "pytorch_sgd": ("X_new", "momentum_buffer"),
  "pytorch_adagrad": ("X_new", "sum"),
  "pytorch_adam": ("X_new", "exp_avg", "exp_avg_sq"),
  "pytorch_adamw": ("X_new", "exp_avg", "exp_avg_sq"),
  "keras_adam": ("X_new", "m", "v"),
}


def check_outputs(
  case: Case,
  platform: str,
  got_x,
  got_state,
  got_count: int | None,
  inputs=None,
  got_u=None,
  *,
  arithmetic: DeviceArithmetic | None = None,
  scalars: Mapping[str, tolerance.Bounded] | None = None,
) -> CaseResult:
  """Checks given outputs of ``case`` (from any implementation) against the reference.

  Values (in units of the tolerance), the new count (``T + 1``, saturating
  at the int32 maximum) and dtypes: the new parameters keep the case's
  dtype and the new state the case's ``state_dtype``. With ``got_u`` (the
  updates an Optax transform returned, per leaf) ``U`` itself is checked
  too, against :func:`expected_update`, with its own tolerance: an error in
  the step is then measured against the step, not against ``X``.

  The expectations are computed from the hyperparameters as the rule
  receives them (:func:`received`), so the tolerance charges only the
  arithmetic after that. ``arithmetic`` and ``scalars``: the device's
  measured arithmetic and the case's measured scalars (:func:`run_case`
  passes them); without them the tolerance is the pinned model's.
  """
  X, G, state = inputs if inputs is not None else case.inputs()
  received_in = received_dtype_of(case.rule, case.dtype, case.state_dtype)
  R, hyper = received(case.learning_rate, case.hyper, received_in)
  want = expected(case.rule, R, case.T, X, G, state, hyper)
  want_u = expected_update(case.rule, R, case.T, X, G, state, hyper) if got_u is not None else None
  # A schedule's rate has the dtype of a Python float's (float64 under x64: the
  # count it receives is int64 there), so the scalars' dtype is the others'.
  ordered, order_skipped = order_applies(case, arithmetic)
  if ordered and scalars is None:
    ordered, order_skipped = False, "the scalars were not measured"
  subnormal: list[bool] = []
  with tolerance.recording(_touches_subnormals(subnormal)) if ordered else contextlib.nullcontext():
    tol = tolerances(
      case.rule,
      case.dtype,
      platform,
      case.learning_rate,
      case.T,
      X,
      G,
      state,
      case.hyper,
      case.state_dtype,
      None,
      received_in,
      arithmetic=arithmetic,
      scalars=scalars,
    )
  if ordered and arithmetic is not None and subnormal and _flushes(arithmetic):
    ordered, order_skipped = False, "subnormal operands, which the device flushes (PyTorch does not)"
  names = OUTPUT_NAMES[case.base_rule]
  worst, where, loose, unchecked = 0.0, "", 0, 0
  for leaf in range(len(X)):
    got = [got_x[leaf]] + [s[leaf] for s in got_state]
    wants = list(want[leaf])
    tols = list(tol[leaf][: len(names)])
    leaf_names = list(names)
    if got_u is not None and want_u is not None:
      got, wants, tols, leaf_names = (
        got + [got_u[leaf]],
        wants + [want_u[leaf]],
        tols + [tol[leaf][-1]],
        leaf_names + ["U"],
      )
    for k, name in enumerate(leaf_names):
      ratio, index, n, m = compare(got[k], wants[k], tols[k])
      loose, unchecked = loose + n, unchecked + m
      if ratio > worst or not where:
        flat_got = np.asarray(got[k]).astype(np.float64).ravel()
        worst, where = (
          ratio,
          (
            f"{name}[leaf {leaf}, element {index}]: got {float(flat_got[index])!r}, "
            f"expected {float(np.ravel(wants[k])[index])!r}"
          ),
        )
  count_ok = got_count is None or got_count == min(case.T + 1, INT32_MAX)
  wrong = []
  checked = [(names[0], got_x, case.dtype)] + [
    (names[k + 1], s, case.state_dtype or case.dtype) for k, s in enumerate(got_state)
  ]
  if got_u is not None:
    checked.append(("U", got_u, case.dtype))
  order = ""
  if ordered and scalars is not None:
    order = order_mismatch(case, X, G, state, got_x, got_state, got_u, scalars)
  for label, arrays, dtype in checked:
    found = sorted(
      {str(np.asarray(a).dtype) for a in arrays if hasattr(a, "dtype")} - {str(numpy_dtype(dtype))}
    )
    if found:
      wrong.append(f"{label} in {', '.join(found)}, expected {dtype}")
  return CaseResult(
    case.rule,
    case.dtype,
    case.name,
    platform,
    worst,
    where,
    loose,
    count_ok,
    unchecked=unchecked,
    limit=case.unchecked_limit,
    wrong_dtypes="; ".join(wrong),
    order_checked=ordered,
    order=order,
    order_skipped=order_skipped,
  )


#: Whether :func:`run_case` charges the pinned model (documented constants, the analytic bound
#: of the scalars) instead of the device's measured arithmetic and scalars.
PINNED = False


def run_case(case: Case, platform: str = "cpu", pinned: bool | None = None) -> CaseResult:
  """Runs ``case`` through its Optax transform on ``platform`` and checks it.

  The tolerance charges the device's measured arithmetic
  (:func:`~onnx_optax.conformance.arithmetic.measure`, once per platform) and the case's scalars as
  the device computes them (:func:`~onnx_optax.conformance.scalars.measure_case`); with ``pinned``
  (default ``check.PINNED``) the documented constants instead.
  """
  pinned = PINNED if pinned is None else pinned
  inputs = case.inputs()
  R = case.R if case.schedule_steps is None else optax.linear_schedule(case.R, 0.0, case.schedule_steps)
  try:
    got_x, got_state, count, got_u = run_transform(
      case.rule,
      case.dtype,
      platform,
      R,
      case.T,
      case.hyper,
      *inputs,
      state_dtype=case.state_dtype,
      initial_count=case.initial_count,
    )
  except Exception as e:  # noqa: BLE001 -- reported as a failure with its message.
    return CaseResult(case.rule, case.dtype, case.name, platform, float("inf"), "", error=repr(e))
  if pinned:
    return check_outputs(case, platform, got_x, got_state, count, inputs, got_u)
  measured = scalars_lib.measure_case(case, platform)
  result = check_outputs(
    case,
    platform,
    got_x,
    got_state,
    count,
    inputs,
    got_u,
    arithmetic=arithmetic_lib.measure(platform),
    scalars=measured,
  )
  # The scalars' dtype: the hyperparameters' (a schedule's R too).
  u = tolerance.unit_roundoff(received_dtype(case.dtype, case.state_dtype))
  with np.errstate(divide="ignore", invalid="ignore"):
    relative = [float(b.e / (u * abs(b.v))) for b in measured.values() if b.v != 0]
  result.scalar_error = max(relative, default=0.0)
  return result
