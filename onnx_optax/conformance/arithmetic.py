"""The arithmetic of the device under test, measured at start-up.

The tolerance model (:mod:`onnx_optax.conformance.tolerance`) charges each
element-wise operation ``k u (|v| + e) + tiny``. IEEE makes ``k = 1`` for a
correctly rounded operation, but XLA does not promise correct rounding off
the CPU (GPUs and TPUs approximate float32 division and square root), and a
device may flush subnormal operands or results. Rather than assume a ``k``
per platform, the runner measures it: :func:`measure` evaluates each
operation the rules use element-wise (``a / b``, ``sqrt``, ``a * b``,
``a + b``) on the device, jitted, in each dtype, over a sweep of operands,
and compares with the exact result. The bound then uses
``max(measured k, documented floor)`` (:meth:`DeviceArithmetic.k`).

The sweep (:func:`sweep`) covers, per dtype:

* every binade of the dtype, subnormals included: for each exponent, random
  significands plus the smallest and the largest (the relative error of a
  result is largest at the bottom of its binade, so exact powers of two are
  included as results too: ``a / a``, ``sqrt(4**k)``);
* random pairs across the whole range (quotients and products that
  overflow, underflow, or land anywhere between);
* the operands of the grid: every operand that reaches a division, a square
  root, a product or a sum when the tolerance model evaluates the grid's
  cases (recorded by the runner, ``check.grid_operands``, and handed to
  :func:`measure`).

``log`` and ``expm1`` are measured as well, in the dtypes of the rules'
scalars (float32, and float64 where the device has it), over every binade,
a dense sweep of ``(-1, 0)`` (where ``-expm1(T log beta)`` lands) and the
grid's arguments. The rules use them only in the per-update scalars, whose
error the runner measures case by case (:mod:`onnx_optax.conformance.scalars`);
the report shows them so that a device's transcendental accuracy is on
record.

What a sweep can prove: that the device reaches *at least* the measured
error (a lower bound on its worst case), and that the grid's own operands
are within the constant used. What it cannot: that no other operand does
worse. For float16 and bfloat16 the unary sweep is exhaustive (every finite
value); for float32 and float64 it is a sample, so the bound also keeps the
documented floor.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from onnx_optax.conformance import devices

__all__ = [
  "OPS",
  "DeviceArithmetic",
  "OpError",
  "Operands",
  "clear",
  "dtype_name",
  "measure",
  "summary",
  "sweep",
]

#: The element-wise operations of the rules, and the scalar ones (``log``, ``expm1``).
ELEMENTWISE = ("div", "sqrt", "mul", "add")
TRANSCENDENTAL = ("log", "expm1")
OPS = ELEMENTWISE + TRANSCENDENTAL

#: The dtypes each operation is measured in: element-wise in every dtype, the scalar functions
#: in the scalar dtypes.
DTYPES = {op: ("float32", "float64", "float16", "bfloat16") for op in ELEMENTWISE} | {
  op: ("float32", "float64") for op in TRANSCENDENTAL
}

_JAX: dict[str, Callable[..., Any]] = {
  "div": lambda a, b: a / b,
  "mul": lambda a, b: a * b,
  "add": lambda a, b: a + b,
  "sqrt": lambda a: jnp.sqrt(a),
  "log": lambda a: jnp.log(a),
  "expm1": lambda a: jnp.expm1(a),
}
_SAMPLE = {"float64": 6, "float32": 24}  # Random significands per binade (16-bit dtypes: all).
#: Points of [0.5, 2] for log, of (-1, 0) for expm1 (three times as many in (-0.1, -0.001)).
_DENSE = {"float64": 4097, "float32": 65537}


@dataclass(frozen=True)
class OpError:
  """The largest error of one operation in one dtype on one device, over ``n`` points.

  Attributes:
    op, dtype: the operation (``OPS``) and its dtype.
    ulp: the largest ``|computed - exact|`` in units in the last place of the
      exact result (0.5: correctly rounded), over results in the normal range.
    k: the same error relative to the exact result, in units of the dtype's
      unit roundoff ``u`` (the tolerance model's ``k``: 1 when correctly rounded).
    underflow: the largest absolute error of a result below the smallest
      normal number, beyond ``k u |exact|`` (a flushed result loses all of it).
    flushes_operands: whether a subnormal operand is read as zero.
    n: the number of points measured.
  """

  op: str
  dtype: str
  ulp: float
  k: float
  underflow: float
  flushes_operands: bool
  n: int


@dataclass(frozen=True)
class DeviceArithmetic:
  """The measured :class:`OpError` of every operation and dtype of one platform."""

  platform: str
  errors: tuple[OpError, ...]

  def get(self, op: str, dtype: Any) -> OpError | None:
    name = dtype_name(dtype)
    return next((e for e in self.errors if e.op == op and e.dtype == name), None)

  def k(self, op: str, dtype: Any, floor: float) -> float:
    """``max(measured k, floor)``: the unit roundoffs the bound allows ``op`` in ``dtype``.

    Example:
      >>> d = DeviceArithmetic("gpu", (OpError("div", "float32", 40.0, 80.0, 0.0, False, 1000),))
      >>> d.k("div", np.float32, 1.0), d.k("sqrt", np.float32, 1.0)
      (80.0, 1.0)
    """
    e = self.get(op, dtype)
    return floor if e is None else max(floor, e.k)

  def tiny(self, dtype: Any, floor: float) -> float:
    """``max(measured underflow error, floor)`` over the element-wise operations of ``dtype``."""
    return max(
      [floor] + [e.underflow for e in self.errors if e.dtype == dtype_name(dtype) and e.op in ELEMENTWISE]
    )

  def flushes_operands(self, dtype: Any) -> bool:
    """Whether an element-wise operation of ``dtype`` reads a subnormal operand as zero."""
    name = dtype_name(dtype)
    return any(e.flushes_operands for e in self.errors if e.dtype == name and e.op in ELEMENTWISE)

  def as_json(self) -> list[dict[str, Any]]:
    return [asdict(e) for e in self.errors]

  def summary(self) -> str:
    """One line: the largest error in ulp of each operation, per dtype, and the sample sizes."""
    return summary(self.as_json())


def summary(errors: list[dict[str, Any]]) -> str:
  """:meth:`DeviceArithmetic.summary` of its JSON form (``DeviceArithmetic.as_json``)."""
  parts = []
  for dtype in ("float32", "float64", "float16", "bfloat16"):
    errs = [e for e in errors if e["dtype"] == dtype]
    if errs:
      ops = " ".join(f"{e['op']} {e['ulp']:.2f}" for e in errs)
      parts.append(f"{dtype} {ops} (n {min(e['n'] for e in errs)}-{max(e['n'] for e in errs)})")
  flushed = sorted({e["dtype"] for e in errors if e["flushes_operands"] and e["op"] in ELEMENTWISE})
  return f"{'; '.join(parts)}; subnormal operands read as 0: {', '.join(flushed) or 'none'}"


def dtype_name(dtype: Any) -> str:
  """The name of a dtype (``"bfloat16"`` for ml_dtypes' bfloat16)."""
  return "bfloat16" if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16) else np.dtype(dtype).name


def _np(dtype: str) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)


