"""What the PyTorch and Keras bridges share: lazy imports, leaf checks, state surgery.

Nothing here knows a rule's formula. A bridge finds in the registry
(:mod:`onnx_optax.registry`) the rule bound to another framework's optimizer,
builds its transform with that optimizer's hyperparameters, calls its ``init``
and then writes the other framework's state tensors into the state ``init``
returned. The reverse direction reads them back out of the same places: the
state of any registered rule with state tensors (:func:`rule_states`).
"""

from __future__ import annotations

import importlib
import numbers
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from onnx_optax import _checks, registry


def rule_states() -> tuple[type, ...]:
  """The state NamedTuples of the registered rules that keep state tensors, in the registry's order.

  What the bridges look for inside a state (alone, in an ``optax.chain`` or
  under ``optax.multi_transform``). Read from the registry at each call, so
  that a rule registered from outside the package counts as well.
  """
  return tuple(dict.fromkeys(r.state for rule in registry.rules() for r in rule.family() if r.fields))


def _rule_state_test() -> Callable[[Any], bool]:
  """``is_leaf`` for a walk over a state: a rule state of :func:`rule_states` (read once per walk)."""
  kinds = rule_states()
  return lambda node: isinstance(node, kinds)


#: How to install each framework the bridges import (docs/interop.md, "Installing").
INSTALL = {
  "torch": (
    "pip install 'onnx_optax[interop]' brings Keras but not PyTorch (a PyTorch user has a build "
    "for their machine); install PyTorch itself, on a machine without a GPU its CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu "
    "(https://pytorch.org/get-started/locally/)"
  ),
  "keras": (
    "pip install 'onnx_optax[interop]' (Keras 3), and set KERAS_BACKEND=jax before anything imports keras"
  ),
}


def require(module: str, caller: str) -> ModuleType:
  """Imports ``module`` or says how to install it, or which backend to set.

  Keras 3 imports its backend when it is imported, TensorFlow by default:
  without TensorFlow, ``import keras`` fails on ``tensorflow`` although Keras
  is installed. That is a missing backend, not a missing Keras, and the
  message says so. The bridges do not set ``KERAS_BACKEND`` themselves: it
  is process-wide, and it decides what every other Keras user in the process
  gets.
  """
  try:
    return importlib.import_module(module)
  except ImportError as error:
    missing = (getattr(error, "name", None) or "").split(".")[0]
    if module == "keras" and missing in ("tensorflow", "torch", "jax"):
      raise ImportError(
        f"{caller} needs keras, which failed to import its backend {missing!r} "
        f"(KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'unset: TensorFlow, the default')}): set "
        f"KERAS_BACKEND=jax (or torch) before anything imports keras, e.g. "
        f"os.environ['KERAS_BACKEND'] = 'jax' at the top of the script"
      ) from error
    how = INSTALL.get(module, "")
    raise ImportError(f"{caller} needs {module}, which is not installed: {how}") from error


def leaf_paths(params: Any) -> tuple[list[Any], jax.tree_util.PyTreeDef, list[str]]:
  """The leaves of ``params``, its structure, and each leaf's path as text."""
  with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
  return (
    [leaf for _, leaf in with_path],
    treedef,
    [jax.tree_util.keystr(path) or "<root>" for path, _ in with_path],
  )


def dtype_name(dtype: Any) -> str:
  """A dtype's NumPy name: ``torch.float32``, ``jnp.float32`` and ``"float32"`` give ``float32``."""
  text = str(dtype)
  try:
    return jnp.dtype(text.removeprefix("torch.") if text.startswith("torch.") else dtype).name
  except TypeError:  # not a NumPy dtype (torch.complex32...): compared as written
    return text.removeprefix("torch.")


def first_field(state: Any) -> Any:
  """The first tensor field of the first rule state in ``state``, or None.

  It has the params' structure, with ``optax.MaskedNode`` at the leaves that
  another label's transform owns: flatten it with ``is_leaf=is_masked`` to
  see every parameter's place.
  """
  is_rule_state = _rule_state_test()
  for node in jax.tree.leaves(state, is_leaf=is_rule_state):
    if is_rule_state(node):
      return node[1]
  return None


