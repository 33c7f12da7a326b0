"""ONNX ``Momentum`` (ai.onnx.preview.training, v1): SGD with momentum, standard or Nesterov."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _feedback, _numerics, registry

__all__ = [
  "MODES",
  "MomentumScalars",
  "MomentumState",
  "momentum",
  "momentum_elementwise",
  "momentum_scalars",
  "momentum_tensor",
]

#: The values of ONNX Momentum's ``mode`` attribute.
MODES = ("standard", "nesterov")


class MomentumScalars(NamedTuple):
  """The per-update scalars of ONNX ``Momentum``.

  ``beta_adjusted`` is None when ``beta`` is the Python number 1: it is 1 at
  every ``T`` then, and ``1 * G_regularized`` is ``G_regularized`` to the bit
  (``optax.sgd``'s momentum, PyTorch's ``dampening = 0``), so the factor is
  not traced per leaf.
  """

  R: Any
  alpha: Any
  beta_adjusted: Any
  norm_coefficient: Any


def momentum_scalars(
  R: ArrayLike,
  T: ArrayLike,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  norm_coefficient: ArrayLike,
) -> MomentumScalars:
  """``beta_adjusted = T > 0 ? beta : 1``, and the hyperparameters."""
  beta_adjusted = None if _numerics.is_static(beta, 1) else jnp.where(jnp.asarray(T) > 0, beta, 1)
  return MomentumScalars(R, alpha, beta_adjusted, norm_coefficient)


def momentum_elementwise(
  s: MomentumScalars,
  X: Array | None,
  G: Array,
  V: Array,
  *,
  mode: str,
) -> tuple[Array, Array]:
  """The element-wise part of ONNX ``Momentum`` (the formula: :func:`momentum`).

  Returns ``(U, V_new)``; ``mode`` is ``"standard"`` or ``"nesterov"``.
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  G_regularized = _numerics.regularized(s.norm_coefficient, X, G)
  V_new = s.alpha * V + (G_regularized if s.beta_adjusted is None else s.beta_adjusted * G_regularized)
  if mode == "standard":
    return -(s.R * V_new), V_new
  return -(s.R * (G_regularized + s.alpha * V_new)), V_new


def momentum_tensor(
  R: ArrayLike,
  T: ArrayLike,
  X: Array,
  G: Array,
  V: Array,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  mode: str,
  norm_coefficient: ArrayLike,
) -> tuple[Array, Array]:
  """ONNX ``Momentum`` on one tensor (``onnx_optax.rules.momentum``; the formula: :func:`momentum`).

  ``T`` is the number of updates already conducted (0 at the first), so the first update uses
  ``beta_adjusted = 1``.

  Returns:
    ``(U, V_new)`` with ``X + U == X_new`` to the bit.
  """
  hyper = dict(alpha=alpha, beta=beta, mode=mode, norm_coefficient=norm_coefficient)
  return _engine.tensor(RULE, R, T, X, G, V, **hyper)  # type: ignore[return-value]


