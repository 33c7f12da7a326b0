"""``keras.optimizers.Adam`` (Keras 3) in Keras's order: the float32 twin of DirectML's Adam."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _numerics, registry
from onnx_optax.rules import directml

__all__ = ["KerasAdamScalars", "KerasAdamState", "keras_adam", "keras_adam_elementwise", "keras_adam_scalars"]


class KerasAdamScalars(NamedTuple):
  """The per-update inputs of :func:`onnx_optax.keras_adam`: the learning rate and the count
  (Keras's ``iterations``); Keras computes its scalars from them in each variable's dtype.

  ``arrays``: the hyperparameters that arrive as arrays (``optax.inject_hyperparams``; traced
  under ``jax.jit`` or ``jax.grad``), by name, None when all are Python numbers. They reach the
  element-wise part through the scalars, the inputs of the leaf loop that a derivative is taken
  through, never as constants captured by it (a traced constant would leak out of the loop's
  ``jax.custom_jvp``).
  """

  lr: Any
  count: Any
  arrays: dict[str, Any] | None = None


def keras_adam_scalars(lr: ArrayLike, count: ArrayLike) -> KerasAdamScalars:
  """``(lr, count)``: Keras derives ``alpha`` per variable, in the variable's dtype."""
  return KerasAdamScalars(lr, count)


def keras_adam_elementwise(
  s: KerasAdamScalars,
  X: Array | None,
  G: Array,
  m: Array,
  v: Array,
  *,
  beta_1: float,
  beta_2: float,
  epsilon: float,
) -> tuple[Array, Array, Array]:
  """Keras 3 ``Adam.update_step`` on one variable, its expressions in its order::

      local_step = cast(iterations + 1);  lr = cast(learning_rate)
      alpha = lr * sqrt(1 - cast(beta_2) ** local_step) / (1 - cast(beta_1) ** local_step)
      m += (g - m) * (1 - beta_1)
      v += (square(g) - v) * (1 - beta_2)
      variable -= (m * alpha) / (sqrt(v) + epsilon)

  ``1 - beta_1`` and ``1 - beta_2`` are Python float64 numbers rounded once, as Keras's
  Python arithmetic gives them; the rest is in the variable's dtype. Written as Keras's
  JAX backend writes it, so that XLA compiles it as it compiles Keras's jitted step
  (``model.fit``). ``X`` is not read: ``variable -= step`` is ``X + (-step)`` to the bit.
  Returns ``(U, m_new, v_new)``: ``U`` in the gradient's (the variable's) dtype, the moments
  in their own, as Keras's ``assign`` stores them (with a ``state_dtype`` other than the
  variable's, which Keras does not have, the arithmetic of the mixed dtypes rounded there).
  """
  del X  # Keras subtracts the step from the variable: the update is the negated step.
  dt = G.dtype
  g = G
  lr = jnp.asarray(s.lr).astype(dt)
  local_step = jnp.asarray(s.count).astype(dt) + jnp.asarray(1, dt)
  beta_1_power = jnp.power(jnp.asarray(beta_1, dt), local_step)
  beta_2_power = jnp.power(jnp.asarray(beta_2, dt), local_step)
  alpha = lr * jnp.sqrt(1 - beta_2_power) / (1 - beta_1_power)
  d_m = g - m
  m_new = m + d_m * _weak(1 - beta_1, d_m)
  d_v = jnp.square(g) - v
  v_new = v + d_v * _weak(1 - beta_2, d_v)
  root = _numerics.sqrt(v_new)
  U = -((m_new * alpha) / (root + _weak(epsilon, root)))
  return _stored(U, G.dtype), _stored(m_new, m.dtype), _stored(v_new, v.dtype)


def _weak(c: Any, x: Array) -> Any:
  """A hyperparameter where it meets the tensor ``x``: a Python number as it is (JAX rounds it to
  ``x``'s dtype, as Keras's Python floats are), an array (injected) rounded to ``x``'s dtype alike."""
  return c if isinstance(c, (int, float)) else jnp.asarray(c, x.dtype)


def _stored(x: Array, dtype: Any) -> Array:
  """``x`` in ``dtype``; no operation where it is already (the variable's dtype throughout)."""
  return x if x.dtype == dtype else x.astype(dtype)


class KerasAdamState(NamedTuple):
  """State of :func:`keras_adam`: ``count`` (Keras's ``iterations``, the updates done), the
  first moments ``momentums`` and the second ``velocities`` (Keras's ``_momentums`` and
  ``_velocities``)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  momentums: optax.Updates
  velocities: optax.Updates


def keras_adam(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  beta_1: float = 0.9,
  beta_2: float = 0.999,
  epsilon: float = 1e-7,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """Keras 3 ``keras.optimizers.Adam`` in Keras's order: the float32 twin of :func:`onnx_optax.directml_adam`.

  The same rule as DirectML Adam (``T = count + 1``) in exact arithmetic, written as Keras's
  ``Adam.update_step`` writes it (``count`` is Keras's ``iterations``)::

      alpha = lr * sqrt(1 - beta_2 ** (count + 1)) / (1 - beta_1 ** (count + 1))
      m += (g - m) * (1 - beta_1)
      v += (square(g) - v) * (1 - beta_2)
      variable -= (m * alpha) / (sqrt(v) + epsilon)

  in the variable's dtype, ``1 - beta_1`` and ``1 - beta_2`` Python float64 numbers rounded
  once (DirectML's rule computes ``1 - beta`` from the rounded ``beta``). Under ``jax.jit`` it
  compiles as Keras's jitted step on the JAX backend (``model.fit``) compiles. Defaults are
  Keras's.

  bfloat16 parameters take no step with ``beta_2 >= 0.998046875``, the default 0.999 among
  them: Keras casts ``beta_2`` to the variable's dtype, where it is 1.0, so ``1 - beta_2 **
  local_step`` and ``alpha`` are 0 and every update is zero, in Keras (3.15.1) as here. It is
  Keras's step and is not refused; float32 parameters (Keras's ``mixed_bfloat16`` policy keeps
  its variables float32), or a ``beta_2`` of 0.998 or less, move.

  Args:
    learning_rate: a float or an Optax schedule.
    beta_1: in ``[0, 1)``.  beta_2: in ``[0, 1]``.  epsilon: ``>= 0``.
    initial_count: Keras's ``iterations`` before the first update here.
    state_dtype: dtype of the moments; default each parameter's.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.keras_adam(0.1, epsilon=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state, params)
    >>> optax.apply_updates(params, updates)  # Keras's float32 bias corrections: 0.9 +- ulps
    Array([0.9000007, 2.0999994], dtype=float32)
  """
  hyper = dict(beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _python_float(value: Any) -> Any:
  """A concrete hyperparameter as a Python float; a traced one as it is."""
  return value if _checks.is_traced(value) else float(value)


# Python floats, as Keras holds them (1 - beta is then rounded once from float64); an injected,
# traced value stays an array (optax.inject_hyperparams).
def _beta_1(name: str, value: Any) -> Any:
  return _python_float(_checks.first_moment_decay(name, value))


def _beta_2(name: str, value: Any) -> Any:
  return _python_float(_checks.decay(name, value))


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  # Python numbers are constants of the element-wise part; arrays go through the scalars.
  arrays = {k: v for k, v in hyper.items() if not isinstance(v, (int, float))} or None
  numbers = {k: v for k, v in hyper.items() if arrays is None or k not in arrays}

  def scalars(R: Any, T: Any) -> KerasAdamScalars:
    s = rule.scalars(R, T)
    return s if arrays is None else s._replace(arrays=arrays)

  def elementwise(s: KerasAdamScalars, X: Any, G: Array, m: Array, v: Array) -> tuple[Array, Array, Array]:
    return rule.elementwise(s, X, G, m, v, **numbers, **(s.arrays or {}))

  return scalars, elementwise


RULE = registry.register(
  registry.Rule(
    name="keras_adam",
    transform=keras_adam,
    state=KerasAdamState,
    fields=(registry.Field("momentums", "m"), registry.Field("velocities", "v", second_moment=True)),
    hyperparameters={
      "beta_1": registry.Hyperparameter(_beta_1),
      "beta_2": registry.Hyperparameter(_beta_2),
      "epsilon": registry.Hyperparameter(_checks.epsilon),
    },
    scalars=keras_adam_scalars,
    elementwise=keras_adam_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    bindings=(registry.Binding("keras", "Adam"),),
    twin_of=directml.RULE,
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(first_moment=lambda h: float(h["beta_1"])),
      hyper=dict(beta_1=0.9, beta_2=0.999, epsilon=1e-7),
      outputs=("X_new", "m", "v"),
      tests=registry.TestConfig(dict(beta_1=0.9, beta_2=0.999, epsilon=0.3), 0.05, ""),
      # Keras computes in the variable's dtype: bfloat16 parameters would be a bfloat16 step.
      dtypes=("float32", "float64"),
      edges=(
        registry.Edge("beta_1=0", {"hyper": {"beta_1": 0.0}}),
        registry.Edge("epsilon=0", {"hyper": {"epsilon": 0.0}}),
        registry.Edge("beta_1=0.999,state=0", {"state": "zero", "hyper": {"beta_1": 0.999}}),
      ),
    ),
  )
)
