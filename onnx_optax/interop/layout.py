"""Which PyTorch parameter each leaf of one's own JAX model is, and by which array operation.

A model ported to JAX keeps PyTorch's numbers in other names and layouts: a
``torch.nn.Linear``'s ``weight`` is ``(out, in)`` where ``flax.nnx.Linear``'s
``kernel`` is ``(in, out)``; ``torch.nn.MultiheadAttention`` packs the query,
key and value projections in one ``in_proj_weight`` of ``(3 E, E)`` where
``flax.nnx.MultiHeadAttention`` keeps three kernels of ``(E, heads, head_dim)``.
A :class:`Layout` says, for each JAX leaf (by its path, keys joined with
``'.'``), which PyTorch tensor or tensors it is made of and by which exact
operations: a split (:meth:`Part.take`, rows ``start:stop`` of one axis), an
axis permutation (:meth:`Part.transpose`), a reshape (:meth:`Part.reshape`),
in that order, and a concatenation of several parts (:func:`concat`). Every
operation moves numbers and computes none, so the map is exact both ways:
:meth:`Layout.to_jax` applies it, :meth:`Layout.to_torch` inverts it.

The bridges take it as ``layout=`` (:func:`~onnx_optax.interop.from_torch`,
:func:`~onnx_optax.interop.to_torch`): the optimizer's state follows its
parameter through the same operations, field by field as the rule's registry
entry declares them (:attr:`onnx_optax.registry.Field.shape`): a field of the
parameter's shape (``exp_avg``, ``momentum_buffer``, ``sum``) goes through the
parameter's operations; a scalar per parameter (:data:`~onnx_optax.registry.PER_TENSOR`,
NAdam's ``mu_product``) and the step count follow the parameter as they are. A
JAX leaf made of several PyTorch parameters takes one count: parameters at
different steps, or in param groups with other options, are refused. An
element-wise rule (each element of the new state and update depends on the
same element of the old ones alone) commutes with every operation here, so the
carried run is PyTorch's exactly; its field of any other shape is refused. A
rule that computes on whole matrices or reduces over a tensor (it declares
:attr:`~onnx_optax.registry.Rule.ranks` or :attr:`~onnx_optax.registry.Rule.reduces`)
is refused under any operation it does not declare in
:attr:`~onnx_optax.registry.Rule.commutes_with`, which also says the fields a
field of a shape of its own takes (a matrix's row means are its transpose's
column means).

:func:`onnx_optax.interop.flax_nnx.derive` builds the layout of a PyTorch
module and its Flax NNX port.

Importing this module imports neither PyTorch nor Flax.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from onnx_optax import registry
from onnx_optax.interop import _common

__all__ = ["Layout", "Leaf", "Part", "concat", "leaf_name", "part"]


def leaf_name(path: Sequence[Any]) -> str:
  """A JAX leaf's name: its path's keys joined with ``'.'`` (a trailing ``.value``, Flax NNX's
  ``Variable`` attribute, left out): ``{"linear": {"kernel": Param(...)}}``'s leaf is
  ``"linear.kernel"``, ``[{"w": ...}]``'s is ``"0.w"``."""
  keys = list(path)
  if keys and isinstance(keys[-1], jax.tree_util.GetAttrKey) and keys[-1].name == "value":
    keys = keys[:-1]
  out = []
  for key in keys:
    if isinstance(key, jax.tree_util.DictKey):
      out.append(str(key.key))
    elif isinstance(key, jax.tree_util.SequenceKey):
      out.append(str(key.idx))
    elif isinstance(key, jax.tree_util.GetAttrKey):
      out.append(key.name)
    elif isinstance(key, jax.tree_util.FlattenedIndexKey):
      out.append(str(key.key))
    else:
      out.append(str(key))
  return ".".join(out)


