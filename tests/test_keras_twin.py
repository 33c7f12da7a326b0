"""``onnx_optax.keras_adam``, Keras 3 Adam in Keras's order, against Keras and the NumPy expectation.

Keras picks its backend at import: this module sets the JAX backend, as
tests/test_interop_keras.py does.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax import reference  # noqa: E402

_SCRIPT = pathlib.Path(__file__).parent.parent / "benchmarks" / "carried_float32.py"
_spec = importlib.util.spec_from_file_location("carried_float32", _SCRIPT)
assert _spec is not None and _spec.loader is not None
carried = importlib.util.module_from_spec(_spec)
sys.modules["carried_float32"] = carried  # dataclasses look their module up
_spec.loader.exec_module(carried)


def test_backend_is_jax():
  assert keras.backend.backend() == "jax", "Keras was imported before KERAS_BACKEND=jax was set"


def test_one_step_is_kerass_jitted_step():
  """From the same state, one ``keras_adam`` update and one ``Adam.stateless_apply`` under
  ``jax.jit`` (``model.fit``'s step): the moments to the bit, the parameters to the bit but
  where ``X + (X_new - X)`` cannot reach ``X_new`` (a parameter shrunk below half)."""
  rng = np.random.default_rng(0)
  n = 1000
  x, g = rng.standard_normal(n).astype(np.float32), (0.1 * rng.standard_normal(n)).astype(np.float32)
  m, v = (0.1 * rng.standard_normal(n)).astype(np.float32), (0.01 * rng.random(n)).astype(np.float32)
  variable = keras.Variable(x.copy())
  opt = keras.optimizers.Adam(learning_rate=1e-3)
  opt.build([variable])
  opt._momentums[0].assign(m)
  opt._velocities[0].assign(v)
  opt.iterations.assign(7)
  opt_vars = [w.value for w in opt.variables]
  (x_keras,), new_opt_vars = jax.jit(opt.stateless_apply)(opt_vars, [jnp.asarray(g)], [jnp.asarray(x)])
  by_path = {w.path: value for w, value in zip(opt.variables, new_opt_vars)}
  m_keras = next(value for path, value in by_path.items() if "momentum" in path)
  v_keras = next(value for path, value in by_path.items() if "velocity" in path)

  tx = onnx_optax.keras_adam(1e-3, initial_count=7)
  state = onnx_optax.KerasAdamState(jnp.int32(7), jnp.asarray(m), jnp.asarray(v))

  @jax.jit
  def step(x, state, g):
    updates, state = tx.update(g, state, x)
    return optax.apply_updates(x, updates), state

  x_ours, state = step(jnp.asarray(x), state, jnp.asarray(g))
  assert np.array_equal(np.asarray(state.momentums), np.asarray(m_keras))
  assert np.array_equal(np.asarray(state.velocities), np.asarray(v_keras))
  assert int(state.count) == 8
  assert np.mean(np.asarray(x_ours) == np.asarray(x_keras)) >= 0.998


def test_is_directml_adam_in_float64():
  """The same rule as DirectML Adam (``T = count + 1``), NumPy's expectation, to 1e-13."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal(64)
  grads = [rng.standard_normal(64) for _ in range(20)]
  with jax.enable_x64(True):
    tx = onnx_optax.keras_adam(0.05, beta_1=0.8, beta_2=0.99, epsilon=1e-6)
    params = jnp.asarray(x)
    state = tx.init(params)
    for g in grads:
      updates, state = tx.update(jnp.asarray(g), state, params)
      params = optax.apply_updates(params, updates)
  expected, M, V = x, np.zeros(64), np.zeros(64)
  for T, g in enumerate(grads, start=1):
    expected, M, V = reference.directml_adam(
      expected, M, V, g, T, learning_rate=0.05, beta1=0.8, beta2=0.99, epsilon=1e-6
    )
  np.testing.assert_allclose(np.asarray(params), expected, rtol=1e-13, atol=1e-13)


def test_carried_run_within_kerass_spread():
  """100 eager Keras steps, then 400 in JAX with ``keras_adam``: within ``max(4 ulp, 2 x Keras's
  own spread)`` (its jitted step against its eager one) of the run that stayed in Keras, and at
  least as often bitwise equal as Keras's jitted step is to its eager one (``directml_adam``,
  in DirectML's order: 0 % on these leaves). ``from_keras`` returns the twin: the same run."""
  result = carried.keras_row(steps=500, move_at=100, shapes=((32, 16), (97,), (7,)))
  spread, spread_bitwise = result["keras jit vs eager"]
  ulps, bitwise = result["keras_adam vs eager"]
  print(result)
  assert ulps <= max(4.0, 2 * spread), result
  assert bitwise >= spread_bitwise, result
  assert result["from_keras vs eager"] == result["keras_adam vs eager"], result
