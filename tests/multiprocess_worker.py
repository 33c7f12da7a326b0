"""One process of the multi-process training check (started by test_multiprocess.py).

JAX's multi-controller runtime runs one Python process per host; each sees only
its own devices and all run the same program. This script is one such process,
on 4 virtual CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``,
set by the caller)::

    python tests/multiprocess_worker.py distributed OUT PORT PROCESS_ID   # 2 of these
    python tests/multiprocess_worker.py reference OUT                      # 1 device, no mesh

``distributed``: joins a 2-process job (``jax.distributed.initialize`` on a
coordinator at ``127.0.0.1:PORT``, CPU collectives through gloo), builds one
8-device mesh spanning both processes and shards the parameters FSDP-style:
the matrices and the vector split row-wise over all 8 devices, so each process
holds half of every sharded leaf and builds only its own shards
(``jax.make_array_from_callback``); a small leaf is replicated. For every rule
it then

* runs ``init`` and asserts the state sharded like the parameters;
* compiles the step (``update`` + ``optax.apply_updates``, parameters and
  state donated), asserts that its HLO has no collective, runs ``STEPS`` steps
  and asserts that the donated buffers were consumed and that updates,
  parameters and state are sharded like the parameters;
* saves parameters and state after step ``K`` with Orbax, both processes
  writing to one directory, restores them onto an abstract sharded target in
  a fresh dict, and runs the remaining steps from the restored values.

It writes the shards it holds (uninterrupted and resumed run) to
``OUT/process_<i>.npz`` and the checks it made to ``OUT/process_<i>.json``;
the parent assembles the shards of both processes and compares them, bit for
bit, with what ``reference`` wrote: the same steps in a single process on one
device with whole arrays (``OUT/reference.npz``).

Any failed check raises with the rule and the pytree path, so the process
exits non-zero and its stderr says why.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import traceback
from typing import Any

import numpy as np

STEPS, K = 6, 3
LEARNING_RATE = 0.05
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# FSDP-style: every sharded leaf is split over all 8 devices along its first
# axis; "c" is too small to be worth sharding and is replicated.
SHAPES = {"w1": (32, 6), "w2": (16, 5), "b": (24,), "c": (3,)}
SPECS = {"w1": ("fsdp", None), "w2": ("fsdp", None), "b": ("fsdp",), "c": ()}


def _configs():
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  from rule_configs import RULE_CONFIGS

  return RULE_CONFIGS


def _values():
  """The initial parameters and the gradient of every step, as whole NumPy arrays.

  Every process computes the same arrays from the same seed and hands JAX only
  the slices its own devices hold, as a data loader would.
  """
  rng = np.random.default_rng(13)
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
  grads = [{k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(STEPS)]
  return params, grads


def _taken(name, values, grad_values):
  """The leaves as ``name``'s rule takes them (``rule_configs.shaped``: a rule of matrices, Muon's,
  gets ``b`` as (24, 1) and ``c`` as (3, 1), the same values; their specs shard the first axis as
  before), the same objects for any other rule."""
  from rule_configs import shaped

  def taken(tree):
    return {k: v.reshape(shaped(name, v.shape)) for k, v in tree.items()}

  return taken(values), [taken(g) for g in grad_values]


def _make(config):
  return config.make(LEARNING_RATE, **config.hyper)


def _step_fn(opt):
  import optax

  def step(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), updates, state

  return step


def reference(out: pathlib.Path) -> None:
  """The same steps in this single process, on one device, with whole arrays."""
  import jax

  if jax.process_count() != 1:
    raise AssertionError(f"the reference must run in a single process, got {jax.process_count()}")
  results: dict[str, Any] = {}
  for name, config in _configs().items():
    opt = _make(config)
    step = jax.jit(_step_fn(opt), donate_argnums=(0, 1))
    values, grad_values = _taken(name, *_values())
    params = jax.tree.map(jax.numpy.asarray, values)
    state = opt.init(params)
    for g in grad_values:
      params, _, state = step(params, state, jax.tree.map(jax.numpy.asarray, g))
    for path, leaf in jax.tree_util.tree_flatten_with_path({"params": params, "state": state})[0]:
      results[f"{name}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
  np.savez(out / "reference.npz", **results)


def distributed(out: pathlib.Path, port: int, process_id: int) -> None:
  import jax

  # CPU devices of different processes talk through gloo. The training step
  # needs no communication, but Orbax's barriers do (process_allgather).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=process_id,
    initialization_timeout=60,
    heartbeat_timeout_seconds=20,
    shutdown_timeout_seconds=30,
  )
  import jax.numpy as jnp
  import orbax.checkpoint as ocp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from onnx_optax import registry

  def check(condition, message):
    if not condition:
      raise AssertionError(f"process {process_id}: {message}")

  check(jax.process_count() == 2, f"{jax.process_count()} processes, expected 2")
  check(
    jax.local_device_count() == 4 and jax.device_count() == 8,
    f"{jax.local_device_count()} local / {jax.device_count()} global devices, expected 4 / 8",
  )
  mesh = jax.make_mesh((8,), ("fsdp",))
  shardings = {k: NamedSharding(mesh, P(*spec)) for k, spec in SPECS.items()}
  # Each process owns half of every sharded leaf: the shards really live apart.
  for k, spec in SPECS.items():
    if spec:
      rows = {
        idx[0].indices(SHAPES[k][0])[:2]
        for idx in shardings[k].addressable_devices_indices_map(SHAPES[k]).values()
        if idx is not None
      }
      check(
        len(rows) == 4 and all(stop - start == SHAPES[k][0] // 8 for start, stop in rows),
        f"params['{k}']: this process holds rows {sorted(rows)}, expected 4 of 8 slices",
      )

  def global_tree(tree):
    # Only the slices this process's devices hold are read from ``tree``.
    return {
      k: jax.make_array_from_callback(v.shape, shardings[k], lambda idx, v=v: v[idx]) for k, v in tree.items()
    }

  def same_sharding(tree, params, what):
    for (path, leaf), p in zip(jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(params)):
      # A field of its own shape (Field.shape: one scalar per parameter, replicated; Adafactor's
      # factors, sharded as the parameter along the axes they keep) is on the parameter's devices;
      # a parameter-shaped one sharded like the parameter.
      own_shape = leaf.shape != p.shape
      check(
        leaf.sharding.device_set == p.sharding.device_set
        if own_shape
        else leaf.sharding.is_equivalent_to(p.sharding, p.ndim),
        f"{what}{jax.tree_util.keystr(path)} is sharded {leaf.sharding}, the parameter {p.sharding}",
      )

  def collectives(hlo):
    return sorted({c for c in COLLECTIVES if re.search(rf"\b{c}(-start)?\(", hlo)})

  def local_shards(tree, prefix, results):
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      for shard in leaf.addressable_shards:
        bounds = ",".join("{}:{}".format(*s.indices(n)[:2]) for s, n in zip(shard.index, leaf.shape))
        results[f"{prefix}{jax.tree_util.keystr(path)}@{bounds}"] = np.asarray(shard.data)

  def run(step, params, state, steps, label):
    for g in steps:
      old = jax.tree.leaves((params, state))
      params, updates, state = step(params, state, g)
      # Every parameter-shaped buffer and the count is consumed. A scalar per parameter (NAdam's mu_product,
      # ASGD's eta and mu), replicated over the mesh, is not: measured, XLA does not alias its
      # donated buffer with the new scalar here (four bytes a parameter, left to the caller).
      shapes = {x.shape for x in jax.tree.leaves(params)}
      kept = [
        f"{x.shape} {x.dtype} {x.sharding}"
        for x in old
        if not x.is_deleted() and (x.shape in shapes or x.dtype == jnp.int32)
      ]
      check(not kept, f"{label}: a donated buffer was not consumed: {kept}")
      same_sharding(updates, params, f"{label}: updates")
      for field, tree in zip(state._fields[1:], state[1:]):
        same_sharding(tree, params, f"{label}: state.{field}")
    return params, state

  # The detector must see a collective where there is one.
  probe = global_tree({"w1": np.ones(SHAPES["w1"], np.float32)})["w1"]
  summed = collectives(jax.jit(jnp.sum).lower(probe).compile().as_text())
  check(summed, "the collective detector found nothing in a sum over the 8-device mesh")
  report = {"process_id": process_id, "detector": summed, "rules": {}}

  results: dict[str, Any] = {}
  ckpt_root = out / "checkpoints"
  for name, config in _configs().items():
    opt = _make(config)
    step = jax.jit(_step_fn(opt), donate_argnums=(0, 1))
    values, grad_values = _taken(name, *_values())
    params = global_tree(values)
    state = opt.init(params)
    for field, tree in zip(state._fields[1:], state[1:]):
      same_sharding(tree, params, f"{name}: init state.{field}")
    grads = [global_tree(g) for g in grad_values]
    found = collectives(step.lower(params, state, grads[0]).compile().as_text())
    # A rule whose step reduces over a whole tensor (Rule.reduces: Adafactor's norms and factored
    # means) needs the other shards: its collectives are its arithmetic.
    reduces = registry.get(config.rule).reduces
    check(not found or reduces, f"{name}: the compiled step contains {found}")

    sharding = jax.tree.map(lambda x: x.sharding, params)
    p, s = run(step, params, state, grads, f"{name} (uninterrupted)")
    check(
      all(p[k].sharding.is_equivalent_to(sharding[k], p[k].ndim) for k in SHAPES),
      f"{name}: the parameters' sharding changed during training",
    )
    local_shards({"params": p, "state": s}, name, results)

    # Stop after step K, both processes write one checkpoint, restore it onto
    # a target that has only shapes, dtypes and shardings, and go on.
    params = global_tree(values)
    p, s = run(step, params, opt.init(params), grads[:K], f"{name} (before the checkpoint)")
    path = ckpt_root / name
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(path, {"params": p, "opt_state": s})
      checkpointer.wait_until_finished()
    saved = {"params": p, "opt_state": s}
    abstract = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    target = jax.tree.map(abstract, saved)
    with ocp.StandardCheckpointer() as checkpointer:
      restored = checkpointer.restore(path, target)
    check(
      isinstance(restored["opt_state"], type(s)),
      f"{name}: restored state is a {type(restored['opt_state']).__name__}, saved {type(s).__name__}",
    )
    for (path_, r), x in zip(jax.tree_util.tree_flatten_with_path(restored)[0], jax.tree.leaves(saved)):
      where = f"{name}: restored{jax.tree_util.keystr(path_)}"
      check(
        r.dtype == x.dtype and r.shape == x.shape, f"{where} is {r.dtype}{r.shape}, saved {x.dtype}{x.shape}"
      )
      check(
        r.sharding.is_equivalent_to(x.sharding, x.ndim),
        f"{where} is sharded {r.sharding}, saved {x.sharding}",
      )
      for a, b in zip(r.addressable_shards, x.addressable_shards):
        check(
          np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes(),
          f"{where}: a shard differs from the saved one",
        )
    del p, s, saved
    p, s = run(step, restored["params"], restored["opt_state"], grads[K:], f"{name} (resumed)")
    local_shards({"params": p, "state": s}, f"resumed/{name}", results)
    report["rules"][name] = {"collectives": found, "steps": STEPS, "checkpoint_after": K}

  np.savez(out / f"process_{process_id}.npz", **results)
  (out / f"process_{process_id}.json").write_text(json.dumps(report))
  jax.distributed.shutdown()


def main(argv: list[str]) -> int:
  mode, out = argv[1], pathlib.Path(argv[2])
  if mode == "reference":
    reference(out)
  elif mode == "distributed":
    try:
      distributed(out, int(argv[3]), int(argv[4]))
    except BaseException:
      # A plain exit would run jax.distributed's atexit shutdown, which waits
      # in a barrier for the other process: say why and leave at once.
      traceback.print_exc()
      sys.stderr.flush()
      os._exit(1)
  else:
    raise SystemExit(f"unknown mode {mode!r}: 'reference' or 'distributed'")
  return 0


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.exit(main(sys.argv))
