"""onnx_optax.interop against Keras 3's own Adam.

Every expectation is Keras: a run of N + M ``optimizer.apply`` calls. The
bridged runs take N steps in Keras and M in JAX (``from_keras``), or N in JAX
and M in Keras (``to_keras``), and must end at Keras's variables and moments:
to 1e-12 relative in float64 and within the float32 bound derived in
:func:`adam_bound`. Gradients are fixed random arrays.

Keras picks its backend once, at import, from ``KERAS_BACKEND``: this module
sets the JAX backend (the one a JAX user has), and
:func:`test_torch_backend` runs the same carry in a fresh interpreter on the
torch backend, since the bridge claims any backend and reads and writes
variables only through ``keras.ops``. (Keras's default backend, TensorFlow,
is not installed here.)
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
from interop_data import gradients, initial  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax.interop import from_keras, to_keras  # noqa: E402

HYPER = dict(learning_rate=0.02, beta_1=0.8, beta_2=0.99, epsilon=1e-5)  # none the default


def test_backend_is_jax():
  # Another module that imported Keras first with another backend would make
  # this file test that backend instead; say so rather than pass silently.
  assert keras.backend.backend() == "jax", "Keras was imported before KERAS_BACKEND=jax was set"


def keras_variables(values):
  return [keras.Variable(v, dtype=v.dtype.name) for v in values]


def keras_steps(opt, variables, grads):
  records = []
  for step_grads in grads:
    opt.apply([np.array(g) for g in step_grads], variables)
    records.append(
      (
        [np.array(v.numpy()) for v in variables],
        [np.array(m.numpy()) for m in opt._momentums],
        [np.array(v.numpy()) for v in opt._velocities],
      )
    )
  return records


def jax_steps(tx, state, params, grads):
  step = jax.jit(tx.update)
  for step_grads in grads:
    updates, state = step([jnp.asarray(g) for g in step_grads], state)
    params = optax.apply_updates(params, updates)
  return params, state


# --- the float32 bound ---------------------------------------------------------

U32 = float(np.finfo(np.float32).eps) / 2


def adam_bound(x0, grads, records, lr, b1, b2, eps, u=U32):
  """Per leaf, twice a first-order bound on one float32 Adam run's distance from exact.

  Exact is the float64 run (``records``, from Keras) of the same float32
  inputs. Keras computes ``m += (g - m) * (1 - b1)`` and the transform
  ``b1 m + (1 - b1) g``; each is within ``5u (|m| + |g|)`` of the exact
  update (three roundings, and ``1 - b1`` taken from float32(b1) in one and
  rounded from float64 in the other: at most ``u b1`` off). Errors in the
  moments decay with them::

      em = b1 em + 5u (|m_prev| + |g|)
      ev = b2 ev + 6u (|v_prev| + g^2)            (one more rounding: g^2)

  The step size ``alpha = lr sqrt(1 - b2^t) / (1 - b1^t)`` uses float32(b),
  whose ``t``-th power is off by ``t u b^t`` relative; ``1 - b^t`` turns
  that into ``(t + 2) u b^t / (1 - b^t)`` (Keras subtracts a rounded power,
  the transform evaluates ``-expm1(t log b)``), plus ``6u`` for the rest::

      ea / alpha = 6u + (t + 2) u (b2^t / (2 (1 - b2^t)) + b1^t / (1 - b1^t))
      d  = sqrt(v) + eps              ed = ev / (2 sqrt(v)) + 3u d
      q  = alpha m / d                eq = (alpha / d) em + |q| (ea / alpha + ed / d + 3u)
      x' = x - q                      eX = eX + eq + 2u (|x'| + |q|)

  Both runs are within ``eX`` of exact (products of errors left out), so
  within ``2 eX`` of each other.
  """
  xs = [x0] + [r[0] for r in records]
  ms = [[np.zeros_like(x) for x in x0]] + [r[1] for r in records]
  vs = [[np.zeros_like(x) for x in x0]] + [r[2] for r in records]
  bounds = []
  for i in range(len(x0)):
    eX = em = ev = np.zeros_like(x0[i])
    for k in range(len(grads)):
      t = k + 1
      g, m, v, x_new = grads[k][i], ms[k + 1][i], vs[k + 1][i], xs[k + 1][i]
      em = b1 * em + 5 * u * (np.abs(ms[k][i]) + np.abs(g))
      ev = b2 * ev + 6 * u * (np.abs(vs[k][i]) + g * g)
      alpha = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
      ea = 6 * u + (t + 2) * u * (b2**t / (2 * (1 - b2**t)) + b1**t / (1 - b1**t))
      d = np.sqrt(v) + eps
      ed = ev / (2 * np.sqrt(v)) + 3 * u * d
      q = alpha * m / d
      eq = alpha / d * em + np.abs(q) * (ea + ed / d + 3 * u)
      eX = eX + eq + 2 * u * (np.abs(x_new) + np.abs(q))
    bounds.append(2 * eX)
  return bounds


# --- the runs ----------------------------------------------------------------


def reference_run(dtype, steps):
  x0, grads = initial(dtype), gradients(steps, dtype)
  opt = keras.optimizers.Adam(**HYPER)
  records = keras_steps(opt, keras_variables(x0), grads)
  x0_64 = [x.astype(np.float64) for x in x0]
  grads64 = [[g.astype(np.float64) for g in step] for step in grads]
  # A real float64 run: without x64, JAX (and so Keras's JAX backend) makes
  # float32 variables of float64 values, and the "exact" run would be a
  # second float32 run.
  with jax.enable_x64(True):
    opt64 = keras.optimizers.Adam(**HYPER)
    records64 = keras_steps(opt64, keras_variables(x0_64), grads64)
  assert all(a.dtype == np.float64 for record in records64 for field in record for a in field)
  lr = float(opt64.learning_rate.numpy())  # float32(0.02): what Keras computes with
  return (
    x0,
    grads,
    records,
    (x0_64, grads64, records64, lr, HYPER["beta_1"], HYPER["beta_2"], HYPER["epsilon"]),
  )


def check_final(dtype, xs, ms, vs, records, run64):
  x_ref, m_ref, v_ref = records[-1]
  if dtype == np.float64:
    x_tol = [1e-12 * max(np.max(np.abs(r)), 1.0) for r in x_ref]
    m_tol = [1e-12 * max(np.max(np.abs(r)), 1.0) for r in m_ref]
    v_tol = [1e-12 * max(np.max(np.abs(r)), 1.0) for r in v_ref]
  else:
    x_tol = adam_bound(*run64)
    # The moments' own errors (em, ev above) are at most ~1e-5 relative here;
    # 1e-3 relative is far below any mistake in the mapping (swapped moments,
    # a moment update off by one step).
    m_tol = [1e-3 * np.abs(r) + 1e-6 for r in m_ref]
    v_tol = [1e-3 * np.abs(r) + 1e-9 for r in v_ref]
  for what, got, ref, tol in (("x", xs, x_ref, x_tol), ("m", ms, m_ref, m_tol), ("v", vs, v_ref, v_tol)):
    for i, (a, b, bound) in enumerate(zip(got, ref, tol)):
      a, b = np.asarray(a), np.asarray(b)
      assert a.shape == b.shape and a.dtype == b.dtype, (what, i)
      err = np.abs(a.astype(np.float64) - b.astype(np.float64))
      assert np.all(err <= bound), f"{what}[{i}]: error {err.max()} over the bound {np.min(bound)}"


def carried_from_keras(dtype, N, M):
  x0, grads, records, run64 = reference_run(dtype, N + M)
  variables = keras_variables(x0)
  opt = keras.optimizers.Adam(**HYPER)
  keras_steps(opt, variables, grads[:N])
  params = [jnp.asarray(v.numpy()) for v in variables]
  tx, state = from_keras(opt, params)
  assert int(state.count) == N  # keras_adam: Keras's iterations
  params, state = jax_steps(tx, state, params, grads[N:])
  return params, state, records, run64


@pytest.mark.parametrize("N, M", [(3, 5), (0, 6), (6, 1)])
def test_from_keras_float64(N, M):
  with jax.enable_x64(True):
    params, state, records, run64 = carried_from_keras(np.float64, N, M)
    check_final(np.float64, params, state.momentums, state.velocities, records, run64)


def test_from_keras_float32():
  params, state, records, run64 = carried_from_keras(np.float32, 4, 6)
  check_final(np.float32, params, state.momentums, state.velocities, records, run64)


def carried_to_keras(dtype, N, M, built=False):
  x0, grads, records, run64 = reference_run(dtype, N + M)
  variables = keras_variables(x0)
  opt = keras.optimizers.Adam(**HYPER)
  if built:
    opt.build(variables)
  params = [jnp.asarray(x) for x in x0]
  tx, state = from_keras(opt, params)  # never stepped: T = 1, zero moments
  params, state = jax_steps(tx, state, params, grads[:N])
  to_keras(state, opt, params, variables=variables)
  assert int(opt.iterations.numpy()) == N
  keras_steps(opt, variables, grads[N:])
  return (
    [v.numpy() for v in variables],
    [m.numpy() for m in opt._momentums],
    [v.numpy() for v in opt._velocities],
    records,
    run64,
  )


@pytest.mark.parametrize(
  "N, M, built", [(3, 5, False), (0, 6, False), (0, 6, True), (6, 0, True), (2, 4, True)]
)
def test_to_keras_float64(N, M, built):
  with jax.enable_x64(True):
    check_final(np.float64, *carried_to_keras(np.float64, N, M, built))


def test_to_keras_float32():
  check_final(np.float32, *carried_to_keras(np.float32, 4, 6))


def test_onnx_adam_state_continues_in_keras():
  """ONNX Adam from T = 1 is the same rule: its state loads too (v -> m, h -> v)."""
  with jax.enable_x64(True):
    N, M = 3, 4
    x0, grads, records, run64 = reference_run(np.float64, N + M)
    lr = run64[3]
    tx = onnx_optax.adam(
      lr, alpha=HYPER["beta_1"], beta=HYPER["beta_2"], epsilon=HYPER["epsilon"], initial_count=1
    )
    params = [jnp.asarray(x) for x in x0]
    params, state = jax_steps(tx, tx.init(params), params, grads[:N])
    variables = keras_variables(x0)
    opt = keras.optimizers.Adam(**HYPER)
    to_keras(state, opt, params, variables=variables)
    keras_steps(opt, variables, grads[N:])
    check_final(
      np.float64,
      [v.numpy() for v in variables],
      [m.numpy() for m in opt._momentums],
      [v.numpy() for v in opt._velocities],
      records,
      run64,
    )


def test_schedule_continues_with_the_shifted_schedule():
  """A Keras LearningRateSchedule, evaluated in JAX at n + iterations, continues the run."""
  N, M = 3, 4
  with jax.enable_x64(True):
    x0, grads = initial(np.float64), gradients(N + M, np.float64)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)
    hyper = dict(HYPER, learning_rate=schedule)
    ref_vars = keras_variables(x0)
    keras_steps(keras.optimizers.Adam(**hyper), ref_vars, grads)
    variables = keras_variables(x0)
    opt = keras.optimizers.Adam(**hyper)
    keras_steps(opt, variables, grads[:N])
    params = [jnp.asarray(v.numpy()) for v in variables]
    with pytest.raises(ValueError, match=r"learning rate is a ExponentialDecay.*n \+ 3"):
      from_keras(opt, params)
    # Keras's own schedule traces under the JAX backend: the same float32 rates.
    tx, state = from_keras(opt, params, learning_rate=lambda n: schedule(n + N))
    params, _ = jax_steps(tx, state, params, grads[N:])
    for x, v in zip(params, ref_vars):
      np.testing.assert_allclose(x, v.numpy(), rtol=1e-12, atol=1e-15)


# --- refusals ----------------------------------------------------------------


def _params():
  x0 = initial(np.float32)
  return keras_variables(x0), [jnp.asarray(x) for x in x0]


def test_an_option_is_checked_by_the_twins_declared_check(monkeypatch):
  """The bridge has no range of its own: the check the registry declares for the twin's hyperparameter
  decides. ``beta_1 = 1`` is refused by the declared check (the bias correction divides by
  ``1 - beta_1^t``); with a check planted in the declaration that accepts it, the bridge accepts it too
  (a bridge that checked with its own range would still refuse it)."""
  from onnx_optax import registry

  (rule,) = [r for r in registry.rules() if r.binding("keras") and r.binding("keras").name == "Adam"]
  variables, params = keras_variables(initial(np.float32)), [jnp.asarray(x) for x in initial(np.float32)]
  opt = keras.optimizers.Adam(learning_rate=0.1, beta_1=1.0)
  opt.build(variables)
  with pytest.raises(ValueError, match=r"^beta_1 must be < 1.0, got 1.0: .*division by zero"):
    from_keras(opt, params)
  monkeypatch.setitem(rule.hyperparameters, "beta_1", registry.Hyperparameter(lambda name, value: value))
  tx, state = from_keras(opt, params)
  assert int(state.count) == 0


@pytest.mark.parametrize(
  "make, error, match",
  [
    (lambda: keras.optimizers.AdamW(), TypeError, r"AdamW decays the weights before the step"),
    (lambda: keras.optimizers.SGD(), TypeError, r"no onnx_optax rule is .*SGD.*keras.optimizers.Adam"),
    (lambda: type("MyAdam", (keras.optimizers.Adam,), {})(), TypeError, "subclasses keras.optimizers.Adam"),
    # Named Adam, but not a Keras backend's own class.
    (lambda: type("Adam", (keras.optimizers.Adam,), {})(), TypeError, "subclasses keras.optimizers.Adam"),
    (lambda: keras.optimizers.Adam(amsgrad=True), ValueError, r"amsgrad=True: AMSGrad"),
    (lambda: keras.optimizers.Adam(weight_decay=0.01), ValueError, r"weight_decay=0.01: Keras decays"),
    (lambda: keras.optimizers.Adam(clipnorm=1.0), ValueError, r"clipnorm=1.0"),
    (lambda: keras.optimizers.Adam(clipvalue=1.0), ValueError, r"clipvalue=1.0.*optax.clip"),
    (lambda: keras.optimizers.Adam(global_clipnorm=1.0), ValueError, r"optax.clip_by_global_norm"),
    (lambda: keras.optimizers.Adam(use_ema=True), ValueError, r"use_ema=True.*optax.ema"),
    (lambda: keras.optimizers.Adam(gradient_accumulation_steps=2), ValueError, r"optax.MultiSteps"),
    (lambda: keras.optimizers.Adam(loss_scale_factor=128.0), ValueError, r"loss_scale_factor=128.0"),
    (lambda: keras.optimizers.Adam(learning_rate=lambda: 0.01), ValueError, r"learning rate is a function"),
  ],
)
def test_refusals(make, error, match):
  variables, params = _params()
  opt = make()
  with pytest.raises(error, match=match):
    from_keras(opt, params)
  # to_keras refuses the same options, except a schedule: Keras evaluates it
  # at its iterations, which to_keras sets, so loading the state is exact.
  if (error is ValueError and "learning rate" not in match) or type(opt) is keras.optimizers.AdamW:
    with pytest.raises(error, match=match):
      to_keras(onnx_optax.directml_adam(0.1).init(params), opt, params, variables=variables)
    assert not opt.built  # refused before building


def test_options_equal_to_the_neutral_ones_are_accepted():
  """``amsgrad=np.False_`` or ``use_ema=0`` (what a config file or NumPy gives) is the neutral
  option, not a refusal: options are compared by value."""
  variables, params = _params()
  opt = keras.optimizers.Adam(learning_rate=0.1, amsgrad=np.bool_(False), use_ema=0)
  assert opt.amsgrad is not False and opt.use_ema is not False  # Keras keeps them as given
  tx, state = from_keras(opt, params)
  to_keras(state, opt, params, variables=variables)


@pytest.mark.parametrize(
  "option", [dict(weight_decay=0.0), dict(loss_scale_factor=1.0), dict(weight_decay=0)]
)
def test_keras_no_op_options_are_accepted_and_change_nothing(option):
  """``weight_decay=0.0`` and ``loss_scale_factor=1.0`` leave Keras's step alone, so the bridge takes them.

  The carried run (3 steps in Keras with the option, 4 in JAX) ends at a
  Keras run of 7 steps *with* the option, to the float32 bound.
  """
  x0, grads = initial(np.float32), gradients(7, np.float32)
  records = keras_steps(keras.optimizers.Adam(**HYPER, **option), keras_variables(x0), grads)
  variables = keras_variables(x0)
  opt = keras.optimizers.Adam(**HYPER, **option)
  keras_steps(opt, variables, grads[:3])
  tx, state = from_keras(opt, [jnp.asarray(v.numpy()) for v in variables])
  params, state = jax_steps(tx, state, [jnp.asarray(v.numpy()) for v in variables], grads[3:])
  _, _, _, run64 = reference_run(np.float32, 7)
  check_final(np.float32, params, state.momentums, state.velocities, records, run64)
  to_keras(state, keras.optimizers.Adam(**HYPER, **option), params, variables=keras_variables(x0))


def test_refuses_mismatched_params():
  variables, params = _params()
  opt = keras.optimizers.Adam()
  opt.build(variables)
  with pytest.raises(ValueError, match=r"params\[1\] has shape \(4, 2\) but the Keras variable 1"):
    from_keras(opt, [params[0], jnp.zeros((4, 2)), *params[2:]])
  with pytest.raises(ValueError, match=r"params\[2\] has dtype float16 .* has dtype float32"):
    from_keras(opt, [*params[:2], jnp.zeros((), jnp.float16), params[3]])
  with pytest.raises(ValueError, match="params has 3 leaves but the Keras optimizer has 4.*in its order"):
    from_keras(opt, params[:3])
  shape_only = __import__("types").SimpleNamespace(shape=params[1].shape)  # no dtype: not an array
  with pytest.raises(TypeError, match=r"params\[1\] must be an array"):
    from_keras(opt, [params[0], shape_only, *params[2:]])


def test_to_keras_refuses_before_writing():
  variables, params = _params()
  opt = keras.optimizers.Adam()
  tx = onnx_optax.directml_adam(0.1)
  state = tx.init(params)
  with pytest.raises(ValueError, match="has not been built.*pass variables=model.trainable_variables"):
    to_keras(state, opt, params)
  t0 = onnx_optax.adam(0.1).init(params)
  with pytest.raises(ValueError, match="count 0: ONNX Adam's T = 0 update"):
    to_keras(t0, opt, params, variables=variables)
  with pytest.raises(TypeError, match="state holds a MomentumState"):
    to_keras(
      onnx_optax.momentum(0.1, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0).init(params),
      opt,
      variables=variables,
    )
  wide = state._replace(m=[m.astype(jnp.float16) for m in state.m])
  with pytest.raises(ValueError, match=r"the state of variable 0 .* dtype float16; Keras keeps"):
    to_keras(wide, opt, variables=variables)
  split = optax.multi_transform(
    {"a": onnx_optax.directml_adam(0.1), "b": onnx_optax.directml_adam(0.1, initial_count=5)},
    ["a", "b", "a", "b"],
  )
  with pytest.raises(ValueError, match=r"the counts \[1, 5\]; Keras keeps one step count"):
    to_keras(split.init(params), opt, variables=variables)
  with pytest.raises(ValueError, match=r"params\[0\] has shape \(4,\)"):
    to_keras(state, opt, [jnp.zeros(4), *params[1:]], variables=variables)
  other_shape = tx.init([params[0], jnp.zeros((4, 2)), *params[2:]])
  with pytest.raises(ValueError, match=r"the state of variable 1 .* has shape \(4, 2\) and dtype float32"):
    to_keras(other_shape, opt, variables=variables)
  with pytest.raises(ValueError, match="has 3 leaves but the optimizer has 4 parameters"):
    to_keras(tx.init(params[:3]), opt, variables=variables)
  assert not opt.built and int(opt.iterations.numpy()) == 0


def test_torch_backend():
  """The same carry on Keras's torch backend (a fresh interpreter: the backend is per process)."""
  code = textwrap.dedent("""
      import os
      os.environ["KERAS_BACKEND"] = "torch"
      import jax, jax.numpy as jnp, keras, numpy as np, optax
      from onnx_optax.interop import from_keras, to_keras
      assert keras.backend.backend() == "torch"
      jax.config.update("jax_enable_x64", True)
      rng = np.random.default_rng(0)
      x0 = [rng.normal(size=s) for s in [(3,), (2, 2)]]
      grads = [[rng.normal(size=x.shape) for x in x0] for _ in range(7)]
      hyper = dict(learning_rate=0.02, beta_1=0.8, beta_2=0.99, epsilon=1e-5)
      def run(opt, variables, gs):
        for g in gs:
          opt.apply([keras.ops.convert_to_tensor(x) for x in g], variables)
      ref = [keras.Variable(x, dtype="float64") for x in x0]
      run(keras.optimizers.Adam(**hyper), ref, grads)
      variables = [keras.Variable(x, dtype="float64") for x in x0]
      opt = keras.optimizers.Adam(**hyper)
      run(opt, variables, grads[:3])
      params = [jnp.asarray(keras.ops.convert_to_numpy(v)) for v in variables]
      tx, state = from_keras(opt, params)
      for g in grads[3:5]:
        updates, state = tx.update([jnp.asarray(x) for x in g], state)
        params = optax.apply_updates(params, updates)
      to_keras(state, opt, params)
      run(opt, variables, grads[5:])
      for v, r in zip(variables, ref):
        a, b = keras.ops.convert_to_numpy(v), keras.ops.convert_to_numpy(r)
        assert np.allclose(a, b, rtol=1e-12, atol=0), (a, b)
      print("torch backend: carried")
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "torch backend: carried" in out.stdout