class MomentumState(NamedTuple):
  """State of :func:`momentum`: the update count ``T`` and the momentum ``V``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  v: optax.Updates


def momentum(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  alpha: float,
  beta: float,
  mode: str,
  norm_coefficient: float,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX ``Momentum``: SGD with momentum, standard or Nesterov.

  The ONNX operator (ai.onnx.preview.training, v1) as an Optax transform.
  With ``T`` the number of updates already conducted (``state.count``)::

      G_regularized = norm_coefficient * X + G
      beta_adjusted = T > 0 ? beta : 1
      V_new         = alpha * V + beta_adjusted * G_regularized
      standard:  X_new = X - R * V_new
      nesterov:  X_new = X - R * (G_regularized + alpha * V_new)

  ``optax.apply_updates(params, updates)`` is ``X_new`` to the bit.

  This is PyTorch's ``torch.optim.SGD(lr=R, momentum=alpha,
  dampening=1 - beta, weight_decay=norm_coefficient, nesterov=...)``: its
  first step also sets the buffer to the undamped gradient. Optax's
  ``optax.sgd(R, momentum=alpha)`` is the case ``beta = 1``,
  ``norm_coefficient = 0``.

  Args:
    learning_rate: ``R``, a float or an Optax schedule.
    alpha: decay of the momentum ``V`` (PyTorch ``momentum``).
    beta: scale of the gradient in ``V_new`` from the second update on
      (PyTorch ``1 - dampening``).
    mode: ``"standard"`` or ``"nesterov"``.
    norm_coefficient: L2 coefficient, the gradient of
      ``0.5 * norm_coefficient * ||X||^2`` is added (PyTorch ``weight_decay``).
    initial_count: ``T`` at the first update. The schema says 0; pass 1 to
      resume a run whose first-step damping rule must not apply.
    state_dtype: dtype of ``V``; default each parameter's dtype.

  All four hyperparameters are required, as in the ONNX schema.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.momentum(0.1, alpha=0.9, beta=0.5, mode="standard",
    ...                           norm_coefficient=0.0)
    >>> params = {"w": jnp.array([1.0, 2.0])}
    >>> state = opt.init(params)
    >>> updates, state = opt.update({"w": jnp.array([1.0, -1.0])}, state)
    >>> optax.apply_updates(params, updates)["w"]
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(alpha=alpha, beta=beta, mode=mode, norm_coefficient=norm_coefficient)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _mode(name: str, value: Any) -> str:
  """Momentum's ``mode``: ``"standard"`` or ``"nesterov"``."""
  if not isinstance(value, str):
    raise TypeError(f"{name} must be a str, one of {MODES}, got {type(value).__name__} {value!r}")
  if value not in MODES:
    raise ValueError(f"{name} must be one of {MODES}, got {value!r}")
  return value


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  mode, numbers = hyper["mode"], {k: v for k, v in hyper.items() if k != "mode"}
  return (
    lambda R, T: rule.scalars(R, T, **numbers),
    lambda s, X, G, V: rule.elementwise(s, X, G, V, mode=mode),
  )


RULE = registry.register(
  registry.Rule(
    name="momentum",
    transform=momentum,
    state=MomentumState,
    fields=(registry.Field("v", "V"),),
    hyperparameters={
      "alpha": registry.Hyperparameter(_checks.decay, decay=True, may_be_one=True),
      "beta": registry.Hyperparameter(_checks.gradient_weight),
      "mode": registry.Hyperparameter(_mode, static=True),
      "norm_coefficient": registry.Hyperparameter(_checks.coefficient),
    },
    scalars=momentum_scalars,
    elementwise=momentum_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.SPEC,
    params_for=("norm_coefficient",),
    bindings=(registry.Binding("onnx", "Momentum", domain="ai.onnx.preview.training"),),
    variants=(
      registry.Variant("standard", {"mode": "standard"}),  # the tests' configuration below
      registry.Variant(
        "nesterov",
        {"mode": "nesterov"},
        registry.TestConfig(dict(alpha=0.8, beta=0.6, mode="nesterov", norm_coefficient=0.05), 0.05, "beta"),
      ),
    ),
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(
        lambda h, R, T0, n: _feedback.momentum(float(h["alpha"]), float(h["norm_coefficient"]), R)
      ),
      hyper=dict(alpha=0.9, beta=0.8, mode="standard", norm_coefficient=0.01),
      tiny_gradient={"norm_coefficient": 0.0},
      tests=registry.TestConfig(
        dict(alpha=0.9, beta=0.7, mode="standard", norm_coefficient=0.05), 0.05, "alpha"
      ),
      edges=(
        registry.Edge("alpha=0", {"hyper": {"alpha": 0.0}}),
        registry.Edge("beta=1", {"hyper": {"beta": 1.0}}),
        registry.Edge("beta=0", {"hyper": {"beta": 0.0}}),
        registry.Edge("beta=0,T=0", {"T": 0, "hyper": {"beta": 0.0}}),
        registry.Edge("norm_coefficient=0", {"hyper": {"norm_coefficient": 0.0}}),
      ),
    ),
  )
)
