"""Every term of every rule counts: the rules against the float64 NumPy reference.

The transforms over several updates (jitted and eager, with the terms that read
``X`` on and off, a schedule, ``T > 0`` from the first update), the first updates
at the default count, the single-tensor functions that the ONNX interface calls,
one update of each rule worked by hand, the transform layer (state dtype, count,
``None`` leaves), the documented defaults and the reference's ``dtype`` argument.

The expectations are the float64 NumPy reference (``onnx_optax.reference``,
written from the spec, never calling the JAX code) and hand-derived numbers;
the hyperparameters make every term of every formula count (non-zero
``norm_coefficient`` and ``norm_coefficient_post``, ``beta != 1``, ``epsilon``
comparable to ``Sqrt(H)``, ``T`` both 0 and positive, non-zero starting states).
"""

from __future__ import annotations

import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from rule_configs import trajectory

import onnx_optax
import onnx_optax._checks
import onnx_optax.interop
import onnx_optax.onnx
from onnx_optax import reference, registry, rules

# name -> (transform, the registered rule (its expectation's key), hyperparameters): the spec rules
RULES = {
  "momentum_standard": (
    onnx_optax.momentum,
    "momentum",
    dict(alpha=0.7, beta=0.6, mode="standard", norm_coefficient=0.3),
  ),
  "momentum_nesterov": (
    onnx_optax.momentum,
    "momentum",
    dict(alpha=0.7, beta=0.6, mode="nesterov", norm_coefficient=0.3),
  ),
  "adagrad": (onnx_optax.adagrad, "adagrad", dict(decay_factor=0.4, epsilon=0.3, norm_coefficient=0.3)),
  "adam": (
    onnx_optax.adam,
    "adam",
    dict(alpha=0.7, beta=0.6, epsilon=0.3, norm_coefficient=0.3, norm_coefficient_post=0.2),
  ),
  "directml_adam": (onnx_optax.directml_adam, "directml_adam", dict(beta1=0.7, beta2=0.6, epsilon=0.3)),
}
# The framework twins, every term of their frameworks' steps counting (maximize too), against their
# frameworks' expectations (rule_configs.expectation: reference.pytorch_*, DirectML's for Keras).
TWINS = {
  "pytorch_sgd": (
    onnx_optax.pytorch_sgd,
    "pytorch_sgd",
    dict(momentum=0.7, dampening=0.4, weight_decay=0.3, nesterov=False, maximize=True),
  ),
  "pytorch_sgd_nesterov": (
    onnx_optax.pytorch_sgd,
    "pytorch_sgd",
    dict(momentum=0.7, dampening=0.0, weight_decay=0.3, nesterov=True, maximize=False),
  ),
  "pytorch_adagrad": (
    onnx_optax.pytorch_adagrad,
    "pytorch_adagrad",
    dict(lr_decay=0.4, weight_decay=0.3, initial_accumulator_value=0.2, eps=0.3, maximize=True),
  ),
  "pytorch_adam": (
    onnx_optax.pytorch_adam,
    "pytorch_adam",
    dict(betas=(0.7, 0.6), eps=0.3, weight_decay=0.3, decoupled_weight_decay=False, maximize=True),
  ),
  "pytorch_adamw": (
    onnx_optax.pytorch_adamw,
    "pytorch_adamw",
    dict(betas=(0.7, 0.6), eps=0.3, weight_decay=0.3, maximize=False),
  ),
  "keras_adam": (onnx_optax.keras_adam, "keras_adam", dict(beta_1=0.7, beta_2=0.6, epsilon=0.3)),
}
ALL = {**RULES, **TWINS}
# The same rules with the terms that read X switched off (the X=None path).
NO_PARAMS = {
  "momentum_standard": dict(norm_coefficient=0.0),
  "momentum_nesterov": dict(norm_coefficient=0.0),
  "adagrad": dict(norm_coefficient=0.0),
  "adam": dict(norm_coefficient=0.0, norm_coefficient_post=0.0),
  "directml_adam": {},
  "pytorch_adagrad": dict(weight_decay=0.0),
  "pytorch_adam": dict(weight_decay=0.0),
  "pytorch_adamw": dict(weight_decay=0.0),
  "keras_adam": {},
}

STEPS = 4
X0 = [np.array([0.5, -1.5, 2.0]), np.array(-0.75)]


def _grads(k):
  return [np.array([0.3, -0.2, 0.9]) * (k + 1) - 0.1 * k**2, np.array(0.4 - 0.3 * k)]


def _start_state(n_state):
  """Non-zero, positive (H must be) starting state tensors, one list per field."""
  return [[np.array([0.2, 0.1, 0.3]) * (j + 1), np.array(0.25 * (j + 1))] for j in range(n_state)]


