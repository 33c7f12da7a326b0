"""Hugging Face's Trainer and Lightning: their own checkpoints to JAX, and back into their own resume.

Each journey is the client's, on a tiny model built from a config (no download) on the CPU:

1. the client's uninterrupted run, the expectation, saves its checkpoints as it does by default;
2. JAX resumes from the checkpoint at step N, from its files alone: the optimizer state with
   ``from_torch_state_dict``, the parameters keyed by the names ``torch_param_names`` gives for the
   optimizer the client builds, the learning-rate schedule as a JAX schedule of the updates shifted
   by the saved step (the recipe of docs/interop.md);
3. M steps in JAX, with the gradients the client itself computes at JAX's weights (its loss, its
   gradient clipping, its batches): what is under test is the optimizer's and the scheduler's state;
4. the step N + M written back, ``to_trainer_checkpoint`` / ``to_lightning_checkpoint``, with the
   weights saved as the client reads them;
5. the client's own resume (``trainer.train(resume_from_checkpoint=...)``,
   ``Trainer.fit(ckpt_path=...)``) runs to the end, no scheduler stepped by hand.

The final weights equal the uninterrupted run's: in float64 to 1e-12 of each tensor's largest
magnitude; in float32 within ``max(4 ulp, 2 x PyTorch's own spread)`` (as
tests/test_float32_carry.py), the spread being how far PyTorch's own other kernel takes the run
from the uninterrupted one, from the start and from the step where the journey leaves PyTorch,
measured here in the same run (the Trainer's also at the step the journey hands back: see its
test). The Trainer's schedule (warmup 3, 7 steps) has different rates at steps N and N + M, so
that a bridge that writes back the checkpoint's stale rate
fails each journey: planted (``to_torch_state_dict`` keeping the groups' ``lr``), the Trainer's runs end
8e-3 to 1.5e-2 off in float64 and 6.6e4 to 2.2e5 ulp off in float32, Lightning's 3e-2 and 1.3e6 ulp.
(With 6 steps, the rates at steps 2 and 4 are equal, and the Trainer's journeys passed with the plant.)
"""

from __future__ import annotations

import copy
import json
import logging
import pathlib
import pickle
import re
import shutil
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from onnx_optax.interop import (
  from_torch_state_dict,
  to_lightning_checkpoint,
  to_trainer_checkpoint,
  torch_param_names,
)

# --- shared: the comparisons --------------------------------------------------

RAN: list = []  # what an unpickled file ran


def _run(what: str) -> str:
  RAN.append(what)
  return what


class _Code:
  """Unpickled by a full ``torch.load``, it calls ``_run``: a file that runs code when read."""

  def __reduce__(self) -> tuple:
    return _run, ("code",)


def _relative(a: Any, b: Any) -> float:
  """The largest difference over the tensors, each relative to its largest magnitude in ``b``."""
  return max(
    float((p.detach().double() - q.detach().double()).abs().max() / q.detach().double().abs().max())
    for p, q in zip(a, b)
  )


def _ulps(a: Any, b: Any) -> float:
  """The largest difference over the tensors in ulps of each tensor's largest magnitude in ``b``."""
  worst = 0.0
  for p, q in zip(a, b):
    p, q = p.detach().numpy(), q.detach().numpy()
    spacing = float(np.spacing(np.max(np.abs(q)).astype(q.dtype)))
    worst = max(worst, float(np.max(np.abs(p.astype(np.float64) - q.astype(np.float64)))) / spacing)
  return worst


def _load(model: Any, values: dict) -> None:
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.from_numpy(np.array(values[name])))


def _jax_steps(tx: Any, state: Any, params: dict, grads_at: Any, batches: list) -> tuple[dict, Any]:
  update = jax.jit(tx.update)
  for batch in batches:
    updates, state = update(grads_at(params, batch), state, params)
    params = optax.apply_updates(params, updates)
  return params, state


# --- Hugging Face Trainer -------------------------------------------------------

WARMUP, TOTAL, N, M = 3, 7, 2, 2  # two batches an epoch: N and N + M end epochs 1 and 2
LR = 1e-2


def _trainer_schedule(step: int) -> Any:
  """The Trainer's default schedule (linear, with warmup) shifted by the saved step, in JAX."""

  def schedule(n):
    t = n + step
    return LR * jnp.where(t < WARMUP, t / WARMUP, jnp.maximum(0.0, (TOTAL - t) / (TOTAL - WARMUP)))

  return schedule


#: The Trainer's ``optim_args`` of each optimizer the journeys run (every option the twin reads).
OPTIM_ARGS = {"sgd": "momentum=0.9", "rmsprop": "momentum=0.5,centered=true,alpha=0.9,eps=0.001"}


