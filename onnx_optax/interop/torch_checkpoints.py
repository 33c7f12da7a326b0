"""Checkpoints of PyTorch training clients: the scheduler's state, Trainer directories, Lightning files.

A JAX run that came from a training client goes back as the checkpoint that
client would have written after the JAX updates, so that the client's own
resume continues it exactly, with no step by hand:

* :func:`to_trainer_checkpoint` writes a Hugging Face Trainer
  ``checkpoint-N/`` directory (``optimizer.pt``, ``scheduler.pt``,
  ``trainer_state.json``) for ``trainer.train(resume_from_checkpoint=...)``;
* :func:`to_lightning_checkpoint` returns a Lightning checkpoint
  (``optimizer_states``, ``lr_schedulers``, the loops' counters, the global
  step, the weights) for ``trainer.fit(model, ckpt_path=...)``;
* :func:`to_torch_scheduler_state_dict` is the scheduler's side alone, for a
  plain PyTorch loop (``scheduler.load_state_dict``).

A learning-rate scheduler is not part of an optimizer's state: its
``last_epoch`` counts its steps, and the optimizer's groups hold the rate it
set last. Both must be those of the step the JAX run reached, since neither
client steps the scheduler when it resumes. The rates come from PyTorch
itself where the scheduler's state determines them (``StepLR``,
``MultiStepLR``, ``ConstantLR``, ``LinearLR``, ``ExponentialLR``,
``PolynomialLR``, ``CosineAnnealingLR``, ``CosineAnnealingWarmRestarts``:
its own ``step()`` is replayed on a copy), or from ``learning_rate`` where it
does not: a ``LambdaLR`` or ``MultiplicativeLR`` saves no function (the
Trainer's linear, cosine and constant schedules with warmup are
``LambdaLR``\\ s), so the schedule given to
:func:`~onnx_optax.interop.from_torch_state_dict` is evaluated after the JAX
updates. Schedulers whose state after the JAX updates is unknown are refused:
``ReduceLROnPlateau`` (a metric), ``CyclicLR`` and ``OneCycleLR`` (they also
cycle the momentum), ``SequentialLR`` and ``ChainedScheduler``.

:func:`torch_param_names` names the parameters of an index-keyed file (a
Trainer's ``optimizer.pt``, a Lightning checkpoint's ``optimizer_states``)
from the optimizer the client builds and the model, so that JAX parameters
keyed by name are placed by name.
"""

from __future__ import annotations

import copy
import json
import math
import pathlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax.interop import _common, _dtensor, _torch_optim, _torch_placement
from onnx_optax.interop.torch_state_dict import to_torch_state_dict

__all__ = [
  "to_lightning_checkpoint",
  "to_torch_scheduler_state_dict",
  "to_trainer_checkpoint",
  "torch_param_names",
]

# torch.optim.lr_scheduler classes whose step() is a function of their saved state and the groups' rates:
# replayed. Each is told by the keys it adds to LRScheduler's.
_REPLAYED = {
  frozenset({"step_size", "gamma"}): "StepLR",
  frozenset({"milestones", "gamma"}): "MultiStepLR",
  frozenset({"factor", "total_iters"}): "ConstantLR",
  frozenset({"start_factor", "end_factor", "total_iters"}): "LinearLR",
  frozenset({"gamma"}): "ExponentialLR",
  frozenset({"total_iters", "power"}): "PolynomialLR",
  frozenset({"T_max", "eta_min"}): "CosineAnnealingLR",
  frozenset({"T_0", "T_i", "T_mult", "eta_min", "T_cur"}): "CosineAnnealingWarmRestarts",
}
_LAMBDAS = frozenset({"lr_lambdas"})  # LambdaLR, MultiplicativeLR: their functions are not saved
_BASE = frozenset({"base_lrs", "last_epoch", "_step_count", "_last_lr"})
_OPTIONAL = frozenset({"_is_initial", "_get_lr_called_within_step", "verbose"})
# A key of each scheduler refused, and why.
_REFUSED = {
  "_schedulers": (
    "SequentialLR's or a ChainedScheduler's (schedulers inside a scheduler)",
    "the onnx_optax bridges write one scheduler's state",
  ),
  "best": ("ReduceLROnPlateau's", "it steps on a metric, which the JAX run did not report to it"),
  "max_lrs": ("CyclicLR's", "it also cycles the momentum, which the JAX run kept constant"),
  "total_steps": ("OneCycleLR's", "it also cycles the momentum, which the JAX run kept constant"),
}


