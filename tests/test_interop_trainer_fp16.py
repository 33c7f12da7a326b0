"""A float16 Trainer run's GradScaler (``scaler.pt``) and generators (``rng_state.pth``) through JAX and back.

What the Trainer does with ``fp16=True`` here (transformers 5.24, accelerate 1.15, PyTorch's CPU build):
accelerate makes a GradScaler and float16 autocast only off the CPU, so on the CPU the run trains in the
model's dtype, skips no step and saves no ``scaler.pt``, and a ``scaler.pt`` in the directory it
resumes from stops it (``test_trainer_fp16_on_the_cpu``). The Trainer's float16 path (the loss scaled
before ``backward``, the gradients unscaled before clipping, a step with an inf or a NaN gradient skipped
and the scale backed off, ``scaler.pt`` saved and loaded) is run here with the GradScaler that accelerate
puts in a GPU run's accelerator (``torch.amp.GradScaler("cuda")``) made for the CPU, on a float64 model:
autocast leaves float64 alone, and a scale that is a power of two changes no gradient, so the
uninterrupted run is the one JAX continues, exactly. One sample's label is inf: its batch (steps 3 and
7) finds inf gradients, and the step is skipped. A dropout layer draws PyTorch random numbers at each
step, so that the generators the resume restores change the run.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import random
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from onnx_optax.interop import from_torch_state_dict, to_trainer_checkpoint, torch_param_names

WARMUP, TOTAL, N, M = 3, 7, 1, 3  # four batches an epoch; JAX takes steps 2-4 (3 skipped), to the epoch's end
LR = 1e-2


class _Regression(torch.nn.Module):
  """The Trainer trains any module whose forward returns the loss; this one draws dropout masks."""

  def __init__(self) -> None:
    super().__init__()
    self.hidden, self.norm, self.out = torch.nn.Linear(3, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2)
    self.dropout = torch.nn.Dropout(0.5)

  def forward(self, x: Any, labels: Any) -> dict:
    y = self.out(self.dropout(self.norm(torch.tanh(self.hidden(x)))))
    return {"loss": torch.nn.functional.mse_loss(y, labels)}


def _data(overflow: bool = True) -> list[dict]:
  """16 samples, four batches of four; with ``overflow``, sample 9 (the third batch) has an inf label."""
  g = torch.Generator().manual_seed(0)
  data = [
    {
      "x": torch.randn(3, generator=g, dtype=torch.float64),
      "labels": torch.randn(2, generator=g, dtype=torch.float64),
    }
    for _ in range(16)
  ]
  if overflow:
    data[9]["labels"] = torch.tensor([math.inf, 0.0], dtype=torch.float64)
  return data


def _grad_scaler(trainer: Any) -> None:
  """The accelerator of a GPU run with ``fp16=True``, with the GradScaler made for the CPU."""
  trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
  trainer.accelerator.native_amp = True  # the gradients unscaled before clipping, autocast on


def _trainer(
  output_dir: pathlib.Path, optim: str, scaler: bool = True, overflow: bool = True, **kwargs: Any
) -> Any:
  """A float16 Trainer (``fp16=True``) on ``_data(overflow)``, with a GPU run's GradScaler if ``scaler``."""
  import transformers

  transformers.logging.set_verbosity_error()
  logging.getLogger("transformers").setLevel(logging.ERROR)
  args = transformers.TrainingArguments(
    str(output_dir),
    **{
      "max_steps": TOTAL,
      "save_steps": 1,
      "learning_rate": LR,
      "warmup_steps": WARMUP,
      "weight_decay": 0.01,
      "per_device_train_batch_size": 4,
      "train_sampling_strategy": "sequential",  # the batches of the JAX steps are known
      "fp16": True,
      "optim": optim,
      "use_cpu": True,
      "report_to": "none",
      "logging_steps": 1000,
      "disable_tqdm": True,
      **kwargs,
    },
  )
  torch.manual_seed(0)
  trainer = transformers.Trainer(model=_Regression().double(), args=args, train_dataset=_data(overflow))
  if scaler:
    _grad_scaler(trainer)
  return trainer


