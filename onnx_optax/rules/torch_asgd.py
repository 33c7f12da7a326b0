"""``torch.optim.ASGD`` in PyTorch's order: averaged SGD, with a per-parameter ``eta``, ``mu`` and ``ax``."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _numerics, _pytorch, registry

__all__ = [
  "PyTorchASGDScalars",
  "PyTorchASGDState",
  "pytorch_asgd",
  "pytorch_asgd_elementwise",
  "pytorch_asgd_scalars",
]


class PyTorchASGDScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_asgd`: the next ``eta`` and ``mu`` (from
  ``step = count + 1``), ``lambd`` (a scalar of the update, not of the element-wise part's
  closure: a traced ``lambd`` is differentiated through it), the coupled ``weight_decay`` (None
  without) and ``neg_zero``."""

  eta_new: Any
  mu_new: Any
  lambd: Any
  weight_decay: Any
  neg_zero: Any


def pytorch_asgd_scalars(
  lr: ArrayLike, count: ArrayLike, *, lambd: float, alpha: float, t0: float, weight_decay: float
) -> PyTorchASGDScalars:
  """PyTorch's Python-float scalars with ``step = count + 1``, in the scalar dtype (float64 under
  ``jax_enable_x64``, where they are PyTorch's; else float32)::

      eta_new = lr / ((1 + lambd * lr * step) ** alpha)
      mu_new  = 1 / max(1, step - t0)

  (evaluated left to right, as Python does: ``(lambd * lr) * step``). They are the state's next
  ``eta`` and ``mu``: this update reads the ones it was given.
  """
  dtype = _pytorch.scalar_dtype()
  step = jnp.asarray(count, dtype) + 1  # in floating point: count + 1 overflows no int32
  rate = jnp.asarray(lr, dtype)
  eta_new = rate / (1 + jnp.asarray(lambd, dtype) * rate * step) ** jnp.asarray(alpha, dtype)
  mu_new = 1 / jnp.maximum(jnp.ones((), dtype), step - jnp.asarray(t0, dtype))
  decays = not _numerics.is_static_zero(weight_decay)
  return PyTorchASGDScalars(
    eta_new, mu_new, jnp.asarray(lambd, dtype), weight_decay if decays else None, _pytorch.neg_zero(count)
  )


def pytorch_asgd_elementwise(
  s: PyTorchASGDScalars,
  X: Array | None,
  G: Array,
  eta: Array,
  mu: Array,
  ax: Array,
  *,
  maximize: bool,
) -> tuple[Array, Array, Array, Array]:
  """``torch.optim.ASGD``'s step on one tensor, in ``_single_tensor_asgd``'s order::

      grad = -grad if maximize
      step += 1
      grad = grad.add(param, alpha=weight_decay)       if weight_decay != 0
      eta_value = eta.item()
      param.mul_(1 - lambd * eta_value)                 (a Python float)
      param.add_(grad, alpha=-eta_value)
      ax.add_(param.sub(ax).mul_(mu))                   if mu.item() != 1
      ax.copy_(param)                                   otherwise
      eta.copy_(lr / ((1 + lambd * lr * step) ** alpha))
      mu.copy_(1 / max(1, step - t0))

  ``eta`` and ``mu`` are one scalar per parameter (PyTorch's scalar dtype, float32), read here as
  PyTorch reads them. ``1 - lambd * eta`` is computed in the scalar dtype (float64 under
  ``jax_enable_x64``, as PyTorch's Python float) and taken by ``mul_`` in the opmath dtype;
  ``-eta`` by ``add_`` in the tensors' own (``_pytorch.alpha``); ``mu`` by ``mul_`` in the opmath
  dtype (float32 for bfloat16: PyTorch does not round it to bfloat16). Each result is stored in
  its tensor's dtype. Returns ``(U, eta_new, mu_new, ax_new)``, ``U = X_new - X`` (in place).
  """
  if X is None:
    raise ValueError("this update writes the parameters in place: call update(grads, state, params)")
  dt = _pytorch.opmath(X.dtype, G.dtype, ax.dtype)
  x, g, nz = X.astype(dt), G.astype(dt), jnp.asarray(s.neg_zero, dt)
  g_dtype = jnp.promote_types(G.dtype, X.dtype)
  if maximize:
    g = -g
  if s.weight_decay is not None:
    g = _pytorch.stored(x * _pytorch.alpha(s.weight_decay, g_dtype) + g, g_dtype)
  # `1 - lambd * eta_value` in Python float64: two roundings (kept apart by a run-time -0.0).
  wide = _pytorch.scalar_dtype()
  eta_value = eta.astype(wide)
  product = jnp.asarray(s.lambd, wide) * eta_value
  factor = (1 - _pytorch.stored(product, wide, jnp.asarray(s.neg_zero, wide))).astype(dt)
  decayed = _pytorch.stored(x * factor, X.dtype, nz)  # param.mul_(...): stored, then added to
  neg_eta = _pytorch.alpha(-eta.astype(dt), jnp.promote_types(X.dtype, g_dtype))
  x_new = _pytorch.stored(g * neg_eta + decayed, X.dtype)
  # Averaging: ax + (param - ax) * mu, each operation stored; a copy while mu is 1.
  a = ax.astype(dt)
  d_dtype = jnp.promote_types(X.dtype, ax.dtype)
  difference = _pytorch.stored(x_new - a, d_dtype)
  scaled = _pytorch.stored(difference * mu.astype(dt), d_dtype, nz)
  averaged = _pytorch.stored(a + scaled, ax.dtype)
  ax_new = jnp.where(mu != 1, averaged, _pytorch.stored(x_new, ax.dtype)).astype(ax.dtype)
  eta_new = jnp.broadcast_to(jnp.asarray(s.eta_new).astype(eta.dtype), eta.shape)
  mu_new = jnp.broadcast_to(jnp.asarray(s.mu_new).astype(mu.dtype), mu.shape)
  return _pytorch.in_place(x_new, X), eta_new, mu_new, ax_new


