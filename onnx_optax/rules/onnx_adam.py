"""ONNX ``Adam`` (ai.onnx.preview.training, v1), epsilon outside the bias correction."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _feedback, _numerics, registry

__all__ = ["AdamScalars", "AdamState", "adam", "adam_elementwise", "adam_scalars", "adam_tensor"]


class AdamScalars(NamedTuple):
  """The per-update scalars of ONNX ``Adam``.

  ``one_minus_post`` is None when ``norm_coefficient_post`` is the Python
  number 0: then ``X_final`` is ``X_new`` and the additive update is exact.
  """

  R_adjusted: Any
  alpha: Any
  beta: Any
  one_minus_alpha: Any
  one_minus_beta: Any
  epsilon: Any
  norm_coefficient: Any
  one_minus_post: Any


def adam_scalars(
  R: ArrayLike,
  T: ArrayLike,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  epsilon: ArrayLike,
  norm_coefficient: ArrayLike,
  norm_coefficient_post: ArrayLike,
) -> AdamScalars:
  """``R_adjusted = T > 0 ? R * Sqrt(1 - beta^T) / (1 - alpha^T) : R``, the decays' ``1 - alpha``,
  ``1 - beta``, ``1 - norm_coefficient_post``, and the hyperparameters."""
  T = jnp.asarray(T)
  # Both branches of a `where` are evaluated; T = 0 in the bias correction
  # would be 0/0, whose NaN poisons gradients taken through the `where`.
  T_positive = jnp.where(T > 0, T, 1)
  R_adjusted = jnp.where(
    T > 0,
    R * jnp.sqrt(_numerics.one_minus_power(beta, T_positive)) / _numerics.one_minus_power(alpha, T_positive),
    R,
  )
  one_minus_post = (
    None if _numerics.is_static_zero(norm_coefficient_post) else _numerics.one_minus(norm_coefficient_post)
  )
  return AdamScalars(
    R_adjusted,
    alpha,
    beta,
    _numerics.one_minus(alpha),
    _numerics.one_minus(beta),
    epsilon,
    norm_coefficient,
    one_minus_post,
  )


def adam_elementwise(
  s: AdamScalars,
  X: Array | None,
  G: Array,
  V: Array,
  H: Array,
) -> tuple[Array, Array, Array]:
  """The element-wise part of ONNX ``Adam`` (the formula: :func:`adam`).

  Returns ``(U, V_new, H_new)``, ``U`` as in :func:`adam_tensor`.
  """
  G_regularized = _numerics.regularized(s.norm_coefficient, X, G)
  V_new = s.alpha * V + s.one_minus_alpha * G_regularized
  H_new = s.beta * H + s.one_minus_beta * G_regularized * G_regularized
  H_sqrt = _numerics.sqrt(H_new) + s.epsilon
  if s.one_minus_post is None:
    return -(s.R_adjusted * V_new / H_sqrt), V_new, H_new
  if X is None:
    raise ValueError("norm_coefficient_post multiplies X: the parameters must be read")
  X_new = X - s.R_adjusted * V_new / H_sqrt
  X_final = s.one_minus_post * X_new
  return X_final - X, V_new, H_new


def adam_tensor(
  R: ArrayLike,
  T: ArrayLike,
  X: Array,
  G: Array,
  V: Array,
  H: Array,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  epsilon: ArrayLike,
  norm_coefficient: ArrayLike,
  norm_coefficient_post: ArrayLike,
) -> tuple[Array, Array, Array]:
  """ONNX ``Adam`` on one tensor (``onnx_optax.rules.adam``; the formula: :func:`adam`).

  ``R_adjusted * V_new / H_sqrt`` is ``(R_adjusted * V_new) / H_sqrt``, the
  order of the operator schema's text (ONNX's NumPy reference evaluates
  ``R_adjusted * (V_new / H_sqrt)``; the two differ by one rounding).

  Returns:
    ``(U, V_new, H_new)``. When ``norm_coefficient_post`` is the Python
    number 0, ``X_final == X_new`` and ``X + U == X_new`` to the bit. Otherwise
    no additive ``U`` can reproduce the multiplication exactly: ``U`` is
    ``X_final - X``, and ``X + U`` equals ``X_final`` to the bit whenever
    ``X_final`` and ``X`` are within a factor of two of each other (Sterbenz'
    lemma makes the subtraction exact), and in general within one ulp of
    ``max(|X|, |X_final|)`` (the subtraction's rounding and the addition's).
  """
  hyper = dict(
    alpha=alpha,
    beta=beta,
    epsilon=epsilon,
    norm_coefficient=norm_coefficient,
    norm_coefficient_post=norm_coefficient_post,
  )
  return _engine.tensor(RULE, R, T, X, G, V, H, **hyper)  # type: ignore[return-value]


class AdamState(NamedTuple):
  """State of :func:`adam` (ONNX): ``T``, first moment ``V``, second moment ``H``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  v: optax.Updates
  h: optax.Updates


