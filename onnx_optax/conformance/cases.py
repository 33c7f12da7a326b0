"""The case grid: every rule x dtype x shape x hyperparameter edge.

A :class:`Case` is one call of one Optax transform's ``update`` from a given
state: the tensors (one leaf, or a pytree of several), their gradients, the
state tensors and the update count ``T``. Its inputs are drawn from a fixed
seed and rounded to the case's dtype, so the implementation and the float64
reference see the same numbers.

Magnitudes are chosen per dtype so that each case tests what its name says
and stays in the dtype's range: a "huge" gradient is ``1e15`` in float32 and
bfloat16 but ``100`` in float16 (whose largest number is 65504, and ``H``
holds ``G*G``); a "tiny" gradient is of the order of ``epsilon``, which is set
to ``1e-6`` in float32 and bfloat16, ``1e-8`` in float64 and ``1e-2`` in
float16 (so that ``G*G`` stays a normal float16 number).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnx_optax import _checks, _engine, registry
from onnx_optax.conformance.devices import numpy_dtype, received_dtype

__all__ = [
  "DTYPES",
  "RULES",  # noqa: F822 (read from the registry by __getattr__)
  "SMALL_X",
  "TWINS",  # noqa: F822
  "Case",
  "SuiteRule",
  "base_rule",
  "cases",
  "dtypes_of",
  "names",
  "numpy_dtype",
  "received_dtype_of",
  "suite_rule",
  "suite_rule_of",
  "suite_rules",
]

#: The parameter dtypes, float32 first.
DTYPES = ("float32", "float64", "float16", "bfloat16")

INT32_MAX = int(np.iinfo(np.int32).max)
LARGE = 10**6
#: ``Case.x_scale`` of the small-parameter cases: ``|X|`` in [0.005, 0.02], the size of a step
#: (``R = 0.05`` times a ratio of order 1; Adam's bias correction makes it ~0.01 at ``T = 5``).
SMALL_X = 0.01
_LARGE_T = 7  # The T of the 10^6-element case.

_TINY = {"float64": 1e-8, "float32": 1e-6, "bfloat16": 1e-6, "float16": 1e-2}
_HUGE = {"float64": 1e100, "float32": 1e15, "bfloat16": 1e15, "float16": 100.0}
#: The relative noise of a "near_singular" gradient (``Case.gradient``) beside its rank-one part.
_NEAR_SINGULAR_NOISE = 1e-3


@dataclass(frozen=True)
class SuiteRule:
  """A rule of the suite: a registered rule, or one of its variants, as the grid checks it.

  Everything here is read from the registry (:mod:`onnx_optax.registry`): nothing is
  decided by the rule's name.

  Attributes:
    name: the suite's name: the rule's, or ``f"{rule}_{suffix}"`` for a variant
      (:class:`~onnx_optax.registry.Variant`).
    rule: the registered rule.
    hyper: the grid's hyperparameters: the rule's conformance hyperparameters, with the
      variant's.
    edges: the rule's edges that apply to these hyperparameters (an edge's ``"only"`` names the
      hyperparameters a variant must have for it to apply).
    variant: the variant's own hyperparameters (empty for a rule without variants).
  """

  name: str
  rule: registry.Rule
  hyper: Mapping[str, Any]
  edges: tuple[registry.Edge, ...]
  variant: Mapping[str, Any] = field(default_factory=dict)

  @property
  def conformance(self) -> registry.Conformance:
    if self.rule.conformance is None:  # suite_rules() lists only rules that declare one.
      raise ValueError(f"{self.rule.name} declares no conformance")
    return self.rule.conformance

  @property
  def dtypes(self) -> tuple[str, ...]:
    """The parameter dtypes the grid checks the rule in."""
    return self.conformance.dtypes

  @property
  def framework(self) -> bool:
    """Whether the rule is a framework twin (its policy is the framework one), run on the twins'
    grid with the framework's Python-float hyperparameters (:func:`received_dtype_of`)."""
    return self.rule.policy is _engine.FRAMEWORK

  @property
  def first(self) -> int:
    """The count at the rule's first update (the transform's ``initial_count`` default)."""
    return self.rule.first_count()

  @property
  def state(self) -> tuple[tuple[str, bool], ...]:
    """The state tensors in the spec's order, as pairs of a name and whether it is a second moment."""
    return tuple((f.name, f.second_moment) for f in self.rule.fields)

  @property
  def epsilon(self) -> str | None:
    """The hyperparameter added to a root (the one checked as an epsilon), if the rule has one."""
    found = [
      h for h, p in self.rule.hyperparameters.items() if p.check is _checks.epsilon and h in self.hyper
    ]
    return found[0] if found else None

  @property
  def outputs(self) -> tuple[str, ...]:
    """The names of the outputs in the spec, ``X``'s first and then one per state tensor."""
    return self.conformance.outputs or ("X_new", *(f"{f.spec}_new" for f in self.rule.fields))


