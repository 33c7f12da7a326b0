"""``torch.optim.RMSprop`` in PyTorch's order: plain, centred, with momentum."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _feedback, _numerics, _pytorch, registry

__all__ = [
  "PyTorchRMSpropScalars",
  "PyTorchRMSpropState",
  "pytorch_rmsprop",
  "pytorch_rmsprop_elementwise",
  "pytorch_rmsprop_scalars",
]


class PyTorchRMSpropScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_rmsprop`: ``-lr``, ``alpha`` and ``1 -
  alpha`` (a Python float64 number rounded once, as PyTorch's), ``eps``, ``weight_decay`` and
  ``momentum`` (None where they are the Python number 0), ``neg_zero``."""

  neg_lr: Any
  alpha: Any
  one_minus_alpha: Any
  eps: Any
  weight_decay: Any
  momentum: Any
  neg_zero: Any


def pytorch_rmsprop_scalars(
  lr: ArrayLike, count: ArrayLike, *, alpha: float, eps: float, weight_decay: float, momentum: float
) -> PyTorchRMSpropScalars:
  """``-lr``, ``1 - alpha`` (Python float64 for Python numbers, as PyTorch computes them); RMSprop
  has no step-dependent scalar (its ``step`` counts, and is read by nothing)."""
  return PyTorchRMSpropScalars(
    _pytorch.host_or_traced(lr, lambda r: -r),
    alpha,
    _pytorch.host_or_traced(alpha, lambda a: 1 - a),
    eps,
    None if _numerics.is_static_zero(weight_decay) else weight_decay,
    None if _numerics.is_static_zero(momentum) else momentum,
    _pytorch.neg_zero(count),
  )


def pytorch_rmsprop_elementwise(
  s: PyTorchRMSpropScalars,
  X: Array | None,
  G: Array,
  square_avg: Array,
  momentum_buffer: Array,
  grad_avg: Array,
  *,
  centered: bool,
  maximize: bool,
  lerp_small: bool | None,
  has_momentum: bool | None = True,
) -> tuple[Array, Array, Array, Array]:
  """``torch.optim.RMSprop``'s step on one tensor, in ``_single_tensor_rmsprop``'s order::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                       weight_decay != 0
      square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
      grad_avg.lerp_(grad, 1 - alpha)                                  centered
      avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()   centered
      avg = square_avg.sqrt()                                          otherwise
      avg = avg.add_(eps)
      buf.mul_(momentum).addcdiv_(grad, avg); param.add_(buf, alpha=-lr)   momentum > 0
      param.addcdiv_(grad, avg, value=-lr)                                 otherwise

  ``lerp_small`` is ``|1 - alpha| < 0.5``, the branch of PyTorch's lerp (None: decided at run
  time, for an injected ``alpha``); ``has_momentum`` is ``momentum > 0`` (None: decided at run
  time, for an injected ``momentum``). Without momentum
  (``s.momentum`` None) the buffer is returned as it is, and without ``centered`` ``grad_avg``:
  PyTorch keeps neither. Returns ``(U, square_avg_new, momentum_buffer_new, grad_avg_new)``.
  """
  dt = _pytorch.opmath(G.dtype, square_avg.dtype)
  x = None if X is None else X.astype(dt)
  g, nz = G.astype(dt), jnp.asarray(s.neg_zero, dt)
  if x is None and (s.weight_decay is not None or s.momentum is not None):
    raise ValueError("this update writes the parameters in place: call update(grads, state, params)")
  # `grad.add(param, alpha=...)`, `add_(eps)` and `param.add_(buf, alpha=-lr)` take their scalar in
  # the tensors' dtype (`_pytorch.alpha`); mul, lerp, addcmul and addcdiv in the opmath dtype.
  g_dtype = G.dtype if X is None else jnp.promote_types(G.dtype, X.dtype)
  s = s._replace(
    weight_decay=_pytorch.alpha(s.weight_decay, g_dtype),
    eps=_pytorch.alpha(s.eps, square_avg.dtype),
    neg_lr=s.neg_lr if s.momentum is None else _pytorch.alpha(s.neg_lr, g_dtype),
  )
  if maximize:
    g = -g
  if s.weight_decay is not None:
    assert x is not None  # checked above
    g = _pytorch.stored(x * s.weight_decay + g, g_dtype)
  decayed = _pytorch.stored(square_avg.astype(dt) * s.alpha, square_avg.dtype, nz)
  v = _pytorch.stored((s.one_minus_alpha * g) * g + decayed, square_avg.dtype)
  ga_new = grad_avg
  if centered:
    start = grad_avg.astype(dt)
    if lerp_small is None:  # alpha injected (traced): the branch PyTorch's lerp takes, at run time
      lerped = jnp.where(
        jnp.abs(s.one_minus_alpha) < 0.5,
        _pytorch.lerp(start, g, s.one_minus_alpha, small=True),
        _pytorch.lerp(start, g, s.one_minus_alpha, small=False),
      )
    else:
      lerped = _pytorch.lerp(start, g, s.one_minus_alpha, small=lerp_small)
    ga = _pytorch.stored(lerped, grad_avg.dtype)
    ga_new = ga.astype(grad_avg.dtype)
    variance = _pytorch.stored((-ga) * ga + v, square_avg.dtype)
    root = _pytorch.stored(_numerics.sqrt(variance), square_avg.dtype)
  else:
    root = _pytorch.stored(_numerics.sqrt(v), square_avg.dtype)
  avg = _pytorch.stored(root + s.eps, square_avg.dtype, nz)
  plain = None if has_momentum is True else _pytorch.added(x, (s.neg_lr * g) / avg, X, dt, G)
  if s.momentum is None or has_momentum is False:
    assert plain is not None
    return plain, v.astype(square_avg.dtype), momentum_buffer, ga_new
  assert x is not None and X is not None  # checked above
  b = _pytorch.stored(momentum_buffer.astype(dt) * s.momentum, momentum_buffer.dtype, nz)
  b = _pytorch.stored(g / avg + b, momentum_buffer.dtype)
  U = _pytorch.in_place(b * s.neg_lr + x, X)
  buf_new = b.astype(momentum_buffer.dtype)
  if has_momentum is None:  # momentum injected (traced): PyTorch's `if momentum > 0`, at run time
    assert plain is not None
    on = s.momentum > 0
    U, buf_new = jnp.where(on, U, plain.astype(U.dtype)), jnp.where(on, buf_new, momentum_buffer)
  return U, v.astype(square_avg.dtype), buf_new, ga_new


