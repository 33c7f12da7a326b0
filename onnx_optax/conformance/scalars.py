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

**Adding a rule**: write its formula below (``_<rule>(o, R, T, h, raw)``:
``o`` the arithmetic, ``h`` the float hyperparameters in it, ``raw`` every
hyperparameter as given) returning ``{name: value}`` for each scalar the
tolerance model reads by name with ``Context.value`` / ``Context.one_minus``,
and add it to :data:`FORMULAS`. A name the model asks for and the formula
does not give is an error (``KeyError``), never a silent fallback.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from onnx_optax import _engine
from onnx_optax.conformance.cases import Case, base_rule, numpy_dtype
from onnx_optax.conformance.tolerance import Bounded

__all__ = ["FORMULAS", "Measured", "clear", "exact", "measure", "measure_case"]


class Measured(Bounded):
  """A measured scalar: its exact value ``v``, the device's error ``e``, and ``got``, the distinct
  values the device computed (the folded and the run-time compilation; usually one). The check in
  the rule's own float32 order (``check.order_mismatch``) computes its expectation from them."""

  __slots__ = ("got",)

  def __init__(self, v: Any, e: Any = 0.0, got: tuple[float, ...] = ()):
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


_DECIMAL = decimal.Context(prec=45, Emin=-99999, Emax=99999, traps=[])


class _Exact:
  """Exact arithmetic: 45-digit decimals (``T`` a Python int)."""

  @staticmethod
  def log(x: decimal.Decimal) -> decimal.Decimal:
    return _DECIMAL.ln(x)

  @staticmethod
  def expm1(x: decimal.Decimal) -> decimal.Decimal:
    if x.is_finite() and abs(x) < decimal.Decimal("1e-6"):  # exp(x) - 1 cancels: the series.
      return x + x * x / 2 + x**3 / 6 + x**4 / 24 + x**5 / 120
    return _DECIMAL.subtract(_DECIMAL.exp(x), 1)

  @staticmethod
  def sqrt(x: decimal.Decimal) -> decimal.Decimal:
    return _DECIMAL.sqrt(x)

  @staticmethod
  def where(condition: bool, a: Any, b: Any) -> Any:
    return a if condition else b

  @staticmethod
  def power(beta: decimal.Decimal, T: int) -> decimal.Decimal:
    return _DECIMAL.power(beta, T + 1)

  @staticmethod
  def pytorch_power_complement(beta: float, T: int) -> decimal.Decimal:
    return _DECIMAL.subtract(1, _DECIMAL.power(decimal.Decimal(beta), T + 1))


# -- the formulas (docs/spec.md), one per rule ----------------------------------------------


def _one_minus_power(o: Any, beta: Any, T: Any) -> Any:
  """``1 - beta^T`` as the spec's number, written without cancellation: ``-expm1(T log beta)``."""
  return -o.expm1(T * o.log(beta))