def _applies(edge: registry.Edge, hyper: Mapping[str, Any]) -> bool:
  return all(hyper.get(k) == v for k, v in edge.changes.get("only", {}).items())


_SUITE: tuple[tuple[int, ...], dict[str, SuiteRule]] = ((), {})


def suite_rules() -> dict[str, SuiteRule]:
  """The suite's rules by name, in the registry's order, each rule expanded by its variants.

  Read from the registry at every call (a rule registered from outside the package is in it
  at once), remembered while the registry is unchanged.
  """
  global _SUITE
  registered = list(registry.rules())
  key = tuple(id(r) for r in registered)
  if key != _SUITE[0]:
    found: dict[str, SuiteRule] = {}
    for rule in registered:
      if rule.conformance is None:
        continue
      for variant in rule.variants or (None,):
        name = rule.name if variant is None else f"{rule.name}_{variant.suffix}"
        hyper = {**rule.conformance.hyper, **(variant.hyper if variant is not None else {})}
        edges = tuple(e for e in rule.conformance.edges if _applies(e, hyper))
        found[name] = SuiteRule(name, rule, hyper, edges, dict(variant.hyper) if variant else {})
      # A flag that adds state fields (Rule.flagged): its rule checked as a suite rule of its own.
      for flag, flagged in rule.flagged.items():
        if flagged.conformance is not None:
          hyper = {**flagged.conformance.hyper, flag: True}
          edges = tuple(e for e in flagged.conformance.edges if _applies(e, hyper))
          found[f"{rule.name}_{flag}"] = SuiteRule(f"{rule.name}_{flag}", flagged, hyper, edges, {flag: True})
    _SUITE = (key, found)
  return _SUITE[1]


def suite_rule(name: str) -> SuiteRule:
  """The suite rule of that name.

  Raises:
    KeyError: no such rule; the message lists the suite's rules.
  """
  found = suite_rules()
  if name not in found:
    raise KeyError(f"no rule named {name!r} in the suite; its rules: {', '.join(found)}")
  return found[name]


def names() -> tuple[str, ...]:
  """Every rule of the suite: the spec rules (with their variants), then the framework twins."""
  found = suite_rules().values()
  return tuple(s.name for s in found if not s.framework) + tuple(s.name for s in found if s.framework)


def __getattr__(attribute: str) -> tuple[str, ...]:
  """``RULES`` and ``TWINS``, read from the registry when asked for (a rule registered later is in them).

  ``RULES``: the spec rules the suite checks (the two Momentum modes count as two rules, and so
  do the two ``adam_mode`` of ONNX Runtime's AdamW). ``TWINS``: the PyTorch-order and
  Keras-order twins, the same rules in exact arithmetic, evaluated in the frameworks' order
  (docs/spec.md, "PyTorch-order twins"); they run a smaller grid (:func:`cases`).
  """
  if attribute in ("RULES", "TWINS"):
    twins = attribute == "TWINS"
    return tuple(s.name for s in suite_rules().values() if s.framework == twins)
  raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def suite_rule_of(rule: registry.Rule, hyper: Mapping[str, Any]) -> SuiteRule:
  """The suite rule that checks ``rule`` with these hyperparameters: its variant whose own
  hyperparameters they have (the rule itself when it has no variants).

  Raises:
    LookupError: no variant of ``rule`` has them.
  """
  for suite in suite_rules().values():
    if suite.rule is rule and all(hyper.get(k) == v for k, v in suite.variant.items()):
      return suite
  raise LookupError(f"no variant of {rule.name} in the suite has the hyperparameters {dict(hyper)}")


