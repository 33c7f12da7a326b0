"""``torch.optim.Rprop`` in PyTorch's order."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _pytorch, registry

__all__ = [
  "PyTorchRpropScalars",
  "PyTorchRpropState",
  "pytorch_rprop",
  "pytorch_rprop_elementwise",
  "pytorch_rprop_scalars",
]


class PyTorchRpropScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_rprop`: ``etaminus``, ``etaplus``,
  ``step_size_min`` and ``step_size_max``, Python floats (Rprop reads no learning rate once its
  step sizes have started at it, and no step-dependent number)."""

  etaminus: Any
  etaplus: Any
  step_size_min: Any
  step_size_max: Any


def pytorch_rprop_scalars(
  lr: ArrayLike,
  count: ArrayLike,
  *,
  etaminus: float,
  etaplus: float,
  step_size_min: float,
  step_size_max: float,
) -> PyTorchRpropScalars:
  """The hyperparameters themselves: ``lr`` only starts ``step_size`` (``init``), ``step`` counts."""
  del lr, count
  return PyTorchRpropScalars(etaminus, etaplus, step_size_min, step_size_max)


def _sign(x: Array) -> Array:
  """``torch.sign``: ``(0 < x) - (x < 0)``, so +0 for a NaN and for -0 (``jnp.sign`` keeps both)."""
  one, zero = jnp.ones((), x.dtype), jnp.zeros((), x.dtype)
  return jnp.where(x > 0, one, jnp.where(x < 0, -one, zero))


def pytorch_rprop_elementwise(
  s: PyTorchRpropScalars,
  X: Array | None,
  G: Array,
  prev: Array,
  step_size: Array,
  *,
  maximize: bool,
) -> tuple[Array, Array, Array]:
  """``torch.optim.Rprop``'s step on one tensor, in ``_single_tensor_rprop``'s order::

      grad = -grad if maximize
      sign = grad.mul(prev).sign()
      sign[sign.gt(0)] = etaplus
      sign[sign.lt(0)] = etaminus
      sign[sign.eq(0)] = 1
      step_size.mul_(sign).clamp_(step_size_min, step_size_max)
      grad = grad.clone(); grad[sign.eq(etaminus)] = 0
      param.addcmul_(grad.sign(), step_size, value=-1)
      prev.copy_(grad)

  The factors are written into ``sign`` (its dtype: 1.2 is 1.203125 in bfloat16), the bounds
  converted to ``step_size``'s dtype by ``clamp_``; ``torch.sign`` is 0 for NaN. The last product
  is exact (a sign times a step size): ``X + U`` is ``addcmul_``'s one rounding. Returns ``(U,
  prev_new, step_size_new)``.
  """
  dt = _pytorch.opmath(G.dtype, prev.dtype, step_size.dtype)
  x, g = None if X is None else X.astype(dt), G.astype(dt)
  if maximize:
    g = -g
  # `grad.mul(prev)` is stored in the dtype of the two, and so are the factors written into it;
  # `clamp_` takes its bounds in step_size's dtype (both as ATen converts a scalar: `_pytorch.alpha`).
  sign_dtype = jnp.promote_types(G.dtype, prev.dtype)
  etaminus, etaplus = _pytorch.alpha(s.etaminus, sign_dtype), _pytorch.alpha(s.etaplus, sign_dtype)
  low, high = (
    _pytorch.alpha(s.step_size_min, step_size.dtype),
    _pytorch.alpha(s.step_size_max, step_size.dtype),
  )
  product = _pytorch.stored(g * prev.astype(dt), sign_dtype)
  one = jnp.ones((), dt)
  # `sign`'s three writes as one choice: etaplus (> 1) is never 0 and never negative, an etaminus
  # rounded to 0 is overwritten by the 1 of the zeros (the choices are made on the scalars).
  shrink = jnp.where(etaminus == 0, one, etaminus)
  factor = jnp.where(product > 0, etaplus, jnp.where(product < 0, shrink, one))
  # Where the factor is 1 the product is the step size itself (exact). Written as that choice, the
  # clamp in each branch, the new step sizes are one fusion on XLA:CPU that the update reads (not
  # recomputes from the old ones): the old step sizes have one reader, and a donated state is
  # written in place without a copy of 64 MB at 16M elements (docs/benchmarks.md, the twins).
  step = step_size.astype(dt)
  clamped = lambda x: jnp.minimum(jnp.maximum(x, low), high)  # noqa: E731
  step_new = jnp.where(factor == one, clamped(step), clamped(_pytorch.stored(step * factor, step_size.dtype)))
  # `step_new < 0` is never true (the clamp's bounds are >= 0; NaN compares false): it makes the new
  # `prev` read the new step sizes, so that XLA:CPU computes it after them, and the old `prev`, read
  # by both, is written in place when donated, not copied first (a 64 MB copy at 16M elements).
  g = jnp.where((factor == etaminus) | (step_new < 0), jnp.zeros((), dt), g)
  U = _pytorch.added(x, -_sign(g) * step_new, X, dt, G)
  return U, g.astype(prev.dtype), step_new.astype(step_size.dtype)


