"""``torch.optim.RAdam`` in PyTorch's order: the rectified Adam, its branch on ``rho_t > 5`` per step."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _feedback, _numerics, _pytorch, registry
from onnx_optax.rules import torch_adam

__all__ = [
  "PyTorchRAdamScalars",
  "PyTorchRAdamState",
  "pytorch_radam",
  "pytorch_radam_elementwise",
  "pytorch_radam_scalars",
]


class PyTorchRAdamScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_radam`: ``lr``, ``1 - beta1``, ``beta2``,
  ``1 - beta2``, ``eps``, AdamW's ``1 - lr * weight_decay`` (None without decoupled decay), the
  coupled ``weight_decay`` (None without), ``bias_correction1``, ``bias_correction2 ** 0.5``,
  ``rect`` and ``rectify`` (``rho_t > 5``, a bool), ``neg_zero``."""

  lr: Any
  one_minus_beta1: Any
  beta2: Any
  one_minus_beta2: Any
  eps: Any
  decay_factor: Any
  weight_decay: Any
  bias_correction1: Any
  bias_correction2_sqrt: Any
  rect: Any
  rectify: Any
  neg_zero: Any


def rho(beta2: float, step: Array, bias_correction2: Array) -> tuple[Array, Array]:
  """``(rho_t, rect)`` as ``_single_tensor_radam`` computes them (Python float64 there), ``step``
  and ``bias_correction2`` in the scalar dtype::

      rho_inf = 2 / (1 - beta2) - 1
      rho_t   = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
      rect    = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5

  ``beta2 ** step`` is PyTorch's power in float64; in float32 (without ``jax_enable_x64``) ``1 -
  bias_correction2``. ``rect`` is 0 where ``rho_t <= 5`` (PyTorch computes it only past 5; nothing reads it
  there).
  """
  dtype = step.dtype
  rho_inf = 2 / (1 - beta2) - 1  # host float64, as PyTorch's
  power = jnp.asarray(beta2, dtype) ** step if dtype == jnp.float64 else 1 - bias_correction2
  rho_t = jnp.asarray(rho_inf, dtype) - 2 * step * power / bias_correction2
  below = (rho_inf - 4) * (rho_inf - 2)  # host float64: PyTorch's ((rho_inf - 4) * (rho_inf - 2)) first
  ratio = (rho_t - 4) * (rho_t - 2) * jnp.asarray(rho_inf, dtype) / (jnp.asarray(below, dtype) * rho_t)
  return rho_t, jnp.where(rho_t > 5, jnp.sqrt(jnp.where(ratio > 0, ratio, 0 * ratio)), 0 * ratio)


def pytorch_radam_scalars(
  lr: ArrayLike,
  count: ArrayLike,
  *,
  beta1: float,
  beta2: float,
  eps: float,
  weight_decay: float,
  decoupled_weight_decay: bool,
) -> PyTorchRAdamScalars:
  """PyTorch's scalars with ``step = count + 1``: ``bias_correction1 = 1 - beta1 ** step``,
  ``bias_correction2 = 1 - beta2 ** step``, its root, ``rho_t`` and ``rect`` (``rho``), and
  the hyperparameters' ``1 - beta1``, ``1 - beta2``, ``1 - lr * weight_decay`` (Python float64
  for Python numbers, as PyTorch computes them)."""
  dtype = _pytorch.scalar_dtype()
  step = jnp.asarray(count, dtype) + 1
  bias_correction1 = _pytorch.power_complement(beta1, step, dtype)
  bias_correction2 = _pytorch.power_complement(beta2, step, dtype)
  rho_t, rect = rho(beta2, step, bias_correction2)
  decays = not _numerics.is_static_zero(weight_decay)
  decay_factor = None
  if decays and decoupled_weight_decay:
    decay_factor = (
      1 - float(lr) * float(weight_decay)
      if isinstance(lr, numbers.Real)
      else 1 - jnp.asarray(lr, dtype) * weight_decay
    )
  return PyTorchRAdamScalars(
    lr,
    1 - beta1,
    beta2,
    1 - beta2,
    eps,
    decay_factor,
    weight_decay if decays and not decoupled_weight_decay else None,
    bias_correction1,
    jnp.sqrt(bias_correction2),
    rect,
    rho_t > 5,
    _pytorch.neg_zero(count),
  )