def _finite_positive(dtype: str, rng: np.random.Generator) -> np.ndarray:
  """Positive finite values of every binade (subnormals included), edges of each included."""
  d = _np(dtype)
  info = ml_dtypes.finfo(d)
  nmant, bits = int(info.nmant), d.itemsize * 8
  uint = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
  top = (1 << (bits - 1 - nmant)) - 1  # The exponent field of inf / NaN.
  if dtype not in _SAMPLE:  # 16 bits: every positive finite value.
    return np.arange(1, top << nmant, dtype=np.uint64).astype(uint).view(d)
  n = _SAMPLE[dtype]
  fields = np.repeat(np.arange(top, dtype=np.uint64), n + 2)
  mant = rng.integers(0, 1 << nmant, size=(top, n + 2), dtype=np.uint64, endpoint=False)
  mant[:, 0], mant[:, 1] = 0, (1 << nmant) - 1  # The binade's edges.
  mant[0, 0] = 1  # Not zero: the smallest subnormal.
  return ((fields << np.uint64(nmant)) | mant.ravel()).astype(uint).view(d)


def sweep(
  op: str, dtype: str, extra: list[np.ndarray] | None = None, seed: int = 0
) -> tuple[np.ndarray, ...]:
  """The operands measured for ``op`` in ``dtype`` (one array per operand), see the module docstring.

  ``extra``: operands to add (the grid's, one array per operand).

  Example:
    >>> a, b = sweep("div", "bfloat16")
    >>> a.dtype.name, a.size == b.size, a.size > 100_000
    ('bfloat16', True, True)
  """
  rng = np.random.default_rng(seed)
  d = _np(dtype)
  V = _finite_positive(dtype, rng)
  shuffled = lambda x: rng.permutation(x)  # noqa: E731
  signs = lambda x: (x * rng.choice(np.array([-1, 1], d), size=x.shape)).astype(d)  # noqa: E731
  near_one = (1 + rng.random(V.size)).astype(d)
  if op == "div":
    a = np.concatenate([V, near_one, signs(shuffled(V)), V])
    b = np.concatenate([near_one, V, shuffled(V), V])  # Last: a / a = 1, the bottom of a binade.
    out = [a, b]
  elif op == "mul":
    out = [np.concatenate([V, signs(shuffled(V))]), np.concatenate([near_one, shuffled(V)])]
  elif op == "add":
    with np.errstate(over="ignore"):
      out = [
        np.concatenate([V, signs(V)]),
        np.concatenate([signs(shuffled(V)), (-signs(V) * near_one).astype(d)]),
      ]
  elif op == "sqrt":
    with np.errstate(over="ignore"):
      squares = (V.astype(np.float64) ** 2).astype(d)  # Roots at or near V (inf where too large).
    out = [np.concatenate([V, squares[np.isfinite(squares)]])]
  elif op == "log":
    dense = np.linspace(0.5, 2.0, _DENSE[dtype]).astype(d)
    out = [np.concatenate([V, dense])]
  else:  # expm1: where -expm1(T log beta) lands for beta = 0.999 and small T, densest.
    dense = np.linspace(-1.0, 0.0, _DENSE[dtype], endpoint=False).astype(d)
    denser = np.linspace(-0.1, -0.001, 3 * _DENSE[dtype]).astype(d)
    out = [np.concatenate([V, -V, dense, denser])]
  if extra:
    out = [np.concatenate([o, np.asarray(x, np.float64).astype(d)]) for o, x in zip(out, extra)]
  return tuple(out)


