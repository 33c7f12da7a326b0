"""The :class:`~onnx_optax.interop.layout.Layout` of a PyTorch module and its Flax NNX port.

:func:`derive` walks a ``torch.nn.Module`` and its port, a ``flax.nnx.Module``
with the same attribute names, side by side, and says for every parameter and
buffer of the port which PyTorch tensor it is and by which operations:

=================================  ==============================  ===========================================
PyTorch                            Flax NNX                        the port's leaves
=================================  ==============================  ===========================================
``Linear``                         ``nnx.Linear``                  ``kernel = weight.T``, ``bias``
``Conv1d/2d/3d``                   ``nnx.Conv``                    ``kernel = weight`` ``(out, in, *k)`` as
                                                                   ``(*k, in, out)``, ``bias``
``ConvTranspose1d/2d/3d``          ``nnx.ConvTranspose``           ``kernel = weight`` ``(in, out, *k)`` as
                                   (``transpose_kernel=True``)     ``(*k, out, in)``, ``bias``
``Embedding``                      ``nnx.Embed``                   ``embedding = weight``
``LayerNorm``, ``GroupNorm``       ``nnx.LayerNorm``,              ``scale = weight``, ``bias``
                                   ``nnx.GroupNorm``
``RMSNorm``                        ``nnx.RMSNorm``                 ``scale = weight``
``BatchNorm1d/2d/3d``              ``nnx.BatchNorm``               ``scale``, ``bias``; the batch statistics
                                                                   ``mean = running_mean``,
                                                                   ``var = running_var``
``MultiheadAttention``             ``nnx.MultiHeadAttention``      ``query``/``key``/``value`` ``.kernel`` =
                                                                   their rows of ``in_proj_weight`` (or
                                                                   ``q/k/v_proj_weight``), transposed, as
                                                                   ``(in, heads, head_dim)``; their
                                                                   ``.bias`` the rows of ``in_proj_bias`` as
                                                                   ``(heads, head_dim)``; ``out.kernel =
                                                                   out_proj.weight.T`` as ``(heads, head_dim,
                                                                   out)``, ``out.bias``
``Sequential``, ``ModuleList``     ``nnx.Sequential``,             by index
                                   ``nnx.List``, a list
``ModuleDict``                     ``nnx.Dict``, a dict            by key
any other module                   any ``nnx.Module``              its own parameters and buffers by name, as
                                                                   they are; its children by attribute name
=================================  ==============================  ===========================================

Where the port's names differ, ``renames`` gives the few that do: a PyTorch
module's or tensor's path -> the port's path (``{"ln_f": "final_norm"}``); the
rest keep their names. A parameter that PyTorch ties (the same tensor in two
modules, an output head that is the embedding) is one leaf of the port, which
uses it twice: a PyTorch module whose tensors are all tied to ones met before
(in ``named_parameters()``' order) needs no counterpart in the port.

Refused, naming the module, its path on both sides, and the shapes on both
sides where they are known: a module with no counterpart, a pair of layers
that the table does not pair (a ``Linear`` beside an ``nnx.Conv``; an
``nnx.ConvTranspose`` without ``transpose_kernel=True``, whose kernel is
PyTorch's flipped; a ``MultiheadAttention`` with ``add_bias_kv`` or
``add_zero_attn``), a tensor whose shape the operations do not make the
port's, and a tensor or a port's leaf that nothing pairs.

What the layout cannot see is what the port computes: run the check in
docs/interop.md ("Carrying into one's own model") once, a step of the port
beside PyTorch's, before training.

Importing this module imports neither PyTorch nor Flax.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from onnx_optax.interop import _common
from onnx_optax.interop.layout import Layout, Part, _forward_shape, leaf_name, part

__all__ = ["derive"]


def _shape(value: Any) -> tuple[int, ...]:
  return tuple(int(s) for s in value.shape)


class _Walk:
  def __init__(self, torch: Any, nnx: Any, root: Any, renames: Mapping[str, str]):
    self.torch, self.nnx, self.root = torch, nnx, root
    self.renames = dict(renames)
    self.used_renames: set[str] = set()
    self.leaves: dict[str, Part] = {}
    self.shapes: dict[str, tuple[int, ...]] = {}
    self.seen: dict[int, str] = {}  # id of a PyTorch tensor -> its first name (tied weights)
    self.port_shapes: dict[str, tuple[int, ...]] = {}
    flat, _ = jax.tree_util.tree_flatten_with_path(nnx.state(root, nnx.Any(nnx.Param, nnx.BatchStat)))
    self.port_shapes = {leaf_name(path): _shape(leaf) for path, leaf in flat}

  # -- the port's side -----------------------------------------------------------------------------

  def resolve(self, path: str) -> Any:
    node = self.root
    for key in path.split(".") if path else []:
      node = self.child(node, key)
      if node is None:
        return None
    return node

  @staticmethod
  def child(node: Any, key: str) -> Any:
    if isinstance(node, (list, tuple)) or type(node).__name__ == "List":
      return node[int(key)] if key.isdigit() and int(key) < len(node) else None
    if isinstance(node, Mapping) or type(node).__name__ == "Dict":
      try:
        return node[key]
      except (KeyError, TypeError):
        return getattr(node, key, None)
    if type(node).__name__ == "Sequential" and key.isdigit():
      layers = getattr(node, "layers", ())
      return layers[int(key)] if int(key) < len(layers) else None
    return getattr(node, key, None)

  def port_path(self, parent: str, key: str, torch_path: str) -> str:
    if torch_path in self.renames:
      self.used_renames.add(torch_path)
      return self.renames[torch_path]
    parent_node = self.resolve(parent)
    if type(parent_node).__name__ == "Sequential" and key.isdigit():
      return _join(parent, "layers", key)
    return _join(parent, key)

  # -- the pairs -------------------------------------------------------------------------------------

  def add(self, port: str, source: str, tensor: Any, p: Part | None = None, *, module: str = "") -> None:
    self.shapes[source] = _shape(tensor)
    p = p if p is not None else part(source)
    self.leaves[port] = p
    if port not in self.port_shapes:
      raise ValueError(
        f"{module or 'the module'}: the PyTorch tensor {source!r} {_shape(tensor)} has no leaf "
        f"{port!r} in the port{_hint(self.renames)}"
      )
    made, _ = _forward_shape(p, _shape(tensor), f"{module}: the port's leaf {port!r}")
    if made != self.port_shapes[port]:
      raise ValueError(
        f"{module or 'the module'}: the port's leaf {port!r} has shape {self.port_shapes[port]}; {p} makes "
        f"the PyTorch tensor {source!r} {_shape(tensor)} a {made}: the port's layer is built with other "
        f"sizes, or the PyTorch tensor pairs with another leaf"
      )

  def refuse(self, what: str, torch_path: str, port_path: str, tmod: Any, nmod: Any) -> ValueError:
    tshapes = {n: _shape(t) for n, t in tmod.named_parameters(recurse=False)} if tmod is not None else {}
    nshapes = {
      k[len(port_path) + 1 :]: s for k, s in self.port_shapes.items() if k.startswith(port_path + ".")
    }
    return ValueError(
      f"{what}: the PyTorch module {torch_path or '<root>'!r} ({type(tmod).__name__}, tensors {tshapes}) "
      f"and the port's {port_path or '<root>'!r} ({type(nmod).__name__}, leaves {nshapes})"
      f"{_hint(self.renames)}"
    )

  def visit(self, tmod: Any, tpath: str, npath: str) -> None:
    nmod = self.resolve(npath)
    t, nnx = self.torch.nn, self.nnx
    if nmod is None:
      # A module whose tensors are all tied to ones met before (an output head that is the
      # embedding) has its leaves in the port already.
      if all(id(p) in self.seen for p in tmod.parameters()) and not list(tmod.buffers()):
        return
      raise self.refuse("no counterpart in the port", tpath, npath, tmod, nmod)
    own = list(tmod.named_parameters(recurse=False))
    for n, p in own:
      self.seen.setdefault(id(p), _join(tpath, n))
    T = lambda name: _join(tpath, name)  # noqa: E731
    N = lambda *names: _join(npath, *names)  # noqa: E731
    mod = f"{type(tmod).__name__} {tpath or '<root>'!r} / {type(nmod).__name__} {npath or '<root>'!r}"

    def pair(port: str, name: str, p: Part | None = None) -> None:
      tensor = getattr(tmod, name)
      if tensor is None:
        return
      if id(tensor) in self.seen and self.seen[id(tensor)] != T(name):
        return  # tied: the port's leaf is the first one's
      self.add(N(port), T(name), tensor, p, module=mod)

    def expect(kind: Any, why: str = "") -> None:
      if not isinstance(nmod, kind):
        raise self.refuse(
          f"a {type(tmod).__name__} pairs with an nnx.{kind.__name__}, not a {type(nmod).__name__}{why}",
          tpath,
          npath,
          tmod,
          nmod,
        )

    if isinstance(tmod, t.Linear):
      expect(nnx.Linear)
      pair("kernel", "weight", part(T("weight")).transpose(1, 0))
      pair("bias", "bias")
    elif isinstance(tmod, (t.Conv1d, t.Conv2d, t.Conv3d)):
      expect(nnx.Conv)
      n = tmod.weight.dim()
      pair("kernel", "weight", part(T("weight")).transpose(*range(2, n), 1, 0))
      pair("bias", "bias")
    elif isinstance(tmod, (t.ConvTranspose1d, t.ConvTranspose2d, t.ConvTranspose3d)):
      expect(nnx.ConvTranspose)
      if not getattr(nmod, "transpose_kernel", False):
        raise self.refuse(
          "PyTorch's transposed convolution is nnx.ConvTranspose with transpose_kernel=True (without it, "
          "the kernel is PyTorch's flipped, which no permutation makes): build the port with it",
          tpath,
          npath,
          tmod,
          nmod,
        )
      n = tmod.weight.dim()
      pair("kernel", "weight", part(T("weight")).transpose(*range(2, n), 1, 0))
      pair("bias", "bias")
    elif isinstance(tmod, t.Embedding):
      expect(nnx.Embed)
      pair("embedding", "weight")
    elif isinstance(tmod, t.LayerNorm):
      expect(nnx.LayerNorm)
      pair("scale", "weight")
      pair("bias", "bias")
    elif isinstance(tmod, t.GroupNorm):
      expect(nnx.GroupNorm)
      pair("scale", "weight")
      pair("bias", "bias")
    elif hasattr(t, "RMSNorm") and isinstance(tmod, t.RMSNorm):
      expect(nnx.RMSNorm)
      pair("scale", "weight")
    elif isinstance(tmod, t.modules.batchnorm._BatchNorm):
      expect(nnx.BatchNorm)
      pair("scale", "weight")
      pair("bias", "bias")
      pair("mean", "running_mean")
      pair("var", "running_var")
    elif isinstance(tmod, t.MultiheadAttention):
      expect(nnx.MultiHeadAttention)
      self.attention(tmod, nmod, T, N, mod, tpath, npath)
    elif isinstance(tmod, (t.Sequential, t.ModuleList, t.ModuleDict)) or not isinstance(
      tmod, tuple(_leaf_layers(t))
    ):
      for name, tensor in own:
        if id(tensor) in self.seen and self.seen[id(tensor)] != T(name):
          continue
        self.add(self.port_path(npath, name, T(name)), T(name), tensor, module=mod)
      for name, tensor in tmod.named_buffers(recurse=False):
        if name in tmod._non_persistent_buffers_set:
          continue
        port = self.port_path(npath, name, T(name))
        if port in self.port_shapes:  # a buffer the port keeps as a variable of its own
          self.add(port, T(name), tensor, module=mod)
      for name, child in tmod.named_children():
        self.visit(child, T(name), self.port_path(npath, name, T(name)))
      return
    # a leaf layer whose buffers the table does not pair (num_batches_tracked) stays PyTorch's

  def attention(self, tmod: Any, nmod: Any, T: Any, N: Any, mod: str, tpath: str, npath: str) -> None:
    if tmod.bias_k is not None or tmod.add_zero_attn:
      raise self.refuse(
        "add_bias_kv and add_zero_attn have no nnx.MultiHeadAttention counterpart", tpath, npath, tmod, nmod
      )
    E, H = tmod.embed_dim, tmod.num_heads
    D = E // H
    if nmod.num_heads != H or nmod.head_dim != D:
      raise self.refuse(
        f"PyTorch's {H} heads of {D} against the port's {nmod.num_heads} of {nmod.head_dim}",
        tpath,
        npath,
        tmod,
        nmod,
      )
    for i, port in enumerate(("query", "key", "value")):
      if tmod._qkv_same_embed_dim:
        weight = part(T("in_proj_weight")).take(0, i * E, (i + 1) * E)
        self.shapes[T("in_proj_weight")] = _shape(tmod.in_proj_weight)
      else:
        name = ("q_proj_weight", "k_proj_weight", "v_proj_weight")[i]
        weight = part(T(name))
        self.shapes[T(name)] = _shape(getattr(tmod, name))
      in_features = self.shapes[weight.name][1]
      self.add(
        N(port, "kernel"),
        weight.name,
        np.empty(self.shapes[weight.name]),
        weight.transpose(1, 0).reshape(in_features, H, D),
        module=mod,
      )
      if tmod.in_proj_bias is not None:
        bias = part(T("in_proj_bias")).take(0, i * E, (i + 1) * E).reshape(H, D)
        self.add(N(port, "bias"), T("in_proj_bias"), tmod.in_proj_bias, bias, module=mod)
    out = tmod.out_proj
    self.add(
      N("out", "kernel"),
      T("out_proj.weight"),
      out.weight,
      part(T("out_proj.weight")).transpose(1, 0).reshape(H, D, E),
      module=mod,
    )
    if out.bias is not None:
      self.add(N("out", "bias"), T("out_proj.bias"), out.bias, module=mod)


def _leaf_layers(t: Any) -> list[type]:
  layers = [
    t.Linear,
    t.Conv1d,
    t.Conv2d,
    t.Conv3d,
    t.ConvTranspose1d,
    t.ConvTranspose2d,
    t.ConvTranspose3d,
    t.Embedding,
    t.LayerNorm,
    t.GroupNorm,
    t.modules.batchnorm._BatchNorm,
    t.MultiheadAttention,
  ]
  return layers + ([t.RMSNorm] if hasattr(t, "RMSNorm") else [])


def _join(*names: str) -> str:
  return ".".join(n for n in names if n)


def _hint(renames: Mapping[str, str]) -> str:
  return (
    "; where the port names it otherwise, pass renames={<PyTorch path>: <the port's path>}"
    if not renames
    else f" (renames given: {dict(renames)})"
  )


def derive(torch_module: Any, nnx_module: Any, renames: Mapping[str, str] | None = None) -> Layout:
  """The layout of ``torch_module``'s parameters and buffers in its Flax NNX port ``nnx_module``.

  Args:
    torch_module: the ``torch.nn.Module``.
    nnx_module: its port, a ``flax.nnx.Module`` whose attributes have the same names (containers
      by index and key), each layer the table's counterpart (module docstring).
    renames: PyTorch path (a module's or a tensor's, ``"ln_f"``, ``"pos_embedding"``) -> the
      port's path (``"final_norm"``, ``"pos"``), for the names that differ.

  Returns:
    A :class:`~onnx_optax.interop.layout.Layout` keyed by the port's leaves (``nnx.state(port,
    nnx.Param, nnx.BatchStat)``), made of ``torch_module.state_dict()``'s tensors, which the
    bridges take as ``layout=``: ``layout.to_jax(torch_module.state_dict(), nnx.state(port))``
    copies the weights and the batch statistics into the port, ``layout.to_torch(...)`` back.

  Raises:
    ValueError: what the table cannot pair, naming the module, its two paths and the shapes on
      both sides (module docstring); a rename that names nothing.

  Example:
    >>> import torch
    >>> from flax import nnx
    >>> from onnx_optax.interop.flax_nnx import derive
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    >>> rngs = nnx.Rngs(0)
    >>> port = nnx.Sequential(nnx.Linear(3, 4, rngs=rngs), nnx.relu, nnx.Linear(4, 2, rngs=rngs))
    >>> layout = derive(model, port)
    >>> print(layout.leaves["layers.0.kernel"])
    part('0.weight').transpose(1, 0)
  """
  torch = _common.require("torch", "derive")
  from flax import nnx

  walk = _Walk(torch, nnx, nnx_module, renames or {})
  walk.visit(torch_module, "", "")
  unused = sorted(set(walk.renames) - walk.used_renames)
  if unused:
    raise ValueError(f"renames {unused} name no PyTorch module or tensor that has a counterpart to rename")
  missing = sorted(set(walk.port_shapes) - set(walk.leaves))
  if missing:
    raise ValueError(
      f"the port's leaves {[(m, walk.port_shapes[m]) for m in missing]} are made of no PyTorch tensor: "
      f"name their PyTorch counterparts with renames={{<PyTorch path>: <the port's path>}}, or leave "
      f"them out of the port"
    )
  layout = Layout(walk.leaves, walk.shapes)
  for path, shape in walk.port_shapes.items():
    if layout.out_shapes[path] != shape:
      sources = layout.sources(path)
      raise ValueError(
        f"the port's leaf {path!r} has shape {shape}; {layout.leaves[path]} makes the PyTorch tensor "
        f"{sources[0]!r} {layout.shapes[sources[0]]} a {layout.out_shapes[path]}: the port's layer is "
        f"built with other sizes, or the PyTorch tensor pairs with another leaf"
      )
  return layout