class _Trainer:
  """The tiny model, its data and the Trainer's arguments, one optimizer and dtype."""

  def __init__(self, optim: str, dtype: Any, root: pathlib.Path) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    self.transformers, self.optim, self.dtype, self.root = transformers, optim, dtype, root
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32, (8, 8), generator=generator)
    self.data = [{"input_ids": x, "labels": x} for x in ids]

  def model(self) -> Any:
    config = self.transformers.LlamaConfig(
      vocab_size=32,
      hidden_size=8,
      intermediate_size=16,
      num_hidden_layers=1,
      num_attention_heads=2,
      num_key_value_heads=2,
      max_position_embeddings=16,
      tie_word_embeddings=True,  # tied weights: one parameter under two names
    )
    torch.manual_seed(0)
    return self.transformers.LlamaForCausalLM(config).to(self.dtype)

  def trainer(self, name: str, optim: str | None = None, fused: bool = False) -> Any:
    """A Trainer writing under ``name``; ``fused``: the optimizer the arguments name, with PyTorch's
    fused kernel (which the Trainer offers only for AdamW, as ``adamw_torch_fused``)."""
    args = self.transformers.TrainingArguments(
      str(self.root / name),
      per_device_train_batch_size=4,
      max_steps=TOTAL,
      save_steps=N,
      learning_rate=LR,
      warmup_steps=WARMUP,
      weight_decay=0.01,
      optim=optim or self.optim,
      optim_args=OPTIM_ARGS.get(self.optim),
      train_sampling_strategy="sequential",  # the batches of the JAX steps are known
      report_to="none",
      use_cpu=True,
      logging_steps=1000,
      disable_tqdm=True,
    )
    model, kernel = self.model(), None
    if fused:
      cls, kwargs = self.transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
      kernel = (cls, {**kwargs, "fused": True})
    return self.transformers.Trainer(
      model=model, args=args, train_dataset=self.data, optimizer_cls_and_kwargs=kernel
    )

  def batch(self, step: int) -> dict:
    """The batch of the Trainer's step ``step + 1`` (sequential sampler, two batches an epoch)."""
    k = step % 2
    return {key: torch.stack([d[key] for d in self.data[4 * k : 4 * k + 4]]) for key in self.data[0]}


@pytest.fixture(scope="module")
def trainer_root(tmp_path_factory):
  return tmp_path_factory.mktemp("trainer")


_REFERENCES: dict[pathlib.Path, Any] = {}


def _reference(setup: _Trainer) -> Any:
  """The uninterrupted run (its checkpoints under ``setup.root / "reference"``), trained once per setup."""
  if setup.root not in _REFERENCES:
    trainer = setup.trainer("reference")
    trainer.train()
    _REFERENCES[setup.root] = trainer.model
  return _REFERENCES[setup.root]


def _trainer_journey(setup: _Trainer, name: str = "jax") -> tuple[Any, Any, tuple[dict, dict]]:
  """The uninterrupted run and the resumed one (steps 1-N Trainer, N+1-N+M JAX, the rest Trainer),
  the resumed one's checkpoints under ``setup.root / name``."""
  reference = _reference(setup)
  checkpoint = setup.root / "reference" / f"checkpoint-{N}"

  # JAX, from the directory alone.
  import safetensors.torch

  saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
  weights = safetensors.torch.load_file(checkpoint / "model.safetensors")
  step = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
  client = setup.trainer(name)  # builds the optimizer as the run did: its names, its gradients
  model = client.model
  names = torch_param_names(client.create_optimizer(), model)
  decay = client.get_decay_parameter_names(model)
  assert names[: len(saved["param_groups"][0]["params"])] == [
    n for n, _ in model.named_parameters() if n in decay
  ]
  params = {name: jnp.asarray(weights[name].numpy()) for name in names}
  tx, state = from_torch_state_dict(saved, params, learning_rate=_trainer_schedule(step), param_names=names)

  def grads_at(params, batch):
    _load(model, params)
    model.zero_grad()
    samples, count = client.get_batch_samples(iter([batch]), 1, torch.device("cpu"))
    client.training_step(model, samples[0], count)
    client.accelerator.clip_grad_norm_(model.parameters(), client.args.max_grad_norm)
    return {name: jnp.asarray(p.grad.numpy()) for name, p in model.named_parameters()}

  params, state = _jax_steps(tx, state, params, grads_at, [setup.batch(k) for k in range(N, N + M)])

  # Back: the weights as the Trainer saves them, then the optimizer's and the scheduler's side.
  target = setup.root / name / f"checkpoint-{N + M}"
  _load(model, params)
  model.save_pretrained(target)
  to_trainer_checkpoint(
    state, checkpoint, target, steps=M, learning_rate=_trainer_schedule(step), param_names=names
  )
  written = torch.load(target / "scheduler.pt"), json.loads((target / "trainer_state.json").read_text())
  resumed = setup.trainer(name)
  resumed.train(resume_from_checkpoint=str(target))
  return reference, resumed.model, written


@pytest.mark.parametrize("optim", ["adamw_torch_fused", "sgd", "adagrad", "rmsprop"])
def test_trainer_float64_resumes_exactly(optim, trainer_root):
  """AdamW (the Trainer's default, fused), SGD with momentum, Adagrad and RMSprop (centred, with
  momentum), with the default linear schedule with warmup: the resumed run is the uninterrupted one
  to 1e-12."""
  with jax.enable_x64(True):
    reference, resumed, (scheduler, trainer_state) = _trainer_journey(
      _Trainer(optim, torch.float64, trainer_root / optim)
    )
  assert _relative(resumed.parameters(), reference.parameters()) <= 1e-12
  # The files written are those the Trainer saved itself at that step (but the counts of work done).
  own = trainer_root / optim / "reference" / f"checkpoint-{N + M}"
  assert scheduler == torch.load(own / "scheduler.pt")
  states = [trainer_state, json.loads((own / "trainer_state.json").read_text())]
  for state in states:
    for key in ("log_history", "total_flos", "num_input_tokens_seen"):
      state.pop(key)
  assert states[0] == states[1]


