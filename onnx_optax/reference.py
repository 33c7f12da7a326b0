"""NumPy expectations for the rules, written from docs/spec.md alone.

Nothing here imports JAX or calls :mod:`onnx_optax.rules`: these functions are
an independent transcription of the spec, so that the tests and the
conformance suite can catch mistakes in the JAX code. They compute in
``dtype`` (float64 by default, the expectation the tolerance model assumes);
``dtype=None`` computes in the dtype of ``X``.

Single-step functions take and return NumPy arrays and return the spec's
outputs in the spec's order (``X_new`` first). :func:`trajectory` runs one
rule over many steps on a list of tensors.

**Registered by rule.** Each rule's expectation is registered under the
rule's name (:func:`expectation`, :func:`register`), as one *step*
``step(R, T, X, G, *state, dtype=np.float64, **hyperparameters) -> (X_new,
*new_state)``, ``T`` the rule's count at this update (its state's
``count``): the conformance suite and the tests look it up by the rule's
name (:func:`get`). A rule registered from outside the package registers
its own expectation, written from its spec::

    from onnx_optax import reference

    def sign_sgd(R, T, X, G, *, dtype=np.float64):
      X, G, R = (np.asarray(v, dtype) for v in (X, G, R))
      return (X - R * np.sign(G),)

    reference.register("sign_sgd", sign_sgd, state=0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
  "RULES",
  "Expectation",
  "adagrad",
  "adam",
  "directml_adam",
  "expectation",
  "get",
  "momentum",
  "ort_adamw",
  "ort_sgd",
  "pytorch_adadelta",
  "pytorch_adagrad",
  "pytorch_adam",
  "pytorch_adamax",
  "pytorch_asgd",
  "pytorch_nadam",
  "pytorch_radam",
  "pytorch_rmsprop",
  "pytorch_rprop",
  "pytorch_sgd",
  "register",
  "trajectory",
  "unregister",
]


class Expectation(NamedTuple):
  """A rule's registered expectation."""

  #: ``step(R, T, X, G, *state, dtype=np.float64, **hyperparameters)``: the rule's outputs on one
  #: tensor, ``(X_new, *new_state)``, computed in ``dtype`` (``None``: ``X``'s).
  step: Callable[..., tuple[np.ndarray, ...]]
  #: The number of state tensors.
  state: int
  #: The expectation follows its framework's float32 operation order, each fused multiply-add
  #: rounded once, and takes ``scalars={name: value}`` for the step-dependent scalars a
  #: framework computes otherwise: in float32 it is that framework's arithmetic to the bit where
  #: the operations are correctly rounded (the conformance check then compares to the bit).
  framework_order: bool = False


_EXPECTATIONS: dict[str, Expectation] = {}

#: name -> ``(step, number of state tensors)`` of every registered expectation.
RULES: dict[str, tuple[Callable[..., tuple[np.ndarray, ...]], int]] = {}


def register(
  name: str, step: Callable[..., tuple[np.ndarray, ...]], *, state: int, framework_order: bool = False
) -> Expectation:
  """Registers ``step`` as the expectation of the rule ``name`` (see :class:`Expectation`).

  Raises:
    ValueError: an expectation of that name is registered already.
  """
  if name in _EXPECTATIONS:
    raise ValueError(f"an expectation named {name!r} is registered already")
  _EXPECTATIONS[name] = Expectation(step, state, framework_order)
  RULES[name] = (step, state)
  return _EXPECTATIONS[name]


def expectation(name: str, *, state: int, framework_order: bool = False) -> Callable[[Any], Any]:
  """A decorator: :func:`register` the decorated step under ``name``, and return it unchanged."""

  def decorate(step: Any) -> Any:
    register(name, step, state=state, framework_order=framework_order)
    return step

  return decorate


def unregister(name: str) -> None:
  """Removes an expectation registered from outside the package (for tests)."""
  del _EXPECTATIONS[name], RULES[name]


def get(name: str) -> Expectation:
  """The expectation registered under a rule's name.

  Raises:
    KeyError: none is; the message lists the registered ones.
  """
  try:
    return _EXPECTATIONS[name]
  except KeyError:
    raise KeyError(
      f"no NumPy expectation registered for {name!r}: register one with onnx_optax.reference.register "
      f"(registered: {', '.join(_EXPECTATIONS)})"
    ) from None


def _arrays(dtype: Any, *values: Any) -> list[np.ndarray]:
  if dtype is None:
    dtype = np.asarray(values[0]).dtype  # X comes first in every call below.
  return [np.asarray(v, dtype=dtype) for v in values]


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