@dataclasses.dataclass(frozen=True)
class Part:
  """One PyTorch tensor (or rows of one) and the operations that bring it into a JAX leaf.

  Built with :func:`part` and its methods, each returning a new ``Part``:
  ``part("attn.in_proj_weight").take(0, 0, 8).transpose(1, 0).reshape(8, 2, 4)``
  is rows ``0:8`` of ``in_proj_weight``, transposed, reshaped to ``(8, 2, 4)``.

  Attributes:
    name: the PyTorch tensor's name (``model.named_parameters()``' or ``model.state_dict()``' key).
    rows: ``(axis, start, stop)``: only those rows of that axis (a split); None: the whole tensor.
    ops: ``("transpose", permutation)`` and ``("reshape", shape)`` steps, applied in order after
      the split.
  """

  name: str
  rows: tuple[int, int, int] | None = None
  ops: tuple[tuple[str, tuple[int, ...]], ...] = ()

  def take(self, axis: int, start: int, stop: int) -> Part:
    """Rows ``start:stop`` of ``axis`` (a split of the tensor among several JAX leaves); first."""
    if self.rows is not None or self.ops:
      raise ValueError(f"part({self.name!r}): take() comes first and once, before transpose() and reshape()")
    return dataclasses.replace(self, rows=(int(axis), int(start), int(stop)))

  def transpose(self, *permutation: int) -> Part:
    """The axes permuted: the result's axis ``i`` is axis ``permutation[i]`` (``jnp.transpose``)."""
    return dataclasses.replace(self, ops=(*self.ops, ("transpose", tuple(int(a) for a in permutation))))

  def reshape(self, *shape: int) -> Part:
    """Reshaped in C order (``jnp.reshape``) to ``shape`` (no ``-1``)."""
    return dataclasses.replace(self, ops=(*self.ops, ("reshape", tuple(int(s) for s in shape))))

  def __str__(self) -> str:
    text = f"part({self.name!r})"
    if self.rows is not None:
      text += ".take({}, {}, {})".format(*self.rows)
    for op, args in self.ops:
      text += f".{op}({', '.join(map(str, args))})"
    return text


def part(name: str) -> Part:
  """The PyTorch tensor ``name``, whole and as it is; the methods of :class:`Part` add operations."""
  return Part(str(name))


@dataclasses.dataclass(frozen=True)
class Leaf:
  """A JAX leaf: its parts, concatenated along ``axis`` when there are several (:func:`concat`)."""

  parts: tuple[Part, ...]
  axis: int = 0

  def __str__(self) -> str:
    if len(self.parts) == 1:
      return str(self.parts[0])
    return f"concat([{', '.join(map(str, self.parts))}], axis={self.axis})"


def concat(parts: Iterable[Part | str], axis: int = 0) -> Leaf:
  """One JAX leaf made of several PyTorch tensors (or parts), concatenated along ``axis``."""
  return Leaf(tuple(part(p) if isinstance(p, str) else p for p in parts), int(axis))


