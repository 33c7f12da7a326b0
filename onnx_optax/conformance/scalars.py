"""The per-update scalars, evaluated by the runner on the device under test.

Each rule computes some scalars once per update from its hyperparameters
and ``T``: the bias corrections ``1 - beta^T`` (as ``-expm1(T log beta)``),
``R_adjusted``, DirectML's ``LearningRate * Alpha``, Adagrad's decayed rate,
ORT AdamW's ``lr_corrected``, ``1 / beta_correction`` and
``lr * weight_decay``, the decays' ``1 - beta``, and the learning rate
``R`` itself (``"R"`` in every formula: a schedule computes it on the
device). Their accuracy depends on
the device's ``log``, ``expm1``, square root and division, which no standard
fixes. So the runner does not assume it: :func:`measure` evaluates the
spec's formula of each scalar **in this module's own code** (never by
calling the rule) on the device, jitted, with the rule's inputs (the
hyperparameters as the Python floats the transform closes over, ``T`` as
its int32 count, a schedule's ``R`` from the schedule at the count the
transform passes it), and compares with
the exact value (45-digit decimals, from the hyperparameters as the rule
receives them). The tolerance charges that actual error for the case
(:meth:`onnx_optax.conformance.tolerance.Context.value`).

Each formula is evaluated twice on the device: with the hyperparameters as
compile-time constants (which XLA may fold, on the host) and as run-time
arguments (computed by the device), and the larger error of the two is
charged, so that either way of compiling the rule's program is covered.

A rule whose scalar is wrong still fails: the expectation
(:mod:`onnx_optax.reference`) is independent of this measurement, which
only sizes the tolerance.

**The formulas** are each rule's, registered with its bound model
(:class:`~onnx_optax.conformance.tolerance.BoundModel`'s ``scalars``, in
:mod:`onnx_optax.conformance.models`): ``scalars(o, R, T, h, raw)``, ``o``
the arithmetic (``_Jax`` on the device, ``_Exact`` in decimals),
``h`` the float hyperparameters in it, ``raw`` every hyperparameter as
given, returning ``{name: value}`` for each scalar the rule's bounds read
by name with ``Context.value`` / ``Context.one_minus``. A name the bounds
ask for and the formula does not give is an error (``KeyError``), never a
silent fallback; and a formula gives only the scalars its bounds read (``R``
aside), since the report's ``scalars`` figure is the largest of their errors.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from onnx_optax import _engine
from onnx_optax.conformance import arithmetic, devices, models, tolerance  # noqa: F401 (models: they register)
from onnx_optax.conformance.cases import Case, base_rule, numpy_dtype, received_dtype_of
from onnx_optax.conformance.programs import Batch
from onnx_optax.conformance.tolerance import Bounded

__all__ = ["Measured", "exact", "exact_case", "formula", "measure", "measure_case", "start", "start_case"]


class Measured(Bounded):
  """A measured scalar: its exact value ``v``, the device's error ``e``, and ``got``, the distinct
  values the device computed (the folded and the run-time compilation; usually one). The check in
  the rule's own float32 order (``check.order_mismatch``) computes its expectation from them."""

  __slots__ = ("got",)

  def __init__(self, v: Any, e: Any, got: tuple[float, ...]):
    super().__init__(v, e)
    self.got = got


class _Jax:
  """The device's arithmetic: jnp (``T`` and the results are arrays, traced under jit)."""

  @staticmethod
  def log(x: Any) -> Any:
    return jnp.log(x)

  @staticmethod
  def expm1(x: Any) -> Any:
    return jnp.expm1(x)

  @staticmethod
  def sqrt(x: Any) -> Any:
    return jnp.sqrt(x)

  @staticmethod
  def where(condition: Any, a: Any, b: Any) -> Any:
    return jnp.where(condition, a, b)

  @staticmethod
  def power(beta: Any, T: Any) -> Any:
    """Keras's ``beta ** (T + 1)``: ``T`` cast to ``beta``'s dtype, plus one, then ``pow``."""
    return jnp.power(beta, jnp.asarray(T).astype(beta.dtype) + 1)

  @staticmethod
  def pytorch_power_complement(beta: float, T: Any) -> Any:
    """PyTorch's ``1 - beta ** step`` (``step = T + 1``, ``beta`` a Python float) on the device:
    float64 under x64; else ``-expm1(step * log(beta))``, ``log`` of the float64 ``beta`` on the host."""
    dtype = jnp.result_type(float)
    step = jnp.asarray(T, dtype) + 1
    if dtype == jnp.float64:
      return 1 - jnp.asarray(beta, dtype) ** step
    if beta == 0:
      return jnp.ones((), dtype)
    return -jnp.expm1(step * jnp.asarray(math.log(beta), dtype))