class PyTorchRMSpropState(NamedTuple):
  """State of :func:`pytorch_rmsprop`: ``count`` (PyTorch's ``step``, the updates done),
  ``square_avg``, ``momentum_buffer`` (zeros, unused, without momentum, where PyTorch keeps none)
  and ``grad_avg`` (zeros, unused, unless ``centered``)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  square_avg: optax.Updates
  momentum_buffer: optax.Updates
  grad_avg: optax.Updates


def pytorch_rmsprop(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  alpha: float = 0.99,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  momentum: float = 0.0,
  centered: bool = False,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.RMSprop``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_rmsprop``)::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                       weight_decay != 0
      square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
      grad_avg.lerp_(grad, 1 - alpha)                                  centered
      avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()   centered
      avg = square_avg.sqrt()                                          otherwise
      avg = avg.add_(eps)
      buf.mul_(momentum).addcdiv_(grad, avg); param.add_(buf, alpha=-lr)   momentum > 0
      param.addcdiv_(grad, avg, value=-lr)                                 otherwise

  Not Optax's ``optax.rmsprop``, which adds ``eps`` inside the square root (docs/from_optax.md).
  ``1 - alpha`` is a Python float64 number rounded once, as in PyTorch. Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule.
    alpha: the decay of the running mean of squares, in ``[0, 1]``.
    eps: added after the square root, ``>= 0``.
    weight_decay: L2 coefficient added to the gradient, ``>= 0``.
    momentum: in ``[0, 1]``; 0: no momentum buffer (PyTorch keeps none). Injected
      (``optax.inject_hyperparams``), PyTorch's ``momentum > 0`` is taken at run time, and
      the derivative with respect to it at exactly 0 is that of the branch without (0).
    centered: divide by the root of the variance (the running mean of squares minus the
      square of the running mean of the gradient, ``grad_avg``).
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of the state tensors; default each parameter's (PyTorch's).

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_rmsprop(0.01, alpha=0.75, eps=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)  # 1 - 0.01 * 3 / sqrt(0.25 * 9): 1 - 0.02
    Array([0.98, 2.02], dtype=float32)
  """
  hyper = dict(
    alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered, maximize=maximize
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  numbers = {k: hyper[k] for k in ("alpha", "eps", "weight_decay", "momentum")}
  centered, maximize = hyper["centered"], hyper["maximize"]
  alpha = hyper["alpha"]
  # The lerp's branch and `momentum > 0`, where known when the update is traced (else at run time:
  # optax.inject_hyperparams hands them in as arrays).
  small = None if _checks.is_traced(alpha) else bool(abs(1 - alpha) < 0.5)
  momentum = hyper["momentum"]
  has_momentum = None if _checks.is_traced(momentum) else bool(momentum > 0)
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, square_avg, buf, grad_avg: rule.elementwise(
      s,
      X,
      G,
      square_avg,
      buf,
      grad_avg,
      centered=centered,
      maximize=maximize,
      lerp_small=small,
      has_momentum=has_momentum,
    ),
  )


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """Through ``weight_decay``: ``R g / avg`` moves by ``R c e / eps`` through ``g`` and by as much
  again through ``square_avg`` (as Adagrad's); with momentum the buffer sums it with weights
  ``momentum^j``, ``1 / (1 - momentum)`` more (a bound: 0 for ``eps = 0`` is not one)."""
  c, momentum = float(h["weight_decay"]), float(h["momentum"])
  return _feedback.adagrad(c, float(h["eps"]), R) / (1 - momentum) if c else 0.0