def _weights(checkpoint: pathlib.Path) -> list:
  """The weights a Trainer checkpoint holds, in the order of their names."""
  import safetensors.torch

  return [w for _, w in sorted(safetensors.torch.load_file(checkpoint / "model.safetensors").items())]


@pytest.mark.parametrize("optim", ["adamw_torch_fused", "sgd", "adagrad"])
def test_trainer_float32_within_pytorchs_spread(optim, trainer_root):
  """AdamW (the Trainer's default, fused), SGD with momentum and Adagrad in float32, with the default
  linear schedule with warmup, within ``max(4 ulp, 2 x PyTorch's own spread)``. The spread is the
  larger of two PyTorch runs against the uninterrupted one: the same run with PyTorch's other kernel
  (AdamW's default one for the fused; the fused one for SGD and Adagrad) from the start, and from
  step N on, where the journey leaves PyTorch. Two journeys:

  - with JAX's step-dependent scalars in float64 (``jax_enable_x64``), as PyTorch computes them, the
    carried run is PyTorch's own program but for the rounding of single operations: checked at the
    step it hands back (N + M) and at the end of the client's resumed run;
  - with JAX's default float32 scalars, each JAX step's learning rate and bias corrections a few
    ulps off PyTorch's float64 ones: checked at the step it hands back, against the spread there.
    The client's later steps carry a difference on by as much as the model's dynamics on that CPU
    grow it, which no spread of PyTorch's kernels measures: for AdamW this journey ended 1.9 ulp
    from the uninterrupted run on an AMD EPYC (1.6 at the hand-back), and 4.5 on an Intel Xeon
    with AVX-512, where PyTorch's other kernel was 1.0 ulp off at the end."""
  if optim == "adamw_torch_fused":
    kernel = dict(optim="adamw_torch")
  else:
    kernel = dict(fused=True)
  setup = _Trainer(optim, torch.float32, trainer_root / f"float32-{optim}")
  with jax.enable_x64(True):
    reference, resumed, _ = _trainer_journey(setup)
  other = setup.trainer("other-kernel", **kernel)
  other.train()
  # The same run switched to the other kernel where the journey leaves PyTorch (step N): the
  # optimizer's own groups in the checkpoint say which kernel a resume runs, so the copy says the other.
  switch = setup.root / "switch" / f"checkpoint-{N}"
  shutil.copytree(setup.root / "reference" / f"checkpoint-{N}", switch)
  saved = torch.load(switch / "optimizer.pt", weights_only=True)
  for group in saved["param_groups"]:
    group["fused"] = None if optim == "adamw_torch_fused" else True
  torch.save(saved, switch / "optimizer.pt")
  switched = setup.trainer("switch", **kernel)
  switched.train(resume_from_checkpoint=str(switch))
  assert [g["fused"] for g in switched.optimizer.param_groups] == [g["fused"] for g in saved["param_groups"]]

  back = f"checkpoint-{N + M}"
  expected = _weights(setup.root / "reference" / back)
  spread = max(
    _ulps(other.model.parameters(), reference.parameters()),
    _ulps(switched.model.parameters(), reference.parameters()),
  )
  spread_back = max(_ulps(_weights(setup.root / run / back), expected) for run in ("other-kernel", "switch"))
  carried = _ulps(resumed.parameters(), reference.parameters())
  assert carried <= max(4.0, 2 * spread), (carried, spread)
  carried_back = _ulps(_weights(setup.root / "jax" / back), expected)
  assert carried_back <= max(4.0, 2 * spread_back), (carried_back, spread_back)

  _trainer_journey(setup, "jax-float32-scalars")  # the same uninterrupted run, trained once
  carried_back = _ulps(_weights(setup.root / "jax-float32-scalars" / back), expected)
  assert carried_back <= max(4.0, 2 * spread_back), (carried_back, spread_back)


