"""Checkpoints of PyTorch training clients: the scheduler's state, Trainer directories, Lightning files.

A JAX run that came from a training client goes back as the checkpoint that
client would have written after the JAX updates, so that the client's own
resume continues it exactly, with no step by hand:

* :func:`to_trainer_checkpoint` writes a Hugging Face Trainer
  ``checkpoint-N/`` directory (``optimizer.pt``, ``scheduler.pt``,
  ``trainer_state.json``, ``rng_state.pth``, a float16 run's ``scaler.pt``)
  for ``trainer.train(resume_from_checkpoint=...)``;
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
import re
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
  found_inf: Sequence[bool] | None = None,
  rng_state: Mapping[str, Any] | None = None,
) -> pathlib.Path:
  """Writes a JAX run as a Hugging Face Trainer checkpoint, for ``trainer.train(resume_from_checkpoint=...)``.

  ``checkpoint`` is the Trainer's ``checkpoint-N/`` directory the run came
  from; after ``steps`` JAX updates, ``directory`` receives what the Trainer
  would have saved at step ``N + steps``, as ``Trainer.train`` reads it to
  resume there: ``optimizer.pt`` (:func:`~onnx_optax.interop.to_torch_state_dict`
  of ``state``, each group's ``lr`` the scheduler's), ``scheduler.pt`` (the
  scheduler ``steps`` steps on, :func:`to_torch_scheduler_state_dict`),
  ``trainer_state.json`` (``global_step`` ``N + steps``, ``epoch`` scaled
  with it, the rest copied; ``log_history``, ``total_flos`` and
  ``num_input_tokens_seen`` do not count the JAX updates), a float16 run's
  ``scaler.pt`` (from ``found_inf``, which also counts skipped steps in
  ``global_step``) and ``rng_state.pth`` (``rng_state``, or the
  checkpoint's copied). The model's weights are yours to write there, as
  the Trainer reads them (``model.save_pretrained(directory)`` after
  loading the JAX parameters).

  A float16 run off the CPU (``fp16=True`` on a GPU) has a GradScaler: a
  Trainer step whose gradients hold an inf or a NaN is skipped and the scale
  backs off; the other steps grow it every ``growth_interval`` of them. Its
  checkpoint holds ``scaler.pt``, and ``found_inf`` says which of the
  Trainer steps the JAX run took were skipped: the scale and growth tracker
  are PyTorch's own ``GradScaler.update`` replayed over them,
  ``global_step`` counts every step, ``steps`` the applied ones, and the
  scheduler those the Trainer steps it for: the applied ones, and the
  skipped ones too where the optimizer's kernel is fused (``"fused": True``
  in its groups, as the Trainer's default AdamW), which skips inside its
  own step, where accelerate 1.15 sees no skip. On the CPU, accelerate makes
  neither a GradScaler nor autocast for ``fp16=True``: the run trains in
  the model's dtype, skips no step, saves no ``scaler.pt``, and its resume
  fails (``AttributeError``) on a directory that holds one. Which steps
  overflow is not carried: ``found_inf`` is the JAX run's own arithmetic,
  not PyTorch's float16 autocast, and the scaler written is the one its
  skips leave.

  ``rng_state.pth`` holds Python's, NumPy's and PyTorch's generators, which
  the Trainer restores when it resumes. Those of step ``N + steps`` are
  known only to a loop that continued them (one that computed its
  gradients with the PyTorch model in its process): pass them as
  ``rng_state``. Without it, the checkpoint's file is copied, the
  generators of step N: a run that draws PyTorch random numbers in its
  steps (dropout, random augmentation) resumes drawing those of steps
  N + 1, ... again.

  Args:
    state: the state of the transform that
      :func:`~onnx_optax.interop.from_torch_state_dict` returned for
      ``checkpoint``'s ``optimizer.pt``, after ``steps`` updates.
    checkpoint: the Trainer checkpoint directory the run came from.
    directory: the directory to write (created if needed; not
      ``checkpoint``). Name it ``checkpoint-{N + steps}`` in the Trainer's
      ``output_dir`` for ``resume_from_checkpoint=True`` to find it (with
      ``found_inf``, ``N + len(found_inf)``).
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
    found_inf: for a checkpoint with ``scaler.pt``, one bool per Trainer
      step the JAX run took, ``True`` where its gradients held an inf or a
      NaN and it applied no update (``steps`` counts the ``False``):
      ``[False] * steps`` if it skipped none. Required there, refused for a
      checkpoint without ``scaler.pt``.
    rng_state: the generators at step ``N + steps``, in the Trainer's
      layout, with the keys of the checkpoint's ``rng_state.pth``:
      ``{"python": random.getstate(), "numpy": numpy.random.get_state(),
      "cpu": torch.random.get_rng_state()}`` (and ``"cuda"`` where it has
      it). None copies the checkpoint's ``rng_state.pth`` (or the
      ``rng_state_{i}.pth`` of each process of a distributed run).

  Returns:
    ``directory``, as a ``pathlib.Path``.

  Raises:
    FileNotFoundError: ``checkpoint`` lacks ``optimizer.pt``,
      ``scheduler.pt`` or ``trainer_state.json``.
    TypeError, ValueError: as :func:`~onnx_optax.interop.to_torch_state_dict`
      and :func:`to_torch_scheduler_state_dict`; ``steps`` that disagree
      with the state's count or with ``found_inf``; ``found_inf`` missing
      for a checkpoint with ``scaler.pt``, or given for one without;
      ``rng_state`` not in the layout of the checkpoint's, or given for a
      distributed run's; ``directory`` that is ``checkpoint``. Everything
      is checked before anything is written.
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
  record = _found_inf(found_inf, source, steps)
  skipped = sum(record) if record is not None else 0
  rng_files = _rng_files(torch, source, rng_state)
  saved = torch.load(source / "optimizer.pt", weights_only=True, map_location="cpu")
  scheduler = torch.load(source / "scheduler.pt", weights_only=True, map_location="cpu")
  trainer_state = json.loads((source / "trainer_state.json").read_text())
  groups = _param_groups(saved, "optimizer.pt")
  # A fused kernel skips an update inside its own step: accelerate sees a step, and the Trainer steps the
  # scheduler; for the others it sees the skip, and does not.
  fused = any(isinstance(group, Mapping) and group.get("fused") for group in groups)
  later = to_torch_scheduler_state_dict(
    scheduler,
    saved,
    steps=steps + (skipped if fused else 0),
    learning_rate=_evaluated(learning_rate, steps, len(groups)),
  )
  written = to_torch_state_dict(
    state, saved, optimizer=optimizer, learning_rate=later["_last_lr"], param_names=param_names
  )
  _check_steps(written, saved, steps)
  scaler = None
  if record is not None:
    applied = len(record) - skipped
    if applied != steps:
      raise ValueError(
        f"found_inf has {len(record)} entries, {skipped} True (skipped) and {applied} False "
        f"(applied), but steps={steps}: found_inf holds a False for each of the {steps} updates the JAX run "
        f"applied (steps counts them) and a True for each Trainer step it skipped"
      )
    saved_scaler = torch.load(source / "scaler.pt", weights_only=True, map_location="cpu")
    scaler = _grad_scaler(torch, saved_scaler, record, str(source))
  before = trainer_state["global_step"]
  taken = steps + skipped
  trainer_state["global_step"] = before + taken
  if before > 0 and trainer_state.get("epoch") is not None:
    # The Trainer's epoch is its global step over the update steps of an epoch.
    trainer_state["epoch"] = trainer_state["epoch"] * (before + taken) / before
  target.mkdir(parents=True, exist_ok=True)
  torch.save(written, target / "optimizer.pt")
  torch.save(later, target / "scheduler.pt")
  if scaler is not None:
    torch.save(scaler, target / "scaler.pt")
  for name, rng in rng_files.items():
    if isinstance(rng, pathlib.Path):
      (target / name).write_bytes(rng.read_bytes())
    else:
      torch.save(rng, target / name)
  (target / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
  return target


# The keys of a torch.amp.GradScaler's state dict (PyTorch 2.13), as the Trainer saves it in scaler.pt.
_SCALER = frozenset({"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})
# A key of the Trainer's rng_state.pth, and the call that gives the generator's state.
_RNG = {
  "python": "random.getstate()",
  "numpy": "numpy.random.get_state()",
  "cpu": "torch.random.get_rng_state()",
  "cuda": "torch.cuda.random.get_rng_state()",
}


def _found_inf(found_inf: Any, source: pathlib.Path, steps: int) -> list[bool] | None:
  """``found_inf`` as a list of bools (None for a run without a GradScaler); refuses a record where the
  checkpoint has no ``scaler.pt``, and no record where it has. A NumPy or JAX array of bools is read."""
  has_scaler = (source / "scaler.pt").is_file()
  if found_inf is None:
    if has_scaler:
      raise ValueError(
        f"checkpoint {str(source)!r} has scaler.pt, a float16 run's GradScaler, whose scale after the JAX "
        f"steps depends on which of them found an inf or a NaN gradient and were skipped: pass found_inf, "
        f"one bool per Trainer step the JAX run took, True where it was skipped; found_inf=[False] * "
        f"{steps} if each of the {steps} steps applied its update"
      )
    return None
  if not has_scaler:
    raise ValueError(
      f"found_inf is given, but checkpoint {str(source)!r} has no scaler.pt: its run had no GradScaler "
      f"(float32, bfloat16, or fp16=True on the CPU, where accelerate makes none), skipped no step, and its "
      f"Trainer fails to resume from a directory that holds a scaler.pt. Leave found_inf out"
    )
  if getattr(found_inf, "dtype", None) == np.bool_ and getattr(found_inf, "ndim", None) == 1:
    found_inf = np.asarray(found_inf).tolist()
  if isinstance(found_inf, (str, bytes, Mapping)) or not isinstance(found_inf, Sequence):
    raise TypeError(
      f"found_inf must be a list of bools, one per Trainer step, got {type(found_inf).__name__}"
    )
  for k, entry in enumerate(found_inf):
    if not isinstance(entry, (bool, np.bool_)):
      raise TypeError(
        f"found_inf[{k}] is {entry!r} ({type(entry).__name__}): found_inf holds a bool per Trainer step, "
        f"True where it was skipped"
      )
  return [bool(entry) for entry in found_inf]


def _grad_scaler(torch: Any, state_dict: Any, found_inf: Sequence[bool], source: str) -> dict[str, Any]:
  """The GradScaler's state dict after PyTorch's own ``step`` and ``update`` over ``found_inf``, on a
  stand-in optimizer whose gradient is an inf where a step found one."""
  if not isinstance(state_dict, Mapping) or set(state_dict) != _SCALER:
    found = sorted(map(str, state_dict)) if isinstance(state_dict, Mapping) else type(state_dict).__name__
    raise TypeError(
      f"checkpoint {source!r} has a scaler.pt that is not a torch.amp.GradScaler's state dict (the keys "
      f"{sorted(_SCALER)}, as the Trainer saves accelerator.scaler.state_dict()), but {found}: pass as "
      f"checkpoint the directory the Trainer saved"
    )
  scaler = torch.amp.GradScaler("cpu")
  scaler.load_state_dict(dict(state_dict))
  scaler.scale(torch.zeros(()))  # the scale and growth tracker, as tensors, from the state dict
  param = torch.nn.Parameter(torch.zeros(1))
  stand_in = torch.optim.SGD([param], lr=0.0)
  for entry in found_inf:
    param.grad = torch.full((1,), math.inf if entry else 0.0)
    scaler.step(stand_in)
    scaler.update()
  return scaler.state_dict()


def _rng_files(torch: Any, source: pathlib.Path, rng_state: Any) -> dict[str, Any]:
  """The RNG files to write: ``rng_state`` as ``rng_state.pth``, or the checkpoint's files (paths) to copy.

  ``rng_state`` is checked as the Trainer restores it: its keys those of the checkpoint's file (read as
  the Trainer reads it, with NumPy's arrays allowed), each host generator's state set on a new one.
  """
  import random

  own = {path.name: path for path in sorted(source.glob("rng_state*.pth"))}
  if rng_state is None:
    return own
  if any(name != "rng_state.pth" for name in own):
    raise ValueError(
      f"rng_state is given, but checkpoint {str(source)!r} holds {', '.join(own)}, one per process of a "
      f"distributed run, which its Trainer reads in place of rng_state.pth: leave rng_state out to copy them"
    )
  keys, whose = ["python", "numpy", "cpu"], "the three the Trainer restores on the CPU"
  if "rng_state.pth" in own:
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
      saved = torch.load(own["rng_state.pth"], weights_only=True, map_location="cpu")
    if isinstance(saved, Mapping):
      keys = sorted(saved, key=lambda key: (list(_RNG).index(key) if key in _RNG else len(_RNG), str(key)))
      whose = f"those of checkpoint {str(source)!r}'s rng_state.pth"
  layout = ", ".join(f'"{key}": {_RNG.get(key, "its generator state")}' for key in keys)
  advice = (
    f"pass rng_state={{{layout}}}, taken where the JAX run reached the step written, or leave it out "
    f"to copy the checkpoint's (the generators of its step)"
  )
  if not isinstance(rng_state, Mapping) or set(rng_state) != set(keys):
    found = sorted(map(str, rng_state)) if isinstance(rng_state, Mapping) else type(rng_state).__name__
    raise ValueError(
      f"rng_state must hold the generators' states with the keys {keys}, {whose}, as the Trainer saves "
      f"and restores them; got {found}: {advice}"
    )
  restore = {
    "python": lambda value: random.Random().setstate(value),
    "numpy": lambda value: np.random.RandomState().set_state(value),
    "cpu": lambda value: torch.Generator().set_state(value),
  }
  for key, check in restore.items():
    try:
      check(rng_state[key])
    except Exception as error:
      raise ValueError(
        f"rng_state[{key!r}] is not a state the Trainer can restore ({type(error).__name__}: {error}): "
        f"{advice}"
      ) from error
  return {"rng_state.pth": dict(rng_state)}


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
        to_torch_state_dict(states[i], saved, optimizer=kinds[i], learning_rate=rates, param_names=names[i])
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