def torch_param_names(optimizer: Any, model: Any) -> list[str]:
  """The names of an optimizer's parameters in its order (group by group), from the model that holds them.

  An optimizer built from ``model.parameters()`` saves its parameters by
  index: the Hugging Face Trainer's (weight-decayed parameters first, then
  the others: ``Trainer.create_optimizer`` groups them by
  ``Trainer.get_decay_parameter_names``), and a Lightning module's
  ``configure_optimizers``. Build the same optimizer with the client
  (``trainer.create_optimizer()``, ``module.configure_optimizers()``) and
  pass its names as ``param_names`` to
  :func:`~onnx_optax.interop.from_torch_state_dict` and the writers: the
  JAX parameters, keyed by name, are then placed by name, and two parameters
  of one shape (two LayerNorm weights) cannot trade places. A parameter
  shared by two modules (tied weights) has the name
  ``model.named_parameters()`` gives it (the first).

  Args:
    optimizer: a ``torch.optim.Optimizer`` (its ``param_groups``).
    model: the ``torch.nn.Module`` whose parameters the optimizer holds.

  Returns:
    One name per parameter, in the optimizer's order.

  Raises:
    ValueError: a parameter of the optimizer that the model does not hold
      (naming its group and place).

  Example:
    >>> import torch
    >>> from onnx_optax.interop import torch_param_names
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    >>> rest = [p for p in model.parameters() if p is not model[0].weight]
    >>> opt = torch.optim.AdamW([{"params": [model[0].weight]}, {"params": rest, "weight_decay": 0.0}])
    >>> torch_param_names(opt, model)
    ['0.weight', '0.bias', '1.weight', '1.bias']
  """
  named = {id(p): name for name, p in model.named_parameters()}
  names = []
  for g, group in enumerate(optimizer.param_groups):
    for j, p in enumerate(group["params"]):
      if id(p) not in named:
        raise ValueError(
          f"optimizer.param_groups[{g}]['params'][{j}] (shape {tuple(p.shape)}) is not a parameter of "
          f"model: pass the model whose parameters the optimizer was built from"
        )
      names.append(named[id(p)])
  return names


