"""The tolerance model: a rigorous error bound per output element.

The suite compares what the Optax transforms compute in a dtype ``d``
(float64, float32, float16, bfloat16) with the spec evaluated in float64 by
:mod:`onnx_optax.reference`, from the same inputs (tensors rounded to ``d``
first, hyperparameters as the Python floats the user passed). The allowed
difference is not a fixed ``rtol``: it is a bound on the rounding error of
the arithmetic the rule performs, evaluated element by element on the
actual operands. Each output's tolerance is::

    tolerance = bound(implementation in d) + bound(reference in float64)

Each bound comes from *running error analysis*: every intermediate of the
spec's formula carries its exact value ``v`` (evaluated in float64) and a
bound ``e`` on ``|computed - v|``. Operands that are inputs are exact
(``e = 0``); a hyperparameter rounded to ``d`` carries its actual rounding
error. Every operation propagates its operands' errors and adds its own
rounding (``u``: the unit roundoff of the dtype, ``2**-p``; ``tiny``: the
absolute error of an underflow)::

    a + b, a - b :  e = e_a + e_b                       + u*(|v| + e) + tiny
    a * b        :  e = |a| e_b + |b| e_a + e_a e_b     + u*(|v| + e) + tiny
    a / b        :  e = (|b| e_a + |a| e_b) / (|b| (|b| - e_b))  + k_div u*(|v| + e) + tiny
    sqrt(a)      :  e = min(e_a / sqrt(a), sqrt(e_a))   + k_sqrt u*(|v| + e) + tiny

These are not first-order estimates: each line bounds the error whatever the
operands' errors are (the division is unbounded, ``inf``, when ``e_b``
reaches ``|b|``). Because the bound is built from the magnitudes of the
*operands*, cancellation is accounted for where it happens: ``X - step``
with ``X`` and ``step`` of similar size has an error of the order of
``u*|X|``, far more than ``u*|X - step|``.

The implementation's dtype policy (see :mod:`onnx_optax.rules`) is part of
the model:

* hyperparameters used element-wise (``alpha``, ``beta``, ``epsilon``,
  ``norm_coefficient``...) are rounded to ``d``: their actual rounding error
  (directly, or through float32 when the rule rounds twice) is the operand's
  error;
* scalars that depend on ``T`` (bias corrections, Adagrad's decayed rate,
  ``beta_adjusted``, ``R`` itself) are computed in the hyperparameter dtype
  ``h`` (float32, float64 under x64), then rounded once to ``d``. Their error
  is the one the runner *measured* for the case on the device
  (:attr:`Context.measured`, :mod:`onnx_optax.conformance.scalars`). Without
  a measurement (the pinned model, :func:`implementation_context` without
  ``scalars``) it is an analytic bound in ``h``: ``1 - beta**T`` computed as
  ``-expm1(T*log(beta))``, the rounding of ``beta`` to ``h`` taken exactly (for
  ``beta = 0.999`` and small ``T``, float32's ``beta`` moves ``1 - beta**T``
  by about ``1000 u``), and ``K_TRANSCENDENTAL`` unit roundoffs for each of
  ``log`` and ``expm1``;
* the decays' ``1 - alpha``, ``1 - beta`` (and ``1 - norm_coefficient_post``)
  are such scalars too (``rules._one_minus``): the decay is rounded to ``h``,
  subtracted there, and the difference rounded once to ``d``
  (:meth:`Context.one_minus`). Nothing more is charged: in particular not a
  rounding of the decay to ``d`` before the subtraction, which in bfloat16
  turns ``1 - 0.999`` into 0 (a rule that did it must fail, and does:
  ``tests/conformance/test_conformance_teeth.py``);
* ``X + U`` (``optax.apply_updates``) is ``X - step`` with one rounding, as
  the rules guarantee; ONNX Adam with ``norm_coefficient_post != 0`` adds the
  two roundings of ``U = X_final - X`` and ``X + U``;
* with a ``state_dtype`` other than the parameters' dtype the rule runs in
  the wider of the two; ``U`` is rounded to the parameters' dtype before
  ``X + U`` there (``Context.param``) and the new state to the state's dtype
  (``Context.state``) where they are narrower.

What a platform may do and the bound still covers:

* fuse ``a*b + c`` into an FMA (one rounding where the bound counts two),
  keep an intermediate in a wider type (XLA's excess precision for float16
  and bfloat16: a rounding skipped);
* approximate division, square root, products and sums: ``k_div``,
  ``k_sqrt``, ``k_mul``, ``k_add`` are the device's measured ones
  (:mod:`onnx_optax.conformance.arithmetic`), never below the documented
  floors: ``1`` on CPU and in float64 (IEEE), ``1 + 3*u32/u`` for division
  and square root elsewhere, i.e. 1.5 ulp of float32 on top of the final
  rounding to ``d`` (float16/bfloat16 are computed in float32 and rounded);
* flush subnormal results to zero: ``tiny`` is at least the smallest normal
  number (XLA's CPU flushes float32 and float64 results, TPUs every dtype),
  except for float16 off TPUs (computed in float32, where float16's
  subnormals are normal): half its smallest subnormal; more if measured;
* read subnormal operands as zero (measured: XLA's CPU does in float32,
  float64, bfloat16): an exact input below the smallest normal number is
  then charged whole (:attr:`Context.flushes_operands`).

**Measured and assumed.** Measured on the device under test, every run: the
element-wise ``k`` and ``tiny`` (over a sweep of every binade, subnormals and
the grid's own operands; a lower bound of the device's worst case, so the
documented floor is kept), whether subnormal operands are read as zero, and
each case's per-update scalars (their actual error). Assumed: the floors
above (they only raise a measurement), the expectation's NumPy arithmetic on
the host (IEEE float64, ``pow`` within one ulp; charged by its own bound),
and that an operation rounds the same inside the rule's fused program as
alone. Each assumption, if false, makes the bound too tight, so a correct
rule fails; none can make a wrong rule pass. docs/conformance.md
("Measured, not assumed") has the table.

The reference's own bound uses the same rules in float64 with exact
hyperparameters, ``1 - beta**T`` by ``pow`` (one ulp) and a subtraction,
and IEEE operations: it is what makes float64 comparisons possible at all,
and it is negligible for every other dtype.

A correct implementation reaches a fraction of the tolerance (rounding
errors do not all reach their bound at once); the teeth test in
``tests/conformance`` shows that the wrong variants of every rule exceed it.

**Two layers.** This module is the generic error algebra: :class:`Bounded`,
the rounding :class:`Context` of an implementation, an expectation or ONNX's
evaluator, and the registry of the rules' *bound models*. A bound model is
one rule's formula written in that algebra, in the rule's evaluation order,
together with the spec's formulas of its per-update scalars (which
:mod:`onnx_optax.conformance.scalars` evaluates on the device); each lives
in :mod:`onnx_optax.conformance.models`, one module per rule (or family),
registered under the rule's name with :func:`register_model`. A rule
registered from outside the package registers its own::

    from onnx_optax.conformance import tolerance

    def sign_sgd_bounds(c, R, T, X, G):           # c: a Context
      X, G = c.exact(X), c.exact(G)
      step = c.mul(c.rate(R), c.exact(np.sign(G.v)))
      X_new = c.finish(X, step)
      return X_new, c.update_of(X, X_new, step)   # the outputs, then U

    def sign_sgd_scalars(o, R, T, h, raw):        # the spec's per-update scalars
      return {"R": R}

    tolerance.register_model("sign_sgd", bounds=sign_sgd_bounds, scalars=sign_sgd_scalars)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
  from onnx_optax.conformance.arithmetic import DeviceArithmetic

__all__ = [
  "BoundModel",
  "Bounded",
  "Context",
  "K_TRANSCENDENTAL",
  "bounds",
  "documented_k",
  "evaluate",
  "evaluator_context",
  "implementation_context",
  "model",
  "promote",
  "recording",
  "reference_context",
  "register_model",
  "scalar_context",
  "unit_roundoff",
  "unregister_model",
]

#: Unit roundoffs (in units of u) allowed for each of ``log``, ``expm1`` and ``exp`` by the *pinned*
#: model only (no measured scalars, see :func:`implementation_context`): two ulps each, a
#: figure from documentation. IEEE does not specify them, and XLA:CPU's float32 ``expm1``
#: exceeds it (about 5.4 ulp): the runner charges each case's measured scalars instead.
K_TRANSCENDENTAL = 4.0

_RECORDER: list[Callable[..., None]] = []


@contextlib.contextmanager
def recording(record: Callable[..., None]) -> Iterator[None]:
  """Within this context every operation of an implementation context calls ``record(op, dtype, *operands)``.

  ``op`` is ``"add"`` (``a - b`` as ``a + (-b)``), ``"mul"``, ``"div"`` or
  ``"sqrt"``; the operands are the exact values (float64 arrays). The
  runner measures the device's arithmetic on them
  (:func:`onnx_optax.conformance.check.grid_operands`).
  """
  _RECORDER.append(record)
  try:
    yield
  finally:
    _RECORDER.pop()


_U32 = 2.0**-24


def unit_roundoff(dtype: Any) -> float:
  """``2**-p``: half the distance from 1 to the next number of ``dtype``."""
  return float(ml_dtypes.finfo(dtype).eps) / 2


def _round(value: float, dtype: Any) -> float:
  return float(np.asarray(value, dtype=np.float64).astype(dtype).astype(np.float64))


class Bounded:
  """An exact value (float64 array) with a bound on its computed value's error."""

  __slots__ = ("v", "e")

  def __init__(self, v: Any, e: Any = 0.0):
    self.v = np.asarray(v, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    # Never written in place: an error of the value's shape is kept as it is, others broadcast.
    self.e = e if e.shape == self.v.shape else e + np.zeros_like(self.v)

  def __repr__(self) -> str:
    return f"Bounded(v={self.v!r}, e={self.e!r})"


@dataclass(frozen=True)
class Context:
  """How one evaluation of a rule rounds.

  Attributes:
    dtype: the dtype of the element-wise arithmetic.
    u: its unit roundoff.
    tiny: the absolute error an underflow may add to one operation.
    k_div, k_sqrt: unit roundoffs allowed for a division, a square root.
    hyper_dtype: dtype of the ``T``-dependent scalars; None: exact
      hyperparameters, ``pow`` for powers, no rounding to ``dtype`` (the
      float64 reference).
    scalar: the context of the scalar computations (``hyper_dtype``).
    float32_attributes: whether the hyperparameters arrive as float32
      attributes whose ``1 - attribute`` is rounded to float32 (ONNX's
      evaluator, see :func:`evaluator_context`).
    param: when the parameters' dtype is narrower than the compute dtype
      (``state_dtype=float32`` with float16 parameters), its context: the
      update is rounded to it, then added to ``X`` in it.
    state: when the state's dtype is narrower than the compute dtype
      (``state_dtype=bfloat16`` with float32 parameters), its context: the
      new state is rounded to it (:meth:`store`).
    received: the dtype the hyperparameters reach the rule in (float32 for a
      Python float without x64, float64 with it); None: the Python floats
      themselves. With it, the exact value of a hyperparameter is its value
      in that dtype (the expectation is computed from those values too), and
      only the roundings the rule performs after receiving it are charged.
    k_add, k_mul: unit roundoffs allowed for a sum (difference), a product.
    measured: the per-update scalars of the case as the device computed them
      (:mod:`onnx_optax.conformance.scalars`), by name: each one's exact value
      and its measured error, charged in place of the scalar context's
      bound (:meth:`value`). None: the pinned model (the scalar context's
      analytic bound, ``K_TRANSCENDENTAL`` for ``log`` and ``expm1``).
    flushes_operands: the device reads a subnormal operand as 0: an exact
      input below the smallest normal number carries its whole value as error.
  """

  dtype: Any
  u: float
  tiny: float
  k_div: float = 1.0
  k_sqrt: float = 1.0
  hyper_dtype: Any = None
  scalar: Context | None = None
  float32_attributes: bool = False
  param: Context | None = None
  state: Context | None = None
  received: Any = None
  k_add: float = 1.0
  k_mul: float = 1.0
  measured: Mapping[str, Bounded] | None = None
  flushes_operands: bool = False

  # -- rounding ---------------------------------------------------------------
  def _rounded(self, v: np.ndarray | np.float64, e: np.ndarray | np.float64, k: float = 1.0) -> Bounded:
    # e + k u (|v| + e) + tiny, each operation as written, the temporaries reused.
    t = np.abs(v) + e
    t *= k * self.u
    t += e
    t += self.tiny
    return Bounded(v, t)

  def _record(self, op: str, *operands: Any) -> None:
    if _RECORDER and self.hyper_dtype is not None:
      _RECORDER[-1](op, self.dtype, *operands)

  def add(self, a: Bounded, b: Bounded) -> Bounded:
    self._record("add", a.v, b.v)
    return self._rounded(a.v + b.v, a.e + b.e, self.k_add)

  def sub(self, a: Bounded, b: Bounded) -> Bounded:
    self._record("add", a.v, -b.v)
    return self._rounded(a.v - b.v, a.e + b.e, self.k_add)

  def value(self, name: str, bound: Callable[[], Bounded]) -> Bounded:
    """The per-update scalar ``name`` of the scalar context, before its rounding to ``dtype``.

    With :attr:`measured` (an implementation context of the runner): the
    device's own value of the scalar, its error measured against the exact
    value. Otherwise ``bound()``: the scalar context's analytic bound (the
    pinned model, and every expectation).
    """
    if self.hyper_dtype is None or self.measured is None:
      return bound()
    if name not in self.measured:
      raise KeyError(
        f"the scalar {name!r} was not measured: declare it in onnx_optax/conformance/scalars.py "
        f"(measured: {sorted(self.measured)})"
      )
    return self.measured[name]

  def rate(self, R: float) -> Bounded:
    """The learning rate as the element-wise arithmetic gets it, rounded to ``dtype``.

    A Python float (:meth:`const`), or a schedule's value computed on the
    device: with :attr:`measured`, its measured error (scalar ``"R"``) where
    there is one, rounded once to ``dtype``.
    """
    measured = self.value("R", lambda: Bounded(self.exact_hyper(R)))
    return self.const(R) if not np.any(measured.e) else self.to_elementwise(measured)

  def one_minus(self, value: float, name: str | None = None) -> Bounded:
    """``1 - value`` for a Python-float hyperparameter (a decay), as this context computes it.

    The implementation (``hyper_dtype`` set) follows ``rules._one_minus``:
    ``value`` rounded to the hyperparameter dtype, ``1 - value`` computed
    there, and the difference rounded once to ``dtype``. Only that is
    charged, not a rounding of ``value`` to ``dtype`` first: bfloat16 rounds
    ``beta = 0.999`` to 1, and a rule that subtracted after that rounding
    would compute ``1 - beta = 0`` and must fail.

    The reference (no ``hyper_dtype``) subtracts in float64; the evaluator
    (``float32_attributes``) gets ``value`` as a float32 attribute and rounds
    ``1 - value`` to float32, a rounding known exactly (often 0, by
    Sterbenz' lemma).
    """
    if self.float32_attributes:
      v = np.float64(1.0 - self.exact_hyper(value))
      return Bounded(v, np.abs(v.astype(np.float32).astype(np.float64) - v))
    if self.hyper_dtype is None:
      return self.sub(self.exact(1.0), self.const(value))
    s = self.scalar
    if s is None:  # Every context with a hyper_dtype has one (implementation_context).
      raise ValueError("a context with hyper_dtype needs its scalar context")
    bound = lambda: s.sub(s.exact(1.0), s.const(value))  # noqa: E731
    return self.to_elementwise(bound() if name is None else self.value(name, bound))

  def update(self, U: Bounded) -> Bounded:
    """The update ``U`` as the transform returns it: rounded to the parameters' dtype (``param``)."""
    if self.param is None:
      return U
    return self.param._rounded(U.v, U.e)

  def apply(self, X: Bounded, U: Bounded) -> Bounded:
    """``X + U`` in the parameters' dtype, ``U`` rounded to it first (``param``)."""
    if self.param is None:
      return self.add(X, U)
    return self.param.add(X, self.update(U))

  def finish(self, X: Bounded, step: Bounded) -> Bounded:
    """The spec's ``X - step``; with ``param``, ``X + round(-step)`` in its dtype."""
    if self.param is None:
      return self.sub(X, step)
    return self.apply(X, Bounded(-step.v, step.e))

  def update_of(self, X: Bounded, X_new: Bounded, step: Bounded) -> Bounded:
    """The update of a rule whose ``X_new`` is ``X - step``.

    The implementation (``hyper_dtype`` set) returns ``U = -step``, rounded
    to the parameters' dtype: its error is the step's, without the
    cancellation against ``X``. An expectation (no ``hyper_dtype``) has only
    ``X_new``: its ``U`` is ``X_new - X``, one more rounding in its dtype.
    """
    if self.hyper_dtype is not None:
      return self.update(Bounded(-step.v, step.e))
    return self.sub(X_new, X)

  def store(self, S: Bounded) -> Bounded:
    """A new state tensor as stored: rounded to the state's dtype (``state``)."""
    if self.state is None:
      return S
    return self.state._rounded(S.v, S.e)

  def mul(self, a: Bounded, b: Bounded) -> Bounded:
    self._record("mul", a.v, b.v)
    # A product's error: an exact factor (error 0, or value 0) contributes none, even against an
    # unbounded one (0 x inf is 0 here, not NaN: the other factor's bound stays inf on its own).
    with np.errstate(invalid="ignore"):
      e = np.abs(a.v) * b.e + np.abs(b.v) * a.e + a.e * b.e
      if np.isnan(e).any():
        terms = (np.abs(a.v) * b.e, np.abs(b.v) * a.e, a.e * b.e)
        e = sum(np.nan_to_num(t, nan=0.0, posinf=np.inf) for t in terms)
    return self._rounded(a.v * b.v, e, self.k_mul)

  def div(self, a: Bounded, b: Bounded) -> Bounded:
    self._record("div", a.v, b.v)
    with np.errstate(divide="ignore", invalid="ignore"):
      margin = np.abs(b.v) - b.e
      v = a.v / b.v
      e = np.where(margin > 0, (np.abs(b.v) * a.e + np.abs(a.v) * b.e) / (np.abs(b.v) * margin), np.inf)
      # An exact 0 / exact b is exactly 0 (Adagrad and Adam with G = 0).
      e = np.where((a.v == 0) & (a.e == 0) & (margin > 0), 0.0, e)
    return self._rounded(v, e, self.k_div)

  def div_by_scalar(self, a: Bounded, s: Bounded, name: str | None = None) -> Bounded:
    """``a / s`` for a per-update scalar ``s`` of the scalar context.

    The implementation (``hyper_dtype`` set) multiplies by the reciprocal, a
    scalar like the others: ``1 / s`` in the scalar context (or the measured
    scalar ``name``), rounded once to ``dtype``, then one product (XLA
    rewrites a division by a scalar so). An expectation divides.
    """
    if self.hyper_dtype is None:
      return self.div(a, s)
    scalar = scalar_context(self)
    bound = lambda: scalar.div(scalar.exact(1.0), s)  # noqa: E731
    return self.mul(a, self.to_elementwise(bound() if name is None else self.value(name, bound)))

  def sqrt(self, a: Bounded) -> Bounded:
    self._record("sqrt", a.v)
    with np.errstate(divide="ignore", invalid="ignore"):
      root = np.sqrt(a.v)
      e = np.minimum(np.where(root > 0, a.e / root, np.inf), np.sqrt(a.e))
    return self._rounded(root, e, self.k_sqrt)

  # -- constants and scalars ----------------------------------------------------
  def exact(self, value: Any) -> Bounded:
    """An exact operand; where the device reads subnormal operands as 0, such a value is all error."""
    if not self.flushes_operands:
      return Bounded(value, 0.0)
    v = np.asarray(value, np.float64)
    normal = float(ml_dtypes.finfo(self.dtype).smallest_normal)
    return Bounded(v, np.where(np.abs(v) < normal, np.abs(v), 0.0))

  def exact_hyper(self, value: float) -> float:
    """A hyperparameter's exact value: as received (``received``), else the Python float."""
    return value if self.received is None else _round(value, self.received)

  def const(self, value: float, received: bool = True) -> Bounded:
    """A Python-float hyperparameter rounded to ``dtype`` (directly or through ``hyper_dtype``).

    Its exact value is :meth:`exact_hyper` (``received=False``: ``value``
    itself, for a number that is not a hyperparameter, ``float(T)``).
    """
    exact = self.exact_hyper(value) if received else value
    if self.hyper_dtype is None:
      return Bounded(exact)
    return Bounded(exact, max(abs(p - exact) for p in self._rounding_paths(value)))

  def _rounding_paths(self, value: float) -> list[float]:
    """The values a Python-float hyperparameter takes in ``dtype``: rounded to it directly, or
    first to ``hyper_dtype`` (each is how some layer receives it)."""
    return [_round(value, self.dtype), _round(_round(value, self.hyper_dtype), self.dtype)]

  def to_elementwise(self, s: Bounded) -> Bounded:
    """Rounds a scalar of the hyperparameter dtype once to ``dtype``."""
    if self.hyper_dtype is None:
      return s
    return self._rounded(s.v, s.e)

  def one_minus_power(self, beta: float, T: int) -> Bounded:
    """``1 - beta**T`` as the scalar context computes it, ``beta`` as received."""
    beta = self.exact_hyper(beta)
    value = 1.0 - float(beta) ** T
    if self.hyper_dtype is None:  # NumPy float64: pow (one ulp) and a subtraction.
      power = float(beta) ** T
      return self._rounded(np.float64(value), np.float64(2 * self.u * power))
    if beta in (0.0, 1.0):
      return Bounded(value)  # log and expm1 are exact there (-inf -> -1, 0 -> 0).
    beta_h = _round(beta, self.hyper_dtype)
    value = -np.expm1(T * np.log(beta))
    e0 = abs(-np.expm1(T * np.log(beta_h)) - value)
    x = T * np.log(beta_h)
    # expm1's condition number at x <= 0 is |x e^x / expm1(x)| <= 1.
    condition = abs(x * np.exp(x) / np.expm1(x)) if x != 0 else 1.0
    # log's error, the rounding of float(T) and of the product, then expm1's.
    k = (K_TRANSCENDENTAL + 2) * condition + K_TRANSCENDENTAL
    return Bounded(value, e0 + k * self.u * (abs(value) + e0) + self.tiny)

  def power_complement(self, beta: float, T: int) -> Bounded:
    """``1 - beta**T`` as a ``pow`` then a subtraction in the scalar context (Keras's order, and
    PyTorch's under ``jax_enable_x64``), ``beta`` as received, rounded to the context's dtype.

    ``pow`` as ``exp(T log beta)``: ``log``'s error times ``T``, the product's rounding, then
    ``exp``'s, each within :data:`K_TRANSCENDENTAL` ulps, and two roundings more of the exponent
    where ``T`` or ``T - 1`` is not exact in the dtype (Keras's ``float(count) + 1``); each way
    of rounding ``beta`` (as :meth:`const`) taken exactly; then the subtraction, rounded once.
    (:meth:`one_minus_power` is the ``-expm1(T log beta)`` form, whose error lies in ``expm1``
    alone: near ``beta = 1`` the subtraction here cancels, and its error is the power's.)
    """
    exact = self.exact_hyper(beta)
    bases = [exact] if self.hyper_dtype is None else self._rounding_paths(beta)
    value = 1.0 - exact**T
    if all(b == exact for b in bases) and exact in (0.0, 1.0):
      return Bounded(value)  # pow(0, T) and pow(1, T) are exact.
    powers = [b**T for b in bases]
    e0 = max(abs(p - exact**T) for p in powers)
    x = max(abs(T * np.log(b)) if b > 0 else 0.0 for b in bases)
    steps = 1 if _round(float(T), self.dtype) == T and _round(float(T - 1), self.dtype) == T - 1 else 3
    relative = ((K_TRANSCENDENTAL + steps) * x + K_TRANSCENDENTAL) * self.u
    return self._rounded(np.float64(value), np.float64(e0 + relative * max(powers)), self.k_add)


def promote(a: Any, b: Any) -> np.dtype:
  """The dtype JAX computes ``a op b`` in: the wider; float32 for float16 with bfloat16."""
  a, b = np.dtype(a), np.dtype(b)
  if {a, b} == {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}:
    return np.dtype(np.float32)
  return np.promote_types(a, b)


def _tiny(dtype: Any, platform: str) -> float:
  """The absolute error an underflow may add to one operation in ``dtype``.

  XLA flushes subnormal float32 and float64 results to zero on CPU (measured:
  ``jit(x * y)`` of 1e-20 * 1e-20 in float32 gives 0, and so does bfloat16,
  computed in float32), and TPUs flush every dtype: a result below the
  smallest normal number may lose all of it. float16 off TPUs is computed in
  float32, where its subnormals are normal numbers: only the final rounding
  to float16 underflows, by half a subnormal at most. GPUs are given the
  larger (flushing) bound as well: it covers both behaviours.
  """
  info = ml_dtypes.finfo(dtype)
  if platform != "tpu" and np.dtype(dtype) == np.float16:
    return float(info.smallest_subnormal) / 2
  return float(info.smallest_normal)


def implementation_context(
  dtype: Any,
  platform: str = "cpu",
  state_dtype: Any = None,
  hyper_dtype: Any = None,
  received_dtype: Any = None,
  *,
  arithmetic: DeviceArithmetic | None = None,
  scalars: Mapping[str, Bounded] | None = None,
) -> Context:
  """How the JAX rules round in ``dtype`` on ``platform`` (see the module docstring).

  With a ``state_dtype`` other than ``dtype`` (the transforms'
  ``state_dtype``) the rule runs in the wider of the two (float32 for
  float16 with bfloat16, as in JAX); the update is rounded to ``dtype`` and
  added there, the new state rounded to ``state_dtype``, where narrower.
  ``hyper_dtype`` is the dtype of the ``T``-dependent scalars when it is
  not the default (float64 for float64, else float32): a float32 learning
  rate (an Optax schedule's value) makes them float32 under x64 too.
  ``received_dtype`` (see :attr:`Context.received`): the dtype the
  hyperparameters arrive in, whose values the expectation is computed from;
  None charges the rounding of the Python floats as well.

  ``arithmetic``: the device's measured arithmetic
  (:func:`onnx_optax.conformance.arithmetic.measure`); each operation's
  ``k`` is then ``max(measured, documented)``, ``tiny`` too, and a device
  that reads subnormal operands as 0 is charged for it. ``scalars``: the
  case's per-update scalars measured on the device
  (:func:`onnx_optax.conformance.scalars.measure`), charged in place of the
  scalar context's analytic bound. Without both: the *pinned* model, the
  documented constants only.
  """
  dtype = np.dtype(dtype)
  state = dtype if state_dtype is None else np.dtype(state_dtype)
  if state != dtype:
    compute = promote(dtype, state)
    return dataclasses.replace(
      implementation_context(
        compute,
        platform,
        hyper_dtype=hyper_dtype,
        received_dtype=received_dtype,
        arithmetic=arithmetic,
        scalars=scalars,
      ),
      param=None if dtype == compute else implementation_context(dtype, platform, arithmetic=arithmetic),
      state=None if state == compute else implementation_context(state, platform, arithmetic=arithmetic),
    )
  if hyper_dtype is not None:
    hyper = np.dtype(hyper_dtype)
  else:
    hyper = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
  received = None if received_dtype is None else np.dtype(received_dtype)
  scalar = _context(hyper, platform, arithmetic, hyper_dtype=hyper, received=received)
  return _context(
    dtype, platform, arithmetic, hyper_dtype=hyper, scalar=scalar, received=received, measured=scalars
  )


def documented_k(dtype: Any, platform: str) -> float:
  """The documented floor of ``k`` for a division or a square root: 1 (IEEE) on CPU and in float64.

  Elsewhere ``1 + 3 u32 / u``: GPUs and TPUs approximate float32 division and
  square root within 1.5 ulp of float32, on top of the final rounding to ``d``
  (float16 and bfloat16 are computed in float32).
  """
  u = unit_roundoff(dtype)
  return 1.0 if platform == "cpu" or np.dtype(dtype) == np.float64 else 1.0 + 3 * _U32 / u


def _context(dtype: np.dtype, platform: str, arithmetic: DeviceArithmetic | None, **kwargs: Any) -> Context:
  k = documented_k(dtype, platform)
  tiny = _tiny(dtype, platform)
  if arithmetic is None:
    return Context(dtype, unit_roundoff(dtype), tiny, k, k, **kwargs)
  return Context(
    dtype,
    unit_roundoff(dtype),
    arithmetic.tiny(dtype, tiny),
    arithmetic.k("div", dtype, k),
    arithmetic.k("sqrt", dtype, k),
    k_add=arithmetic.k("add", dtype, 1.0),
    k_mul=arithmetic.k("mul", dtype, 1.0),
    flushes_operands=arithmetic.flushes_operands(dtype),
    **kwargs,
  )


def reference_context(dtype: Any = np.float64, received_dtype: Any = None) -> Context:
  """How :mod:`onnx_optax.reference` rounds: NumPy in ``dtype`` (float64, or ``np.longdouble``), IEEE.

  ``received_dtype``: the dtype the hyperparameters were rounded to before
  the reference got them (:attr:`Context.received`).
  """
  dtype = np.dtype(dtype)
  info = np.finfo(dtype)
  received = None if received_dtype is None else np.dtype(received_dtype)
  # Gradual underflow loses half a subnormal of the dtype at most: less than the least positive
  # float64, which is what a float64 bound can hold (half of it is 0).
  ctx = Context(dtype, float(info.eps) / 2, float(np.finfo(np.float64).smallest_subnormal), received=received)
  return dataclasses.replace(ctx, scalar=ctx)


def evaluator_context() -> Context:
  """How ``onnx.reference.ReferenceEvaluator`` rounds float64 inputs.

  As the reference, except that the evaluator hands FLOAT attributes to the
  operators as ``np.float32`` scalars: ``1 - alpha``, ``1 - beta`` and
  ``1 - norm_coefficient_post`` are rounded to float32 (products with
  float64 tensors are float64).
  """
  ref = reference_context()
  return Context(ref.dtype, ref.u, ref.tiny, scalar=ref.scalar, float32_attributes=True)


def scalar_context(c: Context) -> Context:
  """The context of ``c``'s per-update scalar computations; every context built here has one."""
  if c.scalar is None:
    raise ValueError("the rules' bounds need a context with a scalar context (see implementation_context)")
  return c.scalar


# -- the bound models, registered by rule ---------------------------------------------------


class BoundModel(NamedTuple):
  """One rule's bound model (see the module docstring)."""

  #: ``bounds(c, R, T, X, G, *state, **hyperparameters)``: the spec's formula in the arithmetic
  #: of the :class:`Context` ``c``, in the rule's evaluation order; returns one :class:`Bounded`
  #: per output (``X_new`` first, then the new state), then the update ``U``. Bounds, not the
  #: rule: a mistake here can loosen or tighten the suite, never change the expected values.
  bounds: Callable[..., tuple[Bounded, ...]]
  #: ``scalars(o, R, T, h, raw) -> {name: value}``: the spec's formula of each per-update scalar
  #: that ``bounds`` reads by name (:meth:`Context.value`, :meth:`Context.one_minus`,
  #: :meth:`Context.div_by_scalar`), written with the arithmetic ``o`` (``o.log``, ``o.expm1``,
  #: ``o.sqrt``, ``o.where``, ``o.power``: the device's or 45-digit decimals,
  #: :mod:`onnx_optax.conformance.scalars`), ``h`` the float hyperparameters in that
  #: arithmetic, ``raw`` every hyperparameter as given.
  scalars: Callable[..., dict[str, Any]]


_MODELS: dict[str, BoundModel] = {}


def register_model(
  name: str, *, bounds: Callable[..., tuple[Bounded, ...]], scalars: Callable[..., dict[str, Any]]
) -> BoundModel:
  """Registers the bound model of the rule ``name`` (a registered rule's name; new here).

  Raises:
    ValueError: a model of that name is registered already.
  """
  if name in _MODELS:
    raise ValueError(f"a bound model named {name!r} is registered already")
  _MODELS[name] = BoundModel(bounds, scalars)
  return _MODELS[name]


def unregister_model(name: str) -> None:
  """Removes a bound model registered from outside the package (for tests)."""
  del _MODELS[name]


def model(name: str) -> BoundModel:
  """The bound model registered under a rule's name.

  Raises:
    KeyError: none is; the message says where a rule's model is registered.
  """
  try:
    return _MODELS[name]
  except KeyError:
    raise KeyError(
      f"no bound model registered for {name!r}: register one with "
      f"onnx_optax.conformance.tolerance.register_model (registered: {', '.join(_MODELS)})"
    ) from None


def evaluate(
  rule: str,
  context: Context,
  R: float,
  T: int,
  X: np.ndarray,
  G: np.ndarray,
  state: Sequence[np.ndarray],
  **hyper: Any,
) -> tuple[Bounded, ...]:
  """The spec's outputs of ``rule`` as the model tracks them: each one's exact value and error bound.

  The arguments are :func:`bounds`'. The values (``Bounded.v``) are the
  spec's outputs evaluated in float64 in the rule's order, from the
  hyperparameters' exact values (:meth:`Context.exact_hyper`); they are not
  used to judge anything, but they show that the bounds follow the spec's
  formula: ``tests/conformance/test_conformance_tolerance.py`` compares them
  with :mod:`onnx_optax.reference`.

  Returns:
    One :class:`Bounded` per output (``X_new`` first), then the update ``U``.

  Example:
    >>> import numpy as np
    >>> X_new, V_new, U = evaluate("momentum", reference_context(), 0.5, 3, np.array([1.0]),
    ...                            np.array([0.5]), [np.array([0.25])], alpha=0.5, beta=0.5,
    ...                            mode="standard", norm_coefficient=0.0)
    >>> float(V_new.v[0]), float(X_new.v[0]), float(U.v[0])
    (0.375, 0.8125, -0.1875)
  """
  return model(rule).bounds(
    context,
    R,
    T,
    np.asarray(X, np.float64),
    np.asarray(G, np.float64),
    *(np.asarray(s, np.float64) for s in state),
    **hyper,
  )


def bounds(
  rule: str,
  context: Context,
  R: float,
  T: int,
  X: np.ndarray,
  G: np.ndarray,
  state: Sequence[np.ndarray],
  update: bool = False,
  **hyper: Any,
) -> tuple[np.ndarray, ...]:
  """Error bounds of the spec's outputs of ``rule`` evaluated as ``context`` rounds.

  Args:
    rule: a registered rule's name (its bound model's, :func:`register_model`).
    context: :func:`implementation_context` or :func:`reference_context`.
    R, T: learning rate and update count.
    X, G: the tensor and its gradient, exact (already rounded) values.
    state: the state tensors in the spec's order (DirectML: ``M, V``).
    update: also return the bound of the update ``U`` (``X_new - X``): as
      the transform returns it for an implementation context (no
      cancellation against ``X``), ``X_new - X`` in the context's dtype for
      an expectation.
    **hyper: the rule's hyperparameters, as the Python floats passed.

  Returns:
    One float64 array per output (``X_new`` first), ``inf`` where no bound
    exists (a denominator whose error may reach its value); with
    ``update``, ``U``'s last.

  Example:
    >>> import numpy as np
    >>> c = implementation_context(np.float32)
    >>> e_x, e_v = bounds("momentum", c, 0.5, 3, np.array([1.0]), np.array([0.5]),
    ...                   [np.array([0.25])], alpha=0.5, beta=0.5, mode="standard",
    ...                   norm_coefficient=0.0)
    >>> bool(0 < e_x[0] < 4 * 2.0**-24)
    True
  """
  out = tuple(b.e for b in evaluate(rule, context, R, T, X, G, state, **hyper))
  return out if update else out[:-1]
