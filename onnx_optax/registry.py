"""The registry of update rules: each rule declared once, every layer reading it.

A rule's module (``onnx_optax/rules/<rule>.py``) holds its formula, its state,
its Optax transform and one :class:`Rule` that declares everything the other
layers need to know about it: its state fields, its hyperparameters (each with
the check of its kind, which holds the range it accepts and why), the count of
its first update, its two parts (per-update scalars and per-leaf element-wise
work), the policy of the engine that maps it over a pytree, and its bindings
(an ONNX operator, the framework optimizers it is the twin of). The transforms
(:mod:`onnx_optax._engine`), the ONNX interface (:mod:`onnx_optax.onnx`), the
bridges (:mod:`onnx_optax.interop`), the conformance suite and the tests read
this registry instead of keeping tables of their own.

The NumPy expectations (:mod:`onnx_optax.reference`) and the bound models of the
conformance suite are written independently of the JAX code and registered
under the rule's name by their own modules.

Registering a rule from outside the package::

  from onnx_optax import registry
  registry.register(my_rule)      # a Rule; its name must be new

after which :func:`rules` lists it and the conformance grid, the state checks
and the test configurations built from the registry include it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

__all__ = [
  "Binding",
  "bind_to_scalars",
  "Conformance",
  "Edge",
  "Field",
  "Hyperparameter",
  "ABSENT",
  "LAYOUT_OPERATIONS",
  "LEARNING_RATE",
  "MATRICES",
  "NOT_MATRICES",
  "PER_TENSOR",
  "Policy",
  "Rule",
  "TORCH_COMMON_OPTIONS",
  "TORCH_SCALAR_DTYPES",
  "TestConfig",
  "TorchOptimizer",
  "Trajectory",
  "Variant",
  "get",
  "param_shape",
  "register",
  "rules",
  "unregister",
]


@dataclass(frozen=True)
class Field:
  """One state tensor of a rule, in the order its element-wise part takes it.

  Attributes:
    name: the field of the rule's state ``NamedTuple`` (``count`` comes first and is not a field).
    spec: the tensor's name in the rule's spec (``"V"``, ``"M1"``), which names the ONNX
      operator's block and the conformance report's output (``"V_new"``).
    second_moment: a second moment (a running mean or sum of squares): never negative.
    initial: the value the state starts at, or the name of the hyperparameter that gives it.
    root_of: the field (a second moment, declared before this one) whose square root bounds
      this one's magnitude in every state the rule reaches (a running mean of the gradient
      beside the running mean of its squares, RMSprop's centred ``grad_avg``): the conformance
      grid draws states that hold it.
    at_least: the field (declared before this one) that this one is never below in a state the
      rule reaches (a running maximum of it, PyTorch Adam's ``max_exp_avg_sq`` of ``exp_avg_sq``):
      the conformance grid draws states that hold it (``"tight"``: equal to it).
    shape: ``shape(parameter's shape) -> the field's shape``; None: the parameter's shape.
      :data:`PER_TENSOR` is one scalar per parameter (NAdam's ``mu_product``); a factored
      moment is a function of the parameter's shape too. The engine's ``init``, its checks,
      the conformance grid and the bridges read it.
    dtypes: the dtypes the field is kept in whatever the parameter's, the first the one
      ``init`` gives it (``state_dtype`` does not apply); empty: ``state_dtype``, else the
      parameter's. :data:`TORCH_SCALAR_DTYPES` is PyTorch's scalar dtype
      (``_get_scalar_dtype()``); a carried state keeps the one its framework had, and a rule
      computes such a field in its own dtype.
    reach: ``(low, high)``: the values the field takes in every state the rule reaches, which
      the conformance grid and the tests' random states draw from (NAdam's ``mu_product`` in
      ``(0, 1]``); None: the grid's usual draws.
    exists: ``exists(parameter's shape) -> bool``: whether the rule keeps the field beside such a
      parameter (Adafactor's factored ``row_var`` and ``col_var`` for two or more dimensions,
      its ``variance`` below: :data:`MATRICES`, :data:`NOT_MATRICES`); None: beside every one.
      Where it does not, the state holds one zero of shape :data:`ABSENT` in its place, so
      that every field's tree keeps the parameters' structure (``jit``, checkpoints, the
      engine's checks); :meth:`shape_for` gives that shape there, and the engine's
      ``init``, its checks, the conformance grid and the bridges (which write no such key for
      PyTorch and read none) read it.
  """

  name: str
  spec: str
  second_moment: bool = False
  initial: float | str = 0.0
  root_of: str = ""
  at_least: str = ""
  shape: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None
  dtypes: tuple[str, ...] = ()
  reach: tuple[float, float] | None = None
  exists: Callable[[tuple[int, ...]], bool] | None = None

  def exists_for(self, param_shape: Any) -> bool:
    """Whether the rule keeps the field beside a parameter of ``param_shape`` (:attr:`exists`)."""
    return self.exists is None or bool(self.exists(tuple(param_shape)))

  def shape_for(self, param_shape: Any) -> tuple[int, ...]:
    """The field's shape for a parameter of ``param_shape``; :data:`ABSENT` where it does not exist."""
    shape = tuple(param_shape)
    if not self.exists_for(shape):
      return ABSENT
    return shape if self.shape is None else tuple(self.shape(shape))

  def dtype_for(self, param_dtype: Any, state_dtype: Any = None) -> Any:
    """The dtype ``init`` gives the field for a parameter of ``param_dtype``."""
    return self.dtypes[0] if self.dtypes else (state_dtype or param_dtype)

  def keeps(self, dtype: str, param_dtype: str) -> bool:
    """Whether the field may be kept in ``dtype`` (a dtype name) beside a parameter of ``param_dtype``."""
    return dtype in self.dtypes if self.dtypes else dtype == param_dtype

  def described(self, param_shape: Any, param_dtype: str) -> str:
    """The shape and dtype the field has beside that parameter, in words (for the bridges' refusals)."""
    dtype = " or ".join(self.dtypes) if self.dtypes else param_dtype
    return f"shape {self.shape_for(param_shape)} and dtype {dtype}"

  @property
  def like_params(self) -> bool:
    """The field has its parameter's shape and (``state_dtype`` aside) dtype, beside every parameter."""
    return self.shape is None and not self.dtypes and self.exists is None


#: :meth:`Field.shape_for` where the field does not exist (:attr:`Field.exists`): one zero holds its
#: place in the state, as in ``optax.adafactor``'s (checkpointers such as Orbax refuse empty arrays).
ABSENT: tuple[int, ...] = (1,)


def MATRICES(shape: tuple[int, ...]) -> bool:  # noqa: N802  # a declaration's constant
  """:attr:`Field.exists` of a field kept beside parameters of two or more dimensions."""
  return len(shape) >= 2


def NOT_MATRICES(shape: tuple[int, ...]) -> bool:  # noqa: N802
  """:attr:`Field.exists` of a field kept beside parameters of fewer than two dimensions."""
  return len(shape) < 2


def param_shape(fields: tuple[Field, ...], values: Any) -> tuple[int, ...] | None:
  """The shape of the parameter that a rule's state values (one per field, in order) stand beside.

  A field of the parameter's shape gives it; else the broadcast of the fields' shapes (Adafactor's
  ``row_var`` ``(..., m, 1)`` and ``col_var`` ``(..., 1, n)``), those of :data:`ABSENT` shape left
  out first, kept where every field's :meth:`Field.shape_for` of it is the value's shape. None:
  no such shape.
  """
  for f, v in zip(fields, values):
    if f.like_params:
      return tuple(v.shape)
  shapes = [tuple(v.shape) for v in values]
  present = [s for f, s in zip(fields, shapes) if s != ABSENT or f.exists is None]
  for candidates in (present, shapes):
    try:
      shape = tuple(int(n) for n in np.broadcast_shapes(*candidates)) if candidates else ()
    except ValueError:
      continue
    if all(f.shape_for(shape) == s for f, s in zip(fields, shapes)):
      return shape
  return None


def PER_TENSOR(shape: tuple[int, ...]) -> tuple[int, ...]:  # noqa: N802  # a declaration's constant
  """:attr:`Field.shape` of one scalar per parameter, whatever its shape."""
  return ()


#: :attr:`Field.dtypes` of a field PyTorch keeps in its scalar dtype (``_get_scalar_dtype()``:
#: float32, or float64 under ``torch.set_default_dtype(torch.float64)``), not the parameter's.
TORCH_SCALAR_DTYPES = ("float32", "float64")

#: The kinds of operation of a layout map (:mod:`onnx_optax.interop.layout`), which
#: :attr:`Rule.commutes_with` names: ``"take"`` (rows of one axis: a tensor split among leaves),
#: ``"concat"`` (several tensors in one leaf), ``"reshape"``, ``"transpose_last_two"`` (the last
#: two axes swapped, the others in place: ``nnx.Linear``'s kernel of ``torch.nn.Linear``'s weight)
#: and ``"transpose"`` (any other axis permutation).
LAYOUT_OPERATIONS = ("take", "concat", "reshape", "transpose", "transpose_last_two")

#: :attr:`Field.initial` of a field that starts at the learning rate (ASGD's ``eta``); a schedule's
#: value at the first update.
LEARNING_RATE = "learning_rate"


@dataclass(frozen=True)
class Hyperparameter:
  """How a rule checks one hyperparameter.

  Attributes:
    check: ``check(name, value) -> value``, the check of the hyperparameter's kind
      (``onnx_optax._checks``: ``decay``, ``epsilon``, ...), which decides its range and says why;
      ``name`` is the argument as its user wrote it (``"alpha"``, an ONNX attribute, a
      PyTorch ``param_groups[0]['momentum']``). It returns the value the rule computes with.
    static: selects the formula (Momentum's ``mode``, a flag): a Python value when the
      update is traced, never an array.
    decay: a decay rate that the rule subtracts from 1 in the compute dtype; the engine
      refuses one that rounds to 1 where a leaf is computed or stored
      (``onnx_optax._checks.decays_representable``).
    may_be_one: a decay whose range includes 1 (the refusal then offers ``1.0``); a callable of
      the checked hyperparameters where that depends on them.
  """

  check: Callable[[str, Any], Any]
  static: bool = False
  decay: bool = False
  may_be_one: bool | Callable[[Mapping[str, Any]], bool] = False


@dataclass(frozen=True)
class Policy:
  """How the engine maps a rule's element-wise part over the leaves of a pytree.

  Attributes:
    name: ``"spec"`` or ``"framework"``.
    compute_dtype: ``compute_dtype(G.dtype, *state_dtypes) -> dtype``, the dtype a leaf is
      computed in.
    round_scalars: ``round_scalars(scalars, dtype)``, the per-update scalars rounded once to
      a compute dtype.
    casts: the engine casts ``X``, ``G`` and the state to the compute dtype and the results
      back (the spec rules); False: the rule gets its tensors in their own dtypes and rounds
      where its framework stores (the twins).
    refuses_stalling_decays: a decay that rounds to 1 in a 16-bit compute or state dtype is
      refused at ``init`` (the spec rules would silently run another algorithm). The twins
      accept it: their frameworks run that configuration, stall included, and a carried run
      must continue as the framework would.
    params_when_given: the rule gets ``X`` whenever ``update`` is given the parameters (the
      twins read them for parameters narrower than float32); False: only where the rule
      reads them at every update (:attr:`Rule.params_for`), else ``X = None``.
  """

  name: str
  compute_dtype: Callable[..., Any]
  round_scalars: Callable[[Any, Any], Any]
  casts: bool
  refuses_stalling_decays: bool
  params_when_given: bool


#: The param-group keys of every ``torch.optim`` class the bridges read (PyTorch 2.13); a
#: :class:`TorchOptimizer` lists its class's others.
TORCH_COMMON_OPTIONS = frozenset(
  {"params", "lr", "maximize", "foreach", "differentiable", "param_names", "initial_lr"}
)


@dataclass(frozen=True)
class TorchOptimizer:
  """What the PyTorch bridges need to know of a ``torch.optim`` class (a :class:`Binding`'s ``torch``).

  The twin's :attr:`Rule.fields` are PyTorch's state keys; this declares the rest: which
  options the class has, how its state dict is recognised, its ``step``, and what no twin
  reproduces. The bridges (:mod:`onnx_optax.interop`) read it and keep no table of classes.

  Attributes:
    options: the keys of its param groups in PyTorch 2.13 besides :data:`TORCH_COMMON_OPTIONS`
      (a group with another key is refused: a newer PyTorch's option may change the update).
    signature: the keys that tell its param groups apart from other classes' in a state dict.
    step: PyTorch keeps a per-parameter ``step`` (updates done) beside the fields, the twin's
      count; without one, a parameter whose fields exist has taken its first step (count 1).
    optional: state field -> the group option under which PyTorch keeps it (SGD's
      ``momentum_buffer`` under ``momentum``): with the option 0 or False it keeps none.
    fixed: options the class sets in every group it steps or loads, whatever the file says
      (AdamW's ``decoupled_weight_decay=True``); a state dict whose groups say otherwise is
      refused as this class's.
    older: options that a PyTorch older than 2.13 saved no key for, with the behaviour it had.
    numbers: the options PyTorch computes its step's scalars from in the option's own dtype
      where the option is a tensor (a pair's items too: ``betas``), not in float64 as from a
      Python number: the bridges refuse a tensor there, with the code that makes it a float.
    capturable: what ``capturable=True`` changes in the class's arithmetic, where no twin
      follows it (its scalars as float32 tensors...): the bridges refuse such a group, naming
      this, with the code that turns the option off; "": carried (Adam's) or no such option.
    refuse: ``refuse(kind, g, group, advice)`` raises for a group of options no twin
      reproduces exactly that the declarations above do not say, naming ``torch.optim.<kind>``,
      ``param_groups[g][key]`` and what to do; ``advice(key)`` is the bridge's advice for
      making an option a Python float (from the optimizer or the state dict); None: nothing
      beyond the bridges' own checks.
    ignores: ``ignores(options) -> options``: the twin's hyperparameters where PyTorch ignores
      one (plain SGD's ``dampening``); identity by default.
    examples: name -> the constructor's options (``lr`` included) of a configuration the
      interop tests carry both ways (every option the twin reads, alone and combined).
  """

  options: frozenset[str]
  signature: frozenset[str]
  step: bool = True
  optional: Mapping[str, str] = field(default_factory=dict)
  fixed: Mapping[str, Any] = field(default_factory=dict)
  older: Mapping[str, Any] = field(default_factory=dict)
  numbers: frozenset[str] = frozenset()
  capturable: str = ""
  refuse: Callable[[str, int, Mapping[str, Any], Callable[[str], str]], None] | None = None
  ignores: Callable[[dict[str, Any]], dict[str, Any]] | None = None
  examples: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
  #: The keys of :data:`TORCH_COMMON_OPTIONS` the class's param groups do not have
  #: (``torch.optim.Muon``: no ``maximize``, ``foreach`` nor ``differentiable``).
  lacks: frozenset[str] = frozenset()

  def keys(self) -> frozenset[str]:
    """Every key a param group of the class has in PyTorch 2.13."""
    return (TORCH_COMMON_OPTIONS - self.lacks) | self.options


@dataclass(frozen=True)
class Binding:
  """A rule's counterpart in another runtime or framework.

  Attributes:
    kind: ``"onnx"`` (an operator of an ONNX domain), ``"torch"`` (a ``torch.optim``
      optimizer), ``"keras"`` (a ``keras.optimizers`` optimizer), ``"optax"`` (the nearest
      Optax transform, named ``"optax.<name>"``, which need not be the same rule:
      docs/from_optax.md says how they differ; the benchmarks time the rule against it).
    name: the operator's ``op_type`` or the optimizer's class name.
    domain: the ONNX domain (``kind == "onnx"``).
    names: the counterpart's name of each hyperparameter that it spells otherwise.
    torch: for ``kind == "torch"``, what the PyTorch bridges read of the class.
  """

  kind: str
  name: str
  domain: str = ""
  names: Mapping[str, str] = field(default_factory=dict)
  torch: TorchOptimizer | None = None


class Edge(NamedTuple):
  """A case of the conformance grid that one rule adds: a hyperparameter at an edge of its range.

  ``changes`` are the case's fields that differ from the grid's default case (``T``, ``R``,
  ``state``, ``hyper``: the hyperparameters that differ from :attr:`Conformance.hyper`;
  ``x_scale``: the parameters' magnitude, 1 in the default case; below the step's, ``X + U``
  keeps the update's last bits).
  """

  name: str
  changes: Mapping[str, Any]


@dataclass(frozen=True)
class TestConfig:
  """The hyperparameters the tests run a rule with: every term of the formula matters.

  Attributes:
    hyper: the hyperparameters (non-zero coefficients, decays away from 0 and 1, an epsilon
      comparable to the root).
    learning_rate: the learning rate.
    sweep: a second hyperparameter the tests sweep besides the learning rate ("" for none).
  """

  hyper: Mapping[str, Any]
  learning_rate: float = 0.05
  sweep: str = ""


def _no_gain(h: Mapping[str, Any], R: float, T0: int, steps: int) -> float:
  return 0.0


def _no_first_moment(h: Mapping[str, Any]) -> float:
  return 0.0


def _two_roundings(h: Mapping[str, Any]) -> int:
  return 2


@dataclass(frozen=True)
class Trajectory:
  """The tests' tolerance model of a run of many updates against the float64 expectation.

  Written from the rule's formula (its terms in ``onnx_optax._feedback``), never from its code;
  ``tests/rule_configs.trajectory_tolerances`` compounds it over a run.

  Attributes:
    gain: ``gain(hyper, R, T0, steps)``: an error ``e`` in ``X`` moves the next update by at
      most ``gain * e`` (the coefficients that read ``X``; 0 for a rule that does not).
    first_moment: ``first_moment(hyper)``: the decay of a ``(1 - decay)``-weighted first
      moment (0: none), whose roundings are relative to ``G`` while its update is ``(1 -
      decay) G`` until the moment fills.
    x_roundings: ``x_roundings(hyper)``: roundings relative to ``X`` per update, the
      expectation's included (4 for a decoupled decay, which subtracts twice).
  """

  gain: Callable[[Mapping[str, Any], float, int, int], float] = _no_gain
  first_moment: Callable[[Mapping[str, Any]], float] = _no_first_moment
  x_roundings: Callable[[Mapping[str, Any]], int] = _two_roundings


@dataclass(frozen=True)
class Conformance:
  """How the conformance suite and the tests check a rule.

  Attributes:
    hyper: the conformance grid's hyperparameters (every term non-zero).
    tests: the tests' configuration.
    edges: the cases this rule adds to the grid.
    dtypes: the parameter dtypes the grid runs it in.
    why_not: dtype -> why the grid leaves it out of :attr:`dtypes`, which the report prints.
    more_tests: configurations the tests run besides :attr:`tests`, by the suffix of their
      name (``{"nesterov": ...}`` is ``pytorch_sgd_nesterov``).
    tiny_gradient: the hyperparameters the grid's tiny-gradient cases change besides epsilon:
      a coefficient whose term (``coefficient * X``) would dwarf a gradient of epsilon's size,
      set to 0 there.
    outputs: the names of the rule's outputs in its spec, ``X``'s first, then one per
      :attr:`Rule.fields` entry, which the conformance report names an element by; empty:
      ``X_new``, then each field's ``spec`` followed by ``_new``.
    trajectory: the tests' tolerance model of a run (:class:`Trajectory`).
    shapes: the leaves' shapes of the grid's cases that do not name theirs (every case but
      ``pytree``, ``scalar`` and ``odd``): a rule whose state depends on the rank
      (:attr:`Field.exists`) runs them on a vector and a matrix.
    huge: dtype -> the magnitude of the grid's huge gradients where the rule's arithmetic holds a
      higher power of the gradient than its square (Adafactor's ``row_var @ col_var``, of order
      ``G ** 4``: PyTorch overflows beyond it as the twin does), or computes in a narrower dtype
      than the parameters' (Muon's float32 and bfloat16 iteration beside float64 parameters);
      unlisted dtypes: the grid's own.
  """

  hyper: Mapping[str, Any]
  tests: TestConfig
  edges: tuple[Edge, ...] = ()
  dtypes: tuple[str, ...] = ("float32", "float64", "float16", "bfloat16")
  why_not: Mapping[str, str] = field(default_factory=dict)
  more_tests: Mapping[str, TestConfig] = field(default_factory=dict)
  tiny_gradient: Mapping[str, Any] = field(default_factory=dict)
  outputs: tuple[str, ...] = ()
  trajectory: Trajectory = field(default_factory=Trajectory)
  shapes: tuple[tuple[int, ...], ...] = ((13,),)
  huge: Mapping[str, float] = field(default_factory=dict)


class Variant(NamedTuple):
  """A configuration of a rule that the conformance suite and the tests check as a rule of its own.

  The suite names it ``f"{rule}_{suffix}"`` (the two Momentum modes, ONNX Runtime AdamW's two
  ``adam_mode``). ``hyper`` overrides the rule's conformance hyperparameters, ``tests`` its
  test configuration (None: the rule's, with ``hyper`` applied).
  """

  suffix: str
  hyper: Mapping[str, Any]
  tests: TestConfig | None = None


@dataclass(eq=False)
class Rule:
  """Everything about one update rule that a layer other than its own module needs.

  A rule is computed in two parts (:mod:`onnx_optax.rules`): ``scalars(R, T, **...)`` once
  per update, ``elementwise(s, X, G, *state, **...)`` once per leaf. :attr:`bind` gives both
  with the hyperparameters bound. The engine and the ONNX interface look both parts up on
  this object when they run, so that a test can plant a wrong part
  (``monkeypatch.setattr(rule, "elementwise", wrong)``) and see a check fail.

  Attributes:
    name: the rule's name: its transform's (``onnx_optax.<name>``) and its suite name.
    transform: the public factory, ``transform(learning_rate, *, **hyperparameters,
      initial_count, state_dtype)``; its signature gives the hyperparameters' defaults.
    state: the state ``NamedTuple``: ``count``, then one field per :attr:`fields` entry.
    fields: the state tensors.
    hyperparameters: name -> :class:`Hyperparameter`, in the transform's order.
    scalars, elementwise: the rule's two parts.
    bind: ``bind(rule, hyper) -> (scalars(R, T), elementwise(s, X, G, *state))`` with the
      checked hyperparameters bound.
    minimum_count: the least ``initial_count`` (1 where ``T = 0`` divides by zero); a callable
      of the checked hyperparameters where it depends on them. The count at the first update
      by default is the transform's ``initial_count`` default (:meth:`first_count`).
    policy: how the engine maps the rule over a pytree (:data:`onnx_optax._engine.SPEC` for the
      spec rules, :data:`onnx_optax._engine.FRAMEWORK` for the framework twins).
    params_for: the hyperparameters that multiply ``X``: unless each is the Python number 0,
      ``update`` needs the parameters.
    always_reads_params: why ``update`` needs the parameters whatever the hyperparameters
      ("": it does not).
    validate: ``validate(hyper, name)``: the checks that involve several hyperparameters
      (``name`` maps a hyperparameter to the argument as the user wrote it).
    bindings: the rule's counterparts (:class:`Binding`).
    twin_of: for a framework twin, the spec rule it equals in exact arithmetic (None: a spec
      rule); a state of either can be loaded where the framework's optimizer is.
    variants: the configurations the conformance suite checks as rules of their own.
    conformance: how the conformance suite and the tests check the rule
      (:class:`Conformance`).
    flagged: a static flag hyperparameter -> the rule that runs when it is on: the same rule
      with more state fields, in a state class of its own, so that a state without the flag
      keeps its structure and no memory for them (PyTorch Adam's ``amsgrad`` and its
      ``max_exp_avg_sq``). Not registered itself (same name, transform and hyperparameters):
      the engine (:meth:`running`), the bridges and the conformance suite take it from here.
  """

  name: str
  transform: Callable[..., Any]
  state: type
  fields: tuple[Field, ...]
  hyperparameters: Mapping[str, Hyperparameter]
  scalars: Callable[..., Any]
  elementwise: Callable[..., Any]
  bind: Callable[[Rule, dict[str, Any]], tuple[Callable[..., Any], Callable[..., Any]]]
  minimum_count: int | Callable[[dict[str, Any]], int]
  policy: Policy
  params_for: tuple[str, ...] = ()
  always_reads_params: str = ""
  validate: Callable[[dict[str, Any], Callable[[str], str]], None] | None = None
  bindings: tuple[Binding, ...] = ()
  twin_of: Rule | None = None
  variants: tuple[Variant, ...] = ()
  conformance: Conformance | None = None
  flagged: Mapping[str, Rule] = field(default_factory=dict)
  #: The numbers of dimensions of the parameters the rule takes (``torch.optim.Muon``'s
  #: ``(2,)``): ``init`` refuses a leaf of another, naming its pytree path, and the
  #: conformance grid and the interop tests give it only such leaves. Empty: any.
  ranks: tuple[int, ...] = ()
  #: Whether an update reads the learning rate. Where not, it only starts a state field
  #: (``Field.initial`` :data:`LEARNING_RATE`, ``torch.optim.Rprop``'s step sizes) at ``init``,
  #: and no update reads it: the engine refuses a
  #: schedule (it would change nothing after the first update, as a PyTorch scheduler changes
  #: nothing of Rprop's step sizes), and an injected rate changed later changes nothing.
  reads_learning_rate: bool = True
  #: Whether the per-leaf part reduces over its tensor (a norm, a row's or a column's mean:
  #: ``torch.optim.Adafactor``), so that an element's new value depends on other elements':
  #: the conformance check evaluates the bound model one leaf at a time in its own shape (its
  #: state fields in theirs), never on the leaves' elements concatenated. False: element-wise.
  reduces: bool = False
  #: The layout operations (:data:`LAYOUT_OPERATIONS`) that the step of a rule whose state or step
  #: is not element-wise (it declares :attr:`ranks` or :attr:`reduces`) commutes with, and how its
  #: state follows each: ``{operation: {field: the field whose numbers it holds after it}}``, every
  #: field taken through the parameter's axis permutation (a field not named keeps its own numbers;
  #: one the parameter does not have, of :data:`ABSENT` shape, stays as it is). A field of a shape
  #: of its own follows axis permutations only. ``torch.optim.Adafactor``'s ``{"transpose_last_two":
  #: {"row_var": "col_var", "col_var": "row_var"}}``: a matrix transposed, its row means are the
  #: column means, transposed. The bridges' ``layout=`` refuses any other operation on such a
  #: rule's parameter, naming the rule and the operation. An element-wise rule (neither ``ranks``
  #: nor ``reduces``: each element of the new state and update depends on the same element of the
  #: old ones alone) commutes with every operation, its fields following the parameter's, and
  #: declares nothing.
  commutes_with: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
  #: Whether the update rounds to a lower precision inside (``torch.optim.Muon``'s Newton–Schulz
  #: iteration in bfloat16, whatever the parameters' dtype), every such rounding through
  #: :func:`onnx_optax._numerics.round_inside`. Its derivatives are those of the same rule with
  #: each inner rounding taken as the identity: the straight-through derivative JAX gives
  #: ``convert_element_type`` (computed at the rounded values, its cotangents rounded as the
  #: values are). A central difference of the rule itself sees the roundings' flat steps
  #: instead (0 where a step of ``h`` stays on one), so the meta-gradient test differences the
  #: rule with the roundings taken as the identity (docs/optax.md, "Meta-gradients"). False: an
  #: update computed in the parameters' dtype or wider, differentiable as it is computed.
  rounds_inside: bool = False

  def defaults(self) -> dict[str, Any]:
    """The hyperparameters' defaults, read from :attr:`transform`'s signature (required ones left out)."""
    parameters = inspect.signature(self.transform).parameters
    return {
      name: parameters[name].default
      for name in self.hyperparameters
      if parameters[name].default is not inspect.Parameter.empty
    }

  def checked(self, hyper: Mapping[str, Any], name: Callable[[str], str] = str) -> dict[str, Any]:
    """Every hyperparameter checked with its kind's check, then the rule's joint checks.

    ``name(h)`` is the argument as the caller's user wrote it (default: ``h``), so that a
    refusal names what the user passed. Raises before anything is computed.
    """
    unknown = sorted(set(hyper) - set(self.hyperparameters))
    if unknown:
      raise TypeError(f"{self.name} has no hyperparameter {', '.join(map(repr, unknown))}")
    checked = {h: self.hyperparameters[h].check(name(h), value) for h, value in hyper.items()}
    if self.validate is not None:
      self.validate(checked, name)
    return checked

  def minimum(self, hyper: Mapping[str, Any]) -> int:
    """The least ``initial_count``, for checked ``hyper``."""
    return self.minimum_count(dict(hyper)) if callable(self.minimum_count) else self.minimum_count

  def first_count(self) -> int:
    """The count at the first update by default: the transform's ``initial_count`` default."""
    return int(inspect.signature(self.transform).parameters["initial_count"].default)

  def decays(self, hyper: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The decay rates among ``hyper`` and those whose range includes 1."""
    decays = {h: v for h, v in hyper.items() if self.hyperparameters[h].decay}
    one = [h for h in decays if _holds(self.hyperparameters[h].may_be_one, hyper)]
    return decays, tuple(one)

  def running(self, hyper: Mapping[str, Any]) -> Rule:
    """The rule that runs with these hyperparameters: :attr:`flagged`'s for a flag that is on."""
    return next((rule for flag, rule in self.flagged.items() if hyper.get(flag)), self)

  def family(self) -> tuple[Rule, ...]:
    """This rule, then its :attr:`flagged` rules (every state class its transform returns)."""
    return (self, *self.flagged.values())

  def binding(self, kind: str) -> Binding | None:
    """The rule's counterpart of a ``kind`` (``"onnx"``, ``"torch"``, ``"keras"``), if any."""
    return next((b for b in self.bindings if b.kind == kind), None)


def bind_to_scalars(rule: Rule, hyper: dict[str, Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
  """The :attr:`Rule.bind` of a rule whose hyperparameters all reach its scalars: ``scalars(R, T,
  **hyper)`` once per update, and the element-wise part as it is."""
  return (lambda R, T: rule.scalars(R, T, **hyper), rule.elementwise)


def _holds(flag: bool | Callable[[Mapping[str, Any]], bool], hyper: Mapping[str, Any]) -> bool:
  return flag(hyper) if callable(flag) else flag


_RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
  """Adds ``rule`` to the registry and returns it; its name must be new.

  Raises:
    ValueError: a rule of that name is registered, or its declaration is inconsistent (a
      state whose fields are not ``count`` then :attr:`Rule.fields`, a hyperparameter the
      transform does not take).
  """
  if rule.name in _RULES:
    raise ValueError(f"a rule named {rule.name!r} is registered already")
  expected = ("count", *(f.name for f in rule.fields))
  if tuple(getattr(rule.state, "_fields", ())) != expected:
    raise ValueError(
      f"{rule.name}: the state's fields are {getattr(rule.state, '_fields', None)}, expected {expected}"
    )
  parameters = inspect.signature(rule.transform).parameters
  missing = [h for h in (*rule.hyperparameters, "initial_count", "state_dtype") if h not in parameters]
  if missing:
    raise ValueError(f"{rule.name}: the transform takes no {', '.join(missing)}")
  for binding in rule.bindings:
    if binding.kind == "torch" and binding.torch is None:
      raise ValueError(f"{rule.name}: Binding('torch', {binding.name!r}) has no torch=TorchOptimizer(...)")
    names = {f.name for r in rule.family() for f in r.fields}
    stray = sorted(set(binding.torch.optional) - names) if binding.torch else []
    if stray:
      raise ValueError(f"{rule.name}: torch.optional names {stray}, which are not fields of the rule")
  for i, f in enumerate(rule.fields):
    before = {g.name for g in rule.fields[:i] if g.second_moment}
    if f.root_of and f.root_of not in before:
      raise ValueError(f"{rule.name}: {f.name!r} has root_of={f.root_of!r}, not a second moment before it")
  for flag, flagged in rule.flagged.items():
    declared = rule.hyperparameters.get(flag)
    laid_out = ("count", *(f.name for f in flagged.fields)) == tuple(getattr(flagged.state, "_fields", ()))
    same = flagged.hyperparameters.keys() == rule.hyperparameters.keys()
    if declared is None or not declared.static or not same:
      raise ValueError(f"{rule.name}: flagged[{flag!r}] is not a static hyperparameter both rules take")
    if flagged.fields[: len(rule.fields)] != rule.fields or not laid_out:
      raise ValueError(f"{rule.name}: flagged[{flag!r}]'s state is not the rule's fields, then its own")
  names = {f.name for f in rule.fields}
  for operation, follows in rule.commutes_with.items():
    if operation not in LAYOUT_OPERATIONS:
      raise ValueError(
        f"{rule.name}: commutes_with names {operation!r}, not one of the layout operations "
        f"{LAYOUT_OPERATIONS}"
      )
    stray = sorted({*follows, *follows.values()} - names)
    if stray:
      raise ValueError(
        f"{rule.name}: commutes_with[{operation!r}] names {stray}, which are not fields of the rule"
      )
  for r in rule.family():
    for i, f in enumerate(r.fields):
      if f.at_least and f.at_least not in {g.name for g in r.fields[:i]}:
        raise ValueError(f"{rule.name}: {f.name!r} has at_least={f.at_least!r}, not a field before it")
  _RULES[rule.name] = rule
  return rule


def unregister(name: str) -> None:
  """Removes a rule registered from outside the package (for tests)."""
  del _RULES[name]


def get(name: str) -> Rule:
  """The registered rule of that name.

  Raises:
    KeyError: no such rule; the message lists the registered ones.
  """
  try:
    return _RULES[name]
  except KeyError:
    raise KeyError(f"no rule named {name!r}; registered: {', '.join(r.name for r in rules())}") from None


def rules() -> Iterator[Rule]:
  """Every registered rule: the spec rules, then the framework twins, each in registration order
  (the package's own first, in the order of their modules' names)."""
  return iter(sorted(_RULES.values(), key=lambda rule: rule.policy.name != "spec"))


def replace_torch(declared: TorchOptimizer, **changes: Any) -> TorchOptimizer:
  """A copy of a class's declaration with some attributes changed (a class that differs in a few)."""
  return dataclasses.replace(declared, **changes)


def replace(rule: Rule, **changes: Any) -> Rule:
  """A copy of ``rule`` with some attributes changed (not registered)."""
  return dataclasses.replace(rule, **changes)
