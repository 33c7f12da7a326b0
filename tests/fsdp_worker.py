"""One rank of an FSDP2 job carried to JAX and back (started by test_interop_fsdp.py).

::

    python tests/fsdp_worker.py RANK WORLD_SIZE TORCH_PORT JAX_PORT OUT [DEVICES]

Each rank is a PyTorch process (``fully_shard`` on the CPU, a gloo process
group) and a JAX process: at world size 2 the two join one JAX job
(``jax.distributed.initialize``, one CPU device each) and hold the JAX
parameters as FSDP2 holds them, the first dimension split over the processes
in rank order; at world size 1 the process has two CPU devices and the
parameters are split over them. Every journey is compared with the run that
never left PyTorch (the same FSDP2 model, optimizer and gradients, N + M + K
``optimizer.step()``): N steps in PyTorch, the state dict taken with
``get_optimizer_state_dict``, read by ``from_torch_state_dict``, M steps in
JAX, written back by ``to_torch_state_dict`` in that state dict's layout,
loaded by ``set_optimizer_state_dict`` into a fresh model and optimizer (other
initial weights: the weights come from the JAX run), K more steps in PyTorch.
The gradients are fixed arrays, the same on both sides, so that the runs
differ only in the optimizer's arithmetic. The journeys (world size 1: the
DTensors' layout, each rank's shard being the whole tensor; world size 2: the
shards):

* ``sharded/<kind>``: the DTensor state dict (float64; SGD with momentum and
  Adagrad at world size 1, AdamW at both), each rank's shards put onto its own
  devices, the JAX weights read from the live optimizer by ``torch_params``;
* ``flat/AdamW``: the same with ``flatten_optimizer_state_dict=True``;
* ``gathered/AdamW``: ``full_state_dict=True, cpu_offload=True``: rank 0 holds
  the whole state and weights (``get_model_state_dict``), runs JAX on its own
  device alone and writes them back; both are loaded with
  ``broadcast_from_rank0=True``;
* world size 2: ``float32/AdamW``, float32, with PyTorch's own spread (its
  ``fused=True`` run against the default one, on the same data) measured
  alongside; ``replicated/AdamW``, the gathered state dict on every rank
  read into JAX arrays replicated over both processes and written back into
  the gathered layout from them; ``uneven/AdamW``, a model whose first dimensions do not split
  evenly (3 rows: 2 and 1; 1 row: 1 and none) read into JAX arrays that each
  process holds whole: refused (a rank holds part of each tensor), the
  refusal's advice run as printed (the gathered state on every rank), and the
  run written back into the sharded state dict, each rank taking its own rows;
  ``live/AdamW``, a live FSDP2 optimizer through ``torch_params``,
  ``from_torch`` and ``to_torch`` (state and weights), and ``torch_params``
  without a sharded ``like`` refused; ``nested/AdamW``, the state's DTensors
  sharded twice along their rows over a 2-D mesh (2, 1), read as the 1-D
  ones. Also the sharded JAX state written into
  a gathered template is refused and the advice run as printed
  (``process_allgather``) writes the tensors the sharded write holds, bit for
  bit; into DTensors split by columns, refused;
* ``layout/AdamW``: ``layout=`` into a port whose kernels are the weights
  transposed (``SQUARE``), the kernels split over the processes along their
  rows (the weights' columns: at world size 2 the read is refused, the advice
  run as printed, the gathered state, and the write into the sharded state
  dict refused and its advice run, ``process_allgather``), along their columns
  (the weights' rows, FSDP2's split: carried from the shards as they are), and
  a live optimizer built from ``named_parameters()`` through ``from_torch``
  and ``to_torch``, the kernels split along their columns; the state's
  DTensors made ``Replicate()``, read into kernels split along their rows as
  the gathered state is, bit for bit;
* world size 2 with two JAX devices per process (``DEVICES`` 2): ``fine/AdamW``,
  the sharded journey of a model whose first dimensions (8 and 4) split over
  the four devices, each rank's rows over its process's two;
* world size 1: ``refused``, a ``Partial`` DTensor and one whose local shape is
  not its placement's piece, refused.

It writes ``OUT/rank_<i>.json``: per journey the largest difference from the
uninterrupted run over this rank's shards, relative to the largest parameter
(``error``), for float32 also in ulps of each leaf's largest magnitude
(``ulp``) and PyTorch's spread in the same unit (``spread_ulp``); the
refusals' messages; and the seconds each part took.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

START = time.monotonic()
RANK, WORLD, TORCH_PORT, JAX_PORT = (int(a) for a in sys.argv[1:5])
OUT = pathlib.Path(sys.argv[5])
LOCAL = int(sys.argv[6]) if len(sys.argv) > 6 else 2 if WORLD == 1 else 1  # JAX devices per process
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL}"

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
if WORLD > 1:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # process_allgather
  jax.distributed.initialize(f"127.0.0.1:{JAX_PORT}", WORLD, RANK)

import jax.experimental.multihost_utils  # noqa: E402, F401  (the advice names it)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
  StateDictOptions,
  get_model_state_dict,
  get_optimizer_state_dict,
  set_model_state_dict,
  set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402

from onnx_optax.interop import (  # noqa: E402
  from_torch,
  from_torch_state_dict,
  to_torch,
  to_torch_state_dict,
  torch_params,
)

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{TORCH_PORT}", rank=RANK, world_size=WORLD)
# fully_shard's default mesh is on the accelerator PyTorch finds (CUDA where it sees a GPU): these ranks
# are CPU ones, also on a machine with a GPU.
MESH = init_device_mesh("cpu", (WORLD,))

N, M, K = 2, 3, 2
DEVICES = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
SPLIT = NamedSharding(Mesh(np.array(DEVICES), ("fsdp",)), PartitionSpec("fsdp"))  # FSDP2's Shard(0)
BOTH = NamedSharding(Mesh(np.array(DEVICES), ("fsdp",)), PartitionSpec())  # whole on every process's device
OWN = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # this process's device, the whole array
EVEN = ((3, 4), (4, 2))  # Linear(3, 4), Tanh, Linear(4, 2): each first dimension splits over 2 evenly
FINE = ((3, 8), (8, 4))  # first dimensions 8 and 4: over 2 ranks x 2 devices, 2 and 1 rows a device
UNEVEN = ((3, 3), (3, 1))  # first dimensions 3 (rows 2 and 1) and 1 (rows 1 and none)
SQUARE = ((4, 4), (4, 2))  # kernels (4, 4) and (4, 2) (the weights transposed): either axis splits over 2
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]
OPTIMIZERS = {
  "SGD": lambda ps, **kw: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01, **kw),
  "Adagrad": lambda ps, **kw: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.05, weight_decay=0.01, **kw),
  "AdamW": lambda ps, **kw: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05, **kw),
}
GATHERED = "options=StateDictOptions(full_state_dict=True)"


def model_and_optimizer(kind, dims, dtype, seed=0, named=False, **options):
  torch.manual_seed(seed)
  (a, b), (c, d) = dims
  model = torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh(), torch.nn.Linear(c, d)).to(dtype)
  for module in (model[0], model[2], model):
    fully_shard(module, mesh=MESH)
  return model, OPTIMIZERS[kind](model.named_parameters() if named else model.parameters(), **options)


def rows(p):
  """The rows of the global tensor that this rank's shard of ``p`` holds (FSDP2: Shard(0), torch.chunk)."""
  n, k = p.shape[0], WORLD
  chunk = -(-n // k)
  return slice(min(RANK * chunk, n), min((RANK + 1) * chunk, n))


def gradients(model, dtype):
  """N + M + K steps of fixed gradients: whole arrays, in the optimizer's order, the same on every rank."""
  rng = np.random.default_rng(7)
  return [
    [rng.normal(size=tuple(p.shape)).astype(dtype) for p in model.parameters()] for _ in range(N + M + K)
  ]


def torch_steps(model, opt, grads):
  for step in grads:
    for p, g in zip(model.parameters(), step):
      shard = torch.from_numpy(np.ascontiguousarray(g[rows(p)]))
      p.grad = DTensor.from_local(shard, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
    opt.step()


def jax_steps(tx, state, params, grads):
  @jax.jit
  def step(grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  # The count where the step leaves it (replicated over the parameters' devices): one compilation.
  where = params[0].sharding
  if isinstance(where, NamedSharding):
    where = NamedSharding(where.mesh, PartitionSpec())
  state = jax.tree.map(lambda x: jax.device_put(x, where) if x.ndim == 0 else x, state)
  for step_grads in grads:
    g = [
      jax.make_array_from_callback(x.shape, p.sharding, lambda i, x=x: x[i])
      for x, p in zip(step_grads, params)
    ]
    params, state = step(g, state, params)
  return params, state


def weights_into(model, params):
  """The JAX weights into an FSDP2 model: each rank copies its own rows (from its own shard, when split)."""
  with torch.no_grad():
    for p, x in zip(model.parameters(), params):
      if x.is_fully_addressable:
        mine = np.asarray(x)[rows(p)]
      elif LOCAL > 1:  # this rank's rows over several devices: gathered (a collective every rank joins)
        mine = np.asarray(jax.experimental.multihost_utils.process_allgather(x, tiled=True))[rows(p)]
      else:
        (shard,) = x.addressable_shards  # one device per process, holding this rank's rows or all
        held = shard.index[0].indices(x.shape[0])[:2]
        if held == (0, x.shape[0]):
          mine = np.asarray(shard.data)[rows(p)]
        else:
          assert held == rows(p).indices(x.shape[0])[:2], shard.index
          mine = np.asarray(shard.data)
      p.to_local().copy_(torch.from_numpy(np.array(mine)))


def compare(model, ref):
  """The largest difference over this rank's shards, relative and (float32) in ulps of each leaf's maximum."""
  worst, scale, ulps = 0.0, 1.0, 0.0
  for p, q in zip(model.parameters(), ref.parameters()):
    a, b = p.to_local().detach(), q.to_local().detach()
    if a.numel():
      diff = float((a.double() - b.double()).abs().max())
      worst, scale = max(worst, diff), max(scale, float(b.abs().max()))
      if b.dtype == torch.float32:
        ulps = max(ulps, diff / float(np.spacing(np.float32(b.abs().max()))))
  return {"error": worst / scale, "ulp": ulps}


def reference(kind, dims, dtype, **options):
  ref, opt_ref = model_and_optimizer(kind, dims, dtype, **options)
  grads = gradients(ref, np.float64 if dtype == torch.float64 else np.float32)
  torch_steps(ref, opt_ref, grads)
  return ref, grads


def split_like(model, dtype):
  """The JAX structure of the parameters: split over the processes along the first dimension, as FSDP2's."""
  return [jax.ShapeDtypeStruct(tuple(p.shape), dtype, sharding=SPLIT) for p in model.parameters()]


def sharded(kind, dtype=torch.float64, options=None, spread=False, dims=EVEN):
  """Each rank's shards onto its own devices and back into DTensors."""
  options = options or StateDictOptions()
  ref, grads = reference(kind, dims, dtype)
  model, opt = model_and_optimizer(kind, dims, dtype)
  torch_steps(model, opt, grads[:N])
  saved = get_optimizer_state_dict(model, opt, options=options)
  params = torch_params(opt, split_like(model, grads[0][0].dtype))
  tx, state = from_torch_state_dict(saved, params)
  params, state = jax_steps(tx, state, params, grads[N : N + M])
  back = to_torch_state_dict(state, saved)
  refusals = None
  plain = kind == "AdamW" and dtype == torch.float64 and options == StateDictOptions()
  if WORLD > 1 and dims == EVEN and plain:
    refusals = write_refusals(model, opt, state, back)  # before loading back: the steps change its tensors
  fresh, opt2 = model_and_optimizer(kind, dims, dtype, seed=1)
  weights_into(fresh, params)
  set_optimizer_state_dict(fresh, opt2, back, options=options)
  torch_steps(fresh, opt2, grads[N + M :])
  report = compare(fresh, ref)
  if spread:
    fused, _ = reference(kind, dims, dtype, fused=True)
    report["spread_ulp"] = compare(fused, ref)["ulp"]
  if refusals:
    report["refused"] = refusals
  return report


def refused(call):
  """The message of the ValueError that ``call()`` raises."""
  try:
    call()
  except ValueError as error:
    return str(error)
  raise AssertionError("not refused")


def write_refusals(model, opt, state, back):
  """A state over several processes written into a gathered template: refused, and the advice, run as
  printed, writes the tensors that the sharded write holds, bit for bit. Into DTensors split by columns
  (Shard(1)) while JAX splits the rows: refused."""
  whole = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
  message = refused(lambda: to_torch_state_dict(state, whole))
  namespace = {"jax": jax, "state": state}
  exec(message.split("gather the state first: ", 1)[1], namespace)
  written = to_torch_state_dict(namespace["state"], whole)
  for name in NAMES:
    for field in ("exp_avg", "exp_avg_sq"):
      have, want = written["state"][name][field], back["state"][name][field].full_tensor()
      assert torch.equal(have, want), (name, field)
  mesh = back["state"]["0.weight"]["exp_avg"].device_mesh
  columns = {
    "state": {
      name: {
        field: distribute_tensor(value, mesh, [Shard(1)]) if value.dim() == 2 else value
        for field, value in entry.items()
      }
      for name, entry in whole["state"].items()
    },
    "param_groups": whole["param_groups"],
  }
  return {"gathered": message, "columns": refused(lambda: to_torch_state_dict(state, columns))}


def gathered():
  """full_state_dict=True, cpu_offload=True: rank 0 alone reads, runs and writes; loaded from rank 0."""
  ref, grads = reference("AdamW", EVEN, torch.float64)
  model, opt = model_and_optimizer("AdamW", EVEN, torch.float64)
  torch_steps(model, opt, grads[:N])
  offload = StateDictOptions(full_state_dict=True, cpu_offload=True)
  saved = get_optimizer_state_dict(model, opt, options=offload)
  weights = get_model_state_dict(model, options=offload)
  back, new_weights = {}, {}
  if RANK == 0:
    assert not any(isinstance(v, DTensor) for e in saved["state"].values() for v in e.values())
    params = [jax.device_put(weights[name].numpy(), OWN) for name in NAMES]
    tx, state = from_torch_state_dict(saved, params)
    params, state = jax_steps(tx, state, params, grads[N : N + M])
    back = to_torch_state_dict(state, saved)
    new_weights = {name: torch.from_numpy(np.asarray(x)) for name, x in zip(NAMES, params)}
  else:
    assert not saved and not weights  # cpu_offload: rank 0 alone holds them
  fresh, opt2 = model_and_optimizer("AdamW", EVEN, torch.float64, seed=1)
  broadcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
  set_model_state_dict(fresh, new_weights, options=broadcast)
  set_optimizer_state_dict(fresh, opt2, back, options=broadcast)
  torch_steps(fresh, opt2, grads[N + M :])
  return compare(fresh, ref)


def replicated():
  """The gathered state dict on every rank (``full_state_dict=True``, whole tensors) read into JAX arrays
  replicated over the two processes (each puts its own device's copy from the whole tensor), and the run
  written back from those arrays, which each process holds whole, into the gathered layout; loaded with
  ``full_state_dict=True`` on every rank."""
  ref, grads = reference("AdamW", EVEN, torch.float64)
  model, opt = model_and_optimizer("AdamW", EVEN, torch.float64)
  torch_steps(model, opt, grads[:N])
  whole = StateDictOptions(full_state_dict=True)
  saved = get_optimizer_state_dict(model, opt, options=whole)
  weights = get_model_state_dict(model, options=whole)
  hosts = [weights[name].numpy() for name in NAMES]
  params = [jax.make_array_from_callback(w.shape, BOTH, lambda i, w=w: w[i]) for w in hosts]
  assert not params[0].is_fully_addressable
  tx, state = from_torch_state_dict(saved, params)
  params, state = jax_steps(tx, state, params, grads[N : N + M])
  back = to_torch_state_dict(state, saved)
  assert not any(isinstance(v, DTensor) for e in back["state"].values() for v in e.values())
  fresh, opt2 = model_and_optimizer("AdamW", EVEN, torch.float64, seed=1)
  weights_into(fresh, params)
  set_optimizer_state_dict(fresh, opt2, back, options=whole)
  torch_steps(fresh, opt2, grads[N + M :])
  return compare(fresh, ref)


def uneven():
  """Whole JAX arrays on each process: the sharded state dict is refused at world size 2; the advice run
  as printed; written back into the sharded state dict, each rank taking its own (uneven) rows."""
  ref, grads = reference("AdamW", UNEVEN, torch.float64)
  model, optimizer = model_and_optimizer("AdamW", UNEVEN, torch.float64)
  torch_steps(model, optimizer, grads[:N])
  saved = get_optimizer_state_dict(model, optimizer)
  weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # every rank
  params = [jax.device_put(weights[name].numpy(), OWN) for name in NAMES]
  report = {}
  try:
    tx, state = from_torch_state_dict(saved, params)
    assert WORLD == 1, "a rank's half of each state tensor was read as the whole"
  except ValueError as error:
    report["refused"] = message = str(error)
    advice = message.split("read the gathered state on every rank: ", 1)[1]
    namespace = {"get_optimizer_state_dict": get_optimizer_state_dict, "StateDictOptions": StateDictOptions}
    readable = eval(advice, {**namespace, "model": model, "optimizer": optimizer})
    tx, state = from_torch_state_dict(readable, params)
  params, state = jax_steps(tx, state, params, grads[N : N + M])
  back = to_torch_state_dict(state, saved)  # the sharded layout: each rank writes its own rows
  assert all(isinstance(e["exp_avg"], DTensor) for e in back["state"].values())
  fresh, opt2 = model_and_optimizer("AdamW", UNEVEN, torch.float64, seed=1)
  weights_into(fresh, params)
  set_optimizer_state_dict(fresh, opt2, back)
  torch_steps(fresh, opt2, grads[N + M :])
  report.update(compare(fresh, ref))
  report["rows"] = {name: [rows(p).start, rows(p).stop] for name, p in zip(NAMES, fresh.parameters())}
  return report


def live():
  """A live FSDP2 optimizer: torch_params and from_torch read each rank's shards, to_torch writes the state
  and the weights back into its DTensors."""
  ref, grads = reference("AdamW", EVEN, torch.float64)
  model, opt = model_and_optimizer("AdamW", EVEN, torch.float64)
  torch_steps(model, opt, grads[:N])
  params = torch_params(opt, split_like(model, np.float64))
  tx, state = from_torch(opt, params)
  params, state = jax_steps(tx, state, params, grads[N : N + M])
  to_torch(state, opt, params)
  assert all(isinstance(opt.state[p]["exp_avg"], DTensor) for p in model.parameters())
  torch_steps(model, opt, grads[N + M :])
  report = compare(model, ref)
  report["refused"] = refused(lambda: torch_params(opt))  # whole arrays from a rank that holds half
  return report


def nested():
  """The sharded state dict with each DTensor sharded twice along its rows, over a 2-D mesh (WORLD, 1):
  each rank holds the rows of its 1-D shard, and the state read is the 1-D one's, bit for bit."""
  model, opt = model_and_optimizer("AdamW", EVEN, torch.float64)
  torch_steps(model, opt, gradients(model, np.float64)[:1])
  saved = get_optimizer_state_dict(model, opt)
  params = torch_params(opt, split_like(model, np.float64))
  mesh = init_device_mesh("cpu", (WORLD, 1), mesh_dim_names=("rows", "again"))
  state = {
    name: {
      field: distribute_tensor(value.full_tensor(), mesh, [Shard(0), Shard(0)])
      if isinstance(value, DTensor)
      else value
      for field, value in entry.items()
    }
    for name, entry in saved["state"].items()
  }
  _, want = from_torch_state_dict(saved, params)
  _, have = from_torch_state_dict({**saved, "state": state}, params)
  same = all(
    np.array_equal(np.asarray(a.data), np.asarray(b.data))
    for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(have))
    for a, b in zip(x.addressable_shards, y.addressable_shards)
  )
  return {"error": 0.0 if same else 1.0}


def read_refusals():
  """DTensors whose local tensor is not a block the bridge places: a Partial one, and one whose local
  shape is not its placements' piece."""
  model, opt = model_and_optimizer("AdamW", EVEN, torch.float64)
  torch_steps(model, opt, gradients(model, np.float64)[:1])
  saved = get_optimizer_state_dict(model, opt)
  params = torch_params(opt, split_like(model, np.float64))
  entry = saved["state"]["0.weight"]
  t = entry["exp_avg"]
  partial = DTensor.from_local(t.to_local(), t.device_mesh, [Partial()])
  short = DTensor.from_local(
    t.to_local()[:1], t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
  )
  report = {}
  for name, value in (("partial", partial), ("short", short)):
    edited = {**saved, "state": {**saved["state"], "0.weight": {**entry, "exp_avg": value}}}
    report[name] = refused(lambda edited=edited: from_torch_state_dict(edited, params))
  return report


def own_layout(model):
  """A port's layout: each Linear's weight as a ``(in, out)`` kernel (transposed), its bias as it is."""
  from onnx_optax.interop.layout import Layout, part

  shapes = {name: tuple(p.shape) for name, p in zip(NAMES, model.parameters())}
  leaves = {f"{i}.kernel": part(f"{i}.weight").transpose(1, 0) for i in (0, 2)}
  return Layout({**leaves, **{f"{i}.bias": f"{i}.bias" for i in (0, 2)}}, shapes=shapes)


def own_placed(layout, named, kernel_spec):
  """The whole PyTorch-named arrays ``named`` in the port's layout, each process putting its devices'
  shards: the biases split as FSDP2's, the kernels by ``kernel_spec``."""
  mesh = SPLIT.mesh
  out = {}
  for path, value in jax.tree_util.tree_flatten_with_path(layout.to_jax(named))[0]:
    (layer, leaf) = (k.key for k in path)
    spec = kernel_spec if leaf == "kernel" else PartitionSpec("fsdp")
    host = np.asarray(value)
    out.setdefault(layer, {})[leaf] = jax.make_array_from_callback(
      host.shape, NamedSharding(mesh, spec), lambda i, h=host: h[i]
    )
  return out


def own_steps(tx, state, params, grads, layout):
  @jax.jit
  def step(grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  where = NamedSharding(SPLIT.mesh, PartitionSpec())
  state = jax.tree.map(lambda x: jax.device_put(x, where) if x.ndim == 0 else x, state)
  for step_grads in grads:
    g = own_placed(layout, dict(zip(NAMES, step_grads)), params["0"]["kernel"].sharding.spec)
    params, state = step(g, state, params)
  return params, state


def layouts():
  """The sharded state dict carried with layout= into a port whose kernels are the weights transposed,
  its kernels split over the processes along either axis, and back; the live optimizer likewise."""
  ref, grads = reference("AdamW", SQUARE, torch.float64)
  report = {
    "rows": layout_journey(PartitionSpec("fsdp"), grads),  # the kernel's rows: the weight's columns
    "columns": layout_journey(PartitionSpec(None, "fsdp"), grads),  # the weight's rows, FSDP2's split
  }
  model, opt = model_and_optimizer("AdamW", SQUARE, torch.float64, named=True)
  torch_steps(model, opt, grads[:N])
  layout = own_layout(model)
  whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
  params = own_placed(layout, {n: whole[n].numpy() for n in NAMES}, PartitionSpec(None, "fsdp"))
  tx, state = from_torch(opt, params, layout=layout)
  params, state = own_steps(tx, state, params, grads[N : N + M], layout)
  to_torch(state, opt, params, layout=layout)
  torch_steps(model, opt, grads[N + M :])
  report["live"] = compare(model, ref)
  for name in ("rows", "columns"):
    report[name].update(compare(report[name].pop("model"), ref))
  report["replicated"] = layout_replicated(grads)
  report["error"] = max(report[name]["error"] for name in ("rows", "columns", "live", "replicated"))
  return report


def layout_replicated(grads):
  """The state's DTensors made Replicate() (every rank holds each whole): read with layout= into kernels
  split along their rows, as the gathered state dict is read, bit for bit."""
  model, opt = model_and_optimizer("AdamW", SQUARE, torch.float64)
  torch_steps(model, opt, grads[:N])
  saved = get_optimizer_state_dict(model, opt)
  whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
  layout = own_layout(model)
  params = own_placed(layout, {n: whole[n].numpy() for n in NAMES}, PartitionSpec("fsdp"))
  state = {
    name: {
      field: distribute_tensor(value.full_tensor(), value.device_mesh, [Replicate()])
      if isinstance(value, DTensor)
      else value
      for field, value in entry.items()
    }
    for name, entry in saved["state"].items()
  }
  gathered = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
  _, want = from_torch_state_dict(gathered, params, layout=layout)
  _, have = from_torch_state_dict({**saved, "state": state}, params, layout=layout)
  same = all(
    np.array_equal(np.asarray(a.data), np.asarray(b.data))
    for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(have))
    for a, b in zip(x.addressable_shards, y.addressable_shards)
  )
  return {"error": 0.0 if same else 1.0}


def layout_journey(spec, grads):
  """from_torch_state_dict(..., layout=), M steps in JAX, to_torch_state_dict(..., layout=) into the
  sharded state dict; each refusal's advice run as printed."""
  model, opt = model_and_optimizer("AdamW", SQUARE, torch.float64)
  torch_steps(model, opt, grads[:N])
  saved = get_optimizer_state_dict(model, opt)
  whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
  layout = own_layout(model)
  params = own_placed(layout, {n: whole[n].numpy() for n in NAMES}, spec)
  out = {}
  try:
    tx, state = from_torch_state_dict(saved, params, layout=layout)
  except ValueError as error:
    out["read"] = message = str(error)
    advice = message.split("which any layout carries): ", 1)[1].split("; or ", 1)[0]
    namespace = {"get_optimizer_state_dict": get_optimizer_state_dict, "StateDictOptions": StateDictOptions}
    readable = eval(advice, {**namespace, "model": model, "optimizer": opt})
    tx, state = from_torch_state_dict(readable, params, layout=layout)
  params, state = own_steps(tx, state, params, grads[N : N + M], layout)
  try:
    back = to_torch_state_dict(state, saved, layout=layout)
  except ValueError as error:
    out["write"] = message = str(error)
    namespace = {"jax": jax, "state": state}
    exec(message.split("(each rank takes its own rows): ", 1)[1], namespace)
    back = to_torch_state_dict(namespace["state"], saved, layout=layout)
  fresh, opt2 = model_and_optimizer("AdamW", SQUARE, torch.float64, seed=1)
  named = layout.to_torch(params)
  if WORLD > 1:  # the kernels' rows split: each rank's weight rows on both processes
    named = jax.experimental.multihost_utils.process_allgather(named, tiled=True)
  weights_into(fresh, [jnp.asarray(named[n]) for n in NAMES])
  set_optimizer_state_dict(fresh, opt2, back)
  torch_steps(fresh, opt2, grads[N + M :])
  out["model"] = fresh
  return out


def main():
  report = {"journeys": {}, "seconds": {"start": time.monotonic() - START}}
  journeys = report["journeys"]

  def timed(name, fn, *args, **kwargs):
    begin = time.monotonic()
    journeys[name] = fn(*args, **kwargs)
    report["seconds"][name] = time.monotonic() - begin

  if WORLD > 1 and LOCAL > 1:
    timed("fine/AdamW", sharded, "AdamW", dims=FINE)
  else:
    # At world size 1 a rank's shard is the whole tensor: what is checked there is the DTensors' layout
    # (and every optimizer's state fields); at world size 2, the shards.
    for kind in OPTIMIZERS if WORLD == 1 else ["AdamW"]:
      timed(f"sharded/{kind}", sharded, kind)
    timed("flat/AdamW", sharded, "AdamW", options=StateDictOptions(flatten_optimizer_state_dict=True))
    timed("gathered/AdamW", gathered)
    timed("layout/AdamW", layouts)
    if WORLD > 1:
      timed("float32/AdamW", sharded, "AdamW", torch.float32, spread=True)
      timed("replicated/AdamW", replicated)
      timed("uneven/AdamW", uneven)
      timed("live/AdamW", live)
      timed("nested/AdamW", nested)
    else:
      timed("refused", read_refusals)
  OUT.mkdir(exist_ok=True)
  (OUT / f"rank_{RANK}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
  dist.destroy_process_group()
