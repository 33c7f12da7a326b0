"""``torch.optim.SGD`` and ``torch.optim.Adagrad`` state to and from the transforms.

PyTorch's ``SGD`` is ONNX ``Momentum`` and its ``Adagrad`` is ONNX
``Adagrad`` (docs/spec.md; notebook 02 shows the equalities over 500 float64
steps). This module maps the hyperparameters of every param group and the
per-parameter state onto :func:`onnx_optax.momentum` and
:func:`onnx_optax.adagrad`, and back:

==========================  =============================================
``torch.optim.SGD``         :func:`onnx_optax.momentum`
==========================  =============================================
``lr``                      ``learning_rate``
``momentum``                ``alpha``
``1 - dampening``           ``beta``
``nesterov``                ``mode="nesterov"`` (else ``"standard"``)
``weight_decay``            ``norm_coefficient``
``maximize``                the gradient negated first (``optax.scale(-1)``)
``momentum_buffer``         ``state.v``
no ``momentum_buffer``      ``state.count == 0`` (the first update)
==========================  =============================================

SGD keeps no step count: a buffer means ``T > 0``, and every ``T > 0`` is the
same update, so a parameter with a buffer gets ``count = 1``. ``momentum = 0``
(plain SGD, where PyTorch ignores ``dampening`` and keeps no buffer) is
``alpha = 0, beta = 1``.

==============================  =========================================
``torch.optim.Adagrad``         :func:`onnx_optax.adagrad`
==============================  =========================================
``lr``                          ``learning_rate``
``lr_decay``                    ``decay_factor``
``eps``                         ``epsilon``
``weight_decay``                ``norm_coefficient``
``maximize``                    the gradient negated first
``sum``                         ``state.h`` (``initial_accumulator_value``
                                is its starting value)
``step``                        ``state.count`` (``T`` of the next update)
==============================  =========================================

Parameters that need different transforms (param groups with different
hyperparameters, SGD parameters with and without a buffer, Adagrad parameters
at different steps) get one transform per label under
``optax.multi_transform``; when one transform covers every parameter, it is
returned alone. Either way every transform's ``initial_count`` is the
``count`` it starts from, so a ``learning_rate`` schedule sees 0 at the first
update in JAX.

Importing this module does not import PyTorch; the functions do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax

from onnx_optax import transforms
from onnx_optax.interop import _common

__all__ = ["from_torch", "to_torch", "torch_params"]

_SGD_KEYS = frozenset(
  {
    "params",
    "lr",
    "momentum",
    "dampening",
    "weight_decay",
    "nesterov",
    "maximize",
    "foreach",
    "differentiable",
    "fused",
    "param_names",
    "initial_lr",
  }
)
_ADAGRAD_KEYS = frozenset(
  {
    "params",
    "lr",
    "lr_decay",
    "eps",
    "weight_decay",
    "initial_accumulator_value",
    "foreach",
    "maximize",
    "differentiable",
    "fused",
    "param_names",
    "initial_lr",
  }
)
# torch.optim.Adagrad keeps ``step`` as a float32 tensor: it counts exactly up
# to 2**24, and PyTorch's own ``step += 1`` stops there.
_FLOAT32_EXACT_COUNT = 2**24

_REFUSED = {
  "Adam": (
    "torch.optim.Adam puts epsilon inside the bias correction "
    "(lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)); onnx_optax's Adam rules add it after the "
    "bias correction. The same rule as Adam is optax.adam(lr, b1, b2, eps) (weight_decay: "
    "optax.chain(optax.add_decayed_weights(wd), optax.adam(...))), with state "
    "optax.ScaleByAdamState(count=step, mu=exp_avg, nu=exp_avg_sq)"
  ),
  "AdamW": (
    "torch.optim.AdamW puts epsilon inside the bias correction and decays the weights "
    "decoupled from the gradient; no onnx_optax rule does either. The same rule is "
    "optax.adamw(lr, b1, b2, eps, weight_decay), with state "
    "optax.ScaleByAdamState(count=step, mu=exp_avg, nu=exp_avg_sq)"
  ),
}


def _torch() -> Any:
  return _common.require("torch", "onnx_optax.interop.torch")


def from_torch(
  optimizer: Any,
  params: Any,
  *,
  learning_rate: Any = None,
) -> tuple[optax.GradientTransformationExtraArgs, Any]:
  """The transform and state that continue a PyTorch optimizer's run in JAX.

  ``optimizer`` may have taken any number of steps, zero included. With
  ``tx, state = from_torch(optimizer, params)``, each
  ``updates, state = tx.update(grads, state, params)`` followed by
  ``params = optax.apply_updates(params, updates)`` is the
  ``optimizer.step()`` that PyTorch would have taken with the same gradients
  (float64: equal to about 1e-15 per step; float32: within the rounding of
  the two implementations, see docs/interop.md). The mapping is in the module
  docstring.

  PyTorch skips parameters whose ``grad`` is None; a transform updates every
  leaf it gets a gradient for. Weights are not moved by this function: copy
  them with :func:`torch_params`.

  Args:
    optimizer: a ``torch.optim.SGD`` or ``torch.optim.Adagrad``.
    params: the JAX parameters (a pytree of arrays), whose ``jax.tree.leaves``
      are the optimizer's
      parameters in the order of ``optimizer.param_groups`` (group by group,
      each group's ``params`` in order). Shapes and dtypes must match.
    learning_rate: None to use each group's ``lr``. Needed when a
      learning-rate scheduler is attached (its groups carry ``initial_lr``),
      since the schedule is not part of the optimizer: a float, or a schedule
      ``n -> lr`` of the number ``n`` of updates made in JAX (0 at the first),
      i.e. the PyTorch schedule shifted by the steps already taken; or a
      sequence with one such entry per param group.

  Returns:
    ``(tx, state)``: an ``optax.GradientTransformationExtraArgs`` (call
    ``tx.update(grads, state, params)``: ``weight_decay`` needs the
    parameters) and its state, with the optimizer's state tensors copied.

  Raises:
    TypeError: an optimizer other than SGD and Adagrad (torch ``Adam`` and
      ``AdamW`` name ``optax.adam`` and ``optax.adamw``, which share their
      rule), or a subclass, whose step may differ.
    ValueError: an option the rules lack, a scheduler without
      ``learning_rate``, or params that do not match the optimizer's
      parameters (naming the pytree path).

  Example:
    >>> import torch, jax.numpy as jnp, optax
    >>> from onnx_optax.interop import from_torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, dampening=0.5)
    >>> for g in ([1.0, -1.0], [0.5, 0.5]):
    ...   w.grad = torch.tensor(g); opt.step()
    >>> params = {"w": jnp.asarray(w.detach().numpy())}
    >>> tx, state = from_torch(opt, params)
    >>> updates, state = tx.update({"w": jnp.array([2.0, 0.0])}, state, params)
    >>> w.grad = torch.tensor([2.0, 0.0]); opt.step()
    >>> bool(jnp.allclose(optax.apply_updates(params, updates)["w"], w.detach().numpy()))
    True
  """
  torch = _torch()
  kind = _kind(torch, optimizer)
  leaves, treedef, paths = _common.leaf_paths(params)
  groups = optimizer.param_groups
  _common.check_leaves(leaves, paths, _described(groups), "PyTorch")
  rates = _common.learning_rates(learning_rate, len(groups))

  transforms_by_label: dict[str, optax.GradientTransformation] = {}
  labels: list[str] = []
  tensors: list[Any] = []  # the state tensor of each leaf, a NumPy array
  for g, (group, rate) in enumerate(zip(groups, rates)):
    _check_group(g, group, kind, rate)
    R = _common.real_number(f"param_groups[{g}]['lr']", group["lr"]) if rate is None else rate
    counts_and_tensors = [_read_state(torch, kind, optimizer, group, p) for p in group["params"]]
    for T in sorted({T for T, _ in counts_and_tensors}):
      label = f"group{g}" if len({T for T, _ in counts_and_tensors}) == 1 else f"group{g}.T{T}"
      transforms_by_label[label] = _common.negated(_transform(kind, g, group, R, T), bool(group["maximize"]))
    for T, tensor in counts_and_tensors:
      labels.append(f"group{g}" if f"group{g}" in transforms_by_label else f"group{g}.T{T}")
      tensors.append(tensor)

  tx = _common.partition(transforms_by_label, labels, treedef)
  state = tx.init(params)
  values = [
    tensor if tensor is not None else np.zeros(leaf.shape, _common.dtype_name(leaf.dtype))
    for tensor, leaf in zip(tensors, leaves)
  ]
  state = _common.fill(state, treedef, [[_common.put_like(v, leaf) for v, leaf in zip(values, leaves)]])
  return tx, state


def to_torch(state: Any, optimizer: Any, params: Any = None) -> None:
  """Loads a transform's state (and optionally the weights) into a PyTorch optimizer.

  ``state`` is a state of a transform returned by :func:`from_torch` for an
  optimizer with the same classes, param groups and hyperparameters as
  ``optimizer`` (the same optimizer, or a fresh one built the same way),
  after any number of JAX updates. Afterwards ``optimizer.step()`` continues
  the JAX run: it is the next ``tx.update`` with the same gradients.

  The optimizer's parameters are PyTorch tensors that JAX never touched: pass
  ``params`` (the JAX parameters, leaves in the order of
  ``optimizer.param_groups``) to copy them in as well, or copy them yourself.

  The state's tensors must have the parameters' dtypes (PyTorch keeps its
  state in the parameter's dtype); nothing is cast. Everything is checked
  before the optimizer or a parameter is written.

  Args:
    state: the transform's state.
    optimizer: the ``torch.optim.SGD`` or ``torch.optim.Adagrad`` to load.
    params: optional JAX parameters to copy into the optimizer's parameters.

  Example:
    >>> import torch, jax.numpy as jnp, optax
    >>> from onnx_optax.interop import from_torch, to_torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> opt = torch.optim.Adagrad([w], lr=0.1, lr_decay=0.01)
    >>> params = [jnp.array([1.0, 2.0])]
    >>> tx, state = from_torch(opt, params)
    >>> for g in ([1.0, -1.0], [0.5, 0.5]):  # two steps in JAX
    ...   updates, state = tx.update([jnp.array(g)], state, params)
    ...   params = optax.apply_updates(params, updates)
    >>> to_torch(state, opt, params)
    >>> opt.state[w]["step"], opt.state[w]["sum"]
    (tensor(2.), tensor([1.2500, 1.2500]))
  """
  torch = _torch()
  kind = _kind(torch, optimizer)
  groups = optimizer.param_groups
  torch_params_ = [p for group in groups for p in group["params"]]
  state_kind = transforms.MomentumState if kind == "SGD" else transforms.AdagradState
  owners = _common.positions(state, len(torch_params_), (state_kind,))
  described = _described(groups)
  new_params = None
  if params is not None:
    leaves, _, paths = _common.leaf_paths(params)
    _common.check_leaves(leaves, paths, described, "PyTorch")
    new_params = [_to_tensor(torch, np.asarray(leaf), p) for leaf, p in zip(leaves, torch_params_)]

  writes = []  # (param, count, tensor or None), all checked before any write
  i = 0
  for g, group in enumerate(groups):
    _check_group(g, group, kind, learning_rate=0.0)  # lr is not read here
    for p in group["params"]:
      owner = owners[i]
      (value,) = owner.values
      shape, dtype, where = described[i]
      if tuple(value.shape) != shape or _common.dtype_name(value.dtype) != dtype:
        raise ValueError(
          f"the state of {where} has shape {tuple(value.shape)} and dtype "
          f"{_common.dtype_name(value.dtype)}; PyTorch keeps it with the parameter's shape "
          f"{shape} and dtype {dtype}"
        )
      count = int(owner.rule_state.count)
      if kind == "Adagrad" and count > _FLOAT32_EXACT_COUNT:
        raise ValueError(
          f"the state of {where} has count {count}, beyond 2**24, where torch's float32 step stops counting"
        )
      writes.append((p, group, count, _to_tensor(torch, np.asarray(value), p)))
      i += 1

  for p, group, count, tensor in writes:
    slot = optimizer.state[p]
    if kind == "SGD":
      if group["momentum"] == 0 or count == 0:
        # No buffer: PyTorch's next step is a first step (T = 0), or keeps none.
        slot.pop("momentum_buffer", None)
      else:
        slot["momentum_buffer"] = tensor
    else:
      old = slot.get("step")
      step_dtype = old.dtype if isinstance(old, torch.Tensor) else torch.float32
      step_device = old.device if isinstance(old, torch.Tensor) else "cpu"
      slot["step"] = torch.tensor(float(count), dtype=step_dtype, device=step_device)
      slot["sum"] = tensor
  if new_params is not None:
    with torch.no_grad():
      for p, value in zip(torch_params_, new_params):
        p.copy_(value)


def torch_params(optimizer: Any, like: Any) -> Any:
  """The optimizer's parameters as JAX arrays, in the structure of ``like``.

  ``jax.tree.leaves(like)`` must match the parameters across
  ``optimizer.param_groups`` in order, shape and dtype (``like`` may hold
  arrays or ``jax.ShapeDtypeStruct``). The values are copied exactly.

  Example:
    >>> import torch, jax, jax.numpy as jnp
    >>> from onnx_optax.interop import torch_params
    >>> layer = torch.nn.Linear(3, 2)
    >>> opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    >>> like = {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32),
    ...         "b": jax.ShapeDtypeStruct((2,), jnp.float32)}
    >>> params = torch_params(opt, like)  # dict leaves are sorted: "b" before "w"
    Traceback (most recent call last):
    ...
    ValueError: params['b'] has shape (2,) but the PyTorch param_groups[0]['params'][0] has shape (2, 3)
    >>> params = torch_params(opt, [like["w"], like["b"]])
    >>> bool((params[0] == jnp.asarray(layer.weight.detach().numpy())).all())
    True
  """
  torch = _torch()
  _kind(torch, optimizer)
  leaves, treedef, paths = _common.leaf_paths(like)
  groups = optimizer.param_groups
  _common.check_leaves(leaves, paths, _described(groups), "PyTorch")
  values = [_to_numpy(torch, p) for group in groups for p in group["params"]]
  return treedef.unflatten(
    [
      _common.put_like(v, leaf) if isinstance(leaf, jax.Array) else jax.numpy.asarray(v, dtype=leaf.dtype)
      for v, leaf in zip(values, leaves)
    ]
  )


def _kind(torch: Any, optimizer: Any) -> str:
  cls = type(optimizer)
  if cls is torch.optim.SGD:
    return "SGD"
  if cls is torch.optim.Adagrad:
    return "Adagrad"
  if cls.__name__ in _REFUSED and cls.__module__.startswith("torch.optim"):
    raise TypeError(f"no onnx_optax rule is {cls.__name__}: {_REFUSED[cls.__name__]}")
  if isinstance(optimizer, (torch.optim.SGD, torch.optim.Adagrad)):
    raise TypeError(
      f"{cls.__module__}.{cls.__qualname__} subclasses a PyTorch optimizer and may change its "
      f"step; the bridges map torch.optim.SGD and torch.optim.Adagrad themselves"
    )
  raise TypeError(
    f"no onnx_optax rule is {cls.__module__}.{cls.__qualname__}: the PyTorch bridges map "
    f"torch.optim.SGD (ONNX Momentum) and torch.optim.Adagrad (ONNX Adagrad)"
  )


def _described(groups: Sequence[dict]) -> list[tuple[tuple[int, ...], str, str]]:
  out = []
  for g, group in enumerate(groups):
    names = group.get("param_names")
    for j, p in enumerate(group["params"]):
      where = f"param_groups[{g}]['params'][{j}]"
      if names is not None:
        where += f" ({names[j]!r})"
      out.append((tuple(p.shape), _common.dtype_name(p.dtype), where))
  return out


def _check_group(g: int, group: dict, kind: str, learning_rate: Any) -> None:
  known = _SGD_KEYS if kind == "SGD" else _ADAGRAD_KEYS
  unknown = sorted(set(group) - known)
  if unknown:
    raise ValueError(
      f"param_groups[{g}] has options {unknown} that torch.optim.{kind} does not have in "
      f"PyTorch 2.13 (a scheduler's, or a newer PyTorch's): onnx_optax cannot tell whether "
      f"they change the update"
    )
  if "initial_lr" in group and learning_rate is None:
    raise ValueError(
      f"param_groups[{g}] has 'initial_lr': a learning-rate scheduler is attached, and its "
      f"schedule is not part of the optimizer. Pass learning_rate= the current lr "
      f"({group['lr']}) to keep it constant, or a schedule n -> lr of the number n of JAX "
      f"updates (the PyTorch schedule shifted by the steps already taken, e.g. "
      f"optax.cosine_decay_schedule(...) evaluated at n + steps)"
    )
  if group.get("differentiable"):
    raise ValueError(
      f"param_groups[{g}] has differentiable=True: it differentiates through PyTorch's step, "
      f"which a copy of the state cannot carry; build the optimizer with differentiable=False "
      f"(JAX differentiates through the transform itself)"
    )
  if kind == "SGD":
    if group["nesterov"] and (group["momentum"] == 0 or group["dampening"] != 0):
      # PyTorch's constructor refuses this too; a group edited after it is not.
      raise ValueError(
        f"param_groups[{g}] has nesterov=True with momentum={group['momentum']} and "
        f"dampening={group['dampening']}: PyTorch refuses Nesterov momentum without momentum "
        f"or with dampening, and ONNX Momentum's Nesterov mode is PyTorch's only for "
        f"dampening=0. Use dampening=0 (beta=1), or nesterov=False"
      )


def _transform(kind: str, g: int, group: dict, R: Any, T: int) -> optax.GradientTransformationExtraArgs:
  def number(key):
    return _common.real_number(f"param_groups[{g}][{key!r}]", group[key])

  if kind == "SGD":
    alpha = number("momentum")
    # momentum = 0 is plain SGD: PyTorch ignores dampening, and V_new is the
    # regularized gradient itself when beta = 1.
    beta = 1.0 - number("dampening") if alpha != 0 else 1.0
    return transforms.momentum(
      R,
      alpha=alpha,
      beta=beta,
      mode="nesterov" if group["nesterov"] else "standard",
      norm_coefficient=number("weight_decay"),
      initial_count=T,
    )
  return transforms.adagrad(
    R,
    decay_factor=number("lr_decay"),
    epsilon=number("eps"),
    norm_coefficient=number("weight_decay"),
    initial_count=T,
  )


def _read_state(torch: Any, kind: str, optimizer: Any, group: dict, p: Any) -> tuple[int, Any]:
  """``(T, state tensor or None for zeros)`` of one parameter."""
  slot = optimizer.state.get(p, {})
  if kind == "SGD":
    if group["momentum"] == 0:
      return 0, None  # plain SGD keeps no buffer, and its T does not matter (beta = 1)
    buffer = slot.get("momentum_buffer")
    return (0, None) if buffer is None else (1, _to_numpy(torch, buffer))
  if "sum" not in slot:
    # Adagrad fills the state of a parameter added after its constructor at
    # that parameter's first step, from the optimizer's defaults.
    value = optimizer.defaults["initial_accumulator_value"]
    return 0, np.full(tuple(p.shape), value, _common.dtype_name(p.dtype))
  step = float(slot["step"])
  if step != int(step) or not 0 <= step <= 2**31 - 1:
    raise ValueError(f"Adagrad's step of a parameter is {step}, not a count of updates")
  return int(step), _to_numpy(torch, slot["sum"])


def _to_numpy(torch: Any, tensor: Any) -> np.ndarray:
  tensor = tensor.detach().cpu()
  if tensor.dtype == torch.bfloat16:
    import ml_dtypes  # a dependency of jax and of onnx_optax

    # float32 holds every bfloat16 exactly.
    return tensor.float().numpy().astype(ml_dtypes.bfloat16)
  return tensor.numpy().copy()


def _to_tensor(torch: Any, value: np.ndarray, like: Any) -> Any:
  if _common.dtype_name(value.dtype) == "bfloat16":
    tensor = torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
  else:
    tensor = torch.from_numpy(np.array(value))
  return tensor.to(device=like.device)
