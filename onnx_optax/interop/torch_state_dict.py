"""PyTorch optimizer state dicts (checkpoints on disk) to and from the transforms.

What a PyTorch run leaves on disk is a state dict, not an optimizer:
``torch.save(optimizer.state_dict(), "optimizer.pt")`` (Hugging Face's Trainer
writes exactly this as ``optimizer.pt``, Lightning keeps it under
``"optimizer_states"`` in its ``.ckpt``), keyed by the parameters' indices; or
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` (FSDP2 and
DCP checkpoints), keyed by their fully qualified names. Both have the form::

    {"state": {key: {"step": ..., "exp_avg": ..., ...}, ...},
     "param_groups": [{"lr": ..., ..., "params": [key, ...]}, ...]}

``get_optimizer_state_dict(..., options=StateDictOptions(flatten_optimizer_state_dict=True))``
keeps the same entries under flat keys, ``"state.<name>.<field>"`` and
``"param_groups.<name>.<option>"``: read alike, and written back flattened.
Under FSDP2 (``fully_shard``) the state tensors are DTensors, of which each
rank holds its own rows: each rank reads its shard onto the devices of its
JAX process that hold parts of it, and writes DTensors with the template's
placements and mesh (docs/interop.md, "FSDP2 and DCP").

:func:`from_torch_state_dict` continues such a run in JAX from the state dict
alone (no PyTorch model or optimizer is built), and
:func:`to_torch_state_dict` writes a JAX run back as a state dict that
``optimizer.load_state_dict`` (or ``set_optimizer_state_dict``) accepts. The
hyperparameters, the state and the refusals are those of
:func:`onnx_optax.interop.from_torch`: the two read the same fields through
the same code, and place the parameters with the same
:func:`onnx_optax.interop.torch.mapping` (by name where the state dict has
names: its keys when they are names, else its groups' ``param_names``; by
position otherwise).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from onnx_optax import registry
from onnx_optax.interop import _common, _dtensor, _torch_optim, _torch_placement
from onnx_optax.interop import layout as _layout
from onnx_optax.interop import torch as bridge

__all__ = ["from_torch_state_dict", "to_torch_state_dict"]

_OLDER_DEFAULTS = {
  "maximize": False,
  "foreach": None,
  "differentiable": False,
  "fused": None,
  "capturable": False,
}


class _Param:
  """A parameter of a state dict: its key, and the shape, dtype and device its state has.

  ``template``: a ``DTensor`` of its state (FSDP2), whose placements the written state takes.
  """

  def __init__(self, key: Any, shape: tuple[int, ...], dtype: Any, device: Any, template: Any = None) -> None:
    self.key, self.shape, self.dtype, self.device, self.template = key, shape, dtype, device, template

  def is_complex(self) -> bool:
    return _common.dtype_name(self.dtype).startswith("complex")

  def __repr__(self) -> str:
    return f"state_dict['state'][{self.key!r}]"


def from_torch_state_dict(
  state_dict: Mapping[str, Any] | str | os.PathLike,
  params: Any,
  *,
  optimizer: Any = None,
  learning_rate: Any = None,
  param_names: Sequence[str] | None = None,
  layout: Any = None,
) -> tuple[optax.GradientTransformationExtraArgs, Any]:
  """The transform and state that continue a saved PyTorch optimizer's run in JAX.

  The same as :func:`onnx_optax.interop.from_torch` of an optimizer that
  loaded ``state_dict``: ``tx.update`` then takes the steps PyTorch would have
  taken (float64: equal to about 1e-15 per step), with the same refusals.

  Args:
    state_dict: the path of a file ``torch.save`` wrote it to (read with
      its tensors mapped from the file, ``torch.load(path, mmap=True)``:
      each is copied into its JAX array in turn, and the process's memory
      holds the JAX state alone; docs/interop.md, "Memory"), or an
      optimizer state dict, as ``optimizer.state_dict()``
      returns it and ``torch.load(path, weights_only=True)`` reads it back
      (keyed by index), or as
      ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``
      returns it (keyed by name; also flattened). Tensors may be on any
      device. DTensors (FSDP2) are read from this rank's shard: each of
      ``params``' devices on this process must need only rows this rank
      holds (split the parameters over the processes as FSDP2 does), or
      pass the gathered state dict (``full_state_dict=True``).
    params: the JAX parameters. Placed on the state dict's parameters by
      :func:`onnx_optax.interop.torch.mapping`: keyed by name, a dict whose
      names (nested dicts join their keys with ``'.'``) are the state dict's
      parameter names (its keys, or its groups' ``param_names``); otherwise
      ``jax.tree.leaves(params)`` in the state dict's order (group by group,
      each group's ``params`` in order): a list. The state comes back with
      each leaf's dtype and sharding (a ``NamedSharding`` stays one: each
      device receives its own shard from the host).
    optimizer: a class name the bridges carry (``"SGD"``, ``"AdamW"``, ...: the
      ``torch.optim`` classes of docs/interop.md's table), or the ``torch.optim``
      class; None to infer it from the param groups' keys, which tell them
      apart except an ``Adam`` from an ``AdamW`` of a PyTorch without
      ``decoupled_weight_decay``. A class the groups contradict is refused
      (``"AdamW"`` for groups with ``decoupled_weight_decay=False``: an Adam's
      run; ``"Adam"`` keeps the file's flag).
    learning_rate: as for :func:`~onnx_optax.interop.from_torch` (a
      scheduler's groups carry ``initial_lr``: pass the rate or schedule).
    param_names: the names of the parameters of a state dict keyed by
      index, in its order (group by group): what
      :func:`~onnx_optax.interop.torch_param_names` returns for the
      optimizer that saved it (a Trainer's ``optimizer.pt``, a Lightning
      checkpoint's ``optimizer_states``). ``params`` keyed by those names is
      then placed by name, so parameters of one shape cannot trade places.
    layout: None, or a :class:`~onnx_optax.interop.layout.Layout`, as for
      :func:`~onnx_optax.interop.from_torch`: ``params`` are one's own model's, the state
      follows them. The state dict must name its parameters (its keys, its groups'
      ``param_names``, or ``param_names``).

  Returns:
    ``(tx, state)``, as :func:`~onnx_optax.interop.from_torch` returns them.

  Raises:
    TypeError: a state dict of another optimizer, or one it cannot tell.
    ValueError: param groups that do not cover the state, a name missing on
      either side (or a leaf too many: named, and two leaves that are equal
      element for element, a tied weight, too), a state tensor whose shape
      or dtype differs from its parameter's, a ``step`` that is not a
      count, a DTensor shard that lacks rows this process's devices need,
      and every refusal of :func:`~onnx_optax.interop.from_torch`, each
      naming the entry.

  Example:
    >>> import io, torch, jax.numpy as jnp
    >>> from onnx_optax.interop import from_torch_state_dict
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> opt = torch.optim.AdamW([w], lr=0.1)
    >>> w.grad = torch.tensor([0.5, -0.5]); opt.step()
    >>> buffer = io.BytesIO(); torch.save(opt.state_dict(), buffer); _ = buffer.seek(0)
    >>> saved = torch.load(buffer, weights_only=True)  # the file alone
    >>> tx, state = from_torch_state_dict(saved, [jnp.asarray(w.detach().numpy())])
    >>> type(state).__name__, int(state.count)
    ('PyTorchAdamState', 1)
  """
  torch = _torch_optim.torch()
  if isinstance(state_dict, (str, os.PathLike)):
    state_dict = _dtensor.load(torch, state_dict)
  state_dict, _ = _unflattened(state_dict, "state_dict")
  kind, groups, entries, keys, names = _read(state_dict, optimizer, "state_dict")
  names = _given_names(param_names, keys, names, "state_dict")
  own = params
  if layout is not None:
    _named(names, "from_torch_state_dict")
    # Only their shapes and dtypes stand in for PyTorch's parameters here: carry maps the values.
    params = jax.eval_shape(layout.to_torch, params)
  leaves, _, paths = _common.leaf_paths(params)
  perm = _placed(params, leaves, paths, keys, names)
  stand_ins = {}
  for i, key in enumerate(keys):
    leaf = leaves[perm[i]]
    if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
      raise TypeError(
        f"params{paths[perm[i]]} must be an array (or jax.ShapeDtypeStruct), got {type(leaf).__name__}"
      )
    stand_ins[key] = _Param(key, tuple(leaf.shape), leaf.dtype, "cpu")
  view_groups = _groups(kind, groups, stand_ins, names)
  # The groups first: an option no rule has (amsgrad=True) is the reason, not the state it keeps.
  for g, group in enumerate(view_groups):
    _torch_optim.check_group(g, group, kind, source="state_dict")
  for i, key in enumerate(keys):
    leaf, path = leaves[perm[i]], paths[perm[i]]
    _check_entry(kind, key, entries.get(key, {}), tuple(leaf.shape), _common.dtype_name(leaf.dtype), path)
  view = _torch_optim.View(
    kind,
    view_groups,
    {stand_ins[key]: dict(entries[key]) for key in keys if key in entries},
    None,
    source="state_dict",
  )
  return bridge.carry(torch, view, own, learning_rate, layout=layout)


def _named(names: Sequence[Any] | None, call: str) -> None:
  """Refuses a layout beside a state dict keyed by index with no names (the layout names them)."""
  if names is None:
    raise ValueError(
      f"{call}(..., layout=...): the layout names PyTorch's parameters, and this state dict keys them "
      f"by index with no names: pass param_names=torch_param_names(optimizer, model), the names of the "
      f"optimizer that saved it"
    )


def to_torch_state_dict(
  state: Any,
  like: Mapping[str, Any] | str | os.PathLike,
  *,
  optimizer: Any = None,
  learning_rate: Any = None,
  param_names: Sequence[str] | None = None,
  copy: bool = True,
  layout: Any = None,
) -> dict[str, Any]:
  """A state dict of a JAX run, to load with ``optimizer.load_state_dict`` (or ``set_optimizer_state_dict``).

  ``like`` is the template: the state dict the run came from (read back
  with ``torch.load``), or ``optimizer.state_dict()`` of an optimizer built
  the same way. The result has its param groups (hyperparameters copied),
  its keys (indices or names; flat keys for a flattened ``like``) and,
  where ``like`` has an entry, its tensors' dtypes and devices, and their
  placements and mesh where they are DTensors (each rank writes its own rows,
  from the state's shards on this process); ``like`` is not modified. After loading it,
  ``optimizer.step()`` continues the JAX run: it is the next ``tx.update``
  with the same gradients. ``state`` is placed on the parameters as
  :func:`onnx_optax.interop.to_torch` places it (by name where ``like`` has
  names, or ``param_names`` gives them, and the state's trees are dicts,
  else by position). Weights are not part of an optimizer's state dict: save
  them with the model's.

  Each group's ``lr`` is the rate of PyTorch's next step: ``learning_rate``,
  or the template's when there is no scheduler. A template whose groups
  carry ``initial_lr`` (a scheduler sets their ``lr``) needs
  ``learning_rate``: the template's rate is the schedule's at the template's
  step, not at the state's. The scheduler's own state goes with it:
  :func:`~onnx_optax.interop.to_torch_scheduler_state_dict` writes it and
  gives the rates (its ``_last_lr``);
  :func:`~onnx_optax.interop.to_trainer_checkpoint` and
  :func:`~onnx_optax.interop.to_lightning_checkpoint` write both.

  Args:
    state: the state of a transform returned by :func:`from_torch_state_dict`
      or :func:`~onnx_optax.interop.from_torch`, after any number of updates.
    like: the template state dict, or the path of a file ``torch.save``
      wrote it to (read mapped, as :func:`from_torch_state_dict` reads one).
    optimizer: as for :func:`from_torch_state_dict`.
    learning_rate: None (the template's ``lr``), or the rate of PyTorch's
      next step: a number (a float, a NumPy or JAX scalar, a 0-d tensor), or
      a sequence with one per param group. A schedule is not a rate:
      evaluate it at the number of JAX updates, ``schedule(m)``.
    param_names: as for :func:`from_torch_state_dict`.
    copy: True: each tensor is a copy of its JAX array, made once. False:
      a JAX array on one CPU device (not a DTensor's shard) is shared with
      its tensor through DLPack, no copy: for ``torch.save`` right away
      (docs/interop.md, "Memory"). JAX takes its arrays as immutable: do not
      load those tensors into an optimizer that steps (PyTorch writes its
      state in place) while the JAX state is still in use.
    layout: None, or the :class:`~onnx_optax.interop.layout.Layout` that
      :func:`from_torch_state_dict` took: ``state`` is one's own model's,
      inverted onto the template's parameter names.

  Returns:
    ``{"state": ..., "param_groups": ...}`` with PyTorch tensors.

  Raises:
    TypeError, ValueError: as :func:`~onnx_optax.interop.to_torch`, and for
      a template that is not an optimizer state dict.

  Example:
    >>> import torch, jax.numpy as jnp, optax
    >>> from onnx_optax.interop import from_torch_state_dict, to_torch_state_dict
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    >>> saved = opt.state_dict()
    >>> params = [jnp.asarray(w.detach().numpy())]
    >>> tx, state = from_torch_state_dict(saved, params)
    >>> updates, state = tx.update([jnp.array([1.0, -1.0])], state, params)
    >>> opt.load_state_dict(to_torch_state_dict(state, saved))
    >>> opt.state[w]["momentum_buffer"]
    tensor([ 1., -1.])
  """
  torch = _torch_optim.torch()
  if isinstance(like, (str, os.PathLike)):
    like = _dtensor.load(torch, like)
  like, flat = _unflattened(like, "like")
  kind, groups, entries, keys, names = _read(like, optimizer, "like")
  names = _given_names(param_names, keys, names, "like")
  if layout is not None:
    _named(names, "to_torch_state_dict")
    state = _layout.state_to_torch(layout, state)
  rates = _written_rates(groups, learning_rate)
  # Each parameter's state value, placed as to_torch places it: its shape and
  # dtype stand in for a parameter that has no entry in like yet.
  owners = _common.positions(state, len(keys), _torch_optim.states(kind))
  perm = _torch_placement.mapping(
    _common.first_field(state), names, "state", is_leaf=_common.is_masked, source="state_dict"
  )
  stand_ins = {}
  for i, key in enumerate(keys):
    # The parameter's shape and dtype: a field's of the parameter's shape and dtype, else
    # registry.param_shape's of the fields' (the factored ones') and an existing field's dtype.
    fields, values = _torch_optim.twins()[kind].fields, owners[perm[i]].values
    own = registry.param_shape(fields, values)
    value = next((v for f, v in zip(fields, values) if not f.dtypes and own and f.exists_for(own)), values[0])
    alike = {f.name for f in fields if f.like_params}
    placed = [v for v in entries.get(key, {}).values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    held = [
      v for k, v in entries.get(key, {}).items() if k in alike and isinstance(v, torch.Tensor) and v.dim() > 0
    ]
    if held:
      shape, dtype = tuple(held[0].shape), held[0].dtype
    else:
      shape, dtype = (tuple(value.shape) if own is None else own), value.dtype
    device = placed[0].device if placed else "cpu"
    template = held[0] if held and _dtensor.is_dtensor(held[0]) else None
    stand_ins[key] = _Param(key, shape, dtype, device, template)
  view_groups = _groups(kind, groups, stand_ins, names)
  writes = bridge.checked_writes(
    torch, kind, view_groups, state, source="state_dict", copy=copy, layout=layout
  )
  out_state: dict[Any, dict] = {}
  for p, group, count, tensors in writes:
    slot = dict(entries.get(p.key, {}))  # a copy: like keeps its tensors
    _torch_optim.write(torch, kind, slot, group, p, count, tensors)
    if slot:
      out_state[p.key] = slot
  out_groups = [
    {
      **group,
      "params": list(group["params"]),
      **({} if rate is None else {"lr": _like_lr(torch, rate, group["lr"])}),
    }
    for group, rate in zip(groups, rates)
  ]
  out = {"state": out_state, "param_groups": out_groups}
  return _flattened(out) if flat else out


def _placed(params: Any, leaves: list, paths: list[str], keys: list, names: list | None) -> list[int]:
  """The mapping of the params' leaves on the state dict's parameters, or a refusal naming the leaves."""
  if names is not None:
    try:
      perm = _torch_placement.mapping(params, names, "params", source="state_dict")
    except ValueError as error:
      raise ValueError(f"{error}{_tied(leaves, paths) if len(leaves) > len(keys) else ''}") from None
  if len(leaves) != len(keys):
    positional = not any(path.startswith("['") for path in paths)
    if len(leaves) < len(keys):
      which = f"placed by position, the last {len(keys) - len(leaves)} of them have no leaf"
    elif positional:
      more = len(leaves) - len(keys) - 1
      which = f"placed by position, params{paths[len(keys)]}" + (
        f" and the {more} leaves after it have no parameter" if more else " has no parameter"
      )
    else:
      shown = _torch_placement.few(paths, 8, show=lambda path: f"params{path}")
      which = (
        f"the state dict keys them by index, with no names to tell which of params' leaves {shown} is "
        f"not one of them"
      )
    raise ValueError(
      f"params has {len(leaves)} leaves but the state dict's param groups list {len(keys)} parameters: "
      f"{which}{_tied(leaves, paths) if len(leaves) > len(keys) else ''}; pass one leaf per parameter"
    )
  return _torch_placement.mapping(params, names, "params", source="state_dict") if names is None else perm


def _tied(leaves: list, paths: list[str]) -> str:
  """What to say of a params tree with more leaves than parameters: a tied weight listed twice, by name
  where two leaves are equal element for element."""
  hint = (
    "a model's state_dict() lists a tied weight (GPT-2's lm_head.weight is its wte.weight) under each of "
    "its names; the optimizer lists it once, as dict(model.named_parameters()) does"
  )
  same: dict[tuple, list[tuple[np.ndarray, str]]] = {}
  for leaf, path in zip(leaves, paths):
    if isinstance(leaf, np.ndarray) or (isinstance(leaf, jax.Array) and leaf.is_fully_addressable):
      host = np.asarray(leaf)
      same.setdefault((host.shape, host.dtype.str, hash(host.tobytes())), []).append((host, path))
  equal = [[path for host, path in group if np.array_equal(host, group[0][0])] for group in same.values()]
  equal = [group for group in equal if len(group) > 1]
  if not equal:
    return f" ({hint})"
  listed = "; ".join(" and ".join(f"params{path}" for path in group) for group in equal[:3])
  return f" ({listed} are equal element for element: {hint})"


# Flattened DCP state dicts (StateDictOptions(flatten_optimizer_state_dict=True)): these prefixes.
_FLAT_STATE, _FLAT_GROUPS = "state.", "param_groups."


def _unflattened(state_dict: Any, argument: str) -> tuple[Any, bool]:
  """A flattened DCP optimizer state dict in the nested form (and True), or ``state_dict`` (and False).

  ``flatten_optimizer_state_dict=True`` keeps ``state.<name>.<field>`` and
  ``param_groups.<name>.<option>`` per parameter: the groups are not kept, and
  are read back as the runs of parameters (in their order) with equal options.
  """
  if not isinstance(state_dict, Mapping):
    return state_dict, False
  keys = list(state_dict)
  # A nested state dict's keys, "state" and "param_groups", have no dot: it is returned as it is.
  if not keys or not all(isinstance(k, str) and k.startswith((_FLAT_STATE, _FLAT_GROUPS)) for k in keys):
    return state_dict, False
  options: dict[str, dict] = {}
  for key in keys:
    if key.startswith(_FLAT_GROUPS):
      name, _, option = key[len(_FLAT_GROUPS) :].rpartition(".")
      options.setdefault(name, {})[option] = state_dict[key]
  state: dict[str, dict] = {}
  for key in keys:
    if key.startswith(_FLAT_STATE):
      name, _, field = key[len(_FLAT_STATE) :].rpartition(".")
      if name not in options:
        raise ValueError(
          f"{argument}[{key!r}] (a flattened DCP state dict, flatten_optimizer_state_dict=True) is the "
          f"state of no parameter its 'param_groups.<name>.<option>' keys list: a nested state (another "
          f"optimizer's) or an edited state dict"
        )
      state.setdefault(name, {})[field] = state_dict[key]
  groups: list[dict] = []
  for name, group_options in options.items():
    if groups and _same_options(groups[-1], group_options):
      groups[-1]["params"].append(name)
    else:
      groups.append({**group_options, "params": [name]})
  return {"state": state, "param_groups": groups}, True


def _same_options(group: dict, options: dict) -> bool:
  if set(group) - {"params"} != set(options):
    return False
  return all(group[key] is value or bool(group[key] == value) for key, value in options.items())


def _flattened(state_dict: dict[str, Any]) -> dict[str, Any]:
  """The flattened form of a nested state dict, as ``flatten_optimizer_state_dict=True`` writes it."""
  out = {
    f"{_FLAT_STATE}{name}.{field}": value
    for name, entry in state_dict["state"].items()
    for field, value in entry.items()
  }
  for group in state_dict["param_groups"]:
    for name in group["params"]:
      out.update({f"{_FLAT_GROUPS}{name}.{key}": value for key, value in group.items() if key != "params"})
  return out


def _given_names(
  param_names: Sequence[str] | None, keys: list, names: list | None, argument: str
) -> list | None:
  """The parameters' names: ``param_names`` where given (checked against the state dict's), else its own."""
  if param_names is None:
    return names
  if isinstance(param_names, str) or not isinstance(param_names, Sequence):
    raise TypeError(
      f"param_names must be a list of names, one per parameter in {argument}'s order (what "
      f"torch_param_names(optimizer, model) returns), got {type(param_names).__name__}"
    )
  given = list(param_names)
  if len(given) != len(keys) or not all(isinstance(name, str) for name in given):
    raise ValueError(
      f"param_names has {len(given)} entries but {argument}'s param groups list {len(keys)} parameters: "
      f"pass one name (a str) per parameter, in the groups' order (torch_param_names(optimizer, model))"
    )
  twice = sorted(name for name, n in collections.Counter(given).items() if n > 1)
  if twice:
    raise ValueError(f"param_names names several parameters {_torch_placement.few(twice)}: each name once")
  if names is not None and names != given:
    i = next(i for i, (a, b) in enumerate(zip(names, given)) if a != b)
    raise ValueError(
      f"param_names[{i}] is {given[i]!r}, but {argument} names its parameter {keys[i]!r} {names[i]!r}: "
      f"a state dict that has names is placed by its own (leave param_names out)"
    )
  return given


def _written_rates(groups: list[dict], learning_rate: Any) -> list[Any]:
  """Each group's ``lr`` to write (None: the template's), refusing a scheduler's template without a rate."""
  if learning_rate is None:
    if any("initial_lr" in group for group in groups):
      current = [
        _common.real_number(f"like['param_groups'][{g}]['lr']", group["lr"]) for g, group in enumerate(groups)
      ]
      value = repr(current[0]) if len(set(current)) == 1 else "[" + ", ".join(map(repr, current)) + "]"
      raise ValueError(
        f"like's param groups have 'initial_lr': a learning-rate scheduler sets their 'lr', which is the "
        f"rate at like's step, not at the state's. Pass learning_rate=, the rate of PyTorch's next step: "
        f"the schedule you gave from_torch_state_dict evaluated at the number m of JAX updates "
        f"(learning_rate=schedule(m)), or the scheduler's own, which "
        f"to_torch_scheduler_state_dict(scheduler_state_dict, like, steps=m) writes with the scheduler's "
        f"state (learning_rate=its['_last_lr']); to_trainer_checkpoint and to_lightning_checkpoint write "
        f"both. learning_rate={value} keeps like's"
      )
    return [None] * len(groups)
  entries = _common.learning_rates(learning_rate, len(groups))
  for g, entry in enumerate(entries):
    if callable(entry):
      where = "learning_rate" if callable(learning_rate) else f"learning_rate[{g}]"
      raise TypeError(
        f"{where} is a schedule; to_torch_state_dict writes a rate, that of PyTorch's next step: evaluate "
        f"the schedule at the number m of JAX updates, {where}=schedule(m)"
      )
  return [float(entry) for entry in entries]


def _like_lr(torch: Any, rate: float, old: Any) -> Any:
  """``rate`` as the template's ``lr`` holds it: a Python float, or a tensor of its dtype and device."""
  if isinstance(old, torch.Tensor):
    return torch.tensor(rate, dtype=old.dtype, device=old.device)
  return rate


def _read(state_dict: Any, optimizer: Any, argument: str) -> tuple[str, list[dict], dict, list, list | None]:
  """The kind, the param groups, the entries, the parameters' keys in order and their names (or None)."""
  if not isinstance(state_dict, Mapping) or "state" not in state_dict or "param_groups" not in state_dict:
    found = sorted(map(str, state_dict)) if isinstance(state_dict, Mapping) else type(state_dict).__name__
    raise TypeError(
      f"{argument} must be an optimizer state dict ({{'state': ..., 'param_groups': ...}}, what "
      f"optimizer.state_dict() returns), got {found}; a Lightning checkpoint keeps it under "
      f"ckpt['optimizer_states'][0], a Trainer directory in optimizer.pt"
    )
  groups, entries = list(state_dict["param_groups"]), dict(state_dict["state"])
  for g, group in enumerate(groups):
    if not isinstance(group, Mapping) or not isinstance(group.get("params"), Sequence):
      raise TypeError(f"{argument}['param_groups'][{g}] must be a dict with a 'params' list")
  keys = [key for group in groups for key in group["params"]]
  by_name = all(isinstance(key, str) for key in keys)
  if not by_name and not all(isinstance(key, int) and not isinstance(key, bool) for key in keys):
    raise TypeError(
      f"{argument}'s param groups list parameters {_torch_placement.few(keys)}: a state dict keys them "
      f"all by index (optimizer.state_dict()) or all by name (get_optimizer_state_dict)"
    )
  twice = [key for key, n in collections.Counter(keys).items() if n > 1]
  if twice:
    raise ValueError(f"{argument}'s param groups list a parameter twice: {_torch_placement.few(twice)}")
  listed = set(keys)
  orphans = [key for key in entries if key not in listed]
  if orphans:
    raise ValueError(
      f"{argument}['state'] has entries {_torch_placement.few(orphans)} that no param group lists: the "
      f"groups do not cover the state (a state dict of another optimizer, or edited)"
    )
  kind = _kind(groups, optimizer, argument)
  names: list | None = keys if by_name else None
  if not by_name and groups and all("param_names" in group for group in groups):
    names = [str(name) for group in groups for name in group["param_names"]]
  return kind, groups, entries, keys, names


def _fits(kind: str, groups: list[dict]) -> bool:
  """The param groups have the class's signature and no key it lacks."""
  declared = _torch_optim.declared(kind)
  allowed = declared.keys() | {"params", "param_names"}
  return bool(groups) and all(declared.signature <= set(group) <= allowed for group in groups)


def _contradicts(kind: str, groups: list[dict]) -> tuple[int, str, Any] | None:
  """The first group option that says the state dict is not the class's: one the class fixes
  (AdamW's ``decoupled_weight_decay=True``), written otherwise. ``(g, key, value)``."""
  for key, value in _torch_optim.declared(kind).fixed.items():
    for g, group in enumerate(groups):
      if key in group and group[key] != value:
        return g, key, group[key]
  return None


def _kind(groups: list[dict], optimizer: Any, argument: str) -> str:
  """The optimizer's class: given (and not contradicted by the groups), or told by the groups' keys.

  Classes whose groups have the same keys (Adam and AdamW) are told apart by the options one
  of them fixes: the class whose fixed options every group has, else the one that fixes none;
  a group without such a key (a PyTorch older than the option) tells neither.
  """
  kinds = list(_torch_optim.twins())
  fitting = [kind for kind in kinds if _fits(kind, groups)]
  agreeing = [kind for kind in fitting if _contradicts(kind, groups) is None]
  fixed = {key for kind in fitting for key in _torch_optim.declared(kind).fixed}
  told = all(key in group for key in fixed for group in groups)
  # The most specific: a class that fixes an option every group has, over one that fixes none.
  ranked = sorted(agreeing, key=lambda kind: -len(_torch_optim.declared(kind).fixed))
  inferred = None
  if told and ranked and (len(ranked) == 1 or len(_torch_optim.declared(ranked[0]).fixed) > 0):
    inferred = ranked[0]
  if optimizer is None:
    if inferred is None:
      keys = sorted(set().union(*map(set, groups)) - {"params"}) if groups else []
      several = len(fitting) > 1
      raise TypeError(
        f"{argument}'s param groups (options {keys}) are not those of "
        f"torch.optim.{_torch_optim.listed(kinds, 'or')} in PyTorch 2.13"
        + (
          f": {_torch_optim.listed([repr(k) for k in fitting], 'or')}'s without "
          f"{_torch_optim.listed([repr(k) for k in sorted(fixed)], 'or')}; pass optimizer="
          f"{_torch_optim.listed([repr(k) for k in fitting], 'or')}"
          if several
          else ""
        )
      )
    return inferred
  given = getattr(optimizer, "__name__", optimizer)
  if given not in kinds:
    raise TypeError(
      f"optimizer must be {_torch_optim.listed([repr(k) for k in kinds], 'or')} (or the class), "
      f"got {optimizer!r}"
    )
  if fitting and given not in fitting:
    raise TypeError(f"optimizer={given!r}, but {argument}'s param groups are torch.optim.{fitting[0]}'s")
  contradiction = _contradicts(given, groups)
  if contradiction is not None:
    g, key, value = contradiction
    others = [kind for kind in agreeing if kind != given]
    advice = f"pass optimizer={others[0]!r}, the file's class, or " if others else ""
    raise ValueError(
      f"optimizer={given!r}, but {argument}['param_groups'][{g}][{key!r}] is {value!r}: torch.optim."
      f"{given} runs with {key}={_torch_optim.declared(given).fixed[key]!r}, so the file is not its "
      f"run. To continue the file's run, {advice}leave optimizer=None; to change the run to "
      f"{given}'s, set {key!r} to {_torch_optim.declared(given).fixed[key]!r} in every group of "
      f"{argument}['param_groups'] first"
    )
  return given


def _entry(kind: str) -> frozenset[str]:
  """The keys of a parameter's state entry: the twin's fields (PyTorch's names), and ``step`` where kept."""
  fields = {field.name for rule in _torch_optim.twins()[kind].family() for field in rule.fields}
  return frozenset(fields | ({"step"} if _torch_optim.declared(kind).step else set()))


def _check_entry(kind: str, key: Any, entry: Mapping[str, Any], shape: tuple, dtype: str, path: str) -> None:
  """A state entry's tensors have the parameter's shape and dtype; its ``step`` is a count."""
  where = f"state_dict['state'][{key!r}]"
  keeps = _entry(kind)
  # Fields kept only beside other ranks (Field.exists) are not missing.
  elsewhere = {f.name for f in _torch_optim.twins()[kind].fields if not f.exists_for(shape)}
  missing = (
    sorted(keeps - set(_torch_optim.declared(kind).optional) - elsewhere - set(entry)) if entry else []
  )
  if missing:
    raise ValueError(
      f"{where} has no {missing}: torch.optim.{kind} keeps {sorted(keeps)} for every "
      f"parameter it has stepped (a truncated or edited checkpoint)"
    )
  unknown = sorted(set(entry) - keeps)
  if unknown:
    raise ValueError(
      f"{where} has {unknown}, which torch.optim.{kind} does not keep (another optimizer's state): "
      f"no rule carries it"
    )
  for field, value in entry.items():
    if field == "step":
      number = _common.real_number(f"{where}['step']", value)
      if number != int(number) or number < 0:
        raise ValueError(f"{where}['step'] is {number}, not a count of updates")
      continue
    if value is None:  # SGD's momentum_buffer of a parameter without momentum
      continue
    declared = next((f for f in _torch_optim.twins()[kind].fields if f.name == field), None)
    if declared is not None and not declared.like_params:  # a shape or dtype of its own
      _torch_optim.check_field(declared, value, shape, dtype, f"{where}[{field!r}]")
      continue
    if tuple(value.shape) != shape or _common.dtype_name(value.dtype) != dtype:
      raise ValueError(
        f"{where}[{field!r}] has shape {tuple(value.shape)} and dtype {_common.dtype_name(value.dtype)}, "
        f"but its parameter params{path} has shape {shape} and dtype {dtype} (nothing is cast: "
        f"for float64 enable jax_enable_x64)"
      )


def _groups(kind: str, groups: list[dict], stand_ins: dict, names: list | None) -> list[dict]:
  """The param groups with stand-ins for ``params`` (and the names, when there are names).

  Options an older PyTorch saved no key for take the behaviour it had (the class's
  :attr:`~onnx_optax.registry.TorchOptimizer.older`: an Adam's file without
  ``decoupled_weight_decay`` couples its decay), and the options the class fixes take its value
  (:attr:`~onnx_optax.registry.TorchOptimizer.fixed`: AdamW's flag, refused beforehand where a
  group says otherwise).
  """
  out, k = [], 0
  for group in groups:
    members = [stand_ins[key] for key in group["params"]]
    # Options an older PyTorch saved no key for: the behaviour it had (none of them but maximize
    # changes the arithmetic, and maximize did not exist).
    declared = _torch_optim.declared(kind)
    older = {key: value for key, value in _OLDER_DEFAULTS.items() if key in declared.keys()}
    view = {**older, **declared.older, **group, **declared.fixed, "params": members}
    if names is not None:
      view["param_names"] = names[k : k + len(members)]
    out.append(view)
    k += len(members)
  return out
