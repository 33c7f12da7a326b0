"""``torch.optim.Adagrad`` in PyTorch's order: the float32 twin of ONNX ``Adagrad``."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _feedback, _numerics, _pytorch, registry
from onnx_optax.rules import onnx_adagrad

__all__ = [
  "PyTorchAdagradScalars",
  "PyTorchAdagradState",
  "pytorch_adagrad",
  "pytorch_adagrad_elementwise",
  "pytorch_adagrad_scalars",
]


class PyTorchAdagradScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_adagrad`: ``-clr``, ``eps``, ``weight_decay``."""

  neg_clr: Any
  eps: Any
  weight_decay: Any


def pytorch_adagrad_scalars(
  lr: ArrayLike, count: ArrayLike, *, lr_decay: float, eps: float, weight_decay: float
) -> PyTorchAdagradScalars:
  """``clr = lr / (1 + (step - 1) * lr_decay)`` with ``step = count + 1`` (PyTorch's step after its
  increment), in float64 under ``jax_enable_x64``, else float32."""
  if _numerics.is_static_zero(lr_decay):
    neg_clr = _pytorch.host_or_traced(lr, lambda r: -r)
  else:
    dtype = _pytorch.scalar_dtype()
    neg_clr = -(jnp.asarray(lr, dtype) / (1 + jnp.asarray(count, dtype) * jnp.asarray(lr_decay, dtype)))
  return PyTorchAdagradScalars(neg_clr, eps, None if _numerics.is_static_zero(weight_decay) else weight_decay)


def pytorch_adagrad_elementwise(
  s: PyTorchAdagradScalars,
  X: Array | None,
  G: Array,
  state_sum: Array,
  *,
  maximize: bool,
) -> tuple[Array, Array]:
  """``torch.optim.Adagrad``'s step on one tensor, in ``_single_tensor_adagrad``'s order::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)        if weight_decay != 0
      clr  = lr / (1 + (step - 1) * lr_decay)
      state_sum.addcmul_(grad, grad, value=1)
      std  = state_sum.sqrt().add_(eps)
      param.addcdiv_(grad, std, value=-clr)

  Returns ``(U, sum_new)``: ``U`` is ``addcdiv_``'s addend (``_pytorch.added``), ``X`` is read
  only for ``weight_decay`` and for parameters narrower than float32 (else it may be None).
  """
  dt = _pytorch.opmath(G.dtype, state_sum.dtype)
  x, g = None if X is None else X.astype(dt), G.astype(dt)
  # `grad.add(param, alpha=weight_decay)` and `add_(eps)` take their scalar in the tensors' dtype.
  g_dtype = G.dtype if X is None else jnp.promote_types(G.dtype, X.dtype)
  s = s._replace(
    weight_decay=_pytorch.alpha(s.weight_decay, g_dtype), eps=_pytorch.alpha(s.eps, state_sum.dtype)
  )
  if maximize:
    g = -g
  if s.weight_decay is not None:
    if x is None:
      raise ValueError("weight_decay multiplies the parameters: call update(grads, state, params)")
    g = _pytorch.stored(x * s.weight_decay + g, G.dtype)
  sum_new = _pytorch.stored(g * g + state_sum.astype(dt), state_sum.dtype)
  std = _pytorch.stored(_pytorch.stored(_numerics.sqrt(sum_new), state_sum.dtype) + s.eps, state_sum.dtype)
  return _pytorch.added(x, (s.neg_clr * g) / std, X, dt, G), sum_new.astype(state_sum.dtype)


