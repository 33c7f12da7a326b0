"""Runs a case through an Optax transform on a device and checks it.

:func:`run_case` builds the transform and its state (``count = T`` and the
case's state tensors), places everything on the chosen device, applies one
jitted ``update`` + ``optax.apply_updates`` and returns the outputs.
:func:`check_outputs` compares them with the rule's NumPy expectation
(:mod:`onnx_optax.reference`, registered under the rule's name) in float64,
in units of the tolerance its bound model gives
(:mod:`onnx_optax.conformance.tolerance`).

Nothing here is keyed by a rule's name: the transform, the state, the output
names, the expectation and the bound model are the registered rule's
(:class:`~onnx_optax.conformance.cases.SuiteRule`), its expectation's and its
bound model's.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from onnx_optax import reference
from onnx_optax.conformance import arithmetic as arithmetic_lib
from onnx_optax.conformance import cases as grid
from onnx_optax.conformance import devices, models, order, tolerance  # noqa: F401 (models: they register)
from onnx_optax.conformance import scalars as scalars_lib
from onnx_optax.conformance.arithmetic import DeviceArithmetic
from onnx_optax.conformance.cases import INT32_MAX, LARGE, Case, numpy_dtype, received_dtype_of, suite_rule
from onnx_optax.conformance.devices import received, received_dtype
from onnx_optax.conformance.programs import Batch

__all__ = [
  "EXTENDED",
  "CaseResult",
  "Comparison",
  "Outputs",
  "check_outputs",
  "compare",
  "expected",
  "expected_update",
  "grid_operands",
  "make_transform",
  "measured_arithmetic",
  "results",
  "run_case",
  "run_transform",
  "tolerances",
  "update_dtype",
]


def make_transform(
  rule: str,
  R: float | optax.Schedule,
  hyper: dict[str, Any],
  state_dtype: str | None = None,
  initial_count: int | None = None,
) -> optax.GradientTransformationExtraArgs:
  """The Optax transform of a suite rule with Python-float hyperparameters (its registered transform).

  ``R`` is a float or a schedule; ``state_dtype`` and ``initial_count``
  (None: the transform's default) are passed on.
  """
  extra: dict[str, Any] = {} if state_dtype is None else {"state_dtype": numpy_dtype(state_dtype)}
  if initial_count is not None:
    extra["initial_count"] = initial_count
  return suite_rule(rule).rule.transform(R, **hyper, **extra)


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
  state_cls = suite_rule(rule).rule.state
  with jax.enable_x64(np.float64 in (numpy_dtype(dtype), numpy_dtype(state_dtype or dtype))):
    dev = devices.device(platform)
    put = lambda leaves: _tree([jax.device_put(np.asarray(x), dev) for x in leaves])  # noqa: E731
    params, grads = put(X), put(G)
    opt_state = state_cls(jax.device_put(jnp.asarray(T, jnp.int32), dev), *(put(s) for s in state))
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


#: The dtype of the expectation of ``U``: x87 extended precision where NumPy has it (64-bit
#: significand), so that ``X_new - X`` does not lose ``U``'s digits to the cancellation.
EXTENDED = np.dtype(np.longdouble) if np.finfo(np.longdouble).nmant > 52 else np.dtype(np.float64)


def expected(
  rule: str, R: float, T: int, X, G, state, hyper, dtype: Any = np.float64
) -> list[tuple[np.ndarray, ...]]:
  """The spec's outputs per leaf, from the rule's registered expectation in ``dtype`` (float64)."""
  step = reference.get(suite_rule(rule).rule.name).step
  outs = []
  for i, (x, g) in enumerate(zip(X, G)):
    s = [block[i] for block in state]
    outs.append(tuple(step(R, T, x, g, *s, dtype=dtype, **hyper)))
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
  """The dtype of ``U``'s expectation: :data:`EXTENDED`, float64 for a framework twin (its ``X_new - X``
  then carries ``X_new``'s float64 rounding, which the expectation's bound charges)."""
  return np.dtype(np.float64) if suite_rule(rule).framework else EXTENDED


def _implementation(
  rule: str,
  dtype: str,
  platform: str,
  state_dtype: str | None,
  scalar_dtype: str | None,
  received_dtype: Any,
  arithmetic: DeviceArithmetic | None,
  scalars: Mapping[str, tolerance.Bounded] | None,
) -> tolerance.Context:
  """The implementation's context of :func:`tolerances`."""
  if not suite_rule(rule).state:  # No state tensors (ONNX Runtime's SGD): computed in its own dtype.
    state_dtype = None
  return tolerance.implementation_context(
    numpy_dtype(dtype),
    platform,
    state_dtype and numpy_dtype(state_dtype),
    scalar_dtype and numpy_dtype(scalar_dtype),
    received_dtype,
    arithmetic=arithmetic,
    scalars=scalars,
  )