def pytorch_radam_elementwise(
  s: PyTorchRAdamScalars,
  X: Array | None,
  G: Array,
  exp_avg: Array,
  exp_avg_sq: Array,
  *,
  maximize: bool,
  lerp_small: bool,
) -> tuple[Array, Array, Array]:
  """``torch.optim.RAdam``'s step on one tensor, in ``_single_tensor_radam``'s order::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)               decoupled, weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)      coupled, weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      bias_corrected_exp_avg = exp_avg / bias_correction1
      rho_t > 5:  adaptive = exp_avg_sq.sqrt().add_(eps).reciprocal() * bias_correction2 ** 0.5
                  param.add_(bias_corrected_exp_avg * lr * adaptive * rect, alpha=-1.0)
      otherwise:  param.add_(bias_corrected_exp_avg * lr, alpha=-1.0)

  (``float / tensor`` is ``tensor.reciprocal() * float`` in PyTorch.) Each product is stored in
  the tensors' dtype. ``lerp_small`` is ``|1 - beta1| < 0.5``, the branch of PyTorch's lerp.
  Returns ``(U, exp_avg_new, exp_avg_sq_new)``.
  """
  s, dt, nz, x, g, m, v = torch_adam.moments(
    s, X, G, exp_avg, exp_avg_sq, maximize=maximize, lerp_small=lerp_small
  )
  corrected = _pytorch.stored(_pytorch.divide_by_scalar(m, s.bias_correction1), exp_avg.dtype)
  scaled = _pytorch.stored(corrected * s.lr, exp_avg.dtype, nz)
  root = _pytorch.stored(_numerics.sqrt(v), exp_avg_sq.dtype)
  # The -0.0 guard (``_pytorch.stored``) where XLA could otherwise change a rounding: on the
  # products that reach an addition (LLVM would contract them), and on ``root + eps`` (with
  # ``eps=0`` folded, XLA rewrites ``1 / sqrt(v)`` as ``rsqrt(v)``, not correctly rounded).
  # The reciprocal and the products that feed a product need none.
  root = _pytorch.stored(root + s.eps, exp_avg_sq.dtype, nz)
  reciprocal = _pytorch.stored(1 / root, exp_avg_sq.dtype)
  adaptive = _pytorch.stored(reciprocal * s.bias_correction2_sqrt, exp_avg_sq.dtype)
  rectified = _pytorch.stored(scaled * adaptive, exp_avg.dtype)
  rectified = _pytorch.stored(rectified * s.rect, exp_avg.dtype, nz)
  step = jnp.where(s.rectify, rectified, scaled)
  m_new, v_new = m.astype(exp_avg.dtype), v.astype(exp_avg_sq.dtype)
  if s.decay_factor is not None or G.dtype != dt:  # written in place: X_new - X
    assert x is not None and X is not None  # checked above
    return _pytorch.in_place(x - step, X), m_new, v_new
  return -step, m_new, v_new