def trajectory(
  rule: str,
  X: Sequence[np.ndarray],
  grads: Sequence[Sequence[np.ndarray]] | Callable[[int, list[np.ndarray]], Sequence[np.ndarray]],
  state: Sequence[Sequence[np.ndarray]],
  T: int,
  learning_rates: Sequence[float],
  dtype: Any = np.float64,
  **hyperparameters: Any,
) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]], int]:
  """Runs ``rule`` for ``len(learning_rates)`` steps on a list of tensors.

  Args:
    rule: a registered rule's name (:data:`RULES`).
    X: the tensors (the leaves of a pytree, in any fixed order).
    grads: per step, one gradient per tensor; or a function
      ``grads(step, X) -> gradients`` of the current tensors.
    state: one list of tensors per state field, in the spec's order
      (Momentum ``[V]``; Adagrad ``[H]``; ONNX Adam ``[V, H]``; DirectML
      ``[M, V]``; ONNX Runtime AdamW ``[M1, M2]``; SGD ``[]``).
    T: the spec's ``T`` at the first step; it grows by one per step.
    learning_rates: ``R`` for each step.
    dtype: compute dtype (``None``: each tensor's own).
    **hyperparameters: the rule's keyword arguments.

  Returns:
    ``(xs, state, T)``: ``xs[k]`` holds the tensors after step ``k``; the
    final state and the ``T`` of the next step.
  """
  step, n_state = RULES[rule]
  if len(state) != n_state:
    raise ValueError(f"{rule} has {n_state} state tensors per parameter, got {len(state)}")
  X = [np.asarray(x) for x in X]
  S = [list(s) for s in state]
  xs = []
  for k, R in enumerate(learning_rates):
    G = grads(k, X) if callable(grads) else grads[k]
    outputs = [
      step(R, T, x, g, *(s[i] for s in S), dtype=dtype, **hyperparameters)
      for i, (x, g) in enumerate(zip(X, G))
    ]
    X = [out[0] for out in outputs]
    S = [[out[1 + j] for out in outputs] for j in range(n_state)]
    xs.append(X)
    T += 1
  return xs, S, T


# -- PyTorch-order twins: torch.optim's _single_tensor_* functions, in their order ----------------
#
# Written from PyTorch 2.13's torch/optim/sgd.py `_single_tensor_sgd`, adagrad.py
# `_single_tensor_adagrad` and adam.py `_single_tensor_adam` (docs/spec.md, "PyTorch-order
# twins"), not from onnx_optax.rules. Scalars are Python floats (float64), as PyTorch's; each
# tensor operation computes in `dtype` and rounds its result to `dtype`. With dtype=np.float32
# the operations that PyTorch's CPU kernels fuse (`add(other, alpha)`, `lerp`, `addcmul`) are
# fused multiply-adds, rounded once (`_fma`): the expectation is then PyTorch's float32
# arithmetic to the bit wherever its operations are correctly rounded. PyTorch's CPU `sqrt`
# (MKL's `vmsSqrt`, dispatched by MKL on the CPU it finds) is not always correctly rounded;
# NumPy's is (docs/interop.md, "PyTorch's float32 arithmetic per CPU").


def _fma(a: np.ndarray, b: Any, c: np.ndarray, dtype: Any) -> np.ndarray:
  """``a * b + c`` rounded once to ``dtype``; in float64 the plain expression.

  Narrower dtypes through float64: the product of two float32 numbers is exact there, the sum's
  rounding error is recovered exactly (Knuth's TwoSum) and the sum rounded to odd (the last bit
  set where it was inexact), which a rounding to nearest of 24 bits or fewer then rounds as the
  exact ``a * b + c`` (Boldo and Melquiond: 53 >= 24 + 2). Without it the two roundings differ
  from one FMA in about one element in 2^29.

  Example:
    >>> a, b, c = np.float32(1 + 2.0**-18), np.float32(2.0**-24 - 2.0**-42), np.float32(1 + 2.0**-23)
    >>> float(_fma(a, b, c, np.float32)) == 1 + 2.0**-23  # float64, then float32: 1 + 2**-22
    True
  """
  if np.dtype(dtype) == np.float64:
    return np.asarray(a * b + c, dtype)
  p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
  c64 = np.asarray(c, np.float64)
  with np.errstate(invalid="ignore", over="ignore"):
    s = np.asarray(p + c64)
    virtual = s - p
    err = (p - (s - virtual)) + (c64 - virtual)
    even = (s.reshape(-1).view(np.int64).reshape(s.shape) & 1) == 0
    odd = np.where((err != 0) & even & np.isfinite(s), np.nextafter(s, np.copysign(np.inf, err)), s)
  return np.asarray(odd).astype(dtype)