def to_torch_scheduler_state_dict(
  scheduler_state_dict: Mapping[str, Any],
  like: Mapping[str, Any],
  *,
  steps: int,
  learning_rate: Any = None,
) -> dict[str, Any]:
  """A learning-rate scheduler's state dict, ``steps`` scheduler steps after the one saved.

  ``scheduler_state_dict`` (``scheduler.state_dict()``, a Trainer's
  ``scheduler.pt``) and ``like`` (the optimizer state dict saved with it) are
  from the step a JAX run started at; after ``steps`` JAX updates (a
  scheduler stepped once per update), the result is the scheduler's state
  that PyTorch's own run would have reached: ``scheduler.load_state_dict``
  of it, after ``optimizer.load_state_dict`` of
  ``to_torch_state_dict(state, like, learning_rate=result["_last_lr"])``,
  continues the run exactly. ``like`` is not modified.

  The rates are PyTorch's own where the scheduler's state determines them:
  its ``step()`` is replayed ``steps`` times on a copy (see the module
  docstring for the classes); ``learning_rate``, if given, must then agree
  with them to the square root of its dtype's epsilon, relative (a Python
  number's: float64's), as a schedule that rounds otherwise does and one
  shifted by a step does not. A ``LambdaLR`` or ``MultiplicativeLR`` saves
  no function: ``learning_rate`` gives the rates after the steps, and the
  state's ``last_epoch`` and step count advance by ``steps``.

  Args:
    scheduler_state_dict: the scheduler's saved state.
    like: the optimizer state dict saved with it (its groups' ``lr``, the
      scheduler's last rates, and ``initial_lr``).
    steps: the scheduler steps since then (``>= 0``).
    learning_rate: None, or the rate after the steps: a number, or a
      sequence with one per param group (the schedule given to
      :func:`~onnx_optax.interop.from_torch_state_dict`, evaluated at the
      number of JAX updates).

  Returns:
    The scheduler's state dict; its ``_last_lr`` are the groups' rates.

  Raises:
    TypeError: a scheduler whose state cannot be written (see the module
      docstring), or a state dict that is not a scheduler's.
    ValueError: ``learning_rate`` missing for a ``LambdaLR`` or
      ``MultiplicativeLR``, or disagreeing with a replayed scheduler's rates;
      a scheduler and an optimizer state dict not saved at the same step.

  Example:
    >>> import torch
    >>> from onnx_optax.interop import to_torch_scheduler_state_dict
    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    >>> scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    >>> later = to_torch_scheduler_state_dict(scheduler.state_dict(), opt.state_dict(), steps=5)
    >>> later["last_epoch"], later["_last_lr"]
    (5, [0.025])
  """
  torch = _torch_optim.torch()
  kind = _scheduler_kind(scheduler_state_dict)
  groups = _param_groups(like, "like")
  steps = _steps(steps)
  base = scheduler_state_dict["base_lrs"]
  if len(base) != len(groups):
    raise ValueError(
      f"scheduler_state_dict has {len(base)} base_lrs but like has {len(groups)} param groups: not the "
      f"state dicts of one optimizer and its scheduler"
    )
  current = [
    _common.real_number(f"like['param_groups'][{g}]['lr']", group["lr"]) for g, group in enumerate(groups)
  ]
  last = [
    _common.real_number(f"scheduler_state_dict['_last_lr'][{g}]", lr)
    for g, lr in enumerate(scheduler_state_dict["_last_lr"])
  ]
  if last != current:
    raise ValueError(
      f"scheduler_state_dict's _last_lr {last} are not like's param groups' lr {current}: the scheduler's "
      f"and the optimizer's state dicts were not saved at the same step"
    )
  given = _rates(learning_rate, len(groups))
  if kind is None:  # LambdaLR or MultiplicativeLR
    if given is None:
      raise ValueError(
        f"scheduler_state_dict is a LambdaLR's or a MultiplicativeLR's, which does not save its functions "
        f"(lr_lambdas: {scheduler_state_dict['lr_lambdas']!r}), so its rates after the steps are not known: "
        f"pass learning_rate=, the rates after the {steps} steps (the schedule given to "
        f"from_torch_state_dict evaluated at the number of JAX updates, learning_rate=schedule({steps}))"
      )
    out = copy.deepcopy(dict(scheduler_state_dict))
    out["last_epoch"] = scheduler_state_dict["last_epoch"] + steps
    out["_step_count"] = scheduler_state_dict["_step_count"] + steps
    out["_last_lr"] = [value for value, _ in given]
    return out
  out, rates = _replay(torch, kind, scheduler_state_dict, groups, steps)
  for g, (rate, entry) in enumerate(zip(rates, given or [])):
    value, eps = entry
    if abs(value - float(rate)) > math.sqrt(eps) * abs(float(rate)):
      raise ValueError(
        f"learning_rate[{g}] is {value}, but the {kind} of scheduler_state_dict gives {float(rate)!r} "
        f"after {steps} steps: a rate that is not the scheduler's would resume its run at another point "
        f"of its schedule. Leave learning_rate out ({kind} is replayed), or check the schedule's shift "
        f"(n -> schedule(n + steps already taken))"
      )
  return out


