"""Property-based tests with Hypothesis (issue 8).

Random pytree structures (nested dicts, lists and tuples), shapes, dtypes,
start counts and hyperparameters in their valid ranges. Properties:

* the Optax transform, jitted and not, agrees with the float64 NumPy
  reference, and jit agrees with no-jit;
* the ONNX-style calls (:mod:`onnx_optax.onnx`, :mod:`onnx_optax.directml`)
  give the transform's new parameters and state, to the bit;
* the state's tree structure and dtypes never change across updates;
* invalid hyperparameter values raise a ValueError naming the argument.

Tolerance against the reference, per output element after ``k`` steps::

    |got - want| <= k * ROUNDINGS * u * scale / (1 - alpha)

the model of ``tests/test_transforms.py`` (each step rounds at most
ROUNDINGS = 16 times, each relative to ``scale``, the largest magnitude of any
parameter, state element or update in the reference trajectory), with one
factor more for the Adam rules: their first moment is a (1 - alpha)-weighted
average whose roundings are relative to the gradient, while the update it
makes is relative to (1 - alpha) times the gradient before the bias
correction; ``1 / (1 - alpha)`` carries the one to the other (1 for Momentum
and Adagrad). Gradients are drawn away from zero (``|G|`` in [0.5, 2],
``|norm_coefficient * X| <= 0.2``) so that no element divides a rounding
error by a cancelled ``G_regularized``: that conditioning is the input's,
not the implementation's. jit against no-jit: each is within the bound, so
they are within twice of it.

Every property that draws a rule runs once per variant (Momentum standard,
Momentum Nesterov, Adagrad, ONNX Adam, DirectML Adam, and the framework twins:
PyTorch's SGD plain and Nesterov, Adagrad, Adam, AdamW, Keras's Adam, against
their frameworks' expectations), so CI exercises each rule and mode whatever
Hypothesis draws; a derandomized run drawing the rule
with ``sampled_from`` never reached DirectML in 20 examples. The
hyperparameters mix the edges of their ranges with values spread over them
(the learning rate log-uniformly over four decades; see ``HYPER``), and each run asserts
that its examples were spread: distinct learning rates, start counts and
hyperparameter values, over at least two decades of learning rate.

CI time is bounded by the settings profile: ``ci`` (the default, 8
examples per property and variant, derandomized, no deadline since the first
example of a shape compiles) or ``thorough`` (100); choose one with the
environment variable ``ONNX_OPTAX_HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rule_configs import RULE_CONFIGS, model, trajectory

from onnx_optax import directml, registry
from onnx_optax import onnx as ox

settings.register_profile(
  "ci",
  max_examples=8,
  deadline=None,
  derandomize=True,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
  "thorough",
  max_examples=100,
  deadline=None,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile(os.environ.get("ONNX_OPTAX_HYPOTHESIS_PROFILE", "ci"))

ROUNDINGS = 16
STEPS = 3

# -- strategies ---------------------------------------------------------------

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)
structures = st.recursive(
  shapes,
  lambda children: st.one_of(
    st.dictionaries(st.sampled_from("abcdw"), children, min_size=1, max_size=3),
    st.lists(children, min_size=1, max_size=3),
    st.lists(children, min_size=1, max_size=2).map(tuple),
  ),
  max_leaves=5,
)


def _is_shape(node):
  return isinstance(node, tuple) and all(isinstance(d, int) for d in node)


def _fill(structure, make):
  """The pytree of ``structure`` with ``make(shape)`` at each shape leaf."""
  return jax.tree.map(make, structure, is_leaf=_is_shape)


def _spread(rng, lo, hi, edges=()):
  """One of ``edges`` (1 in 4), else uniform in [lo, hi]."""
  if edges and rng.random() < 0.25:
    return float(rng.choice(edges))
  return float(rng.uniform(lo, hi))


def _epsilon(rng):
  return float(rng.choice([0.0, 1e-8, 1e-6])) if rng.random() < 0.25 else float(10.0 ** rng.uniform(-8, 0))


# The hyperparameters of each variant, from a NumPy generator that Hypothesis
# seeds. Not st.floats: a derandomized run of it draws the same few values (0,
# tiny subnormals, 0.244, 0.255) for every property and variant; nor a map of
# st.integers, which favours small integers (four of six learning rates within
# 2% of the smallest, and norm_coefficient 0 in five of six examples: measured).
# Every example gets its own seed, so values spread over the ranges and their
# edges; a failing example still prints its hyperparameters.
def _unit(rng):
  return _spread(rng, 0.0, 1.0, (0.0, 0.5, 1.0))


def _small(rng):
  return _spread(rng, 0.0, 0.1, (0.0, 0.1))


HYPER = {
  "momentum_standard": lambda rng: dict(
    alpha=_unit(rng), beta=_unit(rng), mode="standard", norm_coefficient=_small(rng)
  ),
  "momentum_nesterov": lambda rng: dict(
    alpha=_unit(rng), beta=_unit(rng), mode="nesterov", norm_coefficient=_small(rng)
  ),
  "adagrad": lambda rng: dict(decay_factor=_unit(rng), epsilon=_epsilon(rng), norm_coefficient=_small(rng)),
  "adam": lambda rng: dict(
    alpha=_spread(rng, 0.0, 0.95, (0.0, 0.9)),
    beta=_spread(rng, 0.0, 0.999, (0.0, 0.99, 0.999)),
    epsilon=_epsilon(rng),
    norm_coefficient=_small(rng),
    norm_coefficient_post=_small(rng),
  ),
  "directml_adam": lambda rng: dict(
    beta1=_spread(rng, 0.0, 0.95, (0.0, 0.9)),
    beta2=_spread(rng, 0.0, 0.999, (0.0, 0.99, 0.999)),
    epsilon=_epsilon(rng),
  ),
  # The framework twins: their frameworks' ranges (PyTorch refuses betas[1] = 1), maximize drawn.
  "pytorch_sgd": lambda rng: dict(
    momentum=_unit(rng),
    dampening=_unit(rng),
    weight_decay=_small(rng),
    nesterov=False,
    maximize=bool(rng.random() < 0.5),
  ),
  "pytorch_sgd_nesterov": lambda rng: dict(
    momentum=_spread(rng, 0.01, 1.0, (0.5, 1.0)),  # Nesterov needs momentum > 0, dampening = 0
    dampening=0.0,
    weight_decay=_small(rng),
    nesterov=True,
    maximize=bool(rng.random() < 0.5),
  ),
  "pytorch_adagrad": lambda rng: dict(
    lr_decay=_unit(rng),
    weight_decay=_small(rng),
    initial_accumulator_value=_spread(rng, 0.0, 1.0, (0.0,)),
    eps=_epsilon(rng),
    maximize=bool(rng.random() < 0.5),
  ),
  "pytorch_adam": lambda rng: dict(
    betas=(_spread(rng, 0.0, 0.95, (0.0, 0.9)), _spread(rng, 0.0, 0.999, (0.0, 0.99, 0.999))),
    eps=_epsilon(rng),
    weight_decay=_small(rng),
    decoupled_weight_decay=bool(rng.random() < 0.5),
    maximize=bool(rng.random() < 0.5),
  ),
  "pytorch_adamw": lambda rng: dict(
    betas=(_spread(rng, 0.0, 0.95, (0.0, 0.9)), _spread(rng, 0.0, 0.999, (0.0, 0.99, 0.999))),
    eps=_epsilon(rng),
    weight_decay=_small(rng),
    maximize=bool(rng.random() < 0.5),
  ),
  "keras_adam": lambda rng: dict(
    beta_1=_spread(rng, 0.0, 0.95, (0.0, 0.9)),
    beta_2=_spread(rng, 0.0, 0.999, (0.0, 0.99, 0.999)),
    epsilon=_epsilon(rng),
  ),
}
VARIANTS = sorted(HYPER)
#: Hyperparameters a variant holds fixed (not spread): PyTorch's Nesterov needs dampening = 0.
FIXED = {"pytorch_sgd_nesterov": ("dampening",)}
#: The variants are configurations of rule_configs (every one of them is drawn here): the
#: registered rule and its transform.
RULE = {v: RULE_CONFIGS[v].rule for v in VARIANTS}
MAKE = {RULE[v]: registry.get(RULE[v]).transform for v in VARIANTS}
#: The rules that have an ONNX operator's call or DirectML's (the twins' calls are their frameworks').
CALLED = {"momentum": ox.momentum, "adagrad": ox.adagrad, "adam": ox.adam, "directml_adam": None}


@st.composite
def problems(draw, variant):
  rule = RULE[variant]
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  hyper = HYPER[variant](rng)
  lr = float(10.0 ** rng.uniform(-4, 0))
  T0 = draw(st.integers(RULE_CONFIGS[variant].first_count, 1000))
  structure = draw(structures)
  params = _fill(structure, lambda s: rng.uniform(-2, 2, size=s).astype(np.float32))
  grads = [
    _fill(structure, lambda s: (rng.choice([-1, 1], size=s) * rng.uniform(0.5, 2, size=s)).astype(np.float32))
    for _ in range(STEPS)
  ]
  return rule, hyper, lr, T0, params, grads


def _assert_spread(examples, variant):
  """The examples a property ran were not near-copies of each other.

  ``examples``: the ``(rule, hyper, lr, T0, params, grads)`` it was called with.
  """
  n = len(examples)
  assert n >= PROFILE.max_examples, n
  lrs = sorted({e[2] for e in examples})
  assert len(lrs) >= n - 1 and np.log10(lrs[-1] / lrs[0]) >= 2, lrs
  assert len({e[3] for e in examples}) >= n // 2, [e[3] for e in examples]
  for name, value in examples[0][1].items():
    if not isinstance(value, (str, bool)) and name not in FIXED.get(variant, ()):
      values = {e[1][name] for e in examples}
      assert len(values) >= n // 2, (name, values)


def _run(opt, params, grads, jit):
  update = jax.jit(opt.update) if jit else opt.update
  state = opt.init(params)
  p = jax.tree.map(jnp.asarray, params)
  xs, states = [], []
  for g in grads:
    u, state = update(g, state, p)
    p = optax.apply_updates(p, u)
    xs.append(p)
    states.append(state)
  return xs, states


def _config(rule):
  return next(c for c in RULE_CONFIGS.values() if c.rule == rule)


def _reference(rule, hyper, lr, T0, params, grads):
  """The expectation from the state ``init`` starts at, with the hyperparameters as the float32
  transform receives them (rule_configs.RuleConfig.seen: a twin's Python numbers as they are)."""
  leaves = jax.tree.leaves
  config = _config(rule)
  start = config.initial_state(leaves(params), hyper)
  xs, state, _ = trajectory(
    rule,
    leaves(params),
    [leaves(g) for g in grads],
    start,
    T0,
    [float(np.float32(lr))] * len(grads),
    **config.seen(hyper),
  )
  return xs, state


def _tolerance(rule, hyper, xs, state, params, T0):
  """Per step's share: ``ROUNDINGS u scale / (1 - alpha)``; Keras's Adam computes its bias
  corrections in float32 from float32 betas, where ``1 - beta^T`` cancels: a relative error of
  ``beta^T / (1 - beta^T)`` times ``T`` roundings of ``beta`` and a few of the power, for each beta
  (half of it under the square root), in every update."""
  scale = max(
    [1.0]
    + [float(np.abs(a).max(initial=0)) for a in jax.tree.leaves((xs, state))]
    + [float(np.abs(b - a).max(initial=0)) for a, b in zip(jax.tree.leaves(params), xs[0])]
  )
  alpha = model(rule).first_moment(hyper)
  tol = ROUNDINGS * 2.0**-24 * scale / (1 - alpha)
  if rule == "keras_adam":
    T = np.arange(T0 + 1, T0 + STEPS + 1, dtype=np.float64)
    cancel = lambda b: (T + 4) * b**T / (1 - b**T) if b > 0 else 0 * T  # noqa: E731
    relative = float(np.max(cancel(hyper["beta_2"]) / 2 + cancel(hyper["beta_1"]))) * 2.0**-24
    path = [jax.tree.leaves(params), *xs]
    step = max(
      float(np.max(np.abs(np.asarray(b, np.float64) - a), initial=0))
      for before, after in zip(path, path[1:])
      for a, b in zip(before, after)
    )
    tol += relative * step / (1 - alpha)
  return tol


# -- properties -----------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_transform_matches_reference_with_and_without_jit(variant):
  examples = []

  @PROFILE
  @given(problems(variant))
  def check(problem):
    examples.append(problem)
    rule, hyper, lr, T0, params, grads = problem
    opt = MAKE[rule](lr, **hyper, initial_count=T0)
    want, state = _reference(rule, hyper, lr, T0, params, grads)
    tol = _tolerance(rule, hyper, want, state, params, T0)
    eager, _ = _run(opt, params, grads, jit=False)
    jitted, _ = _run(opt, params, grads, jit=True)
    for k in range(STEPS):
      for e, j, w in zip(jax.tree.leaves(eager[k]), jax.tree.leaves(jitted[k]), want[k]):
        np.testing.assert_allclose(e, w, rtol=0, atol=(k + 1) * tol, err_msg=f"eager, step {k}")
        np.testing.assert_allclose(j, w, rtol=0, atol=(k + 1) * tol, err_msg=f"jit, step {k}")
        np.testing.assert_allclose(j, e, rtol=0, atol=2 * (k + 1) * tol, err_msg=f"jit vs eager {k}")

  check()
  _assert_spread(examples, variant)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if RULE[v] in CALLED])
