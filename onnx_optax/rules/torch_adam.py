"""``torch.optim.Adam`` and ``AdamW`` in PyTorch's order: the float32 twins of ONNX Runtime's AdamW."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _feedback, _numerics, _pytorch, registry
from onnx_optax.rules import ort

__all__ = [
  "PyTorchAdamAMSGradState",
  "PyTorchAdamScalars",
  "PyTorchAdamState",
  "pytorch_adam",
  "pytorch_adam_elementwise",
  "pytorch_adam_scalars",
  "pytorch_adamw",
]


class PyTorchAdamScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_adam`.

  ``one_minus_beta1`` is the lerp weight ``1 - beta1``, ``decay_factor`` AdamW's
  ``1 - lr * weight_decay`` (None without decoupled decay), ``weight_decay`` Adam's coupled
  coefficient (None without), ``neg_step_size`` ``-lr / bias_correction1``.
  """

  one_minus_beta1: Any
  beta2: Any
  one_minus_beta2: Any
  eps: Any
  decay_factor: Any
  weight_decay: Any
  neg_step_size: Any
  bias_correction2_sqrt: Any
  neg_zero: Any


def pytorch_adam_scalars(
  lr: ArrayLike,
  count: ArrayLike,
  *,
  beta1: float,
  beta2: float,
  eps: float,
  weight_decay: float,
  decoupled_weight_decay: bool,
) -> PyTorchAdamScalars:
  """PyTorch's scalars, with ``step = count + 1`` (its step after the increment)::

      bias_correction1      = 1 - beta1 ** step
      bias_correction2      = 1 - beta2 ** step
      step_size             = lr / bias_correction1
      bias_correction2_sqrt = bias_correction2 ** 0.5

  and the hyperparameters' ``1 - beta1``, ``1 - beta2``, ``1 - lr * weight_decay`` (Python
  float64 when they are Python numbers, as PyTorch computes them).
  """
  dtype = _pytorch.scalar_dtype()
  step = jnp.asarray(count, dtype) + 1
  bias_correction1 = _pytorch.power_complement(beta1, step, dtype)
  bias_correction2 = _pytorch.power_complement(beta2, step, dtype)
  decays = not _numerics.is_static_zero(weight_decay)
  decay_factor = None
  if decays and decoupled_weight_decay:
    decay_factor = (
      1 - float(lr) * float(weight_decay)
      if isinstance(lr, numbers.Real)
      else 1 - jnp.asarray(lr, dtype) * weight_decay
    )
  return PyTorchAdamScalars(
    1 - beta1,
    beta2,
    1 - beta2,
    eps,
    decay_factor,
    weight_decay if decays and not decoupled_weight_decay else None,
    -(jnp.asarray(lr, dtype) / bias_correction1),
    jnp.sqrt(bias_correction2),
    _pytorch.neg_zero(count),
  )