RULE = registry.register(
  registry.Rule(
    name="pytorch_rmsprop",
    transform=pytorch_rmsprop,
    state=PyTorchRMSpropState,
    fields=(
      registry.Field("square_avg", "square_avg", second_moment=True),
      registry.Field("momentum_buffer", "momentum_buffer"),
      # A running mean of the gradient whose square stays below the mean of its squares.
      registry.Field("grad_avg", "grad_avg", root_of="square_avg"),
    ),
    hyperparameters={
      "alpha": registry.Hyperparameter(_checks.decay),
      "eps": registry.Hyperparameter(_checks.epsilon),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "momentum": registry.Hyperparameter(_checks.decay),
      "centered": registry.Hyperparameter(_checks.flag, static=True),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_rmsprop_scalars,
    elementwise=pytorch_rmsprop_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    params_for=("weight_decay", "momentum"),
    bindings=(
      registry.Binding("optax", "optax.rmsprop"),  # not the same rule: eps inside the root
      registry.Binding(
        "torch",
        "RMSprop",
        torch=registry.TorchOptimizer(
          options=frozenset({"alpha", "eps", "weight_decay", "momentum", "centered", "capturable"}),
          signature=frozenset({"alpha", "centered"}),
          optional={"momentum_buffer": "momentum", "grad_avg": "centered"},
          examples={
            "plain": dict(lr=0.01, alpha=0.9, eps=1e-3),
            "centered": dict(lr=0.01, alpha=0.9, eps=1e-3, centered=True, weight_decay=0.05),
            "momentum": dict(lr=0.01, alpha=0.8, eps=1e-3, momentum=0.9, maximize=True),
            "all": dict(lr=0.01, alpha=0.3, eps=1e-3, momentum=0.5, centered=True, weight_decay=0.1),
          },
        ),
      ),
    ),
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(_gain),
      hyper=dict(alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.9, centered=True),
      tiny_gradient={"weight_decay": 0.0},
      outputs=("X_new", "square_avg", "momentum_buffer", "grad_avg"),
      tests=registry.TestConfig(dict(alpha=0.9, eps=0.3, weight_decay=0.01, momentum=0.5, centered=True)),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      edges=(
        registry.Edge("centered=0", {"hyper": {"centered": False}}),
        registry.Edge("momentum=0", {"hyper": {"momentum": 0.0}}),
        registry.Edge("momentum=0,centered=0", {"hyper": {"momentum": 0.0, "centered": False}}),
        registry.Edge("alpha=0.3", {"hyper": {"alpha": 0.3}}),  # lerp's other branch (weight 0.7)
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
        registry.Edge("eps=0", {"hyper": {"eps": 0.0}}),
        # The mean of the gradient near the root of the mean of its squares: the variance cancels.
        registry.Edge("state=tight", {"state": "tight"}),
      ),
    ),
  )
)