class PyTorchRpropState(NamedTuple):
  """State of :func:`pytorch_rprop`: ``count`` (PyTorch's ``step``, the updates done), ``prev``
  (the last gradient, zeroed where its sign changed) and ``step_size`` (each element's, started at
  the learning rate)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  prev: optax.Updates
  step_size: optax.Updates


def pytorch_rprop(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  etas: tuple[float, float] = (0.5, 1.2),
  step_sizes: tuple[float, float] = (1e-6, 50.0),
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Rprop``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_rprop``)::

      grad = -grad if maximize
      sign = grad.mul(prev).sign()
      sign[sign.gt(0)] = etaplus; sign[sign.lt(0)] = etaminus; sign[sign.eq(0)] = 1
      step_size.mul_(sign).clamp_(step_size_min, step_size_max)
      grad = grad.clone(); grad[sign.eq(etaminus)] = 0
      param.addcmul_(grad.sign(), step_size, value=-1)
      prev.copy_(grad)

  ``learning_rate`` only starts each element's ``step_size`` (PyTorch's ``torch.full_like(grad,
  lr)`` at a parameter's first step; a schedule's value at the first update): the steps never
  read it again. Not quite Optax's ``optax.rprop``, which keeps ``step_size * sign(grad)`` as its
  previous update (PyTorch: the gradient) and leaves a step size unclamped where ``grad * prev`` is 0
  (PyTorch clamps it: at the first step too; docs/from_optax.md). Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, where the step sizes start (PyTorch's default 1e-2).
    etas: ``(etaminus, etaplus)``, Python numbers: the step size's factor where the gradient
      changes sign, in ``(0, 1)``, and where it keeps it, ``> 1``.
    step_sizes: ``(step_size_min, step_size_max)``, Python numbers ``>= 0``, the clamp of the step
      sizes (``min <= max``).
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of ``prev`` and ``step_size``; default each parameter's (PyTorch's).

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_rprop(0.25)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)  # no previous gradient: the sign times 0.25
    Array([0.75, 2.25], dtype=float32)
  """
  hyper = dict(etas=etas, step_sizes=step_sizes, maximize=maximize)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _pair(name: str, value: Any, checks: tuple[Any, Any], what: str) -> tuple[float, float]:
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise TypeError(f"{name} must be a pair {what} of Python numbers, got {value!r}")
  pair = [check(f"{name}[{i}]", v) for i, (check, v) in enumerate(zip(checks, value))]
  for i, v in enumerate(pair):
    if not isinstance(v, numbers.Real):
      raise TypeError(
        f"{name}[{i}] must be a Python number: PyTorch writes it into its tensors as a Python "
        f"float; got {v!r}"
      )
  return float(pair[0]), float(pair[1])