def _run(name, hyper, initial_count, learning_rate, jit, pass_params=True):
  make, key, _ = ALL[name]
  opt = make(learning_rate, initial_count=initial_count, **hyper)
  params = {"a": jnp.asarray(X0[0]), "b": jnp.asarray(X0[1])}
  state = opt.init(params)
  n_state = len(state) - 1
  start = _start_state(n_state)
  state = type(state)(state.count, *({"a": jnp.asarray(f[0]), "b": jnp.asarray(f[1])} for f in start))
  update = jax.jit(opt.update) if jit else opt.update
  xs = []
  for k in range(STEPS):
    g = _grads(k)
    grads = {"a": jnp.asarray(g[0]), "b": jnp.asarray(g[1])}
    # A transform whose coefficients that read X are the Python number 0 must not need X.
    updates, state = update(grads, state, params) if pass_params else update(grads, state)
    params = optax.apply_updates(params, updates)
    xs.append([np.asarray(params["a"]), np.asarray(params["b"])])
  return xs, state, start


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("read_params", [True, False], ids=["params", "no_params"])
@pytest.mark.parametrize("name", sorted(ALL))
def test_transform_matches_reference_over_steps(name, read_params, jit):
  make, key, hyper = ALL[name]
  T0 = 2 if name != "directml_adam" else 3  # T > 0 from the first update: every T term counts
  schedule = lambda n: 0.2 / (1.0 + n)  # evaluated at the updates applied, not at T
  if not read_params and name not in NO_PARAMS:
    # PyTorch's SGD writes the parameters in place (param.add_): its update always reads them,
    # whatever the hyperparameters, and says so without them.
    assert registry.get(key).always_reads_params
    with pytest.raises(ValueError, match=r"pytorch_sgd: this transform needs the parameters.*in place"):
      _run(name, hyper, T0, schedule, jit, pass_params=False)
    return
  hyper = dict(hyper) if read_params else {**hyper, **NO_PARAMS[name]}
  with jax.enable_x64(True):
    xs, state, start = _run(name, hyper, T0, schedule, jit, pass_params=read_params)
    ref_xs, ref_state, ref_T = trajectory(
      key, X0, [_grads(k) for k in range(STEPS)], start, T0, [schedule(k) for k in range(STEPS)], **hyper
    )
  for k in range(STEPS):
    for got, want in zip(xs[k], ref_xs[k]):
      assert got.dtype == np.float64
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=f"{name} step {k}")
  for field, want in zip(state[1:], ref_state):
    np.testing.assert_allclose(np.asarray(field["a"]), want[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(field["b"]), want[1], rtol=1e-12, atol=1e-14)
  assert int(state.count) == ref_T == T0 + STEPS


@pytest.mark.parametrize("name", sorted(ALL))
def test_first_update_at_the_default_count_matches_reference(name):
  """T = 0 for the ONNX rules (beta_adjusted = 1, no bias correction), T = 1 for DirectML; count 0
  for the twins (PyTorch's SGD copies the gradient into its new buffer, the bias corrections at
  step 1)."""
  make, key, hyper = ALL[name]
  T0 = {"directml_adam": 1}.get(name, 0)
  with jax.enable_x64(True):
    xs, state, start = _run(name, hyper, T0, 0.2, jit=False)
    ref_xs, ref_state, _ = trajectory(
      key, X0, [_grads(k) for k in range(STEPS)], start, T0, [0.2] * STEPS, **hyper
    )
  for k in range(STEPS):
    for got, want in zip(xs[k], ref_xs[k]):
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=f"{name} step {k}")


def _single_tensor(name, T, X, G, S, R, hyper):
  if name.startswith("momentum"):
    return rules.momentum(R, T, X, G, *S, **hyper)
  if name == "adagrad":
    return rules.adagrad(R, T, X, G, *S, **hyper)
  if name == "adam":
    return rules.adam(R, T, X, G, *S, **hyper)
  M, V = S
  return rules.directml_adam(X, M, V, G, T, learning_rate=R, **hyper)


@pytest.mark.parametrize("T", [0, 1, 5])
@pytest.mark.parametrize("name", sorted(RULES))
def test_single_tensor_rule_matches_reference(name, T):
  """The single-tensor functions (what the ONNX interface calls) against the reference."""
  _, key, hyper = RULES[name]
  if name == "directml_adam" and T == 0:
    T = 2
  X, G = X0[0], _grads(1)[0]
  S = [f[0] for f in _start_state(reference.RULES[key][1])]
  with jax.enable_x64(True):
    U, *S_new = _single_tensor(
      name, T, jnp.asarray(X), jnp.asarray(G), [jnp.asarray(s) for s in S], 0.2, hyper
    )
    X_new = np.asarray(jnp.asarray(X) + U)
  want = reference.RULES[key][0](0.2, T, X, G, *S, **hyper)
  np.testing.assert_allclose(X_new, want[0], rtol=1e-12, atol=1e-14)
  for got, w in zip(S_new, want[1:]):
    np.testing.assert_allclose(np.asarray(got), w, rtol=1e-12, atol=1e-14)


