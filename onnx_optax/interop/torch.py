"""``torch.optim.SGD``, ``Adagrad``, ``Adam`` and ``AdamW`` state to and from the transforms.

PyTorch's ``SGD`` is ONNX ``Momentum``, its ``Adagrad`` is ONNX ``Adagrad``
and its ``Adam`` / ``AdamW`` are ONNX Runtime's ``AdamWOptimizer`` with
``adam_mode=0`` in exact arithmetic (docs/spec.md; notebook 02 shows the
equalities over 500 float64 steps). In float32 each evaluates its rule in its
own order, so :func:`from_torch` returns the PyTorch-order twins of those
rules, :func:`onnx_optax.pytorch_sgd`, :func:`onnx_optax.pytorch_adagrad`,
:func:`onnx_optax.pytorch_adam` and :func:`onnx_optax.pytorch_adamw`
(docs/spec.md, "PyTorch-order twins"): a carried float32 run stays within
PyTorch's own spread (docs/interop.md). Their states hold PyTorch's tensors
under its names, and their ``count`` is PyTorch's ``step``:

==========================  =============================================
``torch.optim.SGD``         :func:`onnx_optax.pytorch_sgd`
==========================  =============================================
``lr``, ``momentum``,       the same names
``dampening``,
``weight_decay``,
``nesterov``
``maximize``                the gradient negated first (``optax.scale(-1)``)
``momentum_buffer``         ``state.momentum_buffer``
no ``momentum_buffer``      ``state.count == 0`` (the first update)
==========================  =============================================

SGD keeps no step count: a buffer means ``count > 0``, and every ``count > 0``
is the same update, so a parameter with a buffer gets ``count = 1``.
``momentum = 0`` (plain SGD, where PyTorch keeps no buffer) keeps a zero
buffer that it never reads.

==============================  =========================================
``torch.optim.Adagrad``         :func:`onnx_optax.pytorch_adagrad`
==============================  =========================================
``lr``, ``lr_decay``, ``eps``,  the same names
``weight_decay``
``maximize``                    the gradient negated first
``sum``                         ``state.sum`` (``initial_accumulator_value``
                                is its starting value)
``step``                        ``state.count``
==============================  =========================================

================================  =========================================
``torch.optim.Adam``, ``AdamW``   :func:`onnx_optax.pytorch_adam`
================================  =========================================
``lr``, ``betas``, ``eps``,       the same names
``weight_decay``,
``decoupled_weight_decay``
``maximize``                      the gradient negated first
``exp_avg``, ``exp_avg_sq``       ``state.exp_avg``, ``state.exp_avg_sq``
``step`` (updates done)           ``state.count``; no state yet is
                                  ``count = 0`` with zero moments
================================  =========================================

A tensor ``lr`` (PyTorch accepts one) is read with its value, the number
PyTorch computes with, and carried as a Python float ``lr`` is: SGD's always,
Adagrad's unless it is a float32 (or narrower) tensor and ``lr_decay != 0``,
since PyTorch then computes ``lr / (1 + (step - 1) * lr_decay)`` in the
tensor's dtype. Refused,
because no rule is exact for them: that Adagrad case; Adam's and AdamW's
``amsgrad=True``, their ``lr``, ``betas``, ``eps`` or ``weight_decay`` as
tensors (PyTorch computes their step size in the tensor's dtype), and their
complex parameters. :func:`to_torch` also loads the states of the spec-order
rules (``momentum``, ``adagrad``, ``ort_adamw``, whose count is PyTorch's
``step`` plus one), with the same hyperparameters.

FSDP2's parameters and state are DTensors: each rank holds its own rows
(``Shard(0)``). :func:`torch_params` and :func:`from_torch` read each rank's
shard onto the devices of this process that hold parts of it (the JAX
parameters split over the processes as FSDP2 splits them), and refuse a
target whose devices here need rows this rank does not hold; :func:`to_torch`
writes DTensors with the parameter's placements, each rank its own rows.

Parameters that need different transforms (param groups with different
hyperparameters, SGD parameters with and without a buffer, Adagrad and Adam
parameters at different steps) get one transform per label under
``optax.multi_transform``; when one transform covers every parameter, it is
returned alone. Either way every transform's ``initial_count`` is the
``count`` it starts from, so a ``learning_rate`` schedule sees 0 at the first
update in JAX.

Importing this module does not import PyTorch; the functions do.
"""

from __future__ import annotations

import collections
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import optax

from onnx_optax import _checks, transforms
from onnx_optax.interop import _common

__all__ = ["from_torch", "mapping", "to_torch", "torch_params"]

_SGD_KEYS = frozenset(
  {
    "params",
    "lr",
    "momentum",
    "dampening",
    "weight_decay",
    "nesterov",
    "maximize",
    "foreach",
    "differentiable",
    "fused",
    "param_names",
    "initial_lr",
  }
)
_ADAGRAD_KEYS = frozenset(
  {
    "params",
    "lr",
    "lr_decay",
    "eps",
    "weight_decay",
    "initial_accumulator_value",
    "foreach",
    "maximize",
    "differentiable",
    "fused",
    "param_names",
    "initial_lr",
  }
)
# torch.optim.Adagrad keeps ``step`` as a float32 tensor: it counts exactly up
# to 2**24, and PyTorch's own ``step += 1`` stops there.
_FLOAT32_EXACT_COUNT = 2**24

_ADAM_KEYS = frozenset(
  {
    "params",
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "amsgrad",
    "maximize",
    "foreach",
    "capturable",
    "differentiable",
    "fused",
    "decoupled_weight_decay",
    "param_names",
    "initial_lr",
  }
)
_KEYS = {"SGD": _SGD_KEYS, "Adagrad": _ADAGRAD_KEYS, "Adam": _ADAM_KEYS, "AdamW": _ADAM_KEYS}
# The twins' states (what from_torch returns), then the spec-order rules' (to_torch loads both).
_STATES = {
  "SGD": (transforms.PyTorchSGDState, transforms.MomentumState),
  "Adagrad": (transforms.PyTorchAdagradState, transforms.AdagradState),
  "Adam": (transforms.PyTorchAdamState, transforms.OrtAdamWState),
  "AdamW": (transforms.PyTorchAdamState, transforms.OrtAdamWState),
}