def _forward_shape(
  p: Part, shape: tuple[int, ...], where: str
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
  """The shape ``p`` gives a tensor of ``shape``, and the shape before each op."""
  if p.rows is not None:
    axis, start, stop = p.rows
    if not 0 <= axis < len(shape) or not 0 <= start < stop <= shape[axis]:
      raise ValueError(f"{where}: {p} takes rows {start}:{stop} of axis {axis} of a tensor of shape {shape}")
    shape = shape[:axis] + (stop - start,) + shape[axis + 1 :]
  before = []
  for op, args in p.ops:
    before.append(shape)
    if op == "transpose":
      if sorted(args) != list(range(len(shape))):
        raise ValueError(f"{where}: {p} permutes axes {args}, not a permutation of a tensor of shape {shape}")
      shape = tuple(shape[a] for a in args)
    else:
      if math.prod(args) != math.prod(shape) or any(s < 0 for s in args):
        raise ValueError(f"{where}: {p} reshapes a tensor of shape {shape} to {args}, of another size")
      shape = args
  return shape, before


class Layout:
  """Which PyTorch tensor (or tensors, or rows of one) each JAX leaf is, and by which operations.

  Args:
    leaves: JAX leaf name (:func:`leaf_name`: ``"encoder.0.linear.kernel"``) -> its source: a
      PyTorch name (the tensor as it is), a :class:`Part` or a :func:`concat` of parts.
    shapes: PyTorch name -> the tensor's shape, for every name ``leaves`` uses
      (``{n: tuple(t.shape) for n, t in model.state_dict().items()}``).

  Checked when built: each part's operations fit its tensor, and the parts of one PyTorch
  tensor tile it exactly (the rows of one axis, each row once). Refused, naming the tensor:
  rows that no JAX leaf holds, and rows (or a whole tensor) two leaves hold: a weight that
  PyTorch ties (one parameter used twice, an output head that is the embedding) is one
  parameter, and must be one JAX leaf, which the JAX model uses twice.

  Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from onnx_optax.interop.layout import Layout, part
    >>> layout = Layout({"dense.kernel": part("fc.weight").transpose(1, 0), "dense.bias": "fc.bias"},
    ...                 shapes={"fc.weight": (3, 2), "fc.bias": (3,)})
    >>> weight = np.arange(6, dtype=np.float32).reshape(3, 2)
    >>> torch_named = {"fc.weight": weight, "fc.bias": np.zeros(3, np.float32)}
    >>> params = layout.to_jax(torch_named)
    >>> params["dense"]["kernel"].shape
    (2, 3)
    >>> bool((layout.to_torch(params)["fc.weight"] == torch_named["fc.weight"]).all())
    True
  """

  def __init__(self, leaves: Mapping[str, Part | Leaf | str], shapes: Mapping[str, Sequence[int]]):
    self.shapes = {str(n): tuple(int(s) for s in shape) for n, shape in shapes.items()}
    self.leaves: dict[str, Leaf] = {}
    self.out_shapes: dict[str, tuple[int, ...]] = {}
    self._part_shapes: dict[tuple[str, int], tuple[tuple[int, ...], list[tuple[int, ...]]]] = {}
    pieces: dict[str, list[tuple[str, Part]]] = {}
    for path, source in leaves.items():
      leaf = (
        source if isinstance(source, Leaf) else Leaf((part(source) if isinstance(source, str) else source,))
      )
      self.leaves[path] = leaf
      outs = []
      for i, p in enumerate(leaf.parts):
        if p.name not in self.shapes:
          raise ValueError(f"the JAX leaf {path!r} is made of {p.name!r}, which shapes= does not list")
        self._part_shapes[(path, i)] = _forward_shape(p, self.shapes[p.name], f"the JAX leaf {path!r}")
        outs.append(self._part_shapes[(path, i)][0])
        pieces.setdefault(p.name, []).append((path, p))
      if len(outs) == 1:
        self.out_shapes[path] = outs[0]
      else:
        a = leaf.axis
        if any(len(s) != len(outs[0]) or s[:a] + s[a + 1 :] != outs[0][:a] + outs[0][a + 1 :] for s in outs):
          raise ValueError(
            f"the JAX leaf {path!r} concatenates parts of shapes {outs} along axis {a}: the other axes differ"
          )
        self.out_shapes[path] = outs[0][:a] + (sum(s[a] for s in outs),) + outs[0][a + 1 :]
    self.pieces = pieces
    for name, used in pieces.items():
      self._check_tiled(name, used)

  def _check_tiled(self, name: str, used: list[tuple[str, Part]]) -> None:
    shape = self.shapes[name]
    whole = [path for path, p in used if p.rows is None]
    if whole and len(used) > 1:
      raise ValueError(
        f"the PyTorch tensor {name!r} is in several JAX leaves {[path for path, _ in used]}: a tensor "
        f"used twice (a tied weight) is one parameter and must be one JAX leaf, which the model uses twice"
      )
    if whole:
      return
    axes = {p.rows[0] for _, p in used if p.rows is not None}
    if len(axes) != 1:
      raise ValueError(
        f"the PyTorch tensor {name!r} is split along several axes {sorted(axes)}: split one axis"
      )
    spans = sorted((p.rows[1], p.rows[2], path) for path, p in used if p.rows is not None)
    end = 0
    for start, stop, path in spans:
      if start < end:
        raise ValueError(
          f"rows {start}:{min(stop, end)} of the PyTorch tensor {name!r} are in two JAX leaves (one of "
          f"them {path!r}): each row is one parameter's, in one leaf"
        )
      if start > end:
        raise ValueError(
          f"rows {end}:{start} of axis {axes.pop()} of the PyTorch tensor {name!r} are in no JAX leaf"
        )
      end = stop
    axis = axes.pop()
    if end != shape[axis]:
      raise ValueError(
        f"rows {end}:{shape[axis]} of axis {axis} of the PyTorch tensor {name!r} are in no JAX leaf"
      )

  def sources(self, path: str) -> list[str]:
    """The PyTorch names the JAX leaf ``path`` is made of."""
    return [p.name for p in self.leaves[path].parts]

  def __repr__(self) -> str:
    return "Layout({\n" + "".join(f"  {path!r}: {leaf},\n" for path, leaf in self.leaves.items()) + "})"

  # -- applying the map --------------------------------------------------------------------------

  def _forward(self, path: str, values: Sequence[Any]) -> Any:
    leaf = self.leaves[path]
    outs = []
    for p, value in zip(leaf.parts, values):
      if p.rows is not None:
        axis, start, stop = p.rows
        value = jax.lax.slice_in_dim(value, start, stop, axis=axis)
      for op, args in p.ops:
        value = jnp.transpose(value, args) if op == "transpose" else jnp.reshape(value, args)
      outs.append(value)
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=leaf.axis)

  def _backward(self, path: str, value: Any) -> list[tuple[Part, Any]]:
    """The pieces of the PyTorch tensors the JAX leaf ``path`` holds: ``(part, its rows)``."""
    leaf = self.leaves[path]
    out = []
    offset = 0
    for i, p in enumerate(leaf.parts):
      shape, before = self._part_shapes[(path, i)]
      piece = value
      if len(leaf.parts) > 1:
        piece = jax.lax.slice_in_dim(value, offset, offset + shape[leaf.axis], axis=leaf.axis)
        offset += shape[leaf.axis]
      for (op, args), shape_before in reversed(list(zip(p.ops, before))):
        inverse = tuple(int(a) for a in np.argsort(args))
        piece = jnp.transpose(piece, inverse) if op == "transpose" else jnp.reshape(piece, shape_before)
      out.append((p, piece))
    return out

  def to_jax(self, tensors: Mapping[str, Any], like: Any = None) -> Any:
    """The JAX leaves made of the PyTorch ``tensors`` (name -> tensor or array).

    ``like``: the JAX tree to fill (Flax NNX's ``nnx.state(model)``, a nested dict; its leaves
    say each leaf's shape and dtype, which must be the map's and the tensor's: nothing is cast);
    its leaves' names must be in the map. None: every leaf of the map, in nested dicts split
    at ``'.'``. ``tensors`` may hold more names than the map uses (a ``state_dict()``'s
    buffers without a JAX counterpart). Each value is copied once into a JAX array.
    """
    if like is None:
      nested: dict[str, Any] = {}
      for path in self.leaves:
        node = nested
        *heads, last = path.split(".")
        for key in heads:
          node = node.setdefault(key, {})
        node[last] = jax.ShapeDtypeStruct(
          self.out_shapes[path], _dtype_of(tensors, self.sources(path)[0], path)
        )
      like = nested
    flat, treedef = jax.tree_util.tree_flatten_with_path(like)
    out = []
    for keys, leaf in flat:
      name = leaf_name(keys)
      if name not in self.leaves:
        raise ValueError(
          f"the JAX leaf {name!r} is in no entry of the layout (its leaves: {sorted(self.leaves)})"
        )
      values = []
      for source in self.sources(name):
        if source not in tensors:
          raise ValueError(
            f"the JAX leaf {name!r} is made of the PyTorch tensor {source!r}, which is not given"
          )
        host = _host(tensors[source])
        value = jnp.asarray(host)
        if _common.dtype_name(value.dtype) != _common.dtype_name(host.dtype):
          raise ValueError(
            f"the PyTorch tensor {source!r} has dtype {_common.dtype_name(host.dtype)}, which JAX's "
            f"default 32-bit mode truncates: call jax.config.update('jax_enable_x64', True) first "
            f"(nothing is cast)"
          )
        values.append(value)
      value = self._forward(name, values)
      expected = (tuple(np.shape(leaf)), _common.dtype_name(leaf.dtype))
      if (tuple(value.shape), _common.dtype_name(value.dtype)) != expected:
        raise ValueError(
          f"the JAX leaf {name!r} has shape {expected[0]} and dtype {expected[1]}; the layout makes it "
          f"{self.leaves[name]}, of shape {tuple(value.shape)} and dtype {_common.dtype_name(value.dtype)}"
        )
      out.append(value)
    return jax.tree_util.tree_unflatten(treedef, out)

  def to_torch(self, tree: Any) -> dict[str, Any]:
    """The PyTorch tensors (as JAX arrays, keyed by name) that the JAX leaves of ``tree`` make.

    The inverse of :meth:`to_jax`: every tensor that a leaf of ``tree`` holds a part of, whole;
    a tensor only some of whose parts are in ``tree`` is refused, naming the missing leaves.
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_common.is_masked)
    by_name = {leaf_name(path): leaf for path, leaf in flat}
    pieces = _pieces(self, by_name)
    return {name: _assemble(self.shapes[name], entries) for name, entries in pieces.items()}


def _pieces(layout: Layout, by_name: Mapping[str, Any]) -> dict[str, list[tuple[Part, Any]]]:
  """Per PyTorch name, the pieces the JAX leaves ``by_name`` hold (all of them, or refused)."""
  pieces: dict[str, list[tuple[Part, Any]]] = {}
  for name, value in by_name.items():
    if name not in layout.leaves:
      raise ValueError(
        f"the JAX leaf {name!r} is in no entry of the layout (its leaves: {sorted(layout.leaves)})"
      )
    if _common.is_masked(value):
      for source in layout.sources(name):
        pieces.setdefault(source, []).append((part(source), value))
      continue
    if tuple(np.shape(value)) != layout.out_shapes[name]:
      raise ValueError(
        f"the JAX leaf {name!r} has shape {tuple(np.shape(value))}; the layout makes it "
        f"{layout.leaves[name]}, of shape {layout.out_shapes[name]}"
      )
    for p, piece in layout._backward(name, jnp.asarray(value)):
      pieces.setdefault(p.name, []).append((p, piece))
  for name in pieces:
    missing = [path for path, _ in layout.pieces[name] if path not in by_name]
    if missing:
      raise ValueError(
        f"the PyTorch tensor {name!r} is also in the JAX leaves {missing}, which are not given"
      )
  return pieces


def _assemble(shape: tuple[int, ...], entries: list[tuple[Part, Any]]) -> Any:
  if any(_common.is_masked(v) for _, v in entries):
    return optax.MaskedNode()
  if len(entries) == 1 and entries[0][0].rows is None:
    return entries[0][1]
  ordered = sorted(entries, key=lambda e: e[0].rows[1] if e[0].rows else 0)
  axis = ordered[0][0].rows[0] if ordered[0][0].rows else 0
  return jnp.concatenate([v for _, v in ordered], axis=axis)


def _host(value: Any) -> Any:
  """A tensor's values without a copy where it is on the CPU; other arrays as they are."""
  if hasattr(value, "detach") and hasattr(value, "numpy"):
    return value.detach().cpu().numpy()
  return value


