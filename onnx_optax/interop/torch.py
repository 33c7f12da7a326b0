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
``lr``, ``betas``, ``eps`` or ``weight_decay`` as tensors (PyTorch computes
their step size in the tensor's dtype), and their complex parameters.
``amsgrad=True`` is carried (``max_exp_avg_sq``, in the twin's
``PyTorchAdamAMSGradState``). :func:`to_torch` also loads the states of the
spec-order rules (``momentum``, ``adagrad``, ``ort_adamw``, whose count is
PyTorch's ``step`` plus one), with the same hyperparameters (``ort_adamw``'s
not into a group with ``amsgrad=True``: it keeps no running maximum).

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

Which twin carries each class is the registry's (:mod:`onnx_optax.registry`:
the rule that declares ``Binding("torch", "SGD")``, ...; its ``twin_of`` is
the spec rule whose state :func:`to_torch` loads too), and each group option
is checked by that twin's declared check, named as the PyTorch user wrote it
(``param_groups[0]['momentum']``). The placement of leaves on the parameters
(:func:`mapping`), the classes' options, refusals and state entries, and the
tensors and DTensors read and written live in the private modules
``_torch_placement``, ``_torch_optim`` and ``_dtensor``.

Importing this module does not import PyTorch; the functions do.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from onnx_optax import _checks
from onnx_optax.interop import _common, _dtensor, _torch_optim, _torch_placement
from onnx_optax.interop import layout as _layout
from onnx_optax.interop._torch_optim import View, check_group
from onnx_optax.interop._torch_placement import mapping

__all__ = ["from_torch", "mapping", "to_torch", "torch_params"]

# Under the names the other modules, the tests and the benchmarks have always used.
_check_group = check_group
_to_numpy = _dtensor.to_numpy


