"""Where each leaf of a JAX pytree lands among a PyTorch optimizer's parameters.

One mapping (:func:`mapping`) places the leaves of every tree the PyTorch
bridges take or return (``params``, ``like``, a state's trees) on the
optimizer's parameters, in its order: group by group through
``param_groups``, each group's ``params`` in order. A live optimizer and a
state dict are placed alike; a refusal's advice names what the caller has (the
optimizer, or only the state dict). Nothing here knows an optimizer's rule.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import jax

from onnx_optax.interop import _common

__all__ = ["ORDER", "described", "few", "mapping", "ordered", "param_names", "tensors", "to_leaf_order"]

#: The fix for leaves the mapping cannot place (a live optimizer).
ORDER = (
  "pass a list in the order of optimizer.param_groups (torch_params(optimizer) returns one for an "
  "optimizer built from model.parameters()), or build the optimizer from model.named_parameters() and "
  "pass a dict keyed by those names (torch_params(optimizer) returns one), which is matched by name"
)


def param_names(groups: Sequence[dict]) -> list[str] | None:
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


def _advice(argument: str, source: str) -> dict[str, str]:
  """The refusals' advice, for a caller with a live optimizer or with only a state dict."""
  if source == "state_dict":
    return {
      "unnamed": (
        f"the state dict keys its parameters by index and has no param_names: jax.tree.leaves sorts "
        f"dict keys, which need not be its order. Pass a list in the state dict's order (its "
        f"param_groups' 'params', group by group), or pass param_names=, the names of its parameters "
        f"in that order (torch_param_names(optimizer, model) for the optimizer that saved it), and key "
        f"{argument} by those names"
      ),
      "named": "the state dict's parameters have names (its keys, or its groups' param_names)",
      "order": "a list in the state dict's order",
      "exactly": f"key {argument} by exactly those names, or pass a list in the state dict's order",
    }
  return {
    "unnamed": (
      f"the optimizer's parameters have no names to match them by: jax.tree.leaves sorts dict keys, "
      f"which need not be the optimizer's order. Pass a list in the order of optimizer.param_groups "
      f"(torch_params(optimizer) returns one), or build the optimizer from model.named_parameters() "
      f"(or groups of (name, parameter) pairs) and key {argument} by those names"
    ),
    "named": "the optimizer's parameters have names (built from named_parameters())",
    "order": "a list in the optimizer's order",
    "exactly": (
      f"key {argument} by exactly those names (torch_params(optimizer) returns such a dict), or pass a "
      f"list in the optimizer's order"
    ),
  }


def mapping(
  tree: Any,
  names: Sequence[str] | None,
  argument: str,
  *,
  tensors: Sequence[Any] = (),
  is_leaf: Any = None,
  source: str = "optimizer",
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
  optimizer's. ``source`` is what the caller holds, ``"optimizer"`` or
  ``"state_dict"``: the refusal's advice is for that.

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
        f"beside other leaves: the parameters cannot be placed; {ORDER}"
      )
    perm = [0] * len(tensors)
    for j, i in enumerate(own):
      perm[i] = j  # type: ignore[index]
    return perm
  keyed = any(isinstance(key, jax.tree_util.DictKey) for path, _ in with_path for key in path)
  if not keyed or len(leaves) <= 1:
    return list(range(len(leaves)))
  advice = _advice(argument, source)
  if names is None:
    # jax.tree.leaves sorts dict keys: their order is the optimizer's only by accident.
    keys = [_leaf_name(path) or jax.tree_util.keystr(path) for path, _ in with_path]
    raise ValueError(f"{argument} is a dict (keys {few(keys)}), and {advice['unnamed']}")
  maybe_names = [_leaf_name(path) for path, _ in with_path]
  if None in maybe_names:
    where = jax.tree_util.keystr(with_path[maybe_names.index(None)][0])
    raise ValueError(
      f"{argument}{where} is not keyed by dict keys alone, and {advice['named']}: {argument} must be a "
      f"dict keyed by those names (nested dicts join their keys with '.') or {advice['order']}"
    )
  leaf_names = [name for name in maybe_names if name is not None]
  known, given = set(names), set(leaf_names)
  missing = [name for name in names if name not in given]
  extra = [name for name in leaf_names if name not in known]
  twice = sorted(name for name, n in collections.Counter(leaf_names).items() if n > 1)
  if missing or extra or twice:
    found = "; ".join(
      f"{what} {few(which)}"
      for what, which in (
        ("no leaf for", missing),
        ("leaves named", extra),  # no parameter has those names
        ("several leaves named", twice),
      )
      if which
    )
    owner = "the state dict's parameters'" if source == "state_dict" else "the optimizer's parameters'"
    raise ValueError(
      f"{argument} is keyed by names that are not {owner} names: {found}. "
      f"The {'state dict' if source == 'state_dict' else 'optimizer'}'s names are {few(list(names))}: "
      f"{advice['exactly']}"
    )
  index = {name: j for j, name in enumerate(leaf_names)}
  return [index[name] for name in names]


def few(names: Sequence[Any], n: int = 6, show: Callable[[Any], str] = repr) -> str:
  """At most ``n`` names (keys, paths), each as ``show`` writes it, for an error message.

  >>> few(["a", "b"]), few(range(9), n=3)
  ("['a', 'b']", '[0, 1, 2, ... (9 in all)]')
  """
  shown = ", ".join(show(name) for name in names[:n])
  return f"[{shown}, ... ({len(names)} in all)]" if len(names) > n else f"[{shown}]"


def ordered(tree: Any, groups: Sequence[dict], argument: str) -> tuple[list[Any], Any, list[int]]:
  """The leaves of ``tree`` in the optimizer's order, checked; its structure; the mapping."""
  leaves, treedef, paths = _common.leaf_paths(tree)
  perm = mapping(tree, param_names(groups), argument, tensors=tensors(groups))
  leaves, paths = [leaves[j] for j in perm], [paths[j] for j in perm]
  _common.check_leaves(leaves, paths, described(groups), "PyTorch", argument=argument, order=ORDER)
  return leaves, treedef, perm


def to_leaf_order(values: list[Any], perm: list[int]) -> list[Any]:
  """``values`` in the optimizer's order, rearranged into the tree's leaf order."""
  out: list[Any] = [None] * len(values)
  for i, j in enumerate(perm):
    out[j] = values[i]
  return out


def tensors(groups: Sequence[dict]) -> list[Any]:
  """The optimizer's parameters, in its order."""
  return [p for group in groups for p in group["params"]]


def described(groups: Sequence[dict]) -> list[tuple[tuple[int, ...], str, str]]:
  """Per parameter, in the optimizer's order: its shape, its dtype's name and where it is, for messages."""
  out = []
  for g, group in enumerate(groups):
    names = group.get("param_names")
    for j, p in enumerate(group["params"]):
      where = f"param_groups[{g}]['params'][{j}]"
      if names is not None:
        where += f" ({names[j]!r})"
      out.append((tuple(p.shape), _common.dtype_name(p.dtype), where))
  return out
