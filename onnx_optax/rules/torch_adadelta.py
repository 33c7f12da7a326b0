"""``torch.optim.Adadelta`` in PyTorch's order."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _numerics, _pytorch, registry

__all__ = [
  "PyTorchAdadeltaScalars",
  "PyTorchAdadeltaState",
  "pytorch_adadelta",
  "pytorch_adadelta_elementwise",
  "pytorch_adadelta_scalars",
]


class PyTorchAdadeltaScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_adadelta`: ``-lr``, ``rho`` and ``1 - rho``
  (a Python float64 number rounded once, as PyTorch's), ``eps``, ``weight_decay`` (None where it is
  the Python number 0), ``neg_zero``."""

  neg_lr: Any
  rho: Any
  one_minus_rho: Any
  eps: Any
  weight_decay: Any
  neg_zero: Any


def pytorch_adadelta_scalars(
  lr: ArrayLike, count: ArrayLike, *, rho: float, eps: float, weight_decay: float
) -> PyTorchAdadeltaScalars:
  """``-lr`` and ``1 - rho`` (Python float64 for Python numbers, as PyTorch computes them); Adadelta
  has no step-dependent scalar (its ``step`` counts, and is read by nothing)."""
  return PyTorchAdadeltaScalars(
    _pytorch.host_or_traced(lr, lambda r: -r),
    rho,
    _pytorch.host_or_traced(rho, lambda r: 1 - r),
    eps,
    None if _numerics.is_static_zero(weight_decay) else weight_decay,
    _pytorch.neg_zero(count),
  )


def pytorch_adadelta_elementwise(
  s: PyTorchAdadeltaScalars,
  X: Array | None,
  G: Array,
  square_avg: Array,
  acc_delta: Array,
  *,
  maximize: bool,
) -> tuple[Array, Array, Array]:
  """``torch.optim.Adadelta``'s step on one tensor, in ``_single_tensor_adadelta``'s order::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                       weight_decay != 0
      square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
      std = square_avg.add(eps).sqrt_()
      delta = acc_delta.add(eps).sqrt_()
      delta.div_(std).mul_(grad)
      acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
      param.add_(delta, alpha=-lr)

  The last is one fused multiply-add into the parameters, written in place: ``U`` is ``X_new - X``
  (``_pytorch.in_place``), so ``update`` always needs the parameters. Returns ``(U,
  square_avg_new, acc_delta_new)``.
  """
  if X is None:
    raise ValueError("this update writes the parameters in place: call update(grads, state, params)")
  dt = _pytorch.opmath(G.dtype, square_avg.dtype, acc_delta.dtype)
  x, g, nz = X.astype(dt), G.astype(dt), jnp.asarray(s.neg_zero, dt)
  # `grad.add(param, alpha=...)`, `add(eps)` and `param.add_(delta, alpha=-lr)` take their scalar
  # in the tensors' dtype (`_pytorch.alpha`); mul, div and addcmul in the opmath dtype.
  g_dtype = jnp.promote_types(G.dtype, X.dtype)
  s = s._replace(
    weight_decay=_pytorch.alpha(s.weight_decay, g_dtype),
    neg_lr=_pytorch.alpha(s.neg_lr, jnp.promote_types(X.dtype, acc_delta.dtype)),
  )
  eps_square, eps_acc = _pytorch.alpha(s.eps, square_avg.dtype), _pytorch.alpha(s.eps, acc_delta.dtype)
  if maximize:
    g = -g
  if s.weight_decay is not None:
    g = _pytorch.stored(x * s.weight_decay + g, g_dtype)
  decayed = _pytorch.stored(square_avg.astype(dt) * s.rho, square_avg.dtype, nz)
  v = _pytorch.stored((s.one_minus_rho * g) * g + decayed, square_avg.dtype)
  # `+ nz` (a run-time -0.0, exact) keeps XLA from rewriting `root / sqrt(...)` as `root * rsqrt(...)`,
  # which is not correctly rounded.
  std = _pytorch.stored(
    _numerics.sqrt(_pytorch.stored(v + eps_square, square_avg.dtype)), square_avg.dtype, nz
  )
  root = _pytorch.stored(
    _numerics.sqrt(_pytorch.stored(acc_delta.astype(dt) + eps_acc, acc_delta.dtype)), acc_delta.dtype
  )
  delta = _pytorch.stored(_pytorch.stored(root / std, acc_delta.dtype) * g, acc_delta.dtype)
  acc_decayed = _pytorch.stored(acc_delta.astype(dt) * s.rho, acc_delta.dtype, nz)
  acc_new = _pytorch.stored((s.one_minus_rho * delta) * delta + acc_decayed, acc_delta.dtype)
  U = _pytorch.in_place(delta * s.neg_lr + x, X)
  return U, v.astype(square_avg.dtype), acc_new.astype(acc_delta.dtype)