def _schedule(t: Any) -> Any:
  """The Trainer's default schedule (linear, warmup 3, 7 steps) at its scheduler's step ``t``."""
  return LR * jnp.where(t < WARMUP, t / WARMUP, jnp.maximum(0.0, (TOTAL - t) / (TOTAL - WARMUP)))


def _rng(checkpoint: pathlib.Path) -> dict:
  return torch.load(checkpoint / "rng_state.pth", weights_only=False)


def _same_rng(a: dict, b: dict) -> bool:
  return (
    set(a) == set(b)
    and a["python"] == b["python"]
    and all(np.array_equal(x, y) for x, y in zip(a["numpy"], b["numpy"]))
    and torch.equal(a["cpu"], b["cpu"])
  )


_REFERENCES: dict[pathlib.Path, Any] = {}


@pytest.fixture(scope="module")
def fp16_root(tmp_path_factory):
  return tmp_path_factory.mktemp("trainer-fp16")


def _reference(root: pathlib.Path, optim: str) -> Any:
  """The uninterrupted run, a checkpoint each step under ``root / optim / "reference"``, trained once."""
  if root / optim not in _REFERENCES:
    trainer = _trainer(root / optim / "reference", optim)
    trainer.train()
    _REFERENCES[root / optim] = trainer
  return _REFERENCES[root / optim]


def _journey(root: pathlib.Path, optim: str) -> tuple[Any, pathlib.Path, list, dict]:
  """Steps 1-N the Trainer's, N+1-N+M JAX's (the Trainer's gradients, a step whose gradients are not
  finite skipped), written back with the generators the gradients' dropout continued.

  Returns the JAX run's state, the checkpoint it came from, ``found_inf`` and the generators."""
  import safetensors.torch

  checkpoint = root / optim / "reference" / f"checkpoint-{N}"
  saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
  weights = safetensors.torch.load_file(checkpoint / "model.safetensors")
  shift = torch.load(checkpoint / "scheduler.pt")["last_epoch"]
  # The gradients as the Trainer computes them (fp16=True on the CPU: no scaler; the scaled run's
  # gradients are these, scaled and unscaled by a power of two), its dropout drawing from the generators.
  client = _trainer(root / optim / "jax", optim, scaler=False)
  client.current_gradient_accumulation_steps = 1  # as the Trainer's loop sets it: one batch a step
  model = client.model
  names = torch_param_names(client.create_optimizer(), model)
  params = {name: jnp.asarray(weights[name].numpy()) for name in names}
  fused = bool(saved["param_groups"][0]["fused"])
  found_inf: list[bool] = []

  def schedule(n):
    # The rate of the Trainer's scheduler, which a fused kernel's skipped step steps too (accelerate sees
    # no skip there), and the others' does not.
    return _schedule(shift + n + (sum(found_inf) if fused else 0))

  tx, state = from_torch_state_dict(saved, params, learning_rate=schedule, param_names=names)
  data = _data()

  def grads_at(params, step):
    with torch.no_grad():
      for name, p in model.named_parameters():
        p.copy_(torch.from_numpy(np.array(params[name])))
    model.zero_grad()
    k = (step - 1) % 4  # the batch of Trainer step ``step`` (sequential sampler)
    batch = {key: torch.stack([d[key] for d in data[4 * k : 4 * k + 4]]) for key in data[0]}
    samples, count = client.get_batch_samples(iter([batch]), 1, torch.device("cpu"))
    client.training_step(model, samples[0], count)
    client.accelerator.clip_grad_norm_(model.parameters(), client.args.max_grad_norm)
    return {name: jnp.asarray(p.grad.numpy()) for name, p in model.named_parameters()}

  rng = _rng(checkpoint)  # the generators at step N, as the Trainer restores them
  random.setstate(rng["python"])
  np.random.set_state(rng["numpy"])
  torch.random.set_rng_state(rng["cpu"])
  for step in range(N + 1, N + M + 1):
    grads = grads_at(params, step)
    found_inf.append(not all(bool(jnp.isfinite(g).all()) for g in grads.values()))
    if not found_inf[-1]:
      updates, state = tx.update(grads, state, params)
      params = optax.apply_updates(params, updates)
  rng_state = {
    "python": random.getstate(),
    "numpy": np.random.get_state(),
    "cpu": torch.random.get_rng_state(),
  }

  target = root / optim / "jax" / f"checkpoint-{N + M}"
  target.mkdir(parents=True)
  tensors = {name: torch.tensor(np.asarray(p)) for name, p in params.items()}
  safetensors.torch.save_file(tensors, target / "model.safetensors")
  to_trainer_checkpoint(
    state,
    checkpoint,
    target,
    steps=found_inf.count(False),
    learning_rate=schedule,
    param_names=names,
    found_inf=found_inf,
    rng_state=rng_state,
  )
  return state, checkpoint, found_inf, rng_state