def pytorch_sgd(
  lr, count, X, G, buf, *, momentum, dampening, weight_decay, nesterov, maximize, dtype=np.float64
):
  """``torch.optim.SGD``'s step; ``count``: updates done (0: no buffer yet). Returns
  ``(X_new, buf_new)`` (``buf_new`` None when ``momentum == 0``)."""
  X, G = _arrays(dtype, X, G)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731  # a Python float as the kernel's scalar
  grad = -G if maximize else G
  if weight_decay != 0:
    grad = _fma(X, s(weight_decay), grad, X.dtype)  # grad.add(param, alpha=weight_decay)
  if momentum != 0:
    if count == 0:
      buf = grad.copy()
    else:
      buf = np.asarray(buf, X.dtype) * s(momentum)  # buf.mul_(momentum)
      buf = _fma(grad, s(1 - dampening), buf, X.dtype)  # .add_(grad, alpha=1 - dampening)
    grad = _fma(buf, s(momentum), grad, X.dtype) if nesterov else buf
  else:
    buf = None
  return _fma(grad, s(-lr), X, X.dtype), buf  # param.add_(grad, alpha=-lr)


def pytorch_adagrad(
  lr, count, X, G, state_sum, *, lr_decay, eps, weight_decay, maximize, dtype=np.float64, scalars=None
):
  """``torch.optim.Adagrad``'s step; ``count``: PyTorch's ``step`` before it. Returns
  ``(X_new, sum_new)``. ``scalars``: ``{"clr": value}`` to use instead of PyTorch's float64 ``clr``
  (a framework that computes it otherwise: the expectation then follows its number)."""
  X, G, state_sum = _arrays(dtype, X, G, state_sum)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  step = count + 1
  grad = -G if maximize else G
  if weight_decay != 0:
    grad = _fma(X, s(weight_decay), grad, X.dtype)
  clr = lr / (1 + (step - 1) * lr_decay) if scalars is None else scalars["clr"]  # Python floats
  state_sum = _fma(grad, grad, state_sum, X.dtype)  # addcmul_(grad, grad, value=1)
  std = np.sqrt(state_sum) + s(eps)
  return X + (s(-clr) * grad) / std, state_sum  # param.addcdiv_(grad, std, value=-clr)


def pytorch_adam(
  lr,
  count,
  X,
  G,
  exp_avg,
  exp_avg_sq,
  max_exp_avg_sq=None,
  *,
  betas,
  eps,
  weight_decay,
  decoupled_weight_decay,
  maximize,
  amsgrad=False,
  dtype=np.float64,
  scalars=None,
):
  """``torch.optim.Adam`` (``AdamW``: ``decoupled_weight_decay=True``); ``count``: PyTorch's
  ``step`` before it. Returns ``(X_new, exp_avg_new, exp_avg_sq_new)``, then
  ``max_exp_avg_sq_new`` with ``amsgrad`` (``max_exp_avg_sq``: its running maximum). ``scalars``:
  ``{"step_size": value, "bias_correction2_sqrt": value}`` to use instead of PyTorch's float64
  numbers (a framework that computes them otherwise: the expectation then follows its numbers)."""
  X, G, exp_avg, exp_avg_sq = _arrays(dtype, X, G, exp_avg, exp_avg_sq)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  beta1, beta2 = betas
  step = count + 1
  grad = -G if maximize else G
  if weight_decay != 0:
    if decoupled_weight_decay:
      X = X * s(1 - lr * weight_decay)  # param.mul_(1 - lr * weight_decay)
    else:
      grad = _fma(X, s(weight_decay), grad, X.dtype)
  weight = s(1 - beta1)  # exp_avg.lerp_(grad, 1 - beta1), PyTorch's two branches
  if abs(weight) < 0.5:
    exp_avg = _fma(weight, grad - exp_avg, exp_avg, X.dtype)
  else:
    exp_avg = _fma(weight - s(1), grad - exp_avg, grad, X.dtype)
  exp_avg_sq = exp_avg_sq * s(beta2)  # exp_avg_sq.mul_(beta2)
  exp_avg_sq = _fma(s(1 - beta2) * grad, grad, exp_avg_sq, X.dtype)  # .addcmul_(grad, grad, value=1 - beta2)
  bias_correction1 = 1 - beta1**step  # Python floats
  bias_correction2 = 1 - beta2**step
  step_size = lr / bias_correction1
  bias_correction2_sqrt = bias_correction2**0.5
  if scalars is not None:
    step_size, bias_correction2_sqrt = scalars["step_size"], scalars["bias_correction2_sqrt"]
  if amsgrad:  # torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq): the root of the maximum
    (max_exp_avg_sq,) = _arrays(X.dtype, max_exp_avg_sq)
    max_exp_avg_sq = np.maximum(max_exp_avg_sq, exp_avg_sq)
    denom = np.sqrt(max_exp_avg_sq) / s(bias_correction2_sqrt) + s(eps)
  else:
    denom = np.sqrt(exp_avg_sq) / s(bias_correction2_sqrt) + s(eps)
  return (
    X + (s(-step_size) * exp_avg) / denom,  # addcdiv_(exp_avg, denom, value=-step_size)
    exp_avg,
    exp_avg_sq,
    *((max_exp_avg_sq,) if amsgrad else ()),
  )