#: The elements of a bounds evaluation at a time. An evaluation makes hundreds of passes over its
#: arrays; 2**16 elements (512 KiB a float64 array) at a time keep them near the CPU, which cut
#: the bounds of the 10^6-element cases by about a third of their CPU time on a 2-core AMD EPYC,
#: bit for bit the same (``test_conformance_tolerance.py``).
CHUNK = 1 << 16


def _in_chunks(bounds: Callable[..., Sequence[np.ndarray]], x, g, s) -> list[np.ndarray]:
  """``bounds(x, g, s)``, element-wise, evaluated ``CHUNK`` elements at a time (the same values)."""
  if x.size <= CHUNK:
    return list(bounds(x, g, s))
  parts = []
  for i in range(0, x.size, CHUNK):
    piece = slice(i, i + CHUNK)
    x_i = x[piece]
    parts.append([np.broadcast_to(b, x_i.shape) for b in bounds(x_i, g[piece], [t[piece] for t in s])])
  return [np.concatenate(column) for column in zip(*parts)]


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
  expected_u: list[np.ndarray] | None = None,
) -> list[tuple[np.ndarray, ...]]:
  """Per leaf, the tolerance of each output then of ``U``: bound(implementation) + bound(expectation).

  The bounds are the rule's bound model's (:func:`tolerance.bounds`). The outputs' expectation
  is :func:`expected` (float64), ``U``'s is :func:`expected_update` (:data:`EXTENDED`, then
  rounded to float64). ``scalar_dtype``: the dtype of the rule's ``T``-dependent scalars when
  it is not the default (see :func:`tolerance.implementation_context`). ``received_dtype``: the
  dtype the hyperparameters were rounded to before the expectations got them
  (:func:`~onnx_optax.conformance.devices.received`); None: the Python floats.
  ``arithmetic``, ``scalars``: the device's measured arithmetic and the case's measured
  per-update scalars (see :func:`tolerance.implementation_context`); without them the pinned
  model. ``expected_u``: :func:`expected_update` of these inputs, from the hyperparameters as
  received, when the caller has it (computed here otherwise).
  """
  base = suite_rule(rule).rule.name
  impl = _implementation(
    rule, dtype, platform, state_dtype, scalar_dtype, received_dtype, arithmetic, scalars
  )
  ref = tolerance.reference_context(received_dtype=received_dtype)
  ref_u = tolerance.reference_context(update_dtype(rule), received_dtype=received_dtype)
  u64, tiny64 = ref.u, ref.tiny
  R_in, hyper_in = (R, hyper) if received_dtype is None else received(R, hyper, received_dtype)
  if expected_u is None:
    expected_u = expected_update(rule, R_in, T, X, G, state, hyper_in)
  if suite_rule(rule).rule.reduces:  # Not element-wise (Rule.reduces): each leaf in its own shape.
    per_leaf = []
    for i, (x, g, want_u) in enumerate(zip(X, G, expected_u)):
      x_i, g_i = np.asarray(x, np.float64), np.asarray(g, np.float64)
      s_i = [np.asarray(block[i], np.float64) for block in state]
      args = (R, T, x_i, g_i, s_i)
      impl_i, ref_i = (tolerance.bounds(base, c, *args, update=True, **hyper) for c in (impl, ref))
      e_u = ref_i[-1] if ref_u == ref else tolerance.bounds(base, ref_u, *args, update=True, **hyper)[-1]
      e_u = e_u + u64 * (2 * (np.abs(want_u) + e_u)) + tiny64  # rounded from EXTENDED to float64
      tols = [p + q for p, q in zip(impl_i[:-1], ref_i[:-1])] + [np.broadcast_to(impl_i[-1] + e_u, x_i.shape)]
      per_leaf.append(tuple(tols))
    return per_leaf
  # The bounds are element-wise: the leaves are evaluated as one array (one evaluation per
  # context, not one per leaf), then split back; a state field of one scalar per parameter is
  # given per element (its parameter's, broadcast).
  shapes = [np.shape(x) for x in X]
  flat = lambda leaves: np.concatenate(  # noqa: E731
    [np.ravel(np.broadcast_to(np.asarray(t, np.float64), shape)) for t, shape in zip(leaves, shapes)]
  )
  x, g, s = flat(X), flat(G), [flat(block) for block in state]
  bounds = lambda context: _in_chunks(  # noqa: E731
    lambda x, g, s: tolerance.bounds(base, context, R, T, x, g, s, update=True, **hyper), x, g, s
  )
  a = bounds(impl)
  b_all = bounds(ref)
  # A twin's U is expected in float64 (update_dtype): the same context, the same evaluation.
  b_u = b_all if ref_u == ref else bounds(ref_u)
  b, e_u = b_all[:-1], b_u[-1]
  # U's expectation is rounded from EXTENDED to float64: one more rounding of |U| <= |U64| + e.
  e_u = e_u + u64 * (2 * (np.abs(flat(expected_u)) + e_u)) + tiny64
  whole = [np.broadcast_to(p + q, x.shape) for p, q in zip(a, b)] + [np.broadcast_to(a[-1] + e_u, x.shape)]
  ends = np.cumsum([int(np.prod(shape)) for shape in shapes])[:-1]
  parts = [np.split(t, ends) for t in whole]
  # Output k + 1 is state field k's new value, of its input's shape: one scalar per parameter
  # (Field.shape PER_TENSOR) gets the largest tolerance of the elements it stands for.
  own = lambda i, k: np.shape(state[k - 1][i]) if 0 < k <= len(state) else shapes[i]  # noqa: E731
  fold = lambda t, shape: t if t.shape == shape else np.max(t, initial=0.0).reshape(shape)  # noqa: E731
  return [
    tuple(fold(p[i].reshape(shape), own(i, k)) for k, p in enumerate(parts)) for i, shape in enumerate(shapes)
  ]