@pytest.mark.parametrize("optim", ["adamw_torch_fused", "adamw_torch"])
def test_trainer_fp16_grad_scaler_resumes_exactly(optim, fp16_root):
  """The Trainer's default fused AdamW (a skipped step steps its scheduler) and the foreach one (it does
  not): with the JAX steps' ``found_inf`` and generators, the Trainer's own resume is the uninterrupted
  run to 1e-12, its GradScaler's state at the end too, and the files written are those the Trainer saved
  itself at that step (but the counts of work done in trainer_state.json)."""
  reference = _reference(fp16_root, optim)
  with jax.enable_x64(True):
    _, _, found_inf, _ = _journey(fp16_root, optim)
  assert found_inf == [False, True, False]
  written = fp16_root / optim / "jax" / f"checkpoint-{N + M}"
  resumed = _trainer(fp16_root / optim / "jax", optim)
  resumed.train(resume_from_checkpoint=str(written))
  assert resumed.accelerator.scaler.state_dict() == reference.accelerator.scaler.state_dict()
  assert resumed.state.global_step == TOTAL
  worst = max(
    float((p.detach() - q.detach()).abs().max() / q.detach().abs().max())
    for p, q in zip(resumed.model.parameters(), reference.model.parameters())
  )
  assert worst <= 1e-12, worst
  own = fp16_root / optim / "reference" / f"checkpoint-{N + M}"
  # scaler.pt: backed off at step 3 (1024 -> 512), then one finite step of the three that grow it.
  assert (
    torch.load(own / "scaler.pt")["scale"] == 512.0 and torch.load(own / "scaler.pt")["_growth_tracker"] == 1
  )
  assert torch.load(written / "scaler.pt", weights_only=True) == torch.load(own / "scaler.pt")
  assert torch.load(written / "scheduler.pt") == torch.load(own / "scheduler.pt")
  assert _same_rng(_rng(written), _rng(own))
  states = [json.loads((path / "trainer_state.json").read_text()) for path in (written, own)]
  for state in states:
    for key in ("log_history", "total_flos", "num_input_tokens_seen"):
      state.pop(key)
  assert states[0] == states[1]