def _torch() -> Any:
  return _common.require("torch", "onnx_optax.interop.torch")


def from_torch(
  optimizer: Any,
  params: Any,
  *,
  learning_rate: Any = None,
) -> tuple[optax.GradientTransformationExtraArgs, Any]:
  """The transform and state that continue a PyTorch optimizer's run in JAX.

  ``optimizer`` may have taken any number of steps, zero included. With
  ``tx, state = from_torch(optimizer, params)``, each
  ``updates, state = tx.update(grads, state, params)`` followed by
  ``params = optax.apply_updates(params, updates)`` is the
  ``optimizer.step()`` that PyTorch would have taken with the same gradients
  (float64: equal to about 1e-15 per step; float32: within the rounding of
  the two implementations, see docs/interop.md). The mapping is in the module
  docstring.

  PyTorch skips parameters whose ``grad`` is None; a transform updates every
  leaf it gets a gradient for. Weights are not moved by this function: copy
  them with :func:`torch_params`.

  Args:
    optimizer: a ``torch.optim.SGD``, ``Adagrad``, ``Adam`` or ``AdamW``.
    params: the JAX parameters (a pytree of arrays, e.g. from
      :func:`torch_params`), placed on the optimizer's parameters by
      :func:`~onnx_optax.interop.torch.mapping`: for an optimizer built from
      ``model.named_parameters()``, a dict keyed by those names (nested dicts
      join their keys with ``'.'``), matched by name in any order; otherwise
      ``jax.tree.leaves(params)`` in the order of ``optimizer.param_groups``
      (group by group, each group's ``params`` in order): a list. Shapes and
      dtypes must match.
    learning_rate: None to use each group's ``lr``. Needed when a
      learning-rate scheduler is attached (its groups carry ``initial_lr``),
      since the schedule is not part of the optimizer: a number (a float, a
      NumPy scalar, a 0-d array or tensor), or a schedule ``n -> lr`` of the
      number ``n`` of updates made in JAX (0 at the first), i.e. the PyTorch
      schedule shifted by the steps already taken; or a sequence (or a 1-d
      array or tensor) with one such entry per param group.

  Returns:
    ``(tx, state)``: an ``optax.GradientTransformationExtraArgs`` (call
    ``tx.update(grads, state, params)``: ``weight_decay`` needs the
    parameters) and its state, with the optimizer's state tensors copied.

  Raises:
    TypeError: an optimizer other than SGD, Adagrad, Adam and AdamW, or a
      subclass, whose step may differ.
    ValueError: an option the rules lack (Adam's ``amsgrad``, tensor
      hyperparameters that PyTorch computes with in float32, Adam's complex
      parameters), a scheduler without ``learning_rate``, params that do
      not match the optimizer's parameters (naming the pytree path), or a
      ``DTensor`` whose shard on this rank lacks rows that this process's
      devices need.

  Example:
    >>> import torch, jax.numpy as jnp, optax
    >>> from onnx_optax.interop import from_torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, dampening=0.5)
    >>> for g in ([1.0, -1.0], [0.5, 0.5]):
    ...   w.grad = torch.tensor(g); opt.step()
    >>> params = {"w": jnp.asarray(w.detach().numpy())}
    >>> tx, state = from_torch(opt, params)
    >>> updates, state = tx.update({"w": jnp.array([2.0, 0.0])}, state, params)
    >>> w.grad = torch.tensor([2.0, 0.0]); opt.step()
    >>> bool(jnp.allclose(optax.apply_updates(params, updates)["w"], w.detach().numpy()))
    True

    ``torch.optim.AdamW`` gives :func:`onnx_optax.pytorch_adamw`, whose count is
    PyTorch's ``step``:

    >>> opt = torch.optim.AdamW([w], lr=0.1)
    >>> opt.step()
    >>> tx, state = from_torch(opt, params)
    >>> type(state).__name__, int(state.count), float(opt.state[w]["step"])
    ('PyTorchAdamState', 1, 1.0)
  """
  torch = _torch()
  view = View(_kind(torch, optimizer), optimizer.param_groups, optimizer.state, optimizer.defaults)
  return carry(torch, view, params, learning_rate)


class View(NamedTuple):
  """What the bridge reads of an optimizer: a live ``torch.optim`` one, or one rebuilt from a state dict.

  ``groups`` are param groups whose ``params`` are the parameters (tensors,
  or stand-ins with ``shape``, ``dtype``, ``device`` and ``is_complex()``),
  ``state`` maps a parameter to its state entry, ``defaults`` are the
  constructor's options (None when unknown).
  """

  kind: str
  groups: Sequence[dict]
  state: Mapping[Any, dict]
  defaults: Mapping[str, Any] | None
  source: str = "optimizer"  # "state_dict": a refusal's advice edits the state dict instead


