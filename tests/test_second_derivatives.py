"""Second derivatives through updates are finite where the math is: dead units included.

A dead unit (an element whose gradient has been exactly 0 at every update, so
that its second moment is 0) puts ``Sqrt(0)`` in the update. Its derivative is
infinite; the rules differentiate it as 0 (a subgradient of ``|G|``), and that
must hold at every order: a Hessian or a Hessian-vector product through the
update differentiates the first derivative's rule again.

Expected values: central finite differences, in float64, of ``jax.grad``
(whose finiteness and accuracy tests/test_metagradients.py checks against
differences of the loss). Every rule with a square root: Adagrad, ONNX Adam,
DirectML Adam, ONNX Runtime's AdamW in both modes and the framework twins
(PyTorch's Adagrad, Adam, AdamW, Keras's Adam); through the Optax transforms
and through the ONNX operator's call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from onnx_optax import onnx as ox

# The third unit is dead: its gradient A @ p is 0 whatever p is.
A = np.array([[1.0, 0.2, 0.0], [0.2, 2.0, 0.0], [0.0, 0.0, 0.0]])
P0 = np.array([0.5, -0.3, 0.7])

#: The dead unit's factor per update: only a decoupled weight decay (ONNX Runtime's AdamW and
#: PyTorch's, default weight_decay 0.01) scales it, by 1 - lr * wd.
DECAYED = 1 - 0.05 * 0.01

#: name -> (make(lr, h), the hyperparameter h differentiated besides the learning rate, its value,
#: the dead unit's factor per update). The framework twins with a square root too; PyTorch Adam's
#: betas are static (a pair of Python numbers), its eps is differentiated instead.
RULES = {
  "adagrad": (lambda lr, h: onnx_optax.adagrad(lr, decay_factor=h), 0.1, 1.0),
  "adam": (lambda lr, h: onnx_optax.adam(lr, beta=h), 0.9, 1.0),
  "directml_adam": (lambda lr, h: onnx_optax.directml_adam(lr, beta2=h), 0.9, 1.0),
  "ort_adamw_mode0": (lambda lr, h: onnx_optax.ort_adamw(lr, beta=h), 0.9, DECAYED),
  "ort_adamw_mode1": (lambda lr, h: onnx_optax.ort_adamw(lr, beta=h, adam_mode=1), 0.9, DECAYED),
  "pytorch_adagrad": (lambda lr, h: onnx_optax.pytorch_adagrad(lr, lr_decay=h), 0.1, 1.0),
  "pytorch_adam": (lambda lr, h: onnx_optax.pytorch_adam(lr, eps=h), 0.1, 1.0),
  "pytorch_adamw": (lambda lr, h: onnx_optax.pytorch_adamw(lr, eps=h), 0.1, DECAYED),
  "keras_adam": (lambda lr, h: onnx_optax.keras_adam(lr, beta_2=h), 0.9, 1.0),
}


def _loss(tx, p, steps):
  """``sum(p^2)`` after ``steps`` updates with the gradient ``A @ p`` of the current parameters."""
  A_ = jnp.asarray(A)
  state = tx.init(p)
  for _ in range(steps):
    updates, state = tx.update(A_ @ p, state, p)
    p = optax.apply_updates(p, updates)
  return jnp.sum(p**2)


def _central_differences_of_grad(f, x, h=1e-6):
  grad = jax.grad(f)
  columns = [(grad(x + h * e) - grad(x - h * e)) / (2 * h) for e in np.eye(x.size)]
  return np.stack([np.asarray(c) for c in columns], axis=1)


def _check(f, x):
  x = jnp.asarray(x)
  hessian = np.asarray(jax.hessian(f)(x))
  assert np.all(np.isfinite(hessian)), hessian
  np.testing.assert_allclose(hessian, _central_differences_of_grad(f, x), rtol=1e-6, atol=1e-7)
  # A Hessian-vector product, forward over reverse, is the Hessian's column combination.
  v = jnp.asarray(np.linspace(-1.0, 1.0, x.size))
  hvp = np.asarray(jax.jvp(jax.grad(f), (x,), (v,))[1])
  np.testing.assert_allclose(hvp, hessian @ np.asarray(v), rtol=1e-9, atol=1e-12)
  return hessian


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("name", sorted(RULES))
def test_hessian_with_respect_to_the_parameters(name, steps):
  make, h, c = RULES[name]
  with jax.enable_x64(True):
    hessian = _check(lambda p: _loss(make(0.05, h), p, steps), P0)
  # The dead unit's row: its step is 0 for every p, and only a decoupled decay scales it, by c per
  # update: d^2 / dp^2 of (p c^steps)^2.
  np.testing.assert_allclose(hessian[2], [0.0, 0.0, 2.0 * c ** (2 * steps)], rtol=1e-9)


@pytest.mark.parametrize("name", sorted(RULES))
def test_hessian_with_respect_to_the_hyperparameters(name):
  make, h, _ = RULES[name]
  with jax.enable_x64(True):
    _check(lambda lh: _loss(make(lh[0], lh[1]), jnp.asarray(P0), 3), np.array([0.05, h]))


@pytest.mark.parametrize("op", ["Adagrad", "Adam"])
def test_hessian_through_the_onnx_call(op):
  """The single-tensor rules (what the ONNX interface runs) use the same square root."""

  def f(x):
    G = jnp.asarray(A) @ x
    zeros = jnp.zeros_like(x)
    if op == "Adagrad":
      X_new, _ = ox.adagrad(jnp.float64(0.05), 0, x, G, zeros)
    else:
      X_new, _, _ = ox.adam(jnp.float64(0.05), 0, x, G, zeros, zeros)
    return jnp.sum(X_new**2)

  with jax.enable_x64(True):
    hessian = _check(f, P0)
  assert hessian[2, 2] == 2.0
