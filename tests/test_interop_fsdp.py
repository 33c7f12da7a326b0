"""FSDP2 state dicts (``fully_shard``, CPU, gloo) carried to JAX and back, at world size 1 and 2.

Each rank runs ``fsdp_worker.py`` (its docstring lists the journeys): a
PyTorch rank in a gloo process group and, at world size 2, a JAX process of a
two-process job, with one JAX device per process, or two (each rank's rows
split over its process's devices). Every journey ends in PyTorch's own resume
(``set_optimizer_state_dict``, then ``optimizer.step()``) and is compared with
the FSDP2 run that never left PyTorch: float64 to 1e-12 relative; float32 within
PyTorch's own spread (its ``fused=True`` run against the default one, on the
same data, in the same job), in ulps of each leaf's largest magnitude. The
refusals are matched here, and the workers run each one's advice as printed.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 needs torch.distributed (PyTorch 2.6 or later)")

WORKER = pathlib.Path(__file__).with_name("fsdp_worker.py")
ROOT = WORKER.parent.parent
TIMEOUT_S = (
  300  # ~20 s (one rank) and ~40 s (two) on an idle 2-core machine; a hung collective must not hang CI
)

GATHERED = "options=StateDictOptions(full_state_dict=True)"
JOURNEYS = {  # by (ranks, JAX devices per process)
  (1, 2): {
    "sharded/SGD",
    "sharded/Adagrad",
    "sharded/AdamW",
    "flat/AdamW",
    "gathered/AdamW",
    "layout/AdamW",
    "refused",
  },
  (2, 1): {
    "sharded/AdamW",
    "flat/AdamW",
    "gathered/AdamW",
    "layout/AdamW",
    "float32/AdamW",
    "replicated/AdamW",
    "uneven/AdamW",
    "live/AdamW",
    "nested/AdamW",
  },
  (2, 2): {"fine/AdamW"},
}


def _free_ports(n: int) -> list[int]:
  sockets = [socket.socket() for _ in range(n)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _run(world: int, devices: int, out: pathlib.Path) -> list[dict]:
  """Starts the ranks together; on the first failure or the timeout, kills the others (a rank whose peer
  died waits in a collective)."""
  torch_port, jax_port = _free_ports(2)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
  for name in ("XLA_FLAGS", "JAX_PLATFORMS"):  # the worker sets them
    env.pop(name, None)
  logs = [open(out / f"rank_{rank}.log", "w") for rank in range(world)]
  argv = lambda rank: [
    sys.executable,
    str(WORKER),
    str(rank),
    str(world),
    str(torch_port),
    str(jax_port),
    str(out),
    str(devices),
  ]
  procs = [
    subprocess.Popen(argv(rank), env=env, stdout=log, stderr=subprocess.STDOUT)
    for rank, log in enumerate(logs)
  ]
  try:
    deadline = time.monotonic() + TIMEOUT_S
    while any(p.poll() is None for p in procs):
      if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
        break
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
    for log in logs:
      log.close()
  failed = [rank for rank, p in enumerate(procs) if p.returncode != 0]
  if failed:
    tails = [f"--- rank {r}:\n{(out / f'rank_{r}.log').read_text()[-4000:]}" for r in range(world)]
    raise AssertionError(f"ranks {failed} failed or timed out\n" + "\n".join(tails))
  return [json.loads((out / f"rank_{rank}.json").read_text()) for rank in range(world)]


@pytest.mark.parametrize(
  "world, devices", [(1, 2), (2, 1), (2, 2)], ids=["1 rank", "2 ranks", "2 ranks x 2 devices"]
)
def test_fsdp2_state_dicts_continue_in_jax_and_back(world, devices, tmp_path):
  reports = _run(world, devices, tmp_path)
  for report in reports:
    assert set(report["journeys"]) == JOURNEYS[world, devices], report["journeys"].keys()
  for name in JOURNEYS[world, devices] - {"refused"}:
    results = [report["journeys"][name] for report in reports]
    if name.startswith("float32"):
      carried, spread = max(r["ulp"] for r in results), max(r["spread_ulp"] for r in results)
      assert 0 < spread and carried <= spread, (name, carried, spread)
    else:
      assert max(r["error"] for r in results) <= 1e-12, (name, results)

  for report in reports if devices == 1 else []:  # refused only where the kernels split the weights' columns
    layout = report["journeys"]["layout/AdamW"]
    assert not {"read", "write"} & set(layout["columns"]) and set(layout["rows"]) >= (
      {"read", "write"} if world > 1 else set()
    ), layout
  if world == 1:
    assert not {"read", "write"} & set(reports[0]["journeys"]["layout/AdamW"]["rows"])
    refused = reports[0]["journeys"]["refused"]
    assert "has placements (Partial(sum),)" in refused["partial"], refused["partial"]
    assert "reads this rank's shard of Shard(d) and Replicate() placements only" in refused["partial"]
    assert "not in its mesh" not in refused["partial"]  # it is
    assert (
      "local tensor of shape (1, 3) on this rank, not the torch.chunk piece [[0, 4], [0, 3]]"
      in refused["short"]
    )
    for message in refused.values():
      assert message.startswith("the state of param_groups[0]['params'][0]"), message
      assert (
        "get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))"
        in message
      )
    return
  if devices > 1:
    return

  # World size 2: the uneven model's rows (3 rows: 2 and 1; 1 row: 1 and none), each rank's own.
  rows = [report["journeys"]["uneven/AdamW"]["rows"] for report in reports]
  assert rows == [
    {"0.weight": [0, 2], "0.bias": [0, 2], "2.weight": [0, 1], "2.bias": [0, 1]},
    {"0.weight": [2, 3], "0.bias": [2, 3], "2.weight": [1, 1], "2.bias": [1, 1]},
  ]
  for rank, report in enumerate(reports):
    journeys = report["journeys"]
    uneven = journeys["uneven/AdamW"]["refused"]
    part = ["((0, 2), (0, 3))", "((2, 3), (0, 3))"][rank]
    assert uneven.startswith(
      f"the state of param_groups[0]['params'][0] ('0.weight') is a DTensor, and this rank holds its part "
      f"{part} (of shape (3, 3)), but the JAX target"
    ), uneven
    assert "needs ((0, 3), (0, 3)) on this process's devices" in uneven
    assert "but the JAX target (a SingleDeviceSharding(" in uneven  # the target's sharding, named
    write = journeys["sharded/AdamW"]["refused"]
    rows_held = ["((0, 2), (0, 3))", "((2, 4), (0, 3))"][rank]
    assert write["gathered"].startswith(
      f"the state of param_groups[0]['params'][0] ('0.weight') is a JAX array over several processes, and "
      f"this process's shards [{rows_held}] do not hold all of it"
    ), write["gathered"]
    columns = ["((0, 4), (0, 2))", "((0, 4), (2, 3))"][rank]
    assert f"do not hold {columns}, what this rank's DTensor holds" in write["columns"], write["columns"]
    read, write = journeys["layout/AdamW"]["rows"]["read"], journeys["layout/AdamW"]["rows"]["write"]
    held = ["((0, 2), (0, 4))", "((2, 4), (0, 4))"][rank]
    assert read.startswith(
      "layout= makes the JAX leaves '0.kernel' (part('0.weight').transpose(1, 0)) of the state of "
      f"param_groups[0]['params'][0] ('0.weight'), a DTensor with placements (Shard(dim=0),), of which this "
      f"rank holds {held} (of shape (4, 4))"
    ), read
    assert "split the JAX leaf '0.kernel' along its axis 1 over the processes" in read
    assert f"which any layout carries): get_optimizer_state_dict(model, optimizer, {GATHERED})" in read
    assert write.endswith("state = jax.experimental.multihost_utils.process_allgather(state, tiled=True)")
    assert write.startswith(
      "layout= writes the state of param_groups[0]['params'][0] ('0.weight') from the JAX leaves '0.kernel' "
      f"(part('0.weight').transpose(1, 0)), over several processes; it is a DTensor with placements "
      f"(Shard(dim=0),), whose rows {held} this rank holds"
    ), write
    weights = journeys["live/AdamW"]["refused"]
    assert "is a DTensor, and this rank holds its part" in weights and "Pass like with a sharding" in weights