def carry(torch: Any, view: View, params: Any, learning_rate: Any) -> tuple[Any, Any]:
  """``from_torch`` of an optimizer as the bridge reads it (``view``)."""
  kind, groups = view.kind, view.groups
  leaves, treedef, perm = _ordered(params, groups, "params")
  rates = _common.learning_rates(learning_rate, len(groups))
  for g, group in enumerate(groups):
    _check_group(g, group, kind, source=view.source)
  _check_scheduler(groups, rates)

  transforms_by_label: dict[str, optax.GradientTransformation] = {}
  labels: list[str] = []
  tensors: list[tuple[Any, ...]] = []  # each leaf's state tensors (NumPy arrays; None: zeros)
  for g, (group, rate) in enumerate(zip(groups, rates)):
    R = rate
    if rate is None:
      name = f"param_groups[{g}]['lr']"
      R = _checks.learning_rate(name, _common.real_number(name, group["lr"]))
    elif callable(rate):
      R = _as_pytorch_computes(
        rate, "learning_rate" if callable(learning_rate) else f"learning_rate[{g}]", group
      )
    counts_and_tensors = [
      _read_state(torch, view, group, p, f"the state of param_groups[{g}]['params'][{j}]")
      for j, p in enumerate(group["params"])
    ]
    for T in sorted({T for T, _ in counts_and_tensors}):
      label = f"group{g}" if len({T for T, _ in counts_and_tensors}) == 1 else f"group{g}.T{T}"
      transforms_by_label[label] = _common.negated(_transform(kind, g, group, R, T), bool(group["maximize"]))
    for T, tensor in counts_and_tensors:
      labels.append(f"group{g}" if f"group{g}" in transforms_by_label else f"group{g}.T{T}")
      tensors.append(tensor)

  # PyTorch keeps a parameter's state in the parameter's shape and dtype; a state made
  # otherwise by hand is refused, not cast (nothing is cast).
  for (shape, dtype, where), values, leaf in zip(_described(groups), tensors, leaves):
    for value in values:
      if value is not None and (tuple(value.shape) != shape or _common.dtype_name(value.dtype) != dtype):
        raise ValueError(
          f"a state tensor of {where} has shape {tuple(value.shape)} and dtype "
          f"{_common.dtype_name(value.dtype)}, not the parameter's {shape} and {dtype}: PyTorch's own "
          f"steps keep it in the parameter's dtype, and nothing is cast. Store it so "
          f"(optimizer.state[p][key] = optimizer.state[p][key].to(p.dtype)) if that is what you mean"
        )
      _check_held(value, leaf, f"the state of {where}")

  # labels and tensors are in the optimizer's order; the trees need the leaves' order.
  tree_labels, tree_tensors = _to_leaf_order(labels, perm), _to_leaf_order(tensors, perm)
  tx = _common.partition(transforms_by_label, tree_labels, treedef)
  state = tx.init(params)
  tree_leaves = jax.tree.leaves(params)
  fields = [
    [
      _common.put_like(v if v is not None else np.zeros(leaf.shape, _common.dtype_name(leaf.dtype)), leaf)
      for v, leaf in zip(column, tree_leaves)
    ]
    for column in zip(*tree_tensors)
  ]
  state = _common.fill(state, treedef, fields)
  return tx, state


def to_torch(state: Any, optimizer: Any, params: Any = None) -> None:
  """Loads a transform's state (and optionally the weights) into a PyTorch optimizer.

  ``state`` is a state of a transform returned by :func:`from_torch` for an
  optimizer with the same classes, param groups and hyperparameters as
  ``optimizer`` (the same optimizer, or a fresh one built the same way),
  after any number of JAX updates. Afterwards ``optimizer.step()`` continues
  the JAX run: it is the next ``tx.update`` with the same gradients. No
  learning rate is written: with a scheduler attached, step it once per JAX
  update, and the groups' rates follow.

  The optimizer's parameters are PyTorch tensors that JAX never touched: pass
  ``params`` (the JAX parameters) to copy them in as well, or copy them
  yourself. The state and ``params`` are each placed on the optimizer's
  parameters by their own structure, with the mapping of :func:`from_torch`
  (:func:`~onnx_optax.interop.torch.mapping`): by name for an optimizer built from
  ``named_parameters()`` and a dict-keyed tree, else by position.

  The state's tensors must have the parameters' dtypes (PyTorch keeps its
  state in the parameter's dtype); nothing is cast. Everything is checked
  before the optimizer or a parameter is written.

  Args:
    state: the transform's state.
    optimizer: the ``torch.optim.SGD``, ``Adagrad``, ``Adam`` or ``AdamW`` to load.
    params: optional JAX parameters to copy into the optimizer's parameters.

  Example:
    >>> import torch, jax.numpy as jnp, optax
    >>> from onnx_optax.interop import from_torch, to_torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> opt = torch.optim.Adagrad([w], lr=0.1, lr_decay=0.01)
    >>> params = [jnp.array([1.0, 2.0])]
    >>> tx, state = from_torch(opt, params)
    >>> for g in ([1.0, -1.0], [0.5, 0.5]):  # two steps in JAX
    ...   updates, state = tx.update([jnp.array(g)], state, params)
    ...   params = optax.apply_updates(params, updates)
    >>> to_torch(state, opt, params)
    >>> opt.state[w]["step"], opt.state[w]["sum"]
    (tensor(2.), tensor([1.2500, 1.2500]))
  """
  torch = _torch()
  kind = _kind(torch, optimizer)
  groups = optimizer.param_groups
  writes = checked_writes(torch, kind, groups, state)
  new_params = None
  if params is not None:
    leaves, _, _ = _ordered(params, groups, "params")
    new_params = [
      _to_tensor(torch, leaf, p, f"params for {where}")
      for leaf, p, (_, _, where) in zip(leaves, _tensors(groups), _described(groups))
    ]
  for p, group, count, tensors in writes:
    write(torch, kind, optimizer.state[p], group, p, count, tensors)
  if new_params is not None:
    with torch.no_grad():
      for p, value in zip(_tensors(groups), new_params):
        p.copy_(value)


def checked_writes(
  torch: Any, kind: str, groups: Sequence[dict], state: Any
) -> list[tuple[Any, dict, int, tuple]]:
  """``(parameter, group, step, state tensors)`` per parameter, every check done, nothing written
  (``step``: PyTorch's, the updates done)."""
  # The state's trees have the params' structure (optax.MaskedNode where a
  # label's transform does not own a leaf): the one mapping places them.
  owners = _common.positions(state, len(_tensors(groups)), _STATES[kind])
  perm = mapping(_common.first_field(state), _param_names(groups), "state", is_leaf=_common.is_masked)
  owners = [owners[j] for j in perm]
  described = _described(groups)
  writes = []
  i = 0
  for g, group in enumerate(groups):
    _check_group(g, group, kind)
    for p in group["params"]:
      owner = owners[i]
      shape, dtype, where = described[i]
      for value in owner.values:
        if tuple(value.shape) != shape or _common.dtype_name(value.dtype) != dtype:
          raise ValueError(
            f"the state of {where} has shape {tuple(value.shape)} and dtype "
            f"{_common.dtype_name(value.dtype)}; PyTorch keeps it with the parameter's shape "
            f"{shape} and dtype {dtype}"
          )
      count = int(owner.rule_state.count)
      # Adam's torch step counts the updates done: a twin's count, ort_adamw's minus one.
      steps = count - 1 if isinstance(owner.rule_state, transforms.OrtAdamWState) else count
      if kind != "SGD" and steps > _FLOAT32_EXACT_COUNT:
        raise ValueError(
          f"the state of {where} has count {count}, beyond 2**24, where torch's float32 step stops counting"
        )
      if steps < 0:
        raise ValueError(
          f"the state of {where} has count {count}: torch.optim.{kind}'s next update is its step 1 or "
          f"later (count >= 1, ort_adamw's initial_count)"
        )
      tensors = tuple(_to_tensor(torch, value, p, f"the state of {where}") for value in owner.values)
      writes.append((p, group, steps, tensors))
      i += 1
  return writes


