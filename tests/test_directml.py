"""onnx_optax.directml.adam_optimizer against onnx_optax.reference.directml_adam.

Expected values: the NumPy reference (written from the DirectML text, in
float64). Tolerance, element by element: the rigorous rounding-error bound of
our computation in the tensors' dtype plus the reference's float64 bound
(``onnx_optax.conformance.tolerance``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from onnx_optax import reference
from onnx_optax.conformance import tolerance
from onnx_optax.directml import adam_optimizer

HYPER = dict(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8)


def _inputs(shape, dtype, rng, scale=1.0):
  X = rng.normal(size=shape).astype(dtype)
  M = (scale * rng.normal(size=shape)).astype(dtype)
  V = (scale * scale * rng.uniform(0, 2, size=shape)).astype(dtype)
  G = (scale * rng.normal(size=shape)).astype(dtype)
  return X, M, V, G


def _check(outputs, X, M, V, G, T, hyper, dtype):
  expected = reference.directml_adam(X, M, V, G, T, **hyper)
  R = hyper["learning_rate"]
  rest = {k: v for k, v in hyper.items() if k != "learning_rate"}
  context = tolerance.implementation_context(dtype, jax.default_backend())  # GPU: approximate divide/sqrt.
  ours_b = tolerance.bounds("directml_adam", context, R, T, X, G, [M, V], **rest)
  ref_b = tolerance.bounds("directml_adam", tolerance.reference_context(), R, T, X, G, [M, V], **rest)
  for i, (out, exp, a, b) in enumerate(zip(outputs, expected, ours_b, ref_b, strict=True)):
    assert out.dtype == np.dtype(dtype) and out.shape == X.shape
    err = np.abs(np.asarray(out, np.float64) - exp)
    assert np.all(err <= a + b), f"output {i}: error {err.max()} > bound"


@pytest.mark.parametrize("T", [1, 2, 10, 100000])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
# scale 1e-4: sqrt(V) ~ 1e-4, where epsilon (1e-4; float16: 1e-3) matters. In float16, V ~ 1e-8 is
# subnormal: the bound counts the absolute error of underflow.
@pytest.mark.parametrize("scale", [1.0, 1e-4])
def test_matches_reference(T, dtype, scale):
  rng = np.random.default_rng(T + 7 * len(dtype))
  hyper = dict(HYPER, epsilon=1e-3 if dtype == "float16" else 1e-8 if scale == 1.0 else 1e-4)
  with jax.enable_x64(dtype == "float64"):
    X, M, V, G = _inputs((2, 3, 1, 4), np.dtype(dtype), rng, scale)
    outputs = adam_optimizer(X, M, V, G, np.uint32(T), **hyper)
    _check(outputs, X, M, V, G, T, hyper, np.dtype(dtype))


def test_directml_step_shape_and_jit():
  rng = np.random.default_rng(1)
  X, M, V, G = _inputs((5,), np.float32, rng)
  step = jax.jit(adam_optimizer, static_argnames=tuple(HYPER))
  for T in (1, 3):  # DirectML's {1, 1, 1, 1} step tensor, traced: one compilation.
    outputs = step(X, M, V, G, jnp.full((1, 1, 1, 1), T, jnp.uint32), **HYPER)
    _check(outputs, X, M, V, G, T, HYPER, np.float32)
  assert step._cache_size() == 1


def test_one_call_equals_the_transforms_first_update():
  rng = np.random.default_rng(2)
  X, _, _, G = _inputs((4,), np.float32, rng)
  opt = onnx_optax.directml_adam(HYPER["learning_rate"], beta1=0.9, beta2=0.999, epsilon=1e-8)
  updates, state = opt.update(jnp.asarray(G), opt.init(jnp.asarray(X)))
  X_new, M_new, V_new = adam_optimizer(X, np.zeros_like(X), np.zeros_like(X), G, 1, **HYPER)
  np.testing.assert_array_equal(optax.apply_updates(jnp.asarray(X), updates), X_new)
  np.testing.assert_array_equal(state.m, M_new)
  np.testing.assert_array_equal(state.v, V_new)


@pytest.mark.parametrize(
  "step",
  [
    np.uint32(2**32 - 1),
    np.uint8(200),
    np.int16(7),
    np.uint16(65535),
    np.int32(2**31 - 1),
    np.uint64(2**32 - 1),
  ],
)
def test_every_integer_type_whose_value_fits(step):
  """A NumPy integer scalar is read in its own type, as the JAX array of that type is.

  ``np.uint32(2**32 - 1)`` (DirectML's own UINT32) was read as a Python int,
  hence as int32, and refused with advice about x64; ``jnp.uint32`` of the
  same value was accepted. Both now give the same outputs, which follow the
  NumPy reference at that ``T``. (uint64 is held as uint32 in JAX's default
  mode: its value fits.)
  """
  X, M, V, G = _inputs((3,), np.float32, np.random.default_rng(4))
  ours = adam_optimizer(X, M, V, G, step, **HYPER)
  as_jax = adam_optimizer(X, M, V, G, jnp.asarray(step), **HYPER)
  for a, b in zip(ours, as_jax, strict=True):
    np.testing.assert_array_equal(a, b)
  _check(ours, X, M, V, G, int(step), HYPER, np.float32)


@pytest.mark.parametrize(
  "step, error, match",
  [
    (0, ValueError, "training_step must be >= 1, got 0.*0/0"),
    (np.uint32(0), ValueError, "training_step must be >= 1"),
    (-3, ValueError, "training_step must be >= 1"),
    (np.float32(1), TypeError, "training_step must be an integer scalar"),
    (np.ones((1, 2), np.uint32), TypeError, "training_step must be an integer scalar"),
    (True, TypeError, "training_step must be an integer scalar"),
  ],
)
def test_bad_training_step(step, error, match):
  X, M, V, G = _inputs((3,), np.float32, np.random.default_rng(3))
  with pytest.raises(error, match=match):
    adam_optimizer(X, M, V, G, step, **HYPER)


def test_bad_tensors_and_constants():
  X, M, V, G = _inputs((3,), np.float32, np.random.default_rng(4))
  with pytest.raises(ValueError, match=r"gradient has shape \(1, 3\) but input_parameters has shape \(3,\)"):
    adam_optimizer(X, M, V, G[None], 1, **HYPER)
  with pytest.raises(TypeError, match="input_second_moment has dtype float16 but input_parameters"):
    adam_optimizer(X, M, V.astype(np.float16), G, 1, **HYPER)
  with pytest.raises(TypeError, match="input_first_moment has dtype int32"):
    adam_optimizer(X, M.astype(np.int32), V, G, 1, **HYPER)
  with pytest.raises(ValueError, match="beta1 must be < 1.0"):
    adam_optimizer(X, M, V, G, 1, **{**HYPER, "beta1": 1.0})
  with pytest.raises(ValueError, match="epsilon must be >= 0"):
    adam_optimizer(X, M, V, G, 1, **{**HYPER, "epsilon": -1e-8})
  with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'epsilon'"):
    adam_optimizer(X, M, V, G, 1, learning_rate=0.1, beta1=0.9, beta2=0.999)
