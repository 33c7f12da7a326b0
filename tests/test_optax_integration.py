"""Every rule inside ordinary Optax code, the framework twins included (issue 5).

Every expectation is independent of the code under test: trajectories come
from :func:`onnx_optax.reference.trajectory` (NumPy, float64) or, where the
claim is "the same as the plain rule", from the plain transform itself.

Tolerance against the reference (as in ``test_transforms.py``): after update
``k`` the parameters are held to ``rule_configs.trajectory_tolerances``, a
bound charged to ``|X|`` (for ``X + U``) and to the largest update so far
(for the update's roundings and those the state carries), not to the state:
Adagrad's ``H`` reaches hundreds while ``X`` stays near 1. A 0.1% error in
every update exceeds it at the first update.

The reference gets each hyperparameter rounded to float32, as the transform
sees it (a Python float is a weakly typed float32; ``inject_hyperparams``
stores float32 arrays for float32 parameters).

Injected and plain runs agree to the bit eagerly. Under ``jax.jit`` they can
differ in the last bit of the bias corrections of the two Adams: with plain
Python floats XLA folds ``-expm1(T * log(beta))`` into constants at compile
time (with its constant evaluator), with injected arrays it evaluates them at
run time (with the CPU's vectorized ``log``/``expm1``), and the two are not
the same correctly-rounded function. Measured: 2.4e-7 after 30 ONNX Adam
steps on parameters of size ~1. That comparison uses ``JIT_ULPS`` roundings
per step.
"""

from __future__ import annotations

import functools
import operator
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from rule_configs import RULE_CONFIGS, expectation, shaped, trajectory, trajectory_tolerances
from rule_configs import as_float32_sees as _f32

import onnx_optax
from onnx_optax import reference

STEPS = 30
JIT_ULPS = 4
U32 = 2.0**-24

# (registered rule, factory, hyperparameters, learning rate, a second numeric
# hyperparameter for sweeps), for every configuration of every registered rule, the
# framework twins included. Every term of every formula matters.
CONFIGS = {k: (c.rule, c.make, c.hyper, c.learning_rate, c.sweep) for k, c in RULE_CONFIGS.items()}
NAMES = sorted(CONFIGS)
#: The configurations whose rule reads the learning rate at every update: a schedule, a changed
#: injected rate or a swept one moves their steps. The others (``Rule.reads_learning_rate`` False:
#: the rate only starts a state field, torch.optim.Rprop's step sizes) are held to that instead, by
#: test_a_rate_that_only_starts_the_state.
RATE_NAMES = [n for n in NAMES if onnx_optax.registry.get(CONFIGS[n][0]).reads_learning_rate]
#: The rules' configurations by the registered rule's name (the hyperparameters the
#: reference sees, the state it starts from).
BY_RULE = {c.rule: c for c in RULE_CONFIGS.values()}


def _seen(hyper, rule):
  """The hyperparameters as a float32 run of ``rule`` receives them (rule_configs.RuleConfig.seen)."""
  return BY_RULE[rule].seen(hyper)


def _static_args(config, *more):
  return RULE_CONFIGS[config].static_args + more


def _first_count(rule):
  return BY_RULE[rule].first_count


def _tree(rng, config, scale=1.0):
  """A matrix and a vector, each as ``config``'s rule takes a leaf (``shaped``: Muon's matrices)."""
  return {
    "w": (scale * rng.normal(size=shaped(config, (4, 3)))).astype(np.float32),
    "b": (scale * rng.normal(size=shaped(config, 3))).astype(np.float32),
  }


def _problem(config, steps=STEPS):
  """Parameters and a list of gradients of varied magnitudes."""
  rng = np.random.default_rng(zlib.crc32(config.encode()))
  params = _tree(rng, config)
  grads = [_tree(rng, config, scale=10.0 ** rng.uniform(-2, 1)) for _ in range(steps)]
  return params, grads


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _zero_state(rule, params, hyper=None, learning_rate=None):
  """The state ``init`` starts from (zeros, or a hyperparameter's value, or the learning rate at
  the first update), as float64 leaves."""
  return BY_RULE[rule].initial_state(jax.tree.leaves(params), hyper, learning_rate)