class PyTorchAdagradState(NamedTuple):
  """State of :func:`pytorch_adagrad`: ``count`` (PyTorch's ``step``) and ``sum``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  sum: optax.Updates


def pytorch_adagrad(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  lr_decay: float = 0.0,
  weight_decay: float = 0.0,
  initial_accumulator_value: float = 0.0,
  eps: float = 1e-10,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Adagrad``, in PyTorch's order: the float32 twin of :func:`onnx_optax.adagrad`.

  The same rule as ONNX ``Adagrad`` (``decay_factor = lr_decay``, ``epsilon = eps``,
  ``norm_coefficient = weight_decay``, ``T = count``), as ``_single_tensor_adagrad`` evaluates
  it, with ``step = count + 1`` (PyTorch's step after its increment)::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)        if weight_decay != 0
      clr  = lr / (1 + (step - 1) * lr_decay)
      sum.addcmul_(grad, grad, value=1)
      std  = sum.sqrt().add_(eps)
      param.addcdiv_(grad, std, value=-clr)

  ``clr`` is computed in float64 under ``jax_enable_x64`` (PyTorch's), else in float32.
  Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule.
    lr_decay: ``>= 0``.
    weight_decay: L2 coefficient, ``>= 0``.
    initial_accumulator_value: the starting ``sum``, ``>= 0``.
    eps: added to ``sqrt(sum)``, ``>= 0``.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` before the first update here.
    state_dtype: dtype of ``sum``; default each parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adagrad(0.1, eps=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([2.0, -4.0]), state, params)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    lr_decay=lr_decay,
    weight_decay=weight_decay,
    initial_accumulator_value=initial_accumulator_value,
    eps=eps,
    maximize=maximize,
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _refuse(kind: str, g: int, group: Any, advice: Any) -> None:
  """A float32 (or narrower) tensor ``lr`` with ``lr_decay``: PyTorch computes
  ``lr / (1 + (step - 1) * lr_decay)`` in the tensor's dtype; a Python float (or a float64
  tensor) computes in float64, as the twin."""
  lr = group["lr"]
  dtype = str(getattr(lr, "dtype", "")).removeprefix("torch.")
  if hasattr(lr, "detach") and dtype and dtype != "float64" and group["lr_decay"] != 0:
    raise ValueError(
      f"param_groups[{g}]['lr'] is a {dtype} tensor ({lr!r}) and lr_decay is {group['lr_decay']}: "
      f"torch.optim.Adagrad then computes lr / (1 + (step - 1) * lr_decay) in {dtype}, not in "
      f"float64 as for a Python float, so no transform follows its rounding. {advice('lr')}"
    )


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  numbers = {k: hyper[k] for k in ("lr_decay", "eps", "weight_decay")}
  maximize = hyper["maximize"]
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, state_sum: rule.elementwise(s, X, G, state_sum, maximize=maximize),
  )


RULE = registry.register(
  registry.Rule(
    name="pytorch_adagrad",
    transform=pytorch_adagrad,
    state=PyTorchAdagradState,
    fields=(registry.Field("sum", "sum", second_moment=True, initial="initial_accumulator_value"),),
    hyperparameters={
      "lr_decay": registry.Hyperparameter(_checks.learning_rate_decay),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "initial_accumulator_value": registry.Hyperparameter(_checks.accumulator),
      "eps": registry.Hyperparameter(_checks.epsilon),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_adagrad_scalars,
    elementwise=pytorch_adagrad_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    params_for=("weight_decay",),
    bindings=(
      registry.Binding("optax", "optax.adagrad"),  # not the same rule: starts at 0.1, eps inside the root
      registry.Binding(
        "torch",
        "Adagrad",
        torch=registry.TorchOptimizer(
          options=frozenset({"lr_decay", "eps", "weight_decay", "initial_accumulator_value", "fused"}),
          signature=frozenset({"lr_decay", "initial_accumulator_value"}),
          refuse=_refuse,
          examples={
            "plain": dict(lr=0.1),
            "all": dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-3),
          },
        ),
      ),
    ),
    twin_of=onnx_adagrad.RULE,
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(
        lambda h, R, T0, n: _feedback.adagrad(float(h["weight_decay"]), float(h["eps"]), R)
      ),
      hyper=dict(lr_decay=0.1, eps=1e-6, weight_decay=0.01),
      tiny_gradient={"weight_decay": 0.0},
      outputs=("X_new", "sum"),
      tests=registry.TestConfig(
        dict(lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1, eps=0.3), 0.05, ""
      ),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      edges=(
        registry.Edge("lr_decay=0", {"hyper": {"lr_decay": 0.0}}),
        registry.Edge("eps=0", {"hyper": {"eps": 0.0}}),
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
      ),
    ),
  )
)