class PyTorchASGDState(NamedTuple):
  """State of :func:`pytorch_asgd`: ``count`` (PyTorch's ``step``, the updates done), ``eta`` and
  ``mu`` (one scalar per parameter, in PyTorch's scalar dtype: the step size and the averaging
  weight of the next update) and ``ax`` (the running average of the parameters)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  eta: optax.Updates
  mu: optax.Updates
  ax: optax.Updates


def pytorch_asgd(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  lambd: float = 1e-4,
  alpha: float = 0.75,
  t0: float = 1e6,
  weight_decay: float = 0.0,
  maximize: bool = False,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.ASGD``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_asgd``)::

      grad = -grad if maximize
      grad = grad.add(param, alpha=weight_decay)        if weight_decay != 0
      param.mul_(1 - lambd * eta)
      param.add_(grad, alpha=-eta)
      ax = ax + (param - ax) * mu if mu != 1, else param
      eta = lr / ((1 + lambd * lr * step) ** alpha)
      mu = 1 / max(1, step - t0)

  ``step`` counts the updates done, this one included. ``eta`` starts at the learning rate (a
  schedule's value at the first update) and ``mu`` at 1, one scalar per parameter in PyTorch's
  scalar dtype (float32; float64 if carried so), whatever ``state_dtype``; ``ax`` is the average
  of the parameters since ``t0`` (a copy of them before), which the update never reads: evaluate
  a model at ``state.ax``. Optax has no ASGD. Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, where ``eta`` starts and what each update's new ``eta`` decays from.
    lambd: the decay term, ``>= 0``: of ``eta`` over the steps and of the parameters
      (``param * (1 - lambd * eta)``).
    alpha: the power of ``eta``'s decay, ``>= 0``.
    t0: the step after which ``ax`` averages (``mu = 1 / (step - t0)``); any finite number.
    weight_decay: L2 coefficient added to the gradient, ``>= 0``.
    maximize: negate the gradient first.
    initial_count: PyTorch's ``step`` (updates done) before the first update here.
    state_dtype: dtype of ``ax``; default each parameter's (PyTorch's).

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_asgd(0.5, lambd=0.0, t0=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([1.0, -2.0]), state, params)
    >>> optax.apply_updates(params, updates)  # eta = lr at the first step
    Array([0.5, 3. ], dtype=float32)
    >>> state.ax, state.mu  # a copy of the parameters while mu is 1; then 1 / (step - t0)
    (Array([0.5, 3. ], dtype=float32), Array(1., dtype=float32))
  """
  hyper = dict(lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, maximize=maximize)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _lambd(name: str, value: Any) -> Any:
  """ASGD's decay term, ``>= 0``: ``eta``'s decay and the parameters' (``param * (1 - lambd * eta)``)."""
  why = f"{name} is ASGD's decay term: a negative one grows eta and the parameters at every step"
  return _checks.hyperparameter(name, value, minimum=0.0, why=why)


def _alpha(name: str, value: Any) -> Any:
  """The power of ``eta``'s decay, ``>= 0``."""
  why = f"{name} is the power of eta's decay, lr / (1 + lambd lr step) ** {name}: a negative one grows eta"
  return _checks.hyperparameter(name, value, minimum=0.0, why=why)


