"""The configurations the tests run each rule with, derived from the registry.

One configuration per registered rule, or per variant where a rule has some
(Momentum's two modes, ONNX Runtime AdamW's two ``adam_mode``) and one more per
entry of its ``more_tests`` (PyTorch SGD's Nesterov): the transform, its state
class, the hyperparameters and learning rate of the rule's
:class:`~onnx_optax.registry.TestConfig` (every term of the formula matters), the
``static_args`` that ``optax.inject_hyperparams`` needs, the count at the first
update and the NumPy expectation the tests compare with. A rule registered from
outside the package (``tests/test_registry_outside.py``) is among them when it is
registered before this module is imported.

The expectations are written independently of the JAX code: the spec rules'
are :data:`onnx_optax.reference.RULES` (or whatever a rule registered there
under its name), the twins' those of their frameworks, ``reference.pytorch_*``
and, for Keras's Adam, DirectML Adam at ``T = count + 1`` (the same rule in exact
arithmetic). The trajectory tolerance below is the tests' own model, written
from the formulas, never from the implementation. (test_numerics uses
realistic defaults instead of these configurations.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

import onnx_optax  # noqa: F401  # registers the package's rules
from onnx_optax import reference, registry


class RuleConfig(NamedTuple):
  """One configuration of a registered rule, as the tests run it."""

  name: str  #: the configuration: the rule's name, or ``f"{rule}_{suffix}"`` for a variant
  rule: str  #: the registered rule's name (its expectation, bound model and tolerance model)
  make: Callable[..., Any]  #: the transform, ``make(learning_rate, **hyper)``
  state_cls: type
  #: every hyperparameter the transform takes: its defaults, the TestConfig's values over them
  hyper: dict[str, Any]
  learning_rate: float
  sweep: str  #: a second hyperparameter to sweep, besides the learning rate ("": none)
  #: the hyperparameters declared static: ``optax.inject_hyperparams``' ``static_args``
  static_args: tuple[str, ...]
  first_count: int  #: ``state.count`` at the first update by default
  fields: tuple[registry.Field, ...]
  framework: bool  #: a framework twin (its hyperparameters are Python numbers, as its framework's)

  def seen(self, hyper: dict[str, Any] | None = None) -> dict[str, Any]:
    """``hyper`` (default: the configuration's) as a float32 run of the transform receives them.

    A spec rule gets each float rounded to float32 (a Python float is a weakly typed
    float32). A twin computes its scalars from the Python numbers as its framework does
    (``1 - beta2`` in float64, rounded once), so its expectation gets them unrounded: the
    float32 roundings where they meet a tensor are the arithmetic the tolerance charges.
    """
    hyper = self.hyper if hyper is None else hyper
    return dict(hyper) if self.framework else {k: as_float32_sees(v) for k, v in hyper.items()}

  def injected(self, hyper: dict[str, Any] | None = None) -> dict[str, Any]:
    """``hyper`` as ``optax.inject_hyperparams`` hands them to a float32 run: each float a
    float32 array, the rule computing from that number (a twin's ``1 - beta`` included)."""
    hyper = self.hyper if hyper is None else hyper
    return {k: as_float32_sees(v) for k, v in hyper.items()}

  def initial_state(
    self, leaves: Sequence[Any], hyper: dict[str, Any] | None = None, learning_rate: float | None = None
  ) -> list[list[Any]]:
    """The state ``init`` starts from, one list of float64 leaves per field (the registry's values;
    a field declared to start at the learning rate, ``learning_rate``, default the configuration's)."""
    hyper = self.hyper if hyper is None else hyper
    state = []
    for f in self.fields:
      if f.initial == registry.LEARNING_RATE:
        value = float(self.learning_rate if learning_rate is None else learning_rate)
      else:
        value = float(hyper[f.initial]) if isinstance(f.initial, str) else float(f.initial)
      state.append([np.full(f.shape_for(np.shape(x)), value) for x in leaves])
    return state


def field_leaf(f: registry.Field, drawn: Any, dtype: Any) -> np.ndarray:
  """A state leaf of field ``f`` from values drawn in its parameter's shape, as the rule keeps it:
  in the field's shape (``Field.shape``: one scalar per parameter takes the first value), within
  its declared reach (``Field.reach``: ``|tanh|`` of the values mapped into it) and in the dtype
  ``init`` gives it beside a parameter of ``dtype`` (``Field.dtypes``, else ``dtype``).

  Example:
    >>> from onnx_optax import registry
    >>> eta = registry.Field("eta", "eta", shape=registry.PER_TENSOR, dtypes=("float32",), reach=(0.1, 0.2))
    >>> leaf = field_leaf(eta, np.array([[-3.0, 1.0]]), np.float64)
    >>> leaf.shape, leaf.dtype, bool(0.1 <= leaf <= 0.2)
    ((), dtype('float32'), True)
  """
  v = np.asarray(drawn, np.float64)
  shape = f.shape_for(v.shape)
  if shape != v.shape:
    v = np.broadcast_to(v.ravel()[: int(np.prod(shape))].reshape(shape) if v.size else 0.0, shape)
  if f.reach is not None:
    low, high = f.reach
    v = low + (high - low) * np.abs(np.tanh(v))
  return np.asarray(v).astype(f.dtype_for(np.dtype(dtype).name))


def _configuration(rule: registry.Rule, name: str, test: registry.TestConfig) -> RuleConfig:
  return RuleConfig(
    name,
    rule.name,
    rule.transform,
    rule.state,
    {**rule.defaults(), **test.hyper},
    test.learning_rate,
    test.sweep,
    tuple(h for h, declared in rule.hyperparameters.items() if declared.static),
    rule.first_count(),
    rule.fields,
    rule.policy.name == "framework",
  )


def configurations() -> dict[str, RuleConfig]:
  """Every configuration of every registered rule, now (a rule registered later is included)."""
  out = {}
  for rule in registry.rules():
    assert rule.conformance is not None, f"{rule.name} declares no test configuration"
    tests = rule.conformance.tests
    if not rule.variants:
      out[rule.name] = _configuration(rule, rule.name, tests)
    for variant in rule.variants:
      test = variant.tests or registry.TestConfig(
        {**tests.hyper, **variant.hyper}, tests.learning_rate, tests.sweep
      )
      out[f"{rule.name}_{variant.suffix}"] = _configuration(rule, f"{rule.name}_{variant.suffix}", test)
    for suffix, more in rule.conformance.more_tests.items():
      out[f"{rule.name}_{suffix}"] = _configuration(rule, f"{rule.name}_{suffix}", more)
  return out


#: The configurations of the rules registered when this module was first imported (the tests'
#: collection; tests/test_registry_outside.py registers its rule before that, as a plugin).
RULE_CONFIGS = configurations()


def shaped(name: str, shape: int | tuple[int, ...]) -> tuple[int, ...]:
  """``shape`` as a leaf that the configuration or rule ``name`` takes: unchanged, unless the rule
  declares :attr:`~onnx_optax.registry.Rule.ranks` without its number of dimensions; then with
  the first of them, its leading dimensions merged or ones appended, as the conformance grid
  takes its shapes (``torch.optim.Muon``'s ``(2,)``: ``3`` is ``(3, 1)``, ``()`` is ``(1, 1)``).

  Example:
    >>> shaped("pytorch_sgd", 3), shaped("pytorch_sgd", (4, 3))
    ((3,), (4, 3))
  """
  shape = (shape,) if isinstance(shape, int) else tuple(shape)
  ranks = registry.get(RULE_CONFIGS[name].rule if name in RULE_CONFIGS else name).ranks
  if not ranks or len(shape) in ranks:
    return shape
  r = ranks[0]
  if len(shape) < r:
    return (*shape, *(1,) * (r - len(shape)))
  return (int(np.prod(shape[: len(shape) - r + 1])), *shape[len(shape) - r + 1 :])


def elementwise(name: str) -> bool:
  """Whether the configuration or rule ``name`` updates each element from that element alone (no
  :attr:`~onnx_optax.registry.Rule.ranks`: Muon's update of a matrix reads the whole matrix)."""
  return not registry.get(RULE_CONFIGS[name].rule if name in RULE_CONFIGS else name).ranks


def first_count(rule: str) -> int:
  """``state.count`` at a rule's first update by default (DirectML's and ONNX Runtime AdamW's: 1)."""
  return registry.get(rule).first_count()


def as_float32_sees(value: Any) -> Any:
  """A hyperparameter as a float32 transform sees it (Python floats are weak float32)."""
  if value is None or isinstance(value, (str, bool, tuple)) or isinstance(value, int):
    return value  # a mode, a flag, ONNX Runtime's adam_mode, PyTorch's betas, Muon's None: not a float
  return float(np.float32(value))


# ----------------------------------------------------------------------------
# The NumPy expectations


def expectation(rule: str) -> tuple[Callable[..., tuple[np.ndarray, ...]], int]:
  """A rule's NumPy expectation ``step(R, T, X, G, *state, dtype, **hyper) -> (X_new, *state_new)``
  (``T`` the state's count) and its number of state tensors, as :data:`onnx_optax.reference.RULES`
  registers it (a rule registered from outside registers its own), called with the transform's
  hyperparameters: those that only give a state field's starting value (PyTorch Adagrad's
  ``initial_accumulator_value``) are not terms of the step and are left out."""
  step, n_state = reference.RULES[rule]
  fields = registry.get(rule).fields if rule in {r.name for r in registry.rules()} else ()
  initials = {f.initial for f in fields if isinstance(f.initial, str)}
  if not initials:
    return step, n_state

  def stepped(*args: Any, **hyper: Any) -> tuple[np.ndarray, ...]:
    return step(*args, **{h: v for h, v in hyper.items() if h not in initials})

  return stepped, n_state


def trajectory(
  rule: str,
  X: Sequence[np.ndarray],
  grads: Sequence[Sequence[np.ndarray]],
  state: Sequence[Sequence[np.ndarray]],
  T: int,
  learning_rates: Sequence[float],
  dtype: Any = np.float64,
  **hyperparameters: Any,
) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]], int]:
  """:func:`onnx_optax.reference.trajectory` with :func:`expectation`, for every registered rule.

  Returns ``(xs, state, T)``: ``xs[k]`` the tensors after step ``k``, the final state, the
  ``T`` of the next step.
  """
  step, n_state = expectation(rule)
  if len(state) != n_state:
    raise ValueError(f"{rule} has {n_state} state tensors per parameter, got {len(state)}")
  X = [np.asarray(x) for x in X]
  S = [list(s) for s in state]
  xs = []
  for k, R in enumerate(learning_rates):
    outputs = [
      step(R, T, x, g, *(s[i] for s in S), dtype=dtype, **hyperparameters)
      for i, (x, g) in enumerate(zip(X, grads[k]))
    ]
    X = [out[0] for out in outputs]
    S = [[out[1 + j] for out in outputs] for j in range(n_state)]
    xs.append(X)
    T += 1
  return xs, S, T