def pytorch_rmsprop(
  lr,
  count,
  X,
  G,
  square_avg,
  momentum_buffer,
  grad_avg,
  *,
  alpha,
  eps,
  weight_decay,
  momentum,
  centered,
  maximize,
  dtype=np.float64,
):
  """``torch.optim.RMSprop``'s step (written from PyTorch's ``_single_tensor_rmsprop``); ``count``
  is its ``step``, which nothing reads. Returns ``(X_new, square_avg_new, momentum_buffer_new,
  grad_avg_new)``, the buffer and ``grad_avg`` as they were where PyTorch keeps none."""
  del count
  X, G, square_avg, momentum_buffer, grad_avg = _arrays(dtype, X, G, square_avg, momentum_buffer, grad_avg)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  grad = -G if maximize else G
  if weight_decay != 0:
    grad = _fma(X, s(weight_decay), grad, X.dtype)  # grad.add(param, alpha=weight_decay)
  square_avg = square_avg * s(alpha)  # square_avg.mul_(alpha)
  square_avg = _fma(s(1 - alpha) * grad, grad, square_avg, X.dtype)  # .addcmul_(grad, grad, value=1 - alpha)
  if centered:
    weight = s(1 - alpha)  # grad_avg.lerp_(grad, 1 - alpha), PyTorch's two branches
    if abs(weight) < 0.5:
      grad_avg = _fma(weight, grad - grad_avg, grad_avg, X.dtype)
    else:
      grad_avg = _fma(weight - s(1), grad - grad_avg, grad, X.dtype)
    avg = np.sqrt(_fma(-grad_avg, grad_avg, square_avg, X.dtype))  # addcmul(.., value=-1).sqrt_()
  else:
    avg = np.sqrt(square_avg)
  avg = avg + s(eps)
  if momentum > 0:
    momentum_buffer = momentum_buffer * s(momentum) + grad / avg  # buf.mul_(momentum).addcdiv_(grad, avg)
    X_new = _fma(momentum_buffer, s(-lr), X, X.dtype)  # param.add_(buf, alpha=-lr)
    return X_new, square_avg, momentum_buffer, grad_avg
  return X + (s(-lr) * grad) / avg, square_avg, momentum_buffer, grad_avg  # addcdiv_(grad, avg, value=-lr)


def pytorch_adamax(
  lr, count, X, G, exp_avg, exp_inf, *, betas, eps, weight_decay, maximize, dtype=np.float64, scalars=None
):
  """``torch.optim.Adamax``'s step (written from PyTorch's ``_single_tensor_adamax``); ``count``: its
  ``step`` before it. Returns ``(X_new, exp_avg_new, exp_inf_new)``. ``scalars``: ``{"clr": value}``
  to use instead of PyTorch's float64 ``lr / (1 - beta1**step)``."""
  X, G, exp_avg, exp_inf = _arrays(dtype, X, G, exp_avg, exp_inf)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  beta1, beta2 = betas
  step = count + 1
  grad = -G if maximize else G
  if weight_decay != 0:
    grad = _fma(X, s(weight_decay), grad, X.dtype)  # grad.add(param, alpha=weight_decay)
  weight = s(1 - beta1)  # exp_avg.lerp_(grad, 1 - beta1), PyTorch's two branches
  if abs(weight) < 0.5:
    exp_avg = _fma(weight, grad - exp_avg, exp_avg, X.dtype)
  else:
    exp_avg = _fma(weight - s(1), grad - exp_avg, grad, X.dtype)
  # torch.maximum(exp_inf.mul_(beta2), grad.abs().add_(eps), out=exp_inf)
  exp_inf = np.maximum(exp_inf * s(beta2), np.abs(grad) + s(eps))
  clr = lr / (1 - beta1**step) if scalars is None else scalars["clr"]  # Python floats
  return X + (s(-clr) * exp_avg) / exp_inf, exp_avg, exp_inf  # addcdiv_(exp_avg, exp_inf, value=-clr)


