"""``torch.optim.Adamax`` in PyTorch's order."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _numerics, _pytorch, registry

__all__ = [
  "PyTorchAdamaxScalars",
  "PyTorchAdamaxState",
  "pytorch_adamax",
  "pytorch_adamax_elementwise",
  "pytorch_adamax_scalars",
]


class PyTorchAdamaxScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_adamax`: the lerp weight ``1 - beta1`` (a
  Python float64 number rounded once, as PyTorch's), ``beta2``, ``eps``, ``weight_decay`` (None
  where it is the Python number 0), ``-clr`` (``-lr / (1 - beta1 ** step)``)."""

  one_minus_beta1: Any
  beta2: Any
  eps: Any
  weight_decay: Any
  neg_clr: Any


def pytorch_adamax_scalars(
  lr: ArrayLike, count: ArrayLike, *, beta1: float, beta2: float, eps: float, weight_decay: float
) -> PyTorchAdamaxScalars:
  """PyTorch's scalars, with ``step = count + 1`` (its step after the increment)::

      bias_correction = 1 - beta1 ** step
      clr             = lr / bias_correction

  in float64 under ``jax_enable_x64`` (PyTorch's Python floats), else in float32
  (``_pytorch.power_complement``); ``1 - beta1`` in Python float64.
  """
  dtype = _pytorch.scalar_dtype()
  step = jnp.asarray(count, dtype) + 1
  bias_correction = _pytorch.power_complement(beta1, step, dtype)
  return PyTorchAdamaxScalars(
    1 - beta1,
    beta2,
    eps,
    None if _numerics.is_static_zero(weight_decay) else weight_decay,
    -(jnp.asarray(lr, dtype) / bias_correction),
  )


def pytorch_adamax_elementwise(
  s: PyTorchAdamaxScalars,
  X: Array | None,
  G: Array,
  exp_avg: Array,
  exp_inf: Array,
  *,
  maximize: bool,
  lerp_small: bool,
) -> tuple[Array, Array, Array]:
  """``torch.optim.Adamax``'s step on one tensor, in ``_single_tensor_adamax``'s order::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                       weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      torch.maximum(exp_inf.mul_(beta2), grad.abs().add_(eps), out=exp_inf)
      clr = lr / (1 - beta1 ** step)
      param.addcdiv_(exp_avg, exp_inf, value=-clr)

  ``lerp_small`` is ``|1 - beta1| < 0.5``, the branch of PyTorch's lerp. Returns ``(U,
  exp_avg_new, exp_inf_new)``: ``U`` is ``addcdiv_``'s addend (``_pytorch.added``). ``X`` is read
  only for ``weight_decay`` and for parameters narrower than float32 (else it may be None).
  """
  dt = _pytorch.opmath(G.dtype, exp_avg.dtype, exp_inf.dtype)
  x, g = None if X is None else X.astype(dt), G.astype(dt)
  # `grad.add(param, alpha=weight_decay)` and `add_(eps)` take their scalar in the tensors' dtype.
  g_dtype = G.dtype if X is None else jnp.promote_types(G.dtype, X.dtype)
  s = s._replace(weight_decay=_pytorch.alpha(s.weight_decay, g_dtype), eps=_pytorch.alpha(s.eps, g_dtype))
  if x is None and s.weight_decay is not None:
    raise ValueError("weight_decay multiplies the parameters: call update(grads, state, params)")
  if maximize:
    g = -g
  if s.weight_decay is not None:
    g = _pytorch.stored(x * s.weight_decay + g, g_dtype)
  m = _pytorch.stored(
    _pytorch.lerp(exp_avg.astype(dt), g, s.one_minus_beta1, small=lerp_small), exp_avg.dtype
  )
  decayed = _pytorch.stored(exp_inf.astype(dt) * s.beta2, exp_inf.dtype)
  bound = _pytorch.stored(jnp.abs(g) + s.eps, g_dtype)
  # No product is stored and then added (`mul_` feeds the maximum): no `neg_zero` is needed.
  u = _pytorch.stored(jnp.maximum(decayed, bound), exp_inf.dtype)
  U = _pytorch.added(x, (s.neg_clr * m) / u, X, dt, G)
  return U, m.astype(exp_avg.dtype), u.astype(exp_inf.dtype)


