"""The learning-rate scheduler's state, and what the writers of PyTorch training clients' checkpoints share.

A JAX run that came from a training client goes back as the checkpoint that
client would have written after the JAX updates, so that the client's own
resume continues it exactly, with no step by hand:

* :func:`to_torch_scheduler_state_dict` (here) is the scheduler's side, for a
  plain PyTorch loop (``scheduler.load_state_dict``) and for both writers
  below;
* :func:`~onnx_optax.interop.to_trainer_checkpoint` (in
  :mod:`onnx_optax.interop.torch_trainer`) writes a Hugging Face Trainer
  ``checkpoint-N/`` directory;
* :func:`~onnx_optax.interop.to_lightning_checkpoint` (in
  :mod:`onnx_optax.interop.torch_lightning`) returns a Lightning checkpoint.

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
keyed by name are placed by name. The private helpers both writers use (the
optimizer state dict's groups, the step count and its check, the rates
after the steps) are here too.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax.interop import _common, _torch_optim

__all__ = [
  "to_torch_scheduler_state_dict",
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
