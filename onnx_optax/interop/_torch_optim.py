"""The PyTorch optimizers the bridges carry: their classes, options, refusals and state entries.

Which rule carries a ``torch.optim`` class is the registry's: the twin that
declares ``Binding("torch", <class name>)`` (:func:`twins`), whose
``twin_of`` is the spec rule whose state :func:`~onnx_optax.interop.to_torch`
loads too. Each group option that is a hyperparameter of that twin is checked
by the twin's declared check, under the name the PyTorch user wrote
(``param_groups[0]['momentum']``). What this module adds is PyTorch's own:
the options each class has in PyTorch 2.13, what the bridge refuses because
no rule reproduces it (tensor hyperparameters, ...), and where
PyTorch keeps a parameter's state (the twin's fields are PyTorch's keys;
``step`` beside them). Importing this module does not import PyTorch.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import optax

from onnx_optax import _checks, registry
from onnx_optax.interop import _common, _dtensor

__all__ = [
  "FLOAT32_EXACT_COUNT",
  "View",
  "as_pytorch_computes",
  "check_group",
  "check_scheduler",
  "declared",
  "kind",
  "listed",
  "read_state",
  "states",
  "step_offset",
  "torch",
  "transform",
  "twins",
  "write",
]

# A ``step`` kept as a float32 tensor (fused optimizers, or a float32 default dtype) counts
# exactly up to 2**24, and PyTorch's own ``step += 1`` stops there.
FLOAT32_EXACT_COUNT = 2**24

# The group option that the bridge applies before the twin, as optax.scale(-1) (docs/interop.md):
# the twin runs with its own default, maximize=False.
_NEGATED_FIRST = "maximize"


def torch() -> Any:
  """PyTorch, or an ImportError that says how to install it."""
  return _common.require("torch", "onnx_optax.interop.torch")


def twins() -> dict[str, registry.Rule]:
  """Per ``torch.optim`` class the bridges carry, by name: the twin the registry binds to it.

  Read from the registry at each call (the rules declaring ``Binding("torch", "SGD", torch=...)``
  ...), in the order of :func:`onnx_optax.registry.rules`.
  """
  return {b.name: rule for rule in registry.rules() if (b := rule.binding("torch")) is not None}


def declared(kind: str) -> registry.TorchOptimizer:
  """What the twin of ``torch.optim.<kind>`` declares of its class (its options, ``step``, refusals)."""
  binding = twins()[kind].binding("torch")
  assert binding is not None and binding.torch is not None  # registry.register checks it
  return binding.torch


def listed(kinds: Sequence[str], word: str = "and") -> str:
  """``"SGD, Adagrad, Adam and AdamW"``."""
  return ", ".join(kinds[:-1]) + f" {word} {kinds[-1]}" if len(kinds) > 1 else "".join(kinds)


def states(kind: str) -> tuple[type, ...]:
  """The states :func:`~onnx_optax.interop.to_torch` loads into a ``kind``: its twin's, then its twin_of's."""
  twin = twins()[kind]
  return tuple(dict.fromkeys(rule.state for rule in (*twin.family(), twin.twin_of) if rule is not None))


def group_twin(kind: str, group: dict) -> registry.Rule:
  """The rule that takes this group's step: its twin (:func:`_twin_of_group`), or that twin's
  :attr:`~onnx_optax.registry.Rule.flagged` rule for a flag the group has on (Adam's ``amsgrad``)."""
  rule = _twin_of_group(kind, group)
  binding = rule.binding("torch")
  names = binding.names if binding is not None else {}
  return rule.running({flag: group.get(names.get(flag, flag)) for flag in rule.flagged})


def group_states(kind: str, group: dict) -> tuple[type, ...]:
  """The states :func:`~onnx_optax.interop.to_torch` loads into this group: its rule's, and the
  twin_of's where no flag of the group adds state (the spec rule has none of those fields)."""
  rule, twin = group_twin(kind, group), twins()[kind]
  spec_rule = twin.twin_of if rule.state is twin.state else None
  return tuple(dict.fromkeys(r.state for r in (rule, spec_rule) if r is not None))


def step_offset(kind: str, state: Any) -> int:
  """A rule state's ``count`` minus PyTorch's ``step`` (the updates done) at the same point of a run.

  0 for the twin (its count is PyTorch's step); for the rule it is the twin of, the difference
  of the two transforms' first counts (``ort_adamw``'s ``T`` starts at 1, where PyTorch's
  Adam has taken no step).
  """
  twin = twins()[kind]
  if isinstance(state, tuple(rule.state for rule in twin.family())) or twin.twin_of is None:
    return 0
  return twin.twin_of.first_count() - twin.first_count()


def kind(torch: Any, optimizer: Any) -> str:
  """The optimizer's class name, one of :func:`twins`; a subclass or another optimizer is refused."""
  cls, bound = type(optimizer), twins()
  classes = {name: getattr(torch.optim, name) for name in bound}
  for name, known in classes.items():
    if cls is known:
      return name
  if isinstance(optimizer, tuple(classes.values())):
    raise TypeError(
      f"{cls.__module__}.{cls.__qualname__} subclasses a PyTorch optimizer and may change its "
      f"step; the bridges map torch.optim.{listed(list(bound))} themselves"
    )
  mapped = [f"torch.optim.{name} (onnx_optax.{rule.name})" for name, rule in bound.items()]
  why = _NO_TWIN.get(cls.__name__, "") if cls.__module__.startswith("torch.optim") else ""
  name = f"{cls.__module__}.{cls.__qualname__}"
  raise TypeError(f"no onnx_optax rule is {name}{why}: the PyTorch bridges map {listed(mapped)}")


#: Why PyTorch's classes that no rule binds have no exact twin (PyTorch's own facts, not a rule's).
_NO_TWIN = {
  "LBFGS": (
    " (its step calls a closure that re-evaluates the loss, several times per step in its line "
    "search: a rule of the gradients alone cannot take it; use optax.lbfgs in JAX, a different run)"
  ),
  "SparseAdam": (
    " (it updates only the rows a sparse gradient touches, with moments of those rows only: JAX's "
    "gradients are dense; use torch.optim.Adam for a dense run to carry)"
  ),
}


class View(NamedTuple):
  """What the bridge reads of an optimizer: a live ``torch.optim`` one, or one rebuilt from a state dict.

  ``groups`` are param groups whose ``params`` are the parameters (tensors,
  or stand-ins with ``shape``, ``dtype``, ``device`` and ``is_complex()``),
  ``state`` maps a parameter to its state entry, ``defaults`` are the
  constructor's options (None when unknown).
  """

  kind: str
  groups: Sequence[dict]
  state: Mapping[Any, dict]
  defaults: Mapping[str, Any] | None
  source: str = "optimizer"  # "state_dict": a refusal's advice edits the state dict instead


def check_group(g: int, group: dict, kind: str, *, source: str = "optimizer") -> None:
  """Refuses a group of ``kind`` with an option the bridge cannot carry exactly, naming it and the fix."""
  known = declared(kind).keys()
  unknown = sorted(set(group) - known)
  if unknown:
    raise ValueError(
      f"param_groups[{g}] has options {unknown} that torch.optim.{kind} does not have in "
      f"PyTorch 2.13 (a scheduler's, or a newer PyTorch's): onnx_optax cannot tell whether "
      f"they change the update"
    )
  for key, value in group.items():
    for v in value if key == "betas" and isinstance(value, (tuple, list)) else (value,):
      if _narrow_float(v):
        # NumPy's promotion keeps a scalar's dtype against Python numbers: PyTorch's
        # ``lr / bias_correction1``, ``1 - dampening``... are then rounded to it.
        dtype = _common.dtype_name(v.dtype)
        raise ValueError(
          f"param_groups[{g}][{key!r}] is a {dtype} scalar ({v!r}), not a Python float: "
          f"torch.optim.{kind} then computes with it in {dtype}, not in float64, so no transform "
          f"follows its rounding. {_float_advice(key, source)}"
        )
  if group.get("differentiable"):
    raise ValueError(
      f"param_groups[{g}] has differentiable=True: it differentiates through PyTorch's step, "
      f"which a copy of the state cannot carry; build the optimizer with differentiable=False "
      f"(JAX differentiates through the transform itself)"
    )
  declaration = declared(kind)
  if declaration.capturable and group.get("capturable"):
    raise ValueError(
      f"param_groups[{g}] has capturable=True: torch.optim.{kind} then {declaration.capturable}, "
      f"which no transform follows. {_advice(source, 'capturable', 'False', 'Turn it off')}"
    )
  for key in [k for k in group if k in declaration.numbers]:
    value = group[key]
    if any(
      not isinstance(v, numbers.Real) for v in (value if isinstance(value, (tuple, list)) else (value,))
    ):
      raise ValueError(
        f"param_groups[{g}][{key!r}] is a tensor ({value!r}): torch.optim.{kind} then computes its "
        f"step's scalars from it in the tensor's dtype (float32 unless made otherwise), not in "
        f"float64 as from a Python number, so no transform follows its rounding. "
        f"{_float_advice(key, source, group)}"
      )
  if declaration.refuse is not None:
    declaration.refuse(kind, g, group, lambda key: _float_advice(key, source, group))
  complex_params = [j for j, p in enumerate(group["params"]) if p.is_complex()]
  if complex_params:  # every class: the twins are rules of real tensors
    raise ValueError(
      f"param_groups[{g}]['params'][{complex_params[0]}] is complex: torch.optim.{kind} updates its "
      f"real and imaginary parts as two real tensors (torch.view_as_real). Carry real parameters: "
      f"optimize torch.view_as_real views in PyTorch and float pairs in JAX"
    )


def _float_advice(key: str, source: str = "optimizer", group: Any = None) -> str:
  """The advice of a refusal of a tensor hyperparameter: a Python float computes in float64, as the rules."""
  pair = key == "betas" or isinstance((group or {}).get(key), (tuple, list))
  value = f"tuple(float(v) for v in group[{key!r}])" if pair else f"float(group[{key!r}])"
  return _advice(source, key, value, "Make it a Python float")


def _advice(source: str, key: str, value: str, verb: str) -> str:
  """Code the user runs as printed on the optimizer (or the state dict), then the bridge's call."""
  if source == "state_dict":
    return (
      f"{verb} in the state dict, then call from_torch_state_dict: "
      f"for group in state_dict['param_groups']: group[{key!r}] = {value} "
      f"(and in the optimizer that loads it back, whose next steps then compute as the twin does)"
    )
  return (
    f"{verb} in the optimizer, then call from_torch: "
    f"for group in optimizer.param_groups: group[{key!r}] = {value} "
    f"(PyTorch's own next steps then compute as the twin does)"
  )


def _is_tensor(value: Any) -> bool:
  return hasattr(value, "dtype") and hasattr(value, "detach")


def _narrow_float(value: Any) -> bool:
  """A NumPy (or JAX) floating scalar narrower than float64: not a Python float, and not a tensor
  (an array of another shape is refused later, as not a real scalar)."""
  if isinstance(value, (bool, int, float)) or _is_tensor(value) or not hasattr(value, "dtype"):
    return False
  if getattr(value, "ndim", 0) != 0:
    return False
  dtype = _common.dtype_name(value.dtype)
  return bool(jax.numpy.issubdtype(dtype, jax.numpy.floating)) and dtype != "float64"


def as_pytorch_computes(schedule: Any, name: str, group: dict) -> Any:
  """``schedule``, refusing a rate narrower than the group's parameters: PyTorch's ``lr`` is a Python float.

  Checked when the transform evaluates it (the dtype is static, so under
  ``jax.jit`` too): a float32 rate for float64 parameters is PyTorch's rate
  rounded, 1e-8 relative off.
  """
  floats = [_common.dtype_name(p.dtype) for p in group["params"]]
  floats = [d for d in floats if jax.numpy.issubdtype(d, jax.numpy.floating)]
  widest = max(floats, key=lambda d: jax.numpy.finfo(d).bits, default=None)

  def rate(n: Any) -> Any:
    return _checks.wide_enough(
      f"{name}'s value", schedule(n), at_least=widest, why=", where PyTorch's lr is a Python float (float64)"
    )

  return rate


def check_scheduler(groups: Sequence[dict], rates: Sequence[Any]) -> None:
  """Refuses a scheduler's groups without ``learning_rate``, giving the value that keeps them constant."""
  if not any("initial_lr" in group and rate is None for group, rate in zip(groups, rates)):
    return
  current = [_common.real_number(f"param_groups[{g}]['lr']", group["lr"]) for g, group in enumerate(groups)]
  value = repr(current[0]) if len(set(current)) == 1 else "[" + ", ".join(map(repr, current)) + "]"
  each = "the current lr" if len(set(current)) == 1 else "the groups' current lrs, one per group"
  raise ValueError(
    f"param_groups have 'initial_lr': a learning-rate scheduler is attached, and its schedule is "
    f"not part of the optimizer. Pass learning_rate={value} ({each}) to keep it constant, or a "
    f"schedule n -> lr of the number n of JAX updates (the PyTorch schedule shifted by the steps "
    f"already taken, e.g. optax.cosine_decay_schedule(...) evaluated at n + steps), or a list with "
    f"one float or schedule per group"
  )


def _twin_of_group(kind: str, group: dict) -> registry.Rule:
  """The twin that takes this group's step: its class's, unless the group holds an option that twin
  fixes and another twin of the same state takes (AdamW's ``decoupled_weight_decay``: PyTorch's
  Adam step reads the flag from the group, whatever the class), then that one."""
  bound = twins()
  rule = bound[kind]
  for other in bound.values():
    extra = set(other.hyperparameters) - set(rule.hyperparameters)
    if other.state is rule.state and extra and extra <= set(group):
      return other
  return rule


def transform(kind: str, g: int, group: dict, R: Any, T: int) -> optax.GradientTransformationExtraArgs:
  """The twin with group ``g``'s options and ``initial_count = T``.

  Each option is checked by the twin's declared check (docs/spec.md, "Hyperparameter ranges")
  under the name the PyTorch user wrote (``param_groups[0]['momentum']``), before any transform
  is built. A tensor option is read with its value (:func:`~onnx_optax.interop._common.real_number`).
  """
  rule = _twin_of_group(kind, group)
  binding = rule.binding("torch")
  names = binding.names if binding is not None else {}

  def name(h: str) -> str:
    return f"param_groups[{g}][{names.get(h, h)!r}]"

  options = {
    h: group[names.get(h, h)] if declared.static else _common.real_number(name(h), group[names.get(h, h)])
    for h, declared in rule.hyperparameters.items()
    if h != _NEGATED_FIRST
  }
  ignores = declared(kind).ignores
  if ignores is not None:
    options = ignores(options)
  return rule.transform(R, **rule.checked(options, name=name), initial_count=T)


def read_state(torch: Any, view: View, group: dict, p: Any, where: str) -> tuple[int, tuple[Any, ...]]:
  """``(T, state tensors, each a NumPy array or None for zeros)`` of one parameter.

  Read by the class's declaration (:func:`declared`): a field kept only under an option is
  absent without it (the twin runs from zeros); an entry without the fields is a parameter that
  has not stepped (PyTorch creates its state at the first step: count 0, the fields' initial
  values, which a field that starts at a constructor option takes from the optimizer's
  defaults); else the count is PyTorch's ``step``, or 1 for a class that keeps none.
  """
  kind, slot, twin, cls = view.kind, view.state.get(p, {}), group_twin(view.kind, group), declared(view.kind)
  fields = [f for f in twin.fields if not (f.name in cls.optional and not group[cls.optional[f.name]])]
  if not any(slot.get(f.name) is not None for f in fields):
    return 0, tuple(_unstepped(view, f, p, group) for f in twin.fields)
  # A field PyTorch keeps only beside other ranks (Field.exists) is None here: init's empty array.
  tensors = tuple(
    _dtensor.to_host(torch, slot[f.name], where)
    if f in fields and slot.get(f.name) is not None and f.exists_for(tuple(p.shape))
    else None
    for f in twin.fields
  )
  if not cls.step:
    return 1, tensors
  step = float(slot["step"])
  if step != int(step) or not 0 <= step <= 2**31 - 1:
    raise ValueError(f"{kind}'s step of a parameter is {step}, not a count of updates")
  return int(step), tensors


def _unstepped(view: View, field: registry.Field, p: Any, group: dict) -> Any:
  """A field of a parameter that has not stepped: None for zeros, its group's learning rate (which
  PyTorch's first step reads from the parameter's group: Rprop's ``step_size``), or its constructor
  option's value (which PyTorch reads from the optimizer's defaults: Adagrad's ``sum``)."""
  if not isinstance(field.initial, str):
    if field.like_params:
      assert field.initial == 0  # the twins' parameter-shaped fields start at zeros or at an option
      return None
    return np.full(field.shape_for(p.shape), field.initial, field.dtype_for(_common.dtype_name(p.dtype)))
  if field.initial == registry.LEARNING_RATE:
    lr = _common.real_number(f"the learning rate of {p!r}'s group", group["lr"])
    return np.full(field.shape_for(p.shape), lr, field.dtype_for(_common.dtype_name(p.dtype)))
  binding = twins()[view.kind].binding("torch")
  option = binding.names.get(field.initial, field.initial) if binding is not None else field.initial
  if view.defaults is None:
    raise ValueError(
      f"{view.kind}'s state has no {field.name!r} for {p!r}: PyTorch fills it at the parameter's first step "
      f"from the constructor's {option}, which a state dict does not hold. Take one step "
      f"in PyTorch before saving, or use from_torch on the live optimizer"
    )
  return np.full(
    field.shape_for(p.shape), view.defaults[option], field.dtype_for(_common.dtype_name(p.dtype))
  )


def check_field(field: registry.Field, value: Any, shape: tuple, dtype: str, where: str) -> None:
  """A state value of ``field`` beside a parameter of ``shape`` and ``dtype`` (a name) has the field's
  declared shape and dtype (:attr:`~onnx_optax.registry.Field.shape`, ``dtypes``: the parameter's
  unless declared); nothing is cast."""
  got = _common.dtype_name(value.dtype)
  if tuple(value.shape) == field.shape_for(shape) and field.keeps(got, dtype):
    return
  raise ValueError(
    f"{where} has shape {tuple(value.shape)} and dtype {got}, not the {field.described(shape, dtype)} "
    f"that PyTorch keeps its {field.name!r} in beside a parameter of shape {shape} and dtype {dtype}: "
    f"nothing is cast. Store it so (for float64 enable jax_enable_x64) if that is what you mean"
  )


def write(
  torch: Any, kind: str, slot: dict, group: dict, p: Any, count: int, tensors: tuple, *, shared: bool = False
) -> None:
  """Rewrites one parameter's state entry ``slot`` (``optimizer.state[p]``) in place, from a checked
  write (``count``: PyTorch's ``step``, the updates done). ``shared``: a CPU tensor of ``tensors``
  may be a JAX array's memory (``checked_writes(copy=False)``): the entry gets a copy of it, made
  here, since PyTorch steps its state in place and JAX takes its arrays as immutable.

  A class without ``step`` keeps no state before its first step (``count == 0``: PyTorch's next
  step is a first one), and none of a field kept only under an option the group has not set.
  """
  cls, twin = declared(kind), group_twin(kind, group)
  if cls.step:
    old = slot.get("step")
    if isinstance(old, torch.Tensor):
      dtype, device = old.dtype, old.device
    else:
      # Where PyTorch's own first step puts it (its _get_scalar_dtype): float32 on the
      # parameter's device for fused or capturable, else a default-dtype scalar on the CPU.
      on_device = bool(group.get("fused")) or bool(group.get("capturable"))
      default = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
      dtype = torch.float32 if group.get("fused") else default
      device = p.device if on_device else "cpu"
    slot["step"] = torch.tensor(float(count), dtype=dtype, device=device)
  for f, tensor in zip(twin.fields, tensors):
    option = cls.optional.get(f.name)
    absent = not f.exists_for(tuple(p.shape))  # a field PyTorch keeps only beside other ranks
    if absent or (option is not None and not group[option]) or (not cls.step and count == 0):
      slot.pop(f.name, None)
    else:
      old = slot.get(f.name)
      own = shared and tensor.device.type == "cpu" and not _dtensor.is_dtensor(tensor)
      if not f.like_params:  # a field of its own shape: where PyTorch kept it, else on the parameter's device
        tensor = tensor.to(device=old.device if isinstance(old, torch.Tensor) else p.device, copy=own)
      elif own:
        tensor = tensor.clone()
      slot[f.name] = tensor
