"""The memory a carry holds: the PyTorch state read into JAX and written back without extra copies.

What the bridges promise (docs/interop.md, "Memory"): reading a state dict builds no zero-filled
state to overwrite, makes no host copy of a tensor on the way (each is copied once, into its JAX
array, which then holds memory of its own), and writing back with ``copy=False`` shares the JAX
arrays' memory with the tensors. Small sizes; the figures are benchmarks/carry_memory.py's.
"""

from __future__ import annotations

import functools
import os
import tracemalloc
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from onnx_optax.interop import _dtensor, from_torch_state_dict, to_torch_state_dict

SHAPES = {"w": (512, 1024), "b": (1024,)}  # 2 MiB and 4 KiB of float32
INDEX = {k: i for i, k in enumerate(SHAPES)}  # optimizer.state_dict() keys its state by index
FIELDS = ("exp_avg", "exp_avg_sq")


def _saved_adamw() -> tuple[dict, dict]:
  """An AdamW's state dict after one step, and the weights as JAX arrays keyed by name."""
  g = torch.Generator().manual_seed(0)
  params = {k: torch.nn.Parameter(torch.randn(s, generator=g)) for k, s in SHAPES.items()}
  opt = torch.optim.AdamW(params.items(), lr=1e-3)
  for p in params.values():
    p.grad = torch.randn(p.shape, generator=g)
  opt.step()
  return opt.state_dict(), {k: jnp.asarray(p.detach().numpy()) for k, p in params.items()}


def _moments(state: object) -> dict[str, jax.Array]:
  return {f"{k}.{f}": getattr(state, f)[k] for k in SHAPES for f in FIELDS}


def _saved(saved: dict, name: str) -> torch.Tensor:
  key, field = name.split(".")
  return saved["state"][INDEX[key]][field]


def test_no_zero_state_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
  """init's parameter-shaped zeros are never computed: init is only traced."""
  saved, params = _saved_adamw()
  computed = []
  zeros_like = jnp.zeros_like

  def recording(a, *args, **kwargs):
    if not isinstance(a, jax.core.Tracer):
      computed.append(tuple(a.shape))
    return zeros_like(a, *args, **kwargs)

  monkeypatch.setattr(jnp, "zeros_like", recording)
  _, state = from_torch_state_dict(saved, params)
  assert computed == []
  # The state is the file's all the same.
  for name, value in _moments(state).items():
    np.testing.assert_array_equal(np.asarray(value), _saved(saved, name).numpy())


def test_read_makes_no_host_copy() -> None:
  """Host memory (NumPy's, which tracemalloc sees; JAX's buffers it does not) stays far below one
  state tensor while the state is read: the tensors are viewed, not copied, on the host."""
  saved, params = _saved_adamw()
  tensor_bytes = _saved(saved, "w.exp_avg").nbytes
  tracemalloc.start()
  try:
    from_torch_state_dict(saved, params)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < tensor_bytes / 4, (peak, tensor_bytes)


def test_read_compiles_one_program() -> None:
  """The copy of each tensor into JAX's memory is the runtime's (``device_put`` without aliasing), not
  an XLA program compiled per shape and dtype (about 30 ms each on a CPU: most of a small carry's
  time). One program is compiled: init's leaves that are not carried (the step count)."""
  g = torch.Generator().manual_seed(0)
  shapes = [(37, 53), (91,), (5, 7, 11)]  # shapes no other test copies (a compiled copy is cached)
  weights = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in shapes]
  opt = torch.optim.AdamW(weights, lr=1e-3)
  for p in weights:
    p.grad = torch.randn(p.shape, generator=g)
  opt.step()
  params = [jnp.asarray(p.detach().numpy()) for p in weights]
  compiled: list[str] = []

  def listen(event: str, duration_secs: float, **kwargs: str | int) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
      compiled.append(event)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    from_torch_state_dict(opt.state_dict(), params)
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert len(compiled) == 1