def from_torch(
  optimizer: Any,
  params: Any,
  *,
  learning_rate: Any = None,
  layout: Any = None,
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
    layout: None, or a :class:`~onnx_optax.interop.layout.Layout` (for a Flax NNX port,
      :func:`onnx_optax.interop.flax_nnx.derive`): ``params`` are then one's own model's, in its
      names and layouts (``nnx.state(model, nnx.Param)``), each leaf made of the optimizer's
      parameters (named by ``named_parameters()``) by the layout's operations; the state follows
      them (docs/interop.md, "Carrying into one's own model").

  Returns:
    ``(tx, state)``: an ``optax.GradientTransformationExtraArgs`` (call
    ``tx.update(grads, state, params)``: ``weight_decay`` needs the
    parameters) and its state, with the optimizer's state tensors copied.

  Raises:
    TypeError: an optimizer other than SGD, Adagrad, Adam and AdamW, or a
      subclass, whose step may differ.
    ValueError: an option the rules lack (tensor
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
  torch = _torch_optim.torch()
  view = View(
    _torch_optim.kind(torch, optimizer), optimizer.param_groups, optimizer.state, optimizer.defaults
  )
  return carry(torch, view, params, learning_rate, layout=layout)


def carry(torch: Any, view: View, params: Any, learning_rate: Any, *, layout: Any = None) -> tuple[Any, Any]:
  """``from_torch`` of an optimizer as the bridge reads it (``view``)."""
  kind, groups = view.kind, view.groups
  if layout is not None:
    # The bridge carries the PyTorch-named tree; the layout maps it onto one's own leaves after.
    own_params, params = params, _layout_names(layout, groups).to_torch(params)
  leaves, treedef, perm = _torch_placement.ordered(params, groups, "params")
  rates = _common.learning_rates(learning_rate, len(groups))
  for g, group in enumerate(groups):
    check_group(g, group, kind, source=view.source)
  _torch_optim.check_scheduler(groups, rates)

  transforms_by_label: dict[str, optax.GradientTransformation] = {}
  labels: list[str] = []
  tensors: list[tuple[Any, ...]] = []  # each leaf's state tensors (NumPy arrays; None: zeros)
  for g, (group, rate) in enumerate(zip(groups, rates)):
    R = rate
    if rate is None:
      name = f"param_groups[{g}]['lr']"
      R = _checks.learning_rate(name, _common.real_number(name, group["lr"]))
    elif callable(rate):
      R = _torch_optim.as_pytorch_computes(
        rate, "learning_rate" if callable(learning_rate) else f"learning_rate[{g}]", group
      )
    counts_and_tensors = [
      _torch_optim.read_state(torch, view, group, p, f"the state of param_groups[{g}]['params'][{j}]")
      for j, p in enumerate(group["params"])
    ]
    for T in sorted({T for T, _ in counts_and_tensors}):
      label = f"group{g}" if len({T for T, _ in counts_and_tensors}) == 1 else f"group{g}.T{T}"
      transforms_by_label[label] = _common.negated(
        _torch_optim.transform(kind, g, group, R, T), bool(group.get("maximize", False))
      )
    for T, tensor in counts_and_tensors:
      labels.append(f"group{g}" if f"group{g}" in transforms_by_label else f"group{g}.T{T}")
      tensors.append(tensor)

  # PyTorch keeps a parameter's state in the parameter's shape and dtype (a field declared with
  # a shape or dtypes of its own, in those); a state made otherwise by hand is refused, not cast.
  # The groups' rules' longest fields: a flag on in some group (Adam's amsgrad) adds fields after
  # the others, and the parameters of the other groups have none of those (zeros, masked there).
  fields_of = max([_torch_optim.group_twin(kind, group).fields for group in groups], key=len, default=())
  names = _torch_placement.param_names(groups)
  for i, ((shape, dtype, where), values, leaf) in enumerate(
    zip(_torch_placement.described(groups), tensors, leaves)
  ):
    for f, value in zip(fields_of, values):
      if value is None:
        continue
      if f.like_params and (tuple(value.shape) != shape or _common.dtype_name(value.dtype) != dtype):
        raise ValueError(
          f"a state tensor of {where} has shape {tuple(value.shape)} and dtype "
          f"{_common.dtype_name(value.dtype)}, not the parameter's {shape} and {dtype}: PyTorch's own "
          f"steps keep it in the parameter's dtype, and nothing is cast. Store it so "
          f"(optimizer.state[p][key] = optimizer.state[p][key].to(p.dtype)) if that is what you mean"
        )
      _torch_optim.check_field(f, value, shape, dtype, f"the state {f.name!r} of {where}")
      if f.like_params and layout is not None and names is not None:
        _dtensor.check_mapped(
          value,
          leaf,
          f"the state of {where}",
          view.state.get(_torch_placement.tensors(groups)[i], {}).values(),
          layout,
          names[i],
        )
      if f.like_params:
        _dtensor.check_held(value, leaf, f"the state of {where}")

  # labels and tensors are in the optimizer's order; the trees need the leaves' order.
  tree_labels = _torch_placement.to_leaf_order(labels, perm)
  tree_tensors = _torch_placement.to_leaf_order(tensors, perm)
  tx = _common.partition(transforms_by_label, tree_labels, treedef)
  state = _init_without(tx, params, {f.name for f in fields_of if f.like_params})
  tree_leaves = jax.tree.leaves(params)
  # One tensor at a time, each copied once from the tensor's memory into the JAX array (the host
  # values are views of the tensors, _dtensor.to_numpy).
  fields = [
    [
      _dtensor.put(v, leaf)
      if f.like_params and v is not None
      else _common.put_like(np.zeros(leaf.shape, _common.dtype_name(leaf.dtype)), leaf)
      if f.like_params
      # A field of its own shape and dtype: as PyTorch keeps it (init's where it keeps none).
      else _dtensor.put(v, jax.ShapeDtypeStruct(f.shape_for(leaf.shape), v.dtype))
      if v is not None
      else init_leaf
      for v, leaf, init_leaf in zip(column, tree_leaves, _field_leaves(state, f.name, len(tree_leaves)))
    ]
    for f, column in zip(fields_of, itertools.zip_longest(*tree_tensors))
  ]
  state = _common.fill(state, treedef, fields)
  if layout is not None:
    names = _torch_placement.param_names(groups)
    assert names is not None  # _layout_names refused an optimizer without names
    return _layout.state_to_jax(layout, transforms_by_label, dict(zip(names, labels)), state, own_params)
  return tx, _common.counts_placed(state, tree_leaves)


def _mapped(layout: Any, names: Sequence[str] | None, i: int) -> str:
  """The JAX leaves ``layout`` makes the ``i``-th parameter into by some operation, or "" (messages)."""
  return _dtensor.moved(layout, None if names is None else names[i])


def _layout_names(layout: Any, groups: Sequence[dict]) -> Any:
  """``layout``, once the optimizer is known to name its parameters (which the layout uses)."""
  if _torch_placement.param_names(groups) is None:
    raise ValueError(
      "layout= names PyTorch's parameters, and this optimizer keeps no names: build it from "
      "model.named_parameters()"
    )
  return layout


def _init_without(tx: Any, params: Any, names: set[str]) -> Any:
  """``tx.init(params)`` without building its rule states' fields ``names`` (those the caller fills
  with the carried tensors): those leaves are ``jax.ShapeDtypeStruct`` s, the rest (the counts, the
  fields of a shape of their own) init's values.

  ``init`` is traced once (its checks raise as they would), and only what is kept is computed:
  the zeros of the fields left out are never allocated.
  """
  is_rule_state = _common._rule_state_test()
  shapes = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), params)
  traced: list[Any] = []  # the whole state's shapes, seen by the one trace of ``kept``

  def kept() -> Any:
    state = tx.init(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
    traced.append(jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), state))

    def without(node: Any) -> Any:
      return node._replace(**{n: None for n in names if n in node._fields}) if is_rule_state(node) else node

    return jax.tree.map(without, state, is_leaf=is_rule_state)

  computed = jax.jit(kept)()
  (abstract,) = traced

  def merged(node: Any, values: Any) -> Any:
    if not is_rule_state(node):
      return values
    return node._replace(**{name: getattr(values, name) for name in node._fields if name not in names})

  return jax.tree.map(merged, abstract, computed, is_leaf=lambda node: is_rule_state(node) or node is None)