def test_trainer_refusals(trainer_root, tmp_path):
  """A directory without scheduler.pt (the Trainer would not load the optimizer), the source as target,
  steps that the state's count contradicts, and a file that would run code when read: refused before
  anything is written. trainer_state.json is written as the Trainer writes it; its epoch is scaled by
  the global steps (from global step 1 on), and kept where it cannot be (None, or global step 0)."""
  setup = _Trainer("adamw_torch_fused", torch.float32, trainer_root / "float32-adamw_torch_fused")
  _reference(setup)
  checkpoint = tmp_path / f"checkpoint-{N}"
  shutil.copytree(setup.root / "reference" / f"checkpoint-{N}", checkpoint)
  saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
  params = {f"p{i}": jnp.zeros(tuple(saved["state"][i]["exp_avg"].shape)) for i in saved["state"]}
  tx, state = from_torch_state_dict(saved, list(params.values()), learning_rate=_trainer_schedule(N))
  updates, state = tx.update(list(params.values()), state, list(params.values()))
  with pytest.raises(ValueError, match=r"directory is checkpoint"):
    to_trainer_checkpoint(state, checkpoint, checkpoint, steps=1, learning_rate=_trainer_schedule(N))
  target = tmp_path / "run" / f"checkpoint-{N + 1}"  # its parent too is created
  with pytest.raises(
    ValueError, match=r"steps=2, but the state's count for parameter 0 is 3 .* pass steps=1"
  ):
    to_trainer_checkpoint(state, checkpoint, target, steps=2, learning_rate=_trainer_schedule(N))
  assert not target.exists()

  # Written as the Trainer's own TrainerState writes it: read and saved again by it, byte for byte.
  from transformers.trainer_callback import TrainerState

  def check_trainer_layout(written):
    TrainerState.load_from_json(str(written / "trainer_state.json")).save_to_json(str(tmp_path / "own.json"))
    assert (tmp_path / "own.json").read_bytes() == (written / "trainer_state.json").read_bytes()

  check_trainer_layout(
    to_trainer_checkpoint(state, checkpoint, target, steps=1, learning_rate=_trainer_schedule(N))
  )
  # An epoch not known (None), or no step to scale it by (global_step 0): kept as it is; at global step
  # 1, scaled. The source written in another layout (keys reversed, one line): the Trainer's layout still.
  saved_state = json.loads((checkpoint / "trainer_state.json").read_text())
  edges = [({"epoch": None}, None), ({"global_step": 0, "epoch": 0.5}, 0.5)]
  edges.append(({"global_step": 1, "epoch": 0.25}, 0.5))
  for k, (edit, epoch) in enumerate(edges):
    source = dict(reversed({**saved_state, **edit}.items()))
    (checkpoint / "trainer_state.json").write_text(json.dumps(source))
    written = to_trainer_checkpoint(
      state, checkpoint, tmp_path / f"edge{k}", steps=1, learning_rate=_trainer_schedule(N)
    )
    check_trainer_layout(written)
    trainer_state = json.loads((written / "trainer_state.json").read_text())
    assert trainer_state["epoch"] == epoch
    assert trainer_state["global_step"] == edit.get("global_step", saved_state["global_step"]) + 1

  # Files read as the Trainer reads them, tensors and plain data only: one that would run code when
  # unpickled is refused before it runs.
  (checkpoint / "trainer_state.json").write_text(json.dumps(saved_state))
  for name in ("optimizer.pt", "scheduler.pt"):
    shutil.copy(checkpoint / name, tmp_path / name)
    torch.save({**torch.load(checkpoint / name, weights_only=True), "code": _Code()}, checkpoint / name)
    with pytest.raises(pickle.UnpicklingError, match=r"Weights only load failed"):
      to_trainer_checkpoint(state, checkpoint, tmp_path / "code", steps=1, learning_rate=_trainer_schedule(N))
    assert RAN == [] and not (tmp_path / "code").exists()
    shutil.copy(tmp_path / name, checkpoint / name)

  (checkpoint / "scheduler.pt").unlink()
  with pytest.raises(FileNotFoundError, match=r"has no scheduler.pt"):
    to_trainer_checkpoint(state, checkpoint, target, steps=1, learning_rate=_trainer_schedule(N))


# --- Lightning ------------------------------------------------------------------

GAMMA, BATCHES = 0.9, 4  # ExponentialLR stepped every optimizer step; four batches an epoch
_MANUAL = "epoch_loop.manual_optimization.optim_step_progress"  # manual optimization's step count


def _lightning(
  dtype: Any, root: pathlib.Path, fused: bool | None = None, interval: str = "step"
) -> tuple[Any, Any, Any]:
  """A module (an MLP with a LayerNorm; Adam and an ExponentialLR), its data and a Trainer factory."""
  import lightning

  logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

  class Module(lightning.LightningModule):
    def __init__(self) -> None:
      super().__init__()
      torch.manual_seed(0)
      self.net = torch.nn.Sequential(
        torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2)
      ).to(dtype)

    def training_step(self, batch, batch_idx):
      x, y = batch
      return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
      opt = torch.optim.Adam(self.parameters(), lr=1e-2, weight_decay=0.01, fused=fused)
      scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, GAMMA)
      return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

  generator = torch.Generator().manual_seed(1)
  x = torch.randn(4 * BATCHES, 3, generator=generator, dtype=dtype)
  y = torch.randn(4 * BATCHES, 2, generator=generator, dtype=dtype)
  data = torch.utils.data.TensorDataset(x, y)
  return Module, data, _lightning_fit(data, root)


def _lightning_fit(data: Any, root: pathlib.Path) -> Any:
  """``fit(module, epochs, ckpt_path=None, **trainer_options)``: Lightning on the CPU, batches of 4."""
  import lightning

  def fit(module, epochs, ckpt_path=None, **kw):
    trainer = lightning.Trainer(
      max_epochs=epochs,
      accelerator="cpu",
      logger=False,
      enable_progress_bar=False,
      enable_model_summary=False,
      default_root_dir=root,
      **kw,
    )
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # the dataloader's workers, the deprecation of LeafSpec
      trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=ckpt_path)

  return fit


@pytest.fixture(scope="module")
def lightning_root(tmp_path_factory):
  return tmp_path_factory.mktemp("lightning")