def adam(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  alpha: float = 0.9,
  beta: float = 0.999,
  epsilon: float = 1e-6,
  norm_coefficient: float = 0.0,
  norm_coefficient_post: float = 0.0,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX ``Adam`` (ai.onnx.preview.training, v1) as an Optax transform.

  With ``T = state.count``, the number of updates already conducted::

      G_regularized = norm_coefficient * X + G
      V_new         = alpha * V + (1 - alpha) * G_regularized
      H_new         = beta * H + (1 - beta) * G_regularized * G_regularized
      H_sqrt        = Sqrt(H_new) + epsilon
      R_adjusted    = T > 0 ? R * Sqrt(1 - beta^T) / (1 - alpha^T) : R
      X_new         = X - R_adjusted * V_new / H_sqrt
      X_final       = (1 - norm_coefficient_post) * X_new

  ``optax.apply_updates(params, updates)`` is ``X_final`` to the bit when
  ``norm_coefficient_post`` is 0, and otherwise to the bit where ``X`` and
  ``X_final`` are within a factor of two, within one ulp of
  ``max(|X|, |X_final|)`` in general
  (see :func:`onnx_optax.rules.adam`).

  Note the spec's ``T``: the first update (``T = 0``) has no bias correction
  and the second uses ``T = 1``. With ``initial_count=1`` the rule is Adam
  with Kingma and Ba's "epsilon hat" (epsilon outside the bias correction),
  TensorFlow 1's ``tf.compat.v1.train.AdamOptimizer``, plus L2 and a
  multiplicative decay. ``optax.adam`` puts epsilon inside the bias
  correction instead.

  Defaults are the ONNX schema's (stored there as float32: 0.9 reads back as
  0.89999998; the defaults here are the Python floats).

  Args:
    learning_rate: ``R``, a float or an Optax schedule.
    alpha: first-moment decay, in ``[0, 1)`` (``alpha = 1`` divides by zero).
    beta: second-moment decay, in ``[0, 1]``. ``beta = 1`` is legal but
      degenerate: ``H`` stays 0, the first update is ``R * V_new / epsilon``
      and every later one is 0 (``Sqrt(1 - beta^T) = 0``); refused with
      ``epsilon = 0``, where every update is 0/0.
    epsilon: added to ``Sqrt(H_new)``, ``>= 0``.
    norm_coefficient: L2 coefficient added to the gradient.
    norm_coefficient_post: multiplicative decay of the new parameters.
    initial_count: ``T`` at the first update.
    state_dtype: dtype of ``V`` and ``H``; default each parameter's dtype.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.adam(0.1, alpha=0.5, beta=0.75, epsilon=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([2.0, -2.0]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    alpha=alpha,
    beta=beta,
    epsilon=epsilon,
    norm_coefficient=norm_coefficient,
    norm_coefficient_post=norm_coefficient_post,
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _validate(hyper: dict[str, Any], name: Any) -> None:
  _checks.second_moment_decay_at_one(name("beta"), hyper["beta"], hyper["epsilon"])


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """Through ``norm_coefficient``: ONNX Adam's step ``R_adjusted V / (sqrt(H) + epsilon)``."""
  alpha, beta = float(h["alpha"]), float(h["beta"])
  T = _feedback.bias_steps(T0, steps)
  correction = max(1.0, float(np.max(np.sqrt(1 - beta**T) / (1 - alpha**T))))
  return _feedback.adam(float(h["norm_coefficient"]), float(h["epsilon"]), R * correction)


RULE = registry.register(
  registry.Rule(
    name="adam",
    transform=adam,
    state=AdamState,
    fields=(registry.Field("v", "V"), registry.Field("h", "H", second_moment=True)),
    hyperparameters={
      "alpha": registry.Hyperparameter(_checks.first_moment_decay, decay=True),
      "beta": registry.Hyperparameter(_checks.decay, decay=True, may_be_one=True),
      "epsilon": registry.Hyperparameter(_checks.epsilon),
      "norm_coefficient": registry.Hyperparameter(_checks.coefficient),
      "norm_coefficient_post": registry.Hyperparameter(_checks.parameter_decay),
    },
    scalars=adam_scalars,
    elementwise=adam_elementwise,
    bind=registry.bind_to_scalars,
    minimum_count=0,
    policy=_engine.SPEC,
    params_for=("norm_coefficient", "norm_coefficient_post"),
    validate=_validate,
    bindings=(registry.Binding("onnx", "Adam", domain="ai.onnx.preview.training"),),
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(_gain, lambda h: float(h["alpha"])),
      hyper=dict(alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.01, norm_coefficient_post=0.0),
      tiny_gradient={"norm_coefficient": 0.0},
      outputs=("X_final", "V_new", "H_new"),
      tests=registry.TestConfig(
        dict(alpha=0.85, beta=0.95, epsilon=0.3, norm_coefficient=0.05, norm_coefficient_post=0.01),
        0.05,
        "beta",
      ),
      edges=(
        registry.Edge("alpha=0", {"hyper": {"alpha": 0.0}}),
        registry.Edge("beta=1", {"hyper": {"beta": 1.0}}),
        registry.Edge("beta=1,T=0", {"T": 0, "hyper": {"beta": 1.0}}),
        registry.Edge("beta=0", {"hyper": {"beta": 0.0}}),
        registry.Edge("epsilon=0", {"hyper": {"epsilon": 0.0}}),
        registry.Edge("norm_coefficient_post", {"hyper": {"norm_coefficient_post": 0.02}}),
        registry.Edge("norm_coefficient_post,T=0", {"T": 0, "hyper": {"norm_coefficient_post": 0.02}}),
        # Large enough to stand out of bfloat16's rounding of X (0.02 is 5 u there).
        registry.Edge("norm_coefficient_post=0.25", {"hyper": {"norm_coefficient_post": 0.25}}),
        registry.Edge("norm_coefficient=0", {"hyper": {"norm_coefficient": 0.0}}),
        registry.Edge("alpha=0.999,state=0", {"state": "zero", "hyper": {"alpha": 0.999}}),
      ),
    ),
  )
)