def test_onnx_call_gives_the_transforms_result_to_the_bit(variant):
  """Both go through onnx_optax.rules with the same scalars: eagerly, identical.

  The rules with an ONNX operator or DirectML's call; a framework twin's call is its framework's
  own optimizer (tests/test_interop_torch*.py, tests/test_keras_twin.py hold it to that)."""
  examples = []

  @PROFILE
  @given(problems(variant))
  def check(problem):
    examples.append(problem)
    rule, hyper, lr, T0, params, grads = problem
    opt = MAKE[rule](lr, **hyper, initial_count=T0)
    xs, states = _run(opt, params, grads, jit=False)
    X = [jnp.asarray(x) for x in jax.tree.leaves(params)]
    n = len(X)
    S = [[jnp.zeros_like(x) for x in X] for _ in range(len(states[0]) - 1)]
    for k, g in enumerate(grads):
      G = [jnp.asarray(x) for x in jax.tree.leaves(g)]
      if rule == "directml_adam":
        outs = [
          directml.adam_optimizer(x, m, v, gg, T0 + k, learning_rate=lr, **hyper)
          for x, m, v, gg in zip(X, *S, G)
        ]
        X, S = [o[0] for o in outs], [[o[1] for o in outs], [o[2] for o in outs]]
      else:
        call = CALLED[rule]
        out = call(jnp.float32(lr), T0 + k, *X, *G, *(s for block in S for s in block), **hyper)
        X = list(out[:n])
        S = [list(out[n * (i + 1) : n * (i + 2)]) for i in range(len(S))]
      for a, b in zip(X, jax.tree.leaves(xs[k])):
        np.testing.assert_array_equal(a, b)
      for block, field in zip(S, states[k][1:]):
        for a, b in zip(block, jax.tree.leaves(field)):
          np.testing.assert_array_equal(a, b)

  check()
  _assert_spread(examples, variant)