def write(torch: Any, kind: str, slot: dict, group: dict, p: Any, count: int, tensors: tuple) -> None:
  """Rewrites one parameter's state entry ``slot`` (``optimizer.state[p]``) in place, from a checked
  write (``count``: PyTorch's ``step``, the updates done)."""
  if kind in ("Adam", "AdamW"):
    _write_adam_state(torch, slot, group, p, count, tensors)
    return
  (tensor,) = tensors
  if kind == "SGD":
    if group["momentum"] == 0 or count == 0:
      # No buffer: PyTorch's next step is a first step (count = 0), or keeps none.
      slot.pop("momentum_buffer", None)
    else:
      slot["momentum_buffer"] = tensor
  else:
    old = slot.get("step")
    step_dtype = old.dtype if isinstance(old, torch.Tensor) else torch.float32
    step_device = old.device if isinstance(old, torch.Tensor) else "cpu"
    slot["step"] = torch.tensor(float(count), dtype=step_dtype, device=step_device)
    slot["sum"] = tensor


def torch_params(optimizer: Any, like: Any = None) -> Any:
  """The optimizer's parameters as JAX arrays, in the structure of ``like``.

  ``like`` says the structure, shapes and dtypes of the result. It may be:

  * None: a list in the order of ``optimizer.param_groups``, or, when the
    optimizer was built from ``model.named_parameters()``, a dict keyed by
    those names (both are what :func:`from_torch` takes);
  * the PyTorch parameters themselves, ``list(model.parameters())`` or
    ``dict(model.named_parameters())``, or any pytree whose leaves are
    tensors, JAX arrays or ``jax.ShapeDtypeStruct``.

  ``like`` is placed on the optimizer's parameters by :func:`~onnx_optax.interop.torch.mapping`: the
  optimizer's own tensors by identity, a dict keyed by the names the
  optimizer was built with (``named_parameters()``) by name, anything else
  by position (``jax.tree.leaves(like)`` in the optimizer's order). Shapes
  and dtypes must match; the values are copied exactly. float64 needs
  ``jax_enable_x64``.

  Example:
    >>> import torch, jax, jax.numpy as jnp
    >>> from onnx_optax.interop import torch_params
    >>> model = torch.nn.Linear(3, 2)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> params = torch_params(opt)  # a list, in the optimizer's order
    >>> [p.shape for p in params]
    [(2, 3), (2,)]
    >>> params = torch_params(opt, list(model.parameters()))  # the same
    >>> named = torch.optim.SGD(model.named_parameters(), lr=0.1)
    >>> params = torch_params(named)  # keyed by name: from_torch matches names
    >>> sorted(params), params["weight"].shape
    (['bias', 'weight'], (2, 3))
  """
  torch = _torch()
  _kind(torch, optimizer)
  groups = optimizer.param_groups
  if like is None:
    names = _param_names(groups)
    tensors = _tensors(groups)
    like = dict(zip(names, tensors)) if names is not None else tensors
  leaves, treedef, perm = _ordered(like, groups, "like")
  for i, leaf in enumerate(leaves):
    dtype = jax.dtypes.canonicalize_dtype(_common.dtype_name(leaf.dtype))
    if dtype.name != _common.dtype_name(leaf.dtype):
      raise ValueError(
        f"{_described(groups)[i][2]} has dtype {_common.dtype_name(leaf.dtype)}, which JAX's default "
        f"32-bit mode would truncate to {dtype.name}: call jax.config.update('jax_enable_x64', True) "
        f"first (nothing is cast)"
      )
  hosts = [_to_host(torch, p, where) for p, (_, _, where) in zip(_tensors(groups), _described(groups))]
  for value, leaf, (_, _, where) in zip(hosts, leaves, _described(groups)):
    _check_held(value, leaf, where, weights=True)
  values = [_common.put_like(value, leaf) for value, leaf in zip(hosts, leaves)]
  return treedef.unflatten(_to_leaf_order(values, perm))


# The fix for leaves the mapping cannot place.
_ORDER = (
  "pass a list in the order of optimizer.param_groups (torch_params(optimizer) returns one for an "
  "optimizer built from model.parameters()), or build the optimizer from model.named_parameters() and "
  "pass a dict keyed by those names (torch_params(optimizer) returns one), which is matched by name"
)


def _param_names(groups: Sequence[dict]) -> list[str] | None:
  """The names of the optimizer's parameters, in its order (``named_parameters()``), or None.

  PyTorch keeps ``param_names`` in every group or in none
  (``Optimizer.add_param_group`` refuses a mix).
  """
  if not groups or any("param_names" not in group for group in groups):
    return None
  return [str(name) for group in groups for name in group["param_names"]]


def _leaf_name(path: tuple[Any, ...]) -> str | None:
  """A leaf's name: its dict keys joined with '.' (``{"0": {"weight": w}}`` is ``"0.weight"``), else None."""
  if not path or not all(isinstance(key, jax.tree_util.DictKey) for key in path):
    return None
  return ".".join(str(key.key) for key in path)