# -- the device's arithmetic, measured on the grid's operands ------------------------------------

_GRID_MAX = 4096  # Grid operands kept per operation and dtype (a random subset beyond).
_GRID: dict[tuple[str, str], list[np.ndarray]] = {}


def grid_operands() -> dict[tuple[str, str], list[np.ndarray]]:
  """The operands of each operation the tolerance model meets over the grid, by ``(op, dtype)``.

  Recorded from the model's implementation contexts (every operation the rule performs, in its
  element-wise dtype and its scalar dtype, ``a - b`` as ``a + (-b)``), for every case of every
  spec rule and dtype (no 10^6 case), plus the scalars' ``log(beta)`` and ``expm1(T log beta)``
  of each decay; exact values (rounded to the dtype by ``arithmetic.sweep``), at most 4096
  points per operation. Computed once per process.
  """
  if _GRID:
    return _GRID
  seen: dict[tuple[str, str], list[list[np.ndarray]]] = {}

  def record(op: str, ctx_dtype: Any, *values: Any) -> None:
    flat = [np.ravel(v) for v in np.broadcast_arrays(*(np.asarray(v, np.float64) for v in values))]
    seen.setdefault((op, arithmetic_lib.dtype_name(ctx_dtype)), []).append(flat)

  for rule in grid.RULES:
    suite = suite_rule(rule)
    decays = [h for h, p in suite.rule.hyperparameters.items() if p.decay]
    for dtype in suite.dtypes:
      for case in grid.cases(rule, dtype, large=False):
        X, G, state = case.inputs()
        # The implementation's bounds of tolerances() (the expectations' record nothing).
        impl = _implementation(case.rule, case.dtype, "cpu", case.state_dtype, None, None, None, None)
        with tolerance.recording(record):
          for i, (x, g) in enumerate(zip(X, G)):
            s = [block[i] for block in state]
            tolerance.bounds(
              suite.rule.name, impl, case.learning_rate, case.T, x, g, s, update=True, **case.hyper
            )
        for name in decays:  # The scalars' log(beta) and expm1(T log beta).
          beta = case.hyper.get(name)
          if isinstance(beta, float) and 0 < beta < 1 and case.T > 0:
            for scalar_dtype in ("float32", "float64"):
              record("log", scalar_dtype, beta)
              record("expm1", scalar_dtype, case.T * math.log(beta))
  rng = np.random.default_rng(1)
  for key, parts in seen.items():
    columns = [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]
    if columns[0].size > _GRID_MAX:
      keep = rng.choice(columns[0].size, _GRID_MAX, replace=False)
      columns = [c[keep] for c in columns]
    _GRID[key] = columns
  return _GRID


