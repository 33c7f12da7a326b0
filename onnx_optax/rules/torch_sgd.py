"""``torch.optim.SGD`` in PyTorch's order: the float32 twin of ONNX ``Momentum``."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _feedback, _numerics, _pytorch, registry
from onnx_optax.rules import onnx_momentum

__all__ = [
  "PyTorchSGDScalars",
  "PyTorchSGDState",
  "pytorch_sgd",
  "pytorch_sgd_elementwise",
  "pytorch_sgd_scalars",
]


class PyTorchSGDScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_sgd`: ``-lr``, ``momentum`` (None when it
  is the Python number 0: plain SGD), ``1 - dampening``, ``weight_decay``; ``first`` (a bool:
  PyTorch has no momentum buffer yet) and ``neg_zero``."""

  neg_lr: Any
  momentum: Any
  one_minus_dampening: Any
  weight_decay: Any
  first: Any
  neg_zero: Any


def pytorch_sgd_scalars(
  lr: ArrayLike, count: ArrayLike, *, momentum: float, dampening: float, weight_decay: float
) -> PyTorchSGDScalars:
  """``-lr``, ``1 - dampening`` (Python float64, as PyTorch's ``alpha``), ``first = count == 0``.

  ``count`` is the number of updates done (PyTorch's SGD keeps a momentum buffer from its
  first step on: ``count > 0`` means there is one). ``1 - dampening`` is None when it is 1.
  """
  one_minus_dampening = _pytorch.host_or_traced(dampening, lambda d: 1 - d)
  if _numerics.is_static(one_minus_dampening, 1):
    one_minus_dampening = None
  return PyTorchSGDScalars(
    _pytorch.host_or_traced(lr, lambda r: -r),
    None if _numerics.is_static_zero(momentum) else momentum,
    one_minus_dampening,
    None if _numerics.is_static_zero(weight_decay) else weight_decay,
    jnp.asarray(count) == 0,
    _pytorch.neg_zero(count),
  )


def pytorch_sgd_elementwise(
  s: PyTorchSGDScalars,
  X: Array | None,
  G: Array,
  buf: Array,
  *,
  nesterov: bool,
  maximize: bool,
) -> tuple[Array, Array]:
  """``torch.optim.SGD``'s step on one tensor, in ``_single_tensor_sgd``'s order::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                   if weight_decay != 0
      buf  = grad.clone() at the first step, else
             buf.mul_(momentum).add_(grad, alpha=1 - dampening)     if momentum != 0
      grad = grad.add(buf, alpha=momentum) if nesterov, else buf    if momentum != 0
      param.add_(grad, alpha=-lr)

  ``X``, ``G`` and ``buf`` in their own dtypes; computes in PyTorch's opmath dtype. Without
  momentum (``s.momentum`` None) ``buf`` is returned as it is. Returns ``(U, buf_new)``:
  ``param.add_`` is one fused multiply-add with the parameter, so the update is ``X_new - X``
  (``_pytorch.in_place``), in ``X``'s dtype.
  """
  if X is None:
    raise ValueError("this update writes the parameters in place: call update(grads, state, params)")
  dt = _pytorch.opmath(X.dtype, G.dtype, buf.dtype)
  x, g, nz = X.astype(dt), G.astype(dt), jnp.asarray(s.neg_zero, dt)
  g_dtype = jnp.promote_types(G.dtype, X.dtype)
  # Each `add(other, alpha=a)` takes `a` in its operands' common dtype (`_pytorch.alpha`): rounded
  # for 16-bit tensors. `buf.mul_(momentum)` keeps `momentum` in the opmath dtype.
  b_dtype = jnp.promote_types(buf.dtype, g_dtype)
  nesterov_dtype = jnp.promote_types(g_dtype, buf.dtype)
  nesterov_alpha = _pytorch.alpha(s.momentum, nesterov_dtype)
  step_dtype = g_dtype if s.momentum is None else nesterov_dtype if nesterov else buf.dtype
  s = s._replace(
    weight_decay=_pytorch.alpha(s.weight_decay, g_dtype),
    one_minus_dampening=_pytorch.alpha(s.one_minus_dampening, b_dtype),
    neg_lr=_pytorch.alpha(s.neg_lr, jnp.promote_types(X.dtype, step_dtype)),
  )
  if maximize:
    g = -g
  if s.weight_decay is not None:
    g = _pytorch.stored(x * s.weight_decay + g, g_dtype)
  buf_new = buf
  if s.momentum is not None:
    b = buf.astype(dt)
    decayed = _pytorch.stored(b * s.momentum, buf.dtype, nz)
    damped = g + decayed if s.one_minus_dampening is None else g * s.one_minus_dampening + decayed
    b_new = jnp.where(s.first, _pytorch.stored(g, buf.dtype), _pytorch.stored(damped, buf.dtype))
    buf_new = b_new.astype(buf.dtype)
    g = _pytorch.stored(b_new * nesterov_alpha + g, nesterov_dtype) if nesterov else b_new
  return _pytorch.in_place(g * s.neg_lr + x, X), buf_new