def _etas(name: str, value: Any) -> tuple[float, float]:
  """PyTorch's ``etas``: ``(etaminus, etaplus)``, ``0 < etaminus < 1 < etaplus``."""
  return _pair(name, value, (_checks.shrink_factor, _checks.growth_factor), "(etaminus, etaplus)")


def _step_sizes(name: str, value: Any) -> tuple[float, float]:
  """PyTorch's ``step_sizes``: ``(step_size_min, step_size_max)``, each ``>= 0``, ``min <= max``."""
  low, high = _pair(name, value, (_checks.step_size, _checks.step_size), "(step_size_min, step_size_max)")
  if low > high:
    raise ValueError(
      f"{name} must have step_size_min <= step_size_max, got {value!r}: PyTorch's clamp_ then "
      f"sets every step size to step_size_max, and the minimum is never one"
    )
  return low, high


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  (etaminus, etaplus), (low, high) = hyper["etas"], hyper["step_sizes"]
  maximize = hyper["maximize"]
  numbers = dict(etaminus=etaminus, etaplus=etaplus, step_size_min=low, step_size_max=high)
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, prev, step_size: rule.elementwise(s, X, G, prev, step_size, maximize=maximize),
  )


RULE = registry.register(
  registry.Rule(
    name="pytorch_rprop",
    transform=pytorch_rprop,
    state=PyTorchRpropState,
    fields=(
      registry.Field("prev", "prev"),
      # PyTorch's torch.full_like(grad, lr) at a parameter's first step.
      registry.Field("step_size", "step_size", initial=registry.LEARNING_RATE),
    ),
    hyperparameters={
      "etas": registry.Hyperparameter(_etas, static=True),
      "step_sizes": registry.Hyperparameter(_step_sizes, static=True),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_rprop_scalars,
    elementwise=pytorch_rprop_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    reads_learning_rate=False,
    bindings=(
      registry.Binding("optax", "optax.rprop"),  # another state, no clamp where g * prev = 0 (from_optax.md)
      registry.Binding(
        "torch",
        "Rprop",
        torch=registry.TorchOptimizer(
          options=frozenset({"etas", "step_sizes", "capturable"}),
          signature=frozenset({"etas", "step_sizes"}),
          numbers=frozenset({"etas", "step_sizes"}),
          examples={
            "plain": dict(lr=0.01),
            "etas": dict(lr=0.01, etas=(0.25, 2.0)),
            # Bounds the steps reach within the run: the minimum after a few sign changes, the maximum
            # after a few steps of one sign.
            "step_sizes": dict(lr=0.01, step_sizes=(5e-3, 0.015)),
            "maximize": dict(lr=0.01, maximize=True),
            "all": dict(lr=0.02, etas=(0.3, 1.5), step_sizes=(4e-3, 0.03), maximize=True),
          },
        ),
      ),
    ),
    twin_of=None,
    conformance=registry.Conformance(
      # The grid's step sizes are drawn in [0.1, 1] (and their negatives, clamped to the minimum):
      # bounds within that range make some elements reach each of them, growing and shrinking.
      hyper=dict(etas=(0.5, 1.2), step_sizes=(0.2, 0.9)),
      outputs=("X_new", "prev", "step_size"),
      tests=registry.TestConfig(dict(etas=(0.5, 1.2), step_sizes=(1e-3, 0.08))),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      edges=(
        registry.Edge(
          "step_sizes[0]=1e-06,step_sizes[1]=50", {"hyper": {"step_sizes": (1e-6, 50.0)}}
        ),  # not reached
        registry.Edge("etas[0]=0.25,etas[1]=3", {"hyper": {"etas": (0.25, 3.0)}}),
        registry.Edge("step_sizes[0]=0.5,step_sizes[1]=0.5", {"hyper": {"step_sizes": (0.5, 0.5)}}),
        registry.Edge("maximize", {"hyper": {"maximize": True}}),
      ),
    ),
  )
)
