"""Hugging Face Trainer checkpoints: :func:`to_trainer_checkpoint` and the files only the Trainer's hold.

:func:`to_trainer_checkpoint` writes a JAX run as the Trainer's
``checkpoint-N/`` directory (``optimizer.pt``, ``scheduler.pt``,
``trainer_state.json``, ``rng_state.pth``, a float16 run's ``scaler.pt``)
for ``trainer.train(resume_from_checkpoint=...)``. Its private helpers read
and write the files that only the Trainer's checkpoints hold: the
GradScaler's ``scaler.pt`` (replayed over ``found_inf``) and the generators'
``rng_state.pth``. The scheduler's state and what it shares with the
Lightning writer are in :mod:`onnx_optax.interop.torch_checkpoints`.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnx_optax.interop import _dtensor, _torch_optim
from onnx_optax.interop.torch_checkpoints import (
  _check_steps,
  _evaluated,
  _param_groups,
  _steps,
  to_torch_scheduler_state_dict,
)
from onnx_optax.interop.torch_state_dict import to_torch_state_dict

__all__ = ["to_trainer_checkpoint"]


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
  layout: Any = None,
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
    layout: as for :func:`~onnx_optax.interop.to_torch_state_dict`: the
      :class:`~onnx_optax.interop.layout.Layout` of one's own model that
      ``from_torch_state_dict`` took.
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
  # The run's optimizer.pt is the template of groups and keys: mapped from the file, not read into
  # memory, and the state written shares the JAX arrays' memory until torch.save has written it
  # (docs/interop.md, "Memory").
  saved = _dtensor.load(torch, source / "optimizer.pt")
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
    state,
    saved,
    optimizer=optimizer,
    learning_rate=later["_last_lr"],
    param_names=param_names,
    copy=False,
    layout=layout,
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