def _tolerances(rule, hyper, lr, X0, xs):
  """Per update, the float32 bound of ``rule_configs.trajectory_tolerances``."""
  hypers = [_seen(h, rule) for h in (hyper if isinstance(hyper, list) else [hyper])]
  return trajectory_tolerances(rule, hypers, _f32(lr), X0, xs, U32)


def _assert_trajectory(got, want, tols, msg=""):
  """``got``: list of parameter trees; ``want``: list of lists of leaves; ``tols``: per step."""
  assert len(got) == len(want) == len(tols)
  for k, (g, w) in enumerate(zip(got, want)):
    for a, b in zip(jax.tree.leaves(g), w):
      assert a.dtype == jnp.float32
      np.testing.assert_allclose(np.asarray(a), b, rtol=0, atol=tols[k], err_msg=f"{msg} step {k}")


def _run(opt, params, grads, *, jit=True, before_step=None):
  """Applies ``opt`` along ``grads``; returns the parameters after each step."""
  update = jax.jit(opt.update) if jit else opt.update
  state = opt.init(params)
  p = jax.tree.map(jnp.asarray, params)
  out = []
  for k, g in enumerate(grads):
    if before_step is not None:
      state = before_step(k, state)
    u, state = update(g, state, p)
    p = optax.apply_updates(p, u)
    out.append(p)
  return out, state