# ----------------------------------------------------------------------------
# The tolerance of a trajectory against the float64 expectation

#: Roundings of one update, each relative to an operand no larger than the
#: update's magnitude (the longest rule, ONNX Adam, has 11 element-wise
#: operations and 5 scalar ones; PyTorch's Adam 12 and 6).
ROUNDINGS = 16


def model(rule: str) -> registry.Trajectory:
  """The tests' tolerance model of a rule's run: its declaration's (``Conformance.trajectory``)."""
  conformance = registry.get(rule).conformance
  assert conformance is not None, f"{rule} declares no conformance"
  return conformance.trajectory


def feedback_gain(rule: str, hyper: dict[str, Any], learning_rate: float, T0: int, steps: int) -> float:
  """``L``: how much an error ``e`` in ``X`` can move the next update, at most ``L * e``.

  Only the coefficients that read ``X`` feed an error back (``norm_coefficient``, ``c``,
  through ``G_regularized = c X + G``; PyTorch's ``weight_decay``; a decoupled decay's
  ``lr * weight_decay * X``). An error that stays in ``X`` enters every later step; each
  rule's bound is its :class:`~onnx_optax.registry.Trajectory`'s: Momentum ``R c (1 + alpha) / (1 - alpha)``,
  Adagrad ``2 R c / epsilon``, the Adams ``2 max(R_adjusted) c / epsilon``, a decoupled
  decay ``R * weight_decay``, 0 for the rules that do not read ``X``.

  The worst case: ``H = 0`` in the denominators. ``steps`` and ``T0`` give the
  largest bias correction ``R_adjusted / R`` of the run.
  """
  hypers = hyper if isinstance(hyper, (list, tuple)) else [hyper]
  return max(model(rule).gain(h, float(learning_rate), T0, steps) for h in hypers)


