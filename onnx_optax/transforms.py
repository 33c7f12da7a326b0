"""The rules as Optax ``GradientTransformation``\\ s over pytrees.

Each public function closes over its hyperparameters and returns an
``optax.GradientTransformationExtraArgs``. The arithmetic lives in
:mod:`onnx_optax.rules`; this module only maps a rule over the leaves of a
pytree, keeps the update count, and settles dtypes.

Common semantics
----------------

``count`` (the state's first field) is the spec's ``T``: the value the *next*
update runs with. It starts at ``initial_count`` (0 for the ONNX rules, whose
``T`` counts the updates already conducted; 1 for DirectML Adam and ONNX
Runtime's AdamW, whose first update must run with ``T = 1``) and grows by one per update, saturating at the
int32 maximum (``optax.safe_increment``) instead of wrapping.

``learning_rate`` is a float or an Optax schedule. A schedule is evaluated at
the number of updates this transform has applied, ``count - initial_count``
(0 at the first update, as for every Optax optimizer), whatever ``T`` the rule
itself uses. That number is an int32 array, int64 under ``jax_enable_x64``:
there ``n / k`` is float64, as a Python float is (an int32 count would make
``optax.linear_schedule``'s rate float32, rounded to 1e-8 relative).

Dtypes: the state is stored in ``state_dtype`` (default: each parameter's
dtype). Each leaf is computed in the wider of its parameter's dtype and its
state's dtype, the new state is rounded to ``state_dtype`` and the update to
the parameter's dtype. ``state_dtype=jnp.float32`` with float16 or bfloat16
parameters is the documented way to keep accumulators (Adagrad's ``H`` grows
without bound) in range and precise. The count is an int32 scalar.

``norm_coefficient`` (and ONNX Adam's ``norm_coefficient_post``) need the
parameters: ``update(grads, state, params)``. When such a coefficient is the
Python number 0 the parameters are not read at all (the spec's ``0 * X``
differs from nothing only for non-finite ``X``), so ``update`` works without
them and the step moves fewer bytes.

``None`` leaves, and the ``optax.MaskedNode`` leaves that ``optax.masked``
hands in, have no state and pass through untouched.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.custom_derivatives import SymbolicZero

from onnx_optax import _checks, rules

__all__ = [
  "AdagradState",
  "AdamState",
  "DirectMLAdamState",
  "KerasAdamState",
  "MomentumState",
  "OrtAdamWState",
  "OrtSGDState",
  "PyTorchAdagradState",
  "PyTorchAdamState",
  "PyTorchSGDState",
  "adagrad",
  "adam",
  "directml_adam",
  "keras_adam",
  "momentum",
  "ort_adamw",
  "ort_sgd",
  "pytorch_adagrad",
  "pytorch_adam",
  "pytorch_adamw",
  "pytorch_sgd",
]

ScalarOrSchedule: TypeAlias = float | Array | optax.Schedule


class MomentumState(NamedTuple):
  """State of :func:`momentum`: the update count ``T`` and the momentum ``V``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  v: optax.Updates


class AdagradState(NamedTuple):
  """State of :func:`adagrad`: ``T`` and the accumulated squared gradient ``H``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  h: optax.Updates


class AdamState(NamedTuple):
  """State of :func:`adam` (ONNX): ``T``, first moment ``V``, second moment ``H``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  v: optax.Updates
  h: optax.Updates


