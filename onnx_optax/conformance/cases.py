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
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
  "DTYPES",
  "RULES",
  "SMALL_X",
  "TWINS",
  "TWIN_DTYPES",
  "Case",
  "base_rule",
  "cases",
  "dtypes_of",
  "numpy_dtype",
]

#: The rules the suite checks; the two Momentum modes count as two rules, and so do the two
#: ``adam_mode`` of ONNX Runtime's AdamW.
RULES = (
  "momentum_standard",
  "momentum_nesterov",
  "adagrad",
  "adam",
  "directml_adam",
  "ort_adamw_mode0",
  "ort_adamw_mode1",
  "ort_sgd",
)
#: The parameter dtypes, float32 first.
DTYPES = ("float32", "float64", "float16", "bfloat16")
#: The PyTorch-order and Keras-order twins, the same rules as ONNX Momentum, Adagrad, ONNX
#: Runtime's AdamW and DirectML Adam in exact arithmetic, evaluated in the frameworks' order
#: (docs/spec.md, "PyTorch-order twins"). They run a smaller grid (:func:`cases`), in the
#: dtypes their frameworks train in with their own state, :data:`TWIN_DTYPES`.
TWINS = ("pytorch_sgd", "pytorch_adagrad", "pytorch_adam", "pytorch_adamw", "keras_adam")
#: The twins' dtypes. In bfloat16 the parameters only, with a float32 state (PyTorch's mixed
#: precision), and PyTorch's twins only (Keras computes in the variable's dtype, bfloat16 there).
TWIN_DTYPES = ("float32", "float64", "bfloat16")

INT32_MAX = int(np.iinfo(np.int32).max)
LARGE = 10**6
#: ``Case.x_scale`` of the small-parameter cases: ``|X|`` in [0.005, 0.02], the size of a step
#: (``R = 0.05`` times a ratio of order 1; Adam's bias correction makes it ~0.01 at ``T = 5``).
SMALL_X = 0.01
_LARGE_T = 7  # The T of the 10^6-element case.

_TINY = {"float64": 1e-8, "float32": 1e-6, "bfloat16": 1e-6, "float16": 1e-2}
_HUGE = {"float64": 1e100, "float32": 1e15, "bfloat16": 1e15, "float16": 100.0}

