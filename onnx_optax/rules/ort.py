"""ONNX Runtime's training optimizers (com.microsoft, v1): ``AdamWOptimizer`` and ``SGDOptimizerV2``."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _numerics, registry

__all__ = [
  "ADAM_MODES",
  "OrtAdamWScalars",
  "OrtAdamWState",
  "OrtSGDScalars",
  "OrtSGDState",
  "ort_adamw",
  "ort_adamw_elementwise",
  "ort_adamw_scalars",
  "ort_adamw_tensor",
  "ort_sgd",
  "ort_sgd_elementwise",
  "ort_sgd_scalars",
  "ort_sgd_tensor",
]

#: The values of ONNX Runtime AdamWOptimizer's ``adam_mode`` attribute: 0 is PyTorch's
#: ``torch.optim.AdamW``, 1 is Hugging Face's ``transformers.AdamW``.
ADAM_MODES = (0, 1)

_DOMAIN = "com.microsoft"


# -- AdamWOptimizer ---------------------------------------------------------------------


class OrtAdamWScalars(NamedTuple):
  """The per-update scalars of ONNX Runtime's ``AdamWOptimizer``.

  ``alpha_correction`` and ``one_over_beta_correction`` (``adam_mode = 0``
  only) are 1 without bias correction (``correct_bias = 0``).
  ``lr_corrected`` and ``lr_weight_decay`` (``lr * weight_decay``, a scalar
  product in the kernel) are used by ``adam_mode = 1`` only.

  ``M2 / beta_correction`` is evaluated as ``M2 * (1 / beta_correction)``:
  XLA rewrites a division by a broadcast scalar into that product anyway (on
  the CPU, eager or jitted), so the rule says it, and the reciprocal is a
  scalar of the update. It is one rounding more than the kernel's quotient.

  ``weight_decay`` is None when it is the Python number 0: the decay
  ``W - W * lr * 0`` is ``W`` to the bit for finite ``W``, so it is not
  traced and the update is a single subtraction.
  """

  lr: Any
  alpha: Any
  beta: Any
  one_minus_alpha: Any
  one_minus_beta: Any
  epsilon: Any
  weight_decay: Any
  alpha_correction: Any
  one_over_beta_correction: Any
  lr_corrected: Any
  lr_weight_decay: Any


def _check_adam_mode(adam_mode: Any, correct_bias: Any) -> None:
  """``adam_mode`` in {0, 1}; ``correct_bias`` in {0, 1} and 1 in mode 0, as ONNX Runtime enforces.

  The function-level API has no transform before it, so it runs the transform's own checks.
  """
  mode, correct = _adam_mode("adam_mode", adam_mode), _checks.flag("correct_bias", correct_bias)
  _refuse_mode0_without_correction(mode, correct, str)


def ort_adamw_scalars(
  R: ArrayLike,
  T: ArrayLike,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  epsilon: ArrayLike,
  weight_decay: ArrayLike,
  adam_mode: int,
  correct_bias: bool | int,
) -> OrtAdamWScalars:
  """The bias corrections, ``lr_corrected``, ``1 - alpha``, ``1 - beta``, ``lr * weight_decay``::

      correct_bias = 1:  alpha_correction = 1 - alpha^step
                         beta_correction  = 1 - beta^step
                         lr_corrected     = lr * Sqrt(beta_correction) / alpha_correction
      correct_bias = 0:  alpha_correction = beta_correction = 1, lr_corrected = lr

  ``T`` is the kernel's ``step`` input: 1 at the first update. The bias
  corrections are the spec's numbers in the hyperparameters' dtype, without
  cancellation (:func:`onnx_optax._numerics.one_minus_power`); the CPU kernel rounds
  ``pow(alpha, step)`` to float32 before subtracting it from 1 (docs/spec.md,
  section 5, says what that changes).
  """
  _check_adam_mode(adam_mode, correct_bias)
  alpha_correction: Any
  beta_correction: Any
  lr_corrected: Any
  if correct_bias:
    T = jnp.asarray(T)
    alpha_correction = _numerics.one_minus_power(alpha, T)
    beta_correction = _numerics.one_minus_power(beta, T)
    lr_corrected = R * jnp.sqrt(beta_correction) / alpha_correction
  else:
    alpha_correction, beta_correction, lr_corrected = 1, 1, R
  decay = None if _numerics.is_static_zero(weight_decay) else weight_decay
  return OrtAdamWScalars(
    R,
    alpha,
    beta,
    _numerics.one_minus(alpha),
    _numerics.one_minus(beta),
    epsilon,
    decay,
    alpha_correction if adam_mode == 0 else None,
    1 / beta_correction if adam_mode == 0 else None,
    lr_corrected if adam_mode == 1 else None,
    # jnp: two Python floats would multiply in float64, an injected pair in float32.
    None if decay is None or adam_mode == 0 else jnp.multiply(R, decay),
  )


def ort_adamw_elementwise(
  s: OrtAdamWScalars,
  X: Array | None,
  G: Array,
  M1: Array,
  M2: Array,
  *,
  adam_mode: int,
) -> tuple[Array, Array, Array]:
  """The element-wise part of ONNX Runtime's ``AdamWOptimizer``, in the kernel's order::

      adam_mode = 0 (PyTorch's AdamW):
        W     = W - W * lr * weight_decay
        M1    = alpha * M1 + (1 - alpha) * G
        M2    = beta * M2 + (1 - beta) * G * G
        W_new = W - (lr * M1) / (alpha_correction * (Sqrt(M2 / beta_correction) + epsilon))
      adam_mode = 1 (Hugging Face's AdamW):
        M1    = alpha * M1 + (1 - alpha) * G
        M2    = beta * M2 + (1 - beta) * G * G
        W     = W - lr_corrected * M1 / (Sqrt(M2) + epsilon)
        W_new = W - (lr * weight_decay) * W

  ``M2 / beta_correction`` is ``M2 * (1 / beta_correction)`` (see
  :class:`OrtAdamWScalars`); every other operation is the kernel's, in its
  order.

  Returns ``(U, M1_new, M2_new)``. Without weight decay (``s.weight_decay``
  None) ``U`` is the negated step and ``X + U`` is ``W_new`` to the bit;
  otherwise ``U = W_new - X``, exact whenever ``W_new`` and ``X`` are within
  a factor of two of each other (Sterbenz), within one ulp of
  ``max(|X|, |W_new|)`` in general.
  """
  adam_mode = _adam_mode("adam_mode", adam_mode)
  decays = s.weight_decay is not None
  if decays and X is None:
    raise ValueError("weight_decay multiplies W: the parameters must be read")
  M1_new = s.alpha * M1 + s.one_minus_alpha * G
  M2_new = s.beta * M2 + s.one_minus_beta * G * G
  if adam_mode == 0:
    # M2 / beta_correction, as M2 * (1 / beta_correction): see OrtAdamWScalars.
    step = (s.lr * M1_new) / (
      s.alpha_correction * (_numerics.sqrt(M2_new * s.one_over_beta_correction) + s.epsilon)
    )
    if not decays:
      return -step, M1_new, M2_new
    W = X - X * s.lr * s.weight_decay
    return (W - step) - X, M1_new, M2_new
  step = s.lr_corrected * M1_new / (_numerics.sqrt(M2_new) + s.epsilon)
  if not decays:
    return -step, M1_new, M2_new
  W = X - step
  return (W - s.lr_weight_decay * W) - X, M1_new, M2_new


def ort_adamw_tensor(
  R: ArrayLike,
  T: ArrayLike,
  X: Array,
  G: Array,
  M1: Array,
  M2: Array,
  *,
  alpha: ArrayLike,
  beta: ArrayLike,
  epsilon: ArrayLike,
  weight_decay: ArrayLike,
  adam_mode: int,
  correct_bias: bool | int,
) -> tuple[Array, Array, Array]:
  """ONNX Runtime ``AdamWOptimizer`` on one tensor (``onnx_optax.rules.ort_adamw``; the formula:
  :func:`ort_adamw`).

  ``R`` is the kernel's ``lr`` input, ``T`` its ``step`` (1 at the first update), ``M1`` /
  ``M2`` its ``momentums_1`` / ``momentums_2``. This is not ``optax.adamw``: see
  :func:`ort_adamw`.

  Returns:
    ``(U, M1_new, M2_new)``, ``U`` as in :func:`ort_adamw_elementwise`.
  """
  hyper = dict(
    alpha=alpha,
    beta=beta,
    epsilon=epsilon,
    weight_decay=weight_decay,
    adam_mode=adam_mode,
    correct_bias=correct_bias,
  )
  return _engine.tensor(RULE, R, T, X, G, M1, M2, **hyper)  # type: ignore[return-value]


class OrtAdamWState(NamedTuple):
  """State of :func:`ort_adamw`: ONNX Runtime's ``step``, ``momentums_1``, ``momentums_2``.

  ``count`` is the ``step`` input of the *next* update: 1 at the first, as
  ONNX Runtime's training API feeds it and as PyTorch's ``state["step"]``
  reads after its increment (PyTorch's saved ``step`` is ``count - 1``).
  """

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  m1: optax.Updates
  m2: optax.Updates


def ort_adamw(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  alpha: float = 0.9,
  beta: float = 0.999,
  epsilon: float = 1e-8,
  weight_decay: float = 1e-2,
  adam_mode: int = 0,
  correct_bias: bool = True,
  initial_count: int = 1,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX Runtime's ``AdamWOptimizer`` (com.microsoft, v1) as an Optax transform.

  The operator that ONNX Runtime's training (``generate_artifacts``'s
  ``optimizer_model.onnx``) runs, in its CPU kernel's order. With ``step =
  state.count`` (1 at the first update)::

      alpha_correction = correct_bias ? 1 - alpha^step : 1     (likewise beta_correction)
      adam_mode = 0 (PyTorch's torch.optim.AdamW):
        W     = W - W * lr * weight_decay
        M1    = alpha * M1 + (1 - alpha) * G
        M2    = beta * M2 + (1 - beta) * G * G
        W_new = W - (lr * M1) / (alpha_correction * (Sqrt(M2 / beta_correction) + epsilon))
      adam_mode = 1 (Hugging Face's transformers AdamW):
        lr_corrected = lr * Sqrt(beta_correction) / alpha_correction
        M1, M2 as above
        W     = W - lr_corrected * M1 / (Sqrt(M2) + epsilon)
        W_new = W - lr * weight_decay * W

  ``optax.apply_updates(params, updates)`` is ``W_new`` to the bit when
  ``weight_decay`` is 0, and otherwise to the bit where ``X`` and ``W_new``
  are within a factor of two, within one ulp of ``max(|X|, |W_new|)`` in
  general (see
  :func:`onnx_optax.rules.ort_adamw_elementwise`).

  **Not** ``optax.adamw``, although mode 0 is the same rule in exact
  arithmetic. Mode 0 is PyTorch's ``torch.optim.AdamW(lr, betas=(alpha,
  beta), eps=epsilon, weight_decay=weight_decay)`` in ONNX Runtime's
  operation order (in float64 within 1e-12 of PyTorch over 100 steps:
  tests/test_independent_references.py). ``optax.adamw(lr, b1=alpha,
  b2=beta, eps=epsilon, weight_decay=weight_decay)`` computes the same
  number in another order (``m / (1 - b1^t)`` and ``sqrt(v / (1 - b2^t))``
  separately, the decay ``weight_decay * W`` added to the update instead of
  shrinking ``W`` first), so the two agree only up to rounding, and its
  defaults differ (``weight_decay=1e-4``). Mode 1 is another rule: epsilon
  sits outside the bias correction (it is not scaled by
  ``Sqrt(beta_correction)``) and the decay shrinks the already updated
  ``W``. PyTorch's ``torch.optim.Adam(weight_decay=wd)`` (the L2 term added
  to the gradient) is ``optax.chain(optax.add_decayed_weights(wd),
  ort_adamw(lr, weight_decay=0))``.

  Defaults are the operator schema's (``weight_decay = 0.01`` as in the
  schema and PyTorch's AdamW, ``epsilon = 1e-8``); ONNX Runtime's
  ``generate_artifacts`` writes ``adam_mode=1, epsilon=1e-6, weight_decay=0``
  explicitly. ``adam_mode=0`` with ``correct_bias=False`` is refused, as ONNX
  Runtime refuses it.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule (evaluated at the
      number of updates applied, 0 at the first).
    alpha: first-moment decay (PyTorch ``betas[0]``), in ``[0, 1)``.
    beta: second-moment decay (PyTorch ``betas[1]``), in ``[0, 1)`` for
      ``adam_mode=0`` (at 1, ``M2 / beta_correction`` is 0/0: NaN, and PyTorch
      refuses it too), in ``[0, 1]`` for ``adam_mode=1``, where 1 makes every
      update 0 (refused with ``epsilon = 0``: 0/0).
    epsilon: added to the root, ``>= 0`` (PyTorch ``eps``).
    weight_decay: decoupled decay coefficient, ``>= 0``. Non-zero needs the
      parameters: ``update(grads, state, params)``.
    adam_mode: 0 (PyTorch's AdamW) or 1 (Hugging Face's AdamW). It selects
      the formula, so it is static: under ``optax.inject_hyperparams`` pass
      ``static_args=("adam_mode",)`` (a bool ``correct_bias`` is static there).
    correct_bias: apply the bias corrections (``True`` / 1); ``False`` / 0
      only with ``adam_mode=1``.
    initial_count: ``step`` at the first update, ``>= 1`` with bias
      correction (``step = 0`` divides by ``1 - alpha^0 = 0``), ``>= 0``
      without. Resume a PyTorch run whose ``state["step"]`` is ``n`` with
      ``n + 1``.
    state_dtype: dtype of ``M1`` and ``M2``; default each parameter's dtype.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.ort_adamw(0.1, epsilon=0.0, weight_decay=0.0)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  hyper = dict(
    alpha=alpha,
    beta=beta,
    epsilon=epsilon,
    weight_decay=weight_decay,
    adam_mode=adam_mode,
    correct_bias=correct_bias,
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _adam_mode(name: str, value: Any) -> int:
  """``adam_mode``: 0 or 1, static (it selects the formula)."""
  mode = _checks.static_int(name, value)
  if mode not in ADAM_MODES:
    raise ValueError(f"{name} must be 0 (PyTorch's AdamW) or 1 (Hugging Face's AdamW), got {value!r}")
  return mode


def _refuse_mode0_without_correction(adam_mode: int, correct_bias: bool, name: Any) -> None:
  if adam_mode == 0 and not correct_bias:
    raise ValueError(
      f"{name('correct_bias')}=False with {name('adam_mode')}=0: ONNX Runtime's AdamWOptimizer refuses "
      "this pair (mode 0 is PyTorch's AdamW, which always corrects the bias); use adam_mode=1 for no "
      "correction"
    )


def _validate(hyper: dict[str, Any], name: Any) -> None:
  _refuse_mode0_without_correction(hyper["adam_mode"], hyper["correct_bias"], name)
  _checks.second_moment_decay_at_one(
    name("beta"),
    hyper["beta"],
    hyper["epsilon"],
    always=_checks.ORT_ADAMW_MODE0_BETA_ONE if hyper["adam_mode"] == 0 else "",
  )


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  mode = hyper["adam_mode"]
  return (
    lambda R, T: rule.scalars(R, T, **hyper),
    lambda s, X, G, M1, M2: rule.elementwise(s, X, G, M1, M2, adam_mode=mode),
  )


RULE = registry.register(
  registry.Rule(
    name="ort_adamw",
    transform=ort_adamw,
    state=OrtAdamWState,
    fields=(registry.Field("m1", "M1"), registry.Field("m2", "M2", second_moment=True)),
    hyperparameters={
      "alpha": registry.Hyperparameter(_checks.first_moment_decay, decay=True),
      "beta": registry.Hyperparameter(_checks.decay, decay=True, may_be_one=lambda h: h["adam_mode"] == 1),
      "epsilon": registry.Hyperparameter(_checks.epsilon),
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "adam_mode": registry.Hyperparameter(_adam_mode, static=True),
      "correct_bias": registry.Hyperparameter(_checks.flag, static=True),
    },
    scalars=ort_adamw_scalars,
    elementwise=ort_adamw_elementwise,
    bind=_bind,
    minimum_count=lambda h: 1 if h["correct_bias"] else 0,
    policy=_engine.SPEC,
    params_for=("weight_decay",),
    validate=_validate,
    bindings=(registry.Binding("onnx", "AdamWOptimizer", domain=_DOMAIN),),
    variants=(
      registry.Variant("mode0", {"adam_mode": 0}),  # the tests' configuration below
      registry.Variant(
        "mode1",
        {"adam_mode": 1},
        registry.TestConfig(
          dict(alpha=0.8, beta=0.9, epsilon=0.3, weight_decay=0.2, adam_mode=1, correct_bias=True),
          0.05,
          "alpha",
        ),
      ),
    ),
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(
        # Reads X only in its decoupled decay lr * weight_decay * X, rounding relative to X twice
        # per update with weight decay (the decay's subtraction and the step's).
        lambda h, R, T0, n: R * float(h["weight_decay"]),
        lambda h: float(h["alpha"]),
        lambda h: 4 if float(h["weight_decay"]) else 2,
      ),
      # The schema's defaults but epsilon = 1e-6 (what generate_artifacts writes; 1e-8 is 0 in float16).
      hyper=dict(alpha=0.9, beta=0.999, epsilon=1e-6, weight_decay=0.01, adam_mode=0, correct_bias=True),
      tests=registry.TestConfig(
        dict(alpha=0.85, beta=0.95, epsilon=0.3, weight_decay=0.2, adam_mode=0, correct_bias=True),
        0.05,
        "beta",
      ),
      edges=(
        registry.Edge("alpha=0", {"hyper": {"alpha": 0.0}}),
        registry.Edge("beta=0", {"hyper": {"beta": 0.0}}),
        registry.Edge("epsilon=0", {"hyper": {"epsilon": 0.0}}),
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
        # Large enough to stand out of bfloat16's rounding of X (lr * 0.01 is far below it).
        registry.Edge("weight_decay=5", {"hyper": {"weight_decay": 5.0}}),
        registry.Edge("alpha=0.999,state=0", {"state": "zero", "hyper": {"alpha": 0.999}}),
        # ONNX Runtime refuses correct_bias=0 in mode 0: these run in mode 1 only.
        registry.Edge("correct_bias=0", {"hyper": {"correct_bias": False}, "only": {"adam_mode": 1}}),
        registry.Edge(
          "correct_bias=0,T=0", {"T": 0, "hyper": {"correct_bias": False}, "only": {"adam_mode": 1}}
        ),
      ),
    ),
  )
)


# -- SGDOptimizerV2 ----------------------------------------------------------------------


class OrtSGDScalars(NamedTuple):
  """The per-update scalar of ONNX Runtime's ``SGDOptimizerV2``: ``lr``."""

  lr: Any


def ort_sgd_scalars(R: ArrayLike, T: ArrayLike) -> OrtSGDScalars:
  """``lr``; ``T`` is not read (the operator has no update count)."""
  del T
  return OrtSGDScalars(R)


def ort_sgd_elementwise(s: OrtSGDScalars, X: Array | None, G: Array) -> tuple[Array]:
  """The element-wise part of ``SGDOptimizerV2``: ``W_new = W + (-lr * G)``.

  Returns ``(U,)`` with ``U = -lr * G`` (the negation is of the scalar, exact),
  so ``X + U`` is the kernel's ``W_new`` to the bit. ``X`` is not read.
  """
  del X
  return (-s.lr * G,)


def ort_sgd_tensor(R: ArrayLike, T: ArrayLike, X: Array, G: Array) -> tuple[Array]:
  """ONNX Runtime ``SGDOptimizerV2`` on one tensor (``onnx_optax.rules.ort_sgd``): ``W_new = W + (-lr * G)``.

  Returns:
    ``(U,)`` with ``X + U == W_new`` to the bit.
  """
  return _engine.tensor(SGD_RULE, R, T, X, G)  # type: ignore[return-value]


class OrtSGDState(NamedTuple):
  """State of :func:`ort_sgd`: the number of updates applied (``SGDOptimizerV2`` has no state)."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states


def ort_sgd(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """ONNX Runtime's ``SGDOptimizerV2`` (com.microsoft, v1) as an Optax transform::

      W_new = W + (-lr * G)

  ``optax.apply_updates(params, updates)`` is ``W_new`` to the bit, and so is
  ``optax.sgd(lr)`` (its update ``-lr * G`` is the same product).

  Args:
    learning_rate: ``lr``, a float or an Optax schedule (evaluated at
      ``count - initial_count``).
    initial_count: the state's ``count`` at the first update; the operator
      has no update count, so it only offsets the count that ``state.count``
      reports.
    state_dtype: accepted for a signature shared with the other transforms;
      the rule keeps no tensors, so there is nothing to store in it.

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.ort_sgd(0.1)
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([1.0, -1.0]), state)
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  return _engine.transform(SGD_RULE, learning_rate, initial_count, state_dtype, {})


SGD_RULE = registry.register(
  registry.Rule(
    name="ort_sgd",
    transform=ort_sgd,
    state=OrtSGDState,
    fields=(),
    hyperparameters={},
    scalars=ort_sgd_scalars,
    elementwise=ort_sgd_elementwise,
    bind=lambda rule, hyper: (rule.scalars, rule.elementwise),
    minimum_count=0,
    policy=_engine.SPEC,
    bindings=(registry.Binding("onnx", "SGDOptimizerV2", domain=_DOMAIN),),
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(),
      hyper={},
      tests=registry.TestConfig({}, 0.05, ""),
      edges=(registry.Edge("R=1", {"R": 1.0}),),
    ),
  )
)