class PyTorchAdadeltaState(NamedTuple):
  """State of :func:`pytorch_adadelta`: ``count`` (PyTorch's ``step``, the updates done),
  ``square_avg`` (the running mean of the squared gradient) and ``acc_delta`` (of the squared
  step)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  square_avg: optax.Updates
  acc_delta: optax.Updates


def pytorch_adadelta(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  rho: float = 0.9,
  eps: float = 1e-6,
  weight_decay: float = 0.0,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Adadelta``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_adadelta``)::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                       weight_decay != 0
      square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
      std = square_avg.add(eps).sqrt_()
      delta = acc_delta.add(eps).sqrt_()
      delta.div_(std).mul_(grad)
      acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
      param.add_(delta, alpha=-lr)

  Optax's ``optax.adadelta`` is the same rule (no ``maximize``) in another order: ``(1 - rho) g**2 +
  rho e``, not an ``addcmul_``, and the step scaled by ``-lr`` then added to the parameters (two
  roundings where PyTorch's ``add_`` fuses them; docs/from_optax.md). ``1 - rho`` is a Python
  float64 number rounded once, as in PyTorch. Defaults are PyTorch's (``lr = 1``).

  Args:
    learning_rate: ``lr``, a float or an Optax schedule (PyTorch's default 1.0).
    rho: the decay of both running means, in ``[0, 1]``.
    eps: added to each running mean before its square root, ``>= 0``.
    weight_decay: L2 coefficient added to the gradient, ``>= 0``.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of the state tensors; default each parameter's (PyTorch's).

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adadelta(1.0, rho=0.75, eps=0.25)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, 0.0]), state, params)
    >>> optax.apply_updates(params, updates)  # 1 - sqrt(0.25) / sqrt(0.25 * 9 + 0.25) * 3
    Array([0.05131674, 2.        ], dtype=float32)
  """
  hyper = dict(rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  numbers = {k: hyper[k] for k in ("rho", "eps", "weight_decay")}
  maximize = hyper["maximize"]
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, square_avg, acc_delta: rule.elementwise(
      s, X, G, square_avg, acc_delta, maximize=maximize
    ),
  )


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """Through ``weight_decay``: ``lr * sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g`` moves by
  ``lr c e sqrt(acc_delta + eps) / sqrt(eps)`` through ``g``, and by as much again through
  ``square_avg`` and through ``acc_delta``; taken with ``acc_delta <= 1`` (the tests' states and
  steps keep it there: ``|delta| <= sqrt(acc_delta + eps) / sqrt(eps) |g'|`` otherwise)."""
  c, eps = float(h["weight_decay"]), float(h["eps"])
  return 3 * R * c * math.sqrt((1 + eps) / eps) if c else 0.0


RULE = registry.register(
  registry.Rule(
    name="pytorch_adadelta",
    transform=pytorch_adadelta,
    state=PyTorchAdadeltaState,
    fields=(
      registry.Field("square_avg", "square_avg", second_moment=True),
      registry.Field("acc_delta", "acc_delta", second_moment=True),
    ),
    hyperparameters={
      "rho": registry.Hyperparameter(_checks.decay),
      "eps": registry.Hyperparameter(_checks.epsilon),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_adadelta_scalars,
    elementwise=pytorch_adadelta_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    params_for=("weight_decay",),
    always_reads_params="Its update writes the parameters in place (PyTorch's param.add_)",
    bindings=(
      registry.Binding("optax", "optax.adadelta"),  # the same rule in another order (docs/from_optax.md)
      registry.Binding(
        "torch",
        "Adadelta",
        torch=registry.TorchOptimizer(
          options=frozenset({"rho", "eps", "weight_decay", "capturable"}),
          signature=frozenset({"rho"}),
          examples={
            "plain": dict(lr=1.0),
            "rho": dict(lr=0.5, rho=0.5, eps=1e-3),
            "weight_decay": dict(lr=1.0, weight_decay=0.1),
            "maximize": dict(lr=1.0, maximize=True),
            "all": dict(lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.05, maximize=True),
          },
        ),
      ),
    ),
    twin_of=None,
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(_gain),
      hyper=dict(rho=0.9, eps=1e-6, weight_decay=0.01),
      tiny_gradient={"weight_decay": 0.0},
      outputs=("X_new", "square_avg", "acc_delta"),
      tests=registry.TestConfig(dict(rho=0.9, eps=0.3, weight_decay=0.01), 0.05),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      edges=(
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
        registry.Edge("rho=0", {"hyper": {"rho": 0.0}}),  # no memory: square_avg = grad^2
        registry.Edge("rho=1", {"hyper": {"rho": 1.0}}),  # 1 - rho = 0: the means never move
        registry.Edge("eps=0", {"hyper": {"eps": 0.0}}),
      ),
    ),
  )
)