class _Exact:
  """Exact arithmetic: 45-digit decimals (``T`` a Python int)."""

  @staticmethod
  def log(x: decimal.Decimal) -> decimal.Decimal:
    return arithmetic.DECIMAL.ln(x)

  expm1 = staticmethod(arithmetic.decimal_expm1)

  @staticmethod
  def sqrt(x: decimal.Decimal) -> decimal.Decimal:
    return arithmetic.DECIMAL.sqrt(x)

  @staticmethod
  def where(condition: bool, a: Any, b: Any) -> Any:
    return a if condition else b

  @staticmethod
  def power(beta: decimal.Decimal, T: int) -> decimal.Decimal:
    return arithmetic.DECIMAL.power(beta, T + 1)

  @staticmethod
  def pytorch_power_complement(beta: float, T: int) -> decimal.Decimal:
    return arithmetic.DECIMAL.subtract(1, arithmetic.DECIMAL.power(decimal.Decimal(beta), T + 1))


def formula(rule: str) -> Callable[..., dict[str, Any]]:
  """The spec's per-update scalars of ``rule`` (a suite or a registered rule's name), as its bound
  model declares them."""
  return tolerance.model(base_rule(rule)).scalars


def _floats(hyper: Mapping[str, Any]) -> dict[str, float]:
  return {k: v for k, v in hyper.items() if isinstance(v, float) and not isinstance(v, bool)}


def exact(rule: str, R: float, T: int, hyper: Mapping[str, Any]) -> dict[str, decimal.Decimal]:
  """The scalars of ``rule`` (a suite or reference rule name) evaluated exactly, from the given values.

  Example:
    >>> s = exact("adam", 0.5, 1, dict(alpha=0.5, beta=0.75, norm_coefficient_post=0.0))
    >>> float(s["R_adjusted"]), float(s["one_minus_beta"])
    (0.5, 0.25)
  """
  with decimal.localcontext(arithmetic.DECIMAL):
    h = {k: decimal.Decimal(v) for k, v in _floats(hyper).items()}
    return formula(rule)(_Exact(), decimal.Decimal(R), T, h, hyper)


# -- on the device ---------------------------------------------------------------------------


def _program(
  rule: str,
  hyper: Mapping[str, Any],
  folded: bool,
  schedule: tuple[float, int, int] | None,
  platform: str,
  x64: bool,
) -> tuple[Callable[..., dict[str, Any]], Hashable]:
  """The scalars of ``rule`` as a function ``f(T, floats)`` to jit, and the key of its program.

  ``floats`` are the float hyperparameters and ``R`` (unless a schedule gives it), Python
  floats as the transform closes over them: weakly typed, constants (``folded``: ``f`` ignores
  its ``floats`` and bakes them in) or traced arguments. Traced: one program per structure (a
  formula reads the raw values only to leave out a zero term).
  """
  floats = _floats(hyper)
  static = tuple(sorted((k, v) for k, v in hyper.items() if k not in floats and k != "R"))
  values = tuple(sorted(floats.items())) if folded else tuple(sorted((k, v == 0) for k, v in floats.items()))
  scalars_of = formula(rule)

  def scalars(T, given):
    h = {k: jnp.asarray(v) for k, v in floats.items()} if folded else dict(given)
    R = h.pop("R", None)
    if schedule is not None:  # The transform's R: the schedule at the number of updates applied.
      init, steps, first = schedule
      R = optax.linear_schedule(init, 0.0, steps)(_engine.updates_applied(T, first))
    return scalars_of(_Jax(), R, T, h, hyper)

  return scalars, ("scalars", rule, static, values, folded, schedule, platform, x64)