def pytorch_adadelta(
  lr, count, X, G, square_avg, acc_delta, *, rho, eps, weight_decay, maximize, dtype=np.float64
):
  """``torch.optim.Adadelta``'s step (written from PyTorch's ``_single_tensor_adadelta``); ``count``
  is its ``step``, which nothing reads. Returns ``(X_new, square_avg_new, acc_delta_new)``."""
  del count
  X, G, square_avg, acc_delta = _arrays(dtype, X, G, square_avg, acc_delta)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  grad = -G if maximize else G
  if weight_decay != 0:
    grad = _fma(X, s(weight_decay), grad, X.dtype)  # grad.add(param, alpha=weight_decay)
  square_avg = square_avg * s(rho)  # square_avg.mul_(rho)
  square_avg = _fma(s(1 - rho) * grad, grad, square_avg, X.dtype)  # .addcmul_(grad, grad, value=1 - rho)
  std = np.sqrt(square_avg + s(eps))  # square_avg.add(eps).sqrt_()
  delta = np.sqrt(acc_delta + s(eps))  # acc_delta.add(eps).sqrt_()
  delta = (delta / std) * grad  # delta.div_(std).mul_(grad)
  acc_delta = acc_delta * s(rho)  # acc_delta.mul_(rho)
  acc_delta = _fma(s(1 - rho) * delta, delta, acc_delta, X.dtype)  # .addcmul_(delta, delta, value=1 - rho)
  return _fma(delta, s(-lr), X, X.dtype), square_avg, acc_delta  # param.add_(delta, alpha=-lr)


def _torch_sign(x: np.ndarray) -> np.ndarray:
  """``torch.sign``: 0 for NaN and for -0.0."""
  return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def pytorch_rprop(lr, count, X, G, prev, step_size, *, etas, step_sizes, maximize, dtype=np.float64):
  """``torch.optim.Rprop``'s step (written from PyTorch's ``_single_tensor_rprop``); ``lr`` only starts
  ``step_size`` (``torch.full_like(grad, lr)``, before the first step: the caller's state), ``count``
  is its ``step``, which nothing reads. Returns ``(X_new, prev_new, step_size_new)``."""
  del lr, count
  X, G, prev, step_size = _arrays(dtype, X, G, prev, step_size)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  etaminus, etaplus = etas
  step_size_min, step_size_max = step_sizes
  grad = -G if maximize else G
  sign = _torch_sign(np.asarray(grad * prev))  # grad.mul(prev).sign()
  sign = np.where(sign > 0, s(etaplus), sign)  # sign[sign.gt(0)] = etaplus
  sign = np.where(sign < 0, s(etaminus), sign)  # sign[sign.lt(0)] = etaminus
  sign = np.where(sign == 0, s(1), sign)  # sign[sign.eq(0)] = 1
  step_size = np.clip(step_size * sign, s(step_size_min), s(step_size_max))  # mul_(sign).clamp_(min, max)
  grad = np.where(sign == s(etaminus), s(0), grad)  # grad.clone(); grad[sign.eq(etaminus)] = 0
  X_new = X + (s(-1) * _torch_sign(grad)) * step_size  # param.addcmul_(grad.sign(), step_size, value=-1)
  return X_new, grad, step_size  # prev.copy_(grad)