def _lightning_journey(dtype: Any, root: pathlib.Path, interval: str = "step") -> tuple[Any, Any, dict, Any]:
  """The uninterrupted run and the resumed one (epoch 1 Lightning, epoch 2 JAX, epoch 3 Lightning)."""
  import lightning

  Module, data, fit = _lightning(dtype, root, interval=interval)
  reference = Module()
  fit(
    reference,
    3,
    callbacks=[lightning.pytorch.callbacks.ModelCheckpoint(root / "ckpt", save_top_k=-1, filename="{epoch}")],
  )
  checkpoint = torch.load(root / "ckpt" / "epoch=0.ckpt", weights_only=False)

  module = Module()
  names = torch_param_names(module.configure_optimizers()["optimizer"], module)
  params = {name: jnp.asarray(checkpoint["state_dict"][name].numpy()) for name in names}
  step = checkpoint["global_step"]
  # ExponentialLR stepped after each update, or after each epoch of BATCHES updates.
  schedule = lambda n: 1e-2 * GAMMA ** (n + step if interval == "step" else (n + step) // BATCHES)  # noqa: E731
  tx, state = from_torch_state_dict(
    checkpoint["optimizer_states"][0], params, learning_rate=schedule, param_names=names
  )

  def grads_at(params, k):
    _load(module, params)
    module.zero_grad()
    module.training_step(data[4 * k : 4 * k + 4], k).backward()
    return {name: jnp.asarray(p.grad.numpy()) for name, p in module.named_parameters()}

  params, state = _jax_steps(tx, state, params, grads_at, list(range(BATCHES)))
  _load(module, params)
  written = to_lightning_checkpoint(
    state, checkpoint, module.state_dict(), steps=BATCHES, learning_rate=schedule, param_names=names
  )
  torch.save(written, root / "jax.ckpt")
  resumed = Module()
  fit(resumed, 3, ckpt_path=root / "jax.ckpt")
  return reference, resumed, checkpoint, (state, names, module.state_dict(), schedule)


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_lightning_float64_resumes_exactly(interval, lightning_root):
  """Adam with an ExponentialLR stepped per step, or per epoch (Lightning's default interval), replayed in
  PyTorch on the saved state: the resumed run is the uninterrupted one to 1e-12; the written loops'
  counters and scheduler are those Lightning saved itself at that epoch."""
  root = lightning_root / f"float64-{interval}"
  with jax.enable_x64(True):
    reference, resumed, checkpoint, _ = _lightning_journey(torch.float64, root, interval)
  assert _relative(resumed.parameters(), reference.parameters()) <= 1e-12
  own = torch.load(root / "ckpt" / "epoch=1.ckpt", weights_only=False)
  written = torch.load(root / "jax.ckpt", weights_only=False)
  assert written["loops"] == own["loops"]
  assert (written["epoch"], written["global_step"]) == (own["epoch"], own["global_step"]) == (1, 2 * BATCHES)
  assert written["lr_schedulers"] == own["lr_schedulers"]


def test_lightning_float32_within_pytorchs_spread_and_refusals(lightning_root):
  """float32: within max(4 ulp, 2 x fused Adam against the default). Then the refusals: a checkpoint saved
  inside an epoch, counting manual optimization's steps too, with counters that differ between epochs or
  epochs without an optimizer step, not Lightning's, of two optimizers under automatic optimization or two
  schedulers; steps that end inside an epoch (the advice: the whole epochs either side), weights of other
  keys, steps the state's count contradicts, scheduler_steps (which the loops count here: the advice, leave
  it out, followed). Without manual optimization's counter (automatic optimization's count is the global
  step: none manual) or ``_batches_that_stepped``, read, and written back the same without them."""
  root = lightning_root / "float32"
  reference, resumed, checkpoint, (state, names, weights, schedule) = _lightning_journey(torch.float32, root)
  Module, _, fit = _lightning(torch.float32, root / "fused", fused=True)
  other = Module()
  fit(other, 3)
  spread = _ulps(other.parameters(), reference.parameters())
  carried = _ulps(resumed.parameters(), reference.parameters())
  assert carried <= max(4.0, 2 * spread), (carried, spread)

  def write(checkpoint=checkpoint, weights=weights, steps=BATCHES):
    return to_lightning_checkpoint(
      state, checkpoint, weights, steps=steps, learning_rate=schedule, param_names=names
    )

  def loops(edit):
    """A copy of the checkpoint whose fit loop's counters ``edit`` changed."""
    copied = json.loads(json.dumps(checkpoint["loops"]))
    edit(copied["fit_loop"])
    return {**checkpoint, "loops": copied}

  def inside(fit):
    fit["epoch_loop.batch_progress"]["is_last_batch"] = False

  def manual(fit):
    fit["epoch_loop.manual_optimization.optim_step_progress"]["total"]["completed"] = 3

  def uneven(fit):
    fit["epoch_loop.batch_progress"]["total"]["ready"] += 1

  def stepless(fit):
    step = fit["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]
    step["total"]["completed"] = step["current"]["completed"] = 0

  with pytest.raises(ValueError, match=r"saved inside an epoch \(after its batch 4\)"):
    write(loops(inside))
  with pytest.raises(ValueError, match=r"count optimizer steps of automatic \(4\) and of manual \(3\)"):
    write(loops(manual))
  with pytest.raises(ValueError, match=r"\(epoch_loop\.batch_progress\), over 1 epochs: not the same"):
    write(loops(uneven))
  with pytest.raises(ValueError, match=r"checkpoint's epochs took no optimizer step"):
    write(loops(stepless))
  with pytest.raises(TypeError, match=r"checkpoint has no \['loops'\]: a Lightning checkpoint"):
    write({k: v for k, v in checkpoint.items() if k != "loops"})
  with pytest.raises(ValueError, match=r"checkpoint has 2 optimizer states, stepped by automatic optimiz"):
    write({**checkpoint, "optimizer_states": checkpoint["optimizer_states"] * 2})
  with pytest.raises(ValueError, match=r"checkpoint has 2 lr schedulers"):
    write({**checkpoint, "lr_schedulers": checkpoint["lr_schedulers"] * 2})
  with pytest.raises(
    ValueError, match=r"steps=3 is not a whole number of epochs of 4 optimizer steps.*\(steps=4, or 0\)"
  ):
    write(steps=3)
  with pytest.raises(ValueError, match=r"steps=5 is not .*\(steps=8, or 4\)"):
    write(steps=5)
  with pytest.raises(
    ValueError, match=r"steps=8, but the state's count for parameter 0 is 8 .* pass steps=4"
  ):
    write(steps=8)
  with pytest.raises(ValueError, match=r"missing \['net.3.bias'\], unknown \[\]"):
    write(weights={k: v for k, v in weights.items() if k != "net.3.bias"})
  with pytest.raises(ValueError, match=r"weights\['net.0.bias'\] has shape \(8,\) and dtype torch.float64"):
    write(weights={**weights, "net.0.bias": weights["net.0.bias"].double()})
  assert write(weights={k: v.numpy() for k, v in weights.items()})["global_step"] == 2 * BATCHES
  with pytest.raises(ValueError, match=r"scheduler_steps=4 is given, but under automatic optimization") as e:
    to_lightning_checkpoint(
      state, checkpoint, weights, steps=BATCHES, learning_rate=schedule, param_names=names, scheduler_steps=4
    )
  assert str(e.value).endswith(": leave scheduler_steps out")  # as write() does

  def dropped(fit):
    del fit[_MANUAL]
    del fit["epoch_loop.state_dict"]["_batches_that_stepped"]

  expected, without = write(), write(loops(dropped))
  assert _MANUAL not in without["loops"]["fit_loop"]
  assert "_batches_that_stepped" not in without["loops"]["fit_loop"]["epoch_loop.state_dict"]
  dropped(expected["loops"]["fit_loop"])
  assert without["loops"] == expected["loops"] and without["global_step"] == expected["global_step"]


# --- Lightning, two optimizers (manual optimization) ------------------------------


def _gan(root: pathlib.Path) -> tuple[Any, Any, Any]:
  """A generator and a discriminator in float64, each with its optimizer and scheduler, stepped by the
  module (manual optimization) after every batch, the discriminator first: SGD with momentum and a StepLR,
  then Adam and an ExponentialLR. Its data (four batches an epoch, as ``_lightning``'s) and a Trainer
  factory."""
  import lightning

  logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
  dtype = torch.float64
  softplus = torch.nn.functional.softplus

  class GAN(lightning.LightningModule):
    def __init__(self) -> None:
      super().__init__()
      self.automatic_optimization = False
      torch.manual_seed(0)
      self.generator = torch.nn.Linear(2, 3).to(dtype)
      self.discriminator = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)
      ).to(dtype)

    def discriminator_loss(self, z, real):
      fake = self.generator(z).detach()
      return softplus(self.discriminator(fake)).mean() + softplus(-self.discriminator(real)).mean()

    def generator_loss(self, z):
      return softplus(-self.discriminator(self.generator(z))).mean()

    def training_step(self, batch, batch_idx):
      z, real = batch
      (opt_g, opt_d), (sched_g, sched_d) = self.optimizers(), self.lr_schedulers()
      opt_d.zero_grad()
      self.manual_backward(self.discriminator_loss(z, real))
      opt_d.step()
      sched_d.step()
      opt_g.zero_grad()
      self.manual_backward(self.generator_loss(z))
      opt_g.step()
      sched_g.step()

    def configure_optimizers(self):
      opt_g = torch.optim.Adam(self.generator.parameters(), lr=1e-2, betas=(0.5, 0.999))
      opt_d = torch.optim.SGD(self.discriminator.parameters(), lr=5e-2, momentum=0.9)
      schedulers = [
        torch.optim.lr_scheduler.ExponentialLR(opt_g, GAMMA),
        torch.optim.lr_scheduler.StepLR(opt_d, step_size=2, gamma=0.5),
      ]
      return [opt_g, opt_d], schedulers

  generator = torch.Generator().manual_seed(1)
  z = torch.randn(4 * BATCHES, 2, generator=generator, dtype=dtype)
  real = torch.randn(4 * BATCHES, 3, generator=generator, dtype=dtype)
  data = torch.utils.data.TensorDataset(z, real)
  return GAN, data, _lightning_fit(data, root)