def start(
  rule: str,
  platform: str,
  R: float,
  T: int,
  hyper: Mapping[str, Any],
  *,
  x64: bool,
  received: Any,
  schedule: tuple[float, int, int] | None = None,
  batch: Batch | None = None,
  memo: dict[Hashable, Callable[[], dict[str, Bounded]]] | None = None,
) -> Callable[[], dict[str, Bounded]]:
  """:func:`measure`, added to ``batch`` (shared by the cases of a row that have the same scalar
  programs; default a batch of its own, closed here); call the result, after the batch is
  closed, for the measurement.

  ``memo``: the measurements of one run, by everything that decides them (the rule, the
  platform, x64, the received dtype, the schedule, ``T``, ``R`` and the hyperparameters): a
  case whose scalars are those of an earlier case (the float32, float16 and bfloat16 rows of a
  rule compute the same scalars from the same values) reads that measurement, made once.
  """
  if memo is not None:
    once: Hashable = (
      rule,
      platform,
      x64,
      str(np.dtype(received)),
      schedule,
      T,
      R,
      tuple(sorted(hyper.items())),
    )
    if once not in memo:
      memo[once] = _once(
        start(rule, platform, R, T, hyper, x64=x64, received=received, schedule=schedule, batch=batch)
      )
    return memo[once]
  own = batch is None
  batch = Batch() if batch is None else batch
  device = devices.device(platform)
  given = {**hyper, "R": R} if schedule is None else dict(hyper)
  floats = _floats(given)
  runs = []
  with jax.enable_x64(x64):
    T_dev = jax.device_put(np.asarray(T, np.int32), device)
    for folded in (True, False):
      function, key = _program(rule, given, folded, schedule, platform, x64)
      args = (T_dev, {} if folded else floats)
      runs.append(batch.add(key, function, *args))
    if own:
      with jax.default_device(device):
        batch.close()

  def finish() -> dict[str, Bounded]:
    want = _exact_received(rule, R, T, hyper, received, scheduled=schedule is not None)
    errors: dict[str, float] = {name: 0.0 for name in want}
    values: dict[str, list[float]] = {name: [] for name in want}
    with jax.enable_x64(x64):
      for run in runs:
        for name, value in run().items():
          v = np.asarray(value)
          if float(v) not in values[name]:
            values[name].append(float(v))
          g = decimal.Decimal(float(v)) if np.isfinite(v) else None
          x = want[name]
          if g is None or not x.is_finite():
            same = g is None and not x.is_finite()
            same = same and (str(float(v)) == str(float(x)) or math.isnan(float(v)))
            errors[name] = max(errors[name], 0.0 if same else math.inf)
          else:
            err = float(arithmetic.DECIMAL.copy_abs(arithmetic.DECIMAL.subtract(g, x)))
            errors[name] = max(errors[name], err * (1 + 2.0**-50))  # Rounded up from the decimal.
    return {name: Measured(float(want[name]), errors[name], tuple(values[name])) for name in want}

  return finish


def measure(
  rule: str,
  platform: str,
  R: float,
  T: int,
  hyper: Mapping[str, Any],
  *,
  x64: bool,
  received: Any,
  schedule: tuple[float, int, int] | None = None,
) -> dict[str, Bounded]:
  """The scalars of ``rule`` as the first ``platform`` device computes them, with their errors.

  Args:
    rule: a suite rule name (``cases.names()``) or a registered rule's name.
    R, T, hyper: the learning rate (the spec's ``R`` of this update), the
      count and the hyperparameters, as the transform is given them.
    x64: whether the rule runs under ``jax.enable_x64`` (float64 cases).
    received: the dtype a Python float reaches the rule in (float32, or
      float64 under x64): the exact values are computed from the
      hyperparameters rounded to it.
    schedule: ``(R0, steps, initial_count)`` when the learning rate is
      ``optax.linear_schedule(R0, 0, steps)`` evaluated at ``T - initial_count``.

  Returns:
    ``{name: Measured(exact value, |device's value - exact value|, device's values)}``, the
    error the larger of the two compilations (see the module docstring).
  """
  return start(rule, platform, R, T, hyper, x64=x64, received=received, schedule=schedule)()


def _once(finish: Callable[[], dict[str, Bounded]]) -> Callable[[], dict[str, Bounded]]:
  """``finish``, called at most once (its result kept)."""
  done: list[dict[str, Bounded]] = []

  def once() -> dict[str, Bounded]:
    if not done:
      done.append(finish())
    return done[0]

  return once


def start_case(
  case: Case,
  platform: str,
  batch: Batch | None = None,
  memo: dict[Hashable, Callable[[], dict[str, Bounded]]] | None = None,
) -> Callable[[], dict[str, Bounded]]:
  """:func:`start` for a case of the grid (its dtypes, its schedule); ``memo``: :func:`start`'s."""
  dtype, state_dtype = numpy_dtype(case.dtype), numpy_dtype(case.state_dtype or case.dtype)
  schedule = None if case.schedule_steps is None else (case.R, case.schedule_steps, case.first_T)
  return start(
    case.rule,
    platform,
    case.learning_rate,
    case.T,
    case.hyper,
    x64=np.float64 in (dtype, state_dtype),
    received=received_dtype_of(case.rule, case.dtype, case.state_dtype),
    schedule=schedule,
    batch=batch,
    memo=memo,
  )


def _exact_received(
  rule: str, R: float, T: int, hyper: Mapping[str, Any], received: Any, scheduled: bool
) -> dict[str, decimal.Decimal]:
  """:func:`exact` from the hyperparameters as the rule receives them (a schedule's ``R`` as computed)."""
  R_in, hyper_in = devices.received(R, dict(hyper), received)
  return exact(rule, R if scheduled else R_in, T, hyper_in)


def exact_case(case: Case) -> dict[str, decimal.Decimal]:
  """The scalars of a case of the grid evaluated exactly, as :func:`measure_case` compares them."""
  received = received_dtype_of(case.rule, case.dtype, case.state_dtype)
  return _exact_received(
    case.rule, case.learning_rate, case.T, case.hyper, received, scheduled=case.schedule_steps is not None
  )


def measure_case(case: Case, platform: str) -> dict[str, Bounded]:
  """:func:`measure` for a case of the grid (its dtypes, its schedule)."""
  return start_case(case, platform)()
