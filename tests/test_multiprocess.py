"""Training across 2 processes x 4 CPU devices with ``jax.distributed`` (issue 13).

JAX's multi-controller runtime (GPU clusters, TPU pods) runs one process per
host. This test starts that on one machine: two ``multiprocess_worker.py``
processes with 4 virtual CPU devices each join one job through a local
coordinator, build one 8-device mesh and shard the parameters over both
processes; a third process runs the same steps alone on one device. What the
workers check themselves (state and updates sharded like the parameters, no
collective in the compiled step, donation, an Orbax checkpoint written by both
processes and restored) is in the worker's docstring. Here the shards of both
processes are put together and compared with the single-process run, bit for
bit, for every rule, uninterrupted and resumed from the checkpoint.

Why bitwise is the right expectation: every operation of every rule is
element-wise and the per-update scalars (bias corrections, decayed rates)
depend only on hyperparameters and ``T``, so a device holding a slice
computes, for each element, the same sequence of float32 operations as the
single device holding the whole array; XLA:CPU compiles the same fused loop,
only its trip count differs. That includes its contraction of ``a * b + c``
into a fused multiply-add, which XLA:CPU does (checked on an AMD EPYC with
FMA: ``jax.jit(lambda a, b, c: a * b + c)`` gives the once-rounded result,
NumPy the twice-rounded one) in the vector loop and in the scalar remainder
alike: the shards of ``b`` (3 elements) and ``w2`` (10) are shorter than
the whole arrays' vector loops, and still agree to the bit. The NumPy
reference does not fuse, so this comparison is with JAX in one process, not
with :mod:`onnx_optax.reference` (the single-process transforms are held to
that in ``test_transforms.py``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from rule_configs import RULE_CONFIGS

import onnx_optax

# The workers checkpoint with Orbax.
pytest.importorskip(
  "orbax.checkpoint", reason="orbax-checkpoint is in the test extra: pip install onnx_optax[test]"
)

WORKER = pathlib.Path(__file__).with_name("multiprocess_worker.py")
RULES = tuple(RULE_CONFIGS)  # the worker runs every configuration of rule_configs
TIMEOUT_S = 180  # the whole run takes ~15 s on 2 cores; a hung barrier must not hang CI


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
  env = dict(os.environ)
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  root = str(pathlib.Path(onnx_optax.__file__).resolve().parent.parent)
  env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  return env


def _run_all(commands: dict[str, tuple[list[str], dict[str, str]]], logs: pathlib.Path) -> None:
  """Runs the processes together; on the first failure or the timeout, kills the rest.

  A worker whose peer died waits in a barrier until the coordinator gives up,
  so waiting for each in turn could hang for minutes: poll them all instead.
  """
  procs, files = {}, {}
  try:
    for name, (argv, env) in commands.items():
      files[name] = open(logs / f"{name}.log", "w")
      procs[name] = subprocess.Popen(
        [sys.executable, *argv], env=env, stdout=files[name], stderr=subprocess.STDOUT
      )
    deadline = time.monotonic() + TIMEOUT_S
    failed = None
    while failed is None and any(p.poll() is None for p in procs.values()):
      failed = next((n for n, p in procs.items() if p.returncode not in (None, 0)), None)
      if time.monotonic() > deadline:
        failed = "timeout"
      time.sleep(0.2)
    failed = failed or next((n for n, p in procs.items() if p.returncode != 0), None)
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
        p.wait()
    for f in files.values():
      f.close()
  if failed is not None:
    report = [f"timed out after {TIMEOUT_S} s" if failed == "timeout" else f"{failed} failed"]
    for name, p in procs.items():
      text = (logs / f"{name}.log").read_text()
      report.append(f"--- {name} (exit code {p.returncode}), last lines:\n{text[-4000:]}")
    raise AssertionError("\n".join(report))


def _bits(a: np.ndarray) -> np.ndarray:
  """The bit patterns of ``a`` (so -0.0 != 0.0 and NaNs compare by payload)."""
  return np.atleast_1d(a).view(f"u{a.itemsize}")


def _assemble(npz_files: list[pathlib.Path]) -> dict[str, np.ndarray]:
  """Whole arrays from the shards of all processes (keys ``name@start:stop,...``).

  Every element must be covered, and shards that overlap (replicated leaves,
  held by every device) must agree to the bit.
  """
  pieces: dict[str, list[tuple[tuple[slice, ...], np.ndarray, str]]] = {}
  for path in npz_files:
    with np.load(path) as data:
      for key in data.files:
        name, bounds = key.rsplit("@", 1)
        index = tuple(slice(*map(int, b.split(":"))) for b in bounds.split(",") if b)
        pieces.setdefault(name, []).append((index, data[key], path.stem))
  whole = {}
  for name, shards in pieces.items():
    shape = tuple(max(s[0][d].stop for s in shards) for d in range(len(shards[0][0])))
    out = np.zeros(shape, shards[0][1].dtype)
    covered = np.zeros(shape, bool)
    for index, data, source in shards:
      region = out[index]
      seen = covered[index]
      assert np.array_equal(_bits(region[seen]), _bits(data[seen])), (
        f"{name}: the shard {index} of {source} differs from another copy of it"
      )
      out[index] = data
      covered[index] = True
    assert covered.all(), f"{name}: {np.count_nonzero(~covered)} elements are in no process's shards"
    whole[name] = out
  return whole


def test_two_processes_train_like_one(tmp_path):
  port = _free_port()
  worker = [str(WORKER)]
  commands = {
    f"process_{i}": (worker + ["distributed", str(tmp_path), str(port), str(i)], _env(4)) for i in range(2)
  }
  commands["reference"] = (worker + ["reference", str(tmp_path)], _env(1))
  _run_all(commands, tmp_path)

  for i in range(2):
    report = json.loads((tmp_path / f"process_{i}.json").read_text())
    assert report["detector"], "the collective detector saw nothing in a sharded sum"
    assert sorted(report["rules"]) == sorted(RULES), report
    for rule, checks in report["rules"].items():
      # Only a rule that reduces over a whole tensor (Rule.reduces: Adafactor) communicates.
      reduces = onnx_optax.registry.get(RULE_CONFIGS[rule].rule).reduces
      assert checks["collectives"] == [] or reduces, (i, rule, checks)
      assert checks["steps"] > checks["checkpoint_after"] > 0, (i, rule, checks)

  with np.load(tmp_path / "reference.npz") as data:
    expected = {k: data[k] for k in data.files}
  assert {k.split("[", 1)[0] for k in expected} == set(RULES)
  got = _assemble([tmp_path / f"process_{i}.npz" for i in range(2)])
  for run in ("", "resumed/"):
    keys = {k[len(run) :] for k in got if k.startswith(run) and (run or not k.startswith("resumed/"))}
    assert keys == set(expected), (run, sorted(keys ^ set(expected)))
    for key, want in expected.items():
      have = got[run + key]
      assert have.dtype == want.dtype and have.shape == want.shape, (run + key, have.dtype, want.dtype)
      different = _bits(have) != _bits(want)
      reduces = onnx_optax.registry.get(RULE_CONFIGS[key.split("[", 1)[0]].rule).reduces
      if reduces and np.issubdtype(want.dtype, np.floating):
        # Its sums over a sharded tensor add the shards' partial sums in another order than one
        # process's sum: each element within 8 ulps of the tensor's largest (a norm's rounding
        # scales the whole tensor), not to the bit.
        scale = np.max(np.abs(want.astype(np.float64)), initial=0.0)
        bound = 8 * float(np.finfo(want.dtype).eps) * scale
        different &= np.abs(have.astype(np.float64) - want) > bound
      assert not different.any(), (
        f"{run}{key}: {np.count_nonzero(different)} of {want.size} elements differ "
        f"from the single-process run; worst {np.max(np.abs(have.astype(np.float64) - want)):.3g}"
      )
