"""The hyperparameters the tests run each rule with, in one place.

Every term of every formula matters with these values: non-zero
norm_coefficient, beta != 1, epsilon comparable to sqrt(H), decay_factor > 0,
norm_coefficient_post > 0, weight_decay > 0 and the bias corrections of ONNX
Runtime's AdamW in both modes. (test_numerics uses realistic defaults instead.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import onnx_optax


class RuleConfig(NamedTuple):
  rule: str  # the key of onnx_optax.reference.RULES
  make: Callable[..., Any]
  state_cls: type
  hyper: dict[str, Any]
  learning_rate: float
  sweep: str  # a second hyperparameter to sweep, besides the learning rate


RULE_CONFIGS = {
  "momentum_standard": RuleConfig(
    "momentum",
    onnx_optax.momentum,
    onnx_optax.MomentumState,
    dict(alpha=0.9, beta=0.7, mode="standard", norm_coefficient=0.05),
    0.05,
    "alpha",
  ),
  "momentum_nesterov": RuleConfig(
    "momentum",
    onnx_optax.momentum,
    onnx_optax.MomentumState,
    dict(alpha=0.8, beta=0.6, mode="nesterov", norm_coefficient=0.05),
    0.05,
    "beta",
  ),
  "adagrad": RuleConfig(
    "adagrad",
    onnx_optax.adagrad,
    onnx_optax.AdagradState,
    dict(decay_factor=0.2, epsilon=0.5, norm_coefficient=0.05),
    0.3,
    "decay_factor",
  ),
  "adam": RuleConfig(
    "adam",
    onnx_optax.adam,
    onnx_optax.AdamState,
    dict(alpha=0.85, beta=0.95, epsilon=0.3, norm_coefficient=0.05, norm_coefficient_post=0.01),
    0.05,
    "beta",
  ),
  "directml_adam": RuleConfig(
    "directml_adam",
    onnx_optax.directml_adam,
    onnx_optax.DirectMLAdamState,
    dict(beta1=0.85, beta2=0.95, epsilon=0.3),
    0.05,
    "beta1",
  ),
  "ort_adamw_mode0": RuleConfig(
    "ort_adamw",
    onnx_optax.ort_adamw,
    onnx_optax.OrtAdamWState,
    dict(alpha=0.85, beta=0.95, epsilon=0.3, weight_decay=0.2, adam_mode=0, correct_bias=True),
    0.05,
    "beta",
  ),
  "ort_adamw_mode1": RuleConfig(
    "ort_adamw",
    onnx_optax.ort_adamw,
    onnx_optax.OrtAdamWState,
    dict(alpha=0.8, beta=0.9, epsilon=0.3, weight_decay=0.2, adam_mode=1, correct_bias=True),
    0.05,
    "alpha",
  ),
  "ort_sgd": RuleConfig("ort_sgd", onnx_optax.ort_sgd, onnx_optax.OrtSGDState, {}, 0.05, ""),
}

#: The int arguments that select a formula and so cannot be injected by
#: ``optax.inject_hyperparams`` (bools and strings are static there anyway).
STATIC_ARGS = ("adam_mode",)


#: The PyTorch- and Keras-order twins (no NumPy expectation in ``reference.RULES`` nor an ONNX
#: bound, so not in RULE_CONFIGS): transform, hyperparameters and the ``static_args`` that
#: ``optax.inject_hyperparams`` needs for those that are not numbers.
TWIN_CONFIGS: dict[str, tuple[Any, dict[str, Any], tuple[str, ...]]] = {
  "pytorch_sgd": (onnx_optax.pytorch_sgd, dict(momentum=0.9, dampening=0.1, weight_decay=0.01), ()),
  "pytorch_sgd_nesterov": (onnx_optax.pytorch_sgd, dict(momentum=0.9, nesterov=True), ("nesterov",)),
  "pytorch_adagrad": (onnx_optax.pytorch_adagrad, dict(lr_decay=0.01, weight_decay=0.01), ()),
  "pytorch_adam": (onnx_optax.pytorch_adam, dict(betas=(0.9, 0.999), weight_decay=0.01), ("betas",)),
  "pytorch_adamw": (onnx_optax.pytorch_adamw, dict(betas=(0.9, 0.999), weight_decay=0.01), ("betas",)),
  "keras_adam": (onnx_optax.keras_adam, dict(beta_1=0.9, beta_2=0.999), ()),
}


def static_args(hyper: dict[str, Any], *more: str) -> tuple[str, ...]:
  """``static_args`` for ``optax.inject_hyperparams`` of a transform made with ``hyper``, plus ``more``."""
  return tuple(name for name in STATIC_ARGS if name in hyper) + more


def first_count(rule: str) -> int:
  """The spec's ``T`` at a rule's first update (DirectML's and ONNX Runtime AdamW's step start at 1)."""
  return 1 if rule in ("directml_adam", "ort_adamw") else 0


def as_float32_sees(value: Any) -> Any:
  """A hyperparameter as a float32 transform sees it (Python floats are weak float32)."""
  if isinstance(value, (str, bool)) or (isinstance(value, int) and not isinstance(value, bool)):
    return value  # a mode, or ONNX Runtime's adam_mode / correct_bias: not a float
  return float(np.float32(value))


# ----------------------------------------------------------------------------
# The tolerance of a trajectory against the float64 reference

#: Roundings of one update, each relative to an operand no larger than the
#: update's magnitude (the longest rule, ONNX Adam, has 11 element-wise
#: operations and 5 scalar ones).
ROUNDINGS = 16


def feedback_gain(rule: str, hyper: dict[str, Any], learning_rate: float, T0: int, steps: int) -> float:
  """``L``: how much an error ``e`` in ``X`` can move the next update, at most ``L * e``.

  Only ``norm_coefficient`` (``c``) reads ``X``, through ``G_regularized = c X + G``.
  An error that stays in ``X`` enters every later step:

  * Momentum: ``V`` sums it with weights ``beta alpha^j``, so ``|dV| <= c e / (1 - alpha)``
    and ``|dU| <= R c e (1 + alpha) / (1 - alpha)`` (Nesterov adds ``R G_regularized``);
  * Adagrad: ``r G' / (sqrt(H) + epsilon)`` moves by ``r c e / epsilon`` through ``G'``
    and by as much again through ``H`` (``G'^2 <= H``): ``2 R c / epsilon``;
  * ONNX Adam: ``V`` is an average (weights sum to 1), ``|dV| <= c e``; through ``V``
    and ``H`` alike ``2 max(R_adjusted) c / epsilon``;
  * DirectML Adam and ONNX Runtime's SGD do not read ``X``: 0;
  * ONNX Runtime's AdamW reads ``X`` only in its decoupled decay ``lr * weight_decay * X``
    (the step itself does not depend on ``X``): ``R * weight_decay``.

  The worst case: ``H = 0`` in the denominators. ``steps`` and ``T0`` give the
  largest bias correction ``R_adjusted / R`` of the run.
  """
  if rule == "ort_adamw":
    return float(learning_rate) * float(hyper["weight_decay"])
  c = float(hyper.get("norm_coefficient", 0.0))
  if rule in ("directml_adam", "ort_sgd") or c == 0:
    return 0.0
  R = float(learning_rate)
  if rule == "momentum":
    alpha = float(hyper["alpha"])
    return R * c * (1 + alpha) / (1 - alpha)
  eps = float(hyper["epsilon"])
  if eps <= 0:
    raise ValueError(f"feedback_gain needs epsilon > 0 to bound 1 / (sqrt(H) + epsilon), got {eps}")
  if rule == "adagrad":
    return 2 * R * c / eps
  alpha, beta = float(hyper["alpha"]), float(hyper["beta"])
  T = np.arange(max(T0, 1), T0 + steps + 1, dtype=np.float64)
  correction = max(1.0, float(np.max(np.sqrt(1 - beta**T) / (1 - alpha**T))))
  return 2 * R * correction * c / eps


def trajectory_tolerances(
  rule: str, hypers: Any, learning_rate: float, X0: Any, xs: Any, u: float, T0: int | None = None
) -> list[float]:
  """``tol[k]``: a bound on ``max |x_k - x_ref_k|`` after update ``k`` of a run.

  Args:
    rule: a key of ``onnx_optax.reference.RULES``.
    hypers: the rule's hyperparameters, or a list of the sets a run uses
      (the bound takes the worst).
    learning_rate: the largest learning rate of the run.
    X0: the starting parameters (a list of leaves).
    xs: the float64 reference trajectory, ``xs[k]`` the leaves after update ``k``.
    u: the unit roundoff of the run's dtype.
    T0: the ``T`` of the first update (default: the rule's first).

  The error is charged to what the roundings are relative to, not to the
  state (``H`` of Adagrad grows to hundreds, ``X`` stays near 1; charging
  ``H`` allowed updates 5% too large):

  * ``X + U`` rounds once relative to ``X_k``; the reference's own
    ``X - step`` once more, hence ``2 u |X_k|`` (``4 u |X_k|`` for ONNX
    Runtime's AdamW with weight decay, which subtracts twice);
  * the update ``U_t = x_ref_t - x_ref_{t-1}`` is computed with at most
    ROUNDINGS roundings relative to the largest update so far, ``M_t`` (an
    operand cancelled in ``U_t`` was an update-sized quantity before);
  * the state carries the relative error of every earlier update with a gain
    of at most 1 (every decay rate is in [0, 1]; an error ``d`` in Adagrad's
    ``H`` or Adam's ``H`` is ``d / 2`` in ``U``): ``t * ROUNDINGS * u * M_t``
    at update ``t``;
  * the Adam rules' first moment is a ``(1 - alpha)``-weighted average whose
    roundings are relative to ``G``, while the update it makes is relative to
    ``(1 - alpha) G`` until the moment fills: one factor ``1 / (1 - alpha)``;
  * an error in ``X`` feeds back through ``norm_coefficient`` (see
    :func:`feedback_gain`): a factor ``(1 + L)`` per update.

  So ``tol[k] = (1 + L)^(k+1) A sum_{t<=k} (2 u max|X_t| + (t + 1) ROUNDINGS u M_t)``
  with ``A = 1 / (1 - alpha)`` for the Adam rules, 1 otherwise. A relative
  error ``delta`` in every update moves ``x_0`` by ``delta |U_0|``, and
  ``tol[0] ~ 16 A u M_0``: ``delta = 0.001`` fails at the first update
  wherever ``|U_0|`` is within a factor 60 / A of the largest update.
  """
  hypers = [hypers] if isinstance(hypers, dict) else list(hypers)
  T0 = first_count(rule) if T0 is None else T0
  steps = len(xs)
  L = max(feedback_gain(rule, h, learning_rate, T0, steps) for h in hypers)
  alphas = [
    float(h.get("beta1" if rule == "directml_adam" else "alpha", 0.0))
    for h in hypers
    if rule in ("adam", "directml_adam", "ort_adamw")
  ]
  # ONNX Runtime's AdamW with weight decay rounds relative to X twice per
  # update (the decay's subtraction and the step's), the reference as often.
  x_roundings = 4 if rule == "ort_adamw" and any(float(h["weight_decay"]) for h in hypers) else 2
  A = 1 / (1 - max(alphas)) if alphas else 1.0
  previous = [np.asarray(x, np.float64) for x in X0]
  total, M, out = 0.0, 0.0, []
  for k, X in enumerate(xs):
    X = [np.asarray(x, np.float64) for x in X]
    M = max([M] + [float(np.max(np.abs(a - b), initial=0)) for a, b in zip(X, previous)])
    size = max(float(np.max(np.abs(a), initial=0)) for a in X)
    total += x_roundings * u * size + (k + 1) * ROUNDINGS * u * M
    out.append((1 + L) ** (k + 1) * A * total)
    previous = X
  return out