def _dtype_of(tensors: Mapping[str, Any], name: str, path: str) -> str:
  if name not in tensors:
    raise ValueError(f"the JAX leaf {path!r} is made of the PyTorch tensor {name!r}, which is not given")
  return _common.dtype_name(_host(tensors[name]).dtype)


# -- the optimizer's state through the map (used by the bridges) --------------------------------------


def _rule(node: Any) -> registry.Rule:
  for rule in registry.rules():
    for r in rule.family():
      if r.state is type(node):
        return r
  raise TypeError(f"no registered rule keeps a {type(node).__name__}")


def _kind(op: str, args: tuple[int, ...]) -> str:
  """An operation's kind among :data:`~onnx_optax.registry.LAYOUT_OPERATIONS`."""
  n = len(args)
  if op == "transpose" and n >= 2 and args == (*range(n - 2), n - 1, n - 2):
    return "transpose_last_two"
  return op


def _operations(op: Leaf) -> set[str]:
  """The kinds of operation of a leaf's map (:data:`~onnx_optax.registry.LAYOUT_OPERATIONS`)."""
  kinds = {"concat"} if len(op.parts) > 1 else set()
  for p in op.parts:
    kinds |= {"take"} if p.rows is not None else set()
    kinds |= {_kind(kind, args) for kind, args in p.ops}
  return kinds