def mapping(
  tree: Any,
  names: Sequence[str] | None,
  argument: str,
  *,
  tensors: Sequence[Any] = (),
  is_leaf: Any = None,
) -> list[int]:
  """The one mapping between a pytree's leaves and PyTorch's parameters: ``perm[i]``, parameter ``i``'s leaf.

  Parameter ``i`` is the ``i``-th of the optimizer's order (group by group,
  each group's ``params`` in order); leaf ``j`` is the ``j``-th of
  ``jax.tree.leaves(tree, is_leaf)``. Every bridge function (``from_torch``,
  ``to_torch`` on its state and on its params, ``torch_params``, the state
  dicts) places leaves with this function, so a tree is read and written at
  the same places. Decided, in this order:

  1. leaves that are the parameters themselves (``tensors``, by identity):
     each placed on its own parameter, whatever the tree's order;
  2. by name, when the parameters have names (an optimizer built from
     ``named_parameters()``, a state dict keyed by name) and the tree has
     dict keys: a leaf's name is its dict keys joined with ``'.'``, and the
     names must be exactly the parameters' names;
  3. by position, for a tree without dict keys (a list, nested lists and
     tuples) or of one leaf: the leaves are the parameters in their order.

  A tree with dict keys that cannot be matched by name (the parameters have
  no names, or other names), or a tree mixing its parameters' tensors with
  other leaves, is refused: no sorted key order is ever taken for the
  optimizer's order.

  Raises:
    ValueError: the tree's names or tensors do not place every parameter
      exactly once (naming the argument, the names and the fix).
  """
  with_path, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  leaves = [leaf for _, leaf in with_path]
  index_of = {id(p): i for i, p in enumerate(tensors)}
  own = [index_of.get(id(leaf)) for leaf in leaves]
  if any(i is not None for i in own):
    if sorted(i for i in own if i is not None) != list(range(len(tensors))) or None in own:
      raise ValueError(
        f"{argument} holds some of the optimizer's parameters but not each of them exactly once, "
        f"beside other leaves: the parameters cannot be placed; {_ORDER}"
      )
    perm = [0] * len(tensors)
    for j, i in enumerate(own):
      perm[i] = j  # type: ignore[index]
    return perm
  keyed = any(isinstance(key, jax.tree_util.DictKey) for path, _ in with_path for key in path)
  if not keyed or len(leaves) <= 1:
    return list(range(len(leaves)))
  if names is None:
    # jax.tree.leaves sorts dict keys: their order is the optimizer's only by accident.
    keys = [_leaf_name(path) or jax.tree_util.keystr(path) for path, _ in with_path]
    raise ValueError(
      f"{argument} is a dict (keys {_few(keys)}), and the optimizer's parameters have no names to "
      f"match them by: jax.tree.leaves sorts dict keys, which need not be the optimizer's order. "
      f"Pass a list in the order of optimizer.param_groups (torch_params(optimizer) returns one), or "
      f"build the optimizer from model.named_parameters() (or groups of (name, parameter) pairs) and "
      f"key {argument} by those names"
    )
  maybe_names = [_leaf_name(path) for path, _ in with_path]
  if None in maybe_names:
    where = jax.tree_util.keystr(with_path[maybe_names.index(None)][0])
    raise ValueError(
      f"{argument}{where} is not keyed by dict keys alone, and the optimizer's parameters have names "
      f"(built from named_parameters()): {argument} must be a dict keyed by those names (nested dicts "
      f"join their keys with '.') or a list in the optimizer's order"
    )
  leaf_names = [name for name in maybe_names if name is not None]
  known, given = set(names), set(leaf_names)
  missing = [name for name in names if name not in given]
  extra = [name for name in leaf_names if name not in known]
  twice = sorted(name for name, n in collections.Counter(leaf_names).items() if n > 1)
  if missing or extra or twice:
    found = "; ".join(
      f"{what} {_few(which)}"
      for what, which in (
        ("no leaf for", missing),
        ("leaves named", extra),  # no parameter has those names
        ("several leaves named", twice),
      )
      if which
    )
    raise ValueError(
      f"{argument} is keyed by names that are not the optimizer's parameters' names: {found}. "
      f"The optimizer's names are {_few(list(names))}: key {argument} by exactly those names "
      f"(torch_params(optimizer) returns such a dict), or pass a list in the optimizer's order"
    )
  index = {name: j for j, name in enumerate(leaf_names)}
  return [index[name] for name in names]


def _few(names: Sequence[str], n: int = 6) -> str:
  """At most ``n`` names, for an error message."""
  shown = ", ".join(repr(name) for name in names[:n])
  return f"[{shown}, ... ({len(names)} in all)]" if len(names) > n else f"[{shown}]"


def _ordered(tree: Any, groups: Sequence[dict], argument: str) -> tuple[list[Any], Any, list[int]]:
  """The leaves of ``tree`` in the optimizer's order, checked; its structure; the mapping."""
  leaves, treedef, paths = _common.leaf_paths(tree)
  perm = mapping(tree, _param_names(groups), argument, tensors=_tensors(groups))
  leaves, paths = [leaves[j] for j in perm], [paths[j] for j in perm]
  _common.check_leaves(leaves, paths, _described(groups), "PyTorch", argument=argument, order=_ORDER)
  return leaves, treedef, perm


def _to_leaf_order(values: list[Any], perm: list[int]) -> list[Any]:
  """``values`` in the optimizer's order, rearranged into the tree's leaf order."""
  out: list[Any] = [None] * len(values)
  for i, j in enumerate(perm):
    out[j] = values[i]
  return out


def _tensors(groups: Sequence[dict]) -> list[Any]:
  return [p for group in groups for p in group["params"]]


def _kind(torch: Any, optimizer: Any) -> str:
  cls = type(optimizer)
  if cls is torch.optim.SGD:
    return "SGD"
  if cls is torch.optim.Adagrad:
    return "Adagrad"
  if cls is torch.optim.Adam:
    return "Adam"
  if cls is torch.optim.AdamW:
    return "AdamW"
  if isinstance(optimizer, (torch.optim.SGD, torch.optim.Adagrad, torch.optim.Adam)):
    raise TypeError(
      f"{cls.__module__}.{cls.__qualname__} subclasses a PyTorch optimizer and may change its "
      f"step; the bridges map torch.optim.SGD, Adagrad, Adam and AdamW themselves"
    )
  raise TypeError(
    f"no onnx_optax rule is {cls.__module__}.{cls.__qualname__}: the PyTorch bridges map "
    f"torch.optim.SGD (ONNX Momentum), torch.optim.Adagrad (ONNX Adagrad) and "
    f"torch.optim.Adam / AdamW (ONNX Runtime AdamW, adam_mode=0)"
  )