def trajectory_tolerances(
  rule: str, hypers: Any, learning_rate: float, X0: Any, xs: Any, u: float, T0: int | None = None
) -> list[float]:
  """``tol[k]``: a bound on ``max |x_k - x_ref_k|`` after update ``k`` of a run.

  Args:
    rule: a registered rule (its :class:`~onnx_optax.registry.Trajectory` is the model).
    hypers: the rule's hyperparameters, or a list of the sets a run uses
      (the bound takes the worst).
    learning_rate: the largest learning rate of the run.
    X0: the starting parameters (a list of leaves).
    xs: the float64 reference trajectory, ``xs[k]`` the leaves after update ``k``.
    u: the unit roundoff of the run's dtype.
    T0: the ``state.count`` of the first update (default: the rule's first).

  The error is charged to what the roundings are relative to, not to the
  state (``H`` of Adagrad grows to hundreds, ``X`` stays near 1; charging
  ``H`` allowed updates 5% too large):

  * ``X + U`` rounds once relative to ``X_k``; the reference's own
    ``X - step`` once more, hence ``2 u |X_k|`` (``4 u |X_k|`` for a
    decoupled weight decay, which subtracts twice);
  * the update ``U_t = x_ref_t - x_ref_{t-1}`` is computed with at most
    ROUNDINGS roundings relative to the largest update so far, ``M_t`` (an
    operand cancelled in ``U_t`` was an update-sized quantity before);
  * the state carries the relative error of every earlier update with a gain
    of at most 1 (every decay rate is in [0, 1]; an error ``d`` in Adagrad's
    ``H`` or Adam's ``H`` is ``d / 2`` in ``U``): ``t * ROUNDINGS * u * M_t``
    at update ``t``;
  * the Adam rules' first moment is a ``(1 - alpha)``-weighted average whose
    roundings are relative to ``G``, while the update it makes is relative to
    ``(1 - alpha) G`` until the moment fills: one factor ``1 / (1 - alpha)``;
  * an error in ``X`` feeds back through ``norm_coefficient`` (see
    :func:`feedback_gain`): a factor ``(1 + L)`` per update.

  So ``tol[k] = (1 + L)^(k+1) A sum_{t<=k} (2 u max|X_t| + (t + 1) ROUNDINGS u M_t)``
  with ``A = 1 / (1 - alpha)`` for the Adam rules, 1 otherwise. A relative
  error ``delta`` in every update moves ``x_0`` by ``delta |U_0|``, and
  ``tol[0] ~ 16 A u M_0``: ``delta = 0.001`` fails at the first update
  wherever ``|U_0|`` is within a factor 60 / A of the largest update.
  """
  hypers = [hypers] if isinstance(hypers, dict) else list(hypers)
  T0 = first_count(rule) if T0 is None else T0
  traj = model(rule)
  steps = len(xs)
  L = feedback_gain(rule, hypers, learning_rate, T0, steps)
  A = 1 / (1 - max(traj.first_moment(h) for h in hypers))
  x_roundings = max(traj.x_roundings(h) for h in hypers)
  previous = [np.asarray(x, np.float64) for x in X0]
  total, M, out = 0.0, 0.0, []
  for k, X in enumerate(xs):
    X = [np.asarray(x, np.float64) for x in X]
    M = max([M] + [float(np.max(np.abs(a - b), initial=0)) for a, b in zip(X, previous)])
    size = max(float(np.max(np.abs(a), initial=0)) for a in X)
    total += x_roundings * u * size + (k + 1) * ROUNDINGS * u * M
    out.append((1 + L) ** (k + 1) * A * total)
    previous = X
  return out
