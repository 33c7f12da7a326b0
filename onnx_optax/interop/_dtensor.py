"""PyTorch tensors on the host and back, DTensors (FSDP2's parameters and state) included.

What the PyTorch bridges read of a tensor is its values on the host; of a
``DTensor`` (``fully_shard``), this rank's shard with its place in the global
tensor (:class:`~onnx_optax.interop._common.HostPiece`). What they write is a
tensor like the one it replaces: on its device, and a ``DTensor`` with its
placements and mesh where that one is. Nothing here knows an optimizer.
Importing this module does not import PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from onnx_optax.interop import _common

__all__ = [
  "check_held",
  "check_mapped",
  "dtensor_region",
  "is_dtensor",
  "load",
  "put",
  "shares_memory",
  "to_host",
  "to_numpy",
  "to_tensor",
]


def to_numpy(torch: Any, tensor: Any) -> np.ndarray:
  """A CPU tensor's values as a NumPy view of its memory (no copy; bfloat16 too, as ``ml_dtypes``'),
  a tensor on another device's as a copy on the host. :func:`put` copies the view into JAX."""
  tensor = tensor.detach().cpu()
  if tensor.dtype == torch.bfloat16:
    import ml_dtypes  # a dependency of jax and of onnx_optax

    # The same bits: bfloat16 is the upper half of a float32, in both.
    return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return tensor.numpy()


def load(torch: Any, path: Any) -> Any:
  """What ``torch.save`` wrote at ``path``, its tensors mapped from the file (``mmap=True``) on the CPU:
  their pages are the file's (page cache), read as they are used, not memory of the process. A file
  of the legacy format (``_use_new_zipfile_serialization=False``), which cannot be mapped, is read."""
  try:
    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
  except RuntimeError as error:
    if "mmap" not in str(error):
      raise
    return torch.load(path, map_location="cpu", weights_only=True)


def shares_memory(array: Any, host: Any) -> bool:
  """A JAX array holds a buffer inside the NumPy array ``host``'s memory (``jax.device_put`` keeps
  64-byte aligned host memory of a CPU target instead of copying it)."""
  if not isinstance(host, np.ndarray) or host.size == 0:
    return False
  # The bytes a view spans (NumPy's byte_bounds, which moved in NumPy 2).
  spans = [(n - 1) * stride for n, stride in zip(host.shape, host.strides)]
  low = host.ctypes.data + sum(min(0, span) for span in spans)
  high = host.ctypes.data + sum(max(0, span) for span in spans) + host.itemsize
  for shard in getattr(array, "addressable_shards", ()):
    try:
      pointer = shard.data.unsafe_buffer_pointer()
    except Exception:  # a device whose buffers have no host address
      continue
    if low <= pointer < high:
      return True
  return False


def put(value: Any, leaf: Any) -> Any:
  """:func:`~onnx_optax.interop._common.put_like` into memory of JAX's own: one copy of the host values.

  ``value`` is a view of a tensor someone else keeps (a live optimizer's, which PyTorch changes in
  place, or a file's mapped pages, which a later ``torch.save`` to the same path rewrites), so the
  JAX array must not keep it, as ``device_put`` would on the CPU: copied there, once.
  """
  out = _common.put_like(value, leaf)
  if shares_memory(out, value.data if isinstance(value, _common.HostPiece) else value):
    # A copy into JAX's own memory by the runtime (no XLA program compiled per shape, as ``out.copy()``
    # would), which a donating step can reuse (memory JAX shares with NumPy it cannot). Waited for:
    # the copy runs asynchronously, and the tensor may change in place once this returns.
    out = jax.block_until_ready(jax.device_put(out, out.sharding, may_alias=False))
  return out


def to_host(torch: Any, tensor: Any, where: str = "") -> np.ndarray | _common.HostPiece:
  """A tensor's values on the host; of a ``DTensor``, this rank's shard (a piece, unless it is all)."""
  if not is_dtensor(tensor):
    return to_numpy(torch, tensor)
  region, shape = dtensor_region(tensor, where), tuple(tensor.shape)
  host = to_numpy(torch, tensor.to_local())
  if all(a == 0 and b == n for (a, b), n in zip(region, shape)):
    return host
  return _common.HostPiece(host, tuple(a for a, _ in region), shape)


def to_tensor(
  torch: Any, value: Any, like: Any, where: str, *, copy: bool = True, mapped: Callable[[], str] | None = None
) -> Any:
  """A JAX (or NumPy) value as a tensor like ``like``: on its device, and a ``DTensor`` with its
  placements when ``like`` is one (a FSDP2 parameter) or a stand-in for one (``like.template``).

  One copy of the values (none on the host in between); ``copy=False``: a JAX array on one CPU
  device, for a plain tensor on the CPU, is shared through DLPack instead (the tensor is the
  array's memory, which JAX takes as immutable). ``mapped``: returns the JAX leaves a ``layout=``
  made ``value`` of (named where this process lacks the DTensor's rows; called only then).
  """
  template = like if is_dtensor(like) else getattr(like, "template", None)
  if not copy and template is None and _shareable(value) and str(like.device) == "cpu":
    return torch.from_dlpack(value)
  region = dtensor_region(template, where) if template is not None else None
  host = _common.host_region(value, region)
  if host is None:
    held = [_common.bounds(s.index, value.shape) for s in value.addressable_shards]
    leaves = mapped() if mapped is not None and region is not None else ""
    if leaves and template is not None:
      tree = "params" if where.startswith("params") else "state"
      raise ValueError(
        f"layout= writes {where} from the JAX leaves {leaves}, over several processes; it is a DTensor "
        f"with placements {tuple(template.placements)}, whose rows {region} this rank holds, and through "
        f"the layout's operations this process's shards hold {held}: an axis permutation, reshape or "
        f"split moves numbers between the processes, and each rank writes from this process's shards "
        f"alone. Gather the {tree} first, then write it with layout= (each rank takes its own rows): "
        f"{tree} = jax.experimental.multihost_utils.process_allgather({tree}, tiled=True)"
      )
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
  tensor = _copied(torch, host)
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