_GANS: dict[pathlib.Path, dict] = {}


def _gan_journey(root: pathlib.Path) -> dict:
  """Epoch 1 Lightning, epoch 2 JAX (both optimizers' states read from the .ckpt with
  ``from_torch_state_dict``, the module's own gradients at JAX's weights), written back by
  ``to_lightning_checkpoint``. Run once per root."""
  if root in _GANS:
    return _GANS[root]
  import lightning

  GAN, data, fit = _gan(root)
  reference = GAN()
  saves = lightning.pytorch.callbacks.ModelCheckpoint(root / "ckpt", save_top_k=-1, filename="{epoch}")
  with jax.enable_x64(True):
    fit(reference, 3, callbacks=[saves])
    checkpoint = torch.load(root / "ckpt" / "epoch=0.ckpt", weights_only=False)

    module = GAN()
    names = [torch_param_names(opt, module) for opt in module.configure_optimizers()[0]]
    # Each scheduler stepped after each update of its optimizer, from its last_epoch in the checkpoint on.
    last = [scheduler["last_epoch"] for scheduler in checkpoint["lr_schedulers"]]
    schedules = [
      lambda n: 1e-2 * GAMMA ** (n + last[0]),
      lambda n: 5e-2 * 0.5 ** ((n + last[1]) // 2),
    ]
    params, txs, states = [], [], []
    for saved, own, schedule in zip(checkpoint["optimizer_states"], names, schedules):
      params.append({name: jnp.asarray(checkpoint["state_dict"][name].numpy()) for name in own})
      tx, state = from_torch_state_dict(saved, params[-1], learning_rate=schedule, param_names=own)
      txs.append(jax.jit(tx.update))
      states.append(state)

    for k in range(BATCHES):  # the module's training_step, in JAX: the discriminator first
      z, real = data[4 * k : 4 * k + 4]
      for i in (1, 0):
        _load(module, {**params[0], **params[1]})
        module.zero_grad()
        (module.discriminator_loss(z, real) if i else module.generator_loss(z)).backward()
        g = {name: jnp.asarray(p.grad.numpy()) for name, p in module.named_parameters() if name in params[i]}
        updates, states[i] = txs[i](g, states[i], params[i])
        params[i] = optax.apply_updates(params[i], updates)
    _load(module, {**params[0], **params[1]})
  _GANS[root] = dict(
    GAN=GAN,
    fit=fit,
    reference=reference,
    checkpoint=checkpoint,
    states=states,
    weights=module.state_dict(),
    kwargs=dict(steps=[BATCHES, BATCHES], learning_rate=schedules, param_names=names),
  )
  return _GANS[root]


def test_lightning_two_optimizers_resume_exactly(lightning_root):
  """A GAN-like module with manual optimization, two optimizers (Adam, SGD with momentum) and their
  schedulers: both states carried to JAX and back, and Lightning's own resume ends at the uninterrupted
  run's weights to 1e-12. The scheduler steps, which manual optimization's loops do not count, are
  those the refusal advises; the written checkpoint's loops, steps and schedulers are those Lightning
  saved itself at that epoch."""
  root = lightning_root / "gan"
  run = _gan_journey(root)
  checkpoint, states, weights = run["checkpoint"], run["states"], run["weights"]
  with jax.enable_x64(True):
    with pytest.raises(ValueError, match=r"pass scheduler_steps=") as refused:
      to_lightning_checkpoint(states, checkpoint, weights, **run["kwargs"])
    advised = re.search(r"scheduler_steps=(\[[\d, ]+\]) if every epoch", str(refused.value))
    assert advised, refused.value
    written = to_lightning_checkpoint(
      states, checkpoint, weights, **run["kwargs"], scheduler_steps=json.loads(advised[1])
    )
  torch.save(written, root / "jax.ckpt")
  resumed = run["GAN"]()
  run["fit"](resumed, 3, ckpt_path=root / "jax.ckpt")
  assert _relative(resumed.parameters(), run["reference"].parameters()) <= 1e-12
  own = torch.load(root / "ckpt" / "epoch=1.ckpt", weights_only=False)
  assert written["loops"] == own["loops"]
  assert (written["epoch"], written["global_step"]) == (own["epoch"], own["global_step"]) == (1, 4 * BATCHES)
  assert written["lr_schedulers"] == own["lr_schedulers"]
  for mine, theirs in zip(written["optimizer_states"], own["optimizer_states"]):
    assert mine["param_groups"] == theirs["param_groups"]


def test_lightning_two_optimizers_refusals(lightning_root):
  """Arguments without one entry per optimizer; steps that are not whole epochs of all the optimizers'
  steps, or that a state's count contradicts (each advice followed as printed); schedulers not one per
  optimizer; manual and automatic steps both counted; manual steps that differ between epochs; no
  optimizer at all; an optimizer's own refusal, noted with its place. A checkpoint without manual
  optimization's counter is read where its global step tells the counter (the written one the same
  without it), and refused where it does not, or where an older Lightning (before 2.0) keeps it under
  another name: upgraded as the refusal prints, the result is the current checkpoint's."""
  run = _gan_journey(lightning_root / "gan")
  checkpoint, states, weights, kwargs = run["checkpoint"], run["states"], run["weights"], run["kwargs"]
  kwargs = {**kwargs, "scheduler_steps": [BATCHES, BATCHES]}

  def write(checkpoint=checkpoint, states=states, **edit):
    with jax.enable_x64(True):
      return to_lightning_checkpoint(states, checkpoint, weights, **{**kwargs, **edit})

  def edited(edit):
    """A copy of the checkpoint whose fit loop ``edit`` changed."""
    copied = copy.deepcopy(checkpoint)
    edit(copied["loops"]["fit_loop"], copied)
    return copied

  expected = write()
  with pytest.raises(
    ValueError, match=r"state must be a list with one entry per optimizer, 2, .* got a list of 1"
  ):
    write(states=states[:1])
  with pytest.raises(ValueError, match=r"learning_rate must be a list with one entry per optimizer, 2"):
    write(learning_rate=kwargs["learning_rate"][0])
  with pytest.raises(ValueError, match=r"param_names must be a list .* got a tuple of 3"):
    write(param_names=(*kwargs["param_names"], None))

  # Whole epochs of both optimizers' steps (8 an epoch), and each state's count: advice followed.
  with pytest.raises(ValueError, match=r"steps=\[4, 3\] take 7 optimizer steps in all, .* epochs of 8") as e:
    write(steps=[4, 3])
  assert "(steps summing to 8, or 0)" in str(e.value)
  # (The schedulers' replayed rates, learning_rate left out: the schedules would disagree first.)
  with pytest.raises(ValueError, match=r"steps\[0\] is 8, but state\[0\]'s count went on by 4") as e:
    write(steps=[8, 0], learning_rate=None)
  assert "pass 4 as steps[0]" in str(e.value)
  with pytest.raises(ValueError, match=r"\(steps summing to 8, or 0\)"):
    write(steps=[4, 0], learning_rate=None)
  followed = write(steps=[4, 4], learning_rate=None)
  assert followed["global_step"] == expected["global_step"] == 4 * BATCHES
  assert [s["param_groups"] for s in followed["optimizer_states"]] == [
    s["param_groups"] for s in expected["optimizer_states"]
  ]

  with pytest.raises(ValueError, match=r"checkpoint has 1 lr schedulers for 2 optimizer\(s\)"):
    write({**checkpoint, "lr_schedulers": checkpoint["lr_schedulers"][:1]})
  with pytest.raises(ValueError, match=r"scheduler_steps=\[4, 4\] is given, but checkpoint has no lr sched"):
    write({**checkpoint, "lr_schedulers": []})
  with pytest.raises(ValueError, match=r"checkpoint has no optimizer states"):
    write({**checkpoint, "optimizer_states": []})

  def both(fit, _):
    fit["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]["total"]["completed"] = 3

  def uneven(fit, _):  # two epochs of 4 batches, 15 optimizer steps
    for key in ("epoch_progress", "epoch_loop.batch_progress"):
      for k in fit[key]["total"]:
        fit[key]["total"][k] *= 2
    fit[_MANUAL]["total"]["completed"] = 15

  with pytest.raises(ValueError, match=r"automatic \(3\) and of manual \(8\) optimization"):
    write(edited(both))
  with pytest.raises(ValueError, match=r"count 15 optimizer steps of manual optimization .* over 2 epochs"):
    write(edited(uneven))

  # An optimizer's own refusal (a rate that is not its replayed StepLR's) says which optimizer.
  with pytest.raises(ValueError, match=r"learning_rate\[0\] is 0.3, but the StepLR") as e:
    write(learning_rate=[kwargs["learning_rate"][0], 0.3])
  assert e.value.__notes__ == [
    "(writing optimizer 1 of 2: state[1] into checkpoint['optimizer_states'][1] and lr_schedulers[1])"
  ]

  # Without manual optimization's counter: told by the global step (every step counted there), read,
  # and written back without it; with another global step, refused, and the advice followed.
  def drop(fit, _):
    del fit[_MANUAL]

  without = write(edited(drop))
  assert _MANUAL not in without["loops"]["fit_loop"]
  without["loops"]["fit_loop"][_MANUAL] = expected["loops"]["fit_loop"][_MANUAL]
  assert without["loops"] == expected["loops"]
  assert without["global_step"] == expected["global_step"]

  def drop_and_step(fit, copied):  # automatic optimization's 3 steps: neither 0 nor the global step
    drop(fit, copied)
    both(fit, copied)

  with pytest.raises(
    ValueError, match=r"has no \['epoch_loop.manual_optimization.optim_step_progress'\], which Lightning "
  ) as e:
    write(edited(drop_and_step))
  assert (
    "pytorch-lightning_version is '2.6.6'): manual optimization's step count is not told by its global_step 8"
    in str(e.value)
  )
  assert str(e.value).endswith(
    "Pass the checkpoint as Lightning saved it (torch.load of its .ckpt, unedited)"
  )
  assert write(checkpoint)["loops"] == expected["loops"]  # the advice, followed

  # Lightning 1.9's layout (the counters under the names Lightning 2.0.0's migration renames).
  def older(fit, copied):
    copied["pytorch-lightning_version"] = "1.9.5"
    fit["epoch_loop.batch_loop.state_dict"] = {}
    for old, new in (("manual_loop", "manual_optimization"), ("optimizer_loop", "automatic_optimization")):
      for part in ("state_dict", "optim_step_progress" if old == "manual_loop" else "optim_progress"):
        fit[f"epoch_loop.batch_loop.{old}.{part}"] = fit.pop(f"epoch_loop.{new}.{part}")
    fit["epoch_loop.batch_loop.optimizer_loop.optim_progress"]["optimizer_position"] = 1

  old = edited(older)
  with pytest.raises(
    ValueError, match=r"Lightning writes them from 2.0.0 on, and this checkpoint is of Lightning 1.9.5"
  ) as e:
    write(old)
  assert "'epoch_loop.manual_optimization.optim_step_progress'" in str(e.value)
  namespace = {"checkpoint": old}
  exec(str(e.value).split("then pass that: ", 1)[1], namespace)
  upgraded = write(namespace["checkpoint"])
  assert upgraded["loops"] == expected["loops"]
  assert upgraded["global_step"] == expected["global_step"]
  assert [s["param_groups"] for s in upgraded["optimizer_states"]] == [
    s["param_groups"] for s in expected["optimizer_states"]
  ]