def test_trainer_fp16_on_the_cpu(tmp_path):
  """``fp16=True`` on the CPU: accelerate makes neither a GradScaler nor autocast (the model trains in its
  float64), and the checkpoint has no scaler.pt. ``found_inf`` is refused for it, and the advice followed
  writes no scaler.pt: the Trainer resumes that directory, and fails on one that holds a scaler.pt."""
  trainer = _trainer(tmp_path / "cpu", "adamw_torch_fused", scaler=False, overflow=False, max_steps=2)
  assert trainer.accelerator.mixed_precision == "fp16"
  assert trainer.accelerator.scaler is None and not trainer.accelerator.native_amp
  trainer.train()
  assert {p.dtype for p in trainer.model.parameters()} == {torch.float64}
  checkpoint = tmp_path / "cpu" / "checkpoint-1"
  assert not (checkpoint / "scaler.pt").exists()

  saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
  target = tmp_path / "jax" / "checkpoint-2"
  with jax.enable_x64(True):
    params = [jnp.zeros(tuple(saved["state"][i]["exp_avg"].shape), jnp.float64) for i in saved["state"]]
    tx, state = from_torch_state_dict(saved, params, learning_rate=lambda n: _schedule(1 + n))
    _, state = tx.update(params, state, params)
    with pytest.raises(
      ValueError, match=r"found_inf is given, but checkpoint .* has no scaler.pt: .* Leave found_inf out"
    ):
      to_trainer_checkpoint(
        state, checkpoint, target, steps=1, learning_rate=lambda n: _schedule(1 + n), found_inf=[False]
      )
    assert not target.exists()
    to_trainer_checkpoint(state, checkpoint, target, steps=1, learning_rate=lambda n: _schedule(1 + n))
  assert sorted(p.name for p in target.iterdir()) == [
    "optimizer.pt",
    "rng_state.pth",
    "scheduler.pt",
    "trainer_state.json",
  ]
  shutil.copy(checkpoint / "model.safetensors", target)
  resumed = _trainer(tmp_path / "jax", "adamw_torch_fused", scaler=False, overflow=False, max_steps=4)
  resumed.train(resume_from_checkpoint=str(target))
  assert resumed.state.global_step == 4
  # Why found_inf is refused there: a Trainer without a GradScaler does not resume a scaler.pt.
  torch.save(torch.amp.GradScaler("cpu").state_dict(), target / "scaler.pt")
  again = _trainer(tmp_path / "again", "adamw_torch_fused", scaler=False, overflow=False, max_steps=4)
  with pytest.raises(AttributeError, match=r"'NoneType' object has no attribute 'load_state_dict'"):
    again.train(resume_from_checkpoint=str(target))