def test_carried_state_is_donated_in_place() -> None:
  """The carried arrays are JAX's own memory, which a donating step reuses for its outputs (memory
  shared with NumPy or PyTorch it could not: the step would hold two copies of the state)."""
  saved, params = _saved_adamw()
  tx, state = from_torch_state_dict(saved, params)
  before = {name: value.unsafe_buffer_pointer() for name, value in _moments(state).items()}

  @functools.partial(jax.jit, donate_argnums=1)
  def step(params, state):
    return tx.update(jax.tree.map(jnp.ones_like, params), state, params)[1]

  with warnings.catch_warnings():
    warnings.simplefilter("error")  # "Some donated buffers were not usable"
    state = step(params, state)
  after = {name: value.unsafe_buffer_pointer() for name, value in _moments(state).items()}
  assert after == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_to_numpy_is_a_view(dtype: torch.dtype) -> None:
  tensor = torch.arange(6, dtype=dtype).reshape(2, 3)
  host = _dtensor.to_numpy(torch, tensor)
  assert host.ctypes.data == tensor.data_ptr()
  np.testing.assert_array_equal(host.astype(np.float32), tensor.float().numpy())


def test_carried_state_has_memory_of_its_own() -> None:
  """A tensor changed in place after the carry (PyTorch's next step) leaves the JAX state as it was,
  though device_put would keep the tensor's aligned memory on the CPU."""
  saved, params = _saved_adamw()
  before = {f"{k}.{f}": _saved(saved, f"{k}.{f}").numpy().copy() for k in SHAPES for f in FIELDS}
  _, state = from_torch_state_dict(saved, params)
  for entry in saved["state"].values():
    entry["exp_avg"].add_(1.0)
    entry["exp_avg_sq"].mul_(2.0)
  for name, value in _moments(state).items():
    np.testing.assert_array_equal(np.asarray(value), before[name])


def test_carry_is_complete_when_it_returns() -> None:
  """The copies into JAX's memory are done when ``from_torch`` returns (the runtime makes them
  asynchronously): PyTorch's next step, in place at once, changes nothing of the carried state.
  16 MiB, which takes the copy a few milliseconds; planted, the copies not waited for: 70 to 75 % of
  the elements were the changed ones (three runs of three)."""
  from onnx_optax.interop import from_torch

  w = torch.nn.Parameter(torch.ones(1 << 22))
  opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
  w.grad = torch.full_like(w, 0.5)
  opt.step()
  _, state = from_torch(opt, [jnp.asarray(w.detach().numpy())])
  opt.state[w]["momentum_buffer"].fill_(-1.0)  # at once, as an in-place step would
  carried = np.asarray(jax.tree.leaves(state)[-1])
  assert carried.shape == (1 << 22,)
  np.testing.assert_array_equal(carried, np.full(1 << 22, 0.5, np.float32))


def test_path_reads_the_mapped_file(tmp_path: os.PathLike) -> None:
  """A path reads as the state dict saved there, and the state does not keep the file's pages:
  the file rewritten afterwards changes nothing of it."""
  saved, params = _saved_adamw()
  path = os.path.join(tmp_path, "optimizer.pt")
  torch.save(saved, path)
  _, state = from_torch_state_dict(path, params)
  torch.save({"rewritten": torch.zeros(3)}, path)  # truncates the file the tensors were mapped from
  for name, value in _moments(state).items():
    np.testing.assert_array_equal(np.asarray(value), _saved(saved, name).numpy())


def test_write_back_shares_or_copies() -> None:
  """``copy=False``: each moment tensor is its JAX array's memory; by default, a copy of the values."""
  saved, params = _saved_adamw()
  _, state = from_torch_state_dict(saved, params)
  moments = _moments(state)
  shared = to_torch_state_dict(state, saved, copy=False)
  copied = to_torch_state_dict(state, saved)
  for name, value in moments.items():
    assert _saved(shared, name).data_ptr() == value.unsafe_buffer_pointer()
    assert _saved(copied, name).data_ptr() != value.unsafe_buffer_pointer()
    np.testing.assert_array_equal(_saved(shared, name).numpy(), np.asarray(value))
    np.testing.assert_array_equal(_saved(copied, name).numpy(), np.asarray(value))