def _copied(torch: Any, host: np.ndarray) -> Any:
  """A CPU tensor of its own holding ``host``'s values: memory PyTorch allocates, then one copy.

  Not ``np.array(host)``: NumPy asks Linux for transparent huge pages from 4 MiB on, and where huge
  pages are made on demand (``/sys/kernel/mm/transparent_hugepage/defrag``: ``madvise``, the
  default) the first write to each may stall to compact memory (a 147 MiB copy took 2.9 s, against
  0.08 s into PyTorch's memory, on a 2-core VM).
  """
  name = _common.dtype_name(host.dtype)
  tensor = torch.empty(host.shape, dtype=getattr(torch, name))
  if name == "bfloat16":  # NumPy has no bfloat16 PyTorch reads: its bits
    tensor.view(torch.int16).numpy()[...] = host.view(np.int16)
  else:
    tensor.numpy()[...] = host
  return tensor


def _shareable(value: Any) -> bool:
  """A JAX array on one CPU device, of a dtype DLPack carries to PyTorch."""
  import jax

  if not isinstance(value, jax.Array) or not value.is_fully_addressable or len(value.devices()) != 1:
    return False
  return next(iter(value.devices())).platform == "cpu" and value.size > 0


def is_dtensor(tensor: Any) -> bool:
  """A ``torch.distributed.tensor.DTensor`` (FSDP2's parameters and state), without importing it."""
  return all(hasattr(tensor, name) for name in ("device_mesh", "placements", "to_local"))


def dtensor_region(tensor: Any, where: str = "") -> tuple[tuple[int, int], ...]:
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
  gathered = f"read the gathered state instead: {GATHERED_READ}"
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


#: The advice to read a DCP / FSDP2 state gathered, as plain tensors on every rank.
GATHERED_READ = "get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))"


def check_held(value: Any, leaf: Any, where: str, *, weights: bool = False) -> None:
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
      f"{GATHERED_READ}"
    )
  )


def moved(layout: Any, name: str | None) -> str:
  """The JAX leaves ``layout`` makes the PyTorch tensor ``name`` into by some operation (for messages),
  or "" where there is none (no layout, or the tensor is one leaf as it is)."""
  if layout is None or name is None or name not in layout.pieces:
    return ""
  used = layout.pieces[name]
  if all(p.rows is None and not p.ops and len(layout.leaves[path].parts) == 1 for path, p in used):
    return ""
  return ", ".join(f"{path!r} ({layout.leaves[path]})" for path, _ in used)


def check_mapped(value: Any, leaf: Any, where: str, entry: Any, layout: Any, name: str) -> None:
  """Refuses, naming ``layout=``, a rank's shard (a ``HostPiece``) of the PyTorch tensor ``name`` that
  lacks a region which the JAX leaves the layout makes of it need on this process's devices.

  ``leaf``: the PyTorch-named leaf (the JAX leaves mapped back through the layout); ``entry``: the
  state entry's raw values (the DTensors, for their placements).
  """
  missing = _common.missing_region(value, leaf)
  leaves = "" if missing is None else moved(layout, name)
  if not leaves:  # nothing missing, or the identity: check_held's refusal, if any
    return
  placements = next((tuple(t.placements) for t in entry if is_dtensor(t)), None)
  used = layout.pieces[name]
  split = [d for d, ((a, b), n) in enumerate(zip(value.region(), value.shape)) if (a, b) != (0, n)]
  hint = ""
  if len(used) == 1 and split:
    (path, p), axes = used[0], list(range(len(value.shape)))
    if p.rows is None and all(op == "transpose" for op, _ in p.ops):
      for _, permutation in p.ops:
        axes = [axes[a] for a in permutation]
      own = [axes.index(d) for d in split]
      hint = (
        f"; or split the JAX leaf {path!r} along its axis {own[0] if len(own) == 1 else own} over the "
        f"processes in rank order (the tensor's axis {split[0] if len(split) == 1 else split}, which "
        f"the DTensor splits), so that each process's devices need rows this rank holds"
      )
  raise ValueError(
    f"layout= makes the JAX leaves {leaves} of {where}, a DTensor with placements {placements}, of which "
    f"this rank holds {value.region()} (of shape {tuple(value.shape)}); through the layout's operations "
    f"their devices on this process need {missing} of it, which this rank does not hold: an axis "
    f"permutation, reshape or split moves numbers between the ranks' shards, and the bridge reads this "
    f"rank's shard alone. Read the gathered state on every rank (plain tensors, which any layout "
    f"carries): {GATHERED_READ}{hint}"
  )