def measured_arithmetic(platform: str) -> DeviceArithmetic:
  """The device's arithmetic as the runner charges it: the sweep and the grid's operands
  (:func:`grid_operands`), measured once per platform and process."""
  return arithmetic_lib.measure(platform, operands=grid_operands)


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
  bit (:func:`~onnx_optax.conformance.order.order_mismatch`); ``order``: where they differ (a
  failure); ``order_skipped``: why a float32 case of a rule compared so was not compared.
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
  want_u = expected_update(case.rule, R, case.T, X, G, state, hyper)
  # A schedule's rate has the dtype of a Python float's (float64 under x64: the
  # count it receives is int64 there), so the scalars' dtype is the others'.
  ordered, order_skipped = order.order_applies(case, arithmetic)
  if ordered and scalars is None:
    ordered, order_skipped = False, "the scalars were not measured"
  subnormal: list[bool] = []
  with tolerance.recording(order.touches_subnormals(subnormal)) if ordered else contextlib.nullcontext():
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
      expected_u=want_u,
    )
  if ordered and arithmetic is not None and subnormal and order.flushes(arithmetic):
    ordered, order_skipped = False, "subnormal operands, which the device flushes (PyTorch does not)"
  names = case.suite.outputs
  worst, where, loose, unchecked = 0.0, "", 0, 0
  for leaf in range(len(X)):
    got = [got_x[leaf]] + [s[leaf] for s in got_state]
    wants = list(want[leaf])
    tols = list(tol[leaf][: len(names)])
    leaf_names = list(names)
    if got_u is not None:
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
  # Each state field in the dtype init gives it: the case's state dtype, or its own (Field.dtypes).
  field_dtype = [f.dtype_for(case.dtype, case.state_dtype) for f in case.suite.rule.fields]
  checked = [(names[0], got_x, case.dtype)] + [
    (names[k + 1], s, field_dtype[k]) for k, s in enumerate(got_state)
  ]
  if got_u is not None:
    checked.append(("U", got_u, case.dtype))
  mismatch = ""
  if ordered and scalars is not None:
    mismatch = order.order_mismatch(case, X, G, state, got_x, got_state, got_u, scalars)
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
    order=mismatch,
    order_skipped=order_skipped,
  )


#: Whether :func:`run_case` charges the pinned model (documented constants, the analytic bound
#: of the scalars) instead of the device's measured arithmetic and scalars.
PINNED = False


# -- running cases: one program per program shape, compiled ahead ---------------------------------


def _traced(case: Case, value: Any) -> bool:
  """Whether a hyperparameter (or the learning rate) reaches a case's program as an argument.

  A spec rule's float hyperparameters do, as ``optax.inject_hyperparams`` hands them in (an array of
  the dtype a Python float reaches the rule in: the expectation is computed from that very value),
  so that cases that differ only in their values share one program. Not: 0 and 1, which the rules
  test for as Python numbers to leave a term or a factor out (``_numerics.is_static``; the program
  a user who writes 0 or 1 gets is the one checked), flags and modes, and every hyperparameter of
  a framework twin, whose Python floats its framework's scalars are computed from on the host.
  """
  return (
    not case.suite.framework
    and isinstance(value, float)
    and not isinstance(value, bool)
    and value not in (0.0, 1.0)
  )