def base_rule(rule: str) -> str:
  """The registered rule of a suite rule (its variants' too): the name its expectation and its bound
  model are registered under. A registered rule's own name is its own base."""
  found = suite_rules()
  return found[rule].rule.name if rule in found else registry.get(rule).name


def dtypes_of(rule: str) -> tuple[str, ...]:
  """The dtypes the grid checks ``rule`` in (its registered conformance's)."""
  return suite_rule(rule).dtypes


def received_dtype_of(rule: str, dtype: str, state_dtype: str | None = None) -> np.dtype:
  """The dtype ``rule``'s Python-float hyperparameters reach it in.

  A spec rule: :func:`~onnx_optax.conformance.devices.received_dtype` (float64 under x64, else
  float32). A framework twin: float64, for PyTorch's and Keras's hyperparameters are Python
  floats, and the twins compute their scalars from them on the host (``1 - beta2`` in float64,
  rounded once), or round each one once where it meets a tensor.
  """
  return np.dtype(np.float64) if suite_rule(rule).framework else received_dtype(dtype, state_dtype)


@dataclass(frozen=True)
class Case:
  """One ``update`` call of one rule, from a given state.

  Attributes:
    rule: a suite rule's name (:func:`names`).
    dtype: a name of :data:`DTYPES`, the dtype of parameters and state.
    name: what the case tests.
    T: the state's ``count``, the spec's ``T`` of this update.
    R: the learning rate.
    hyper: the rule's hyperparameters (Python floats, and Momentum's mode).
    shapes: one shape per leaf; more than one leaf makes a nested pytree.
    gradient: ``"normal"``, ``"zero"``, ``"tiny"``, ``"huge"``, or ``"near_singular"`` (2-D
      leaves only: the outer product ``u v^T`` of two vectors drawn as a normal gradient, plus
      a normal gradient times ``1e-3``, rounded once to the dtype; one singular value dominates,
      the others are about 1e-4 to 1e-3 of it).
    state: ``"random"`` (non-zero), ``"zero"``, or ``"tight"`` (random, a field declared
      ``root_of`` a second moment within 0.1% of that bound, one declared ``at_least`` another
      equal to it).
    state_dtype: the transform's ``state_dtype`` (None: the parameters' dtype).
    schedule_steps: None for a constant learning rate ``R``; else the
      learning rate is ``optax.linear_schedule(R, 0, schedule_steps)``,
      evaluated at the number of updates applied (:attr:`learning_rate`).
    initial_count: the transform's ``initial_count`` (None: its default,
      :attr:`first_T`).
    unchecked_limit: why this dtype cannot bound some output elements (an
      infinite tolerance), for a case that exists to show that limit; None
      (every case of the grid now) makes any unchecked element a failure.
    x_scale: the parameters' magnitude, ``|X|`` in ``[0.5, 2] * x_scale``;
      :data:`SMALL_X` makes ``|X|`` of the order of the step, so that
      ``X_new = X + U`` keeps the step's digits.
  """

  rule: str
  dtype: str
  name: str
  T: int
  R: float
  hyper: dict[str, Any] = field(hash=False)
  shapes: tuple[tuple[int, ...], ...] = ((13,),)
  gradient: str = "normal"
  state: str = "random"
  state_dtype: str | None = None
  schedule_steps: int | None = None
  initial_count: int | None = None
  unchecked_limit: str | None = None
  x_scale: float = 1.0

  @property
  def id(self) -> str:
    return f"{self.rule}-{self.dtype}-{self.name}"

  @property
  def first_T(self) -> int:
    """The ``T`` of the transform's first update: its ``initial_count``."""
    if self.initial_count is not None:
      return self.initial_count
    return self.suite.first

  @property
  def suite(self) -> SuiteRule:
    """The case's rule, as the suite checks it."""
    return suite_rule(self.rule)

  @property
  def learning_rate(self) -> float:
    """The spec's ``R`` of this update, from the case alone (not from Optax).

    With a schedule it is the linear schedule's value after ``n = T -
    initial_count`` updates: ``R * (1 - min(n, steps) / steps)``, exact in
    every dtype for the ``R`` and ``steps`` (powers of two) of the grid.
    """
    if self.schedule_steps is None:
      return self.R
    n = min(self.T - self.first_T, self.schedule_steps)
    return self.R * (1 - n / self.schedule_steps)

  @property
  def base_rule(self) -> str:
    """The registered rule's name, under which its expectation and bound model are registered."""
    return self.suite.rule.name

  def inputs(self) -> tuple[list[np.ndarray], list[np.ndarray], list[list[np.ndarray]]]:
    """``(X, G, state)``: leaves, gradients and state tensors, rounded to the dtype."""
    rng = np.random.default_rng(zlib.crc32(self.id.encode()))
    dtype = numpy_dtype(self.dtype)
    state_dtype = numpy_dtype(self.state_dtype or self.dtype)

    def draw(shape, low, high, signed=True, scale=1.0, dtype=dtype):
      x = rng.uniform(low, high, size=shape) * scale
      if signed:
        x = x * rng.choice([-1.0, 1.0], size=shape)
      return np.asarray(x).astype(dtype)  # Rounded once, from float64.

    def near_singular(shape):
      # Nearly rank one: u v^T plus a relative noise of 1e-3, in float64, rounded once.
      if len(shape) != 2:
        raise ValueError(f"a near_singular gradient is a matrix, got shape {shape} in case {self.id}")
      u, v = (draw((n,), 0.5, 1.0, dtype=np.float64) for n in shape)
      noise = draw(shape, 0.5, 1.0, scale=_NEAR_SINGULAR_NOISE, dtype=np.float64)
      return (np.outer(u, v) + noise).astype(dtype)

    huge = self.suite.conformance.huge.get(self.dtype, _HUGE[self.dtype])  # the rule's (Conformance.huge)
    X = [draw(s, 0.5, 2.0, scale=self.x_scale) for s in self.shapes]
    if self.gradient == "near_singular":
      G = [near_singular(s) for s in self.shapes]
    else:
      scale = {"normal": 1.0, "zero": 0.0, "tiny": _TINY[self.dtype], "huge": huge}[self.gradient]
      G = [draw(s, 0.5, 1.0, scale=scale) for s in self.shapes]
    state_scale = _TINY[self.dtype] if self.gradient == "tiny" else 1.0
    state: list[list[np.ndarray]] = []
    drawn: dict[str, list[np.ndarray]] = {}
    for f in self.suite.rule.fields:
      if not f.like_params or f.reach is not None:
        # A field of its own shape and dtype, or of a declared reach (Field.shape, dtypes,
        # reach): a value the rule reaches, its initial one for a fresh state.
        own = numpy_dtype(f.dtypes[0]) if f.dtypes else state_dtype
        shapes = [f.shape_for(s) for s in self.shapes]
        if self.state == "zero":
          first = self.learning_rate if f.initial == registry.LEARNING_RATE else f.initial
          first = float(self.hyper[first]) if isinstance(first, str) else float(first)
          leaves = [np.full(s, first, own) for s in shapes]
        else:
          low, high = f.reach if f.reach is not None else (0.1, 1.0)
          leaves = [draw(s, low, high, signed=False, dtype=own) for s in shapes]
      elif self.state == "zero":
        leaves = [np.zeros(s, state_dtype) for s in self.shapes]
      elif f.at_least:
        # A state the rule reaches: not below the field it is the running maximum of (1.5 to 3
        # times it; "tight": equal to it).
        low, high = (1.0, 1.0) if self.state == "tight" else (1.5, 3.0)
        leaves = [
          np.asarray(draw(s, low, high, signed=False, dtype=np.float64) * np.asarray(v, np.float64)).astype(
            state_dtype
          )
          for s, v in zip(self.shapes, drawn[f.at_least])
        ]
      elif f.second_moment:
        leaves = [
          draw(s, 0.1, 1.0, signed=False, scale=state_scale**2, dtype=state_dtype) for s in self.shapes
        ]
      elif f.root_of:
        # A state the rule reaches: |field| below the root of the second moment it is the mean
        # of ("tight": within 0.1% of it, where their difference cancels).
        low, high = (0.999, 0.9999) if self.state == "tight" else (0.1, 0.9)
        roots = [np.sqrt(np.asarray(v, np.float64)) for v in drawn[f.root_of]]
        leaves = [
          np.asarray(draw(s, low, high, dtype=np.float64) * r).astype(state_dtype)
          for s, r in zip(self.shapes, roots)
        ]
      else:
        leaves = [draw(s, 0.1, 1.0, scale=state_scale, dtype=state_dtype) for s in self.shapes]
      drawn[f.name] = leaves
      state.append(leaves)
    return X, G, state