def to_trainer_checkpoint(
  state: Any,
  checkpoint: str | pathlib.Path,
  directory: str | pathlib.Path,
  *,
  steps: int,
  learning_rate: Any = None,
  param_names: Sequence[str] | None = None,
  optimizer: Any = None,
) -> pathlib.Path:
  """Writes a JAX run as a Hugging Face Trainer checkpoint, for ``trainer.train(resume_from_checkpoint=...)``.

  ``checkpoint`` is the Trainer's ``checkpoint-N/`` directory the run came
  from; after ``steps`` JAX updates, ``directory`` receives what the Trainer
  would have saved at step ``N + steps``, as ``Trainer.train`` reads it to
  resume there: ``optimizer.pt`` (:func:`~onnx_optax.interop.to_torch_state_dict`
  of ``state``, each group's ``lr`` the scheduler's), ``scheduler.pt`` (the
  scheduler ``steps`` steps on, :func:`to_torch_scheduler_state_dict`) and
  ``trainer_state.json`` (``global_step`` ``N + steps``, ``epoch`` scaled
  with it, the rest copied; ``log_history``, ``total_flos`` and
  ``num_input_tokens_seen`` do not count the JAX updates). The model's
  weights are yours to write there, as the Trainer reads them
  (``model.save_pretrained(directory)`` after loading the JAX parameters);
  nothing else is copied (``rng_state.pth``: the JAX updates drew no
  PyTorch random numbers, and the Trainer resumes without one; ``scaler.pt``
  of a float16 run: the scaler starts afresh).

  Args:
    state: the state of the transform that
      :func:`~onnx_optax.interop.from_torch_state_dict` returned for
      ``checkpoint``'s ``optimizer.pt``, after ``steps`` updates.
    checkpoint: the Trainer checkpoint directory the run came from.
    directory: the directory to write (created if needed; not
      ``checkpoint``). Name it ``checkpoint-{N + steps}`` in the Trainer's
      ``output_dir`` for ``resume_from_checkpoint=True`` to find it.
    steps: the JAX updates since ``checkpoint``. For Adam, AdamW and Adagrad
      it must be the state's count less the saved ``step``.
    learning_rate: the ``learning_rate`` given to ``from_torch_state_dict``
      (a number, a schedule of the JAX updates, or one per param group),
      evaluated after ``steps`` updates as the transform evaluates it
      (float64 under ``jax_enable_x64``, as PyTorch's rate; float32
      without); needed for the Trainer's own schedules (``LambdaLR``\\ s),
      checked against a replayed scheduler.
    param_names: as for :func:`~onnx_optax.interop.from_torch_state_dict`
      (:func:`torch_param_names` of ``trainer.create_optimizer()``).
    optimizer: as for :func:`~onnx_optax.interop.from_torch_state_dict`.

  Returns:
    ``directory``, as a ``pathlib.Path``.

  Raises:
    FileNotFoundError: ``checkpoint`` lacks ``optimizer.pt``,
      ``scheduler.pt`` or ``trainer_state.json``.
    TypeError, ValueError: as :func:`~onnx_optax.interop.to_torch_state_dict`
      and :func:`to_torch_scheduler_state_dict`; ``steps`` that disagree
      with the state's count; ``directory`` that is ``checkpoint``.
      Everything is checked before anything is written.
  """
  torch = _torch_optim.torch()
  source, target = pathlib.Path(checkpoint), pathlib.Path(directory)
  for name in ("optimizer.pt", "scheduler.pt", "trainer_state.json"):
    if not (source / name).is_file():
      raise FileNotFoundError(
        f"checkpoint {str(source)!r} has no {name}: a Trainer checkpoint directory (checkpoint-N) holds "
        f"optimizer.pt, scheduler.pt and trainer_state.json, and the Trainer resumes its optimizer only "
        f"with both of the first two"
      )
  if target.exists() and target.resolve() == source.resolve():
    raise ValueError(f"directory is checkpoint ({str(source)!r}): write the run's step to a new directory")
  steps = _steps(steps)
  saved = torch.load(source / "optimizer.pt", weights_only=True, map_location="cpu")
  scheduler = torch.load(source / "scheduler.pt", weights_only=True, map_location="cpu")
  trainer_state = json.loads((source / "trainer_state.json").read_text())
  groups = _param_groups(saved, "optimizer.pt")
  later = to_torch_scheduler_state_dict(
    scheduler, saved, steps=steps, learning_rate=_evaluated(learning_rate, steps, len(groups))
  )
  written = to_torch_state_dict(
    state, saved, optimizer=optimizer, learning_rate=later["_last_lr"], param_names=param_names
  )
  _check_steps(written, saved, steps)
  before = trainer_state["global_step"]
  trainer_state["global_step"] = before + steps
  if before > 0 and trainer_state.get("epoch") is not None:
    # The Trainer's epoch is its global step over the update steps of an epoch.
    trainer_state["epoch"] = trainer_state["epoch"] * (before + steps) / before
  target.mkdir(parents=True, exist_ok=True)
  torch.save(written, target / "optimizer.pt")
  torch.save(later, target / "scheduler.pt")
  (target / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
  return target


def to_lightning_checkpoint(
  state: Any,
  checkpoint: Mapping[str, Any],
  weights: Mapping[str, Any],
  *,
  steps: int,
  learning_rate: Any = None,
  param_names: Sequence[str] | None = None,
  optimizer: Any = None,
) -> dict[str, Any]:
  """A JAX run as a Lightning checkpoint, to save and resume with ``trainer.fit(..., ckpt_path=...)``.

  ``checkpoint`` is the Lightning checkpoint the run came from, as
  ``torch.load`` reads it, saved at the end of an epoch (``ModelCheckpoint``
  saves there by default); after ``steps`` JAX updates, a whole number of
  that run's epochs, the result is the checkpoint Lightning would have saved
  at the same point that many epochs later: ``optimizer_states`` (the
  optimizer's, each group's ``lr`` the scheduler's), ``lr_schedulers`` (the
  scheduler on by its steps: ``steps`` for ``interval="step"``, one per
  epoch for ``"epoch"``, read from the loops' counters), the loops' counters,
  ``global_step`` and ``epoch``, and ``weights`` as the ``state_dict``;
  everything else (callbacks, hyperparameters) is copied. ``checkpoint`` is
  not modified.

  Lightning resumes a run saved mid-epoch from the start of a dataloader
  that cannot resume (it warns), so a step inside an epoch would not
  continue exactly: such a checkpoint, or ``steps`` that end inside an
  epoch, are refused. One optimizer (automatic optimization) and at most
  one scheduler.

  Args:
    state: the state of the transform that
      :func:`~onnx_optax.interop.from_torch_state_dict` returned for
      ``checkpoint["optimizer_states"][0]``, after ``steps`` updates.
    checkpoint: the Lightning checkpoint (a dict).
    weights: the LightningModule's ``state_dict`` at the new step
      (``module.state_dict()`` after loading the JAX parameters), with
      ``checkpoint["state_dict"]``'s keys, shapes and dtypes; values may be
      tensors or arrays.
    steps: the JAX updates since ``checkpoint``: whole epochs of its run.
    learning_rate: as for :func:`to_trainer_checkpoint`.
    param_names: as for :func:`~onnx_optax.interop.from_torch_state_dict`
      (:func:`torch_param_names` of the module's optimizer).
    optimizer: as for :func:`~onnx_optax.interop.from_torch_state_dict`.

  Returns:
    The new checkpoint (a dict).

  Raises:
    TypeError, ValueError: a checkpoint that is not Lightning's, saved
      mid-epoch, of several optimizers or schedulers or manual optimization;
      ``steps`` that are not whole epochs or disagree with the state's count;
      ``weights`` that do not match; and as
      :func:`~onnx_optax.interop.to_torch_state_dict` and
      :func:`to_torch_scheduler_state_dict`.
  """
  torch = _torch_optim.torch()
  missing = [
    key for key in ("optimizer_states", "lr_schedulers", "loops", "state_dict") if key not in checkpoint
  ]
  if missing:
    raise TypeError(
      f"checkpoint has no {missing}: a Lightning checkpoint (torch.load of a .ckpt that "
      f"ModelCheckpoint or trainer.save_checkpoint wrote, not saved with weights_only) holds "
      f"optimizer_states, lr_schedulers, loops and state_dict"
    )
  steps = _steps(steps)
  if len(checkpoint["optimizer_states"]) != 1:
    raise ValueError(
      f"checkpoint has {len(checkpoint['optimizer_states'])} optimizer states: the bridge writes one "
      f"optimizer's (a LightningModule's configure_optimizers returning one optimizer)"
    )
  if len(checkpoint["lr_schedulers"]) > 1:
    raise ValueError(
      f"checkpoint has {len(checkpoint['lr_schedulers'])} lr schedulers: the bridge writes one scheduler's"
    )
  fit = checkpoint["loops"]["fit_loop"]
  if fit["epoch_loop.manual_optimization.optim_step_progress"]["total"]["completed"]:
    raise ValueError(
      "checkpoint is of a module with manual optimization: the bridge writes automatic optimization's"
    )
  batches = fit["epoch_loop.batch_progress"]
  if not batches["is_last_batch"]:
    raise ValueError(
      f"checkpoint was saved inside an epoch (after its batch {batches['current']['ready']}): Lightning "
      f"resumes such a run from the start of a dataloader that cannot resume, so no step inside an epoch "
      f"continues exactly. Start from a checkpoint saved at the end of an epoch (ModelCheckpoint's default)"
    )
  epochs = fit["epoch_progress"]["total"]["processed"]
  progress = {
    "epoch_loop.batch_progress": batches,
    "epoch_loop.scheduler_progress": fit["epoch_loop.scheduler_progress"],
    "epoch_loop.automatic_optimization.optim_progress": fit[
      "epoch_loop.automatic_optimization.optim_progress"
    ],
  }
  for key, counters in progress.items():
    for where, pair in _counters(counters, key):
      if any(pair["total"][k] != epochs * pair["current"][k] for k in pair["current"]):
        raise ValueError(
          f"checkpoint's loops count {pair['total']} in all and {pair['current']} in its last epoch "
          f"({where}), over {epochs} epochs: not the same every epoch, so the counters of later epochs are "
          f"not known"
        )
  per_epoch = progress["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]["current"][
    "completed"
  ]
  if per_epoch == 0:
    raise ValueError(
      "checkpoint's epochs took no optimizer step (its loops count none in its last epoch): the bridge "
      "writes a run back after whole epochs of optimizer steps, and these epochs have none"
    )
  if steps % per_epoch:
    raise ValueError(
      f"steps={steps} is not a whole number of epochs of {per_epoch} optimizer steps: checkpoint was saved "
      f"at the end of an epoch, and Lightning resumes there only, so a run written back ends at an epoch's "
      f"end too (steps={steps - steps % per_epoch + per_epoch}, or {steps - steps % per_epoch})"
    )
  later_epochs = steps // per_epoch
  saved = checkpoint["optimizer_states"][0]
  groups = _param_groups(saved, "checkpoint['optimizer_states'][0]")
  rates = _evaluated(learning_rate, steps, len(groups))
  schedulers = []
  if checkpoint["lr_schedulers"]:
    scheduler_steps = later_epochs * fit["epoch_loop.scheduler_progress"]["current"]["completed"]
    later = to_torch_scheduler_state_dict(
      checkpoint["lr_schedulers"][0], saved, steps=scheduler_steps, learning_rate=rates
    )
    schedulers, rates = [later], later["_last_lr"]
  written = to_torch_state_dict(
    state, saved, optimizer=optimizer, learning_rate=rates, param_names=param_names
  )
  _check_steps(written, saved, steps)
  new_weights = _weights(torch, checkpoint["state_dict"], weights)

  loops = copy.deepcopy(checkpoint["loops"])
  new_fit = loops["fit_loop"]
  for key in progress:
    for _, pair in _counters(new_fit[key], key):
      for k in pair["total"]:
        pair["total"][k] += later_epochs * pair["current"][k]
  for k in new_fit["epoch_progress"]["total"]:
    new_fit["epoch_progress"]["total"][k] += later_epochs
    new_fit["epoch_progress"]["current"][k] += later_epochs
  new_fit["epoch_loop.state_dict"]["_batches_that_stepped"] += steps
  return {
    **checkpoint,
    "epoch": checkpoint["epoch"] + later_epochs,
    "global_step": checkpoint["global_step"] + steps,
    "state_dict": new_weights,
    "optimizer_states": [written],
    "lr_schedulers": schedulers,
    "loops": loops,
  }


def _scheduler_kind(state_dict: Any) -> str | None:
  """The replayed class's name, or None for a LambdaLR or MultiplicativeLR; refuses the others."""
  if not isinstance(state_dict, Mapping) or not _BASE <= set(state_dict):
    for key, (what, why) in _REFUSED.items():
      if isinstance(state_dict, Mapping) and key in state_dict:
        raise TypeError(
          f"scheduler_state_dict is a {what}: {why}, so its state after the JAX updates is not known"
        )
    found = sorted(map(str, state_dict)) if isinstance(state_dict, Mapping) else type(state_dict).__name__
    raise TypeError(
      f"scheduler_state_dict must be a learning-rate scheduler's state dict (scheduler.state_dict(), a "
      f"Trainer's scheduler.pt, a Lightning checkpoint's lr_schedulers[0]), got {found}"
    )
  for key, (what, why) in _REFUSED.items():
    if key in state_dict:
      raise TypeError(
        f"scheduler_state_dict is a {what}: {why}, so its state after the JAX updates is not known"
      )
  own = frozenset(state_dict) - _BASE - _OPTIONAL
  if own == _LAMBDAS:
    return None
  if own not in _REPLAYED:
    raise TypeError(
      f"scheduler_state_dict has the options {sorted(own)}, which are not those of a "
      f"torch.optim.lr_scheduler class the bridge writes (LambdaLR, MultiplicativeLR, "
      f"{', '.join(_REPLAYED.values())} in PyTorch 2.13)"
    )
  return _REPLAYED[own]


def _replay(
  torch: Any, kind: str, state_dict: Mapping[str, Any], groups: list, steps: int
) -> tuple[dict, list]:
  """PyTorch's ``step()`` of the scheduler, ``steps`` times, on a copy with the groups' rates."""
  stand_in = torch.optim.SGD(
    [
      {
        "params": [torch.nn.Parameter(torch.zeros(0))],
        "lr": group["lr"],
        "initial_lr": group.get("initial_lr", group["lr"]),
      }
      for group in groups
    ]
  )
  cls = getattr(torch.optim.lr_scheduler, kind)
  scheduler = cls.__new__(cls)
  scheduler.__dict__.update(copy.deepcopy(dict(state_dict)))
  scheduler.optimizer = stand_in
  with warnings.catch_warnings():
    # "lr_scheduler.step() before optimizer.step()": the stand-in takes no step.
    warnings.simplefilter("ignore")
    for _ in range(steps):
      scheduler.step()
  return scheduler.state_dict(), [group["lr"] for group in stand_in.param_groups]


def _param_groups(state_dict: Any, argument: str) -> list:
  if not isinstance(state_dict, Mapping) or not isinstance(state_dict.get("param_groups"), Sequence):
    raise TypeError(f"{argument} must be an optimizer state dict ({{'state': ..., 'param_groups': ...}})")
  return list(state_dict["param_groups"])


def _steps(steps: Any) -> int:
  if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
    raise ValueError(f"steps must be the number of JAX updates, an int >= 0, got {steps!r}")
  return int(steps)


def _rates(learning_rate: Any, n_groups: int) -> list[tuple[float, float]] | None:
  """``learning_rate`` as ``(rate, eps of the dtype it was computed in)`` per group, or None."""
  if learning_rate is None:
    return None
  entries = _common.learning_rates(learning_rate, n_groups)
  if any(callable(entry) for entry in entries):
    raise TypeError(
      "learning_rate is a schedule; the scheduler's state needs the rates after the steps: evaluate it, "
      "learning_rate=schedule(steps)"
    )
  values = learning_rate if isinstance(learning_rate, Sequence) else [learning_rate] * n_groups
  out = []
  for entry, value in zip(entries, values):
    dtype = getattr(value, "dtype", None)
    eps = (
      float(jnp.finfo(dtype).eps) if dtype is not None and jnp.issubdtype(dtype, jnp.floating) else 2.0**-52
    )
    out.append((float(entry), eps))
  return out


def _evaluated(learning_rate: Any, steps: int, n_groups: int) -> Any:
  """``learning_rate`` as given to ``from_torch_state_dict`` after ``steps`` JAX updates: the rates (or None).

  A schedule receives the count as the transform passes it (int64 under
  ``jax_enable_x64``), so the value is the one the transform's next update
  would use.
  """
  if learning_rate is None:
    return None
  count = jnp.asarray(steps, jnp.result_type(int))
  entries = _common.learning_rates(learning_rate, n_groups)
  return [entry(count) if callable(entry) else entry for entry in entries]


def _check_steps(written: Mapping[str, Any], saved: Mapping[str, Any], steps: int) -> None:
  """Adam's, AdamW's and Adagrad's ``step`` counts updates: the written one is the saved one + ``steps``."""
  for key, entry in written["state"].items():
    before = saved["state"].get(key, {}).get("step")
    if "step" in entry and before is not None and float(entry["step"]) != float(before) + steps:
      now, then = int(float(entry["step"])), int(float(before))
      raise ValueError(
        f"steps={steps}, but the state's count for parameter {key!r} is {now} where the checkpoint's step "
        f"was {then}: pass steps={now - then}, the number of JAX updates since the checkpoint"
      )


def _counters(tree: Mapping[str, Any], where: str) -> list[tuple[str, dict]]:
  """Every ``{"total": ..., "current": ...}`` pair of Lightning's progress counters in ``tree``."""
  if "total" in tree and "current" in tree:
    return [(where, tree)]  # type: ignore[list-item]
  return [
    pair
    for key, value in tree.items()
    if isinstance(value, Mapping)
    for pair in _counters(value, f"{where}.{key}")
  ]


def _weights(torch: Any, old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
  """``new`` as tensors with ``old``'s keys, shapes, dtypes and devices; nothing cast."""
  if not isinstance(new, Mapping):
    raise TypeError(f"weights must be a dict of the LightningModule's state_dict, got {type(new).__name__}")
  missing, extra = [k for k in old if k not in new], [k for k in new if k not in old]
  if missing or extra:
    raise ValueError(
      f"weights must have the keys of checkpoint['state_dict'] (module.state_dict() after loading the JAX "
      f"parameters): missing {_torch_placement.few(missing)}, unknown {_torch_placement.few(extra)}"
    )
  out = {}
  for key, like in old.items():
    value = new[key]
    if not isinstance(value, torch.Tensor):
      value = _dtensor.to_tensor(torch, np.asarray(value), like, f"weights[{key!r}]")
    if tuple(value.shape) != tuple(like.shape) or value.dtype != like.dtype:
      raise ValueError(
        f"weights[{key!r}] has shape {tuple(value.shape)} and dtype {value.dtype}, but "
        f"checkpoint['state_dict'][{key!r}] has {tuple(like.shape)} and {like.dtype} (nothing is cast)"
      )
    out[key] = value.detach().to(like.device)
  return out