def test_hand_derived_first_updates():
  """One update of each rule, worked by hand (no reference, no JAX), float64.

  X = 1, G = 2, R = 0.1 and zero states unless stated.
  """
  with jax.enable_x64(True):
    X, G = jnp.float64(1.0), jnp.float64(2.0)
    zero = jnp.float64(0.0)
    # Momentum, T = 1: V_new = 0.5 * 1 + 0.5 * (0.5 * 1 + 2) = 1.75; X_new = 1 - 0.1 * 1.75.
    U, V = rules.momentum(
      0.1, 1, X, G, jnp.float64(1.0), alpha=0.5, beta=0.5, mode="standard", norm_coefficient=0.5
    )
    assert float(V) == pytest.approx(1.75, rel=1e-15, abs=0)
    assert float(X + U) == pytest.approx(0.825, rel=1e-15, abs=0)
    # Nesterov: X_new = 1 - 0.1 * (2.5 + 0.5 * 1.75) = 0.6625.
    U, _ = rules.momentum(
      0.1, 1, X, G, jnp.float64(1.0), alpha=0.5, beta=0.5, mode="nesterov", norm_coefficient=0.5
    )
    assert float(X + U) == pytest.approx(0.6625, rel=1e-15, abs=0)
    # Adagrad, T = 3, decay 1/3: r = 0.1 / 2; H_new = 1 + 4 = 5; X_new = 1 - 0.05 * 2 / (sqrt 5 + 1).
    U, H = rules.adagrad(
      0.1, 3, X, G, jnp.float64(1.0), decay_factor=1 / 3, epsilon=1.0, norm_coefficient=0.0
    )
    assert float(H) == 5.0
    assert float(X + U) == pytest.approx(1 - 0.1 / (5**0.5 + 1), rel=1e-14, abs=0)
    # ONNX Adam, T = 2, alpha = beta = 0.5: V = 1, H = 2; R_adjusted = 0.1 sqrt(0.75) / 0.75;
    # X_new = 1 - R_adjusted * 1 / (sqrt 2 + 0.5); X_final = 0.9 X_new.
    U, V, H = rules.adam(
      0.1,
      2,
      X,
      G,
      zero,
      zero,
      alpha=0.5,
      beta=0.5,
      epsilon=0.5,
      norm_coefficient=0.0,
      norm_coefficient_post=0.1,
    )
    assert (float(V), float(H)) == (1.0, 2.0)
    R_adjusted = 0.1 * 0.75**0.5 / 0.75
    assert float(X + U) == pytest.approx(0.9 * (1 - R_adjusted / (2**0.5 + 0.5)), rel=1e-14, abs=0)
    # DirectML Adam, T = 1: M = 0.1 * 2, V = 0.001 * 4, Alpha = sqrt(0.001) / 0.1;
    # X_new = 1 - 0.1 * Alpha * 0.2 / (sqrt(0.004) + 1e-8).
    U, M, V = rules.directml_adam(
      X, zero, zero, G, 1, learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8
    )
    assert float(M) == pytest.approx(0.2, rel=1e-15, abs=0)
    assert float(V) == pytest.approx(0.004, rel=1e-13, abs=0)
    Alpha = 0.001**0.5 / 0.1
    assert float(X + U) == pytest.approx(1 - 0.1 * Alpha * 0.2 / (0.004**0.5 + 1e-8), rel=1e-12, abs=0)


def test_state_dtype_count_and_none_leaves():
  """The transform layer: the state kept in state_dtype, the update in the parameters' dtype,
  the count advanced by one per update from initial_count, None leaves passed through."""
  opt = onnx_optax.adam(0.1, norm_coefficient=0.1, initial_count=3, state_dtype=jnp.float32)
  params = {"w": jnp.ones((2,), jnp.bfloat16), "skip": None}
  state = opt.init(params)
  assert int(state.count) == 3 and state.count.dtype == jnp.int32
  assert state.v["w"].dtype == jnp.float32 and state.h["w"].dtype == jnp.float32
  grads = {"w": jnp.array([0.5, -0.5], jnp.bfloat16), "skip": None}
  for k in range(2):
    updates, state = opt.update(grads, state, params)
    assert int(state.count) == 4 + k
  assert updates["skip"] is None and updates["w"].dtype == jnp.bfloat16
  assert state.v["w"].dtype == jnp.float32 and state.h["w"].dtype == jnp.float32
  assert state.v["skip"] is None