#: Why the float16 tiny-gradient cases may have unchecked elements on a TPU.
_TPU_FLOAT16_TINY = (
  "float16 on a TPU, which flushes subnormals: (1 - beta2) * G * G (~1e-7) and the tiny state "
  "(~1e-5) are below float16's smallest normal number (6.1e-5), so the second moment is known "
  "to within a few 6.1e-5, its square root to within its own size"
)


def _case(rule: str, dtype: str, name: str, T: int = 5, R: float = 0.05, **kwargs: Any) -> Case:
  hyper = dict(suite_rule(rule).hyper)
  hyper.update(kwargs.pop("hyper", {}))
  kwargs.setdefault("shapes", suite_rule(rule).conformance.shapes)  # the rule's (Conformance.shapes)
  ranks = suite_rule(rule).rule.ranks
  if ranks:  # A rule of matrices only (Rule.ranks): the grid's shapes taken to its rank.
    kwargs["shapes"] = tuple(_ranked(s, ranks) for s in kwargs.get("shapes", Case.shapes))
  return Case(rule, dtype, name, T, R, hyper, **kwargs)


def _ranked(shape: tuple[int, ...], ranks: tuple[int, ...]) -> tuple[int, ...]:
  """``shape`` with the first of ``ranks`` dimensions: its leading ones merged, or ones appended
  (``(13,)`` is ``(13, 1)``, ``(1, 7, 2)`` is ``(7, 2)`` for ``(2,)``); a shape of one of them kept."""
  if len(shape) in ranks:
    return shape
  r = ranks[0]
  if len(shape) < r:
    return (*shape, *(1,) * (r - len(shape)))
  return (int(np.prod(shape[: len(shape) - r + 1])), *shape[len(shape) - r + 1 :])