class PyTorchSGDState(NamedTuple):
  """State of :func:`pytorch_sgd`: ``count`` (updates done; 0: no momentum buffer yet) and
  ``momentum_buffer`` (PyTorch's ``state[p]["momentum_buffer"]``; zeros, unused, without
  momentum, where PyTorch keeps none)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  momentum_buffer: optax.Updates


def pytorch_sgd(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  momentum: float = 0.0,
  dampening: float = 0.0,
  weight_decay: float = 0.0,
  nesterov: bool = False,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.SGD``, in PyTorch's order: the float32 twin of :func:`onnx_optax.momentum`.

  The same rule as ONNX ``Momentum`` (``alpha = momentum``, ``beta = 1 - dampening``,
  ``norm_coefficient = weight_decay``), evaluated as PyTorch 2.13's ``_single_tensor_sgd``
  evaluates it, with its scalars (``1 - dampening`` in float64, rounded once) and its roundings
  (docs/spec.md, "PyTorch-order twins")::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                 if weight_decay != 0
      buf  = grad at the first update (count == 0), else
             buf.mul_(momentum).add_(grad, alpha=1 - dampening)   if momentum != 0
      grad = grad.add(buf, alpha=momentum) if nesterov, else buf  if momentum != 0
      param.add_(grad, alpha=-lr)

  A run carried from PyTorch with :func:`onnx_optax.interop.from_torch` continues in float32
  within PyTorch's own spread (docs/interop.md, "Float32 runs carried from PyTorch").

  Args:
    learning_rate: ``lr``, a float or an Optax schedule (of the updates made by this
      transform, ``count - initial_count``).
    momentum: in ``[0, 1]``; 0 is plain SGD (``state.momentum_buffer`` stays zero).
    dampening: in ``[0, 1]``.
    weight_decay: L2 coefficient added to the gradient, ``>= 0``.
    nesterov: Nesterov momentum (PyTorch: needs ``momentum > 0`` and ``dampening = 0``).
    maximize: negate the gradient first.
    initial_count: the updates already done; ``> 0`` means the buffer exists.
    state_dtype: dtype of the buffer; default each parameter's (PyTorch's).

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_sgd(0.1, momentum=0.9, dampening=0.5)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([1.0, -1.0]), state, params)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov, maximize=maximize
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _validate(hyper: dict[str, Any], name: Any) -> None:
  momentum, dampening = hyper["momentum"], hyper["dampening"]
  concrete = not (_checks.is_traced(momentum) or _checks.is_traced(dampening))
  if hyper["nesterov"] and concrete and (momentum == 0 or dampening != 0):  # injected, traced: unchecked
    raise ValueError(
      f"{name('nesterov')}=True needs {name('momentum')} > 0 and {name('dampening')} = 0 (as "
      f"torch.optim.SGD), got momentum={momentum}, dampening={dampening}"
    )


def _refuse(kind: str, g: int, group: Any, advice: Any) -> None:
  """What ``torch.optim.SGD``'s constructor refuses, in a group edited after it."""
  if group["nesterov"] and (group["momentum"] == 0 or group["dampening"] != 0):
    raise ValueError(
      f"param_groups[{g}] has nesterov=True with momentum={group['momentum']} and "
      f"dampening={group['dampening']}: PyTorch refuses Nesterov momentum without momentum "
      f"or with dampening, and ONNX Momentum's Nesterov mode is PyTorch's only for "
      f"dampening=0. Use dampening=0 (beta=1), or nesterov=False"
    )


def _ignores(options: dict[str, Any]) -> dict[str, Any]:
  """Plain SGD (``momentum = 0``): PyTorch ignores ``dampening``."""
  return {**options, "dampening": 0.0} if options["momentum"] == 0 else options


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  numbers = {k: hyper[k] for k in ("momentum", "dampening", "weight_decay")}
  nesterov, maximize = hyper["nesterov"], hyper["maximize"]
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, buf: rule.elementwise(s, X, G, buf, nesterov=nesterov, maximize=maximize),
  )


RULE = registry.register(
  registry.Rule(
    name="pytorch_sgd",
    transform=pytorch_sgd,
    state=PyTorchSGDState,
    fields=(registry.Field("momentum_buffer", "momentum_buffer"),),
    hyperparameters={
      "momentum": registry.Hyperparameter(_checks.decay),
      "dampening": registry.Hyperparameter(_checks.dampening),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "nesterov": registry.Hyperparameter(_checks.flag, static=True),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_sgd_scalars,
    elementwise=pytorch_sgd_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    always_reads_params="Its update writes the parameters in place (PyTorch's param.add_)",
    validate=_validate,
    bindings=(
      registry.Binding("optax", "optax.sgd"),
      registry.Binding(
        "torch",
        "SGD",
        torch=registry.TorchOptimizer(
          options=frozenset({"momentum", "dampening", "weight_decay", "nesterov", "fused"}),
          signature=frozenset({"momentum", "dampening", "nesterov"}),
          step=False,
          optional={"momentum_buffer": "momentum"},
          refuse=_refuse,
          ignores=_ignores,
          examples={
            "plain": dict(lr=0.1),
            "momentum": dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
            "nesterov": dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True),
          },
        ),
      ),
    ),
    twin_of=onnx_momentum.RULE,
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(
        lambda h, R, T0, n: _feedback.momentum(float(h["momentum"]), float(h["weight_decay"]), R)
      ),
      hyper=dict(momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False),
      tiny_gradient={"weight_decay": 0.0},
      outputs=("X_new", "momentum_buffer"),
      tests=registry.TestConfig(dict(momentum=0.9, dampening=0.1, weight_decay=0.01), 0.05, ""),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      more_tests={"nesterov": registry.TestConfig(dict(momentum=0.9, nesterov=True), 0.05, "")},
      edges=(
        registry.Edge("nesterov", {"hyper": {"nesterov": True, "dampening": 0.0}}),
        registry.Edge("nesterov,T=0", {"T": 0, "hyper": {"nesterov": True, "dampening": 0.0}}),
        registry.Edge("momentum=0", {"hyper": {"momentum": 0.0, "dampening": 0.0}}),
        registry.Edge("dampening=0", {"hyper": {"dampening": 0.0}}),
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
      ),
    ),
  )
)