def moments(
  s: Any, X: Array | None, G: Array, exp_avg: Array, exp_avg_sq: Array, *, maximize: bool, lerp_small: bool
) -> tuple[Any, Any, Array, Array | None, Array, Array, Array]:
  """The first half of ``_single_tensor_adam``, which NAdam's and RAdam's share::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)               decoupled, weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)      coupled, weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

  ``s`` has the fields ``decay_factor``, ``weight_decay`` (None where they do not apply), ``eps``,
  ``one_minus_beta1``, ``beta2``, ``one_minus_beta2`` and ``neg_zero``. Returns ``(s, dt, nz, x,
  g, m, v)``: ``s`` with ``weight_decay`` and ``eps`` in the tensors' dtypes (``grad.add(param,
  alpha=weight_decay)`` and ``add_(eps)`` take their scalar there), the compute dtype, its
  negative zero, the (decayed) parameter and the gradient in it, and the new moments, each stored
  in its tensor's dtype. Raises where a weight decay needs the parameters and ``X`` is None.
  """
  dt = _pytorch.opmath(G.dtype, exp_avg.dtype, exp_avg_sq.dtype)
  x, g, nz = None if X is None else X.astype(dt), G.astype(dt), jnp.asarray(s.neg_zero, dt)
  g_dtype = G.dtype if X is None else jnp.promote_types(G.dtype, X.dtype)
  s = s._replace(
    weight_decay=_pytorch.alpha(s.weight_decay, g_dtype), eps=_pytorch.alpha(s.eps, exp_avg_sq.dtype)
  )
  if x is None and (s.decay_factor is not None or s.weight_decay is not None):
    raise ValueError("weight_decay multiplies the parameters: call update(grads, state, params)")
  if maximize:
    g = -g
  if s.decay_factor is not None:
    x = _pytorch.stored(x * s.decay_factor, G.dtype, nz)
  if s.weight_decay is not None:
    g = _pytorch.stored(x * s.weight_decay + g, G.dtype)
  m = _pytorch.stored(
    _pytorch.lerp(exp_avg.astype(dt), g, s.one_minus_beta1, small=lerp_small), exp_avg.dtype
  )
  v2 = _pytorch.stored(exp_avg_sq.astype(dt) * s.beta2, exp_avg_sq.dtype, nz)
  v = _pytorch.stored((s.one_minus_beta2 * g) * g + v2, exp_avg_sq.dtype)
  return s, dt, nz, x, g, m, v


def pytorch_adam_elementwise(
  s: PyTorchAdamScalars,
  X: Array | None,
  G: Array,
  exp_avg: Array,
  exp_avg_sq: Array,
  max_exp_avg_sq: Array | None = None,
  *,
  maximize: bool,
  lerp_small: bool,
) -> tuple[Array, ...]:
  """``torch.optim.Adam`` / ``AdamW``'s step on one tensor, in ``_single_tensor_adam``'s order::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)               AdamW (decoupled), weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)      Adam (coupled), weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)          amsgrad
      denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)      amsgrad
      denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)          otherwise
      param.addcdiv_(exp_avg, denom, value=-step_size)

  ``lerp_small`` is ``|1 - beta1| < 0.5``, the branch of PyTorch's lerp. Returns
  ``(U, exp_avg_new, exp_avg_sq_new)``, then ``max_exp_avg_sq_new`` when ``max_exp_avg_sq`` is
  given (``amsgrad``): ``U`` is ``addcdiv_``'s addend (``_pytorch.added``), ``X_new - X`` for
  AdamW (``_pytorch.in_place``). ``X`` is read only for ``weight_decay`` and for parameters
  narrower than float32 (else it may be None).
  """
  s, dt, nz, x, g, m, v = moments(s, X, G, exp_avg, exp_avg_sq, maximize=maximize, lerp_small=lerp_small)
  vmax = None
  if max_exp_avg_sq is not None:  # amsgrad: the maximum of two stored values, exact (it rounds nothing)
    vmax = jnp.maximum(max_exp_avg_sq.astype(dt), v)
  root = _pytorch.stored(_numerics.sqrt(v if vmax is None else vmax), exp_avg_sq.dtype)
  # `denom` feeds a division, never an addition: no `neg_zero` (it would cost an addition per element).
  denom = _pytorch.stored(
    _pytorch.stored(_pytorch.divide_by_scalar(root, s.bias_correction2_sqrt), exp_avg_sq.dtype) + s.eps,
    exp_avg_sq.dtype,
  )
  q = (s.neg_step_size * m) / denom
  state: tuple[Array, ...] = (m.astype(exp_avg.dtype), v.astype(exp_avg_sq.dtype))
  if vmax is not None:
    assert max_exp_avg_sq is not None
    state = (*state, vmax.astype(max_exp_avg_sq.dtype))
  if s.decay_factor is not None:  # AdamW's decayed parameter is stored first: no addition to X.
    assert x is not None and X is not None  # checked above
    return _pytorch.in_place(x + q, X), *state
  return _pytorch.added(x, q, X, dt, G), *state