class DirectMLAdamState(NamedTuple):
  """State of :func:`directml_adam`: training step ``T``, moments ``M`` and ``V``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  m: optax.Updates
  v: optax.Updates


class OrtAdamWState(NamedTuple):
  """State of :func:`ort_adamw`: ONNX Runtime's ``step``, ``momentums_1``, ``momentums_2``.

  ``count`` is the ``step`` input of the *next* update: 1 at the first, as
  ONNX Runtime's training API feeds it and as PyTorch's ``state["step"]``
  reads after its increment (PyTorch's saved ``step`` is ``count - 1``).
  """

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  m1: optax.Updates
  m2: optax.Updates


class OrtSGDState(NamedTuple):
  """State of :func:`ort_sgd`: the number of updates applied (``SGDOptimizerV2`` has no state)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states


_State: TypeAlias = MomentumState | AdagradState | AdamState | DirectMLAdamState | OrtAdamWState | OrtSGDState


def _transform(
  scalars: Callable[..., tuple],
  elementwise: Callable[..., tuple[Array, ...]],
  state_cls: type[_State],
  learning_rate: ScalarOrSchedule,
  initial_count: int | Array,
  state_dtype: Any,
  *,
  minimum_count: int,
  read_params_for: tuple[Any, ...],
  decays: dict[str, Any],
  may_be_one: tuple[str, ...] = (),
) -> optax.GradientTransformationExtraArgs:
  """Maps a rule over the leaves of a pytree.

  The rule comes in its two parts (see :mod:`onnx_optax.rules`):
  ``scalars(R, T)`` runs once per update, ``elementwise(s, X, G, *S) ->
  (U, *S_new)`` once per leaf, with ``s`` rounded once per compute dtype. A
  tree of a thousand leaves pays for the bias corrections once, not a
  thousand times.

  Args:
    scalars: the rule's per-update part, hyperparameters bound.
    elementwise: the rule's per-leaf part, static arguments bound.
    state_cls: the state NamedTuple; its fields after ``count`` are the state
      tensors, in the order ``elementwise`` takes them.
    learning_rate: float or schedule, see the module docstring.
    initial_count: the ``T`` of the first update, at least ``minimum_count``.
    state_dtype: floating dtype, or None for the parameters' dtypes.
    read_params_for: the coefficients that multiply ``X``; unless all are the
      Python number 0 the rule reads the parameters, else it gets ``X=None``.
    decays: the decay rates that the rule subtracts from 1 in the compute
      dtype, checked at ``init`` not to round to 1 there nor in the state's dtype.
    may_be_one: the decays whose range includes 1 (the message of that
      check offers 1.0 for them).
  """
  learning_rate = _learning_rate(learning_rate)
  initial_count = _checks.count("initial_count", initial_count, minimum=minimum_count)
  state_dtype = _checks.floating_dtype("state_dtype", state_dtype)
  uses_params = not all(rules._is_static_zero(c) for c in read_params_for)
  n_state = len(state_cls._fields) - 1

  def init_fn(params: optax.Params) -> NamedTuple:
    _checks.floating_leaves("params", params)
    _checks.decays_representable(decays, params, state_dtype, may_be_one)

    def zeros(p):
      # A fresh buffer per field and leaf: donated states must not alias.
      # zeros_like, not zeros(p.shape): the state inherits the parameter's
      # sharding (and, under explicit mesh axes, its sharded type).
      return jnp.zeros_like(p, dtype=state_dtype or p.dtype)

    return state_cls(
      jnp.asarray(initial_count, jnp.int32), *(jax.tree.map(zeros, params) for _ in range(n_state))
    )

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args  # The GradientTransformationExtraArgs protocol.
    if uses_params and params is None:
      raise ValueError(
        "this transform needs the parameters: call update(grads, state, params). Its "
        "norm_coefficient (or norm_coefficient_post) is not the Python number 0; an injected "
        "coefficient (optax.inject_hyperparams) is an array, traced under jit, so even an injected "
        "0.0 needs them. Pass params, or keep the coefficient a Python number: "
        "optax.inject_hyperparams(..., static_args=('norm_coefficient',))"
      )
    _checks.state(state_cls, state)
    trees = {f"state.{name}": tree for name, tree in zip(state_cls._fields[1:], state[1:])}
    if params is not None:
      # Checked even when the rule does not read them: parameters that do not
      # match the gradients are a mistake in the caller's loop either way.
      trees["params"] = params
    _checks.same_trees(updates, trees)

    T = state.count
    # A schedule's value is a hyperparameter received as an array: at least float32.
    R = (
      _checks.wide_enough("learning_rate", learning_rate(_updates_applied(T, initial_count)))
      if callable(learning_rate)
      else learning_rate
    )
    s = scalars(R, T)
    grads, treedef = jax.tree.flatten(updates)
    xs = treedef.flatten_up_to(params) if uses_params else [None] * len(grads)
    states = [treedef.flatten_up_to(tree) for tree in state[1:]]

    # Each leaf is computed in the wider of its gradient's and its state's dtype,
    # with the scalars rounded once per compute dtype.
    dtypes = [jnp.promote_types(G.dtype, S[0].dtype) if S else G.dtype for G, *S in zip(grads, *states)]
    distinct = list(dict.fromkeys(dtypes))
    which = [distinct.index(d) for d in dtypes]
    leaves = _leaves_once_differentiated(elementwise, which)
    new_updates, new_states = leaves([rules.like(s, d) for d in distinct], xs, grads, states)
    return (
      treedef.unflatten(new_updates),
      state_cls(optax.safe_increment(T), *(treedef.unflatten(t) for t in new_states)),
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _leaves_once_differentiated(elementwise: Callable[..., tuple[Array, ...]], which: list[int]) -> Callable:
  """The per-leaf loop of an update as one ``jax.custom_jvp``.

  ``loop(s_by_dtype, xs, grads, states) -> (updates, new_states)`` calls
  ``elementwise`` once per leaf, leaf ``i`` with the scalars
  ``s_by_dtype[which[i]]`` and its tensors cast to their dtype, and casts the
  results back (the update to the gradient's dtype, the state to its own).

  Its primal traces every leaf with a plain ``Sqrt`` (``rules._plain_sqrt``);
  its derivative is the derivative of the same loop with the rules' safe
  ``Sqrt`` (0 at ``H = 0``), taken by ``jax.jvp`` with respect to the inputs
  that are differentiated. The values are the same (the safe ``Sqrt`` is
  ``jnp.sqrt`` with another derivative), and so are the derivatives; what
  changes is the cost of an update that is not differentiated: one
  ``custom_jvp`` per update, where a ``custom_jvp`` per leaf cost each leaf a
  sub-trace and a lowering of its own (on a tree of a thousand leaves, a
  quarter to a third of the trace and a third to three quarters of the
  lowering of Adagrad and the Adams; docs/benchmarks.md). The compiled
  program is the same.
  """

  def loop(s_by_dtype, xs, grads, states):
    new_updates, new_states = [], [[] for _ in states]
    for i, (G, X, *S) in enumerate(zip(grads, xs, *states)):
      s = s_by_dtype[which[i]]
      dtype = jnp.promote_types(G.dtype, S[0].dtype) if S else G.dtype
      U, *S_new = elementwise(s, _cast(X, dtype), _cast(G, dtype), *(_cast(x, dtype) for x in S))
      new_updates.append(_cast(U, G.dtype))
      for out, s_new, s_old in zip(new_states, S_new, S):
        out.append(_cast(s_new, s_old.dtype))
    return new_updates, new_states

  @jax.custom_jvp
  def leaves(s_by_dtype, xs, grads, states):
    with rules._plain_sqrt():
      return loop(s_by_dtype, xs, grads, states)

  @functools.partial(leaves.defjvp, symbolic_zeros=True)
  def _(primals, tangents):
    # Only the inputs with a non-zero tangent are differentiated, the others
    # are constants of the loop: the derivative is that of the loop called
    # directly, with the same terms (no 0 * inf where an input is not varied).
    flat, tree = jax.tree.flatten(primals)
    varied = [not isinstance(t, SymbolicZero) for t in jax.tree.leaves(tangents)]

    def of_varied(*inputs):
      it = iter(inputs)
      with rules._plain_sqrt(False):
        return loop(*tree.unflatten([next(it) if v else x for x, v in zip(flat, varied)]))

    dots = [t for t, v in zip(jax.tree.leaves(tangents), varied) if v]
    return jax.jvp(of_varied, [x for x, v in zip(flat, varied) if v], dots)

  return leaves


def _cast(x: Array | None, dtype: Any) -> Array | None:
  """``x`` in ``dtype``; no operation is traced when it already is."""
  return x if x is None or x.dtype == dtype else x.astype(dtype)


def _updates_applied(count: Array, initial_count: int | Array) -> Array:
  """``count - initial_count``, the argument of a ``learning_rate`` schedule: int64 under ``jax_enable_x64``.

  An int32 count divided by a Python int is float32 even under x64
  (``jnp.int32(3) / 4``), so a schedule such as ``lambda n: base * (n + 1) /
  warmup``, or ``optax.linear_schedule``, would compute its rate in float32
  for float64 parameters: another rate (1e-8 relative), where PyTorch's is a
  Python float. As int64 it is float64, as the quotient of a Python int is.
  Without x64 there is no int64: the count stays int32, the program unchanged.
  """
  return _cast(count - initial_count, jnp.result_type(int))  # type: ignore[return-value]


def _learning_rate(learning_rate: ScalarOrSchedule) -> ScalarOrSchedule:
  if callable(learning_rate):
    return learning_rate
  return _checks.learning_rate("learning_rate", learning_rate)


def momentum(
  learning_rate: ScalarOrSchedule,
  *,
  alpha: float,
  beta: float,
  mode: str,
  norm_coefficient: float,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX ``Momentum``: SGD with momentum, standard or Nesterov.

  The ONNX operator (ai.onnx.preview.training, v1) as an Optax transform.
  With ``T`` the number of updates already conducted (``state.count``)::

      G_regularized = norm_coefficient * X + G
      beta_adjusted = T > 0 ? beta : 1
      V_new         = alpha * V + beta_adjusted * G_regularized
      standard:  X_new = X - R * V_new
      nesterov:  X_new = X - R * (G_regularized + alpha * V_new)

  ``optax.apply_updates(params, updates)`` is ``X_new`` to the bit.

  This is PyTorch's ``torch.optim.SGD(lr=R, momentum=alpha,
  dampening=1 - beta, weight_decay=norm_coefficient, nesterov=...)``: its
  first step also sets the buffer to the undamped gradient. Optax's
  ``optax.sgd(R, momentum=alpha)`` is the case ``beta = 1``,
  ``norm_coefficient = 0``.

  Args:
    learning_rate: ``R``, a float or an Optax schedule.
    alpha: decay of the momentum ``V`` (PyTorch ``momentum``).
    beta: scale of the gradient in ``V_new`` from the second update on
      (PyTorch ``1 - dampening``).
    mode: ``"standard"`` or ``"nesterov"``.
    norm_coefficient: L2 coefficient, the gradient of
      ``0.5 * norm_coefficient * ||X||^2`` is added (PyTorch ``weight_decay``).
    initial_count: ``T`` at the first update. The schema says 0; pass 1 to
      resume a run whose first-step damping rule must not apply.
    state_dtype: dtype of ``V``; default each parameter's dtype.

  All four hyperparameters are required, as in the ONNX schema.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.momentum(0.1, alpha=0.9, beta=0.5, mode="standard",
    ...                           norm_coefficient=0.0)
    >>> params = {"w": jnp.array([1.0, 2.0])}
    >>> state = opt.init(params)
    >>> updates, state = opt.update({"w": jnp.array([1.0, -1.0])}, state)
    >>> optax.apply_updates(params, updates)["w"]
    Array([0.9, 2.1], dtype=float32)
  """
  if not isinstance(mode, str):
    raise TypeError(f"mode must be a str, one of {rules.MODES}, got {type(mode).__name__} {mode!r}")
  if mode not in rules.MODES:
    raise ValueError(f"mode must be one of {rules.MODES}, got {mode!r}")
  hyper = dict(
    alpha=_checks.decay("alpha", alpha),
    beta=_checks.gradient_weight("beta", beta),
    norm_coefficient=_checks.coefficient("norm_coefficient", norm_coefficient),
  )

  # Looked up in `rules` at each update, not bound here: a test may replace a part.
  def scalars(R, T):
    return rules.momentum_scalars(R, T, **hyper)

  def elementwise(s, X, G, V):
    return rules.momentum_elementwise(s, X, G, V, mode=mode)

  return _transform(
    scalars,
    elementwise,
    MomentumState,
    learning_rate,
    initial_count,
    state_dtype,
    minimum_count=0,
    read_params_for=(norm_coefficient,),
    decays={"alpha": hyper["alpha"]},
    may_be_one=("alpha",),
  )


def adagrad(
  learning_rate: ScalarOrSchedule,
  *,
  decay_factor: float = 0.0,
  epsilon: float = 1e-6,
  norm_coefficient: float = 0.0,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX ``Adagrad``: Adagrad with learning-rate decay and L2 regularization.

  The ONNX operator (ai.onnx.preview.training, v1) as an Optax transform.
  With ``T = state.count``::

      r             = R / (1 + T * decay_factor)
      G_regularized = norm_coefficient * X + G
      H_new         = H + G_regularized * G_regularized
      H_adaptive    = Sqrt(H_new) + epsilon
      X_new         = X - r * G_regularized / H_adaptive

  ``optax.apply_updates(params, updates)`` is ``X_new`` to the bit.

  ``T`` at the first update: the spec allows 0 (0-based) or 1 (1-based). This
  transform is 0-based by default, as ONNX's own test cases are; pass
  ``initial_count=1`` for the 1-based convention.

  Defaults are the ONNX schema's. The seed's text gives ``epsilon`` a default
  of 0.0, but the schema that every ONNX runtime applies says 1e-6; this
  follows the schema. The accumulator starts at zero (``H = 0``).

  This is PyTorch's ``torch.optim.Adagrad(lr=R, lr_decay=decay_factor,
  weight_decay=norm_coefficient, eps=epsilon, initial_accumulator_value=0)``
  (its ``step - 1`` is our 0-based ``T``). Optax's ``optax.adagrad`` differs:
  no decay, epsilon inside the square root, and an initial accumulator of 0.1.

  Args:
    learning_rate: ``R``, a float or an Optax schedule.
    decay_factor: learning-rate decay, ``>= 0`` (a negative value would
      divide by zero at ``T = -1/decay_factor``).
    epsilon: added to ``Sqrt(H_new)``, ``>= 0``.
    norm_coefficient: L2 coefficient (PyTorch ``weight_decay``).
    initial_count: ``T`` at the first update (0 or 1 by the spec's text).
    state_dtype: dtype of ``H``; default each parameter's dtype. Use float32
      for float16 parameters: ``H`` only grows and float16 overflows at 65504.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.adagrad(0.1, decay_factor=0.1, epsilon=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([2.0, -4.0]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    decay_factor=_checks.learning_rate_decay("decay_factor", decay_factor),
    epsilon=_checks.epsilon("epsilon", epsilon),
    norm_coefficient=_checks.coefficient("norm_coefficient", norm_coefficient),
  )

  def scalars(R, T):
    return rules.adagrad_scalars(R, T, **hyper)

  def elementwise(s, X, G, H):
    return rules.adagrad_elementwise(s, X, G, H)

  return _transform(
    scalars,
    elementwise,
    AdagradState,
    learning_rate,
    initial_count,
    state_dtype,
    minimum_count=0,
    read_params_for=(norm_coefficient,),
    decays={},
  )


def adam(
  learning_rate: ScalarOrSchedule,
  *,
  alpha: float = 0.9,
  beta: float = 0.999,
  epsilon: float = 1e-6,
  norm_coefficient: float = 0.0,
  norm_coefficient_post: float = 0.0,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX ``Adam`` (ai.onnx.preview.training, v1) as an Optax transform.

  With ``T = state.count``, the number of updates already conducted::

      G_regularized = norm_coefficient * X + G
      V_new         = alpha * V + (1 - alpha) * G_regularized
      H_new         = beta * H + (1 - beta) * G_regularized * G_regularized
      H_sqrt        = Sqrt(H_new) + epsilon
      R_adjusted    = T > 0 ? R * Sqrt(1 - beta^T) / (1 - alpha^T) : R
      X_new         = X - R_adjusted * V_new / H_sqrt
      X_final       = (1 - norm_coefficient_post) * X_new

  ``optax.apply_updates(params, updates)`` is ``X_final`` to the bit when
  ``norm_coefficient_post`` is 0, and otherwise to the bit where ``X`` and
  ``X_final`` are within a factor of two, within one ulp of
  ``max(|X|, |X_final|)`` in general
  (see :func:`onnx_optax.rules.adam`).

  Note the spec's ``T``: the first update (``T = 0``) has no bias correction
  and the second uses ``T = 1``. With ``initial_count=1`` the rule is Adam
  with Kingma and Ba's "epsilon hat" (epsilon outside the bias correction),
  TensorFlow 1's ``tf.compat.v1.train.AdamOptimizer``, plus L2 and a
  multiplicative decay. ``optax.adam`` puts epsilon inside the bias
  correction instead.

  Defaults are the ONNX schema's (stored there as float32: 0.9 reads back as
  0.89999998; the defaults here are the Python floats).

  Args:
    learning_rate: ``R``, a float or an Optax schedule.
    alpha: first-moment decay, in ``[0, 1)`` (``alpha = 1`` divides by zero).
    beta: second-moment decay, in ``[0, 1]``. ``beta = 1`` is legal but
      degenerate: ``H`` stays 0, the first update is ``R * V_new / epsilon``
      and every later one is 0 (``Sqrt(1 - beta^T) = 0``); refused with
      ``epsilon = 0``, where every update is 0/0.
    epsilon: added to ``Sqrt(H_new)``, ``>= 0``.
    norm_coefficient: L2 coefficient added to the gradient.
    norm_coefficient_post: multiplicative decay of the new parameters.
    initial_count: ``T`` at the first update.
    state_dtype: dtype of ``V`` and ``H``; default each parameter's dtype.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.adam(0.1, alpha=0.5, beta=0.75, epsilon=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([2.0, -2.0]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    alpha=_checks.decay("alpha", alpha, below_one=True),
    beta=_checks.decay("beta", beta),
    epsilon=_checks.epsilon("epsilon", epsilon),
    norm_coefficient=_checks.coefficient("norm_coefficient", norm_coefficient),
    norm_coefficient_post=_checks.parameter_decay("norm_coefficient_post", norm_coefficient_post),
  )
  _checks.second_moment_decay_at_one("beta", beta, epsilon)

  def scalars(R, T):
    return rules.adam_scalars(R, T, **hyper)

  def elementwise(s, X, G, V, H):
    return rules.adam_elementwise(s, X, G, V, H)

  return _transform(
    scalars,
    elementwise,
    AdamState,
    learning_rate,
    initial_count,
    state_dtype,
    minimum_count=0,
    read_params_for=(norm_coefficient, norm_coefficient_post),
    decays={"alpha": hyper["alpha"], "beta": hyper["beta"]},
    may_be_one=("beta",),
  )


def directml_adam(
  learning_rate: ScalarOrSchedule,
  *,
  beta1: float = 0.9,
  beta2: float = 0.999,
  epsilon: float = 1e-8,
  initial_count: int = 1,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """DirectML ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` as an Optax transform.

  With ``T = state.count``::

      M_new = Beta1 * M + (1 - Beta1) * G
      V_new = Beta2 * V + (1 - Beta2) * G * G
      Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)
      X_new = X - LearningRate * Alpha * M_new / (sqrt(V_new) + Epsilon)

  ``optax.apply_updates(params, updates)`` is ``X_new`` to the bit.

  ``T`` starts at 1 (``initial_count=1``): at ``T = 0`` ``Alpha`` is 0/0.
  DirectML's text says the step "usually starts at 0", but the TensorFlow
  backend built on DirectML passes a ``T`` recovered from TensorFlow's
  1-based ``beta^t`` powers. This is Kingma and Ba's "epsilon hat" form (end
  of section 2 of the Adam paper), TensorFlow 1's ``AdamOptimizer``; Optax's
  ``optax.adam`` is their Algorithm 1 (epsilon inside the bias correction).
  DirectML has no weight decay.

  DirectML gives no defaults; these are the values its documentation calls
  typical (0.9, 0.999, 1e-8). In float16, ``epsilon = 1e-8`` rounds to
  zero: keep the state in float32 (``state_dtype``) or use a larger epsilon.

  Args:
    learning_rate: ``LearningRate``, a float or an Optax schedule.
    beta1: first-moment decay, in ``[0, 1)``.
    beta2: second-moment decay, in ``[0, 1]``. ``beta2 = 1`` is legal but
      degenerate: ``V`` stays 0 and ``Alpha = 0``, so every update is 0;
      refused with ``epsilon = 0``, where every update is 0/0.
    epsilon: added to ``sqrt(V_new)``, ``>= 0``.
    initial_count: ``T`` at the first update, ``>= 1``.
    state_dtype: dtype of ``M`` and ``V``; default each parameter's dtype.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.directml_adam(0.1, epsilon=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    beta1=_checks.decay("beta1", beta1, below_one=True),
    beta2=_checks.decay("beta2", beta2),
    epsilon=_checks.epsilon("epsilon", epsilon),
  )
  _checks.second_moment_decay_at_one("beta2", beta2, epsilon)

  def scalars(R, T):
    return rules.directml_adam_scalars(R, T, **hyper)

  def elementwise(s, X, G, M, V):
    return rules.directml_adam_elementwise(s, X, G, M, V)

  return _transform(
    scalars,
    elementwise,
    DirectMLAdamState,
    learning_rate,
    initial_count,
    state_dtype,
    minimum_count=1,
    read_params_for=(),
    decays={"beta1": hyper["beta1"], "beta2": hyper["beta2"]},
    may_be_one=("beta2",),
  )


def _flag(name: str, value: Any) -> bool:
  """A bool attribute that ONNX stores as an int: True, False, 1 or 0 (a concrete scalar array too)."""
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  number = _static_int(name, value, what="a bool (or the ONNX attribute's 0 / 1)")
  if number not in (0, 1):
    raise TypeError(f"{name} must be a bool (or the ONNX attribute's 0 / 1), got {value!r}")
  return bool(number)


def _static_int(name: str, value: Any, what: str = "the int 0 or 1") -> int:
  """An int that selects a formula, so it must be known when the update is traced.

  A concrete integer scalar array is read (``optax.inject_hyperparams`` hands
  ints in as arrays); a traced one cannot be.
  """
  if _checks.is_traced(value):
    raise TypeError(
      f"{name} selects the formula and cannot be traced; under optax.inject_hyperparams "
      f"pass static_args=('{name}',)"
    )
  if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
    return int(value)
  shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
  if shape is not None and tuple(shape) == () and dtype is not None and jnp.issubdtype(dtype, jnp.integer):
    return int(value)
  raise TypeError(f"{name} must be {what}, got {value!r}")


def ort_adamw(
  learning_rate: ScalarOrSchedule,
  *,
  alpha: float = 0.9,
  beta: float = 0.999,
  epsilon: float = 1e-8,
  weight_decay: float = 1e-2,
  adam_mode: int = 0,
  correct_bias: bool = True,
  initial_count: int = 1,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX Runtime's ``AdamWOptimizer`` (com.microsoft, v1) as an Optax transform.

  The operator that ONNX Runtime's training (``generate_artifacts``'s
  ``optimizer_model.onnx``) runs, in its CPU kernel's order. With ``step =
  state.count`` (1 at the first update)::

      alpha_correction = correct_bias ? 1 - alpha^step : 1     (likewise beta_correction)
      adam_mode = 0 (PyTorch's torch.optim.AdamW):
        W     = W - W * lr * weight_decay
        M1    = alpha * M1 + (1 - alpha) * G
        M2    = beta * M2 + (1 - beta) * G * G
        W_new = W - (lr * M1) / (alpha_correction * (Sqrt(M2 / beta_correction) + epsilon))
      adam_mode = 1 (Hugging Face's transformers AdamW):
        lr_corrected = lr * Sqrt(beta_correction) / alpha_correction
        M1, M2 as above
        W     = W - lr_corrected * M1 / (Sqrt(M2) + epsilon)
        W_new = W - lr * weight_decay * W

  ``optax.apply_updates(params, updates)`` is ``W_new`` to the bit when
  ``weight_decay`` is 0, and otherwise to the bit where ``X`` and ``W_new``
  are within a factor of two, within one ulp of ``max(|X|, |W_new|)`` in
  general (see
  :func:`onnx_optax.rules.ort_adamw_elementwise`).

  **Not** ``optax.adamw``, although mode 0 is the same rule in exact
  arithmetic. Mode 0 is PyTorch's ``torch.optim.AdamW(lr, betas=(alpha,
  beta), eps=epsilon, weight_decay=weight_decay)`` in ONNX Runtime's
  operation order (in float64 within 1e-12 of PyTorch over 100 steps:
  tests/test_independent_references.py). ``optax.adamw(lr, b1=alpha,
  b2=beta, eps=epsilon, weight_decay=weight_decay)`` computes the same
  number in another order (``m / (1 - b1^t)`` and ``sqrt(v / (1 - b2^t))``
  separately, the decay ``weight_decay * W`` added to the update instead of
  shrinking ``W`` first), so the two agree only up to rounding, and its
  defaults differ (``weight_decay=1e-4``). Mode 1 is another rule: epsilon
  sits outside the bias correction (it is not scaled by
  ``Sqrt(beta_correction)``) and the decay shrinks the already updated
  ``W``. PyTorch's ``torch.optim.Adam(weight_decay=wd)`` (the L2 term added
  to the gradient) is ``optax.chain(optax.add_decayed_weights(wd),
  ort_adamw(lr, weight_decay=0))``.

  Defaults are the operator schema's (``weight_decay = 0.01`` as in the
  schema and PyTorch's AdamW, ``epsilon = 1e-8``); ONNX Runtime's
  ``generate_artifacts`` writes ``adam_mode=1, epsilon=1e-6, weight_decay=0``
  explicitly. ``adam_mode=0`` with ``correct_bias=False`` is refused, as ONNX
  Runtime refuses it.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule (evaluated at the
      number of updates applied, 0 at the first).
    alpha: first-moment decay (PyTorch ``betas[0]``), in ``[0, 1)``.
    beta: second-moment decay (PyTorch ``betas[1]``), in ``[0, 1)`` for
      ``adam_mode=0`` (at 1, ``M2 / beta_correction`` is 0/0: NaN, and PyTorch
      refuses it too), in ``[0, 1]`` for ``adam_mode=1``, where 1 makes every
      update 0 (refused with ``epsilon = 0``: 0/0).
    epsilon: added to the root, ``>= 0`` (PyTorch ``eps``).
    weight_decay: decoupled decay coefficient, ``>= 0``. Non-zero needs the
      parameters: ``update(grads, state, params)``.
    adam_mode: 0 (PyTorch's AdamW) or 1 (Hugging Face's AdamW). It selects
      the formula, so it is static: under ``optax.inject_hyperparams`` pass
      ``static_args=("adam_mode",)`` (a bool ``correct_bias`` is static there).
    correct_bias: apply the bias corrections (``True`` / 1); ``False`` / 0
      only with ``adam_mode=1``.
    initial_count: ``step`` at the first update, ``>= 1`` with bias
      correction (``step = 0`` divides by ``1 - alpha^0 = 0``), ``>= 0``
      without. Resume a PyTorch run whose ``state["step"]`` is ``n`` with
      ``n + 1``.
    state_dtype: dtype of ``M1`` and ``M2``; default each parameter's dtype.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.ort_adamw(0.1, epsilon=0.0, weight_decay=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  correct_bias = _flag("correct_bias", correct_bias)
  adam_mode = _static_int("adam_mode", adam_mode)
  if adam_mode not in rules.ADAM_MODES:
    raise ValueError(f"adam_mode must be 0 (PyTorch's AdamW) or 1 (Hugging Face's AdamW), got {adam_mode!r}")
  if adam_mode == 0 and not correct_bias:
    raise ValueError(
      "correct_bias=False with adam_mode=0: ONNX Runtime's AdamWOptimizer refuses this pair "
      "(mode 0 is PyTorch's AdamW, which always corrects the bias); use adam_mode=1 for no correction"
    )
  hyper = dict(
    alpha=_checks.decay("alpha", alpha, below_one=True),
    beta=_checks.decay("beta", beta),
    epsilon=_checks.epsilon("epsilon", epsilon),
    weight_decay=_checks.coefficient("weight_decay", weight_decay),
  )
  _checks.second_moment_decay_at_one(
    "beta", beta, epsilon, always=_checks.ORT_ADAMW_MODE0_BETA_ONE if adam_mode == 0 else ""
  )

  def scalars(R, T):
    return rules.ort_adamw_scalars(R, T, **hyper, adam_mode=adam_mode, correct_bias=correct_bias)

  def elementwise(s, X, G, M1, M2):
    return rules.ort_adamw_elementwise(s, X, G, M1, M2, adam_mode=adam_mode)

  return _transform(
    scalars,
    elementwise,
    OrtAdamWState,
    learning_rate,
    initial_count,
    state_dtype,
    minimum_count=1 if correct_bias else 0,
    read_params_for=(weight_decay,),
    decays={"alpha": hyper["alpha"], "beta": hyper["beta"]},
    may_be_one=("beta",) if adam_mode == 1 else (),
  )


def ort_sgd(
  learning_rate: ScalarOrSchedule,
  *,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX Runtime's ``SGDOptimizerV2`` (com.microsoft, v1) as an Optax transform::

      W_new = W + (-lr * G)

  ``optax.apply_updates(params, updates)`` is ``W_new`` to the bit, and so is
  ``optax.sgd(lr)`` (its update ``-lr * G`` is the same product).

  Args:
    learning_rate: ``lr``, a float or an Optax schedule (evaluated at
      ``count - initial_count``).
    initial_count: the state's ``count`` at the first update; the operator
      has no update count, so it only offsets the count that ``state.count``
      reports.
    state_dtype: accepted for a signature shared with the other transforms;
      the rule keeps no tensors, so there is nothing to store in it.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.ort_sgd(0.1)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([1.0, -1.0]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  return _transform(
    rules.ort_sgd_scalars,
    lambda s, X, G: rules.ort_sgd_elementwise(s, X, G),
    OrtSGDState,
    learning_rate,
    initial_count,
    state_dtype,
    minimum_count=0,
    read_params_for=(),
    decays={},
  )


# -- PyTorch-order twins ---------------------------------------------------------------


class PyTorchSGDState(NamedTuple):
  """State of :func:`pytorch_sgd`: ``count`` (updates done; 0: no momentum buffer yet) and
  ``momentum_buffer`` (PyTorch's ``state[p]["momentum_buffer"]``; zeros, unused, without
  momentum, where PyTorch keeps none)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  momentum_buffer: optax.Updates


class PyTorchAdagradState(NamedTuple):
  """State of :func:`pytorch_adagrad`: ``count`` (PyTorch's ``step``) and ``sum``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  sum: optax.Updates


class PyTorchAdamState(NamedTuple):
  """State of :func:`pytorch_adam` and :func:`pytorch_adamw`: ``count`` (PyTorch's ``step``, the
  updates done), ``exp_avg`` and ``exp_avg_sq``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  exp_avg: optax.Updates
  exp_avg_sq: optax.Updates


class KerasAdamState(NamedTuple):
  """State of :func:`keras_adam`: ``count`` (Keras's ``iterations``, the updates done), the
  first moments ``momentums`` and the second ``velocities`` (Keras's ``_momentums`` and
  ``_velocities``)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  momentums: optax.Updates
  velocities: optax.Updates


_PyTorchState: TypeAlias = PyTorchSGDState | PyTorchAdagradState | PyTorchAdamState | KerasAdamState


def _scalars_in(s: tuple, dtype: Any) -> tuple:
  """The float scalars of a twin rounded once to ``dtype`` (bool, integer and None fields kept)."""

  def one(v):
    kind = getattr(v, "dtype", None)
    if kind is not None and (kind == jnp.bool_ or jnp.issubdtype(kind, jnp.integer)):
      return v
    return jnp.asarray(v, dtype)

  return jax.tree.map(one, s)


def _pytorch_transform(
  scalars: Callable[..., tuple],
  elementwise: Callable[..., tuple[Array, ...]],
  state_cls: type[_PyTorchState],
  learning_rate: ScalarOrSchedule,
  initial_count: int | Array,
  state_dtype: Any,
  *,
  initial_values: tuple[float | None, ...],
  reads_params: bool,
) -> optax.GradientTransformationExtraArgs:
  """Maps a PyTorch-order (or Keras-order) twin over the leaves of a pytree.

  As :func:`_transform`, except: ``count`` is the framework's (updates done, 0 at the
  first); ``initial_values`` gives each state field's starting value (None: the field is
  None, the rule keeps no such tensor); each leaf computes in the rule's compute dtype and
  rounds where the framework stores. The rule returns the update: the addend of the
  framework's last addition to the parameters where that addition is the whole step (then
  ``optax.apply_updates`` reproduces it to the bit), else ``X_new - X``
  (``onnx_optax.rules._in_place``). ``reads_params``: the rule needs ``params`` at every
  update (else only where it says so, for parameters narrower than float32).
  """
  learning_rate = _learning_rate(learning_rate)
  initial_count = _checks.count("initial_count", initial_count, minimum=0)
  state_dtype = _checks.floating_dtype("state_dtype", state_dtype)

  def init_fn(params: optax.Params) -> NamedTuple:
    _checks.floating_leaves("params", params)

    def field(value):
      if value is None:
        return None
      return jax.tree.map(lambda p: jnp.full_like(p, value, dtype=state_dtype or p.dtype), params)

    return state_cls(jnp.asarray(initial_count, jnp.int32), *(field(v) for v in initial_values))

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args  # The GradientTransformationExtraArgs protocol.
    if params is None and reads_params:
      raise ValueError(
        f"this transform needs the parameters: call update(grads, state, params). Its step "
        f"({state_cls.__name__[: -len('State')]}) reads them: a weight decay, or an update "
        f"written in place"
      )
    _checks.state(state_cls, state)
    fields = [(name, tree) for name, tree in zip(state_cls._fields[1:], state[1:]) if tree is not None]
    trees = {f"state.{name}": tree for name, tree in fields}
    if params is not None:
      trees["params"] = params
    _checks.same_trees(updates, trees)

    count = state.count
    R = learning_rate(_updates_applied(count, initial_count)) if callable(learning_rate) else learning_rate
    s = scalars(R, count)
    grads, treedef = jax.tree.flatten(updates)
    xs = treedef.flatten_up_to(params) if params is not None else [None] * len(grads)
    present = [i for i, tree in enumerate(state[1:]) if tree is not None]
    columns = [treedef.flatten_up_to(state[1 + i]) for i in present]
    new_updates, new_columns = [], [[] for _ in present]
    for j, (G, X) in enumerate(zip(grads, xs)):
      S = [column[j] for column in columns]
      S_all: list[Any] = [None] * (len(state_cls._fields) - 1)
      for i, tensor in zip(present, S):
        S_all[i] = tensor
      dtype = rules._torch_opmath(G.dtype, *(t.dtype for t in S))
      U, *S_new = elementwise(_scalars_in(s, dtype), X, G, *S_all)
      new_updates.append(U)
      for out, i in zip(new_columns, present):
        out.append(S_new[i])
    new_state: list[Any] = [None] * (len(state_cls._fields) - 1)
    for i, column in zip(present, new_columns):
      new_state[i] = treedef.unflatten(column)
    return treedef.unflatten(new_updates), state_cls(optax.safe_increment(count), *new_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def pytorch_sgd(
  learning_rate: ScalarOrSchedule,
  *,
  momentum: float = 0.0,
  dampening: float = 0.0,
  weight_decay: float = 0.0,
  nesterov: bool = False,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.SGD``, in PyTorch's order: the float32 twin of :func:`momentum`.

  The same rule as ONNX ``Momentum`` (``alpha = momentum``, ``beta = 1 - dampening``,
  ``norm_coefficient = weight_decay``), evaluated as PyTorch 2.13's ``_single_tensor_sgd``
  evaluates it, with its scalars (``1 - dampening`` in float64, rounded once) and its roundings
  (docs/spec.md, "PyTorch-order twins")::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                 if weight_decay != 0
      buf  = grad at the first update (count == 0), else
             buf.mul_(momentum).add_(grad, alpha=1 - dampening)   if momentum != 0
      grad = grad.add(buf, alpha=momentum) if nesterov, else buf  if momentum != 0
      param.add_(grad, alpha=-lr)

  A run carried from PyTorch with :func:`onnx_optax.interop.from_torch` continues in float32
  within PyTorch's own spread (docs/interop.md, "Float32 runs carried from PyTorch").

  Args:
    learning_rate: ``lr``, a float or an Optax schedule (of the updates made by this
      transform, ``count - initial_count``).
    momentum: in ``[0, 1]``; 0 is plain SGD (``state.momentum_buffer`` stays zero).
    dampening: in ``[0, 1]``.
    weight_decay: L2 coefficient added to the gradient, ``>= 0``.
    nesterov: Nesterov momentum (PyTorch: needs ``momentum > 0`` and ``dampening = 0``).
    maximize: negate the gradient first.
    initial_count: the updates already done; ``> 0`` means the buffer exists.
    state_dtype: dtype of the buffer; default each parameter's (PyTorch's).

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_sgd(0.1, momentum=0.9, dampening=0.5)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([1.0, -1.0]), state, params)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  momentum = _checks.decay("momentum", momentum)
  dampening = _checks.hyperparameter("dampening", dampening, minimum=0.0, maximum=1.0)
  weight_decay = _checks.coefficient("weight_decay", weight_decay)
  nesterov, maximize = _flag("nesterov", nesterov), _flag("maximize", maximize)
  concrete = not (_checks.is_traced(momentum) or _checks.is_traced(dampening))
  if nesterov and concrete and (momentum == 0 or dampening != 0):  # injected, traced: unchecked
    raise ValueError(
      f"nesterov=True needs momentum > 0 and dampening = 0 (as torch.optim.SGD), got "
      f"momentum={momentum}, dampening={dampening}"
    )

  def scalars(R, T):
    return rules.pytorch_sgd_scalars(R, T, momentum=momentum, dampening=dampening, weight_decay=weight_decay)

  def elementwise(s, X, G, buf):
    return rules.pytorch_sgd_elementwise(s, X, G, buf, nesterov=nesterov, maximize=maximize)

  return _pytorch_transform(
    scalars,
    elementwise,
    PyTorchSGDState,
    learning_rate,
    initial_count,
    state_dtype,
    initial_values=(0.0,),
    reads_params=True,
  )


def pytorch_adagrad(
  learning_rate: ScalarOrSchedule,
  *,
  lr_decay: float = 0.0,
  weight_decay: float = 0.0,
  initial_accumulator_value: float = 0.0,
  eps: float = 1e-10,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Adagrad``, in PyTorch's order: the float32 twin of :func:`adagrad`.

  The same rule as ONNX ``Adagrad`` (``decay_factor = lr_decay``, ``epsilon = eps``,
  ``norm_coefficient = weight_decay``, ``T = count``), as ``_single_tensor_adagrad`` evaluates
  it, with ``step = count + 1`` (PyTorch's step after its increment)::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)        if weight_decay != 0
      clr  = lr / (1 + (step - 1) * lr_decay)
      sum.addcmul_(grad, grad, value=1)
      std  = sum.sqrt().add_(eps)
      param.addcdiv_(grad, std, value=-clr)

  ``clr`` is computed in float64 under ``jax_enable_x64`` (PyTorch's), else in float32.
  Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule.
    lr_decay: ``>= 0``.
    weight_decay: L2 coefficient, ``>= 0``.
    initial_accumulator_value: the starting ``sum``, ``>= 0``.
    eps: added to ``sqrt(sum)``, ``>= 0``.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` before the first update here.
    state_dtype: dtype of ``sum``; default each parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adagrad(0.1, eps=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([2.0, -4.0]), state, params)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    lr_decay=_checks.learning_rate_decay("lr_decay", lr_decay),
    eps=_checks.epsilon("eps", eps),
    weight_decay=_checks.coefficient("weight_decay", weight_decay),
  )
  initial = _checks.hyperparameter("initial_accumulator_value", initial_accumulator_value, minimum=0.0)
  maximize = _flag("maximize", maximize)

  def scalars(R, T):
    return rules.pytorch_adagrad_scalars(R, T, **hyper)

  def elementwise(s, X, G, state_sum):
    return rules.pytorch_adagrad_elementwise(s, X, G, state_sum, maximize=maximize)

  return _pytorch_transform(
    scalars,
    elementwise,
    PyTorchAdagradState,
    learning_rate,
    initial_count,
    state_dtype,
    initial_values=(initial,),
    reads_params=not rules._is_static_zero(hyper["weight_decay"]),
  )


def pytorch_adam(
  learning_rate: ScalarOrSchedule,
  *,
  betas: tuple[float, float] = (0.9, 0.999),
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  decoupled_weight_decay: bool = False,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Adam`` (and ``AdamW``), in PyTorch's order.

  The float32 twin of :func:`ort_adamw` (``adam_mode=0``, ``correct_bias=True``): the same
  rule in exact arithmetic, as ``_single_tensor_adam`` evaluates it, with ``step = count + 1``::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)             decoupled (AdamW), weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)    coupled (Adam), weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      bias_correction1 = 1 - beta1 ** step;  bias_correction2 = 1 - beta2 ** step
      step_size = lr / bias_correction1;     bias_correction2_sqrt = bias_correction2 ** 0.5
      denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
      param.addcdiv_(exp_avg, denom, value=-step_size)

  ``1 - beta1``, ``1 - beta2`` and ``1 - lr * weight_decay`` are Python float64 numbers
  rounded once, as in PyTorch (``1 - 0.999`` is ``0.001f``; ONNX Runtime's ``1 - 0.999f`` is
  0.00099998713). The bias corrections and ``step_size`` are computed in float64 under
  ``jax_enable_x64`` (PyTorch's numbers), else in float32 (docs/spec.md). ``amsgrad`` is not
  a rule here. Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule.
    betas: ``(beta1, beta2)``, Python numbers, ``beta1`` in ``[0, 1)``, ``beta2`` in ``[0, 1]``.
    eps: added after the bias correction of the root, ``>= 0``.
    weight_decay: ``>= 0``; coupled (L2, added to the gradient) unless
      ``decoupled_weight_decay``.
    decoupled_weight_decay: AdamW's decay, ``param * (1 - lr * weight_decay)`` first.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of ``exp_avg`` and ``exp_avg_sq``; default each parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adam(0.1, eps=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  if not isinstance(betas, (tuple, list)) or len(betas) != 2:
    raise TypeError(f"betas must be a pair (beta1, beta2) of Python numbers, got {betas!r}")
  beta1 = _checks.decay("betas[0]", betas[0], below_one=True)
  # PyTorch's constructor refuses betas[1] = 1 too: its step divides by 1 - beta2**step = 0.
  beta2 = _checks.decay("betas[1]", betas[1], below_one=True)
  for name, value in (("betas[0]", beta1), ("betas[1]", beta2)):
    if not isinstance(value, numbers.Real):
      raise TypeError(
        f"{name} must be a Python number: PyTorch's 1 - beta and its lerp branch are Python "
        f"float arithmetic; got {value!r}"
      )
  hyper = dict(
    beta1=float(beta1),
    beta2=float(beta2),
    eps=_checks.epsilon("eps", eps),
    weight_decay=_checks.coefficient("weight_decay", weight_decay),
    decoupled_weight_decay=_flag("decoupled_weight_decay", decoupled_weight_decay),
  )
  maximize = _flag("maximize", maximize)

  def scalars(R, T):
    return rules.pytorch_adam_scalars(R, T, **hyper)

  def elementwise(s, X, G, exp_avg, exp_avg_sq):
    return rules.pytorch_adam_elementwise(
      s, X, G, exp_avg, exp_avg_sq, maximize=maximize, lerp_small=abs(1 - hyper["beta1"]) < 0.5
    )

  return _pytorch_transform(
    scalars,
    elementwise,
    PyTorchAdamState,
    learning_rate,
    initial_count,
    state_dtype,
    initial_values=(0.0, 0.0),
    reads_params=not rules._is_static_zero(hyper["weight_decay"]),
  )


def pytorch_adamw(
  learning_rate: ScalarOrSchedule,
  *,
  betas: tuple[float, float] = (0.9, 0.999),
  eps: float = 1e-8,
  weight_decay: float = 1e-2,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.AdamW``: :func:`pytorch_adam` with ``decoupled_weight_decay=True``.

  PyTorch's defaults (``weight_decay = 0.01``). See :func:`pytorch_adam` for the order.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adamw(0.1, eps=0.0, weight_decay=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  return pytorch_adam(
    learning_rate,
    betas=betas,
    eps=eps,
    weight_decay=weight_decay,
    decoupled_weight_decay=True,
    maximize=maximize,
    initial_count=initial_count,
    state_dtype=state_dtype,
  )


def keras_adam(
  learning_rate: ScalarOrSchedule,
  *,
  beta_1: float = 0.9,
  beta_2: float = 0.999,
  epsilon: float = 1e-7,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """Keras 3 ``keras.optimizers.Adam``, in Keras's order: the float32 twin of :func:`directml_adam`.

  The same rule as DirectML Adam (``T = count + 1``) in exact arithmetic, written as Keras's
  ``Adam.update_step`` writes it (``count`` is Keras's ``iterations``)::

      alpha = lr * sqrt(1 - beta_2 ** (count + 1)) / (1 - beta_1 ** (count + 1))
      m += (g - m) * (1 - beta_1)
      v += (square(g) - v) * (1 - beta_2)
      variable -= (m * alpha) / (sqrt(v) + epsilon)

  in the variable's dtype, ``1 - beta_1`` and ``1 - beta_2`` Python float64 numbers rounded
  once (DirectML's rule computes ``1 - beta`` from the rounded ``beta``). Under ``jax.jit`` it
  compiles as Keras's jitted step on the JAX backend (``model.fit``) compiles. Defaults are
  Keras's.

  Args:
    learning_rate: a float or an Optax schedule.
    beta_1: in ``[0, 1)``.  beta_2: in ``[0, 1]``.  epsilon: ``>= 0``.
    initial_count: Keras's ``iterations`` before the first update here.
    state_dtype: dtype of the moments; default each parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.keras_adam(0.1, epsilon=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)  # Keras's float32 bias corrections: 0.9 +- ulps
    Array([0.9000007, 2.0999994], dtype=float32)
  """
  # Python floats, as Keras holds them (1 - beta is then rounded once from float64); an injected,
  # traced value stays an array (optax.inject_hyperparams).
  beta_1 = _python_float(_checks.decay("beta_1", beta_1, below_one=True))
  beta_2 = _python_float(_checks.decay("beta_2", beta_2))
  epsilon = _checks.epsilon("epsilon", epsilon)

  def elementwise(s, X, G, m, v):
    return rules.keras_adam_elementwise(s, X, G, m, v, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)

  return _pytorch_transform(
    rules.keras_adam_scalars,
    elementwise,
    KerasAdamState,
    learning_rate,
    initial_count,
    state_dtype,
    initial_values=(0.0, 0.0),
    reads_params=False,
  )


def _python_float(value: Any) -> Any:
  """A concrete hyperparameter as a Python float; a traced one as it is."""
  return value if _checks.is_traced(value) else float(value)