def _described(groups: Sequence[dict]) -> list[tuple[tuple[int, ...], str, str]]:
  out = []
  for g, group in enumerate(groups):
    names = group.get("param_names")
    for j, p in enumerate(group["params"]):
      where = f"param_groups[{g}]['params'][{j}]"
      if names is not None:
        where += f" ({names[j]!r})"
      out.append((tuple(p.shape), _common.dtype_name(p.dtype), where))
  return out


def _check_group(g: int, group: dict, kind: str, *, source: str = "optimizer") -> None:
  known = _KEYS[kind]
  unknown = sorted(set(group) - known)
  if unknown:
    raise ValueError(
      f"param_groups[{g}] has options {unknown} that torch.optim.{kind} does not have in "
      f"PyTorch 2.13 (a scheduler's, or a newer PyTorch's): onnx_optax cannot tell whether "
      f"they change the update"
    )
  lr = group["lr"]
  if kind == "Adagrad" and _is_tensor(lr) and str(lr.dtype) != "torch.float64" and group["lr_decay"] != 0:
    # PyTorch's Adagrad computes lr / (1 + (step - 1) * lr_decay) in the
    # tensor's dtype; a Python float (or a float64 tensor) computes in float64.
    raise ValueError(
      f"param_groups[{g}]['lr'] is a {str(lr.dtype).removeprefix('torch.')} tensor ({lr!r}) and "
      f"lr_decay is {group['lr_decay']}: torch.optim.Adagrad then computes "
      f"lr / (1 + (step - 1) * lr_decay) in {str(lr.dtype).removeprefix('torch.')}, not in float64 as "
      f"for a Python float, so no transform follows its rounding. {_float_advice('lr', source)}"
    )
  if group.get("differentiable"):
    raise ValueError(
      f"param_groups[{g}] has differentiable=True: it differentiates through PyTorch's step, "
      f"which a copy of the state cannot carry; build the optimizer with differentiable=False "
      f"(JAX differentiates through the transform itself)"
    )
  if kind in ("Adam", "AdamW"):
    _check_adam_group(g, group, kind, source=source)
  if kind == "SGD":
    if group["nesterov"] and (group["momentum"] == 0 or group["dampening"] != 0):
      # PyTorch's constructor refuses this too; a group edited after it is not.
      raise ValueError(
        f"param_groups[{g}] has nesterov=True with momentum={group['momentum']} and "
        f"dampening={group['dampening']}: PyTorch refuses Nesterov momentum without momentum "
        f"or with dampening, and ONNX Momentum's Nesterov mode is PyTorch's only for "
        f"dampening=0. Use dampening=0 (beta=1), or nesterov=False"
      )


def _float_advice(key: str, source: str = "optimizer") -> str:
  """The advice of a refusal of a tensor hyperparameter: a Python float computes in float64, as the rules."""
  value = "tuple(float(b) for b in group['betas'])" if key == "betas" else f"float(group[{key!r}])"
  if source == "state_dict":
    return (
      f"Make it a Python float in the state dict, then call from_torch_state_dict: "
      f"for group in state_dict['param_groups']: group[{key!r}] = {value} "
      f"(and in the optimizer that loads it back, whose next steps then compute in float64 too)"
    )
  return (
    f"Make it a Python float in the optimizer, then call from_torch: "
    f"for group in optimizer.param_groups: group[{key!r}] = {value} "
    f"(PyTorch's own next steps then compute in float64 too)"
  )


def _is_tensor(value: Any) -> bool:
  return hasattr(value, "dtype") and hasattr(value, "detach")


def _as_pytorch_computes(schedule: Any, name: str, group: dict) -> Any:
  """``schedule``, refusing a rate narrower than the group's parameters: PyTorch's ``lr`` is a Python float.

  Checked when the transform evaluates it (the dtype is static, so under
  ``jax.jit`` too): a float32 rate for float64 parameters is PyTorch's rate
  rounded, 1e-8 relative off.
  """
  floats = [_common.dtype_name(p.dtype) for p in group["params"]]
  floats = [d for d in floats if jax.numpy.issubdtype(d, jax.numpy.floating)]
  widest = max(floats, key=lambda d: jax.numpy.finfo(d).bits, default=None)

  def rate(n: Any) -> Any:
    return _checks.wide_enough(
      f"{name}'s value", schedule(n), at_least=widest, why=", where PyTorch's lr is a Python float (float64)"
    )

  return rate


def _check_scheduler(groups: Sequence[dict], rates: Sequence[Any]) -> None:
  """Refuses a scheduler's groups without ``learning_rate``, giving the value that keeps them constant."""
  if not any("initial_lr" in group and rate is None for group, rate in zip(groups, rates)):
    return
  current = [_common.real_number(f"param_groups[{g}]['lr']", group["lr"]) for g, group in enumerate(groups)]
  value = repr(current[0]) if len(set(current)) == 1 else "[" + ", ".join(map(repr, current)) + "]"
  each = "the current lr" if len(set(current)) == 1 else "the groups' current lrs, one per group"
  raise ValueError(
    f"param_groups have 'initial_lr': a learning-rate scheduler is attached, and its schedule is "
    f"not part of the optimizer. Pass learning_rate={value} ({each}) to keep it constant, or a "
    f"schedule n -> lr of the number n of JAX updates (the PyTorch schedule shifted by the steps "
    f"already taken, e.g. optax.cosine_decay_schedule(...) evaluated at n + steps), or a list with "
    f"one float or schedule per group"
  )


def _transform(kind: str, g: int, group: dict, R: Any, T: int) -> optax.GradientTransformationExtraArgs:
  # Each option is checked under its PyTorch name with the range of its kind
  # (docs/spec.md, "Hyperparameter ranges"), before any transform is built.
  def number(key, check):
    name = f"param_groups[{g}][{key!r}]"
    return check(name, _common.real_number(name, group[key]))

  if kind in ("Adam", "AdamW"):
    return _adam_transform(kind, g, group, R, T)
  weight_decay = number("weight_decay", _checks.coefficient)
  if kind == "SGD":
    momentum = number("momentum", _checks.decay)
    # momentum = 0 is plain SGD: PyTorch ignores dampening.
    dampening = 0.0
    if momentum != 0:
      dampening = number("dampening", lambda n, v: _checks.hyperparameter(n, v, minimum=0.0, maximum=1.0))
    return transforms.pytorch_sgd(
      R,
      momentum=momentum,
      dampening=dampening,
      weight_decay=weight_decay,
      nesterov=bool(group["nesterov"]),
      initial_count=T,
    )
  return transforms.pytorch_adagrad(
    R,
    lr_decay=number("lr_decay", _checks.learning_rate_decay),
    eps=number("eps", _checks.epsilon),
    weight_decay=weight_decay,
    initial_count=T,
  )


