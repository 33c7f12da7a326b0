"""``torch.optim.NAdam`` in PyTorch's order: Adam with Nesterov momentum, its ``mu_product`` per tensor."""

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
  "PyTorchNAdamScalars",
  "PyTorchNAdamState",
  "pytorch_nadam",
  "pytorch_nadam_elementwise",
  "pytorch_nadam_scalars",
]


class PyTorchNAdamScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_nadam`: ``1 - beta1``, ``beta2``, ``1 -
  beta2``, ``eps``, AdamW's ``1 - lr * weight_decay`` (None without decoupled decay), the coupled
  ``weight_decay`` (None without), ``bias_correction2``, ``mu``, ``mu_next``, the numerators
  ``-lr * (1 - mu)`` and ``-lr * mu_next`` of the two step sizes, ``neg_zero``."""

  one_minus_beta1: Any
  beta2: Any
  one_minus_beta2: Any
  eps: Any
  decay_factor: Any
  weight_decay: Any
  bias_correction2: Any
  mu: Any
  mu_next: Any
  neg_lr_one_minus_mu: Any
  neg_lr_mu_next: Any
  neg_zero: Any


def momentum_cache(beta1: float, momentum_decay: Any, step: Array) -> Array:
  """``mu = beta1 * (1 - 0.5 * 0.96 ** (step * momentum_decay))`` in ``step``'s dtype (Python float64
  in PyTorch: float64 under ``jax_enable_x64``, else float32)."""
  dtype = step.dtype
  power = jnp.asarray(0.96, dtype) ** (step * jnp.asarray(momentum_decay, dtype))
  return jnp.asarray(beta1, dtype) * (1 - 0.5 * power)


def pytorch_nadam_scalars(
  lr: ArrayLike,
  count: ArrayLike,
  *,
  beta1: float,
  beta2: float,
  eps: float,
  weight_decay: float,
  momentum_decay: float,
  decoupled_weight_decay: bool,
) -> PyTorchNAdamScalars:
  """PyTorch's scalars with ``step = count + 1``: ``bias_correction2 = 1 - beta2 ** step``, ``mu``
  and ``mu_next`` (``momentum_cache`` at ``step`` and ``step + 1``), ``-lr * (1 - mu)`` and ``-lr
  * mu_next``, and the hyperparameters' ``1 - beta1``, ``1 - beta2``, ``1 - lr * weight_decay``
  (Python float64 for Python numbers, as PyTorch computes them). The divisions by ``1 -
  mu_product`` are per tensor (:func:`pytorch_nadam_elementwise`)."""
  dtype = _pytorch.scalar_dtype()
  step = jnp.asarray(count, dtype) + 1
  nz = _pytorch.neg_zero(count)
  # + -0.0: stored, as PyTorch's Python floats are, not contracted into the 1 - mu that follows
  mu = momentum_cache(beta1, momentum_decay, step) + nz
  mu_next = momentum_cache(beta1, momentum_decay, step + 1) + nz
  decays = not _numerics.is_static_zero(weight_decay)
  decay_factor = None
  if decays and decoupled_weight_decay:
    decay_factor = (
      1 - float(lr) * float(weight_decay)
      if isinstance(lr, numbers.Real)
      else 1 - jnp.asarray(lr, dtype) * weight_decay
    )
  neg_lr = -float(lr) if isinstance(lr, numbers.Real) else -jnp.asarray(lr, dtype)
  return PyTorchNAdamScalars(
    1 - beta1,
    beta2,
    1 - beta2,
    eps,
    decay_factor,
    weight_decay if decays and not decoupled_weight_decay else None,
    _pytorch.power_complement(beta2, step, dtype),
    mu,
    mu_next,
    neg_lr * (1 - mu),
    neg_lr * mu_next,
    nz,
  )


def pytorch_nadam_elementwise(
  s: PyTorchNAdamScalars,
  X: Array | None,
  G: Array,
  mu_product: Array,
  exp_avg: Array,
  exp_avg_sq: Array,
  *,
  maximize: bool,
  lerp_small: bool,
) -> tuple[Array, Array, Array, Array]:
  """``torch.optim.NAdam``'s step on one tensor, in ``_single_tensor_nadam``'s order::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)               decoupled, weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)      coupled, weight_decay != 0
      mu_product *= mu                                in mu_product's own dtype
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      denom = exp_avg_sq.div(bias_correction2).sqrt().add_(eps)
      mu_product_next = mu_product.item() * mu_next
      param.addcdiv_(grad, denom, value=-lr * (1 - mu) / (1 - mu_product.item()))
      param.addcdiv_(exp_avg, denom, value=-lr * mu_next / (1 - mu_product_next))

  Each tensor operation is stored in its tensor's dtype. ``mu_product`` is one scalar per
  tensor, kept in PyTorch's scalar dtype (float32, float64 under a float64 default dtype) and
  multiplied there; the two step sizes are divided per tensor in the compute dtype (PyTorch's
  Python float64, rounded once by ``addcdiv_``). ``lerp_small`` is ``|1 - beta1| < 0.5``.
  Returns ``(X_new - X, mu_product_new, exp_avg_new, exp_avg_sq_new)``: two additions to the
  parameter, written in place.
  """
  if X is None:
    raise ValueError("NAdam adds to the parameters twice, in place: call update(grads, state, params)")
  s, dt, nz, x, g, m, v = torch_adam.moments(
    s, X, G, exp_avg, exp_avg_sq, maximize=maximize, lerp_small=lerp_small
  )
  assert x is not None  # X is given
  own = mu_product.dtype  # mu_product *= mu: a tensor of the scalar dtype times a Python float
  product = _pytorch.stored(mu_product * jnp.asarray(s.mu, own), own, nz.astype(own))
  denom = _pytorch.stored(_pytorch.divide_by_scalar(v, s.bias_correction2), exp_avg_sq.dtype)
  denom = _pytorch.stored(_numerics.sqrt(denom), exp_avg_sq.dtype)
  denom = _pytorch.stored(denom + s.eps, exp_avg_sq.dtype, nz)
  # The step sizes: Python floats in PyTorch (mu_product.item(), exact in the compute dtype).
  p = product.astype(dt)
  grad_size = s.neg_lr_one_minus_mu / (1 - p)
  product_next = _pytorch.stored(p * s.mu_next, dt, nz)  # stored: not contracted into 1 - it
  avg_size = s.neg_lr_mu_next / (1 - product_next)
  x = _pytorch.stored(x + (grad_size * g) / denom, G.dtype)  # addcdiv_: self + value * t1 / t2
  x = _pytorch.stored(x + (avg_size * m) / denom, G.dtype)
  return _pytorch.in_place(x, X), product, m.astype(exp_avg.dtype), v.astype(exp_avg_sq.dtype)


class PyTorchNAdamState(NamedTuple):
  """State of :func:`pytorch_nadam`: ``count`` (PyTorch's ``step``, the updates done), ``mu_product``
  (one scalar per parameter, in PyTorch's scalar dtype), ``exp_avg`` and ``exp_avg_sq``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  mu_product: optax.Updates
  exp_avg: optax.Updates
  exp_avg_sq: optax.Updates


def pytorch_nadam(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  betas: tuple[float, float] = (0.9, 0.999),
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  momentum_decay: float = 4e-3,
  decoupled_weight_decay: bool = False,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.NAdam``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_nadam``), with
  ``step = count + 1``::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)             decoupled, weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)    coupled, weight_decay != 0
      mu      = beta1 * (1 - 0.5 * 0.96 ** (step * momentum_decay))
      mu_next = beta1 * (1 - 0.5 * 0.96 ** ((step + 1) * momentum_decay))
      mu_product *= mu
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      denom = (exp_avg_sq / (1 - beta2 ** step)).sqrt() + eps
      param += -lr * (1 - mu) / (1 - mu_product) * grad / denom
      param += -lr * mu_next / (1 - mu_product * mu_next) * exp_avg / denom

  ``mu_product`` is one scalar per parameter, kept in PyTorch's scalar dtype (float32 unless
  carried as float64) whatever the parameter's; ``state_dtype`` applies to ``exp_avg`` and
  ``exp_avg_sq``. The step-dependent scalars are Python float64 in PyTorch: float64 under
  ``jax_enable_x64``, else float32; the two step sizes are divided by ``1 - mu_product`` in the
  parameter's compute dtype (float32 for float32 parameters even under x64: a few float32
  ulps from PyTorch's rounded float64). The update always reads the parameters (two in-place
  additions). Not Optax's ``optax.nadam`` (docs/from_optax.md). Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule.
    betas: ``(beta1, beta2)``, Python numbers, ``beta1`` in ``[0, 1)``, ``beta2`` in ``[0, 1)``.
    eps: added to the corrected root of ``exp_avg_sq``, ``>= 0``.
    weight_decay: ``>= 0``; coupled (L2, added to the gradient) unless ``decoupled_weight_decay``.
    momentum_decay: ``psi`` of the momentum schedule ``mu``, ``>= 0``.
    decoupled_weight_decay: AdamW's decay (NAdamW), ``param * (1 - lr * weight_decay)`` first.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of ``exp_avg`` and ``exp_avg_sq``; default each parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_nadam(0.1)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> state.mu_product
    Array(1., dtype=float32)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> [round(float(x), 4) for x in optax.apply_updates(params, updates)]  # PyTorch's, to 4 digits
    [0.8944, 2.1056]
  """
  hyper = dict(
    betas=betas,
    eps=eps,
    weight_decay=weight_decay,
    momentum_decay=momentum_decay,
    decoupled_weight_decay=decoupled_weight_decay,
    maximize=maximize,
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _betas(name: str, value: Any) -> tuple[float, float]:
  """PyTorch's ``betas``, checked as Adam's (``beta2 < 1``: the step divides by ``1 - beta2 ** step``)."""
  return torch_adam._betas(name, value)


def _momentum_decay(name: str, value: Any) -> Any:
  """``momentum_decay``, ``>= 0`` as PyTorch's constructor checks it (not a kind of ``_checks``: NAdam's
  own, the rate of the momentum schedule)."""
  why = (
    f"{name} is the rate of mu = beta1 * (1 - 0.5 * 0.96 ** (step * {name})): a negative one grows "
    f"0.96 ** (...) past 2 and turns mu negative; PyTorch refuses momentum_decay < 0"
  )
  return _checks.hyperparameter(name, value, minimum=0.0, why=why)


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  (beta1, beta2), maximize = hyper["betas"], hyper["maximize"]
  numbers_ = dict(
    beta1=beta1,
    beta2=beta2,
    eps=hyper["eps"],
    weight_decay=hyper["weight_decay"],
    momentum_decay=hyper["momentum_decay"],
    decoupled_weight_decay=hyper["decoupled_weight_decay"],
  )
  small = abs(1 - beta1) < 0.5
  return (
    lambda R, T: rule.scalars(R, T, **numbers_),
    lambda s, X, G, mu_product, exp_avg, exp_avg_sq: rule.elementwise(
      s, X, G, mu_product, exp_avg, exp_avg_sq, maximize=maximize, lerp_small=small
    ),
  )


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """Decoupled: ``R weight_decay``. Coupled: the two step sizes together, ``R (1 - mu) / (1 -
  mu_product) + R mu_next / (1 - mu_product mu_next)``, at most ``R (1 + 1 / (1 - beta1))``
  times Adam's ``c / eps`` gain of a corrected rate."""
  c = float(h["weight_decay"])
  if h["decoupled_weight_decay"]:
    return R * c
  beta1 = float(h["betas"][0])
  rate = R * (1 + 1 / (1 - beta1))
  return max(_feedback.adam(c, float(h["eps"]), rate), rate * c)


def _x_roundings(h: Any) -> int:
  """Two additions per update, a decoupled decay a third and a fourth."""
  return 6 if float(h["weight_decay"]) and h["decoupled_weight_decay"] else 4


RULE = registry.register(
  registry.Rule(
    name="pytorch_nadam",
    transform=pytorch_nadam,
    state=PyTorchNAdamState,
    fields=(
      registry.Field(
        "mu_product",
        "mu_product",
        initial=1.0,
        shape=registry.PER_TENSOR,
        dtypes=registry.TORCH_SCALAR_DTYPES,
        reach=(0.0, 1.0),
      ),
      registry.Field("exp_avg", "exp_avg"),
      registry.Field("exp_avg_sq", "exp_avg_sq", second_moment=True),
    ),
    hyperparameters={
      "betas": registry.Hyperparameter(_betas, static=True),
      "eps": registry.Hyperparameter(_checks.epsilon),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "momentum_decay": registry.Hyperparameter(_momentum_decay),
      "decoupled_weight_decay": registry.Hyperparameter(_checks.flag, static=True),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_nadam_scalars,
    elementwise=pytorch_nadam_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    params_for=("weight_decay",),
    always_reads_params="Its update writes the parameters in place (PyTorch's two addcdiv_)",
    bindings=(
      registry.Binding("optax", "optax.nadam"),  # not the same rule: no momentum schedule
      registry.Binding(
        "torch",
        "NAdam",
        torch=registry.TorchOptimizer(
          options=frozenset(
            {"betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "capturable"}
          ),
          signature=frozenset({"betas", "momentum_decay"}),
          numbers=frozenset({"lr", "betas", "eps", "weight_decay", "momentum_decay"}),
          capturable=(
            "computes mu, mu_next and the step sizes as tensors in the step's dtype (float32), "
            "multiplying the step size into the gradient before dividing by denom, not in Python "
            "float64 through addcdiv_'s value"
          ),
          # lr 2e-3 (NAdam's default): PyTorch's load_state_dict casts mu_product to the
          # parameter's dtype, so a float64 run reloaded from a file continues it in float64, not
          # in float32 as the run that never left PyTorch: about 1e-12 of the parameters at lr 0.01.
          examples={
            "plain": dict(lr=2e-3),
            "coupled": dict(lr=2e-3, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.05),
            "momentum_decay": dict(lr=2e-3, momentum_decay=0.3),
            "decoupled": dict(lr=2e-3, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
            "all": dict(
              lr=2e-3,
              betas=(0.3, 0.9),
              eps=1e-3,
              weight_decay=0.05,
              momentum_decay=0.1,
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
      hyper=dict(
        betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, momentum_decay=4e-3, decoupled_weight_decay=False
      ),
      tiny_gradient={"weight_decay": 0.0},
      outputs=("X_new", "mu_product", "exp_avg", "exp_avg_sq"),
      tests=registry.TestConfig(
        dict(
          betas=(0.9, 0.99), eps=0.3, weight_decay=0.01, momentum_decay=4e-3, decoupled_weight_decay=False
        ),
        0.005,
        "",
      ),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      edges=(
        registry.Edge("T=3", {"T": 3}),  # a few steps in: mu_product a product of four mu
        registry.Edge("momentum_decay=0", {"hyper": {"momentum_decay": 0.0}}),  # mu = beta1 / 2
        registry.Edge("momentum_decay=1", {"hyper": {"momentum_decay": 1.0}}),  # 0.96 ** step moves
        registry.Edge("decoupled_weight_decay=1", {"hyper": {"decoupled_weight_decay": True}}),
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
        registry.Edge("betas[0]=0.3", {"hyper": {"betas": (0.3, 0.999)}}),  # the lerp's other branch
        registry.Edge("eps=0", {"hyper": {"eps": 0.0}}),
      ),
    ),
  )
)