# -- exact results ---------------------------------------------------------------------

#: The exact arithmetic of the measurements (this module's and the per-update scalars'): 45 digits.
DECIMAL = decimal.Context(prec=45, Emin=-99999, Emax=99999, traps=[])


def decimal_expm1(x: decimal.Decimal) -> decimal.Decimal:
  """``exp(x) - 1`` in :data:`DECIMAL`'s 45 digits; a non-finite ``x`` through ``exp``.

  Example (mpmath's ``expm1(1e-7)`` in 60 digits: ``1.00000005000000166666670833333416666668055555575e-7``):
    >>> decimal_expm1(decimal.Decimal("1e-7"))
    Decimal('1.00000005000000166666670833333416666668055556E-7')
  """
  if x.is_finite() and abs(x) < decimal.Decimal("1e-6"):  # exp(x) - 1 cancels: the series.
    with decimal.localcontext(DECIMAL):
      # Through x^7: the first term left out, x^8 / 8!, is below 1e-46 of x.
      return +(x + x * x / 2 + x**3 / 6 + x**4 / 24 + x**5 / 120 + x**6 / 720 + x**7 / 5040)
  return DECIMAL.subtract(DECIMAL.exp(x), 1)


_EXACT: dict[str, Callable[..., decimal.Decimal]] = {
  "div": DECIMAL.divide,
  "mul": DECIMAL.multiply,
  "add": DECIMAL.add,
  "sqrt": DECIMAL.sqrt,
  "log": DECIMAL.ln,
  "expm1": decimal_expm1,
}
_FLOAT64 = {
  "div": np.divide,
  "mul": np.multiply,
  "add": np.add,
  "sqrt": np.sqrt,
  "log": np.log,
  "expm1": np.expm1,
}


def _decimal_errors(op: str, operands: tuple[np.ndarray, ...], got: np.ndarray) -> tuple[np.ndarray, ...]:
  """``(exact, |got - exact|)`` of float64 operations through 45-digit decimals, each rounded once."""
  f = _EXACT[op]
  exact_d = [f(*(decimal.Decimal(float(x[i])) for x in operands)) for i in range(got.size)]
  exact = np.array([float(x) for x in exact_d], np.float64)
  err = np.array(
    [
      float(abs(DECIMAL.subtract(decimal.Decimal(float(g)), x)))
      if x.is_finite() and math.isfinite(g)
      else np.nan
      for g, x in zip(got.tolist(), exact_d)
    ],
    np.float64,
  )
  return exact, err