def _read_state(torch: Any, view: View, group: dict, p: Any, where: str) -> tuple[int, tuple[Any, ...]]:
  """``(T, state tensors, each a NumPy array or None for zeros)`` of one parameter."""
  kind, slot = view.kind, view.state.get(p, {})
  if kind in ("Adam", "AdamW"):
    return _read_adam_state(torch, kind, slot, where)
  if kind == "SGD":
    if group["momentum"] == 0:
      return 0, (None,)  # plain SGD keeps no buffer, and its T does not matter (beta = 1)
    buffer = slot.get("momentum_buffer")
    return (0, (None,)) if buffer is None else (1, (_to_host(torch, buffer, where),))
  if "sum" not in slot:
    # Adagrad fills the state of a parameter added after its constructor at
    # that parameter's first step, from the optimizer's defaults.
    if view.defaults is None:
      raise ValueError(
        f"Adagrad's state has no 'sum' for {p!r}: PyTorch fills it at the parameter's first step from "
        f"the constructor's initial_accumulator_value, which a state dict does not hold. Take one step "
        f"in PyTorch before saving, or use from_torch on the live optimizer"
      )
    value = view.defaults["initial_accumulator_value"]
    return 0, (np.full(tuple(p.shape), value, _common.dtype_name(p.dtype)),)
  step = float(slot["step"])
  if step != int(step) or not 0 <= step <= 2**31 - 1:
    raise ValueError(f"Adagrad's step of a parameter is {step}, not a count of updates")
  return int(step), (_to_host(torch, slot["sum"], where),)


def _to_numpy(torch: Any, tensor: Any) -> np.ndarray:
  tensor = tensor.detach().cpu()
  if tensor.dtype == torch.bfloat16:
    import ml_dtypes  # a dependency of jax and of onnx_optax

    # float32 holds every bfloat16 exactly.
    return tensor.float().numpy().astype(ml_dtypes.bfloat16)
  return tensor.numpy().copy()


def _to_host(torch: Any, tensor: Any, where: str = "") -> np.ndarray | _common.HostPiece:
  """A tensor's values on the host; of a ``DTensor``, this rank's shard (a piece, unless it is all)."""
  if not _is_dtensor(tensor):
    return _to_numpy(torch, tensor)
  region, shape = _dtensor_region(tensor, where), tuple(tensor.shape)
  host = _to_numpy(torch, tensor.to_local())
  if all(a == 0 and b == n for (a, b), n in zip(region, shape)):
    return host
  return _common.HostPiece(host, tuple(a for a, _ in region), shape)


def _to_tensor(torch: Any, value: Any, like: Any, where: str) -> Any:
  """A JAX (or NumPy) value as a tensor like ``like``: on its device, and a ``DTensor`` with its
  placements when ``like`` is one (a FSDP2 parameter) or a stand-in for one (``like.template``)."""
  template = like if _is_dtensor(like) else getattr(like, "template", None)
  region = _dtensor_region(template, where) if template is not None else None
  host = _common.host_region(value, region)
  if host is None:
    held = [_common.bounds(s.index, value.shape) for s in value.addressable_shards]
    raise ValueError(
      f"{where} is a JAX array over several processes, and this process's shards {held} do not hold "
      + (
        f"{region}, what this rank's DTensor holds: place the JAX arrays so that each process holds its "
        f"rank's shards (FSDP2's Shard(0): the first dimension split over the processes in rank order)"
        if region is not None
        else "all of it, which a template of whole tensors (a gathered state dict) needs: write into each "
        "rank's sharded state dict (get_optimizer_state_dict without full_state_dict), or gather the state "
        "first: state = jax.experimental.multihost_utils.process_allgather(state, tiled=True)"
      )
    )
  if _common.dtype_name(host.dtype) == "bfloat16":
    tensor = torch.from_numpy(host.astype(np.float32)).to(torch.bfloat16)
  else:
    tensor = torch.from_numpy(np.array(host))
  if template is None:
    return tensor.to(device=like.device)
  from torch.distributed.tensor import DTensor

  return DTensor.from_local(
    tensor.to(device=template.to_local().device),
    template.device_mesh,
    template.placements,
    run_check=False,
    shape=template.shape,
    stride=template.stride(),
  )


def _is_dtensor(tensor: Any) -> bool:
  """A ``torch.distributed.tensor.DTensor`` (FSDP2's parameters and state), without importing it."""
  return all(hasattr(tensor, name) for name in ("device_mesh", "placements", "to_local"))