def pytorch_asgd(lr, count, X, G, eta, mu, ax, *, lambd, alpha, t0, weight_decay, maximize, dtype=np.float64):
  """``torch.optim.ASGD``'s step (written from PyTorch's ``_single_tensor_asgd``); ``count``: its
  ``step`` before it; ``eta`` and ``mu`` one number per parameter (``.item()``). Returns ``(X_new,
  eta_new, mu_new, ax_new)``, the next ``eta`` and ``mu`` in float32 as PyTorch stores them."""
  X, G, ax = _arrays(dtype, X, G, ax)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  step = count + 1  # step_t += 1
  grad = -G if maximize else G
  if weight_decay != 0:
    grad = _fma(X, s(weight_decay), grad, X.dtype)  # grad.add(param, alpha=weight_decay)
  eta_value = float(np.ravel(eta)[0])  # eta.item()
  param = X * s(1 - lambd * eta_value)  # param.mul_(1 - lambd * eta_value): a Python float
  param = _fma(grad, s(-eta_value), param, X.dtype)  # param.add_(grad, alpha=-eta_value)
  mu_value = float(np.ravel(mu)[0])
  if mu_value != 1:
    ax = ax + (param - ax) * s(mu_value)  # ax.add_(param.sub(ax).mul_(mu))
  else:
    ax = param.copy()  # ax.copy_(param)
  eta_new = np.full(np.shape(eta), lr / ((1 + lambd * lr * step) ** alpha), np.float32)  # eta.copy_(...)
  mu_new = np.full(np.shape(mu), 1 / max(1, step - t0), np.float32)  # mu.copy_(...)
  return param, eta_new, mu_new, ax


def pytorch_radam(
  lr,
  count,
  X,
  G,
  exp_avg,
  exp_avg_sq,
  *,
  betas,
  eps,
  weight_decay,
  decoupled_weight_decay,
  maximize,
  dtype=np.float64,
  scalars=None,
):
  """``torch.optim.RAdam``'s step (written from PyTorch's ``_single_tensor_radam``); ``count``:
  PyTorch's ``step`` before it. Returns ``(X_new, exp_avg_new, exp_avg_sq_new)``. ``scalars``:
  ``{"bias_correction1", "bias_correction2_sqrt", "rho_t", "rect"}`` to use instead of PyTorch's
  float64 numbers (a framework that computes them otherwise)."""
  X, G, exp_avg, exp_avg_sq = _arrays(dtype, X, G, exp_avg, exp_avg_sq)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  beta1, beta2 = betas
  step = count + 1
  grad = -G if maximize else G
  if weight_decay != 0:
    if decoupled_weight_decay:
      X = X * s(1 - lr * weight_decay)  # param.mul_(1 - lr * weight_decay)
    else:
      grad = _fma(X, s(weight_decay), grad, X.dtype)  # grad.add(param, alpha=weight_decay)
  weight = s(1 - beta1)  # exp_avg.lerp_(grad, 1 - beta1), PyTorch's two branches
  if abs(weight) < 0.5:
    exp_avg = _fma(weight, grad - exp_avg, exp_avg, X.dtype)
  else:
    exp_avg = _fma(weight - s(1), grad - exp_avg, grad, X.dtype)
  exp_avg_sq = exp_avg_sq * s(beta2)  # exp_avg_sq.mul_(beta2)
  exp_avg_sq = _fma(s(1 - beta2) * grad, grad, exp_avg_sq, X.dtype)  # .addcmul_(grad, grad, value=1 - beta2)
  bias_correction1 = 1 - beta1**step  # Python floats
  bias_correction2 = 1 - beta2**step
  rho_inf = 2 / (1 - beta2) - 1
  rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
  bias_correction2_sqrt = bias_correction2**0.5
  if scalars is not None:
    bias_correction1, bias_correction2_sqrt = scalars["bias_correction1"], scalars["bias_correction2_sqrt"]
    rho_t = scalars["rho_t"]
  bias_corrected = exp_avg / s(bias_correction1)  # exp_avg / bias_correction1
  scaled = bias_corrected * s(lr)  # * lr
  if rho_t > 5:
    if scalars is not None:
      rect = scalars["rect"]
    else:
      rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
    denom = np.sqrt(exp_avg_sq) + s(eps)  # exp_avg_sq.sqrt().add_(eps)
    adaptive = (s(1) / denom) * s(bias_correction2_sqrt)  # float / tensor: reciprocal(), then * float
    step_ = (scaled * adaptive) * s(rect)
  else:
    step_ = scaled
  return X - step_, exp_avg, exp_avg_sq  # param.add_(..., alpha=-1.0)