def _elementwise(rule: registry.Rule) -> bool:
  """Each element of the new state and update depends on the same element of the old ones alone:
  neither :attr:`~onnx_optax.registry.Rule.ranks` nor :attr:`~onnx_optax.registry.Rule.reduces`."""
  return not rule.ranks and not rule.reduces


def _commutes(node: Any, path: str, op: Leaf) -> None:
  """Refuses a rule whose step need not commute with the leaf's operations.

  An element-wise rule commutes with every operation. A rule that computes on whole matrices (it
  declares :attr:`~onnx_optax.registry.Rule.ranks`, ``torch.optim.Muon``'s orthogonalization) or
  reduces over its tensor (:attr:`~onnx_optax.registry.Rule.reduces`) commutes only with those it
  declares in :attr:`~onnx_optax.registry.Rule.commutes_with` (none where it declares nothing).
  """
  rule = _rule(node)
  if _elementwise(rule):
    return
  outside = _operations(op) - set(rule.commutes_with)
  if outside:
    why = f"computes on whole matrices (ranks {rule.ranks})" if rule.ranks else "reduces over each tensor"
    raise ValueError(
      f"the rule {rule.name} {why}, and its step need not commute with the operations {sorted(outside)} "
      f"of the JAX leaf {path!r} ({op}): carry that parameter in PyTorch's own layout"
    )