class _OnCpu:
  """A ``like`` for :func:`_dtensor.to_tensor`: a plain tensor on the CPU."""

  device = "cpu"


_ON_CPU = _OnCpu()


def _field_leaves(state: Any, name: str, n: int) -> list[Any]:
  """Per parameter leaf, the value ``init`` gave the field ``name`` (MaskedNode where another label's
  rule state owns the leaf), from the rule states in ``state``."""
  out: list[Any] = [None] * n
  is_rule_state = _common._rule_state_test()
  for node in jax.tree.leaves(state, is_leaf=is_rule_state):
    if is_rule_state(node):
      for i, entry in enumerate(jax.tree.leaves(getattr(node, name, None), is_leaf=_common.is_masked)):
        if not _common.is_masked(entry):
          out[i] = entry
  return out


def to_torch(state: Any, optimizer: Any, params: Any = None, *, layout: Any = None) -> None:
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
    layout: None, or the :class:`~onnx_optax.interop.layout.Layout` that :func:`from_torch` took:
      ``state`` and ``params`` are one's own model's, inverted onto the optimizer's names.

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
  torch = _torch_optim.torch()
  kind = _torch_optim.kind(torch, optimizer)
  groups = optimizer.param_groups
  if layout is not None:
    state = _layout.state_to_torch(_layout_names(layout, groups), state)
    params = None if params is None else layout.to_torch(params)
  # Checked whole before anything is written, each tensor sharing its JAX array's memory where it
  # can (a CPU one); each is copied once as it is written, so the state is held once more at most
  # by one tensor in flight (docs/interop.md, "Memory").
  writes = checked_writes(torch, kind, groups, state, copy=False, layout=layout)
  new_params = None
  if params is not None:
    leaves, _, _ = _torch_placement.ordered(params, groups, "params")
    names = _torch_placement.param_names(groups)
    new_params = [
      _dtensor.to_tensor(
        torch, leaf, p, f"params for {where}", copy=False, mapped=functools.partial(_mapped, layout, names, i)
      )
      for i, (leaf, p, (_, _, where)) in enumerate(
        zip(leaves, _torch_placement.tensors(groups), _torch_placement.described(groups))
      )
    ]
  for p, group, count, tensors in writes:
    _torch_optim.write(torch, kind, optimizer.state[p], group, p, count, tensors, shared=True)
  if new_params is not None:
    with torch.no_grad():
      for p, value in zip(_torch_placement.tensors(groups), new_params):
        p.copy_(value)