_DEFAULTS: dict[str, dict[str, Any]] = {
  "momentum_standard": dict(alpha=0.9, beta=0.8, mode="standard", norm_coefficient=0.01),
  "momentum_nesterov": dict(alpha=0.9, beta=0.8, mode="nesterov", norm_coefficient=0.01),
  "adagrad": dict(decay_factor=0.1, epsilon=1e-6, norm_coefficient=0.01),
  "adam": dict(alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.01, norm_coefficient_post=0.0),
  "directml_adam": dict(beta1=0.9, beta2=0.999, epsilon=1e-8),
  # The schema's defaults but epsilon = 1e-6 (what generate_artifacts writes; 1e-8 is 0 in float16).
  "ort_adamw_mode0": dict(
    alpha=0.9, beta=0.999, epsilon=1e-6, weight_decay=0.01, adam_mode=0, correct_bias=True
  ),
  "ort_adamw_mode1": dict(
    alpha=0.9, beta=0.999, epsilon=1e-6, weight_decay=0.01, adam_mode=1, correct_bias=True
  ),
  "ort_sgd": {},
  # The twins' hyperparameters by their frameworks' names; every term non-zero.
  "pytorch_sgd": dict(momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False),
  "pytorch_adagrad": dict(lr_decay=0.1, eps=1e-6, weight_decay=0.01),
  "pytorch_adam": dict(betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
  "pytorch_adamw": dict(betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
  "keras_adam": dict(beta_1=0.9, beta_2=0.999, epsilon=1e-7),
}
#: The state tensors of each rule, in the spec's order, and whether each is a
#: second moment (non-negative).
STATE: dict[str, tuple[tuple[str, bool], ...]] = {
  "momentum_standard": (("v", False),),
  "momentum_nesterov": (("v", False),),
  "adagrad": (("h", True),),
  "adam": (("v", False), ("h", True)),
  "directml_adam": (("m", False), ("v", True)),
  "ort_adamw_mode0": (("m1", False), ("m2", True)),
  "ort_adamw_mode1": (("m1", False), ("m2", True)),
  "ort_sgd": (),
  "pytorch_sgd": (("momentum_buffer", False),),
  "pytorch_adagrad": (("sum", True),),
  "pytorch_adam": (("exp_avg", False), ("exp_avg_sq", True)),
  "pytorch_adamw": (("exp_avg", False), ("exp_avg_sq", True)),
  "keras_adam": (("m", False), ("v", True)),
}
_EPSILON = {
  "adagrad": "epsilon",
  "adam": "epsilon",
  "directml_adam": "epsilon",
  "ort_adamw_mode0": "epsilon",
  "ort_adamw_mode1": "epsilon",
}
#: The rules whose first update has ``T = 1`` (at ``T = 0`` the bias correction is 0/0).
ONE_BASED = ("directml_adam", "ort_adamw_mode0", "ort_adamw_mode1")


def base_rule(rule: str) -> str:
  """A suite rule's name in :mod:`onnx_optax.reference` and the tolerance model (modes dropped)."""
  for base in ("momentum", "ort_adamw"):
    if rule.startswith(base):
      return base
  return rule


def numpy_dtype(name: str) -> np.dtype:
  """The NumPy dtype of a dtype name (bfloat16 from ml_dtypes)."""
  return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


@dataclass(frozen=True)
class Case:
  """One ``update`` call of one rule, from a given state.

  Attributes:
    rule: a name of :data:`RULES`.
    dtype: a name of :data:`DTYPES`, the dtype of parameters and state.
    name: what the case tests.
    T: the state's ``count``, the spec's ``T`` of this update.
    R: the learning rate.
    hyper: the rule's hyperparameters (Python floats, and Momentum's mode).
    shapes: one shape per leaf; more than one leaf makes a nested pytree.
    gradient: ``"normal"``, ``"zero"``, ``"tiny"`` or ``"huge"``.
    state: ``"random"`` (non-zero) or ``"zero"``.
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
    return 1 if self.rule in ONE_BASED else 0  # DirectML's and ORT AdamW's T start at 1.

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
    """The rule's name in :mod:`onnx_optax.reference` and the tolerance model."""
    return base_rule(self.rule)

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

    scale = {"normal": 1.0, "zero": 0.0, "tiny": _TINY[self.dtype], "huge": _HUGE[self.dtype]}[self.gradient]
    X = [draw(s, 0.5, 2.0, scale=self.x_scale) for s in self.shapes]
    G = [draw(s, 0.5, 1.0, scale=scale) for s in self.shapes]
    state_scale = _TINY[self.dtype] if self.gradient == "tiny" else 1.0
    state = []
    for _, second_moment in STATE[self.rule]:
      if self.state == "zero":
        state.append([np.zeros(s, state_dtype) for s in self.shapes])
      elif second_moment:
        state.append(
          [draw(s, 0.1, 1.0, signed=False, scale=state_scale**2, dtype=state_dtype) for s in self.shapes]
        )
      else:
        state.append([draw(s, 0.1, 1.0, scale=state_scale, dtype=state_dtype) for s in self.shapes])
    return X, G, state


#: Why the float16 tiny-gradient cases may have unchecked elements on a TPU.
_TPU_FLOAT16_TINY = (
  "float16 on a TPU, which flushes subnormals: (1 - beta2) * G * G (~1e-7) and the tiny state "
  "(~1e-5) are below float16's smallest normal number (6.1e-5), so the second moment is known "
  "to within a few 6.1e-5, its square root to within its own size"
)


def _case(rule: str, dtype: str, name: str, T: int = 5, R: float = 0.05, **kwargs: Any) -> Case:
  hyper = dict(_DEFAULTS[rule])
  hyper.update(kwargs.pop("hyper", {}))
  return Case(rule, dtype, name, T, R, hyper, **kwargs)


def _edges(rule: str, dtype: str) -> list[Case]:
  """Hyperparameter edges specific to one rule."""
  c = lambda name, **kw: _case(rule, dtype, name, **kw)  # noqa: E731
  if rule.startswith("momentum"):
    return [
      c("alpha=0", hyper=dict(alpha=0.0)),
      c("beta=1", hyper=dict(beta=1.0)),
      c("beta=0", hyper=dict(beta=0.0)),
      c("beta=0,T=0", T=0, hyper=dict(beta=0.0)),
      c("norm_coefficient=0", hyper=dict(norm_coefficient=0.0)),
    ]
  if rule == "adagrad":
    return [
      c("epsilon=0", hyper=dict(epsilon=0.0)),
      c("decay_factor=0", hyper=dict(decay_factor=0.0)),
      c("norm_coefficient=0", hyper=dict(norm_coefficient=0.0)),
    ]
  if rule == "adam":
    return [
      c("alpha=0", hyper=dict(alpha=0.0)),
      c("beta=1", hyper=dict(beta=1.0)),
      c("beta=1,T=0", T=0, hyper=dict(beta=1.0)),
      c("beta=0", hyper=dict(beta=0.0)),
      c("epsilon=0", hyper=dict(epsilon=0.0)),
      c("norm_coefficient_post", hyper=dict(norm_coefficient_post=0.02)),
      c("norm_coefficient_post,T=0", T=0, hyper=dict(norm_coefficient_post=0.02)),
      # Large enough to stand out of bfloat16's rounding of X (0.02 is 5 u there).
      c("norm_coefficient_post=0.25", hyper=dict(norm_coefficient_post=0.25)),
      c("norm_coefficient=0", hyper=dict(norm_coefficient=0.0)),
      c("alpha=0.999,state=0", state="zero", hyper=dict(alpha=0.999)),
    ]
  if rule.startswith("ort_adamw"):
    grid = [
      c("alpha=0", hyper=dict(alpha=0.0)),
      c("beta=0", hyper=dict(beta=0.0)),
      c("epsilon=0", hyper=dict(epsilon=0.0)),
      c("weight_decay=0", hyper=dict(weight_decay=0.0)),
      # Large enough to stand out of bfloat16's rounding of X (lr * 0.01 is far below it).
      c("weight_decay=5", hyper=dict(weight_decay=5.0)),
      c("alpha=0.999,state=0", state="zero", hyper=dict(alpha=0.999)),
    ]
    if rule.endswith("mode1"):  # ONNX Runtime refuses correct_bias=0 in mode 0.
      grid += [
        c("correct_bias=0", hyper=dict(correct_bias=False)),
        c("correct_bias=0,T=0", T=0, hyper=dict(correct_bias=False)),
      ]
    return grid
  if rule == "ort_sgd":
    return [c("R=1", R=1.0)]
  return [
    c("beta1=0", hyper=dict(beta1=0.0)),
    c("beta2=1", hyper=dict(beta2=1.0)),
    c("epsilon=0", hyper=dict(epsilon=0.0)),
    c("beta1=0.999,state=0", state="zero", hyper=dict(beta1=0.999)),
  ]


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


_TWIN_EPSILON = {
  "pytorch_adagrad": "eps",
  "pytorch_adam": "eps",
  "pytorch_adamw": "eps",
  "keras_adam": "epsilon",
}


def _twin_edges(rule: str, dtype: str) -> list[Case]:
  """Hyperparameter edges of a twin, each one switching a term of its framework's code off or on."""
  c = lambda name, **kw: _case(rule, dtype, name, **kw)  # noqa: E731
  if rule == "pytorch_sgd":
    return [
      c("nesterov", hyper=dict(nesterov=True, dampening=0.0)),
      c("nesterov,T=0", T=0, hyper=dict(nesterov=True, dampening=0.0)),
      c("momentum=0", hyper=dict(momentum=0.0, dampening=0.0)),
      c("dampening=0", hyper=dict(dampening=0.0)),
      c("weight_decay=0", hyper=dict(weight_decay=0.0)),
    ]
  if rule == "pytorch_adagrad":
    return [
      c("lr_decay=0", hyper=dict(lr_decay=0.0)),
      c("eps=0", hyper=dict(eps=0.0)),
      c("weight_decay=0", hyper=dict(weight_decay=0.0)),
    ]
  if rule in ("pytorch_adam", "pytorch_adamw"):
    return [
      c("weight_decay=0", hyper=dict(weight_decay=0.0)),
      # Large enough to stand out of X's rounding (lr * 0.01 is a few ulps of X in float32).
      c("weight_decay=5", hyper=dict(weight_decay=5.0)),
      c("betas[0]=0", hyper=dict(betas=(0.0, 0.999))),  # lerp's other branch (weight 1 >= 0.5)
      c("betas[0]=0.3", hyper=dict(betas=(0.3, 0.999))),  # the other branch, weight 0.7
      c("eps=0", hyper=dict(eps=0.0)),
      c("betas[0]=0.999,state=0", state="zero", hyper=dict(betas=(0.999, 0.999))),
    ]
  return [  # keras_adam
    c("beta_1=0", hyper=dict(beta_1=0.0)),
    c("epsilon=0", hyper=dict(epsilon=0.0)),
    c("beta_1=0.999,state=0", state="zero", hyper=dict(beta_1=0.999)),
  ]


def _twin_cases(rule: str, dtype: str) -> list[Case]:
  """The twins' grid: the rule's cases of :func:`cases` that apply to a framework's step.

  Every twin's ``count`` is its framework's (updates done, 0 at the first). bfloat16:
  PyTorch's mixed precision only, bfloat16 parameters with a float32 state. Left out: the
  Optax layer's cases (schedules, ``initial_count``, narrow states: the twins share that
  layer with each other, not with the ONNX rules) and the 10^6-element case (the runtime:
  the same arithmetic as ``odd``).
  """
  if dtype not in dtypes_of(rule):
    raise ValueError(f"the twins run in {dtypes_of(rule)} ({rule}), got dtype={dtype!r}")
  c = lambda name, **kw: _case(rule, dtype, name, **kw)  # noqa: E731
  no_l2 = {"weight_decay": 0.0} if "weight_decay" in _DEFAULTS[rule] else {}
  if dtype == "bfloat16":  # PyTorch's mixed precision: bfloat16 parameters, a float32 state.
    f32 = dict(state_dtype="float32")
    grid = [
      c("state_dtype=float32", shapes=((), (3, 5), (1, 7, 2)), **f32),
      c("state_dtype=float32,T=0", T=0, **f32),
      c("state_dtype=float32,T=10^6", T=10**6, **f32),
      c("state_dtype=float32,weight_decay=0", hyper=no_l2, **f32),
      # The first state's increments alone, the gradient not rounded by a weight decay.
      c("state_dtype=float32,state=0,T=0", T=0, state="zero", hyper=no_l2, **f32),
      c("state_dtype=float32,|X|~step", x_scale=SMALL_X, **f32),
    ]
    if rule in _TWIN_EPSILON:
      tiny = {_TWIN_EPSILON[rule]: _TINY[dtype], **no_l2}
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
    c("state=0,T=0", T=0, state="zero"),
  ]
  if rule in _TWIN_EPSILON:
    grid.append(
      c("gradient~epsilon", R=1.0, gradient="tiny", hyper={_TWIN_EPSILON[rule]: _TINY[dtype], **no_l2})
    )
  else:
    grid.append(c("gradient=tiny", gradient="tiny", hyper=no_l2))
  grid += _twin_edges(rule, dtype)
  grid += [c(f"|X|~step,T={T}", T=T, x_scale=SMALL_X) for T in (0, 1, _LARGE_T)]
  return grid


def dtypes_of(rule: str) -> tuple[str, ...]:
  """The dtypes the grid checks ``rule`` in: :data:`DTYPES`, or :data:`TWIN_DTYPES` for a twin
  (Keras's Adam: float32 and float64)."""
  if rule == "keras_adam":
    return ("float32", "float64")
  return TWIN_DTYPES if rule in TWINS else DTYPES


def cases(rule: str, dtype: str, *, large: bool = True) -> list[Case]:
  """Every case of one rule in one dtype.

  Args:
    rule: a name of :data:`RULES` or :data:`TWINS`.
    dtype: a name of :data:`DTYPES` (:data:`TWIN_DTYPES` for a twin).
    large: include the case with one tensor of 10^6 elements.

  Example:
    >>> [c.name for c in cases("adam", "float32")][:4]
    ['pytree', 'scalar', 'odd', 'T=0']
  """
  if rule in TWINS:
    return _twin_cases(rule, dtype)
  first = 1 if rule in ONE_BASED else 0  # DirectML's and ORT AdamW's T start at 1.
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
  # Without L2 (norm_coefficient * X would dwarf a tiny gradient).
  no_l2 = {"norm_coefficient": 0.0} if "norm_coefficient" in _DEFAULTS[rule] else {}
  if rule in _EPSILON:
    # R = 1: the step stays visible next to X even in bfloat16.
    grid.append(
      c(
        "gradient~epsilon",
        R=1.0,
        gradient="tiny",
        hyper={_EPSILON[rule]: tiny, **no_l2},
        unchecked_limit=_TPU_FLOAT16_TINY if dtype == "float16" else None,
      )
    )
  else:
    grid.append(c("gradient=tiny", gradient="tiny", hyper=no_l2))
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
    if rule in _EPSILON:
      grid.append(
        c(
          "state_dtype=float32,gradient~epsilon",
          R=1.0,
          gradient="tiny",
          state_dtype="float32",
          hyper={_EPSILON[rule]: tiny, **no_l2},
        )
      )
  if large:
    grid.append(c("10^6 elements", T=_LARGE_T, shapes=((LARGE,),)))
  return grid


def replace(case: Case, **changes: Any) -> Case:
  """A copy of ``case`` with some fields changed."""
  return dataclasses.replace(case, **changes)