def _moves(field: registry.Field, op: Leaf) -> bool:
  """Whether the field's value changes through the leaf's operations: a field of the parameter's shape
  or of a shape of its own (not one scalar per parameter) under an operation that moves numbers."""
  if field.shape is registry.PER_TENSOR:
    return False
  return not (len(op.parts) == 1 and op.parts[0].rows is None and not op.parts[0].ops)


def _own_shape(rule: registry.Rule, field: registry.Field, node: Any, path: str, op: Leaf) -> bool:
  """Whether a field of a shape of its own follows the leaf's operations by the rule's declaration
  (:attr:`~onnx_optax.registry.Rule.commutes_with`, checked by :func:`_commutes`); refuses one of an
  element-wise rule, which declares none."""
  if _elementwise(rule):
    raise ValueError(
      f"the state field {field.name!r} of {type(node).__name__} has a shape of its own, which does not "
      f"follow the JAX leaf {path!r}'s operations {op}: carry that parameter without a layout operation"
    )
  p = op.parts[0]
  if len(op.parts) > 1 or p.rows is not None or any(kind != "transpose" for kind, _ in p.ops):
    raise ValueError(
      f"the rule {rule.name} declares that its step commutes with the operations {sorted(_operations(op))} "
      f"of the JAX leaf {path!r} ({op}), but its state field {field.name!r} has a shape of its own, "
      f"which follows axis permutations only: declare no other operation in its commutes_with"
    )
  return True


def _source_field(rule: registry.Rule, name: str, p: Part) -> str:
  """The field whose numbers, before ``p``'s operations, the field ``name`` holds after them."""
  for kind, args in reversed(p.ops):
    name = rule.commutes_with.get(_kind(kind, args), {}).get(name, name)
  return name


def _permuted(p: Part, value: Any, inverse: bool = False) -> Any:
  perms = [args for _, args in p.ops]
  if inverse:
    perms = [tuple(int(a) for a in np.argsort(args)) for args in reversed(perms)]
  for args in perms:
    value = jnp.transpose(value, args)
  return value