def _t0(name: str, value: Any) -> Any:
  """The step after which ``ax`` averages: any finite number."""
  return _checks.hyperparameter(name, value)


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  numbers = {k: hyper[k] for k in ("lambd", "alpha", "t0", "weight_decay")}
  maximize = hyper["maximize"]
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, eta, mu, ax: rule.elementwise(s, X, G, eta, mu, ax, maximize=maximize),
  )


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """``eta (lambd + weight_decay)``, ``eta <= lr``: the coefficients that read ``X``."""
  return R * (float(h["lambd"]) + float(h["weight_decay"]))


RULE = registry.register(
  registry.Rule(
    name="pytorch_asgd",
    transform=pytorch_asgd,
    state=PyTorchASGDState,
    fields=(
      # PyTorch's torch.as_tensor(lr) and torch.ones(()) at a parameter's first step, in its scalar
      # dtype: one of each per parameter. eta stays in (0, lr] and mu in (0, 1].
      registry.Field(
        "eta",
        "eta",
        initial=registry.LEARNING_RATE,
        shape=registry.PER_TENSOR,
        dtypes=registry.TORCH_SCALAR_DTYPES,
        reach=(0.005, 0.05),
      ),
      registry.Field(
        "mu",
        "mu",
        initial=1.0,
        shape=registry.PER_TENSOR,
        dtypes=registry.TORCH_SCALAR_DTYPES,
        reach=(0.01, 1.0),
      ),
      registry.Field("ax", "ax"),
    ),
    hyperparameters={
      "lambd": registry.Hyperparameter(_lambd),
      "alpha": registry.Hyperparameter(_alpha),
      "t0": registry.Hyperparameter(_t0),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "maximize": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=pytorch_asgd_scalars,
    elementwise=pytorch_asgd_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    always_reads_params="Its update writes the parameters in place (PyTorch's param.mul_ and add_)",
    bindings=(
      registry.Binding(
        "torch",
        "ASGD",
        torch=registry.TorchOptimizer(
          options=frozenset({"lambd", "alpha", "t0", "weight_decay", "capturable"}),
          signature=frozenset({"lambd", "t0"}),
          numbers=frozenset({"lr", "lambd", "alpha", "t0", "weight_decay"}),
          capturable=(
            "computes eta and mu as float32 tensors, multiplies by eta with addcmul_ and averages ax "
            "even while mu is 1, not the Python-float step the twin follows"
          ),
          examples={
            "plain": dict(lr=0.05),
            # t0 = 2: ax copies the parameters for the first steps, then averages (mu = 1 / (step
            # - 2) from step 5: the JAX steps cross it, and the late parameter's own steps later).
            "t0": dict(lr=0.05, t0=2.0),
            "lambd": dict(lr=0.05, lambd=0.5, alpha=1.0, t0=0.0),
            "lambd=0": dict(lr=0.05, lambd=0.0, t0=3.0),
            "alpha=0": dict(lr=0.05, lambd=0.1, alpha=0.0, t0=1.0),
            "weight_decay": dict(lr=0.05, weight_decay=0.1, t0=2.0),
            "maximize": dict(lr=0.05, maximize=True, t0=2.0),
            "all": dict(lr=0.03, lambd=0.2, alpha=0.5, t0=1.5, weight_decay=0.05, maximize=True),
          },
        ),
      ),
    ),
    twin_of=None,
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(_gain),
      # t0 = 2: the grid's T = 5 averages with mu_new = 1 / 4, T = 0 and 1 keep mu_new = 1.
      hyper=dict(lambd=0.01, alpha=0.75, t0=2.0, weight_decay=0.01),
      tiny_gradient={"weight_decay": 0.0, "lambd": 0.0},
      outputs=("X_new", "eta", "mu", "ax"),
      tests=registry.TestConfig(dict(lambd=0.01, alpha=0.75, t0=2.0, weight_decay=0.01)),
      dtypes=("float32", "float64", "float16", "bfloat16"),
      edges=(
        registry.Edge("lambd=0", {"hyper": {"lambd": 0.0}}),
        registry.Edge("alpha=0", {"hyper": {"alpha": 0.0}}),
        registry.Edge("alpha=1", {"hyper": {"alpha": 1.0}}),
        # Either side of t0: mu_new 1 at step t0 + 1, then 1 / (step - t0).
        registry.Edge("t0=5,T=5", {"T": 5, "hyper": {"t0": 5.0}}),
        registry.Edge("t0=4,T=5", {"T": 5, "hyper": {"t0": 4.0}}),
        registry.Edge("t0=1000000", {"hyper": {"t0": 1e6}}),
        registry.Edge("state=0,T=3", {"T": 3, "state": "zero"}),  # mu = 1: ax copies
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
        registry.Edge("maximize", {"hyper": {"maximize": True}}),
      ),
    ),
  )
)