def _dtensor_region(tensor: Any, where: str = "") -> tuple[tuple[int, int], ...]:
  """``(start, stop)`` per dimension of the global tensor that this rank's local tensor holds.

  ``Shard(d)`` splits dimension ``d`` as ``torch.chunk`` does (pieces of
  ``ceil(n / k)``, the last ones shorter or empty), mesh dimension by mesh
  dimension; ``Replicate()`` keeps it whole. Other placements (``Partial``,
  the strided shards of tensor parallelism) hold no such block: refused.
  """
  from torch.distributed.tensor import Replicate, Shard

  mesh, placements = tensor.device_mesh, tensor.placements
  coordinate = mesh.get_coordinate()
  bounds = [[0, int(n)] for n in tensor.shape]
  gathered = (
    "read the gathered state instead: get_optimizer_state_dict(model, optimizer, "
    "options=StateDictOptions(full_state_dict=True))"
  )
  for axis, placement in enumerate(placements):
    if type(placement) is Replicate:
      continue
    if type(placement) is not Shard or coordinate is None:
      raise ValueError(
        f"{where or 'a DTensor'} has placements {tuple(placements)} on {mesh}"
        + (": this rank is not in its mesh" if coordinate is None else "")
        + f"; the bridge reads this rank's shard of Shard(d) and Replicate() placements only: {gathered}"
      )
    d = placement.dim % len(bounds)
    start, stop = bounds[d]
    n, k, c = stop - start, mesh.size(axis), coordinate[axis]
    chunk = -(-n // k)
    bounds[d] = [start + min(c * chunk, n), start + min((c + 1) * chunk, n)]
  local = tuple(tensor.to_local().shape)
  if tuple(b - a for a, b in bounds) != local:
    raise ValueError(
      f"{where or 'a DTensor'} of shape {tuple(tensor.shape)} with placements {tuple(placements)} holds a "
      f"local tensor of shape {local} on this rank, not the torch.chunk piece {bounds}: {gathered}"
    )
  return tuple((a, b) for a, b in bounds)


def _check_held(value: Any, leaf: Any, where: str, *, weights: bool = False) -> None:
  """Refuses a rank's shard (a ``HostPiece``) that lacks a region ``leaf``'s devices on this process need."""
  missing = _common.missing_region(value, leaf)
  if missing is None:
    return
  sharding = getattr(leaf, "sharding", None)
  split = (
    "each process's devices hold parts of its rank's shard (FSDP2's Shard(0): the first dimension split "
    "over the processes in rank order)"
  )
  raise ValueError(
    f"{where} is a DTensor, and this rank holds its part {value.region()} (of shape {tuple(value.shape)}), "
    f"but the JAX target{f' (a {sharding})' if sharding is not None else ''} needs {missing} on this "
    f"process's devices. "
    + (
      f"Pass like with a sharding over the processes (jax.ShapeDtypeStruct(shape, dtype, sharding=...)) "
      f"in which {split}"
      if weights
      else f"Shard the JAX parameters so that {split}, or read the gathered state on every rank: "
      f"get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))"
    )
  )


# --- torch.optim.Adam and AdamW: ONNX Runtime AdamW, adam_mode = 0 ------------


def _check_adam_group(g: int, group: dict, kind: str, *, source: str = "optimizer") -> None:
  """Refuses what no transform reproduces exactly (before anything is read or written)."""
  if group["amsgrad"]:
    raise ValueError(
      f"param_groups[{g}] has amsgrad=True: torch.optim.{kind} then divides by the running maximum "
      f"of exp_avg_sq (max_exp_avg_sq), which no onnx_optax rule keeps. Build the optimizer with "
      f"amsgrad=False; optax.amsgrad is the nearest Optax rule (it takes the maximum of the "
      f"bias-corrected second moment, and eps outside the root: a different rule)"
    )
  for key in ("lr", "betas", "eps", "weight_decay"):
    values = group[key] if key == "betas" else (group[key],)
    if any(not isinstance(v, numbers.Real) for v in values):
      raise ValueError(
        f"param_groups[{g}][{key!r}] is a tensor ({group[key]!r}): PyTorch then computes the step "
        f"size in the tensor's dtype (float32 unless made otherwise), not in float64 as for a Python "
        f"number, so no transform follows its rounding. {_float_advice(key, source)}"
      )
  complex_params = [j for j, p in enumerate(group["params"]) if p.is_complex()]
  if complex_params:
    raise ValueError(
      f"param_groups[{g}]['params'][{complex_params[0]}] is complex: torch.optim.{kind} updates its "
      f"real and imaginary parts as two real tensors (torch.view_as_real). Carry real parameters: "
      f"optimize torch.view_as_real views in PyTorch and float pairs in JAX"
    )


def _adam_transform(kind: str, g: int, group: dict, R: Any, T: int) -> optax.GradientTransformationExtraArgs:
  """``pytorch_adam``: the group's ``decoupled_weight_decay`` decides (AdamW sets it, and
  ``Adam(decoupled_weight_decay=True)`` is AdamW), as it decides in PyTorch's step."""

  # Each option checked under its PyTorch name with the range of its kind
  # (docs/spec.md, "Hyperparameter ranges"), as for SGD and Adagrad.
  def number(name, value, check):
    name = f"param_groups[{g}][{name}]"
    return check(name, _common.real_number(name, value))

  alpha = number("'betas'][0", group["betas"][0], lambda n, v: _checks.decay(n, v, below_one=True))
  beta = number("'betas'][1", group["betas"][1], lambda n, v: _checks.decay(n, v, below_one=True))
  epsilon = number("'eps'", group["eps"], _checks.epsilon)
  weight_decay = number("'weight_decay'", group["weight_decay"], _checks.coefficient)
  return transforms.pytorch_adam(
    R,
    betas=(alpha, beta),
    eps=epsilon,
    weight_decay=weight_decay,
    decoupled_weight_decay=bool(group["decoupled_weight_decay"]),
    initial_count=T,
  )


def _read_adam_state(torch: Any, kind: str, slot: dict, where: str) -> tuple[int, tuple[Any, ...]]:
  """``(count, (exp_avg, exp_avg_sq))``: ``count`` is PyTorch's ``step`` (updates done)."""
  if "exp_avg" not in slot:
    # PyTorch creates the state at a parameter's first step: zeros, step 0.
    return 0, (None, None)
  step = float(slot["step"])
  if step != int(step) or not 0 <= step <= 2**31 - 1:
    raise ValueError(f"{kind}'s step of a parameter is {step}, not a count of updates")
  return int(step), (_to_host(torch, slot["exp_avg"], where), _to_host(torch, slot["exp_avg_sq"], where))


def _write_adam_state(torch: Any, slot: dict, group: dict, p: Any, steps: int, tensors: tuple) -> None:
  """``step`` (updates done), ``exp_avg`` and ``exp_avg_sq`` of one parameter."""
  old = slot.get("step")
  if isinstance(old, torch.Tensor):
    dtype, device = old.dtype, old.device
  else:
    # Where PyTorch's own first step puts it: float32 on the parameter's
    # device for fused or capturable, else a default-dtype scalar on the CPU.
    on_device = bool(group["fused"]) or bool(group["capturable"])
    default = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    dtype = torch.float32 if group["fused"] else default
    device = p.device if on_device else "cpu"
  slot["step"] = torch.tensor(float(steps), dtype=dtype, device=device)
  slot["exp_avg"], slot["exp_avg_sq"] = tensors