def check_leaves(
  leaves: Sequence[Any],
  paths: Sequence[str],
  others: Sequence[tuple[tuple[int, ...], str, str]],
  framework: str,
  *,
  argument: str = "params",
  order: str = "",
) -> None:
  """Checks that the JAX leaves match the other framework's parameters one by one.

  Args:
    leaves: the leaves of the JAX ``params`` (anything with ``shape`` and
      ``dtype``: JAX arrays, ``jax.ShapeDtypeStruct``, NumPy arrays, PyTorch
      tensors), in the other framework's order.
    paths: their pytree paths, for the error messages.
    others: per parameter of the other framework, ``(shape, dtype name,
      description)``, in its order.
    framework: ``"PyTorch"`` or ``"Keras"``, for the error messages.
    argument: the name of the checked argument, for the error messages.
    order: how to list the leaves in the other framework's order (the fix
      that a shape error on permuted leaves needs).

  Raises:
    ValueError: different numbers of leaves, or a shape or dtype that differs
      (nothing is broadcast or cast).
  """
  order = order or (
    f"jax.tree.leaves({argument}) must list the {framework} optimizer's parameters in its order "
    f"(it sorts dict keys: pass a list in that order)"
  )
  if len(leaves) != len(others):
    raise ValueError(
      f"{argument} has {len(leaves)} leaves but the {framework} optimizer has {len(others)} "
      f"parameters; {order}"
    )
  for leaf, path, (shape, dtype, where) in zip(leaves, paths, others):
    if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
      raise TypeError(
        f"{argument}{path} must be an array (or jax.ShapeDtypeStruct), got {type(leaf).__name__}"
      )
    if tuple(leaf.shape) != tuple(shape):
      raise ValueError(
        f"{argument}{path} has shape {tuple(leaf.shape)} but the {framework} {where} has shape "
        f"{tuple(shape)}; {order}"
      )
    if dtype_name(leaf.dtype) != dtype:
      raise ValueError(
        f"{argument}{path} has dtype {dtype_name(leaf.dtype)} but the {framework} {where} "
        f"has dtype {dtype} (nothing is cast; for float64 enable jax_enable_x64)"
      )