#: Why a twin's first step from a zero state may have unchecked elements in float16 on a TPU.
_TPU_FLOAT16_FIRST = (
  "float16 on a TPU, which flushes subnormals: each operation's result is known to within "
  "float16's smallest normal number (6.1e-5), and the first second moment (1 - beta2) * G * G "
  "(2.5e-4 at |G| = 0.5) is a few of them: through NAdam's several operations, its square root is "
  "known to within its own size"
)

#: Why a float16 case whose state is drawn tight against its bound may have unchecked elements on
#: a TPU.
_TPU_FLOAT16_TIGHT = (
  "float16 on a TPU, which flushes subnormals: a state drawn within 0.1% of its bound (RMSprop's "
  "centred square_avg against grad_avg^2) leaves a difference below float16's smallest normal "
  "number (6.1e-5), known to within its own size"
)


def _edges(rule: str, dtype: str) -> list[Case]:
  """The hyperparameter edges the rule declares (:attr:`onnx_optax.registry.Conformance.edges`)."""
  found = []
  for edge in suite_rule(rule).edges:
    changes: dict[str, Any] = {k: v for k, v in edge.changes.items() if k != "only"}
    if dtype == "float16" and changes.get("state") == "tight":
      changes["unchecked_limit"] = _TPU_FLOAT16_TIGHT
    found.append(_case(rule, dtype, edge.name, **changes))
  return found


