"""The one engine: a registered rule mapped over the leaves of a pytree, as an Optax transform.

Every transform of the package (the spec rules and the framework twins) is
:func:`transform` of its :class:`~onnx_optax.registry.Rule`. What differs between
rules is declared by the rule, never decided here by its name: its two parts, its
hyperparameters' checks, the count of its first update, and its
:class:`~onnx_optax.registry.Policy` (the dtype each leaf is computed in, how the
per-update scalars are rounded, whether the engine casts the tensors or the rule
rounds where its framework stores, whether a decay that stalls in a 16-bit dtype is
refused). The semantics common to all are :mod:`onnx_optax.transforms`' docstring.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import optax
from jax import Array
from jax.custom_derivatives import SymbolicZero

from onnx_optax import _checks, _numerics, _pytorch
from onnx_optax.registry import LEARNING_RATE, Policy, Rule

__all__ = ["FRAMEWORK", "SPEC", "ScalarOrSchedule", "tensor", "transform", "updates_applied"]

ScalarOrSchedule: TypeAlias = float | Array | optax.Schedule


def _wider(g_dtype: Any, *state_dtypes: Any) -> Any:
  """The wider of the gradient's and the (first) state tensor's dtype."""
  return jnp.promote_types(g_dtype, state_dtypes[0]) if state_dtypes else g_dtype


#: The policy of the spec rules, each leaf in the wider of its gradient's and its state's dtype, every
#: scalar rounded once to it, the results rounded to the state's and the parameter's dtypes
#: (docs/spec.md, "Dtypes"); ``X`` is read only where a coefficient multiplies it.
SPEC = Policy(
  "spec", _wider, _numerics.like, casts=True, refuses_stalling_decays=True, params_when_given=False
)
#: The policy of the framework twins, each leaf in PyTorch's opmath dtype (float64 if any of its tensors
#: is, else float32), the rule rounding where its framework stores (docs/spec.md,
#: "PyTorch-order twins"); ``X`` is handed to the rule whenever ``update`` gets it (the
#: rule reads it for parameters narrower than float32).
FRAMEWORK = Policy(
  "framework",
  _pytorch.opmath,
  _pytorch.scalars_in,
  casts=False,
  refuses_stalling_decays=False,
  params_when_given=True,
)


def transform(
  rule: Rule,
  learning_rate: Any,
  initial_count: Any,
  state_dtype: Any,
  hyper: Mapping[str, Any],
) -> optax.GradientTransformationExtraArgs:
  """The Optax transform of ``rule`` with these hyperparameters.

  Everything is checked here, before anything is computed, each error naming the
  argument as the user passed it: the hyperparameters (by the rule's declaration,
  :meth:`~onnx_optax.registry.Rule.checked`), ``learning_rate``, ``initial_count``
  (at least the rule's first count) and ``state_dtype``.
  """
  hyper = rule.checked(hyper)
  rule = rule.running(hyper)  # a flag that adds state fields runs its own rule (Rule.flagged)
  if callable(learning_rate) and not rule.reads_learning_rate:
    starts = [f.name for f in rule.fields if f.initial == LEARNING_RATE]
    raise TypeError(
      f"onnx_optax.{rule.name}: learning_rate only starts state.{', state.'.join(starts)} at init, and no "
      f"update reads it: a schedule would change nothing after the first update (as a PyTorch "
      f"scheduler changes nothing of the started step sizes). Pass a float: its value at the "
      f"first update, learning_rate=float(schedule(0))"
    )
  learning_rate = (
    learning_rate if callable(learning_rate) else _checks.learning_rate("learning_rate", learning_rate)
  )
  initial_count = _checks.count("initial_count", initial_count, minimum=rule.minimum(hyper))
  state_dtype = _checks.floating_dtype("state_dtype", state_dtype)
  policy = rule.policy
  reads = _reads_params(rule, hyper)
  decays, may_be_one = rule.decays(hyper)

  def init_fn(params: optax.Params) -> Any:
    with _named(rule):
      _checks.floating_leaves("params", params)
      if rule.ranks:
        _checks.ranks("params", params, rule.ranks, rule.name)
      if policy.refuses_stalling_decays:
        _checks.decays_representable(decays, params, state_dtype, may_be_one)

    def field(f: Any) -> Any:
      initial = f.initial
      if initial == LEARNING_RATE:  # the learning rate at the first update (a schedule's value there)
        value = learning_rate(0) if callable(learning_rate) else learning_rate
      else:
        value = hyper[initial] if isinstance(initial, str) else initial
      if not f.like_params:
        # A field of its own shape and dtype (Field.shape, Field.dtypes): one array per leaf, on
        # its parameter's devices; sharded like the parameter where it has the parameter's shape
        # (Adafactor's variance beside a vector), replicated over them otherwise.
        def own(p: Any) -> Array:
          shape, dtype = f.shape_for(p.shape), f.dtype_for(p.dtype, state_dtype)
          if shape == tuple(p.shape):
            return jnp.full_like(p, value, dtype=dtype)
          return _beside(jnp.full(shape, value, dtype), p, _kept_axes(shape, tuple(p.shape)))

        return jax.tree.map(own, params)
      if isinstance(value, (int, float)) and value == 0:
        # A fresh buffer per field and leaf: donated states must not alias. zeros_like, not
        # zeros(p.shape): the state inherits the parameter's sharding (and, under explicit
        # mesh axes, its sharded type).
        return jax.tree.map(lambda p: jnp.zeros_like(p, dtype=state_dtype or p.dtype), params)
      return jax.tree.map(lambda p: jnp.full_like(p, value, dtype=state_dtype or p.dtype), params)

    return rule.state(jnp.asarray(initial_count, jnp.int32), *(field(f) for f in rule.fields))

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args  # The GradientTransformationExtraArgs protocol.
    with _named(rule):
      if reads and params is None:
        raise ValueError(f"this transform needs the parameters: call update(grads, state, params). {reads}")
      _checks.state(rule.state, state)
      trees = {f"state.{f.name}": tree for f, tree in zip(rule.fields, state[1:])}
      if params is not None:
        # Checked even when the rule does not read them: parameters that do not match the
        # gradients are a mistake in the caller's loop either way.
        trees["params"] = params
      # A field of its own shape (Field.shape) is checked against that shape of each leaf's.
      _checks.same_trees(updates, trees, {f"state.{f.name}": f.shape_for for f in rule.fields})

    T = state.count
    R = learning_rate
    if callable(learning_rate):
      with _named(rule):
        # A schedule's value is a hyperparameter received as an array: at least float32.
        R = _checks.wide_enough("learning_rate", learning_rate(updates_applied(T, initial_count)))
    scalars, elementwise = rule.bind(rule, hyper)
    s = scalars(R, T)
    grads, treedef = jax.tree.flatten(updates)
    given = reads or (policy.params_when_given and params is not None)
    xs = treedef.flatten_up_to(params) if given else [None] * len(grads)
    states = [treedef.flatten_up_to(tree) for tree in state[1:]]

    # Each leaf is computed in its policy's dtype, with the scalars rounded once per dtype.
    # A field kept in a dtype of its own (Field.dtypes, a framework's scalar dtype) does not
    # choose it: the rule computes it in its own.
    own = [bool(f.dtypes) for f in rule.fields]
    dtypes = [
      policy.compute_dtype(G.dtype, *(t.dtype for t, o in zip(S, own) if not o))
      for G, *S in zip(grads, *states)
    ]
    distinct = list(dict.fromkeys(dtypes))
    which = [distinct.index(d) for d in dtypes]
    leaves = _leaves_once_differentiated(elementwise, which, distinct, policy.casts)
    new_updates, new_states = leaves([policy.round_scalars(s, d) for d in distinct], xs, grads, states)
    return (
      treedef.unflatten(new_updates),
      rule.state(optax.safe_increment(T), *(treedef.unflatten(t) for t in new_states)),
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


@contextlib.contextmanager
def _named(rule: Rule) -> Iterator[None]:
  """Errors of the checks name the transform they come from (inside ``optax.chain`` or
  ``optax.multi_transform`` the traceback alone does not say which of several it was)."""
  try:
    yield
  except (TypeError, ValueError) as e:
    raise type(e)(f"onnx_optax.{rule.name}: {e}") from None


def tensor(rule: Rule, R: Any, T: Any, X: Array, G: Array, *state: Array, **hyper: Any) -> tuple[Array, ...]:
  """``rule`` on one tensor: its scalars rounded once to ``X``'s dtype, then its element-wise part.

  Returns ``(U, *new_state)`` with ``X + U`` the rule's new ``X``. The hyperparameters are
  not checked here (the callers check them: the ONNX interface, DirectML's call); ``X`` is
  always read.
  """
  scalars, elementwise = rule.bind(rule, hyper)
  return elementwise(rule.policy.round_scalars(scalars(R, T), X.dtype), X, G, *state)


def _reads_params(rule: Rule, hyper: Mapping[str, Any]) -> str:
  """Why the rule needs ``params`` at every update with these hyperparameters ("": it does not).

  Injection is named only where a coefficient is an array, as ``optax.inject_hyperparams`` hands
  it in (an array, traced under jit, multiplies the parameters even at 0).
  """
  if rule.always_reads_params:
    return rule.always_reads_params
  named = [h for h in rule.params_for if not _numerics.is_static_zero(hyper[h])]
  if not named:
    return ""
  injected = [h for h in named if hasattr(hyper[h], "dtype")]
  if injected:
    static = ", ".join(repr(h) for h in injected)
    return (
      f"Its {' and '.join(injected)} multiplies them and is an array, as optax.inject_hyperparams "
      f"injects it (traced under jit), so even an injected 0.0 needs them. Pass params, or keep it a "
      f"Python number: optax.inject_hyperparams(..., static_args=({static},))"
    )
  values = " and ".join(f"{h}={hyper[h]!r}" for h in named)
  return f"Its {values} multiplies them"


def _kept_axes(shape: tuple[int, ...], param_shape: tuple[int, ...]) -> tuple[bool, ...] | None:
  """Per axis of a factored field (the parameter's shape with some axes reduced to 1: Adafactor's
  ``row_var`` and ``col_var``), whether it keeps the parameter's axis; None for another shape."""
  if len(shape) != len(param_shape) or any(n not in (m, 1) for n, m in zip(shape, param_shape)):
    return None
  return tuple(n == m for n, m in zip(shape, param_shape))


def _beside(x: Array, p: Any, kept: tuple[bool, ...] | None = None) -> Array:
  """``x``, a state leaf not of its parameter's shape, on the parameter's devices where the
  parameter is sharded over several: a factored field (``kept``: the parameter's axes it keeps)
  sharded as the parameter along the axes it keeps, as the update's reductions leave it (else
  ``jit`` sees another sharding, under explicit mesh axes another type, after the first update);
  any other (one scalar per parameter) replicated. A parameter on one device, and a traced one
  under automatic axes, leave ``x`` as ``jnp.full`` made it: committing it to one device would
  give ``jit`` another argument sharding than the update's outputs, and a second compilation."""
  if isinstance(p, jax.core.Tracer):
    sharding = getattr(jax.typeof(p), "sharding", None)
    spec = getattr(sharding, "spec", None)
    if kept is None or spec is None or not any(spec):
      return x
    # Explicit mesh axes: the type carries the sharding.
    return jax.sharding.reshard(x, _kept_spec(spec, kept))
  sharding = getattr(p, "sharding", None)
  if not isinstance(sharding, jax.sharding.NamedSharding) or len(sharding.device_set) == 1:
    return x
  spec = _kept_spec(sharding.spec, kept) if kept is not None else jax.sharding.PartitionSpec()
  return jax.device_put(x, jax.sharding.NamedSharding(sharding.mesh, spec, memory_kind=sharding.memory_kind))


def _kept_spec(spec: Any, kept: tuple[bool, ...]) -> Any:
  """``spec`` (the parameter's), each axis the field does not keep unsharded."""
  axes = tuple(spec) + (None,) * (len(kept) - len(tuple(spec)))
  return jax.sharding.PartitionSpec(*(a if k else None for a, k in zip(axes, kept)))


def updates_applied(count: Array, initial_count: int | Array) -> Array:
  """``count - initial_count``, the argument of a ``learning_rate`` schedule: int64 under ``jax_enable_x64``.

  An int32 count divided by a Python int is float32 even under x64
  (``jnp.int32(3) / 4``), so a schedule such as ``lambda n: base * (n + 1) /
  warmup``, or ``optax.linear_schedule``, would compute its rate in float32
  for float64 parameters: another rate (1e-8 relative), where PyTorch's is a
  Python float. As int64 it is float64, as the quotient of a Python int is.
  Without x64 there is no int64: the count stays int32, the program unchanged.
  """
  return _cast(count - initial_count, jnp.result_type(int))  # type: ignore[return-value]


def _cast(x: Array | None, dtype: Any) -> Array | None:
  """``x`` in ``dtype``; no operation is traced when it already is."""
  return x if x is None or x.dtype == dtype else x.astype(dtype)


def _leaves_once_differentiated(
  elementwise: Callable[..., tuple[Array, ...]], which: list[int], distinct: list[Any], casts: bool
) -> Callable:
  """The per-leaf loop of an update as one ``jax.custom_jvp``.

  ``loop(s_by_dtype, xs, grads, states) -> (updates, new_states)`` calls ``elementwise``
  once per leaf, leaf ``i`` with the scalars ``s_by_dtype[which[i]]``. With ``casts`` its
  tensors are cast to ``distinct[which[i]]`` and the results back (the update to the
  gradient's dtype, the state to its own); without, the rule gets and returns them in their
  own dtypes.

  Its primal traces every leaf with a plain ``Sqrt`` (``_numerics.plain_sqrt``); its
  derivative is the derivative of the same loop with the rules' safe ``Sqrt`` (0 at
  ``H = 0``), taken by ``jax.jvp`` with respect to the inputs that are differentiated. The
  values are the same (the safe ``Sqrt`` is ``jnp.sqrt`` with another derivative), and so
  are the derivatives; what changes is the cost of an update that is not differentiated:
  one ``custom_jvp`` per update, where a ``custom_jvp`` per leaf cost each leaf a sub-trace
  and a lowering of its own (on a tree of a thousand leaves, a quarter to a third of the
  trace and a third to three quarters of the lowering of Adagrad and the Adams;
  docs/benchmarks.md). The compiled program is the same.
  """

  def loop(s_by_dtype, xs, grads, states):
    new_updates, new_states = [], [[] for _ in states]
    for i, (G, X, *S) in enumerate(zip(grads, xs, *states)):
      s = s_by_dtype[which[i]]
      if casts:
        dtype = distinct[which[i]]
        U, *S_new = elementwise(s, _cast(X, dtype), _cast(G, dtype), *(_cast(x, dtype) for x in S))
        U, S_new = _cast(U, G.dtype), [_cast(t, old.dtype) for t, old in zip(S_new, S)]
      else:
        U, *S_new = elementwise(s, X, G, *S)
      new_updates.append(U)
      for out, s_new in zip(new_states, S_new):
        out.append(s_new)
    return new_updates, new_states

  @jax.custom_jvp
  def leaves(s_by_dtype, xs, grads, states):
    with _numerics.plain_sqrt():
      return loop(s_by_dtype, xs, grads, states)

  @functools.partial(leaves.defjvp, symbolic_zeros=True)
  def _(primals, tangents):
    # Only the inputs with a non-zero tangent are differentiated, the others are constants of
    # the loop: the derivative is that of the loop called directly, with the same terms (no
    # 0 * inf where an input is not varied).
    flat, tree = jax.tree.flatten(primals)
    varied = [not isinstance(t, SymbolicZero) for t in jax.tree.leaves(tangents)]

    def of_varied(*inputs):
      it = iter(inputs)
      with _numerics.plain_sqrt(False):
        return loop(*tree.unflatten([next(it) if v else x for x, v in zip(flat, varied)]))

    dots = [t for t, v in zip(jax.tree.leaves(tangents), varied) if v]
    return jax.jvp(of_varied, [x for x, v in zip(flat, varied) if v], dots)

  return leaves