def state_to_jax(
  layout: Layout,
  transforms_by_label: Mapping[str, optax.GradientTransformation],
  labels: Mapping[str, str],
  state: Any,
  params: Any,
) -> tuple[Any, Any]:
  """A bridge's transform and state over the PyTorch-named tree, over the JAX ``params`` instead.

  ``labels``: PyTorch name -> the label of its transform (its param group and count).
  """
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  names = [leaf_name(path) for path, _ in flat]
  jax_labels = []
  for name in names:
    if name not in layout.leaves:
      raise ValueError(
        f"the JAX leaf {name!r} is in no entry of the layout (its leaves: {sorted(layout.leaves)})"
      )
    own = {source: labels[source] for source in layout.sources(name) if source in labels}
    if len(set(own.values())) > 1:
      raise ValueError(
        f"the JAX leaf {name!r} is made of PyTorch parameters {sorted(own)} at different steps or in "
        f"param groups with different options ({own}): one leaf takes one count and one set of "
        f"hyperparameters; carry them as separate leaves"
      )
    jax_labels.append(next(iter(own.values())))
  tx = _common.partition(dict(transforms_by_label), jax_labels, treedef)
  is_rule_state = _common._rule_state_test()

  def onto(node: Any) -> Any:
    if not is_rule_state(node):
      return node
    rule = _rule(node)
    by_field = {f.name: dict(zip(*_named_entries(getattr(node, f.name)))) for f in rule.fields}
    new = {}
    for f in rule.fields:
      by_torch = by_field[f.name]
      values = []
      for name in names:
        op = layout.leaves[name]
        sources = [by_torch[s] for s in layout.sources(name)]
        if all(_common.is_masked(v) for v in sources):
          values.append(optax.MaskedNode())
          continue
        _commutes(node, name, op)
        if f.like_params:
          values.append(layout._forward(name, sources))
        elif _moves(f, op) and _own_shape(rule, f, node, name, op):
          p, torch_shape = op.parts[0], layout.shapes[op.parts[0].name]
          if not f.exists_for(torch_shape):  # one zero in its place (registry.ABSENT), as it is
            values.append(sources[0])
            continue
          value = _permuted(p, by_field[_source_field(rule, f.name, p)][p.name])
          expected = f.shape_for(layout.out_shapes[name])
          if tuple(value.shape) != expected:
            raise ValueError(
              f"the rule {rule.name}'s commutes_with makes its state field {f.name!r} of the JAX leaf "
              f"{name!r} ({op}) of shape {tuple(value.shape)}, where the leaf's is {expected}: "
              f"the declaration is wrong"
            )
          values.append(value)
        else:
          if any(not np.array_equal(np.asarray(sources[0]), np.asarray(v)) for v in sources[1:]):
            raise ValueError(
              f"the JAX leaf {name!r} is made of PyTorch parameters {layout.sources(name)} whose "
              f"{f.name!r} differ: one leaf keeps one"
            )
          values.append(sources[0])
      new[f.name] = jax.tree_util.tree_unflatten(treedef, values)
    return node._replace(**new)

  mapped = jax.tree.map(onto, state, is_leaf=is_rule_state)
  return tx, _common.counts_placed(mapped, [leaf for _, leaf in flat])


def _named_entries(tree: Any) -> tuple[list[str], list[Any]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_common.is_masked)
  return [leaf_name(path) for path, _ in flat], [leaf for _, leaf in flat]


def state_to_torch(layout: Layout, state: Any) -> Any:
  """A state over JAX leaves (``state_to_jax``'s), over the PyTorch names again (a flat dict)."""
  is_rule_state = _common._rule_state_test()

  def back(node: Any) -> Any:
    if not is_rule_state(node):
      return node
    rule = _rule(node)
    new = {}
    own: dict[str, dict[str, Any]] = {f.name: {} for f in rule.fields if not f.like_params}
    for f in rule.fields:
      names, entries = _named_entries(getattr(node, f.name))
      for name, value in zip(names, entries):
        if name not in layout.leaves:
          raise ValueError(
            f"the JAX leaf {name!r} is in no entry of the layout (its leaves: {sorted(layout.leaves)})"
          )
        if not _common.is_masked(value):
          _commutes(node, name, layout.leaves[name])
      if f.like_params:
        new[f.name] = layout.to_torch(dict(zip(names, entries)))
        continue
      for name, value in zip(names, entries):
        op, target = layout.leaves[name], f.name
        if not _common.is_masked(value) and _moves(f, op) and _own_shape(rule, f, node, name, op):
          p = op.parts[0]
          if f.exists_for(layout.out_shapes[name]):  # else one zero in its place, as it is
            target, value = _source_field(rule, f.name, p), _permuted(p, jnp.asarray(value), inverse=True)
        out = own[target]
        for source in layout.sources(name):
          if source in out and not _common.is_masked(value):
            if not np.array_equal(np.asarray(out[source]), np.asarray(value)):
              raise ValueError(
                f"the PyTorch tensor {source!r} is in several JAX leaves whose {f.name!r} differ: "
                f"PyTorch keeps one per parameter"
              )
          out[source] = value
    return node._replace(**new, **own)

  return jax.tree.map(back, state, is_leaf=is_rule_state)
