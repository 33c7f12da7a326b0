"""ONNX ``Adagrad`` (ai.onnx.preview.training, v1): Adagrad with learning-rate decay and L2."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _feedback, _numerics, registry

__all__ = [
  "AdagradScalars",
  "AdagradState",
  "adagrad",
  "adagrad_elementwise",
  "adagrad_scalars",
  "adagrad_tensor",
]


class AdagradScalars(NamedTuple):
  """The per-update scalars of ONNX ``Adagrad``."""

  r: Any
  epsilon: Any
  norm_coefficient: Any


def adagrad_scalars(
  R: ArrayLike,
  T: ArrayLike,
  *,
  decay_factor: ArrayLike,
  epsilon: ArrayLike,
  norm_coefficient: ArrayLike,
) -> AdagradScalars:
  """``r = R / (1 + T * decay_factor)``, and the hyperparameters.

  With ``decay_factor`` the Python number 0, ``r`` is ``R``: ``R / 1`` to the
  bit, and nothing that depends on ``T`` is traced.
  """
  r = R if _numerics.is_static_zero(decay_factor) else R / (1 + jnp.asarray(T) * decay_factor)
  return AdagradScalars(r, epsilon, norm_coefficient)


def adagrad_elementwise(
  s: AdagradScalars,
  X: Array | None,
  G: Array,
  H: Array,
) -> tuple[Array, Array]:
  """The element-wise part of ONNX ``Adagrad`` (the formula: :func:`adagrad`).

  ``r * G_regularized / H_adaptive`` is evaluated left to right, as the
  spec's C-like pseudo code reads: ``(r * G_regularized) / H_adaptive``.
  Returns ``(U, H_new)``.
  """
  G_regularized = _numerics.regularized(s.norm_coefficient, X, G)
  H_new = H + G_regularized * G_regularized
  H_adaptive = _numerics.sqrt(H_new) + s.epsilon
  return -(s.r * G_regularized / H_adaptive), H_new


def adagrad_tensor(
  R: ArrayLike,
  T: ArrayLike,
  X: Array,
  G: Array,
  H: Array,
  *,
  decay_factor: ArrayLike,
  epsilon: ArrayLike,
  norm_coefficient: ArrayLike,
) -> tuple[Array, Array]:
  """ONNX ``Adagrad`` on one tensor (``onnx_optax.rules.adagrad``; the formula: :func:`adagrad`).

  Returns:
    ``(U, H_new)`` with ``X + U == X_new`` to the bit.
  """
  hyper = dict(decay_factor=decay_factor, epsilon=epsilon, norm_coefficient=norm_coefficient)
  return _engine.tensor(RULE, R, T, X, G, H, **hyper)  # type: ignore[return-value]


class AdagradState(NamedTuple):
  """State of :func:`adagrad`: ``T`` and the accumulated squared gradient ``H``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  h: optax.Updates


def adagrad(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  decay_factor: float = 0.0,
  epsilon: float = 1e-6,
  norm_coefficient: float = 0.0,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX ``Adagrad``: Adagrad with learning-rate decay and L2 regularization.

  The ONNX operator (ai.onnx.preview.training, v1) as an Optax transform.
  With ``T = state.count``::

      r             = R / (1 + T * decay_factor)
      G_regularized = norm_coefficient * X + G
      H_new         = H + G_regularized * G_regularized
      H_adaptive    = Sqrt(H_new) + epsilon
      X_new         = X - r * G_regularized / H_adaptive

  ``optax.apply_updates(params, updates)`` is ``X_new`` to the bit.

  ``T`` at the first update: the spec allows 0 (0-based) or 1 (1-based). This
  transform is 0-based by default, as ONNX's own test cases are; pass
  ``initial_count=1`` for the 1-based convention.

  Defaults are the ONNX schema's. The seed's text gives ``epsilon`` a default
  of 0.0, but the schema that every ONNX runtime applies says 1e-6; this
  follows the schema. The accumulator starts at zero (``H = 0``).

  This is PyTorch's ``torch.optim.Adagrad(lr=R, lr_decay=decay_factor,
  weight_decay=norm_coefficient, eps=epsilon, initial_accumulator_value=0)``
  (its ``step - 1`` is our 0-based ``T``). Optax's ``optax.adagrad`` differs:
  no decay, epsilon inside the square root, and an initial accumulator of 0.1.

  Args:
    learning_rate: ``R``, a float or an Optax schedule.
    decay_factor: learning-rate decay, ``>= 0`` (a negative value would
      divide by zero at ``T = -1/decay_factor``).
    epsilon: added to ``Sqrt(H_new)``, ``>= 0``.
    norm_coefficient: L2 coefficient (PyTorch ``weight_decay``).
    initial_count: ``T`` at the first update (0 or 1 by the spec's text).
    state_dtype: dtype of ``H``; default each parameter's dtype. Use float32
      for float16 parameters: ``H`` only grows and float16 overflows at 65504.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.adagrad(0.1, decay_factor=0.1, epsilon=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([2.0, -4.0]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(decay_factor=decay_factor, epsilon=epsilon, norm_coefficient=norm_coefficient)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


RULE = registry.register(
  registry.Rule(
    name="adagrad",
    transform=adagrad,
    state=AdagradState,
    fields=(registry.Field("h", "H", second_moment=True),),
    hyperparameters={
      "decay_factor": registry.Hyperparameter(_checks.learning_rate_decay),
      "epsilon": registry.Hyperparameter(_checks.epsilon),
      "norm_coefficient": registry.Hyperparameter(_checks.coefficient),
    },
    scalars=adagrad_scalars,
    elementwise=adagrad_elementwise,
    bind=registry.bind_to_scalars,
    minimum_count=0,
    policy=_engine.SPEC,
    params_for=("norm_coefficient",),
    bindings=(registry.Binding("onnx", "Adagrad", domain="ai.onnx.preview.training"),),
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(
        lambda h, R, T0, n: _feedback.adagrad(float(h["norm_coefficient"]), float(h["epsilon"]), R)
      ),
      hyper=dict(decay_factor=0.1, epsilon=1e-6, norm_coefficient=0.01),
      tiny_gradient={"norm_coefficient": 0.0},
      tests=registry.TestConfig(
        dict(decay_factor=0.2, epsilon=0.5, norm_coefficient=0.05), 0.3, "decay_factor"
      ),
      edges=(
        registry.Edge("epsilon=0", {"hyper": {"epsilon": 0.0}}),
        registry.Edge("decay_factor=0", {"hyper": {"decay_factor": 0.0}}),
        registry.Edge("norm_coefficient=0", {"hyper": {"norm_coefficient": 0.0}}),
      ),
    ),
  )
)