@expectation("pytorch_nadam", state=3, framework_order=True)
def pytorch_nadam(
  lr,
  count,
  X,
  G,
  mu_product,
  exp_avg,
  exp_avg_sq,
  *,
  betas,
  eps,
  weight_decay,
  momentum_decay,
  decoupled_weight_decay=False,
  maximize=False,
  dtype=np.float64,
  scalars=None,
):
  """``torch.optim.NAdam``'s step (written from PyTorch's ``_single_tensor_nadam``); ``count``:
  PyTorch's ``step`` before it, ``mu_product`` its per-tensor scalar (multiplied in float32, PyTorch's
  scalar dtype under its default dtype, whatever ``dtype``). Returns ``(X_new, mu_product_new, exp_avg_new,
  exp_avg_sq_new)``. ``scalars``: ``{"bias_correction2", "mu", "mu_next"}`` to use instead of
  PyTorch's float64 numbers (a framework that computes them otherwise); the step sizes are then
  computed from them in ``dtype``, as Python floats are in float64."""
  X, G, exp_avg, exp_avg_sq = _arrays(dtype, X, G, exp_avg, exp_avg_sq)
  s = lambda v: np.asarray(v, X.dtype)  # noqa: E731
  beta1, beta2 = betas
  step = count + 1
  grad = -G if maximize else G
  bias_correction2 = 1 - beta2**step  # Python floats
  if weight_decay != 0:
    if decoupled_weight_decay:
      X = X * s(1 - lr * weight_decay)  # param.mul_(1 - lr * weight_decay)
    else:
      grad = _fma(X, s(weight_decay), grad, X.dtype)  # grad.add(param, alpha=weight_decay)
  mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
  mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
  if scalars is not None:
    bias_correction2, mu, mu_next = scalars["bias_correction2"], scalars["mu"], scalars["mu_next"]
  # mu_product *= mu: a tensor of PyTorch's scalar dtype (float32 under its default dtype) times a
  # Python float, in float32 whatever the parameters' dtype
  mu_product = np.asarray(mu_product, np.float32) * np.float32(mu)
  weight = s(1 - beta1)  # exp_avg.lerp_(grad, 1 - beta1), PyTorch's two branches
  if abs(weight) < 0.5:
    exp_avg = _fma(weight, grad - exp_avg, exp_avg, X.dtype)
  else:
    exp_avg = _fma(weight - s(1), grad - exp_avg, grad, X.dtype)
  exp_avg_sq = exp_avg_sq * s(beta2)  # exp_avg_sq.mul_(beta2)
  exp_avg_sq = _fma(s(1 - beta2) * grad, grad, exp_avg_sq, X.dtype)  # .addcmul_(grad, grad, value=1 - beta2)
  denom = np.sqrt(exp_avg_sq / s(bias_correction2)) + s(eps)  # exp_avg_sq.div(bc2).sqrt().add_(eps)
  p = s(mu_product)  # mu_product.item(): exact
  grad_size = (s(-lr) * (s(1.0) - s(mu))) / (s(1.0) - p)  # -lr * (1.0 - mu) / (1.0 - mu_product)
  avg_size = (s(-lr) * s(mu_next)) / (s(1.0) - p * s(mu_next))  # (-lr * mu_next) / (1.0 - mu_product_next)
  X = X + (grad_size * grad) / denom  # param.addcdiv_(grad, denom, value=grad_size)
  X = X + (avg_size * exp_avg) / denom  # param.addcdiv_(exp_avg, denom, value=avg_size)
  return X, mu_product, exp_avg, exp_avg_sq


# -- the twins' steps, registered by rule: ``(R, T, X, G, *state)``, ``T`` their count ------------


@expectation("pytorch_sgd", state=1, framework_order=True)
def _pytorch_sgd_step(R, T, X, G, buf, *, maximize=False, dtype=np.float64, scalars=None, **hyper):
  """:func:`pytorch_sgd`, the buffer as it was without momentum (PyTorch keeps none). Its scalars
  (``-lr``, ``1 - dampening``) are Python floats: ``scalars`` changes nothing."""
  del scalars
  X_new, buf_new = pytorch_sgd(R, T, X, G, buf, maximize=maximize, dtype=dtype, **hyper)
  return X_new, (np.asarray(buf, dtype) if buf_new is None else buf_new)


@expectation("pytorch_adagrad", state=1, framework_order=True)
def _pytorch_adagrad_step(R, T, X, G, state_sum, *, maximize=False, **kwargs):
  """:func:`pytorch_adagrad` (``maximize`` off unless given)."""
  return pytorch_adagrad(R, T, X, G, state_sum, maximize=maximize, **kwargs)


@expectation("pytorch_adam", state=2, framework_order=True)
def _pytorch_adam_step(
  R, T, X, G, exp_avg, exp_avg_sq, *amsgrad_max, maximize=False, decoupled_weight_decay=False, **kwargs
):
  """:func:`pytorch_adam` (``torch.optim.Adam``: the weight decay added to the gradient unless given;
  ``max_exp_avg_sq`` after ``exp_avg_sq`` with ``amsgrad``)."""
  return pytorch_adam(
    R,
    T,
    X,
    G,
    exp_avg,
    exp_avg_sq,
    *amsgrad_max,
    maximize=maximize,
    decoupled_weight_decay=decoupled_weight_decay,
    **kwargs,
  )