class PyTorchAdamState(NamedTuple):
  """State of :func:`pytorch_adam` and :func:`pytorch_adamw`: ``count`` (PyTorch's ``step``, the
  updates done), ``exp_avg`` and ``exp_avg_sq``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  exp_avg: optax.Updates
  exp_avg_sq: optax.Updates


class PyTorchAdamAMSGradState(NamedTuple):
  """State of :func:`pytorch_adam` and :func:`pytorch_adamw` with ``amsgrad=True``: those of
  :class:`PyTorchAdamState`, then ``max_exp_avg_sq``, the running maximum of ``exp_avg_sq`` (a
  class of its own: a state without ``amsgrad`` keeps its structure and no third tensor)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  exp_avg: optax.Updates
  exp_avg_sq: optax.Updates
  max_exp_avg_sq: optax.Updates


def pytorch_adam(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  betas: tuple[float, float] = (0.9, 0.999),
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  amsgrad: bool = False,
  decoupled_weight_decay: bool = False,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Adam`` (and ``AdamW``), in PyTorch's order.

  The float32 twin of :func:`onnx_optax.ort_adamw` (``adam_mode=0``, ``correct_bias=True``): the same
  rule in exact arithmetic, as ``_single_tensor_adam`` evaluates it, with ``step = count + 1``::

      grad = -grad if maximize
      param.mul_(1 - lr * weight_decay)             decoupled (AdamW), weight_decay != 0
      grad = grad.add(param, alpha=weight_decay)    coupled (Adam), weight_decay != 0
      exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      bias_correction1 = 1 - beta1 ** step;  bias_correction2 = 1 - beta2 ** step
      step_size = lr / bias_correction1;     bias_correction2_sqrt = bias_correction2 ** 0.5
      torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)   amsgrad
      denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) amsgrad
      denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)     otherwise
      param.addcdiv_(exp_avg, denom, value=-step_size)

  ``1 - beta1``, ``1 - beta2`` and ``1 - lr * weight_decay`` are Python float64 numbers
  rounded once, as in PyTorch (``1 - 0.999`` is ``0.001f``; ONNX Runtime's ``1 - 0.999f`` is
  0.00099998713). The bias corrections and ``step_size`` are computed in float64 under
  ``jax_enable_x64`` (PyTorch's numbers), else in float32 (docs/spec.md). ``amsgrad`` keeps
  ``max_exp_avg_sq``, the running maximum of ``exp_avg_sq`` (the maximum of the stored values,
  before the root, not of the bias-corrected moment as ``optax.amsgrad``), in a state of its own
  (:class:`~onnx_optax.rules.torch_adam.PyTorchAdamAMSGradState`); without it the state is
  :class:`~onnx_optax.rules.torch_adam.PyTorchAdamState` and
  keeps no third tensor. Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule.
    betas: ``(beta1, beta2)``, Python numbers, ``beta1`` in ``[0, 1)``, ``beta2`` in ``[0, 1]``.
    eps: added after the bias correction of the root, ``>= 0``.
    weight_decay: ``>= 0``; coupled (L2, added to the gradient) unless
      ``decoupled_weight_decay``.
    amsgrad: divide by the root of the running maximum of ``exp_avg_sq`` (``max_exp_avg_sq``,
      zeros at ``init``), PyTorch's AMSGrad.
    decoupled_weight_decay: AdamW's decay, ``param * (1 - lr * weight_decay)`` first.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq``); default each
      parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adam(0.1, eps=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    betas=betas,
    eps=eps,
    weight_decay=weight_decay,
    amsgrad=amsgrad,
    decoupled_weight_decay=decoupled_weight_decay,
    maximize=maximize,
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def pytorch_adamw(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  betas: tuple[float, float] = (0.9, 0.999),
  eps: float = 1e-8,
  weight_decay: float = 1e-2,
  amsgrad: bool = False,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.AdamW``: :func:`pytorch_adam` with ``decoupled_weight_decay=True``.

  PyTorch's defaults (``weight_decay = 0.01``). See :func:`pytorch_adam` for the order.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adamw(0.1, eps=0.0, weight_decay=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
  return _engine.transform(ADAMW_RULE, learning_rate, initial_count, state_dtype, hyper)


def _betas(name: str, value: Any) -> tuple[float, float]:
  """PyTorch's ``betas``: a pair of Python numbers, ``beta1`` in ``[0, 1)`` and ``beta2`` in ``[0, 1)``."""
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise TypeError(f"{name} must be a pair (beta1, beta2) of Python numbers, got {value!r}")
  # PyTorch's constructor refuses betas[1] = 1 too: its step divides by 1 - beta2**step = 0.
  pair = [_checks.first_moment_decay(f"{name}[{i}]", beta) for i, beta in enumerate(value)]
  for i, beta in enumerate(pair):
    if not isinstance(beta, numbers.Real):
      raise TypeError(
        f"{name}[{i}] must be a Python number: PyTorch's 1 - beta and its lerp branch are Python "
        f"float arithmetic; got {beta!r}"
      )
  return float(pair[0]), float(pair[1])


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  (beta1, beta2), maximize = hyper["betas"], hyper["maximize"]
  numbers = dict(
    beta1=beta1,
    beta2=beta2,
    eps=hyper["eps"],
    weight_decay=hyper["weight_decay"],
    decoupled_weight_decay=hyper.get("decoupled_weight_decay", True),
  )
  small = abs(1 - beta1) < 0.5
  # `amsgrad` chose the rule (Rule.flagged): its state, with max_exp_avg_sq last, says the rest.
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, *state: rule.elementwise(s, X, G, *state, maximize=maximize, lerp_small=small),
  )


_TORCH = registry.TorchOptimizer(
  options=frozenset(
    {"betas", "eps", "weight_decay", "amsgrad", "capturable", "fused", "decoupled_weight_decay"}
  ),
  signature=frozenset({"betas", "amsgrad"}),
  # A PyTorch older than decoupled_weight_decay told Adam from AdamW by the class alone.
  older={"decoupled_weight_decay": False},
  optional={"max_exp_avg_sq": "amsgrad"},
  numbers=frozenset({"lr", "betas", "eps", "weight_decay"}),
  examples={
    "plain": dict(lr=0.01),
    "all": dict(lr=0.01, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.05, maximize=True),
    "amsgrad": dict(lr=0.01, amsgrad=True),
    "amsgrad_all": dict(lr=0.01, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.05, amsgrad=True, maximize=True),
  },
)

_HYPERPARAMETERS = {
  "betas": registry.Hyperparameter(_betas, static=True),
  "eps": registry.Hyperparameter(_checks.epsilon),
  "weight_decay": registry.Hyperparameter(_checks.coefficient),
  "amsgrad": registry.Hyperparameter(_checks.flag, static=True),
  "decoupled_weight_decay": registry.Hyperparameter(_checks.flag, static=True),
  "maximize": registry.Hyperparameter(_checks.flag, static=True),
}
_EDGES = (
  registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
  # Large enough to stand out of X's rounding (lr * 0.01 is a few ulps of X in float32).
  registry.Edge("weight_decay=5", {"hyper": {"weight_decay": 5.0}}),
  registry.Edge("betas[0]=0", {"hyper": {"betas": (0.0, 0.999)}}),  # lerp's other branch (weight 1 >= 0.5)
  registry.Edge("betas[0]=0.3", {"hyper": {"betas": (0.3, 0.999)}}),  # the other branch, weight 0.7
  registry.Edge("eps=0", {"hyper": {"eps": 0.0}}),
  registry.Edge("betas[0]=0.999,state=0", {"state": "zero", "hyper": {"betas": (0.999, 0.999)}}),
)


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """Decoupled (AdamW): ``R weight_decay``, as ONNX Runtime's AdamW. Coupled (L2):
  ``U = -(lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)``, whose ``1 / (...)`` is at most
  ``1 / eps``: ONNX Adam's gain with ``rate = lr / min(bc1)``, ``step = count + 1``."""
  c = float(h["weight_decay"])
  if h.get("decoupled_weight_decay", True):
    return R * c
  beta1 = float(h["betas"][0])
  bias_correction1 = 1 - beta1 ** _feedback.bias_steps(T0 + 1, steps)
  return _feedback.adam(c, float(h["eps"]), R / float(np.min(bias_correction1)))


def _x_roundings(h: Any) -> int:
  """A decoupled decay subtracts twice per update."""
  return 4 if float(h["weight_decay"]) and h.get("decoupled_weight_decay", True) else 2


_TRAJECTORY = registry.Trajectory(_gain, lambda h: float(h["betas"][0]), _x_roundings)


def _conformance(amsgrad: bool) -> registry.Conformance:
  """The grid and tests of the twins; ``amsgrad``: of their flagged rules (:attr:`registry.Rule.flagged`)."""
  return registry.Conformance(
    trajectory=_TRAJECTORY,
    hyper=dict(betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, **(dict(amsgrad=True) if amsgrad else {})),
    tiny_gradient={"weight_decay": 0.0},
    outputs=("X_new", "exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if amsgrad else ())),
    tests=registry.TestConfig(dict(betas=(0.9, 0.999), eps=0.3, weight_decay=0.01), 0.05, ""),
    dtypes=("float32", "float64", "float16", "bfloat16"),
    edges=_EDGES + _AMSGRAD_EDGES if amsgrad else _EDGES,
  )


#: amsgrad's: the running maximum drawn above the past exp_avg_sq (Field.at_least) by default, so
#: above the new one for beta2 = 0.999; equal to the past one ("tight"): the new one above it where
#: grad**2 > exp_avg_sq, below elsewhere; equal, with a huge gradient: the new one above everywhere.
_AMSGRAD_EDGES = (
  registry.Edge("max_exp_avg_sq=exp_avg_sq", {"state": "tight"}),
  registry.Edge("max_exp_avg_sq=exp_avg_sq,gradient=huge", {"state": "tight", "gradient": "huge"}),
)

_FIELDS = (
  registry.Field("exp_avg", "exp_avg"),
  registry.Field("exp_avg_sq", "exp_avg_sq", second_moment=True),
)
#: amsgrad's running maximum of exp_avg_sq, never below it in a state the rule reaches.
_MAX = registry.Field("max_exp_avg_sq", "max_exp_avg_sq", second_moment=True, at_least="exp_avg_sq")


def _with_amsgrad(rule: registry.Rule) -> registry.Rule:
  """``rule`` with its ``amsgrad=True`` rule: ``max_exp_avg_sq`` kept in a state class of its own."""
  amsgrad = registry.replace(
    rule, state=PyTorchAdamAMSGradState, fields=(*_FIELDS, _MAX), conformance=_conformance(True)
  )
  return registry.replace(rule, flagged={"amsgrad": amsgrad})


RULE = registry.register(
  _with_amsgrad(
    registry.Rule(
      name="pytorch_adam",
      transform=pytorch_adam,
      state=PyTorchAdamState,
      fields=_FIELDS,
      hyperparameters=_HYPERPARAMETERS,
      scalars=pytorch_adam_scalars,
      elementwise=pytorch_adam_elementwise,
      bind=_bind,
      minimum_count=0,
      policy=_engine.FRAMEWORK,
      params_for=("weight_decay",),
      bindings=(registry.Binding("optax", "optax.adam"), registry.Binding("torch", "Adam", torch=_TORCH)),
      twin_of=ort.RULE,
      conformance=_conformance(False),
    )
  )
)

ADAMW_RULE = registry.register(
  _with_amsgrad(
    registry.replace(
      RULE,
      name="pytorch_adamw",
      transform=pytorch_adamw,
      hyperparameters={h: v for h, v in _HYPERPARAMETERS.items() if h != "decoupled_weight_decay"},
      bindings=(
        registry.Binding("optax", "optax.adamw"),
        registry.Binding(
          "torch",
          "AdamW",
          # torch.optim.AdamW sets the flag in every group, loaded ones included (its __setstate__).
          torch=registry.replace_torch(_TORCH, fixed={"decoupled_weight_decay": True}, older={}),
        ),
      ),
      flagged={},
    )
  )
)