def _max_diff(a, b):
  return max(
    float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


# ----------------------------------------------------------------------------
# inject_hyperparams


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("config", NAMES)
def test_inject_hyperparams_matches_plain_rule_and_reference(config, jit):
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, grads = _problem(config)
  opt = optax.inject_hyperparams(make, static_args=_static_args(config))(lr, **hyper)
  state = opt.init(params)
  # Every numeric hyperparameter is injected (mode is a string, correct_bias a
  # bool, adam_mode selects the formula: static).
  numeric = {k for k, v in hyper.items() if not isinstance(v, (str, bool)) and k not in _static_args(config)}
  assert numeric | {"learning_rate", "initial_count"} == set(state.hyperparams)

  injected, _ = _run(opt, params, grads, jit=jit)
  # A twin computes 1 - beta (Keras, PyTorch's dampening) from its Python numbers in float64,
  # rounded once, as its framework does; injected, they are float32 arrays, and so are the scalars
  # computed from them. The plain transform with the values as float32 holds them computes the same.
  as_given = {k: _f32(v) for k, v in hyper.items()} if RULE_CONFIGS[config].framework else hyper
  plain, _ = _run(make(lr, **as_given), params, grads, jit=jit)
  if jit:
    scale = max(1.0, max(float(np.max(np.abs(x))) for p in plain for x in jax.tree.leaves(p)))
    assert _max_diff(injected, plain) <= STEPS * JIT_ULPS * U32 * scale
  else:
    for a, b in zip(injected, plain):
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

  xs, ref_state, _ = trajectory(
    rule,
    _leaves(params),
    [_leaves(g) for g in grads],
    _zero_state(rule, params),
    _first_count(rule),
    [_f32(lr)] * STEPS,
    **_seen(hyper, rule),
  )
  _assert_trajectory(injected, xs, _tolerances(rule, hyper, lr, _leaves(params), xs))


@pytest.mark.parametrize("config", RATE_NAMES)
def test_changing_hyperparameters_between_steps_takes_effect_at_that_step(config):
  """A new learning rate every step; every other hyperparameter changes at step K."""
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, grads = _problem(config)
  K = 12
  lrs = [lr * (1.0 + 0.5 * np.sin(k)) for k in range(STEPS)]
  # Other values, still valid (decays in [0, 1), epsilon >= 0).
  # Modes and flags (strings, bools, static ints) stay: they are not injected.
  fixed = lambda k, v: isinstance(v, (str, bool)) or k in _static_args(config)  # noqa: E731
  changed = {
    k: (v if fixed(k, v) else 0.5 * v + (0.3 if k in ("alpha", "beta", "beta1", "beta2") else 0.0))
    for k, v in hyper.items()
  }

  def before_step(k, state):
    state.hyperparams["learning_rate"] = jnp.asarray(lrs[k], jnp.float32)
    if k == K:
      for name, value in changed.items():
        if not fixed(name, value):
          state.hyperparams[name] = jnp.asarray(value, jnp.float32)
    return state

  got, _ = _run(
    optax.inject_hyperparams(make, static_args=_static_args(config))(lr, **hyper),
    params,
    grads,
    before_step=before_step,
  )

  xs1, s1, T1 = trajectory(
    rule,
    _leaves(params),
    [_leaves(g) for g in grads[:K]],
    _zero_state(rule, params),
    _first_count(rule),
    [_f32(r) for r in lrs[:K]],
    **_seen(hyper, rule),
  )
  xs2, s2, _ = trajectory(
    rule, xs1[-1], [_leaves(g) for g in grads[K:]], s1, T1, [_f32(r) for r in lrs[K:]], **_seen(changed, rule)
  )
  xs = xs1 + xs2
  _assert_trajectory(got, xs, _tolerances(rule, [hyper, changed], max(lrs), _leaves(params), xs))
  # Each change acts at its own step, not one step later: at step K the
  # reference with every change one step late is much farther away.
  late = [lrs[0]] + lrs[:-1]
  ys1, t1, U1 = trajectory(
    rule,
    _leaves(params),
    [_leaves(g) for g in grads[: K + 1]],
    _zero_state(rule, params),
    _first_count(rule),
    [_f32(r) for r in late[: K + 1]],
    **_seen(hyper, rule),
  )
  right, wrong = _max_diff(got[K], xs[K]), _max_diff(got[K], ys1[K])
  assert 100 * right < wrong, (right, wrong)


def test_injected_norm_coefficient_needs_params():
  """An injected (hence traced) norm_coefficient is not known to be 0."""
  opt = optax.inject_hyperparams(onnx_optax.adagrad)(0.1)
  params = jnp.ones(3)
  state = opt.init(params)
  with pytest.raises(ValueError, match="needs the parameters"):
    jax.jit(opt.update)(jnp.ones(3), state)
  jax.jit(opt.update)(jnp.ones(3), state, params)  # Passing them works.
  # Keeping it static keeps the parameter-free update.
  opt = optax.inject_hyperparams(onnx_optax.adagrad, static_args=("norm_coefficient",))(0.1)
  jax.jit(opt.update)(jnp.ones(3), opt.init(params))


def test_injected_values_are_validated_when_concrete():
  """Concrete injected values are still checked; traced ones cannot be."""
  with pytest.raises(ValueError, match="beta"):
    optax.inject_hyperparams(onnx_optax.adam)(0.1, beta=1.5).init(jnp.ones(2))
  with pytest.raises(ValueError, match="initial_count"):
    optax.inject_hyperparams(onnx_optax.directml_adam)(0.1, initial_count=0).init(jnp.ones(2))


def test_state_dtype_under_inject_hyperparams():
  """inject_hyperparams takes every callable for a schedule, jnp.float32 included.

  (bfloat16 parameters: the hyperparameters are injected as float32, see
  tests/test_precision.py.)
  """
  params = {"w": jnp.ones(3, jnp.bfloat16)}
  inject = functools.partial(optax.inject_hyperparams, hyperparam_dtype=jnp.float32)
  with pytest.raises(TypeError, match="static_args"):
    inject(onnx_optax.adam)(0.1, state_dtype=jnp.float32).init(params)
  for opt in (
    inject(onnx_optax.adam, static_args=("state_dtype",))(0.1, state_dtype=jnp.float32),
    inject(onnx_optax.adam)(0.1, state_dtype=jnp.dtype("float32")),
  ):
    state = opt.init(params)
    assert "state_dtype" not in state.hyperparams
    assert state.inner_state.h["w"].dtype == jnp.float32


# ----------------------------------------------------------------------------
# Schedules and wrappers


@pytest.mark.parametrize("config", RATE_NAMES)
def test_learning_rate_schedule_plain_and_injected(config):
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, grads = _problem(config)
  schedule = optax.linear_schedule(0.1 * lr, lr, transition_steps=10)
  # Written out, not evaluated by optax: the schedule's value at update k.
  lrs = [_f32(0.1 * lr + (lr - 0.1 * lr) * min(k, 10) / 10) for k in range(STEPS)]
  xs, s, _ = trajectory(
    rule,
    _leaves(params),
    [_leaves(g) for g in grads],
    _zero_state(rule, params, learning_rate=lrs[0]),  # ASGD's eta starts at the schedule's first rate
    _first_count(rule),
    lrs,
    **_seen(hyper, rule),
  )
  tol = _tolerances(rule, hyper, lr, _leaves(params), xs)
  plain, _ = _run(make(schedule, **hyper), params, grads)
  _assert_trajectory(plain, xs, tol, "plain")
  injected, state = _run(
    optax.inject_hyperparams(make, static_args=_static_args(config))(schedule, **hyper), params, grads
  )
  _assert_trajectory(injected, xs, tol, "injected")
  np.testing.assert_allclose(float(state.hyperparams["learning_rate"]), lrs[-1], rtol=1e-6)


def _reference_step(rule, hyper, R, T, X, G, S):
  """One reference step on lists of leaves; returns (X_new, S_new)."""
  step, n = expectation(rule)
  out = [step(R, T, x, g, *(s[i] for s in S), **hyper) for i, (x, g) in enumerate(zip(X, G))]
  return [o[0] for o in out], [[o[1 + j] for o in out] for j in range(n)]


@pytest.mark.parametrize("config", NAMES)
def test_chain_with_clipping_before_and_after(config):
  """clip_by_global_norm, then the rule, then an element-wise clip of the update."""
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, grads = _problem(config)
  max_norm, max_delta = 1.0, 0.02
  opt = optax.chain(optax.clip_by_global_norm(max_norm), make(lr, **hyper), optax.clip(max_delta))
  got, _ = _run(opt, params, grads)

  X, S, T, xs = _leaves(params), _zero_state(rule, params), _first_count(rule), []
  clipped_before = 0
  for g in grads:
    G = [x.astype(np.float64) for x in _leaves(g)]
    norm = np.sqrt(sum(np.sum(x * x) for x in G))
    if norm > max_norm:
      G = [x * (max_norm / norm) for x in G]
      clipped_before += 1
    X_new, S = _reference_step(rule, _seen(hyper, rule), _f32(lr), T, X, G, S)
    X = [x + np.clip(xn - x, -max_delta, max_delta) for x, xn in zip(X, X_new)]
    xs.append(X)
    T += 1
  assert 0 < clipped_before < STEPS  # both branches of the first clip ran
  _assert_trajectory(got, xs, _tolerances(rule, hyper, lr, _leaves(params), xs))


@pytest.mark.parametrize("config", NAMES)
def test_masked(config):
  """Masked-out leaves keep their raw gradient as update (optax.masked's contract)."""
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, grads = _problem(config)
  opt = optax.masked(make(lr, **hyper), {"w": True, "b": False})
  state = opt.init(params)
  update = jax.jit(opt.update)
  p, got = jax.tree.map(jnp.asarray, params), []
  for g in grads:
    u, state = update(g, state, p)
    np.testing.assert_array_equal(np.asarray(u["b"]), g["b"])
    p = optax.apply_updates(p, u)
    got.append(p["w"])
  xs, s, _ = trajectory(
    rule,
    [params["w"]],
    [[g["w"]] for g in grads],
    _zero_state(rule, {"w": params["w"]}),
    _first_count(rule),
    [_f32(lr)] * STEPS,
    **_seen(hyper, rule),
  )
  _assert_trajectory(got, xs, _tolerances(rule, hyper, lr, [params["w"]], xs))


@pytest.mark.parametrize("config", NAMES)
def test_multi_transform(config):
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, grads = _problem(config)
  other = dict(alpha=0.5, beta=1.0, mode="nesterov", norm_coefficient=0.0)
  opt = optax.multi_transform(
    {"main": make(lr, **hyper), "other": onnx_optax.momentum(0.02, **other)}, {"w": "main", "b": "other"}
  )
  got, _ = _run(opt, params, grads)
  xs_w, s_w, _ = trajectory(
    rule,
    [params["w"]],
    [[g["w"]] for g in grads],
    _zero_state(rule, {"w": params["w"]}),
    _first_count(rule),
    [_f32(lr)] * STEPS,
    **_seen(hyper, rule),
  )
  xs_b, s_b, _ = trajectory(
    "momentum",
    [params["b"]],
    [[g["b"]] for g in grads],
    [[np.zeros(np.shape(params["b"]))]],
    0,
    [_f32(0.02)] * STEPS,
    **_seen(other, "momentum"),
  )
  _assert_trajectory([p["w"] for p in got], xs_w, _tolerances(rule, hyper, lr, [params["w"]], xs_w), "w")
  _assert_trajectory(
    [p["b"] for p in got], xs_b, _tolerances("momentum", other, 0.02, [params["b"]], xs_b), "b"
  )


@pytest.mark.parametrize("config", NAMES)
def test_multi_steps_accumulates_gradients(config):
  """MultiSteps(k=3): one update of the rule with the mean of 3 gradients."""
  rule, make, hyper, lr, _ = CONFIGS[config]
  every = 3
  params, grads = _problem(config)
  opt = optax.MultiSteps(make(lr, **hyper), every_k_schedule=every)
  got, state = _run(opt, params, grads)
  mean_grads = [
    [np.mean([_leaves(g)[i].astype(np.float64) for g in grads[k : k + every]], axis=0) for i in range(2)]
    for k in range(0, STEPS, every)
  ]
  xs, s, T = trajectory(
    rule,
    _leaves(params),
    mean_grads,
    _zero_state(rule, params),
    _first_count(rule),
    [_f32(lr)] * len(mean_grads),
    **_seen(hyper, rule),
  )
  # The mean of `every` float32 gradients rounds a few times relative to |G|:
  # an input error of the update's relative size, inside ROUNDINGS.
  tols = _tolerances(rule, hyper, lr, _leaves(params), xs)
  for k, p in enumerate(got):
    if (k + 1) % every:  # between updates the parameters stay where they were
      n = k // every - 1
      want, tol = (xs[n], tols[n]) if k >= every else (_leaves(params), 0.0)
    else:
      want, tol = xs[k // every], tols[k // every]
    _assert_trajectory([p], [want], [tol], f"micro-step {k}")
  assert int(state.inner_opt_state.count) == T


@pytest.mark.parametrize("config", NAMES)
def test_apply_if_finite_skips_non_finite_steps(config):
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, grads = _problem(config)
  bad = {4: np.nan, 9: np.inf}
  for k, value in bad.items():
    grads[k] = {"w": grads[k]["w"].copy(), "b": grads[k]["b"]}
    grads[k]["w"][1, 2] = value
  opt = optax.apply_if_finite(make(lr, **hyper), max_consecutive_errors=5)
  got, state = _run(opt, params, grads)
  good = [g for k, g in enumerate(grads) if k not in bad]
  xs, s, T = trajectory(
    rule,
    _leaves(params),
    [_leaves(g) for g in good],
    _zero_state(rule, params),
    _first_count(rule),
    [_f32(lr)] * len(good),
    **_seen(hyper, rule),
  )
  # The expected parameters after each step: a skipped step repeats the last ones.
  good_tols = _tolerances(rule, hyper, lr, _leaves(params), xs)
  want, tols, j = [], [], 0
  for k in range(STEPS):
    if k in bad:
      want.append(want[-1] if want else _leaves(params))
      tols.append(tols[-1] if tols else 0.0)
    else:
      want.append(xs[j])
      tols.append(good_tols[j])
      j += 1
  _assert_trajectory(got, want, tols)
  assert int(state.total_notfinite) == len(bad)
  assert int(state.inner_state.count) == T  # skipped steps do not count


@pytest.mark.parametrize("config", NAMES)
def test_extra_keyword_arguments_are_accepted(config):
  """The GradientTransformationExtraArgs protocol, alone and in a chain that needs them."""
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, grads = _problem(config, steps=3)
  opt = make(lr, **hyper)
  assert isinstance(opt, optax.GradientTransformationExtraArgs)
  state = opt.init(params)
  u1, s1 = opt.update(grads[0], state, params, value=jnp.float32(1.0), anything="else")
  u2, s2 = opt.update(grads[0], state, params)
  for a, b in zip(jax.tree.leaves((u1, s1)), jax.tree.leaves((u2, s2))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Jitted, to compare with the jitted chain below (jit contracts a*b + c).
  u2, _ = jax.jit(opt.update)(grads[0], state, params)
  # reduce_on_plateau needs value=; our transform must let it through.
  chained = optax.chain(make(lr, **hyper), optax.contrib.reduce_on_plateau(patience=100))
  state = chained.init(params)
  u, state = jax.jit(chained.update)(grads[0], state, params, value=jnp.float32(2.0))
  for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # plateau scale is 1


# ----------------------------------------------------------------------------
# Abstract init, stable state types, scan, vmap


def _types(tree):
  return jax.tree.map(lambda a: jax.typeof(a), tree)


@pytest.mark.parametrize("inject", [False, True], ids=["plain", "injected"])
# A dtype object, not the scalar type jnp.float32: inject_hyperparams takes
# every callable for a schedule (docs/optax.md).
@pytest.mark.parametrize("state_dtype", [None, jnp.dtype("float32")], ids=["default_state", "f32_state"])
@pytest.mark.parametrize("config", NAMES)
def test_abstract_init_and_state_types_are_stable(config, state_dtype, inject):
  rule, make, hyper, lr, _ = CONFIGS[config]
  factory = optax.inject_hyperparams(make, static_args=_static_args(config)) if inject else make
  opt = factory(lr, **hyper, state_dtype=state_dtype)
  params = {"w": jnp.ones((4, 3), jnp.bfloat16), "b": jnp.ones(shaped(config, 3), jnp.float32)}
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)

  state = opt.init(params)
  if not inject:
    # Zeros from shapes and dtypes alone. (optax.inject_hyperparams' own init
    # reads the parameters' values, for optax.adam as well: use eval_shape.)
    from_abstract = opt.init(abstract)
    assert jax.tree.structure(from_abstract) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(from_abstract), jax.tree.leaves(state)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))
  shapes = jax.eval_shape(opt.init, abstract)
  assert jax.tree.structure(shapes) == jax.tree.structure(state)
  for s, leaf in zip(jax.tree.leaves(shapes), jax.tree.leaves(state)):
    assert (s.shape, s.dtype) == (leaf.shape, leaf.dtype)

  inner = state.inner_state if inject else state
  for f, field in zip(onnx_optax.registry.get(rule).fields, inner[1:]):  # Field.dtypes where declared
    assert field["w"].dtype == f.dtype_for(jnp.bfloat16, state_dtype)
    assert field["b"].dtype == f.dtype_for(jnp.float32, state_dtype)
  before = _types(state)
  update = jax.jit(opt.update)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
  for _ in range(3):
    _, state = update(grads, state, params)
    assert _types(state) == before  # shapes, dtypes and weak types
  assert update._cache_size() == 1