# Structures and dtypes are what this property explores; the variant is drawn
# with the rest, and at least 3 examples per variant run on average.
@settings(PROFILE, max_examples=max(3 * len(VARIANTS), PROFILE.max_examples))
@given(
  st.sampled_from(VARIANTS).flatmap(problems),
  st.sampled_from([jnp.float32, jnp.float16, jnp.bfloat16]),
  st.sampled_from([None, jnp.float32]),
)
def test_state_structure_and_dtypes_are_stable(problem, dtype, state_dtype):
  rule, hyper, lr, T0, params, grads = problem
  params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
  grads = [jax.tree.map(lambda x: jnp.asarray(x, dtype), g) for g in grads]
  opt = MAKE[rule](lr, **hyper, initial_count=T0, state_dtype=state_dtype)
  compute = jnp.promote_types(dtype, state_dtype or dtype)
  rounds_to_one = [
    k
    for k in ("alpha", "beta", "beta1", "beta2")
    if k in hyper
    and (rule != "momentum" or k == "alpha")
    and hyper[k] < 1
    and float(np.asarray(hyper[k], compute)) == 1.0
  ]
  # The framework twins' hyperparameters have their frameworks' names (PyTorch's momentum, betas,
  # Keras's beta_1): none is listed, and their policy accepts such a decay, as their frameworks run it.
  if rounds_to_one:  # documented: init refuses a decay that the dtype makes 1
    with pytest.raises(ValueError, match=rounds_to_one[0]):
      opt.init(params)
    return
  state = opt.init(params)
  structure = jax.tree.structure(state)
  dtypes = [x.dtype for x in jax.tree.leaves(state)]
  assert state.count.dtype == jnp.int32 and int(state.count) == T0
  for field in state[1:]:
    assert jax.tree.structure(field) == jax.tree.structure(params)
    assert all(x.dtype == (state_dtype or dtype) for x in jax.tree.leaves(field))
  step = jax.jit(opt.update)
  for k, g in enumerate(grads):
    updates, state = step(g, state, params)
    assert jax.tree.structure(state) == structure
    assert [x.dtype for x in jax.tree.leaves(state)] == dtypes
    assert jax.tree.structure(updates) == jax.tree.structure(params)
    assert all(
      u.dtype == dtype and u.shape == x.shape
      for u, x in zip(jax.tree.leaves(updates), jax.tree.leaves(params))
    )
    assert int(state.count) == T0 + k + 1


