"""The ONNX operators' calls (``onnx_optax.onnx.momentum/adagrad/adam``, ``run_node``): their
argument checks, their defaults against ONNX's schemas, the update count's range and the opset."""

from __future__ import annotations

import re

import numpy as np
import pytest


def test_a_bad_operator_argument_is_described_by_its_type_unless_it_is_an_array():
  """The ONNX call's message names an array by shape and dtype, anything else by type and value
  (a NumPy dtype has a ``shape`` but no ``dtype``: not an array)."""
  from onnx_optax import onnx as ox

  X = np.ones(2, np.float32)
  hyper = dict(alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0)
  with pytest.raises(
    TypeError,
    match=r"R must be a float scalar \(ONNX: float or double\), got Float32DType dtype\('float32'\)",
  ):
    ox.momentum(np.dtype("float32"), np.int64(0), X, X, X, **hyper)
  with pytest.raises(TypeError, match=r"got an array of shape \(2,\) and dtype float32"):
    ox.momentum(X, np.int64(0), X, X, X, **hyper)


def test_the_operator_attributes_are_checked_before_the_inputs():
  """A mode that is not one is reported as such, whatever else is wrong with the call."""
  from onnx_optax import onnx as ox

  X = np.ones(2, np.float32)
  with pytest.raises(ValueError, match="mode must be one of"):
    ox.momentum(
      np.float32(0.1), np.int64(-1), X, X, X, alpha=0.9, beta=1.0, mode="Nesterov", norm_coefficient=0.0
    )


@pytest.mark.parametrize("op", ["Adagrad", "Adam"])
def test_the_operator_calls_defaults_are_the_onnx_schemas(op):
  """The defaults of ``onnx_optax.onnx.adagrad`` / ``adam`` are the attributes' defaults of ONNX's own
  schemas (a float32 attribute: compared after rounding to float32)."""
  import inspect

  import onnx.defs

  from onnx_optax import onnx as ox

  schema = onnx.defs.get_schema(op, domain="ai.onnx.preview.training")
  parameters = inspect.signature(getattr(ox, op.lower())).parameters
  defaults = {name: a.default_value.f for name, a in schema.attributes.items() if not a.required}
  assert defaults and set(defaults) <= set(parameters)
  for name, value in defaults.items():
    assert np.float32(parameters[name].default) == np.float32(value), name


def test_the_update_count_of_the_operator_call_fits_int32_to_its_maximum():
  """Under JAX's default 32-bit mode an int64 ``T`` up to int32's maximum is accepted, one more
  is refused (it would wrap)."""
  from onnx_optax import onnx as ox

  X = np.ones(2, np.float32)
  hyper = dict(alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0)
  T_max = np.int64(np.iinfo(np.int32).max)
  X_new, _ = ox.momentum(np.float32(0.1), T_max, X, X, X, **hyper)
  np.testing.assert_allclose(X_new, X - 0.1 * (0.9 * X + X), rtol=1e-6)
  with pytest.raises(ValueError, match=r"T = 2147483648 does not fit int32"):
    ox.momentum(np.float32(0.1), T_max + 1, X, X, X, **hyper)


def test_opset_that_is_not_a_positive_int_is_refused_as_such():
  from onnx import helper

  from onnx_optax import onnx as ox

  node = helper.make_node(
    "Adagrad", ["R", "T", "X", "G", "H"], ["Y", "H2"], domain="ai.onnx.preview.training"
  )
  for opset in (0, -1, True, "1", 1.0):
    with pytest.raises(ValueError, match=r"opset must be a positive int .*got " + re.escape(repr(opset))):
      ox.run_node(node, np.float32(0.1), np.int64(0), *[np.ones(1, np.float32)] * 3, opset=opset)


def test_an_operator_tensor_with_a_shape_but_no_dtype_is_not_an_array():
  from onnx_optax import onnx as ox

  X = np.ones(2, np.float32)
  with pytest.raises(TypeError, match=r"X_1 must be an array, got Float32DType"):
    ox.adagrad(np.float32(0.1), np.int64(0), np.dtype("float32"), X, X)


@pytest.mark.parametrize("x64", [False, True], ids=["32-bit", "x64"])
def test_ort_step_is_int64_or_int32_in_either_mode_and_no_other_integer(x64):
  """ONNX Runtime's ``step`` is int64; an int32 array is accepted too, in JAX's default 32-bit mode
  (which holds an int64 as int32) and under ``jax.enable_x64`` alike (docs/onnx.md); int8 and
  uint64 are not ONNX Runtime's type and are refused, naming ``step``."""
  import jax

  from onnx_optax import onnx as ox

  weights = [np.array([1.0, 2.0], np.float32)]
  gradients = [np.array([0.5, -0.5], np.float32)]
  zeros = [np.zeros(2, np.float32)]
  with jax.enable_x64(x64):
    # ONNX Runtime's AdamW, mode 0, at step 1 without decay: the first Adam step is lr * sign(g).
    for step in (np.int64(1), np.int32(1), np.array([1], np.int32), 1):
      flag, W, _, _ = ox.adamw_optimizer(
        np.float32(0.1), step, weights, gradients, zeros, zeros, adam_mode=0, weight_decay=0.0
      )
      assert bool(flag)
      np.testing.assert_allclose(np.asarray(W[0]), [0.9, 2.1], rtol=1e-6)
    for step in (np.int8(1), np.uint64(1), np.array(1, np.int16)):
      with pytest.raises(TypeError, match=r"^step must be an int64 scalar \(ONNX Runtime's step is int64\)"):
        ox.adamw_optimizer(np.float32(0.1), step, weights, gradients, zeros, zeros)