class HostPiece(NamedTuple):
  """The part of a larger array that this process holds: ``data`` at ``offset`` in an array of ``shape``.

  What a sharded tensor of another framework leaves on each host (a PyTorch
  ``DTensor``'s local shard, with its place in the global tensor). Its
  ``shape`` and ``dtype`` are the whole array's, so that it is checked like the
  whole array; :func:`put_like` puts each of a target's devices' shards from it.
  """

  data: np.ndarray
  offset: tuple[int, ...]
  shape: tuple[int, ...]

  @property
  def dtype(self) -> Any:
    return self.data.dtype

  def region(self) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` per dimension, in the whole array."""
    return tuple((o, o + n) for o, n in zip(self.offset, self.data.shape))


def bounds(index: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """A shard's index (a tuple of slices, as ``jax.Shard.index``) as ``(start, stop)`` per dimension."""
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape)) + tuple((0, n) for n in shape[len(index) :])


def _inside(inner: tuple[tuple[int, int], ...], outer: tuple[tuple[int, int], ...]) -> bool:
  """Region ``inner`` lies in ``outer`` (an empty region lies anywhere)."""
  if any(start == stop for start, stop in inner):
    return True
  return all(a <= c and d <= b for (c, d), (a, b) in zip(inner, outer))


def missing_region(value: Any, leaf: Any) -> tuple[tuple[int, int], ...] | None:
  """The first region of ``leaf``'s devices on this process that ``value`` does not hold, or None.

  ``value`` is a :class:`HostPiece` or a whole array (which holds every
  region); ``leaf`` the target (a JAX array, or anything with ``shape`` and
  optionally ``sharding``: without one, the whole array is the target).
  """
  if not isinstance(value, HostPiece):
    return None
  shape = tuple(value.shape)
  held = value.region()
  sharding = getattr(leaf, "sharding", None)
  wanted = (
    [bounds(index, shape) for index in sharding.addressable_devices_indices_map(shape).values()]
    if sharding is not None
    else [tuple((0, n) for n in shape)]
  )
  return next((region for region in wanted if not _inside(region, held)), None)


def put_like(value: Any, leaf: Any) -> jax.Array:
  """``value`` as a JAX array with ``leaf``'s dtype, on ``leaf``'s devices.

  Put from the host straight onto ``leaf``'s sharding: each device receives
  its own shard, and no device holds the whole array on the way. ``value`` is
  a NumPy array (the whole array) or a :class:`HostPiece` that holds every
  shard this process's devices need (:func:`missing_region` says which it
  lacks); for a sharding over several processes, each process puts its own
  devices' shards.
  """
  dtype = dtype_name(leaf.dtype)
  sharding = getattr(leaf, "sharding", None)
  piece = value if isinstance(value, HostPiece) else None
  if piece is None and (sharding is None or sharding.is_fully_addressable):
    host = np.asarray(value, dtype=dtype)
    return jax.device_put(host, sharding) if sharding is not None else jnp.asarray(host)
  if piece is None:
    host = np.asarray(value)
    piece = HostPiece(host, (0,) * host.ndim, host.shape)
  shape = tuple(piece.shape)
  missing = missing_region(piece, leaf)
  if missing is not None:  # the callers check first, naming the entry
    raise ValueError(f"this process holds {piece.region()} of an array of shape {shape}, not {missing}")
  if sharding is None:
    return jnp.asarray(np.asarray(piece.data, dtype=dtype))
  arrays = []
  for device, index in sharding.addressable_devices_indices_map(shape).items():
    local = tuple(slice(a - o, b - o) for (a, b), o in zip(bounds(index, shape), piece.offset))
    arrays.append(jax.device_put(np.asarray(piece.data[local], dtype=dtype), device))
  return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def host_region(value: Any, region: tuple[tuple[int, int], ...] | None = None) -> np.ndarray | None:
  """The values of ``value`` in ``region`` (``(start, stop)`` per dimension; None: all), on the host.

  A JAX array spread over several processes is read from this process's own
  shards alone (no collective): None when they do not hold all of
  ``region``. Anything else is read whole, as ``np.asarray``.
  """
  if not isinstance(value, jax.Array) or value.is_fully_addressable:
    host = host_array(value)
    return host if region is None else host[tuple(slice(a, b) for a, b in region)]
  shape = tuple(value.shape)
  region = region if region is not None else tuple((0, n) for n in shape)
  out = np.empty(tuple(b - a for a, b in region), dtype=value.dtype)
  covered = np.zeros(out.shape, bool)
  for shard in value.addressable_shards:
    held = bounds(shard.index, shape)
    common = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(held, region))
    if any(lo >= hi for lo, hi in common):
      continue
    source = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(common, held))
    target = tuple(slice(lo - c, hi - c) for (lo, hi), (c, _) in zip(common, region))
    out[target] = np.asarray(shard.data)[source]
    covered[target] = True
  return out if covered.all() else None


def real_number(name: str, value: Any) -> float:
  """A hyperparameter read from another framework, as a Python float.

  Scalar tensors (PyTorch accepts a tensor ``lr``) are read with their value:
  it is the number the other framework computes with.
  """
  if isinstance(value, bool) or value is None:
    raise TypeError(f"{name} must be a real number, got {value!r}")
  if isinstance(value, numbers.Real):
    return float(value)
  try:
    array = host_array(value)
  except Exception as error:  # noqa: BLE001 -- any failure means: not a number.
    raise TypeError(f"{name} must be a real number, got {type(value).__name__}") from error
  if array.shape != () or not np.issubdtype(array.dtype, np.number):
    raise TypeError(f"{name} must be a real scalar, got {type(value).__name__} {value!r}")
  return float(array)


class Position(NamedTuple):
  """Where one parameter's state lives inside a transform's state."""

  rule_state: Any  # the MomentumState, AdagradState, ... that owns this leaf
  values: tuple[Any, ...]  # the leaf's entry in each tensor field of rule_state


def positions(state: Any, n_leaves: int, kinds: tuple[type, ...]) -> list[Position]:
  """Finds, for every parameter, the rule state that owns it and its tensors.

  ``state`` is what a bridge's transform keeps: one rule state, an
  ``optax.chain`` of stateless transforms and one rule state, or an
  ``optax.multi_transform`` of those, in which each rule state holds
  ``optax.MaskedNode`` at the other labels' leaves.

  Raises:
    TypeError: no rule state of the expected kinds, or one of another kind.
    ValueError: a parameter owned by no rule state or by several, or a rule
      state with another number of leaves.
  """
  is_rule_state = _rule_state_test()
  found = [node for node in jax.tree.leaves(state, is_leaf=is_rule_state) if is_rule_state(node)]
  names = " or ".join(kind.__name__ for kind in kinds)
  if not found:
    raise TypeError(f"state holds no {names}: pass the state of the transform the bridge returned")
  for node in found:
    if not isinstance(node, kinds):
      raise TypeError(f"state holds a {type(node).__name__}, this optimizer needs {names}")
  owners: list[Position | None] = [None] * n_leaves
  for node in found:
    fields = [_entries(tree) for tree in node[1:]]
    if any(len(entries) != n_leaves for entries in fields):
      raise ValueError(
        f"the {type(node).__name__} in state has {len(fields[0])} leaves but the optimizer has "
        f"{n_leaves} parameters"
      )
    for i, entries in enumerate(zip(*fields)):
      if isinstance(entries[0], optax.MaskedNode):
        continue
      if owners[i] is not None:
        raise ValueError(f"parameter {i} has state in two places of state")
      owners[i] = Position(node, entries)
  missing = [i for i, owner in enumerate(owners) if owner is None]
  if missing:
    raise ValueError(f"parameters {missing} have no state in state")
  return owners  # type: ignore[return-value]


def is_masked(node: Any) -> bool:
  """``optax.MaskedNode``: a leaf of a rule state's field that another label's transform owns."""
  return isinstance(node, optax.MaskedNode)


def _entries(tree: Any) -> list[Any]:
  return jax.tree.leaves(tree, is_leaf=is_masked)


def fill(state: Any, treedef: jax.tree_util.PyTreeDef, values: Sequence[Sequence[Any]]) -> Any:
  """``state`` with each rule state's tensor fields replaced by ``values``.

  Args:
    state: a state returned by ``init`` of a transform the bridges build.
    treedef: the structure of the parameters.
    values: per state field after ``count`` (``v``; ``h``; ``m, v``...), one
      value per parameter leaf; leaves a rule state masks keep their
      ``MaskedNode``.
  """

  is_rule_state = _rule_state_test()

  def fill_one(node):
    if not is_rule_state(node):
      return node
    fields = []
    for tree, field_values in zip(node[1:], values):
      entries = treedef.flatten_up_to(tree)
      fields.append(
        treedef.unflatten(
          [
            entry if isinstance(entry, optax.MaskedNode) else value
            for entry, value in zip(entries, field_values)
          ]
        )
      )
    return type(node)(node.count, *fields)

  return jax.tree.map(fill_one, state, is_leaf=is_rule_state)


def counts_placed(state: Any, leaves: Sequence[Any]) -> Any:
  """``state`` with each rule state's ``count`` replicated on the devices of the parameters' sharding.

  ``init`` leaves the count uncommitted on the default device, and a jitted
  step returns it on the parameters' mesh: the second step would see another
  input sharding and compile again. Placed here, the first step's count is
  placed as every later one. The sharding is the first leaf's that has one
  (a ``NamedSharding``: its mesh, replicated; one device: that device);
  leaves without one, or on devices that no replicated sharding names here,
  leave the state as it is.
  """
  sharding = next((s for s in (getattr(leaf, "sharding", None) for leaf in leaves) if s is not None), None)
  if isinstance(sharding, jax.sharding.NamedSharding):
    target: Any = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  elif sharding is not None and len(sharding.device_set) == 1:
    target = sharding
  else:
    return state
  is_rule_state = _rule_state_test()

  def place(node: Any) -> Any:
    if not is_rule_state(node):
      return node
    count = np.asarray(node.count)
    # From the host, each process its own devices: a mesh over several processes too.
    return node._replace(count=jax.make_array_from_callback((), target, lambda _: count))

  return jax.tree.map(place, state, is_leaf=is_rule_state)


def partition(
  transforms_by_label: dict[str, optax.GradientTransformation],
  labels: Sequence[str],
  treedef: jax.tree_util.PyTreeDef,
) -> optax.GradientTransformation:
  """One transform for one label, else ``optax.multi_transform`` over the labels."""
  if len(transforms_by_label) == 1:
    return next(iter(transforms_by_label.values()))
  return optax.multi_transform(transforms_by_label, treedef.unflatten(list(labels)))


def negated(tx: optax.GradientTransformation, maximize: bool) -> optax.GradientTransformation:
  """``tx`` on the negated gradient when ``maximize``: exact, a sign flip."""
  return optax.chain(optax.scale(-1.0), tx) if maximize else tx


def learning_rates(learning_rate: Any, n_groups: int) -> list[Any]:
  """``learning_rate`` as one entry per param group, each a float, a schedule or None.

  None (read each group's own rate), a schedule, or one number (a Python
  number, a NumPy scalar, a 0-d array or tensor) applies to every group; a
  sequence, or a 1-d array or tensor, gives one entry per group. Numbers are
  read with their value (``float(torch.tensor(0.1))`` is the float32 0.1 that
  PyTorch computes with) and checked; an error names ``learning_rate``.
  """
  if learning_rate is None or callable(learning_rate):
    return [learning_rate] * n_groups
  if isinstance(learning_rate, Sequence) and not isinstance(learning_rate, str):
    entries = list(learning_rate)
  else:
    array = host_array(learning_rate)
    if array.ndim == 0:
      return [_checks.learning_rate("learning_rate", real_number("learning_rate", learning_rate))] * n_groups
    if array.ndim != 1:
      raise ValueError(
        f"learning_rate has shape {array.shape}: pass one float or schedule, or one per param group "
        f"(a list, or an array of shape ({n_groups},))"
      )
    entries = list(array)
  if len(entries) != n_groups:
    raise ValueError(
      f"learning_rate has {len(entries)} entries but the optimizer has {n_groups} param "
      f"groups: pass one float or schedule, or one per group"
    )
  return [
    entry
    if entry is None or callable(entry)
    else _checks.learning_rate(f"learning_rate[{g}]", real_number(f"learning_rate[{g}]", entry))
    for g, entry in enumerate(entries)
  ]


def host_array(value: Any) -> np.ndarray:
  """``value`` as a NumPy array on the host: a PyTorch tensor (on any device) is detached and copied."""
  if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch.Tensor, without importing torch
    value = value.detach().cpu()
  return np.asarray(value)


Schedule = Callable[[Any], Any]
