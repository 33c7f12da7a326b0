"""DirectML's Adam (``DML_ADAM_OPTIMIZER_OPERATOR_DESC``): Kingma and Ba's "epsilon hat" Adam."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _numerics, registry

__all__ = [
  "DirectMLAdamScalars",
  "DirectMLAdamState",
  "directml_adam",
  "directml_adam_elementwise",
  "directml_adam_scalars",
  "directml_adam_tensor",
]


class DirectMLAdamScalars(NamedTuple):
  """The per-update scalars of DirectML's Adam: ``LearningRate * Alpha`` and the decays."""

  step_size: Any
  beta1: Any
  beta2: Any
  one_minus_beta1: Any
  one_minus_beta2: Any
  epsilon: Any


def directml_adam_scalars(
  learning_rate: ArrayLike,
  T: ArrayLike,
  *,
  beta1: ArrayLike,
  beta2: ArrayLike,
  epsilon: ArrayLike,
) -> DirectMLAdamScalars:
  """``Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)``, ``LearningRate * Alpha``, ``1 - Beta1``,
  ``1 - Beta2``, and the hyperparameters.

  ``LearningRate * Alpha * M_new / D`` is evaluated left to right, so
  ``LearningRate * Alpha`` is a scalar product.
  """
  T = jnp.asarray(T)
  Alpha = jnp.sqrt(_numerics.one_minus_power(beta2, T)) / _numerics.one_minus_power(beta1, T)
  return DirectMLAdamScalars(
    learning_rate * Alpha, beta1, beta2, _numerics.one_minus(beta1), _numerics.one_minus(beta2), epsilon
  )


def directml_adam_elementwise(
  s: DirectMLAdamScalars,
  X: Array | None,
  G: Array,
  M: Array,
  V: Array,
) -> tuple[Array, Array, Array]:
  """The element-wise part of DirectML's Adam (the formula: :func:`directml_adam`); ``X`` is
  not read (no weight decay). Returns ``(U, M_new, V_new)``."""
  del X
  M_new = s.beta1 * M + s.one_minus_beta1 * G
  V_new = s.beta2 * V + s.one_minus_beta2 * G * G
  return -(s.step_size * M_new / (_numerics.sqrt(V_new) + s.epsilon)), M_new, V_new


def directml_adam_tensor(
  X: Array,
  M: Array,
  V: Array,
  G: Array,
  T: ArrayLike,
  *,
  learning_rate: ArrayLike,
  beta1: ArrayLike,
  beta2: ArrayLike,
  epsilon: ArrayLike,
) -> tuple[Array, Array, Array]:
  """DirectML Adam on one tensor (``onnx_optax.rules.directml_adam``; the formula:
  :func:`directml_adam`).

  Operands in DirectML's order (parameters, first moment, second moment,
  gradient, training step)::

      M_new = Beta1 * M + (1 - Beta1) * G
      V_new = Beta2 * V + (1 - Beta2) * G * G
      Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)
      X_new = X - LearningRate * Alpha * M_new / (sqrt(V_new) + Epsilon)

  ``T`` must be at least 1: at ``T = 0`` ``Alpha`` is 0/0 and the result is
  NaN (callers with concrete values reject it before calling).
  ``LearningRate * Alpha * M_new / D`` is evaluated left to right, so
  ``LearningRate * Alpha`` is a scalar product.

  Returns:
    ``(U, M_new, V_new)`` with ``X + U == X_new`` to the bit.
  """
  hyper = dict(beta1=beta1, beta2=beta2, epsilon=epsilon)
  return _engine.tensor(RULE, learning_rate, T, X, G, M, V, **hyper)  # type: ignore[return-value]


class DirectMLAdamState(NamedTuple):
  """State of :func:`directml_adam`: training step ``T``, moments ``M`` and ``V``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  m: optax.Updates
  v: optax.Updates


def directml_adam(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  beta1: float = 0.9,
  beta2: float = 0.999,
  epsilon: float = 1e-8,
  initial_count: int = 1,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """DirectML ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` as an Optax transform.

  With ``T = state.count``::

      M_new = Beta1 * M + (1 - Beta1) * G
      V_new = Beta2 * V + (1 - Beta2) * G * G
      Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)
      X_new = X - LearningRate * Alpha * M_new / (sqrt(V_new) + Epsilon)

  ``optax.apply_updates(params, updates)`` is ``X_new`` to the bit.

  ``T`` starts at 1 (``initial_count=1``): at ``T = 0`` ``Alpha`` is 0/0.
  DirectML's text says the step "usually starts at 0", but the TensorFlow
  backend built on DirectML passes a ``T`` recovered from TensorFlow's
  1-based ``beta^t`` powers. This is Kingma and Ba's "epsilon hat" form (end
  of section 2 of the Adam paper), TensorFlow 1's ``AdamOptimizer``; Optax's
  ``optax.adam`` is their Algorithm 1 (epsilon inside the bias correction).
  DirectML has no weight decay.

  DirectML gives no defaults; these are the values its documentation calls
  typical (0.9, 0.999, 1e-8). In float16, ``epsilon = 1e-8`` rounds to
  zero: keep the state in float32 (``state_dtype``) or use a larger epsilon.

  Args:
    learning_rate: ``LearningRate``, a float or an Optax schedule.
    beta1: first-moment decay, in ``[0, 1)``.
    beta2: second-moment decay, in ``[0, 1]``. ``beta2 = 1`` is legal but
      degenerate: ``V`` stays 0 and ``Alpha = 0``, so every update is 0;
      refused with ``epsilon = 0``, where every update is 0/0.
    epsilon: added to ``sqrt(V_new)``, ``>= 0``.
    initial_count: ``T`` at the first update, ``>= 1``.
    state_dtype: dtype of ``M`` and ``V``; default each parameter's dtype.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.directml_adam(0.1, epsilon=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(beta1=beta1, beta2=beta2, epsilon=epsilon)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _validate(hyper: dict[str, Any], name: Any) -> None:
  _checks.second_moment_decay_at_one(name("beta2"), hyper["beta2"], hyper["epsilon"])


RULE = registry.register(
  registry.Rule(
    name="directml_adam",
    transform=directml_adam,
    state=DirectMLAdamState,
    fields=(registry.Field("m", "M"), registry.Field("v", "V", second_moment=True)),
    hyperparameters={
      "beta1": registry.Hyperparameter(_checks.first_moment_decay, decay=True),
      "beta2": registry.Hyperparameter(_checks.decay, decay=True, may_be_one=True),
      "epsilon": registry.Hyperparameter(_checks.epsilon),
    },
    scalars=directml_adam_scalars,
    elementwise=directml_adam_elementwise,
    bind=registry.bind_to_scalars,
    minimum_count=1,
    policy=_engine.SPEC,
    validate=_validate,
    bindings=(registry.Binding("directml", "DML_ADAM_OPTIMIZER_OPERATOR_DESC"),),
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(first_moment=lambda h: float(h["beta1"])),
      hyper=dict(beta1=0.9, beta2=0.999, epsilon=1e-8),
      tests=registry.TestConfig(dict(beta1=0.85, beta2=0.95, epsilon=0.3), 0.05, "beta1"),
      edges=(
        registry.Edge("beta1=0", {"hyper": {"beta1": 0.0}}),
        registry.Edge("beta2=1", {"hyper": {"beta2": 1.0}}),
        registry.Edge("epsilon=0", {"hyper": {"epsilon": 0.0}}),
        registry.Edge("beta1=0.999,state=0", {"state": "zero", "hyper": {"beta1": 0.999}}),
      ),
    ),
  )
)