def test_trainer_fp16_refusals(fp16_root, tmp_path):
  """A checkpoint with scaler.pt and no ``found_inf``; ``found_inf`` that disagrees with ``steps`` or is
  not bools; a scaler.pt that is not a GradScaler's; ``rng_state`` not in the Trainer's layout, or given
  for a distributed run: refused before anything is written, the advice followed as printed, and what it
  writes read back by the Trainer's own ``_load_scaler`` and ``_load_rng_state``. Without ``rng_state``,
  the checkpoint's rng_state.pth is copied (the generators of its step)."""
  _reference(fp16_root, "adamw_torch_fused")
  checkpoint = tmp_path / f"checkpoint-{N}"
  shutil.copytree(fp16_root / "adamw_torch_fused" / "reference" / f"checkpoint-{N}", checkpoint)
  assert torch.load(checkpoint / "scaler.pt") == {
    "scale": 1024.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 3,
    "_growth_tracker": 1,
  }
  reader = _trainer(tmp_path / "reader", "adamw_torch_fused")  # the Trainer's own loading of the files

  def scaler_read(directory):
    reader._load_scaler(str(directory))
    return reader.accelerator.scaler.state_dict()

  saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
  with jax.enable_x64(True):
    params = [jnp.zeros(tuple(saved["state"][i]["exp_avg"].shape), jnp.float64) for i in saved["state"]]
    tx, state = from_torch_state_dict(saved, params, learning_rate=lambda n: _schedule(N + n))
    for _ in range(2):
      _, state = tx.update(params, state, params)

    def write(name, **kwargs):
      kwargs = {"steps": 2, "learning_rate": lambda n: _schedule(N + n), **kwargs}
      return to_trainer_checkpoint(state, checkpoint, tmp_path / name, **kwargs)

    with pytest.raises(
      ValueError, match=r"has scaler.pt, a float16 run's GradScaler, .* pass found_inf, .*"
    ) as error:
      write("none")
    assert not (tmp_path / "none").exists()
    advice = str(error.value).split("found_inf=", 1)[1].split(" if ", 1)[0]
    assert advice == "[False] * 2"
    written = write("none", found_inf=eval(advice))  # noqa: S307 (the advice as printed)
    assert scaler_read(written)["scale"] == 2048.0 and scaler_read(written)["_growth_tracker"] == 0
    assert json.loads((written / "trainer_state.json").read_text())["global_step"] == N + 2
    # A JAX array of bools, as a jitted loop records it, is read as the list.
    assert write("array", found_inf=jnp.array([False, False])) == tmp_path / "array"
    assert torch.load(tmp_path / "array" / "scaler.pt") == torch.load(written / "scaler.pt")
    # Without rng_state: the checkpoint's generators, those of step N, byte for byte.
    assert (written / "rng_state.pth").read_bytes() == (checkpoint / "rng_state.pth").read_bytes()

    with pytest.raises(
      ValueError,
      match=r"found_inf has 3 entries, 2 True \(skipped\) and 1 False \(applied\), but steps=2: found_inf "
      r"holds a False for each of the 2 updates the JAX run applied \(steps counts them\) and a True",
    ):
      write("disagree", found_inf=[True, True, False])
    assert not (tmp_path / "disagree").exists()
    written = write("disagree", found_inf=[False, True, False])  # two False, one True
    assert scaler_read(written)["scale"] == 512.0 and scaler_read(written)["_growth_tracker"] == 1
    assert json.loads((written / "trainer_state.json").read_text())["global_step"] == N + 3
    for wrong, match in [
      ("no", r"found_inf must be a list of bools"),
      ([0, 1], r"found_inf\[0\] is 0 \(int\)"),
    ]:
      with pytest.raises(TypeError, match=match):
        write("type", found_inf=wrong)
    assert not (tmp_path / "type").exists()

    # rng_state: the advice printed is code; run as printed, the generators at that moment are written, and
    # the Trainer restores them.
    for wrong, match in [
      (
        {"cpu": torch.random.get_rng_state()},
        r"rng_state must hold the generators' states with the keys \['python', 'numpy', 'cpu'\], those of ",
      ),
      (
        {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": np.random.get_state()},
        r"rng_state\['cpu'\] is not a state the Trainer can restore",
      ),
    ]:
      with pytest.raises(ValueError, match=match) as error:
        write("rng", found_inf=[False] * 2, rng_state=wrong)
      assert not (tmp_path / "rng").exists()
    code = str(error.value).split("pass rng_state=", 1)[1].split(", taken where", 1)[0]
    getters = (
      '"python": random.getstate(), "numpy": numpy.random.get_state(), "cpu": torch.random.get_rng_state()'
    )
    assert code == "{" + getters + "}"
    given = eval(code, {"random": random, "numpy": np, "torch": torch})  # noqa: S307 (the advice as printed)
    written = write("rng", found_inf=[False] * 2, rng_state=given)
    torch.rand(3), np.random.rand(3), random.random()  # the generators move on
    reader._load_rng_state(str(written))
    now = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    assert _same_rng(now, given)

    # A distributed run's checkpoint: one file per process, which only copying keeps.
    (checkpoint / "rng_state.pth").rename(checkpoint / "rng_state_0.pth")
    shutil.copy(checkpoint / "rng_state_0.pth", checkpoint / "rng_state_1.pth")
    with pytest.raises(
      ValueError, match=r"holds rng_state_0.pth, rng_state_1.pth, one per process .* leave rng_state out"
    ):
      write("ranks", found_inf=[False] * 2, rng_state=given)
    assert not (tmp_path / "ranks").exists()
    written = write("ranks", found_inf=[False] * 2)
    assert sorted(p.name for p in written.glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]

    torch.save({"scale": 1024.0}, checkpoint / "scaler.pt")
    with pytest.raises(
      TypeError,
      match=r"has a scaler.pt that is not a torch.amp.GradScaler.s state dict .* pass as checkpoint the",
    ):
      write("scaler", found_inf=[False] * 2)
    assert not (tmp_path / "scaler").exists()