#: A state dtype narrower than each parameter dtype (or, for float16 and
#: bfloat16, the other half-precision type: JAX computes in float32 then):
#: the new state is rounded to it, and only a transform that keeps the
#: state's dtype passes.
NARROW_STATE = {"float64": "float32", "float32": "bfloat16", "float16": "bfloat16", "bfloat16": "float16"}


def _transform_layer(rule: str, dtype: str, first: int) -> list[Case]:
  """What the Optax layer adds to the rule: schedules, ``initial_count``, state dtypes.

  A schedule is evaluated at the number of updates applied, ``T -
  initial_count``; with ``initial_count = 0`` (the ONNX rules' default) that
  is ``T`` itself, so the ONNX rules also run with ``initial_count = 1``
  (Adagrad's 1-based convention), where a schedule evaluated at ``T`` is
  off by one update. R = 2 and 4 steps keep every value of the schedule (2, 1.5, 1, 0.5, 0)
  exact in every dtype.
  """
  c = lambda name, **kw: _case(rule, dtype, name, **kw)  # noqa: E731
  grid = [
    c("schedule", T=first + 3, R=2.0, schedule_steps=4),
    c(f"state_dtype={NARROW_STATE[dtype]}", state_dtype=NARROW_STATE[dtype]),
  ]
  if first == 0:
    grid.append(c("schedule,initial_count=1", T=4, R=2.0, schedule_steps=4, initial_count=1))
  return grid


def _without(changes: Mapping[str, Any]) -> str:
  """A case name's part for hyperparameters set to a value (``weight_decay=0``)."""
  return ",".join(f"{k}={v:g}" for k, v in changes.items())


def _twin_cases(rule: str, dtype: str) -> list[Case]:
  """The twins' grid: the rule's cases of :func:`cases` that apply to a framework's step.

  Every twin's ``count`` is its framework's (updates done, 0 at the first). bfloat16:
  PyTorch's mixed precision only, bfloat16 parameters with a float32 state. Left out: the
  Optax layer's cases (schedules, ``initial_count``, narrow states: the twins share that
  layer with each other, not with the ONNX rules) and the 10^6-element case (the runtime:
  the same arithmetic as ``odd``).
  """
  suite = suite_rule(rule)
  c = lambda name, **kw: _case(rule, dtype, name, **kw)  # noqa: E731
  quiet = dict(suite.conformance.tiny_gradient)  # The terms a tiny gradient would be lost beside.
  if dtype == "bfloat16":  # PyTorch's mixed precision: bfloat16 parameters, a float32 state.
    f32 = dict(state_dtype="float32")
    grid = [
      c("state_dtype=float32", shapes=((), (3, 5), (1, 7, 2)), **f32),
      c("state_dtype=float32,T=0", T=0, **f32),
      c("state_dtype=float32,T=10^6", T=10**6, **f32),
    ]
    if quiet:
      grid.append(c(f"state_dtype=float32,{_without(quiet)}", hyper=quiet, **f32))
    grid += [
      # The first state's increments alone, the gradient not rounded by a weight decay.
      c("state_dtype=float32,state=0,T=0", T=0, state="zero", hyper=quiet, **f32),
      c("state_dtype=float32,|X|~step", x_scale=SMALL_X, **f32),
    ]
    if suite.epsilon is not None:
      tiny = {suite.epsilon: _TINY[dtype], **quiet}
      grid.append(c("state_dtype=float32,gradient~epsilon", R=1.0, gradient="tiny", hyper=tiny, **f32))
    return grid
  grid = [
    c("pytree", shapes=((), (3, 5), (1, 7, 2))),
    c("scalar", T=2, shapes=((),)),
    c("odd", shapes=((13,),)),
    c("T=0", T=0),
    c("T=1", T=1),
    c("T=10^6", T=10**6),
    c("T=int32max", T=INT32_MAX),
    c("gradient=0", gradient="zero"),
    c("gradient=huge", gradient="huge"),
    c("state=0,T=0", T=0, state="zero", unchecked_limit=_TPU_FLOAT16_FIRST if dtype == "float16" else None),
  ]
  if suite.epsilon is not None:
    tiny = {suite.epsilon: _TINY[dtype], **quiet}
    limit = _TPU_FLOAT16_TINY if dtype == "float16" else None  # PyTorch's float16 state, on a TPU
    grid.append(c("gradient~epsilon", R=1.0, gradient="tiny", hyper=tiny, unchecked_limit=limit))
  else:
    grid.append(c("gradient=tiny", gradient="tiny", hyper=quiet))
  grid += _edges(rule, dtype)
  grid += [c(f"|X|~step,T={T}", T=T, x_scale=SMALL_X) for T in (0, 1, _LARGE_T)]
  return grid