# gradients small enough that epsilon weighs in every update.
DEFAULTS = {
  "momentum_standard": (
    lambda lr: onnx_optax.momentum(lr, alpha=0.7, beta=0.6, mode="standard", norm_coefficient=0.3),
    "momentum",
    dict(alpha=0.7, beta=0.6, mode="standard", norm_coefficient=0.3),
    0,
  ),
  "adagrad": (onnx_optax.adagrad, "adagrad", dict(decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0), 0),
  "adam": (
    onnx_optax.adam,
    "adam",
    dict(alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0),
    0,
  ),
  "directml_adam": (onnx_optax.directml_adam, "directml_adam", dict(beta1=0.9, beta2=0.999, epsilon=1e-8), 1),
}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_defaults_and_first_count_are_the_documented_ones(name):
  make, key, hyper, T0 = DEFAULTS[name]
  scale = 1e-8 if name == "directml_adam" else 1e-6
  X = [np.array([0.5, -1.5, 2.0])]
  grads = [[np.array([0.3, -0.2, 0.9]) * scale * (k + 1)] for k in range(3)]
  with jax.enable_x64(True):
    opt = make(0.1)
    state = opt.init(jnp.asarray(X[0]))
    assert int(state.count) == T0
    params = jnp.asarray(X[0])
    got = []
    for g in grads:
      updates, state = opt.update(jnp.asarray(g[0]), state, params)
      params = optax.apply_updates(params, updates)
      got.append(np.asarray(params))
  n_state = reference.RULES[key][1]
  want, _, T = reference.trajectory(key, X, grads, [[np.zeros(3)]] * n_state, T0, [0.1] * 3, **hyper)
  assert int(state.count) == T == T0 + 3
  for k in range(3):
    np.testing.assert_allclose(got[k], want[k][0], rtol=1e-13, atol=0, err_msg=f"{name} step {k}")


FRAMEWORK_TWINS = [rule for rule in registry.rules() if rule.binding("torch") or rule.binding("keras")]


def _framework_optimizer(binding):
  """The optimizer class a twin is bound to, from its framework itself."""
  if binding.kind == "torch":
    torch = pytest.importorskip("torch", reason="torch is in the test extra")
    return getattr(torch.optim, binding.name)
  os.environ.setdefault("KERAS_BACKEND", "jax")  # as tests/test_keras_twin.py
  keras = pytest.importorskip("keras", reason="keras is in the interop extra")
  return getattr(keras.optimizers, binding.name)


@pytest.mark.parametrize("rule", FRAMEWORK_TWINS, ids=lambda r: r.name)
def test_a_twins_defaults_are_its_frameworks(rule):
  """Every hyperparameter of a framework twin defaults to what its framework's constructor gives it,
  read from PyTorch's and Keras's own signatures (their names where the binding spells them
  otherwise), and its count starts at the framework's: PyTorch's ``step`` and Keras's
  ``iterations`` are 0 before the first update."""
  (binding,) = [b for b in rule.bindings if b.kind in ("torch", "keras")]
  theirs = inspect.signature(_framework_optimizer(binding)).parameters
  ours = rule.defaults()
  assert set(ours) == set(rule.hyperparameters), "every hyperparameter has a default, as in the framework"
  for name, value in ours.items():
    framework_name = binding.names.get(name, name)
    assert framework_name in theirs, (rule.name, name)
    assert (
      value == theirs[framework_name].default
      and type(value) is type(theirs[framework_name].default)
      or (isinstance(value, float) and value == theirs[framework_name].default)
    ), (rule.name, name, value, theirs[framework_name].default)
  assert rule.first_count() == 0


def test_reference_dtype_argument():
  """The reference computes in float64 by default whatever the inputs' dtype, and in the dtype of
  X (the first tensor, not the gradient) with dtype=None."""
  X32, G64 = np.float32(1.0), np.float64(0.1)
  X_new, H_new = reference.adagrad(
    0.1, 0, X32, np.float32(0.1), np.float32(0.0), decay_factor=0.0, epsilon=0.0, norm_coefficient=0.0
  )
  assert X_new.dtype == np.float64 and H_new.dtype == np.float64
  X_new, H_new = reference.adagrad(
    0.1, 0, X32, G64, np.float64(0.0), decay_factor=0.0, epsilon=0.0, norm_coefficient=0.0, dtype=None
  )
  assert X_new.dtype == np.float32 and H_new.dtype == np.float32
  # R = 0.1, G = 0.1, H_new = 0.01 (in float32), X_new = 1 - 0.1 * 0.1 / 0.1 = 0.9.
  assert X_new == np.float32(0.9)
