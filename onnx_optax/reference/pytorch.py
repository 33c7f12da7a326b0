"""The PyTorch twins' expectations: torch.optim's ``_single_tensor_*`` functions, in their order.

Written from PyTorch 2.13's torch/optim/sgd.py ``_single_tensor_sgd``, adagrad.py
``_single_tensor_adagrad`` and adam.py ``_single_tensor_adam`` (docs/spec.md, "PyTorch-order
twins"), not from onnx_optax.rules. Scalars are Python floats (float64), as PyTorch's; each
tensor operation computes in ``dtype`` and rounds its result to ``dtype``. With dtype=np.float32
the operations that PyTorch's CPU kernels fuse (``add(other, alpha)``, ``lerp``, ``addcmul``) are
fused multiply-adds, rounded once (``_fma``): the expectation is then PyTorch's float32
arithmetic to the bit wherever its operations are correctly rounded. PyTorch's CPU ``sqrt``
(MKL's ``vmsSqrt``, dispatched by MKL on the CPU it finds) is not always correctly rounded;
NumPy's is (docs/interop.md, "PyTorch's float32 arithmetic per CPU").
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from onnx_optax.reference._base import _arrays, expectation, register

__all__ = [
  "pytorch_adadelta",
  "pytorch_adafactor",
  "pytorch_adagrad",
  "pytorch_adam",
  "pytorch_adamax",
  "pytorch_asgd",
  "pytorch_muon",
  "pytorch_nadam",
  "pytorch_radam",
  "pytorch_rmsprop",
  "pytorch_rprop",
  "pytorch_sgd",
]


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


def _lerp(start: np.ndarray, end: np.ndarray, weight: float) -> np.ndarray:
  """``start.lerp(end, weight)``, a Python float ``weight``: PyTorch's two branches, each one fused
  rounding in ``start``'s dtype (``start + weight (end - start)`` for ``|weight| < 0.5``, else
  ``end + (weight - 1) (end - start)``)."""
  w = np.asarray(weight, start.dtype)
  if abs(w) < 0.5:
    return _fma(w, end - start, start, start.dtype)
  return _fma(w - np.asarray(1, start.dtype), end - start, end, start.dtype)


def _weight_decay(X: np.ndarray, grad: np.ndarray, lr: float, weight_decay: float, decoupled: bool):
  """The weight decay of Adam, AdamW, RAdam and NAdam: ``param.mul_(1 - lr * weight_decay)``
  (decoupled) or ``grad = grad.add(param, alpha=weight_decay)``. Returns ``(X, grad)``."""
  if weight_decay == 0:
    return X, grad
  if decoupled:
    return X * np.asarray(1 - lr * weight_decay, X.dtype), grad
  return X, _fma(X, np.asarray(weight_decay, X.dtype), grad, X.dtype)


def _adam_moments(grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, beta1: float, beta2: float):
  """The moments of Adam, AdamW, RAdam and NAdam, in their order: ``exp_avg.lerp_(grad, 1 - beta1)``,
  ``exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)``. Returns both."""
  s = lambda v: np.asarray(v, grad.dtype)  # noqa: E731
  exp_avg = _lerp(exp_avg, grad, 1 - beta1)
  exp_avg_sq = _fma(s(1 - beta2) * grad, grad, exp_avg_sq * s(beta2), grad.dtype)
  return exp_avg, exp_avg_sq


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
  X, grad = _weight_decay(X, grad, lr, weight_decay, decoupled_weight_decay)
  exp_avg, exp_avg_sq = _adam_moments(grad, exp_avg, exp_avg_sq, beta1, beta2)
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
  exp_avg = _lerp(exp_avg, grad, 1 - beta1)  # exp_avg.lerp_(grad, 1 - beta1)
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
  X, grad = _weight_decay(X, grad, lr, weight_decay, decoupled_weight_decay)
  exp_avg, exp_avg_sq = _adam_moments(grad, exp_avg, exp_avg_sq, beta1, beta2)
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
  X, grad = _weight_decay(X, grad, lr, weight_decay, decoupled_weight_decay)
  mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
  mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
  if scalars is not None:
    bias_correction2, mu, mu_next = scalars["bias_correction2"], scalars["mu"], scalars["mu_next"]
  # mu_product *= mu: a tensor of PyTorch's scalar dtype (float32 under its default dtype) times a
  # Python float, in float32 whatever the parameters' dtype
  mu_product = np.asarray(mu_product, np.float32) * np.float32(mu)
  exp_avg, exp_avg_sq = _adam_moments(grad, exp_avg, exp_avg_sq, beta1, beta2)
  denom = np.sqrt(exp_avg_sq / s(bias_correction2)) + s(eps)  # exp_avg_sq.div(bc2).sqrt().add_(eps)
  p = s(mu_product)  # mu_product.item(): exact
  grad_size = (s(-lr) * (s(1.0) - s(mu))) / (s(1.0) - p)  # -lr * (1.0 - mu) / (1.0 - mu_product)
  avg_size = (s(-lr) * s(mu_next)) / (s(1.0) - p * s(mu_next))  # (-lr * mu_next) / (1.0 - mu_product_next)
  X = X + (grad_size * grad) / denom  # param.addcdiv_(grad, denom, value=grad_size)
  X = X + (avg_size * exp_avg) / denom  # param.addcdiv_(exp_avg, denom, value=avg_size)
  return X, mu_product, exp_avg, exp_avg_sq


# -- torch.optim.Muon (torch/optim/_muon.py) ------------------------------------------------------


def _bfloat16(x: np.ndarray) -> np.ndarray:
  """``x`` (float64 or float32) rounded to bfloat16 (to nearest, ties to even, through float32 as
  c10's conversion), kept as float64."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  one, half = np.uint64(1), np.uint64(0x7FFF)
  rounded = (bits + half + ((bits >> np.uint64(16)) & one)) & np.uint64(0xFFFF0000)
  return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def _muon_newton_schulz(update, ns_coefficients, ns_steps, eps):
  """PyTorch's ``_zeropower_via_newtonschulz`` with every bfloat16 result correctly rounded: each
  matrix product (of bfloat16 numbers, exact products) and ``b A + c A A``, ``a X + B X`` summed in
  float64 and rounded once to bfloat16 (PyTorch accumulates in float32: the two differ only where
  float32's sum lands across a bfloat16 rounding boundary)."""
  a, b, c = (float(np.float32(v)) for v in ns_coefficients)
  x = _bfloat16(update)  # grad.bfloat16()
  tall = x.shape[0] > x.shape[1]
  if tall:
    x = x.T
  norm = _bfloat16(np.sqrt(np.sum(x * x)))  # ortho_grad.norm()
  norm = max(norm, float(_bfloat16(np.float64(eps))))  # .clamp(min=eps)
  x = _bfloat16(x / norm)  # ortho_grad.div_(...)
  for _ in range(ns_steps):
    gram = _bfloat16(x @ x.T)  # ortho_grad @ ortho_grad.T
    gram_update = _bfloat16(b * gram + c * (gram @ gram))  # addmm(gram, gram, gram, beta=b, alpha=c)
    x = _bfloat16(a * x + gram_update @ x)  # addmm(ortho_grad, gram_update, ortho_grad, beta=a)
  return x.T if tall else x


@expectation("pytorch_muon", state=1)
def pytorch_muon(
  lr,
  count,
  X,
  G,
  momentum_buffer,
  *,
  weight_decay,
  momentum,
  nesterov,
  ns_coefficients=(3.4445, -4.7750, 2.0315),
  eps=1e-7,
  ns_steps=5,
  adjust_lr_fn=None,
  dtype=np.float64,
  scalars=None,
):
  """``torch.optim.Muon``'s step on one matrix (written from PyTorch's ``_single_tensor_muon``).

  The iteration's input is formed as PyTorch forms it, in the tensors' own arithmetic (float32
  for float32, bfloat16 and float16 tensors, float64 for float64): ``buf.lerp_(grad, 1 -
  momentum)``, ``grad.lerp(buf, momentum)`` (one fused rounding each, PyTorch's two branches);
  the iteration is ``_muon_newton_schulz``; ``X_new`` and the new buffer are computed in
  ``dtype`` (the buffer's lerp again there: the iteration's input alone is PyTorch's rounded
  one). ``count`` is not read (Muon keeps no ``step``), nor ``scalars`` (its only scalar is
  ``lr``). Returns ``(X_new, momentum_buffer_new)``.
  """
  del count, scalars
  ortho, buf = muon_orthogonalized(
    G,
    momentum_buffer,
    momentum=momentum,
    nesterov=nesterov,
    ns_coefficients=ns_coefficients,
    ns_steps=ns_steps,
    eps=eps,
  )
  del buf  # the iteration's input; the new buffer is computed in ``dtype`` as the rest
  ratio = muon_ratio(np.shape(X), adjust_lr_fn)
  X, G, momentum_buffer = _arrays(dtype, X, G, momentum_buffer)
  buf = _lerp(momentum_buffer, G, 1 - momentum)  # buf.lerp_(grad, 1 - momentum)
  if weight_decay != 0:
    X = X * np.asarray(1 - lr * weight_decay, X.dtype)  # param.mul_(1 - lr * weight_decay)
  X_new = X + np.asarray(-(lr * ratio), X.dtype) * ortho.astype(X.dtype)  # add_(update, alpha=-adjusted_lr)
  return X_new, buf


def muon_orthogonalized(G, momentum_buffer, *, momentum, nesterov, ns_coefficients, ns_steps, eps):
  """``torch.optim.Muon``'s momentum and iteration on one matrix: ``(O, momentum_buffer_new)``,
  ``O`` the bfloat16 iteration's output (float64 values), the buffer in ``work`` (float64 for
  float64 tensors, else float32), its values those of its own dtype. ``G`` and
  ``momentum_buffer`` in the tensors' own dtypes: each lerp is one fused rounding in ``work``,
  its result stored in its tensor's dtype (float16's rounding) and read back in ``work``."""
  work = np.float64 if np.asarray(G).dtype == np.float64 else np.float32
  g_dtype, buf_dtype = np.asarray(G).dtype, np.asarray(momentum_buffer).dtype
  g, buf = (np.asarray(v, work) for v in (G, momentum_buffer))
  buf = _lerp(buf, g, 1 - momentum).astype(buf_dtype).astype(work)  # buf.lerp_(grad, 1 - momentum)
  if nesterov:
    update = _lerp(g, buf, momentum).astype(g_dtype).astype(work)  # grad.lerp(buf, momentum)
  else:
    update = buf
  return _muon_newton_schulz(update, ns_coefficients, ns_steps, eps), buf


def muon_ratio(shape, adjust_lr_fn) -> float:
  """PyTorch's ``_adjust_lr`` factor, a Python float: ``sqrt(max(1, A / B))`` (None,
  ``"original"``) or ``0.2 sqrt(max(A, B))`` (``"match_rms_adamw"``)."""
  A, B = shape
  return math.sqrt(max(1, A / B)) if adjust_lr_fn in (None, "original") else 0.2 * math.sqrt(max(A, B))


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


def pytorch_adafactor(
  lr: float,
  count: int,
  X: Any,
  G: Any,
  row_var: Any,
  col_var: Any,
  variance: Any,
  *,
  beta2_decay: float = -0.8,
  eps: tuple[float | None, float] = (None, 1e-3),
  d: float = 1.0,
  weight_decay: float = 0.0,
  maximize: bool = False,
  dtype: Any = np.float64,
  scalars: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """``torch.optim.Adafactor``'s step on one tensor ``X`` (``count``: PyTorch's ``step`` before it),
  from PyTorch 2.13's ``_single_tensor_adafactor`` (docs/spec.md, "torch.optim.Adafactor"). The
  norms couple a tensor's elements: one call is one PyTorch tensor.

  ``row_var`` and ``col_var`` (``X`` of two or more dimensions) or ``variance`` (fewer) are the
  state; the other ones are returned as given (one zero each in the transform's state). ``eps1``
  None is the machine epsilon of ``X``'s dtype as given. Returns ``(X_new, row_var_new,
  col_var_new, variance_new)``. ``scalars`` changes nothing (the scalars are Python floats).
  """
  del scalars
  eps1, eps2 = eps
  if eps1 is None:
    eps1 = float(ml_dtypes.finfo(np.asarray(X).dtype).eps)
  dtype = np.asarray(X).dtype if dtype is None else dtype
  X, G = np.asarray(X, dtype), np.asarray(G, dtype)
  grad = -G if maximize else G
  step = count + 1.0
  one_minus_beta2 = step**beta2_decay  # Python floats, as PyTorch's
  rho = min(lr, 1 / (step**0.5))
  numel = X.size
  alpha = max(eps2, float(np.linalg.norm(X.ravel())) / (numel**0.5)) * rho  # before the decay
  if weight_decay != 0:
    X = X * np.asarray(1 - lr * weight_decay, dtype)
  if grad.ndim > 1:
    row_mean = np.sqrt(np.sum(grad * grad, axis=-1, keepdims=True)) ** 2 / grad.shape[-1]
    row_var = _lerp(np.asarray(row_var, dtype), row_mean, one_minus_beta2)
    col_mean = np.sqrt(np.sum(grad * grad, axis=-2, keepdims=True)) ** 2 / grad.shape[-2]
    col_var = _lerp(np.asarray(col_var, dtype), col_mean, one_minus_beta2)
    var = row_var @ col_var  # (..., m, 1) @ (..., 1, n): one product per element
    var = var / np.maximum(np.mean(row_var, axis=-2, keepdims=True), np.asarray(eps1, dtype))
  else:
    variance = _lerp(np.asarray(variance, dtype), grad * grad, one_minus_beta2)
    var = variance
  update = (1 / np.sqrt(np.maximum(var, np.asarray(eps1 * eps1, dtype)))) * grad  # rsqrt_, mul_(grad)
  denom = max(1.0, float(np.linalg.norm(update.ravel())) / ((numel**0.5) * d))
  X_new = _fma(np.asarray(-alpha / denom, dtype), update, X, X.dtype)  # add_(update, alpha=-alpha / denom)
  return X_new, np.asarray(row_var), np.asarray(col_var), np.asarray(variance)


register("pytorch_adafactor", pytorch_adafactor, state=3)