def cases(rule: str, dtype: str, *, large: bool = True) -> list[Case]:
  """Every case of one rule in one dtype.

  A framework twin (:attr:`SuiteRule.framework`) runs the twins' grid (``_twin_cases``).

  Args:
    rule: a suite rule's name (:func:`names`).
    dtype: one of the rule's dtypes (:func:`dtypes_of`).
    large: include the case with one tensor of 10^6 elements.

  Raises:
    ValueError: the grid does not run the rule in ``dtype``.

  Example:
    >>> [c.name for c in cases("adam", "float32")][:4]
    ['pytree', 'scalar', 'odd', 'T=0']
  """
  suite = suite_rule(rule)
  if dtype not in suite.dtypes:
    raise ValueError(f"the grid runs {rule} in {suite.dtypes}, got dtype={dtype!r}")
  if suite.framework:
    return _twin_cases(rule, dtype)
  first = suite.first
  c = lambda name, **kw: _case(rule, dtype, name, **kw)  # noqa: E731
  grid = [
    c("pytree", shapes=((), (3, 5), (1, 7, 2))),
    c("scalar", T=2, shapes=((),)),
    c("odd", shapes=((13,),)),
    c(f"T={first}", T=first),
    c(f"T={first + 1}", T=first + 1),
    c("T=10^6", T=10**6),
    c("T=int32max", T=INT32_MAX),
    c("gradient=0", gradient="zero"),
    c("gradient=huge", gradient="huge"),
    c(f"state=0,T={first}", T=first, state="zero"),
  ]
  tiny = _TINY[dtype]
  quiet = dict(suite.conformance.tiny_gradient)  # Without L2 (norm_coefficient * X would dwarf it).
  if suite.epsilon is not None:
    # R = 1: the step stays visible next to X even in bfloat16.
    grid.append(
      c(
        "gradient~epsilon",
        R=1.0,
        gradient="tiny",
        hyper={suite.epsilon: tiny, **quiet},
        unchecked_limit=_TPU_FLOAT16_TINY if dtype == "float16" else None,
      )
    )
  else:
    grid.append(c("gradient=tiny", gradient="tiny", hyper=quiet))
  grid += _edges(rule, dtype)
  grid += _transform_layer(rule, dtype, first)
  # Beside every T of the grid, |X| of the step's size: X + U then keeps the step's digits,
  # which X of size 1 rounds away (U itself is checked in every case).
  every_T = sorted({case.T for case in grid} | {_LARGE_T})
  # Below the first T (ORT AdamW's T = 0, only without bias correction): that case's hyperparameters.
  below = {case.T: case.hyper for case in reversed(grid) if case.T < first}
  grid += [c(f"|X|~step,T={T}", T=T, x_scale=SMALL_X, hyper=below.get(T, {})) for T in every_T]
  if dtype in ("float16", "bfloat16"):  # The documented way to train in low precision.
    grid.append(c("state_dtype=float32", shapes=((), (3, 5), (1, 7, 2)), state_dtype="float32"))
    grid.append(c(f"state_dtype=float32,T={first}", T=first, state_dtype="float32"))
    if suite.epsilon is not None:
      grid.append(
        c(
          "state_dtype=float32,gradient~epsilon",
          R=1.0,
          gradient="tiny",
          state_dtype="float32",
          hyper={suite.epsilon: tiny, **quiet},
        )
      )
  if large:
    grid.append(c("10^6 elements", T=_LARGE_T, shapes=((LARGE,),)))
  return grid


def replace(case: Case, **changes: Any) -> Case:
  """A copy of ``case`` with some fields changed."""
  return dataclasses.replace(case, **changes)