_SPLIT = 2.0**27 + 1  # Veltkamp's splitter for float64.


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``(p, e)`` with ``p = fl(a b)`` and ``a b = p + e`` exactly (Dekker), for ``|a|, |b|`` in [0.5, 2)."""

  def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = _SPLIT * x
    hi = c - (c - x)
    return hi, x - hi

  p = a * b
  (ah, al), (bh, bl) = split(a), split(b)
  return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _exact_errors(op: str, operands: tuple[np.ndarray, ...], got: np.ndarray) -> tuple[np.ndarray, ...]:
  """``(exact, |got - exact|)`` of the float64 ``div``, ``mul``, ``add``, ``sqrt``, without decimals.

  ``exact`` is NumPy's result (IEEE: the exact result correctly rounded); the error comes from
  error-free transformations: the operands scaled by powers of two (exact) to [0.5, 2), the
  exact product or remainder as a sum of two floats (Dekker's product, Knuth's sum), so that
  ``|got - exact|`` is computed with one rounding of the error itself, as the decimals give it.
  Elements outside these transformations' preconditions (a zero, a non-finite value, a sum
  that overflows) are computed through the decimals (:func:`_decimal_errors`).
  """
  a = np.asarray(operands[0], np.float64)
  b = np.asarray(operands[1], np.float64) if len(operands) > 1 else None
  g = np.asarray(got, np.float64)
  with np.errstate(all="ignore"):
    exact = _FLOAT64[op](*(x for x in (a, b) if x is not None))
    ok = np.isfinite(a) & (a != 0) & np.isfinite(g) & (g != 0) & np.isfinite(exact)
    if b is not None:
      ok &= np.isfinite(b) & (b != 0)
    err = np.full(g.shape, np.nan)
    if op == "add":
      assert b is not None
      s = a + b  # Knuth's TwoSum: a + b = s + t exactly (s finite).
      v = s - a
      t = (a - (s - v)) + (b - v)
      ok = np.isfinite(a) & np.isfinite(b) & np.isfinite(g) & np.isfinite(s)
      err = np.abs((g - s) - t)
    else:
      ma, ea = np.frexp(a)
      if op == "sqrt":
        k = ea // 2  # a = m 4^k, m in [0.25, 1)
        m = np.ldexp(a, -2 * k)
        q = np.ldexp(g, -k)  # about sqrt(m), in [0.5, 1)
        p, e = _two_product(q, q)
        r = (m - p) - e  # m - q^2, Sterbenz: m and p within a factor 2
        err = np.ldexp(np.abs(r) / (q + np.sqrt(m)), k)
        ok &= a > 0
      else:
        assert b is not None
        mb, eb = np.frexp(b)
        scale = ea + eb if op == "mul" else ea - eb
        q = np.ldexp(g, -scale)  # got, scaled as the mantissas' product or quotient
        if op == "mul":
          p, e = _two_product(ma, mb)
          err = np.ldexp(np.abs((q - p) - e), scale)
        else:  # div: ma - q mb, exact (Sterbenz), over mb
          p, e = _two_product(q, mb)
          err = np.ldexp(np.abs(((ma - p) - e) / mb), scale)
        ok &= (np.abs(q) >= 0.125) & (np.abs(q) <= 8)  # got within a few binades of the result
  rest = np.flatnonzero(~ok)
  if rest.size:
    slow_exact, slow_err = _decimal_errors(
      op, tuple(np.asarray(x)[rest] for x in operands), np.asarray(got)[rest]
    )
    exact, err = exact.copy(), err.copy()
    exact[rest], err[rest] = slow_exact, slow_err
  return exact, err


def _errors(op: str, dtype: str, operands: tuple[np.ndarray, ...], got: np.ndarray) -> tuple[np.ndarray, ...]:
  """``(exact, |got - exact|)`` as float64: in float64 for the narrower dtypes; float64 operations
  exactly (:func:`_exact_errors`; ``log`` and ``expm1`` through 45-digit decimals)."""
  if dtype != "float64":
    with np.errstate(all="ignore"):
      exact = _FLOAT64[op](*(np.asarray(x, np.float64) for x in operands))
      return exact, np.abs(np.asarray(got, np.float64) - exact)
  if op in ("div", "mul", "add", "sqrt"):
    return _exact_errors(op, operands, got)
  return _decimal_errors(op, operands, got)


def _op_error(op: str, dtype: str, operands: tuple[np.ndarray, ...], got: np.ndarray) -> OpError:
  d = _np(dtype)
  info = ml_dtypes.finfo(d)
  u, normal, nmant = float(info.eps) / 2, float(info.smallest_normal), int(info.nmant)
  exact, err = _errors(op, dtype, operands, got)
  with np.errstate(all="ignore"):
    sub_operand = np.zeros(got.shape, bool)
    for x in operands:
      x64 = np.abs(np.asarray(x, np.float64))
      sub_operand |= (x64 > 0) & (x64 < normal)
    finite = np.isfinite(exact) & (np.abs(exact) <= float(info.max)) & np.isfinite(err)
    in_range = finite & ~sub_operand & (np.abs(exact) >= normal)
    below = finite & ~sub_operand & (np.abs(exact) < normal) & (exact != 0)
    rel = np.where(in_range, err / np.where(in_range, np.abs(exact), 1.0) / u, 0.0)  # No overflow.
    e = np.floor(np.log2(np.where(in_range, np.abs(exact), 1.0)))
    ulp = np.where(in_range, err / np.exp2(e - nmant), 0.0)
    k = float(rel.max(initial=0.0))
    under = np.where(below, err - max(k, 1.0) * u * np.abs(exact), 0.0)
    # A subnormal operand read as zero: the result is the operation's on 0 (not its own).
    flushed = False
    if sub_operand.any():
      zeroed = tuple(
        np.where(np.abs(np.asarray(x, np.float64)) < normal, 0.0, np.asarray(x, np.float64)) for x in operands
      )
      as_zero = _FLOAT64[op](*zeroed).astype(d).astype(np.float64)
      differs = np.asarray(got, np.float64) != np.asarray(exact, np.float64).astype(d).astype(np.float64)
      flushed = bool(np.any(sub_operand & differs & (np.asarray(got, np.float64) == as_zero)))
  return OpError(
    op, dtype, float(ulp.max(initial=0.0)), k, float(max(under.max(initial=0.0), 0.0)), flushed, int(got.size)
  )


def _device_values(op: str, dtype: str, operands: tuple[np.ndarray, ...], device: jax.Device) -> np.ndarray:
  with jax.enable_x64(dtype == "float64"):
    placed = [jax.device_put(x, device) for x in operands]
    with jax.default_device(device):
      return np.asarray(jax.jit(_JAX[op])(*placed))


# -- the measurement ------------------------------------------------------------------------

#: The operands a caller adds to the sweep, by ``(op, dtype)``: one array per operand.
Operands = Mapping[tuple[str, str], Sequence[np.ndarray]]

_MEASURED: dict[tuple[str, bool], DeviceArithmetic] = {}


def clear() -> None:
  """Forgets the measurements (a test that changes the arithmetic measures again)."""
  _MEASURED.clear()


def measure(
  platform: str,
  dtypes: tuple[str, ...] | None = None,
  operands: Callable[[], Operands] | None = None,
) -> DeviceArithmetic:
  """Measures every operation of ``OPS`` in its dtypes on the first ``platform`` device.

  Args:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; float64 is skipped where it has none
      (:func:`~onnx_optax.conformance.devices.has_float64`).
    dtypes: only these dtypes (not remembered); None: every dtype of ``DTYPES``.
    operands: returns the operands to add to the sweep, by ``(op, dtype)`` (the runner's: every
      operand the tolerance model meets over the grid, ``check.grid_operands``); called only
      when the measurement is made. The measurement takes them from its caller: it knows
      nothing of the grid.

  Every dtype's measurement is made once per platform and process, with and without
  ``operands`` apart (:func:`clear` forgets).
  """
  key = (platform, operands is not None)
  if dtypes is None and key in _MEASURED:
    return _MEASURED[key]
  device = devices.device(platform)
  extra = operands() if operands is not None else {}
  errors = []
  for op in OPS:
    for dtype in DTYPES[op]:
      if (dtypes is not None and dtype not in dtypes) or (
        dtype == "float64" and not devices.has_float64(platform)
      ):
        continue
      points = sweep(op, dtype, list(extra.get((op, dtype), ())) or None)
      got = _device_values(op, dtype, points, device)
      errors.append(_op_error(op, dtype, points, got))
  result = DeviceArithmetic(platform, tuple(errors))
  if dtypes is None:
    _MEASURED[key] = result
  return result