def test_path_of_the_legacy_format(tmp_path: os.PathLike) -> None:
  """A file of the format before zip (which cannot be mapped) is read whole, to the same state."""
  saved, params = _saved_adamw()
  path = os.path.join(tmp_path, "legacy.pt")
  torch.save(saved, path, _use_new_zipfile_serialization=False)
  with pytest.raises(RuntimeError, match="mmap"):
    torch.load(path, mmap=True, weights_only=True)
  _, state = from_torch_state_dict(path, params)
  for name, value in _moments(state).items():
    np.testing.assert_array_equal(np.asarray(value), _saved(saved, name).numpy())


def test_trainer_checkpoint_written_from_the_jax_arrays(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
  """``to_trainer_checkpoint`` maps the run's ``optimizer.pt`` (its template) and hands
  ``torch.save`` tensors that are the JAX arrays' memory: no copy of the state on the way out. The
  file written holds the JAX state's values."""
  from onnx_optax.interop import to_trainer_checkpoint

  saved, params = _saved_adamw()
  source = tmp_path / "checkpoint-1"
  source.mkdir()
  torch.save(saved, source / "optimizer.pt")
  w = torch.nn.Parameter(torch.zeros(1))
  schedule = torch.optim.lr_scheduler.LambdaLR(torch.optim.AdamW([w], lr=1e-3), lambda step: 1.0)
  torch.save(schedule.state_dict(), source / "scheduler.pt")
  (source / "trainer_state.json").write_text('{"global_step": 1}')
  _, state = from_torch_state_dict(source / "optimizer.pt", params)
  loads: list = []
  saves: list = []
  load, save = torch.load, torch.save

  def loading(*args, **kwargs):
    loads.append(kwargs.get("mmap"))
    return load(*args, **kwargs)

  def saving(obj, path, *args, **kwargs):
    saves.append((obj, path))
    return save(obj, path, *args, **kwargs)

  monkeypatch.setattr(torch, "load", loading)
  monkeypatch.setattr(torch, "save", saving)
  target = to_trainer_checkpoint(state, source, tmp_path / "checkpoint-2", steps=0, learning_rate=1e-3)
  assert loads[0] is True  # optimizer.pt, the first file read, is mapped
  (written,) = [obj for obj, path in saves if str(path).endswith("optimizer.pt")]
  for name, value in _moments(state).items():
    assert _saved(written, name).data_ptr() == value.unsafe_buffer_pointer()
  again = torch.load(target / "optimizer.pt", weights_only=True)
  for name, value in _moments(state).items():
    np.testing.assert_array_equal(_saved(again, name).numpy(), np.asarray(value))


def test_to_torch_copies_each_tensor_as_it_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
  """``to_torch`` checks the whole state with tensors that are the JAX arrays' memory (nothing copied
  up front), then gives each state entry a copy of its own as it writes it: the optimizer, which
  PyTorch steps in place, never shares memory with JAX, and holds the JAX state's values."""
  from onnx_optax.interop import _torch_optim, from_torch, to_torch

  g = torch.Generator().manual_seed(0)
  params = {k: torch.nn.Parameter(torch.randn(s, generator=g)) for k, s in SHAPES.items()}
  opt = torch.optim.AdamW(params.items(), lr=1e-3)
  for p in params.values():
    p.grad = torch.randn(p.shape, generator=g)
  opt.step()
  jax_params = {k: jnp.asarray(p.detach().numpy()) for k, p in params.items()}
  tx, state = from_torch(opt, jax_params)
  _, state = tx.update(jax.tree.map(jnp.ones_like, jax_params), state, jax_params)
  buffers = {v.unsafe_buffer_pointer() for v in _moments(state).values()}
  handed: list[int] = []
  write = _torch_optim.write

  def writing(*args, **kwargs):
    handed.extend(t.data_ptr() for t in args[6])
    return write(*args, **kwargs)

  monkeypatch.setattr(_torch_optim, "write", writing)
  to_torch(state, opt)
  assert set(handed) == buffers  # every tensor handed to the writes is a JAX array's memory
  for k, p in params.items():
    for f in FIELDS:
      written = opt.state[p][f]
      assert written.data_ptr() not in buffers
      np.testing.assert_array_equal(written.numpy(), np.asarray(getattr(state, f)[k]))