def _update_program(case: Case, static: dict[str, Any], R: float | None) -> Any:
  """The jitted update of :func:`run_transform` with the traced values as arguments."""
  rule, steps, state_dtype, initial_count = (
    case.rule,
    case.schedule_steps,
    case.state_dtype,
    case.initial_count,
  )

  def step(rate, traced, params, grads, opt_state):
    rate = R if R is not None else rate
    lr = rate if steps is None else optax.linear_schedule(rate, 0.0, steps)
    opt = make_transform(rule, lr, {**static, **traced}, state_dtype, initial_count)
    updates, new_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_state, updates

  return step


def _x64(case: Case) -> bool:
  """Whether ``case`` runs under ``jax.enable_x64`` (its parameters or its state are float64)."""
  return np.float64 in (numpy_dtype(case.dtype), numpy_dtype(case.state_dtype or case.dtype))


def _start_update(case: Case, inputs, platform: str, batch: Batch) -> Callable[[], Outputs]:
  """The case's update, added to ``batch``; call the result, after the batch is closed, for the
  :class:`Outputs`. The same outputs as :func:`run_transform` (``test_conformance_suite``
  compares them to the bit), from a computation that every case of the row with the same
  program shape shares (``_traced``)."""
  X, G, state = inputs
  x64 = _x64(case)
  dtype = received_dtype(case.dtype, case.state_dtype)  # A Python float's in this case's program.
  traced = {k: v for k, v in case.hyper.items() if _traced(case, v)}
  static = {k: v for k, v in case.hyper.items() if k not in traced}
  R_traced = _traced(case, case.R)
  key = (
    "update",
    case.rule,
    case.dtype,
    case.state_dtype,
    tuple(sorted(static.items())),
    tuple(sorted(traced)),
    None if R_traced else case.R,
    case.schedule_steps,
    case.initial_count,
    case.shapes,
  )
  state_cls = suite_rule(case.rule).rule.state
  dev = devices.device(platform)
  with jax.enable_x64(x64):
    put = lambda leaves: _tree([jax.device_put(np.asarray(x), dev) for x in leaves])  # noqa: E731
    args = (
      jax.device_put(np.asarray(case.R, dtype), dev) if R_traced else None,
      {k: jax.device_put(np.asarray(v, dtype), dev) for k, v in traced.items()},
      put(X),
      put(G),
      state_cls(jax.device_put(jnp.asarray(case.T, jnp.int32), dev), *(put(s) for s in state)),
    )
  result = batch.add(key, _update_program(case, static, None if R_traced else case.R), *args)

  def finish() -> Outputs:
    with jax.enable_x64(x64):
      new_params, new_state, updates = result()
    placed = {d for leaf in jax.tree.leaves((new_params, new_state, updates)) for d in leaf.devices()}
    if placed != {dev}:  # The platform under test must be the one that computed.
      raise RuntimeError(f"outputs on {placed}, expected {dev}")
    leaves = lambda tree: [np.asarray(x) for x in jax.tree.leaves(tree)]  # noqa: E731
    return Outputs(
      leaves(new_params), [leaves(s) for s in new_state[1:]], int(new_state.count), leaves(updates)
    )

  return finish


def _failed(case: Case, platform: str, e: Exception) -> CaseResult:
  return CaseResult(case.rule, case.dtype, case.name, platform, float("inf"), "", error=repr(e))


