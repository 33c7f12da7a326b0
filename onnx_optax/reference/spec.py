"""The spec rules' expectations: ONNX's Momentum, Adagrad and Adam, DirectML's Adam, ONNX
Runtime's AdamW and SGD, and Keras's Adam (DirectML's Adam in exact arithmetic), written from
docs/spec.md alone (see :mod:`onnx_optax.reference`)."""

from __future__ import annotations

import numpy as np

from onnx_optax.reference._base import _arrays, expectation

__all__ = ["adagrad", "adam", "directml_adam", "momentum", "ort_adamw", "ort_sgd"]


@expectation("momentum", state=1)
def momentum(R, T, X, G, V, *, alpha, beta, mode, norm_coefficient, dtype=np.float64):
  """ONNX Momentum. ``T``: updates already conducted. Returns ``(X_new, V_new)``."""
  if mode not in ("standard", "nesterov"):
    raise ValueError(f"mode must be 'standard' or 'nesterov', got {mode!r}")
  X, G, V, R, alpha, beta, norm_coefficient = _arrays(dtype, X, G, V, R, alpha, beta, norm_coefficient)
  G_regularized = norm_coefficient * X + G
  beta_adjusted = beta if T > 0 else np.ones_like(beta)
  V_new = alpha * V + beta_adjusted * G_regularized
  if mode == "standard":
    X_new = X - R * V_new
  else:
    X_new = X - R * (G_regularized + alpha * V_new)
  return X_new, V_new


@expectation("adagrad", state=1)
def adagrad(R, T, X, G, H, *, decay_factor, epsilon, norm_coefficient, dtype=np.float64):
  """ONNX Adagrad. Returns ``(X_new, H_new)``."""
  X, G, H, R, decay_factor, epsilon, norm_coefficient = _arrays(
    dtype, X, G, H, R, decay_factor, epsilon, norm_coefficient
  )
  r = R / (1 + T * decay_factor)
  G_regularized = norm_coefficient * X + G
  H_new = H + G_regularized * G_regularized
  H_adaptive = np.sqrt(H_new) + epsilon
  X_new = X - r * G_regularized / H_adaptive
  return X_new, H_new


@expectation("adam", state=2)
def adam(
  R, T, X, G, V, H, *, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post, dtype=np.float64
):
  """ONNX Adam. Returns ``(X_final, V_new, H_new)``."""
  X, G, V, H, R, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post = _arrays(
    dtype, X, G, V, H, R, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post
  )
  G_regularized = norm_coefficient * X + G
  V_new = alpha * V + (1 - alpha) * G_regularized
  H_new = beta * H + (1 - beta) * G_regularized * G_regularized
  H_sqrt = np.sqrt(H_new) + epsilon
  if T > 0:
    R_adjusted = R * np.sqrt(1 - beta**T) / (1 - alpha**T)
  else:
    R_adjusted = R
  X_new = X - R_adjusted * V_new / H_sqrt
  X_final = (1 - norm_coefficient_post) * X_new
  return X_final, V_new, H_new


def directml_adam(X, M, V, G, T, *, learning_rate, beta1, beta2, epsilon, dtype=np.float64):
  """DirectML Adam, operands in DirectML's order. Returns ``(X_new, M_new, V_new)``."""
  if T < 1:
    raise ValueError(f"DirectML Adam needs T >= 1 (T = 0 gives 0/0), got {T}")
  X, M, V, G, learning_rate, beta1, beta2, epsilon = _arrays(
    dtype, X, M, V, G, learning_rate, beta1, beta2, epsilon
  )
  M_new = beta1 * M + (1 - beta1) * G
  V_new = beta2 * V + (1 - beta2) * G * G
  Alpha = np.sqrt(1 - beta2**T) / (1 - beta1**T)
  X_new = X - learning_rate * Alpha * M_new / (np.sqrt(V_new) + epsilon)
  return X_new, M_new, V_new


@expectation("ort_adamw", state=2)
def ort_adamw(
  R, T, X, G, M1, M2, *, alpha, beta, epsilon, weight_decay, adam_mode, correct_bias, dtype=np.float64
):
  """ONNX Runtime AdamWOptimizer, ``T`` its ``step`` input (1 at the first update).

  The bias corrections as the CPU kernel forms them: the power in float64
  (C++'s ``std::pow(float, int64)`` returns a double), rounded to ``dtype``,
  then subtracted from 1 in ``dtype``. With ``dtype=np.float32`` this is the
  kernel's arithmetic step for step. Returns ``(W_new, M1_new, M2_new)``.
  """
  if adam_mode not in (0, 1):
    raise ValueError(f"adam_mode must be 0 or 1, got {adam_mode!r}")
  if adam_mode == 0 and not correct_bias:
    raise ValueError("ONNX Runtime refuses adam_mode=0 with correct_bias=0")
  W, G, M1, M2, lr, alpha, beta, epsilon, weight_decay = _arrays(
    dtype, X, G, M1, M2, R, alpha, beta, epsilon, weight_decay
  )
  one = np.ones((), W.dtype)
  if correct_bias:
    alpha_correction = one - np.asarray(np.float64(alpha) ** T, W.dtype)
    beta_correction = one - np.asarray(np.float64(beta) ** T, W.dtype)
    lr_corrected = lr * np.sqrt(beta_correction) / alpha_correction
  else:
    alpha_correction, beta_correction, lr_corrected = one, one, lr
  if adam_mode == 0:
    W = W - W * lr * weight_decay
  M1 = alpha * M1 + (one - alpha) * G
  M2 = beta * M2 + (one - beta) * G * G
  if adam_mode == 0:
    W = W - (lr * M1) / (alpha_correction * (np.sqrt(M2 / beta_correction) + epsilon))
  else:
    W = W - lr_corrected * M1 / (np.sqrt(M2) + epsilon)
    W = W - lr * weight_decay * W
  return W, M1, M2


@expectation("ort_sgd", state=0)
def ort_sgd(R, T, X, G, *, dtype=np.float64):
  """ONNX Runtime SGDOptimizerV2 (``T`` is not read). Returns ``(W_new,)``."""
  del T
  W, G, lr = _arrays(dtype, X, G, R)
  return (W + (-lr) * G,)


@expectation("directml_adam", state=2)
def _directml_adam_spec_order(R, T, X, G, M, V, **hyper):
  """:func:`directml_adam` with the spec's argument order ``(R, T, X, G, M, V)``."""
  return directml_adam(X, M, V, G, T, learning_rate=R, **hyper)


@expectation("keras_adam", state=2)
def _keras_adam_step(R, T, X, G, m, v, *, beta_1, beta_2, epsilon, dtype=np.float64):
  """Keras's Adam is DirectML Adam in exact arithmetic (Keras's ``m += (g - m) * (1 - beta_1)`` is
  ``beta_1 m + (1 - beta_1) g``, its ``alpha`` DirectML's ``LearningRate * Alpha`` at ``T = count +
  1``): :func:`directml_adam` at ``T + 1``. Not Keras's order: nothing to compare to the bit."""
  return directml_adam(
    X, m, v, G, T + 1, learning_rate=R, beta1=beta_1, beta2=beta_2, epsilon=epsilon, dtype=dtype
  )