class PyTorchRAdamState(NamedTuple):
  """State of :func:`pytorch_radam`: ``count`` (PyTorch's ``step``, the updates done), ``exp_avg``
  and ``exp_avg_sq``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  exp_avg: optax.Updates
  exp_avg_sq: optax.Updates


def pytorch_radam(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  betas: tuple[float, float] = (0.9, 0.999),
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  decoupled_weight_decay: bool = False,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.RAdam``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_radam``), with
  ``step = count + 1``::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)             decoupled, weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)    coupled, weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      bias_correction1 = 1 - beta1 ** step;  bias_correction2 = 1 - beta2 ** step
      rho_inf = 2 / (1 - beta2) - 1
      rho_t = rho_inf - 2 * step * beta2 ** step / bias_correction2
      rect = ((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t)) ** 0.5
      adaptive = bias_correction2 ** 0.5 / (exp_avg_sq.sqrt() + eps)
      rho_t > 5:  param -= exp_avg / bias_correction1 * lr * adaptive * rect
      otherwise:  param -= exp_avg / bias_correction1 * lr

  The branch is PyTorch's, taken at each step (``rho_t`` crosses 5 at step 6 for ``beta2 =
  0.999``: the first five updates are SGD with momentum). The step-dependent scalars are Python
  float64 in PyTorch: float64 under ``jax_enable_x64`` (PyTorch's numbers), else float32
  (``rho_t`` then loses a few digits to cancellation, docs/spec.md). Not Optax's
  ``optax.radam`` (docs/from_optax.md). Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule.
    betas: ``(beta1, beta2)``, Python numbers, ``beta1`` in ``[0, 1)``, ``beta2`` in ``[0, 1)``.
    eps: added to the root of ``exp_avg_sq``, ``>= 0``.
    weight_decay: ``>= 0``; coupled (L2, added to the gradient) unless ``decoupled_weight_decay``.
    decoupled_weight_decay: AdamW's decay, ``param * (1 - lr * weight_decay)`` first.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of ``exp_avg`` and ``exp_avg_sq``; default each parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_radam(0.1)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> # step 1: rho_t = 1, SGD with the corrected momentum (float32 without jax_enable_x64, whose
    >>> # scalars are float32: 1 ulp from PyTorch's 0.7 in the first element; under x64, PyTorch's)
    >>> optax.apply_updates(params, updates).round(4)
    Array([0.7 , 2.05], dtype=float32)
  """
  hyper = dict(
    betas=betas,
    eps=eps,
    weight_decay=weight_decay,
    decoupled_weight_decay=decoupled_weight_decay,
    maximize=maximize,
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _betas(name: str, value: Any) -> tuple[float, float]:
  """PyTorch's ``betas``, checked as Adam's (``beta2 < 1``: ``rho_inf = 2 / (1 - beta2) - 1``)."""
  return torch_adam._betas(name, value)


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  (beta1, beta2), maximize = hyper["betas"], hyper["maximize"]
  numbers_ = dict(
    beta1=beta1,
    beta2=beta2,
    eps=hyper["eps"],
    weight_decay=hyper["weight_decay"],
    decoupled_weight_decay=hyper["decoupled_weight_decay"],
  )
  small = abs(1 - beta1) < 0.5
  return (
    lambda R, T: rule.scalars(R, T, **numbers_),
    lambda s, X, G, exp_avg, exp_avg_sq: rule.elementwise(
      s, X, G, exp_avg, exp_avg_sq, maximize=maximize, lerp_small=small
    ),
  )


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """Decoupled: ``R weight_decay``. Coupled: at most Adam's (``rect <= 1``; the unrectified
  steps ``R c / bias_correction1``, below it for the ``eps`` of the tests)."""
  c = float(h["weight_decay"])
  if h["decoupled_weight_decay"]:
    return R * c
  beta1 = float(h["betas"][0])
  bias_correction1 = 1 - beta1 ** _feedback.bias_steps(T0 + 1, steps)
  rate = R / float(min(bias_correction1))
  return max(_feedback.adam(c, float(h["eps"]), rate), rate * c)


def _x_roundings(h: Any) -> int:
  """A decoupled decay subtracts twice per update."""
  return 4 if float(h["weight_decay"]) and h["decoupled_weight_decay"] else 2


_STEP_OF_RECTIFICATION = 5  # rho_t > 5 first at count 5 (step 6) for beta2 = 0.999

RULE = registry.register(
  registry.Rule(
    name="pytorch_radam",
    transform=pytorch_radam,
    state=PyTorchRAdamState,
    fields=(
      registry.Field("exp_avg", "exp_avg"),
      registry.Field("exp_avg_sq", "exp_avg_sq", second_moment=True),
    ),
    hyperparameters={
      "betas": registry.Hyperparameter(_betas, static=True),
      "eps": registry.Hyperparameter(_checks.epsilon),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "decoupled_weight_decay": registry.Hyperparameter(_checks.flag, static=True),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_radam_scalars,
    elementwise=pytorch_radam_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    params_for=("weight_decay",),
    bindings=(
      registry.Binding("optax", "optax.radam"),  # not the same rule: its rectification's threshold
      registry.Binding(
        "torch",
        "RAdam",
        torch=registry.TorchOptimizer(
          options=frozenset({"betas", "eps", "weight_decay", "decoupled_weight_decay", "capturable"}),
          # betas without amsgrad (Adam's, AdamW's) nor momentum_decay (NAdam's): RAdam's alone.
          signature=frozenset({"betas", "decoupled_weight_decay", "capturable"}),
          numbers=frozenset({"lr", "betas", "eps", "weight_decay"}),
          capturable=(
            "computes step, rho_t and rect as tensors in the step's dtype (float32), and adds 1.0 "
            "where rho_t <= 5 through torch.where, not in Python float64"
          ),
          examples={
            "plain": dict(lr=0.01),
            "coupled": dict(lr=0.01, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.05),
            "decoupled": dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
            "all": dict(
              lr=0.01,
              betas=(0.3, 0.9),
              eps=1e-3,
              weight_decay=0.05,
              decoupled_weight_decay=True,
              maximize=True,
            ),
          },
        ),
      ),
    ),
    twin_of=None,
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(_gain, lambda h: float(h["betas"][0]), _x_roundings),
      hyper=dict(betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, decoupled_weight_decay=False),
      tiny_gradient={"weight_decay": 0.0},
      outputs=("X_new", "exp_avg", "exp_avg_sq"),
      # lr 0.005: the unrectified steps (exp_avg / bias_correction1 * lr, no root to scale them)
      # keep X_new within a factor 2 of X, as the tests' bit-for-bit comparisons need.
      tests=registry.TestConfig(
        dict(betas=(0.9, 0.99), eps=0.3, weight_decay=0.01, decoupled_weight_decay=False), 0.005, ""
      ),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      edges=(
        # The grid's T: either side of the step where rho_t crosses 5 (beta2 = 0.999: step 6).
        registry.Edge(f"T={_STEP_OF_RECTIFICATION - 1}", {"T": _STEP_OF_RECTIFICATION - 1}),
        registry.Edge(f"T={_STEP_OF_RECTIFICATION}", {"T": _STEP_OF_RECTIFICATION}),
        registry.Edge("decoupled_weight_decay=1", {"hyper": {"decoupled_weight_decay": True}}),
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
        registry.Edge("betas[0]=0.3", {"hyper": {"betas": (0.3, 0.999)}}),  # the lerp's other branch
        registry.Edge("eps=0", {"hyper": {"eps": 0.0}}),
        # The rectified step at eps=0 (folded: XLA's rsqrt rewrite, were sqrt(v) + eps not
        # guarded) on parameters smaller than the step: U's last bits reach X + U.
        registry.Edge(
          "eps=0,T=1000,R=1,|X|=0.001", {"T": 1000, "R": 1.0, "hyper": {"eps": 0.0}, "x_scale": 0.001}
        ),
      ),
    ),
  )
)