def _start(
  case: Case, platform: str, pinned: bool, batch: Batch, memo: dict[Any, Any]
) -> Callable[[], CaseResult]:
  """``case``'s computations added to ``batch``; call the result, after the batch is closed, to
  run and check it. ``memo``: the run's scalar measurements (:func:`scalars.start`)."""
  inputs = case.inputs()
  update = _start_update(case, inputs, platform, batch)
  measuring = None if pinned else scalars_lib.start_case(case, platform, batch, memo)

  def finish() -> CaseResult:
    try:
      got_x, got_state, count, got_u = update()
    except Exception as e:  # noqa: BLE001 -- reported as a failure with its message.
      return _failed(case, platform, e)
    if measuring is None:
      return check_outputs(case, platform, got_x, got_state, count, inputs, got_u)
    measured = measuring()
    result = check_outputs(
      case,
      platform,
      got_x,
      got_state,
      count,
      inputs,
      got_u,
      arithmetic=measured_arithmetic(platform),
      scalars=measured,
    )
    # The scalars' dtype: the hyperparameters' (a schedule's R too).
    u = tolerance.unit_roundoff(received_dtype(case.dtype, case.state_dtype))
    with np.errstate(divide="ignore", invalid="ignore"):
      relative = [float(b.e / (u * abs(b.v))) for b in measured.values() if b.v != 0]
    result.scalar_error = max(relative, default=0.0)
    return result

  return finish


def _rows(cases: Iterable[Case]) -> Iterator[list[Case]]:
  """The cases in runs compiled together: consecutive cases of one rule and dtype (a row of the
  report), a large case alone (its copy would run in every round of its row's program)."""
  row: list[Case] = []
  for case in cases:
    large = max(int(np.prod(s)) for s in case.shapes) >= LARGE
    if row and (large or (case.rule, case.dtype, _x64(case)) != (row[0].rule, row[0].dtype, _x64(row[0]))):
      yield row
      row = []
    row.append(case)
    if large:
      yield row
      row = []
  if row:
    yield row


def _start_row(
  row: list[Case], platform: str, pinned: bool, memo: dict[Any, Any]
) -> list[Callable[[], CaseResult]]:
  """A row's cases in one batch, closed: its program compiling."""
  batch = Batch()
  finishes = [_start(case, platform, pinned, batch, memo) for case in row]
  with jax.enable_x64(_x64(row[0])), jax.default_device(devices.device(platform)):
    batch.close()
  return finishes


#: The rows :func:`results` starts ahead of the one it checks (their programs compile meanwhile).
AHEAD = 4


def results(cases: Iterable[Case], platform: str = "cpu", pinned: bool | None = None) -> Iterator[CaseResult]:
  """Runs each case through its Optax transform on ``platform`` and checks it, in order.

  The cases of a row (consecutive cases of one rule and dtype) are compiled as one program
  (:class:`~onnx_optax.conformance.programs.Batch`); cases that differ only in ``T``, their
  inputs, or a spec rule's hyperparameter values (``_traced``) share one computation in
  it; the programs of the next ``AHEAD`` rows are traced here and compile while a row is
  checked, and the checks run on a thread of their own (NumPy's work on the 10^6-element cases
  and the device's runs release Python's lock: they go on while this thread traces). The
  tolerance charges the device's measured arithmetic (:func:`measured_arithmetic`, once per
  platform, the checker's first job) and each case's scalars as the device computes them
  (:func:`~onnx_optax.conformance.scalars.start_case`); with ``pinned`` (default
  ``check.PINNED``) the documented constants instead.
  """
  pinned = PINNED if pinned is None else pinned
  rows = _rows(cases)
  memo: dict[Any, Any] = {}  # The run's scalar measurements, each made once.
  started: collections.deque[list[concurrent.futures.Future[CaseResult]]] = collections.deque()
  with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="conformance-check") as checker:
    if not pinned:  # Measured while the first programs compile (before any check reads it).
      checker.submit(measured_arithmetic, platform)

    def start_more() -> None:
      while len(started) <= AHEAD:
        row = next(rows, None)
        if row is None:
          return
        started.append([checker.submit(finish) for finish in _start_row(row, platform, pinned, memo)])

    try:
      start_more()
      while started:
        futures = started.popleft()
        start_more()
        for future in futures:
          yield future.result()
    finally:  # A consumer that stops early: the checks not begun are dropped.
      for futures in started:
        for future in futures:
          future.cancel()


def run_case(case: Case, platform: str = "cpu", pinned: bool | None = None) -> CaseResult:
  """Runs ``case`` through its Optax transform on ``platform`` and checks it (:func:`results`)."""
  return next(results([case], platform, pinned))