def checked_writes(
  torch: Any,
  kind: str,
  groups: Sequence[dict],
  state: Any,
  *,
  source: str = "optimizer",
  copy: bool = True,
  layout: Any = None,
) -> list[tuple[Any, dict, int, tuple]]:
  """``(parameter, group, step, state tensors)`` per parameter, every check done, nothing written
  (``step``: PyTorch's, the updates done). ``source``: what the caller holds (``mapping``'s);
  ``copy=False``: tensors on the CPU share the state's memory (:func:`_dtensor.to_tensor`); ``layout``:
  the layout the state was mapped back through, named where a DTensor's rows are not on this process."""
  # The state's trees have the params' structure (optax.MaskedNode where a
  # label's transform does not own a leaf): the one mapping places them.
  names = _torch_placement.param_names(groups)
  owners = _common.positions(state, len(_torch_placement.tensors(groups)), _torch_optim.states(kind))
  perm = mapping(_common.first_field(state), names, "state", is_leaf=_common.is_masked, source=source)
  owners = [owners[j] for j in perm]
  described = _torch_placement.described(groups)
  writes = []
  i = 0
  for g, group in enumerate(groups):
    check_group(g, group, kind)
    for p in group["params"]:
      owner = owners[i]
      shape, dtype, where = described[i]
      loads = _torch_optim.group_states(kind, group)
      if not issubclass(type(owner.rule_state), loads):
        # A flag that adds state (Adam's amsgrad) on in the group and off in the run, or the reverse.
        raise ValueError(
          f"the state of {where} is a {type(owner.rule_state).__name__}, but param_groups[{g}]'s "
          f"options take a {' or '.join(t.__name__ for t in loads)}: the run and the optimizer differ "
          f"in an option that changes the state (amsgrad); build the optimizer with the run's options"
        )
      fields = _torch_optim.group_twin(kind, group).fields
      for f, value in zip(fields, owner.values):
        if f.like_params and (tuple(value.shape) != shape or _common.dtype_name(value.dtype) != dtype):
          raise ValueError(
            f"the state of {where} has shape {tuple(value.shape)} and dtype "
            f"{_common.dtype_name(value.dtype)}; PyTorch keeps it with the parameter's shape "
            f"{shape} and dtype {dtype}"
          )
        _torch_optim.check_field(f, value, shape, dtype, f"the state {f.name!r} of {where}")
      count = int(owner.rule_state.count)
      # PyTorch's step counts the updates done: a twin's count; the spec rule's T can start higher.
      offset = _torch_optim.step_offset(kind, owner.rule_state)
      steps = count - offset
      if _torch_optim.declared(kind).step and steps > _torch_optim.FLOAT32_EXACT_COUNT:
        raise ValueError(
          f"the state of {where} has count {count}, beyond 2**24, where torch's float32 step stops counting"
        )
      if steps < 0:
        spec_rule = _torch_optim.twins()[kind].twin_of
        assert spec_rule is not None  # only the spec rule's count starts above PyTorch's step
        raise ValueError(
          f"the state of {where} has count {count}: torch.optim.{kind}'s next update is its step 1 or "
          f"later (count >= {offset}, {spec_rule.name}'s initial_count)"
        )
      tensors = tuple(
        _dtensor.to_tensor(
          torch,
          value,
          p,
          f"the state of {where}",
          copy=copy,
          mapped=functools.partial(_mapped, layout, names, i),
        )
        if f.like_params
        # A field of its own shape (a scalar per parameter): a plain tensor, on the CPU here
        # (_torch_optim.write puts it where the tensor it replaces was).
        else _dtensor.to_tensor(torch, value, _ON_CPU, f"the state of {where}")
        for f, value in zip(fields, owner.values)
      )
      writes.append((p, group, steps, tensors))
      i += 1
  return writes


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
  torch = _torch_optim.torch()
  _torch_optim.kind(torch, optimizer)
  groups = optimizer.param_groups
  if like is None:
    names = _torch_placement.param_names(groups)
    tensors = _torch_placement.tensors(groups)
    like = dict(zip(names, tensors)) if names is not None else tensors
  leaves, treedef, perm = _torch_placement.ordered(like, groups, "like")
  described = _torch_placement.described(groups)
  for i, leaf in enumerate(leaves):
    dtype = jax.dtypes.canonicalize_dtype(_common.dtype_name(leaf.dtype))
    if dtype.name != _common.dtype_name(leaf.dtype):
      raise ValueError(
        f"{described[i][2]} has dtype {_common.dtype_name(leaf.dtype)}, which JAX's default "
        f"32-bit mode would truncate to {dtype.name}: call jax.config.update('jax_enable_x64', True) "
        f"first (nothing is cast)"
      )
  hosts = [
    _dtensor.to_host(torch, p, where) for p, (_, _, where) in zip(_torch_placement.tensors(groups), described)
  ]
  for value, leaf, (_, _, where) in zip(hosts, leaves, described):
    _dtensor.check_held(value, leaf, where, weights=True)
  values = [_dtensor.put(value, leaf) for value, leaf in zip(hosts, leaves)]
  return treedef.unflatten(_torch_placement.to_leaf_order(values, perm))