def _momentum(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  return {"R": R}  # beta_adjusted = T > 0 ? beta : 1 is a choice, not arithmetic.


def _adagrad(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  return {"R": R, "r": R / (1 + T * h["decay_factor"])}


def _adam(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  R_adjusted = R * o.sqrt(_one_minus_power(o, h["beta"], T)) / _one_minus_power(o, h["alpha"], T)
  out = {
    "R": R,
    "R_adjusted": o.where(T > 0, R_adjusted, R),
    "one_minus_alpha": 1 - h["alpha"],
    "one_minus_beta": 1 - h["beta"],
  }
  if raw["norm_coefficient_post"] != 0:
    out["one_minus_post"] = 1 - h["norm_coefficient_post"]
  return out


def _directml_adam(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  Alpha = o.sqrt(_one_minus_power(o, h["beta2"], T)) / _one_minus_power(o, h["beta1"], T)
  return {
    "R": R,
    "step_size": R * Alpha,
    "one_minus_beta1": 1 - h["beta1"],
    "one_minus_beta2": 1 - h["beta2"],
  }


def _ort_adamw(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  out = {"R": R, "one_minus_alpha": 1 - h["alpha"], "one_minus_beta": 1 - h["beta"]}
  if raw["correct_bias"]:
    alpha_correction = _one_minus_power(o, h["alpha"], T)
    beta_correction = _one_minus_power(o, h["beta"], T)
    if raw["adam_mode"] == 0:
      out["alpha_correction"] = alpha_correction
      out["one_over_beta_correction"] = 1 / beta_correction
    else:
      out["lr_corrected"] = R * o.sqrt(beta_correction) / alpha_correction
  if raw["adam_mode"] == 1 and raw["weight_decay"] != 0:
    out["lr_weight_decay"] = R * h["weight_decay"]
  return out


def _ort_sgd(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  return {"R": R}


# The twins: PyTorch computes its scalars in Python float64 from Python floats; the twins
# compute the step-dependent ones on the device (float64 under x64, else float32, ``log(beta)``
# taken on the host), the constant ones on the host (rounded once where they meet a tensor,
# charged by the tolerance model without a measurement). Keras computes ``alpha`` in the
# variable's dtype from the hyperparameters rounded to it.


def _pytorch_sgd(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  return {"R": R}  # -lr and 1 - dampening are Python floats.


def _pytorch_adagrad(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  return {"R": R, "clr": R / (1 + T * h["lr_decay"])}  # clr = lr / (1 + (step - 1) * lr_decay)


def _pytorch_adam(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  beta1, beta2 = (float(b) for b in raw["betas"])
  return {
    "R": R,
    "step_size": R / o.pytorch_power_complement(beta1, T),
    "bias_correction2_sqrt": o.sqrt(o.pytorch_power_complement(beta2, T)),
  }


def _keras_adam(o: Any, R: Any, T: Any, h: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
  alpha = R * o.sqrt(1 - o.power(h["beta_2"], T)) / (1 - o.power(h["beta_1"], T))
  return {"R": R, "alpha": alpha}


#: Each rule's per-update scalars (by its name in :mod:`onnx_optax.reference`): the one place
#: where a rule declares them.
FORMULAS: dict[str, Callable[..., dict[str, Any]]] = {
  "momentum": _momentum,
  "adagrad": _adagrad,
  "adam": _adam,
  "directml_adam": _directml_adam,
  "ort_adamw": _ort_adamw,
  "ort_sgd": _ort_sgd,
  "pytorch_sgd": _pytorch_sgd,
  "pytorch_adagrad": _pytorch_adagrad,
  "pytorch_adam": _pytorch_adam,
  "pytorch_adamw": _pytorch_adam,
  "keras_adam": _keras_adam,
}


def _floats(hyper: Mapping[str, Any]) -> dict[str, float]:
  return {k: v for k, v in hyper.items() if isinstance(v, float) and not isinstance(v, bool)}


def exact(rule: str, R: float, T: int, hyper: Mapping[str, Any]) -> dict[str, decimal.Decimal]:
  """The scalars of ``rule`` (a suite or reference rule name) evaluated exactly, from the given values.

  Example:
    >>> s = exact("adam", 0.5, 1, dict(alpha=0.5, beta=0.75, norm_coefficient_post=0.0))
    >>> float(s["R_adjusted"]), float(s["one_minus_beta"])
    (0.5, 0.25)
  """
  with decimal.localcontext(_DECIMAL):
    h = {k: decimal.Decimal(v) for k, v in _floats(hyper).items()}
    return FORMULAS[base_rule(rule)](_Exact(), decimal.Decimal(R), T, h, hyper)


# -- on the device ---------------------------------------------------------------------------

_PROGRAMS: dict[Any, Callable[..., dict[str, Any]]] = {}


def clear() -> None:
  """Forgets the compiled programs (a test that changes the device's arithmetic compiles anew)."""
  _PROGRAMS.clear()


def _program(
  rule: str, hyper: Mapping[str, Any], folded: bool, schedule: tuple[float, int, int] | None
) -> Callable[..., dict[str, Any]]:
  """The jitted scalars of ``rule``: ``f(T, **floats)``; ``folded``: the floats are constants.

  ``floats`` are the float hyperparameters and ``R`` (unless a schedule gives it), Python
  floats as the transform closes over them: weakly typed, constants or traced arguments.
  """
  floats = _floats(hyper)
  static = tuple(sorted((k, v) for k, v in hyper.items() if k not in floats and k != "R"))
  # Traced: one program per structure (a formula reads the raw values only to leave out a zero term).
  values = tuple(sorted(floats.items())) if folded else tuple(sorted((k, v == 0) for k, v in floats.items()))
  key = (rule, static, values, folded, schedule)
  if key not in _PROGRAMS:
    formula = FORMULAS[base_rule(rule)]

    def scalars(T, **given):
      h = {k: jnp.asarray(v) for k, v in floats.items()} if folded else dict(given)
      R = h.pop("R", None)
      if schedule is not None:  # The transform's R: the schedule at the number of updates applied.
        init, steps, first = schedule
        R = optax.linear_schedule(init, 0.0, steps)(_engine.updates_applied(T, first))
      return formula(_Jax(), R, T, h, hyper)

    _PROGRAMS[key] = jax.jit(scalars)
  return _PROGRAMS[key]


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
    rule: a suite rule name (``cases.RULES``) or a reference rule name.
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
  from onnx_optax.conformance import check

  R_in, hyper_in = check.received(R, dict(hyper), received)
  want = exact(rule, R if schedule is not None else R_in, T, hyper_in)
  device = check.device(platform)
  errors: dict[str, float] = {name: 0.0 for name in want}
  values: dict[str, list[float]] = {name: [] for name in want}
  given = {**hyper, "R": R} if schedule is None else dict(hyper)
  floats = _floats(given)
  with jax.enable_x64(x64):
    T_dev = jax.device_put(np.asarray(T, np.int32), device)
    for folded in (True, False):
      args = {} if folded else floats
      with jax.default_device(device):
        got = _program(rule, given, folded, schedule)(T_dev, **args)
      for name, value in got.items():
        v = np.asarray(value)
        if float(v) not in values[name]:
          values[name].append(float(v))
        g = decimal.Decimal(float(v)) if np.isfinite(v) else None
        x = want[name]
        if g is None or not x.is_finite():
          same = g is None and not x.is_finite() and (str(float(v)) == str(float(x)) or math.isnan(float(v)))
          errors[name] = max(errors[name], 0.0 if same else math.inf)
        else:
          err = float(_DECIMAL.copy_abs(_DECIMAL.subtract(g, x)))
          errors[name] = max(errors[name], err * (1 + 2.0**-50))  # Rounded up from the decimal.
  return {name: Measured(float(want[name]), errors[name], tuple(values[name])) for name in want}


def measure_case(case: Case, platform: str) -> dict[str, Bounded]:
  """:func:`measure` for a case of the grid (its dtypes, its schedule)."""
  from onnx_optax.conformance import check

  dtype, state_dtype = numpy_dtype(case.dtype), numpy_dtype(case.state_dtype or case.dtype)
  schedule = None if case.schedule_steps is None else (case.R, case.schedule_steps, case.first_T)
  return measure(
    case.rule,
    platform,
    case.learning_rate,
    case.T,
    case.hyper,
    x64=np.float64 in (dtype, state_dtype),
    received=check.received_dtype_of(case.rule, case.dtype, case.state_dtype),
    schedule=schedule,
  )
