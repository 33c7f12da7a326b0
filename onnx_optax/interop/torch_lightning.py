"""Lightning checkpoints: :func:`to_lightning_checkpoint` and the reading of Lightning's loops.

:func:`to_lightning_checkpoint` returns a JAX run as a Lightning checkpoint
(``optimizer_states``, ``lr_schedulers``, the loops' counters, the global
step, the weights) for ``trainer.fit(model, ckpt_path=...)``. Its private
helpers read and advance the fit loop's progress counters (under the names
Lightning writes from 2.0.0 on), spread the arguments over several
optimizers (manual optimization), count the schedulers' steps, and check
the new weights against the checkpoint's. The scheduler's state and what it
shares with the Trainer writer are in
:mod:`onnx_optax.interop.torch_checkpoints`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnx_optax.interop import _dtensor, _torch_optim, _torch_placement
from onnx_optax.interop.torch_checkpoints import (
  _check_steps,
  _evaluated,
  _param_groups,
  _steps,
  to_torch_scheduler_state_dict,
)
from onnx_optax.interop.torch_state_dict import to_torch_state_dict

__all__ = ["to_lightning_checkpoint"]


# Lightning's fit loop: the counters the bridge reads, under the names Lightning writes from 2.0.0 on.
_MANUAL = "epoch_loop.manual_optimization.optim_step_progress"
_AUTOMATIC = "epoch_loop.automatic_optimization.optim_progress"
_PER_EPOCH = ("epoch_loop.batch_progress", "epoch_loop.scheduler_progress", _AUTOMATIC)  # reset every epoch
_FIT_LOOP = ("epoch_progress", *_PER_EPOCH, _MANUAL)


def to_lightning_checkpoint(
  state: Any,
  checkpoint: Mapping[str, Any],
  weights: Mapping[str, Any],
  *,
  steps: int | Sequence[int],
  learning_rate: Any = None,
  param_names: Sequence[Any] | None = None,
  optimizer: Any = None,
  scheduler_steps: int | Sequence[int] | None = None,
  layout: Any = None,
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

  Several optimizers (a GAN's generator and discriminator:
  ``configure_optimizers`` returning ``[opt0, opt1], [sched0, sched1]``,
  which Lightning runs with manual optimization,
  ``self.automatic_optimization = False``) are written each from its own
  state: ``state``, ``steps``, ``learning_rate``, ``param_names``,
  ``optimizer`` and ``scheduler_steps`` are then lists with one entry per
  optimizer, in the order of ``checkpoint["optimizer_states"]`` (each entry
  as for one optimizer; a None for an optional argument is None for all).
  Read each into JAX with
  :func:`~onnx_optax.interop.from_torch_state_dict` of
  ``checkpoint["optimizer_states"][i]``. Under manual optimization the
  module steps its schedulers itself and Lightning's loops count none of
  those steps, so ``scheduler_steps`` gives them; ``lr_schedulers[i]`` is
  the scheduler of ``optimizer_states[i]`` (each optimizer has one, or none
  has). Lightning counts the steps of all optimizers: ``steps`` sum to whole
  epochs of them.

  Lightning resumes a run saved mid-epoch from the start of a dataloader
  that cannot resume (it warns), so a step inside an epoch would not
  continue exactly: such a checkpoint, or ``steps`` that end inside an
  epoch, are refused. The loops' counters are read under the names
  Lightning writes from 2.0.0 on; a checkpoint of an older Lightning is
  refused with the call that upgrades it as Lightning does when it loads it
  (``lightning.pytorch.utilities.migration.migrate_checkpoint``). A
  checkpoint without manual optimization's step count, but whose global
  step tells it (that of automatic optimization, or with none of it), is
  read, and written back without it.

  Args:
    state: the state of the transform that
      :func:`~onnx_optax.interop.from_torch_state_dict` returned for
      ``checkpoint["optimizer_states"][0]``, after ``steps`` updates; a list
      of one per optimizer for several.
    checkpoint: the Lightning checkpoint (a dict).
    weights: the LightningModule's ``state_dict`` at the new step
      (``module.state_dict()`` after loading the JAX parameters), with
      ``checkpoint["state_dict"]``'s keys, shapes and dtypes; values may be
      tensors or arrays.
    steps: the JAX updates since ``checkpoint``: whole epochs of its run
      (one per optimizer for several, summing to whole epochs).
    learning_rate: as for :func:`to_trainer_checkpoint` (one per optimizer
      for several).
    param_names: as for :func:`~onnx_optax.interop.from_torch_state_dict`
      (:func:`torch_param_names` of the module's optimizer; one list per
      optimizer for several).
    optimizer: as for :func:`~onnx_optax.interop.from_torch_state_dict`
      (one per optimizer for several).
    layout: as for :func:`~onnx_optax.interop.to_torch_state_dict`: the
      :class:`~onnx_optax.interop.layout.Layout` of one's own model (one for
      all the optimizers); ``weights`` stay in PyTorch's names
      (``layout.to_torch(params)``).
    scheduler_steps: under manual optimization, the steps the module took of
      each scheduler during the JAX updates (one per optimizer for
      several); left out under automatic optimization, whose schedulers'
      steps the loops count.

  Returns:
    The new checkpoint (a dict).

  Raises:
    TypeError, ValueError: a checkpoint that is not Lightning's, of an
      older Lightning, saved mid-epoch, of several optimizers under
      automatic optimization, of other schedulers than one per optimizer;
      ``steps`` that are not whole epochs or disagree with the states'
      counts; an argument without one entry per optimizer;
      ``scheduler_steps`` missing under manual optimization with
      schedulers, or given otherwise; ``weights`` that do not match; and as
      :func:`~onnx_optax.interop.to_torch_state_dict` and
      :func:`to_torch_scheduler_state_dict` (noting the optimizer, for
      several).
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
  count, schedulers = len(checkpoint["optimizer_states"]), list(checkpoint["lr_schedulers"])
  if not count:
    raise ValueError(
      "checkpoint has no optimizer states (optimizer_states is empty): a module whose configure_optimizers "
      "returns no optimizer has no optimizer state to write; pass a checkpoint of a module with one"
    )
  fit, manual_progress = _fit_loop(checkpoint)
  automatic_steps = fit[_AUTOMATIC]["optimizer"]["step"]["total"]["completed"]
  manual = bool(manual_progress["total"]["completed"])
  if manual and automatic_steps:
    raise ValueError(
      f"checkpoint's loops count optimizer steps of automatic ({automatic_steps}) and of manual "
      f"({manual_progress['total']['completed']}) optimization: a module runs one of them, so these are not "
      f"the counters of one run. Pass the checkpoint as Lightning saved it (torch.load of its .ckpt)"
    )
  if count > 1 and not manual:
    raise ValueError(
      f"checkpoint has {count} optimizer states, stepped by automatic optimization: Lightning (from 2.0 on) "
      f"runs several optimizers with manual optimization only, and the bridge writes them so. Save the run "
      f"with self.automatic_optimization = False in the module"
    )
  if len(schedulers) not in (0, count):
    raise ValueError(
      f"checkpoint has {len(schedulers)} lr schedulers for {count} optimizer(s): the bridge writes one "
      f"scheduler per optimizer (lr_schedulers[i] that of optimizer_states[i]: configure_optimizers "
      f"returning [opt0, opt1], [sched0, sched1]) or none; two schedulers of one optimizer are not written"
    )
  states = _each(state, count, "state")
  step_counts = [_steps(n) for n in _each(steps, count, "steps")]
  rates_given = _each(learning_rate, count, "learning_rate", optional=True)
  names = _each(param_names, count, "param_names", optional=True)
  kinds = _each(optimizer, count, "optimizer", optional=True)
  batches = fit["epoch_loop.batch_progress"]
  if not batches["is_last_batch"]:
    raise ValueError(
      f"checkpoint was saved inside an epoch (after its batch {batches['current']['ready']}): Lightning "
      f"resumes such a run from the start of a dataloader that cannot resume, so no step inside an epoch "
      f"continues exactly. Start from a checkpoint saved at the end of an epoch (ModelCheckpoint's default)"
    )
  epochs = fit["epoch_progress"]["total"]["processed"]
  progress = {key: fit[key] for key in _PER_EPOCH}
  for key, counters in progress.items():
    for where, pair in _counters(counters, key):
      if any(pair["total"][k] != epochs * pair["current"][k] for k in pair["current"]):
        raise ValueError(
          f"checkpoint's loops count {pair['total']} in all and {pair['current']} in its last epoch "
          f"({where}), over {epochs} epochs: not the same every epoch, so the counters of later epochs are "
          f"not known"
        )
  if manual:
    # Manual optimization's count runs on over the epochs (its current is its total).
    taken = manual_progress["total"]["completed"]
    if not epochs or taken % epochs:
      raise ValueError(
        f"checkpoint's loops count {taken} optimizer steps of manual optimization ({_MANUAL}) over {epochs} "
        f"epochs: not the same every epoch, so the counters of later epochs are not known"
      )
    per_epoch = taken // epochs
  else:
    per_epoch = progress[_AUTOMATIC]["optimizer"]["step"]["current"]["completed"]
  if per_epoch == 0:
    raise ValueError(
      "checkpoint's epochs took no optimizer step (its loops count none in its last epoch): the bridge "
      "writes a run back after whole epochs of optimizer steps, and these epochs have none"
    )
  total = sum(step_counts)
  if total % per_epoch:
    down = total - total % per_epoch
    if count == 1:
      raise ValueError(
        f"steps={steps} is not a whole number of epochs of {per_epoch} optimizer steps: checkpoint was saved "
        f"at the end of an epoch, and Lightning resumes there only, so a run written back ends at an epoch's "
        f"end too (steps={down + per_epoch}, or {down})"
      )
    raise ValueError(
      f"steps={step_counts} take {total} optimizer steps in all, not a whole number of epochs of {per_epoch} "
      f"(Lightning counts the steps of all the optimizers): checkpoint was saved at the end of an epoch, and "
      f"Lightning resumes there only, so a run written back ends at an epoch's end too (steps summing to "
      f"{down + per_epoch}, or {down})"
    )
  later_epochs = total // per_epoch
  scheduler_counts = (
    _scheduler_steps(scheduler_steps, checkpoint, count, manual, epochs, later_epochs)
    or [later_epochs * fit["epoch_loop.scheduler_progress"]["current"]["completed"]] * count
  )
  written_states, later_schedulers = [], []
  for i in range(count):
    saved = checkpoint["optimizer_states"][i]
    try:
      groups = _param_groups(saved, f"checkpoint['optimizer_states'][{i}]")
      rates = _evaluated(rates_given[i], step_counts[i], len(groups))
      if schedulers:
        later = to_torch_scheduler_state_dict(
          schedulers[i], saved, steps=scheduler_counts[i], learning_rate=rates
        )
        later_schedulers.append(later)
        rates = later["_last_lr"]
      written_states.append(
        to_torch_state_dict(
          states[i], saved, optimizer=kinds[i], learning_rate=rates, param_names=names[i], layout=layout
        )
      )
    except (TypeError, ValueError) as error:
      if count > 1:
        error.add_note(
          f"(writing optimizer {i} of {count}: state[{i}] into checkpoint['optimizer_states'][{i}]"
          f"{f' and lr_schedulers[{i}]' if schedulers else ''})"
        )
      raise
  for i, (written, saved, n) in enumerate(zip(written_states, checkpoint["optimizer_states"], step_counts)):
    taken = _taken(written, saved)
    if count > 1 and taken is not None and taken != n:
      raise ValueError(
        f"steps[{i}] is {n}, but state[{i}]'s count went on by {taken} since "
        f"checkpoint['optimizer_states'][{i}]: pass {taken} as steps[{i}], the JAX updates of optimizer {i} "
        f"since the checkpoint"
      )
    _check_steps(written, saved, n)
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
  if manual and _MANUAL in new_fit:
    for counter in (new_fit[_MANUAL]["total"], new_fit[_MANUAL]["current"]):
      for k in counter:
        counter[k] += total
  stepped = new_fit.get("epoch_loop.state_dict", {})
  if "_batches_that_stepped" in stepped:
    # Once per optimizer step (automatic optimization, accumulated batches counted once), or per batch.
    stepped["_batches_that_stepped"] += later_epochs * batches["current"]["completed"] if manual else total
  return {
    **checkpoint,
    "epoch": checkpoint["epoch"] + later_epochs,
    "global_step": checkpoint["global_step"] + total,
    "state_dict": new_weights,
    "optimizer_states": written_states,
    "lr_schedulers": later_schedulers,
    "loops": loops,
  }


def _fit_loop(checkpoint: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
  """The fit loop's counters, and manual optimization's step count (derived where only it is missing)."""
  fit = checkpoint["loops"].get("fit_loop", {})
  version = checkpoint.get("pytorch-lightning_version")
  missing = [key for key in _FIT_LOOP if key not in fit]
  why = ""
  if missing == [_MANUAL]:
    # Lightning's global step is automatic optimization's step count, or manual optimization's when the
    # module never stepped automatically; each optimizer step counts once, in one of them.
    automatic = fit[_AUTOMATIC]["optimizer"]["step"]["total"]["completed"]
    global_step = checkpoint["global_step"]
    if automatic in (0, global_step):
      taken = 0 if automatic == global_step else global_step
      counter = {"ready": taken, "completed": taken}
      return fit, {"total": counter, "current": dict(counter)}
    why = (
      f": manual optimization's step count is not told by its global_step {global_step}, which is neither "
      f"automatic optimization's {automatic} nor that of a run without it"
    )
  if not missing:
    return fit, fit[_MANUAL]
  release = tuple(int(part) for part in re.findall(r"\d+", str(version))[:2])
  if version is not None and release < (2, 0):
    raise ValueError(
      f"checkpoint['loops']['fit_loop'] has no {missing}: Lightning writes them from 2.0.0 on, and this "
      f"checkpoint is of Lightning {version} (its pytorch-lightning_version), which keeps its loops' "
      f"counters under other names. Upgrade it as Lightning 2 does when it loads it (and resumes it "
      f"alike), then pass that: from lightning.pytorch.utilities.migration import migrate_checkpoint; "
      f"checkpoint, _ = migrate_checkpoint(checkpoint)"
    )
  raise ValueError(
    f"checkpoint['loops']['fit_loop'] has no {missing}, which Lightning writes from 2.0.0 on (its "
    f"pytorch-lightning_version is {version!r}){why}. Pass the checkpoint as Lightning saved it (torch.load "
    f"of its .ckpt, unedited)"
  )


def _each(value: Any, count: int, argument: str, *, optional: bool = False) -> list[Any]:
  """``value`` for each of ``count`` optimizers: itself for one, its entries for several."""
  if count == 1:
    return [value]
  if optional and value is None:
    return [None] * count
  if not isinstance(value, (list, tuple)) or len(value) != count:
    found = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (list, tuple)) else repr(value)
    raise ValueError(
      f"{argument} must be a list with one entry per optimizer, {count}, as checkpoint has {count} "
      f"optimizer_states (in configure_optimizers' order), got {found}: pass [{argument} of optimizer 0, "
      f"..., {argument} of optimizer {count - 1}]"
    )
  return list(value)


def _scheduler_steps(
  scheduler_steps: Any,
  checkpoint: Mapping[str, Any],
  count: int,
  manual: bool,
  epochs: int,
  later_epochs: int,
) -> list[int] | None:
  """The steps of each scheduler under manual optimization, or None where the loops count them."""
  schedulers = checkpoint["lr_schedulers"]
  if not (manual and schedulers):
    if scheduler_steps is not None:
      why = "under automatic optimization Lightning steps the schedulers, and its loops count their steps"
      if not schedulers:
        why = "checkpoint has no lr schedulers"
      raise ValueError(f"scheduler_steps={scheduler_steps!r} is given, but {why}: leave scheduler_steps out")
    return None
  if scheduler_steps is None:
    last = [scheduler.get("last_epoch") for scheduler in schedulers]
    advice = ""
    if all(isinstance(n, int) and n % epochs == 0 for n in last):
      advised = [n // epochs * later_epochs for n in last]
      advice = (
        f": their last_epoch are {last} after {epochs} epochs, so scheduler_steps="
        f"{advised[0] if count == 1 else advised} if every epoch steps them alike"
      )
    raise ValueError(
      "checkpoint is of a module with manual optimization, which steps its lr schedulers itself, so "
      "Lightning's loops count none of their steps: pass scheduler_steps=, the steps the module took of each "
      f"scheduler during the JAX updates{advice}"
    )
  out = []
  for n in _each(scheduler_steps, count, "scheduler_steps"):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
      raise ValueError(f"scheduler_steps must count scheduler steps, ints >= 0, got {scheduler_steps!r}")
    out.append(int(n))
  return out


def _taken(written: Mapping[str, Any], saved: Mapping[str, Any]) -> int | None:
  """The updates since ``saved`` that ``written``'s first ``step`` counts (Adam, AdamW, Adagrad), or None."""
  for key, entry in written["state"].items():
    before = saved["state"].get(key, {}).get("step")
    if "step" in entry and before is not None:
      return int(float(entry["step"])) - int(float(before))
  return None


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