@expectation("pytorch_adamw", state=2, framework_order=True)
def _pytorch_adamw_step(R, T, X, G, exp_avg, exp_avg_sq, *amsgrad_max, maximize=False, **kwargs):
  """:func:`pytorch_adam` with ``decoupled_weight_decay`` (``torch.optim.AdamW``)."""
  return pytorch_adam(
    R, T, X, G, exp_avg, exp_avg_sq, *amsgrad_max, maximize=maximize, decoupled_weight_decay=True, **kwargs
  )


@expectation("pytorch_rmsprop", state=3, framework_order=True)
def _pytorch_rmsprop_step(R, T, X, G, square_avg, buf, grad_avg, *, maximize=False, scalars=None, **kwargs):
  """:func:`pytorch_rmsprop` (``maximize`` off unless given). Its only scalar is ``-lr``, a Python
  float: ``scalars`` changes nothing."""
  del scalars
  return pytorch_rmsprop(R, T, X, G, square_avg, buf, grad_avg, maximize=maximize, **kwargs)


@expectation("pytorch_adamax", state=2, framework_order=True)
def _pytorch_adamax_step(R, T, X, G, exp_avg, exp_inf, *, maximize=False, **kwargs):
  """:func:`pytorch_adamax` (``maximize`` off unless given); ``scalars`` (``clr``) passed on."""
  return pytorch_adamax(R, T, X, G, exp_avg, exp_inf, maximize=maximize, **kwargs)


@expectation("pytorch_adadelta", state=2, framework_order=True)
def _pytorch_adadelta_step(R, T, X, G, square_avg, acc_delta, *, maximize=False, scalars=None, **kwargs):
  """:func:`pytorch_adadelta` (``maximize`` off unless given). Its only scalar is ``-lr``, a Python
  float: ``scalars`` changes nothing."""
  del scalars
  return pytorch_adadelta(R, T, X, G, square_avg, acc_delta, maximize=maximize, **kwargs)


@expectation("pytorch_rprop", state=2, framework_order=True)
def _pytorch_rprop_step(R, T, X, G, prev, step_size, *, maximize=False, scalars=None, **kwargs):
  """:func:`pytorch_rprop` (``maximize`` off unless given). It has no computed scalar: ``scalars``
  changes nothing."""
  del scalars
  return pytorch_rprop(R, T, X, G, prev, step_size, maximize=maximize, **kwargs)


@expectation("pytorch_radam", state=2, framework_order=True)
def _pytorch_radam_step(
  R, T, X, G, exp_avg, exp_avg_sq, *, maximize=False, decoupled_weight_decay=False, **kwargs
):
  """:func:`pytorch_radam` (``maximize`` and the decoupled decay off unless given)."""
  decoupled = decoupled_weight_decay
  return pytorch_radam(
    R, T, X, G, exp_avg, exp_avg_sq, maximize=maximize, decoupled_weight_decay=decoupled, **kwargs
  )


@expectation("pytorch_asgd", state=3)
def _pytorch_asgd_step(R, T, X, G, eta, mu, ax, *, maximize=False, **kwargs):
  """:func:`pytorch_asgd` (``maximize`` off unless given). Not compared to the bit with PyTorch's
  float32 order: without ``jax_enable_x64`` the twin computes ``1 - lambd * eta`` and the next
  ``eta`` in float32, PyTorch in Python float64."""
  return pytorch_asgd(R, T, X, G, eta, mu, ax, maximize=maximize, **kwargs)


@expectation("keras_adam", state=2)
def _keras_adam_step(R, T, X, G, m, v, *, beta_1, beta_2, epsilon, dtype=np.float64):
  """Keras's Adam is DirectML Adam in exact arithmetic (Keras's ``m += (g - m) * (1 - beta_1)`` is
  ``beta_1 m + (1 - beta_1) g``, its ``alpha`` DirectML's ``LearningRate * Alpha`` at ``T = count +
  1``): :func:`directml_adam` at ``T + 1``. Not Keras's order: nothing to compare to the bit."""
  return directml_adam(
    X, m, v, G, T + 1, learning_rate=R, beta1=beta_1, beta2=beta_2, epsilon=epsilon, dtype=dtype
  )
