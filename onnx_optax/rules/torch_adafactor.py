"""``torch.optim.Adafactor`` in PyTorch's order: factored second moments, a relative, clipped step."""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _numerics, _pytorch, registry

__all__ = [
  "PyTorchAdafactorScalars",
  "PyTorchAdafactorState",
  "pytorch_adafactor",
  "pytorch_adafactor_elementwise",
  "pytorch_adafactor_scalars",
]


class PyTorchAdafactorScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_adafactor`: the lerp weight ``step **
  beta2_decay``, ``rho = min(lr, 1 / step ** 0.5)``, ``eps2``, ``d``, ``1 - lr * weight_decay``
  (None without decay), ``neg_zero``. Step-dependent ones in the scalar dtype (PyTorch's Python
  float64: float64 under ``jax_enable_x64``, else float32)."""

  one_minus_beta2: Any
  rho: Any
  eps2: Any
  d: Any
  decay_factor: Any
  neg_zero: Any


def pytorch_adafactor_scalars(
  lr: ArrayLike, count: ArrayLike, *, beta2_decay: Any, eps2: float, d: Any, weight_decay: Any
) -> PyTorchAdafactorScalars:
  """PyTorch's scalars with ``step = count + 1``: ``step ** beta2_decay``, ``min(lr, 1 / step **
  0.5)`` (Python's ``min``: ``lr`` unless the other is smaller) and ``1 - lr * weight_decay``
  (Python float64 for Python numbers, as PyTorch computes it)."""
  dtype = _pytorch.scalar_dtype()
  step = jnp.asarray(count, dtype) + 1
  nz = _pytorch.neg_zero(count)
  one_minus_beta2 = step ** jnp.asarray(beta2_decay, dtype)
  rate = jnp.asarray(lr, dtype)
  inverse_root = 1 / jnp.sqrt(step)
  rho = jnp.where(inverse_root < rate, inverse_root, rate)
  decay_factor = None
  if not _numerics.is_static_zero(weight_decay):
    decay_factor = (
      1 - float(lr) * float(weight_decay)
      if isinstance(lr, numbers.Real) and isinstance(weight_decay, numbers.Real)
      else 1 - rate * jnp.asarray(weight_decay, dtype)
    )
  return PyTorchAdafactorScalars(one_minus_beta2, rho, eps2, d, decay_factor, nz)


def _norm(x: Array, stored_in: Any, axis: Any = None) -> Array:
  """``torch.norm(x, dim=axis, keepdim=True)``: the root of the sum of squares in the opmath dtype,
  stored in ``stored_in``."""
  return _pytorch.stored(jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True)), stored_in)


def _lerp(start: Array, end: Array, weight: Array) -> Array:
  """``start.lerp_(end, weight)`` for a weight known only at the update (``step ** beta2_decay``):
  PyTorch's two branches (:func:`onnx_optax._pytorch.lerp`), chosen by ``|weight| < 0.5``."""
  small = _pytorch.lerp(start, end, weight, small=True)
  large = _pytorch.lerp(start, end, weight, small=False)
  return jnp.where(jnp.abs(weight) < 0.5, small, large)


def _python_max(a: Array, b: Array) -> Array:
  """Python's ``max(a, b)``: ``a`` unless ``b > a`` (a NaN ``b`` gives ``a``)."""
  return jnp.where(b > a, b, a)


def pytorch_adafactor_elementwise(
  s: PyTorchAdafactorScalars,
  X: Array | None,
  G: Array,
  row_var: Array,
  col_var: Array,
  variance: Array,
  *,
  maximize: bool,
  eps1: float | None,
) -> tuple[Array, Array, Array, Array]:
  """``torch.optim.Adafactor``'s step on one tensor, in ``_single_tensor_adafactor``'s order::

      grad = -grad if maximize
      alpha = max(eps2, param.norm(2) / sqrt(numel)) * rho        before the decay
      param.mul_(1 - lr * weight_decay)                          weight_decay != 0
      ndim >= 2: row_var.lerp_(norm(grad, dim=-1) ** 2 / grad.size(-1), step ** beta2_decay)
                 col_var.lerp_(norm(grad, dim=-2) ** 2 / grad.size(-2), step ** beta2_decay)
                 var = (row_var @ col_var) / max(row_var.mean(dim=-2), eps1)
      ndim < 2:  variance.lerp_(grad * grad, step ** beta2_decay); var = variance
      update = max(var, eps1 * eps1).rsqrt() * grad
      param.add_(update, alpha=-alpha / max(1, update.norm(2) / (sqrt(numel) * d)))

  Each tensor operation is stored in its tensor's dtype; the norms' quotients and ``alpha`` are
  PyTorch's Python floats, here in the scalar dtype, and ``-alpha / denom`` is rounded once by
  ``add_``. The field that does not exist for this rank (one zero, ``registry.ABSENT``) is returned as it is.
  ``eps1`` None: ``X``'s dtype's machine epsilon. Returns ``(X_new - X, row_var_new,
  col_var_new, variance_new)``: the parameter is written in place.
  """
  if X is None:
    raise ValueError("Adafactor's step size reads the parameters' norm: call update(grads, state, params)")
  factored = G.ndim >= 2
  state = (row_var, col_var) if factored else (variance,)
  dt = _pytorch.opmath(G.dtype, X.dtype, *(t.dtype for t in state))
  sdt = _pytorch.scalar_dtype() if dt == jnp.float32 else jnp.float64
  x, g = X.astype(dt), G.astype(dt)
  nz = jnp.asarray(s.neg_zero, dt)
  e1 = float(jnp.finfo(X.dtype).eps) if eps1 is None else eps1
  if maximize:
    g = -g
  numel = math.prod(G.shape)
  # alpha from the parameter before its decay (Python floats in PyTorch).
  rms_x = _norm(x, X.dtype).astype(sdt).reshape(()) / jnp.asarray(math.sqrt(numel), sdt)
  alpha = _python_max(jnp.asarray(s.eps2, sdt), rms_x) * jnp.asarray(s.rho, sdt)
  if s.decay_factor is not None:
    x = _pytorch.stored(x * jnp.asarray(s.decay_factor, dt), X.dtype, nz)
  w = jnp.asarray(s.one_minus_beta2, dt)
  if factored:
    rows, cols = G.shape[-1], G.shape[-2]
    row_mean = _pytorch.stored(_norm(g, G.dtype, -1), G.dtype)
    row_mean = _pytorch.stored(row_mean * row_mean, G.dtype)
    row_mean = _pytorch.stored(row_mean / rows, G.dtype)
    r = _pytorch.stored(_lerp(row_var.astype(dt), row_mean, w), row_var.dtype)
    col_mean = _pytorch.stored(_norm(g, G.dtype, -2), G.dtype)
    col_mean = _pytorch.stored(col_mean * col_mean, G.dtype)
    col_mean = _pytorch.stored(col_mean / cols, G.dtype)
    c = _pytorch.stored(_lerp(col_var.astype(dt), col_mean, w), col_var.dtype)
    var_dtype = jnp.promote_types(row_var.dtype, col_var.dtype)
    var = _pytorch.stored(r * c, var_dtype)  # row_var @ col_var: one product per element
    mean = _pytorch.stored(jnp.mean(r, axis=-2, keepdims=True), row_var.dtype)
    mean = jnp.maximum(mean, _pytorch.stored(jnp.asarray(e1, dt), row_var.dtype))  # clamp_(min=eps1)
    quotient = _pytorch.divide_by_scalar(var, mean)  # correctly rounded, but NaN from an infinite var
    var = _pytorch.stored(jnp.where(jnp.isfinite(quotient), quotient, var / mean), var_dtype)
    new_state = (r.astype(row_var.dtype), c.astype(col_var.dtype), variance)
  else:
    var_dtype = variance.dtype
    square = _pytorch.stored(g * g, G.dtype, nz)  # stored before the lerp adds it
    v = _pytorch.stored(_lerp(variance.astype(dt), square, w), variance.dtype)
    var = v
    new_state = (row_var, col_var, v.astype(variance.dtype))
  var = jnp.maximum(var, _pytorch.stored(jnp.asarray(e1 * e1, dt), var_dtype))  # clamp_(min=eps1 * eps1)
  update = _pytorch.stored(1 / _numerics.sqrt(var), var_dtype)  # rsqrt_: 1 / sqrt, two roundings
  update = _pytorch.stored(update * g, var_dtype)
  rms_u = _norm(update, var_dtype).astype(sdt).reshape(()) / (jnp.asarray(math.sqrt(numel), sdt) * s.d)
  denom = _python_max(jnp.asarray(1.0, sdt), rms_u)
  step_size = _pytorch.alpha(-alpha / denom, X.dtype)
  x = _pytorch.stored(jnp.asarray(step_size, dt) * update + x, X.dtype)  # add_(update, alpha=...): one FMA
  return (_pytorch.in_place(x, X), *new_state)


class PyTorchAdafactorState(NamedTuple):
  """State of :func:`pytorch_adafactor`: ``count`` (PyTorch's ``step``, the updates done), then
  ``row_var`` and ``col_var`` (parameters of two or more dimensions: the last, resp. the
  second-to-last, dimension set to 1) and ``variance`` (parameters of fewer: the parameter's
  shape); a field a parameter does not have is one zero of shape ``(1,)`` (``registry.ABSENT``)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  row_var: optax.Updates
  col_var: optax.Updates
  variance: optax.Updates


def pytorch_adafactor(
  learning_rate: _engine.ScalarOrSchedule = 1e-2,
  *,
  beta2_decay: float = -0.8,
  eps: tuple[float | None, float] = (None, 1e-3),
  d: float = 1.0,
  weight_decay: float = 0.0,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Adafactor``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_adafactor``), with
  ``step = count + 1``::

      grad = -grad if maximize
      alpha = max(eps2, rms(param)) * min(lr, 1 / sqrt(step))
      param *= 1 - lr * weight_decay
      matrices (ndim >= 2), the means over the last and the second-to-last dimension:
        row_var = lerp(row_var, mean(grad ** 2, dim=-1), step ** beta2_decay)
        col_var = lerp(col_var, mean(grad ** 2, dim=-2), step ** beta2_decay)
        var = row_var @ col_var / max(mean(row_var, dim=-2), eps1)
      otherwise: variance = lerp(variance, grad ** 2, step ** beta2_decay); var = variance
      update = grad / sqrt(max(var, eps1 ** 2))
      param -= alpha / max(1, rms(update) / d) * update

  ``rms(t) = norm(t) / sqrt(numel)``. ``row_var`` and ``col_var`` keep PyTorch's shapes (the
  parameter's with the last, resp. the second-to-last, dimension 1); a parameter of fewer than
  two dimensions keeps ``variance`` instead, and a field a parameter has no use for is one zero
  (``registry.ABSENT``). The norms couple the elements of a tensor: each leaf is one PyTorch tensor. ``eps1``
  None is the parameter's dtype's machine epsilon, as PyTorch's (whose single-tensor loop takes
  the first parameter's for a whole group: the same wherever a group is of one dtype). The update
  always reads the parameters. Not Optax's ``optax.adafactor`` (docs/from_optax.md). Defaults
  are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule: the largest relative step ``rho``.
    beta2_decay: the lerp weight of the second moments is ``step ** beta2_decay``, ``<= 0``.
    eps: ``(eps1, eps2)``: ``eps1`` (None or ``>= 0``) floors the variance estimate (squared)
      and the row mean; ``eps2 >= 0`` floors the parameters' root mean square in ``alpha``.
    d: the clipping threshold of the update's root mean square, ``>= 1``.
    weight_decay: ``>= 0``, decoupled: ``param * (1 - lr * weight_decay)`` before the step.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of the second moments; default each parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_adafactor(0.1)
    >>> params = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    >>> state = opt.init(params)
    >>> state.row_var.shape, state.col_var.shape, state.variance.shape
    ((2, 1), (1, 2), (1,))
    >>> updates, state = opt.update(jnp.array([[0.5, -1.0], [2.0, 0.25]]), state, params)
    >>> [[round(float(x), 4) for x in row] for row in optax.apply_updates(params, updates)]  # PyTorch's
    [[0.8838, 2.4647], [2.7422, 3.9356]]
  """
  hyper = dict(beta2_decay=beta2_decay, eps=eps, d=d, weight_decay=weight_decay, maximize=maximize)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _beta2_decay(name: str, value: Any) -> Any:
  """``beta2_decay <= 0``, as PyTorch's constructor checks it."""
  why = (
    f"{name} is the exponent of the second moments' weight step ** {name}: a positive one grows the "
    f"weight past 1 and the running means diverge; PyTorch refuses beta2_decay > 0"
  )
  return _checks.hyperparameter(name, value, maximum=0.0, why=why)


def _d(name: str, value: Any) -> Any:
  """``d >= 1``, as PyTorch's constructor checks it."""
  why = f"{name} is the clipping threshold of the update's root mean square; PyTorch refuses d < 1"
  return _checks.hyperparameter(name, value, minimum=1.0, why=why)


def _eps(name: str, value: Any) -> tuple[float | None, float]:
  """PyTorch's ``eps = (eps1, eps2)``: ``eps1`` None (the dtype's epsilon) or ``>= 0``, ``eps2 >= 0``,
  Python numbers (``eps1`` picks the clamps' floors where the update is traced)."""
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise TypeError(f"{name} must be a pair (eps1, eps2) as torch.optim.Adafactor's eps, got {value!r}")
  pair = [None if eps is None else _checks.epsilon(f"{name}[{i}]", eps) for i, eps in enumerate(value)]
  if pair[1] is None:
    raise TypeError(f"{name}[1] must be a Python number (only eps1 may be None), got None")
  for i, eps in enumerate(pair):
    if eps is not None and not isinstance(eps, numbers.Real):
      raise TypeError(
        f"{name}[{i}] must be a Python number: PyTorch's clamps read a Python float; got {eps!r}"
      )
  return (None if pair[0] is None else float(pair[0])), float(pair[1])


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  eps1, eps2 = hyper["eps"]
  maximize = hyper["maximize"]
  numbers_ = dict(
    beta2_decay=hyper["beta2_decay"], eps2=eps2, d=hyper["d"], weight_decay=hyper["weight_decay"]
  )
  return (
    lambda R, T: rule.scalars(R, T, **numbers_),
    lambda s, X, G, row_var, col_var, variance: rule.elementwise(
      s, X, G, row_var, col_var, variance, maximize=maximize, eps1=eps1
    ),
  )


def _refuse(kind: str, g: int, group: Any, advice: Any) -> None:
  """What no transform reproduces exactly in ``torch.optim.Adafactor``'s groups beyond its ``numbers``."""
  del advice  # eps's None has no float: its advice is written here
  if group.get("foreach"):
    raise ValueError(
      f"param_groups[{g}] has foreach=True: torch.optim.{kind} then computes the step sizes as tensors "
      f"and its row and column means in another order, not _single_tensor_adafactor's. Build the "
      f"optimizer with foreach=False (for group in optimizer.param_groups: group['foreach'] = False) "
      f"to carry it"
    )
  if any(v is not None and not isinstance(v, numbers.Real) for v in group["eps"]):
    raise ValueError(
      f"param_groups[{g}]['eps'] holds a tensor ({group['eps']!r}): torch.optim.{kind} then floors its "
      f"estimates in the tensor's dtype, not at a Python float. Make them Python numbers: for group in "
      f"optimizer.param_groups: group['eps'] = tuple(v if v is None else float(v) for v in group['eps'])"
    )


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """The step reads ``X`` through ``alpha = rms(X) rho`` (at most ``R``) and the decay ``R weight_decay``:
  ``R (1 + weight_decay)``."""
  return R * (1.0 + float(h["weight_decay"]))


def _x_roundings(h: Any) -> int:
  """One addition (an FMA) and its in-place difference; a decay two more."""
  return 4 if float(h["weight_decay"]) else 2


RULE = registry.register(
  registry.Rule(
    name="pytorch_adafactor",
    transform=pytorch_adafactor,
    state=PyTorchAdafactorState,
    fields=(
      registry.Field(
        "row_var",
        "row_var",
        second_moment=True,
        shape=lambda shape: (*shape[:-1], 1),
        exists=registry.MATRICES,
      ),
      registry.Field(
        "col_var",
        "col_var",
        second_moment=True,
        shape=lambda shape: (*shape[:-2], 1, shape[-1]),
        exists=registry.MATRICES,
      ),
      registry.Field("variance", "variance", second_moment=True, exists=registry.NOT_MATRICES),
    ),
    hyperparameters={
      "beta2_decay": registry.Hyperparameter(_beta2_decay),
      "eps": registry.Hyperparameter(_eps, static=True),
      "d": registry.Hyperparameter(_d),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_adafactor_scalars,
    elementwise=pytorch_adafactor_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    always_reads_params="Its step size reads the parameters' root mean square (PyTorch's param.norm)",
    reduces=True,
    # A matrix transposed (a Flax NNX kernel of a torch.nn.Linear weight): its row means are the
    # column means, transposed, and row_var @ col_var / mean(row_var) is unchanged (the means of
    # row_var and col_var are both the mean of the squares); the root mean squares of the
    # parameter and the update do not see the order of the elements.
    commutes_with={"transpose_last_two": {"row_var": "col_var", "col_var": "row_var"}},
    bindings=(
      registry.Binding("optax", "optax.adafactor"),  # not the same rule (docs/from_optax.md)
      registry.Binding(
        "torch",
        "Adafactor",
        torch=registry.TorchOptimizer(
          options=frozenset({"beta2_decay", "eps", "d", "weight_decay"}),
          signature=frozenset({"beta2_decay", "d"}),
          lacks=frozenset({"differentiable"}),
          numbers=frozenset({"lr", "beta2_decay", "d", "weight_decay"}),
          refuse=_refuse,
          examples={
            "plain": dict(lr=1e-2),
            "beta2_decay": dict(lr=1e-2, beta2_decay=-0.5),
            "eps": dict(lr=1e-2, eps=(1e-3, 1e-2)),
            "d": dict(lr=5e-2, d=1.5),
            "weight_decay": dict(lr=1e-2, weight_decay=0.1),
            "all": dict(lr=5e-2, beta2_decay=-0.6, eps=(1e-4, 2e-3), d=1.2, weight_decay=0.05, maximize=True),
          },
        ),
      ),
    ),
    twin_of=None,
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(_gain, x_roundings=_x_roundings),
      # eps1 given: None is the parameters' dtype's epsilon, which a bound model of float64 values
      # cannot tell (carried against PyTorch itself by the interop tests' examples).
      hyper=dict(beta2_decay=-0.8, eps=(1e-6, 1e-3), d=1.0, weight_decay=0.01),
      tiny_gradient={"weight_decay": 0.0},
      outputs=("X_new", "row_var", "col_var", "variance"),
      # d = 1.2: the first update's U is sign(g), of root mean square 1, at the kink of max(1, rms / d)
      # for d = 1, where a central difference is not a derivative (the meta-gradient tests).
      tests=registry.TestConfig(dict(beta2_decay=-0.8, eps=(1e-3, 1e-3), d=1.2, weight_decay=0.01), 0.01, ""),
      # Not bfloat16: the twins' bfloat16 grid keeps a float32 state beside bfloat16 parameters,
      # which PyTorch's lerp_ of a bfloat16 row mean into a float32 row_var refuses.
      dtypes=("float32", "float64", "float16"),
      why_not={
        "bfloat16": "the twins' bfloat16 rows keep a float32 state beside bfloat16 parameters, which "
        "torch.optim.Adafactor does not take (lerp_ of a float32 variance toward a bfloat16 gradient)"
      },
      # A vector (variance) and a matrix (row_var, col_var) in every case that names no shapes.
      shapes=((13,), (6, 9)),
      # row_var @ col_var is of order G ** 4: finite up to these, as PyTorch (float64: the bounds too).
      huge={"float32": 1e9, "float64": 1e50, "float16": 10.0},
      edges=(
        registry.Edge("T=2", {"T": 2, "shapes": ((7,), (2, 3, 4))}),  # a batch of matrices: 3 dimensions
        registry.Edge("d=1.5", {"hyper": {"d": 1.5}}),
        registry.Edge("eps[0]=0.001", {"hyper": {"eps": (1e-3, 1e-3)}}),
        registry.Edge("eps[1]=0", {"hyper": {"eps": (1e-6, 0.0)}}),
        registry.Edge("beta2_decay=0", {"hyper": {"beta2_decay": 0.0}}),
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
      ),
    ),
  )
)