@pytest.mark.parametrize("inject", [False, True], ids=["plain", "injected"])
@pytest.mark.parametrize("config", NAMES)
def test_scan_over_1000_steps_compiles_once_and_matches_python_loop(config, inject):
  """The scanned body and the jitted step are the same computation.

  Plain: bitwise equal. Injected: the hyperparameters are part of the scan's
  carry, and XLA compiles the while-loop body as a program of its own (its
  loop passes see carried values that come back unchanged), whose fusion,
  hence its contraction of ``a*b + c`` into fused multiply-adds, can differ
  from the standalone step's. Measured on the CPU: momentum_standard's ``V``
  differs by 9.1e-13 after 1,000 steps (where ``|V|`` <= 2.6e-6), every
  other leaf and rule bitwise. So the injected runs are held
  to a few roundings at the trajectory's scale, not to the bit.
  Pinned to the CPU, where this was measured.
  """
  with jax.default_device(jax.devices("cpu")[0]):
    _scan_matches_loop(config, inject)


def _scan_matches_loop(config, inject):
  rule, make, hyper, lr, _ = CONFIGS[config]
  params, _ = _problem(config, steps=0)
  rng = np.random.default_rng(1)
  target = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)

  def loss(p):
    return sum(
      jnp.sum(jnp.cos(a) * (a - t) ** 2) for a, t in zip(jax.tree.leaves(p), jax.tree.leaves(target))
    )

  opt = (optax.inject_hyperparams(make, static_args=_static_args(config)) if inject else make)(lr, **hyper)
  traces = []

  def step(carry, _=None):
    traces.append(1)
    p, s = carry
    u, s = opt.update(jax.grad(loss)(p), s, p)
    return (optax.apply_updates(p, u), s), None

  n = 1000
  params = jax.tree.map(jnp.asarray, params)
  jitted = jax.jit(lambda c: step(c)[0])
  carry = (params, opt.init(params))
  for _ in range(n):
    carry = jitted(carry)
  assert len(traces) == 1 and jitted._cache_size() == 1

  scanned = jax.jit(lambda c: jax.lax.scan(step, c, length=n)[0])
  result = scanned((params, opt.init(params)))
  assert len(traces) == 2  # the scan body was traced once
  count = result[1].inner_state.count if inject else result[1].count
  assert int(count) == _first_count(rule) + n
  for a, b in zip(jax.tree.leaves(result), jax.tree.leaves(carry)):
    if inject:
      scale = max(1.0, float(np.max(np.abs(np.asarray(b, np.float64)))))
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=JIT_ULPS * U32 * scale)
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("config", RATE_NAMES)
def test_vmap_over_a_sweep_of_hyperparameters(config):
  """Four learning rates x a second hyperparameter, in one compiled program."""
  rule, make, hyper, lr, second = CONFIGS[config]
  params, grads = _problem(config, steps=10)
  stacked = jax.tree.map(lambda *g: jnp.stack(g), *grads)
  lrs = np.array([0.5, 1.0, 1.5, 2.0], np.float32) * np.float32(lr)
  # ONNX Runtime's SGD has no hyperparameter but the learning rate (sweep "").
  with_second = (lambda h, b: dict(h, **{second: b})) if second else (lambda h, b: h)
  seconds = np.array([0.5, 0.6, 0.7, 0.8], np.float32) * np.float32(
    hyper[second] if second and hyper[second] < 1 else 0.9
  )

  @jax.jit
  @jax.vmap
  def sweep(r, b):
    opt = make(r, **with_second(hyper, b))  # traced hyperparameters

    def step(carry, g):
      p, s = carry
      u, s = opt.update(g, s, p)
      p = optax.apply_updates(p, u)
      return (p, s), p

    p0 = jax.tree.map(jnp.asarray, params)
    return jax.lax.scan(step, (p0, opt.init(p0)), stacked)[1]

  got = sweep(lrs, seconds)
  assert sweep._cache_size() == 1
  for i, (r, b) in enumerate(zip(lrs, seconds)):
    xs, s, _ = trajectory(
      rule,
      _leaves(params),
      [_leaves(g) for g in grads],
      _zero_state(rule, params, learning_rate=float(r)),
      _first_count(rule),
      [float(r)] * len(grads),
      **_seen(with_second(hyper, float(b)), rule),
    )
    mine = [jax.tree.map(operator.itemgetter((i, k)), got) for k in range(len(grads))]
    _assert_trajectory(
      mine,
      xs,
      _tolerances(rule, with_second(hyper, float(b)), float(r), _leaves(params), xs),
      f"sweep {i}",
    )