# name -> strategies of invalid values (nan and inf are invalid everywhere)
INVALID = {
  ("adam", "alpha"): st.one_of(st.floats(1.0, 1e6), st.floats(-1e6, -1e-9)),
  ("adam", "beta"): st.one_of(st.floats(1.0 + 2**-40, 1e6), st.floats(-1e6, -1e-9)),
  ("adam", "epsilon"): st.floats(-1e6, -1e-30),
  ("directml_adam", "beta1"): st.one_of(st.floats(1.0, 1e6), st.floats(-1e6, -1e-9)),
  ("directml_adam", "beta2"): st.one_of(st.floats(1.0 + 2**-40, 1e6), st.floats(-1e6, -1e-9)),
  ("directml_adam", "epsilon"): st.floats(-1e6, -1e-30),
  ("adagrad", "decay_factor"): st.floats(-1e6, -1e-30),
  ("adagrad", "epsilon"): st.floats(-1e6, -1e-30),
  ("momentum", "alpha"): st.nothing(),
  ("momentum", "norm_coefficient"): st.nothing(),
  ("adam", "norm_coefficient_post"): st.nothing(),
  # The framework twins' own names, the same kinds of range.
  ("pytorch_sgd", "momentum"): st.one_of(st.floats(1.0 + 2**-40, 1e6), st.floats(-1e6, -1e-9)),
  ("pytorch_sgd", "dampening"): st.one_of(st.floats(1.0 + 2**-40, 1e6), st.floats(-1e6, -1e-9)),
  ("pytorch_adagrad", "lr_decay"): st.floats(-1e6, -1e-30),
  ("pytorch_adam", "eps"): st.floats(-1e6, -1e-30),
  ("pytorch_adamw", "weight_decay"): st.floats(-1e6, -1e-30),
  ("keras_adam", "beta_1"): st.one_of(st.floats(1.0, 1e6), st.floats(-1e6, -1e-9)),
}


@PROFILE
@given(st.sampled_from(sorted(INVALID)), st.data())
def test_invalid_values_raise_naming_the_argument(key, data):
  rule, name = key
  value = data.draw(st.one_of(INVALID[key], st.sampled_from([np.nan, np.inf, -np.inf])))
  as_array = data.draw(st.booleans())
  if as_array:
    value = np.float64(value)
  required = dict(alpha=0.9, beta=0.9, mode="standard", norm_coefficient=0.0) if rule == "momentum" else {}
  with pytest.raises(ValueError, match=re.escape(name)):
    MAKE[rule](0.1, **{**required, name: value})