class PyTorchAdamaxState(NamedTuple):
  """State of :func:`pytorch_adamax`: ``count`` (PyTorch's ``step``, the updates done), ``exp_avg``
  and ``exp_inf`` (the decayed infinity norm of the gradients)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  exp_avg: optax.Updates
  exp_inf: optax.Updates


def pytorch_adamax(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  betas: tuple[float, float] = (0.9, 0.999),
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Adamax``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_adamax``), with
  ``step = count + 1``::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)                       weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      torch.maximum(exp_inf.mul_(beta2), grad.abs().add_(eps), out=exp_inf)
      clr = lr / (1 - beta1 ** step)
      param.addcdiv_(exp_avg, exp_inf, value=-clr)

  Optax's ``optax.adamax`` is the same rule without ``weight_decay`` and ``maximize``, in another
  order: ``(1 - b1) g + b1 m``, not a lerp, and ``m / (1 - b1^t) / nu`` scaled by ``-lr`` after
  (docs/from_optax.md). ``1 - beta1`` is a Python float64 number rounded once; ``clr`` is computed
  in float64 under ``jax_enable_x64`` (PyTorch's number), else in float32. Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule (PyTorch's default 2e-3).
    betas: ``(beta1, beta2)``, Python numbers in ``[0, 1)`` (PyTorch refuses 1 for either).
    eps: added to ``|grad|`` inside the maximum, ``>= 0``.
    weight_decay: L2 coefficient added to the gradient, ``>= 0``.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of ``exp_avg`` and ``exp_inf``; default each parameter's (PyTorch's).

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adamax(0.1, eps=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)  # 1 - 0.1 * (0.1 * 3) / (0.1 * 3): 1 - 0.1
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _betas(name: str, value: Any) -> tuple[float, float]:
  """PyTorch's ``betas``: a pair of Python numbers, each in ``[0, 1)`` (Adamax's constructor refuses
  1 for both: ``beta1 = 1`` divides by ``1 - beta1 ** step = 0``)."""
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise TypeError(f"{name} must be a pair (beta1, beta2) of Python numbers, got {value!r}")
  pair = [_checks.first_moment_decay(f"{name}[{i}]", beta) for i, beta in enumerate(value)]
  for i, beta in enumerate(pair):
    if not isinstance(beta, numbers.Real):
      raise TypeError(
        f"{name}[{i}] must be a Python number: PyTorch's 1 - beta1, its lerp branch and its "
        f"bias correction are Python float arithmetic; got {beta!r}"
      )
  return float(pair[0]), float(pair[1])


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  (beta1, beta2), maximize = hyper["betas"], hyper["maximize"]
  numbers = dict(beta1=beta1, beta2=beta2, eps=hyper["eps"], weight_decay=hyper["weight_decay"])
  small = abs(1 - beta1) < 0.5
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, exp_avg, exp_inf: rule.elementwise(
      s, X, G, exp_avg, exp_inf, maximize=maximize, lerp_small=small
    ),
  )


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """Through ``weight_decay``: ``clr m / exp_inf`` with ``exp_inf >= |g'| + eps``, ``m`` an average
  of ``g'`` (weights summing to at most 1): ``clr c e / eps`` through ``m`` and as much again
  through ``exp_inf``, with ``clr = lr / (1 - beta1 ** step)`` at its largest (the first step)."""
  c = float(h["weight_decay"])
  if not c:
    return 0.0
  beta1 = float(h["betas"][0])
  first = max(T0 + 1, 1)
  bias_correction = 1 - beta1 ** np.arange(first, first + steps, dtype=np.float64)
  return 2 * R * c / float(h["eps"]) / float(np.min(bias_correction))


RULE = registry.register(
  registry.Rule(
    name="pytorch_adamax",
    transform=pytorch_adamax,
    state=PyTorchAdamaxState,
    fields=(registry.Field("exp_avg", "exp_avg"), registry.Field("exp_inf", "exp_inf", second_moment=True)),
    hyperparameters={
      "betas": registry.Hyperparameter(_betas, static=True),
      "eps": registry.Hyperparameter(_checks.epsilon),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_adamax_scalars,
    elementwise=pytorch_adamax_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    params_for=("weight_decay",),
    bindings=(
      registry.Binding(
        "optax", "optax.adamax"
      ),  # the same rule in another order, no weight_decay (from_optax.md)
      registry.Binding(
        "torch",
        "Adamax",
        torch=registry.TorchOptimizer(
          options=frozenset({"betas", "eps", "weight_decay", "capturable"}),
          # No key is Adamax's alone: its groups' keys are a subset of Adam's, AdamW's, NAdam's and
          # RAdam's, whose groups have one Adamax's lack (amsgrad, momentum_decay,
          # decoupled_weight_decay), so they do not fit it; betas and weight_decay tell it from
          # every other class (SparseAdam has betas and no weight_decay).
          signature=frozenset({"betas", "weight_decay"}),
          numbers=frozenset({"lr", "betas", "eps", "weight_decay"}),
          capturable=(
            "computes its bias correction from the float32 step tensor, (beta1 ** step - 1) / lr, "
            "and divides by exp_inf times it, not lr / (1 - beta1 ** step) in float64 through addcdiv_"
          ),
          examples={
            "plain": dict(lr=0.01),
            "betas": dict(lr=0.01, betas=(0.3, 0.5)),
            "weight_decay": dict(lr=0.01, weight_decay=0.1, eps=1e-3),
            "maximize": dict(lr=0.01, maximize=True),
            "all": dict(lr=0.01, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.05, maximize=True),
          },
        ),
      ),
    ),
    twin_of=None,
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(_gain, lambda h: float(h["betas"][0])),
      hyper=dict(betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
      tiny_gradient={"weight_decay": 0.0},
      outputs=("X_new", "exp_avg", "exp_inf"),
      # clr = lr / (1 - beta1^step) is 10 lr at the first step: steps small beside |X| ~ 1.
      tests=registry.TestConfig(dict(betas=(0.9, 0.999), eps=0.3, weight_decay=0.01), 0.005),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      edges=(
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
        registry.Edge("betas[0]=0", {"hyper": {"betas": (0.0, 0.999)}}),  # lerp's other branch (weight 1)
        registry.Edge("betas[0]=0.3", {"hyper": {"betas": (0.3, 0.999)}}),  # the other branch, weight 0.7
        # exp_inf decays fast: |grad| + eps wins the maximum in some elements, beta2 * exp_inf in others.
        registry.Edge("betas[1]=0.5", {"hyper": {"betas": (0.9, 0.5)}}),
        registry.Edge("eps=0", {"hyper": {"eps": 0.0}}),
        registry.Edge("betas[0]=0.999,state=0", {"state": "zero", "hyper": {"betas": (0.999, 0.999)}}),
      ),
    ),
  )
)