def test_vmap_over_injected_hyperparameters():
  """The injected state's hyperparameters carry a batch axis like any leaf."""
  params, grads = _problem("adam", steps=5)
  hyper = CONFIGS["adam"][2]
  opt = optax.inject_hyperparams(onnx_optax.adam)(0.05, **hyper)
  state = opt.init(params)
  lrs = jnp.array([0.01, 0.05, 0.1], jnp.float32)
  state.hyperparams["learning_rate"] = lrs
  axes = jax.tree.map(lambda _: None, state)
  axes.hyperparams["learning_rate"] = 0
  step = jax.jit(jax.vmap(lambda g, s, p: opt.update(g, s, p), in_axes=(None, axes, None)))
  updates, new_state = step(grads[0], state, params)
  for i, r in enumerate(np.asarray(lrs)):
    want, _, _ = reference.adam(
      float(r), 0, params["w"], grads[0]["w"], np.zeros((4, 3)), np.zeros((4, 3)), **_seen(hyper, "adam")
    )
    got = params["w"] + np.asarray(updates["w"][i], np.float64)
    tol = _tolerances("adam", hyper, float(r), [params["w"]], [[want]])[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


@pytest.mark.parametrize("config", [n for n in NAMES if n not in RATE_NAMES])
def test_a_rate_that_only_starts_the_state(config):
  """A rule whose learning rate only starts a state field (``Rule.reads_learning_rate`` False,
  PyTorch's Rprop): a schedule is refused, naming the argument, and its advice (the schedule's
  value at the first update, as a float) runs; an injected rate changed after ``init`` changes
  nothing, as PyTorch's scheduler changes nothing of Rprop's started step sizes."""
  rule, make, hyper, lr, _ = CONFIGS[config]
  schedule = optax.linear_schedule(lr, lr / 10, 5)
  with pytest.raises(
    TypeError, match=r"learning_rate only starts state\.\w+ .*learning_rate=float\(schedule\(0\)\)"
  ):
    make(schedule, **hyper)
  make(float(schedule(0)), **hyper)  # the advice, as printed
  params = {"w": jnp.array([1.0, -2.0, 0.5])}
  grads = [{"w": jnp.array([0.5, -1.0, 2.0]) * (1 - 2 * (k % 2))} for k in range(4)]
  tx = optax.inject_hyperparams(make)(learning_rate=lr, **hyper)
  runs = []
  for later in (lr, 10 * lr):
    state, p = tx.init(params), params
    for k, g in enumerate(grads):
      if k == 1:
        state.hyperparams["learning_rate"] = jnp.asarray(later)
      u, state = tx.update(g, state, p)
      p = optax.apply_updates(p, u)
    runs.append(np.asarray(p["w"]))
  np.testing.assert_array_equal(runs[0], runs[1])
  assert np.any(runs[0] != np.asarray(params["w"]))  # it moved
