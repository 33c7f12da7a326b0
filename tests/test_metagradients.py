"""Meta-gradients: ``jax.grad`` through update steps w.r.t. hyperparameters (issue 5).

The meta-objective is the training loss after K updates, as a function of the
hyperparameters; every hyperparameter is a traced value inside
``jax.grad`` (validation skips values it cannot read). Expected values are
central finite differences of the same meta-objective in float64, evaluated
under ``jax.jit`` so that a difference may step just outside a
hyperparameter's valid range (``epsilon - h`` at ``epsilon = 0``).

Error of a central difference with step ``h = 1e-6 * |theta|``: truncation
``h**2 * f''' / 6`` and rounding ``~1e-16 * |f| / h``, both far below the
tolerance ``1e-6 * (|fd| + 1)`` used here (measured agreement: 3e-7 relative
at worst, ONNX Adam's ``norm_coefficient``, whose derivative is small).

Where the spec's formulas are singular (see docs/optax.md, "Meta-gradients"):

* ``Sqrt(H)`` at ``H = 0`` (Adagrad, both Adams): an element whose gradient
  has been exactly 0 at every update so far has ``H = 0``; the derivative of
  the square root there is infinite, and times a zero cotangent it would make
  the whole meta-gradient NaN. The rules differentiate it as 0 (a
  subgradient of ``|G|``), so the meta-gradient is finite.
* ``epsilon = 0`` together with ``H = 0``: the forward value is already 0/0.
* The bias corrections ``1 - beta^T`` are evaluated as
  ``-expm1(T * log(beta))`` (no cancellation near 1); at a decay of exactly 0
  ``log`` gives a NaN derivative although the true one is finite. A small
  decay (1e-4) is a working substitute; a tiny one (1e-12) is inaccurate
  (see the test).
* ``Sqrt(1 - beta^T)`` at a second-moment decay ``beta = 1``: the true
  derivative is infinite (``~ -T / (2 Sqrt(T (1 - beta)))``).
* Momentum is a polynomial in every hyperparameter: no singularity.

A rule that rounds to a lower precision inside its update (``Rule.rounds_inside``:
``torch.optim.Muon``'s bfloat16 iteration) declares the derivative it promises: that
of the same rule with each inner rounding taken as the identity, the straight-through
derivative JAX gives ``convert_element_type``. A central difference of the rule itself
sees the roundings' flat steps instead (PyTorch Muon's ``momentum``: 0.0 against
``jax.grad``'s 0.24), so for such a rule both sides are taken with
``onnx_optax._numerics.round_inside``, the one function its roundings go through, as the
identity: the central difference and ``jax.grad`` are then of the same function, compared
to the same tolerance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from rule_configs import RULE_CONFIGS, shaped

import onnx_optax
from onnx_optax import _numerics, registry

K = 10
# Every configuration of every registered rule, the framework twins included.
CONFIGS = {k: (c.make, c.hyper, c.learning_rate) for k, c in RULE_CONFIGS.items()}


@pytest.fixture(autouse=True)
def _float64():
  with jax.enable_x64(True):
    yield


def _problem(weights=None, config=None):
  """A (4, 3) and a (3,) leaf; the (3,) one as (3, 1) for a rule of matrices (``Rule.ranks``)."""
  rng = np.random.default_rng(0)
  b = (3,) if config is None else shaped(config, (3,))
  params = {"w": jnp.asarray(rng.normal(size=(4, 3))), "b": jnp.asarray(rng.normal(size=(3,))).reshape(b)}
  target = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape)), params)
  if weights is None:
    weights = jax.tree.map(lambda p: jnp.asarray(1.0 + 0.5 * rng.uniform(size=p.shape)), params)

  def loss(p):
    # Not a quadratic: the gradient depends on the parameters non-linearly.
    return sum(
      jnp.sum(w * jnp.cos(a) * (a - t) ** 2 + 0.1 * w * a**4)
      for a, t, w in zip(jax.tree.leaves(p), jax.tree.leaves(target), jax.tree.leaves(weights))
    )

  return params, loss


def _meta_objective(make, static, loss, params, steps=K, prepare=None):
  """The loss after ``steps`` updates, a function of a dict of hyperparameters."""

  def meta(h):
    h = dict(h)
    lr = h.pop("learning_rate")
    opt = make(lr, **static, **h)
    s = opt.init(params)
    if prepare is not None:
      s = prepare(s, lr)
    p, _ = jax.lax.fori_loop(0, steps, lambda _, c: _step(opt, loss, *c), (params, s))
    return loss(p)

  return meta


def _step(opt, loss, p, s):
  u, s = opt.update(jax.grad(loss)(p), s, p)
  return optax.apply_updates(p, u), s


def _central_difference(meta, h0, name, step=None):
  jitted = jax.jit(meta)  # traced hyperparameters: h0 - e may leave the valid range
  e = step or 1e-6 * max(abs(h0[name]), 1e-3)
  up, down = dict(h0), dict(h0)
  up[name] += e
  down[name] -= e
  return (float(jitted(up)) - float(jitted(down))) / (2 * e)


def _split(hyper, lr, rule):
  # Modes, flags and formula selectors (ONNX Runtime's adam_mode) are static: those the rule
  # declares static (another rule's static eps, Adafactor's pair, is this one's number).
  fixed = RULE_CONFIGS[rule].static_args
  static = {k: v for k, v in hyper.items() if isinstance(v, (str, bool)) or k in fixed}
  numeric = {k: float(v) for k, v in hyper.items() if k not in static}
  return static, {"learning_rate": float(lr), **numeric}


def _float64_fields(config):
  """The state's fields of a declared dtype (``Field.dtypes``: PyTorch's scalar dtype, NAdam's
  ``mu_product``, ASGD's ``eta`` and ``mu``) in float64, as a float64 PyTorch run keeps them
  (``torch.set_default_dtype(torch.float64)``): ``init`` gives them float32, whose rounding a
  central difference of step 1e-6 cannot resolve. A field that starts at the learning rate
  starts at the float64 one. None where the rule declares no such field."""
  wide = [f for f in RULE_CONFIGS[config].fields if "float64" in f.dtypes]
  if not wide:
    return None

  def widened(f, leaf, lr):
    if f.initial == onnx_optax.registry.LEARNING_RATE:
      return jnp.full(leaf.shape, lr, jnp.float64)
    return leaf.astype(jnp.float64)

  return lambda s, lr: s._replace(
    **{f.name: jax.tree.map(lambda a, f=f: widened(f, a, lr), getattr(s, f.name)) for f in wide}
  )


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_metagradient_matches_central_difference(config, monkeypatch):
  """jax.grad w.r.t. every numeric hyperparameter, through K updates.

  A rule that rounds inside (``Rule.rounds_inside``) is differenced, and differentiated, with
  its inner roundings taken as the identity (the module docstring)."""
  if registry.get(RULE_CONFIGS[config].rule).rounds_inside:
    monkeypatch.setattr(_numerics, "round_inside", lambda x, dtype: x)
  make, hyper, lr = CONFIGS[config]
  params, loss = _problem(config=config)
  static, h0 = _split(hyper, lr, config)
  meta = _meta_objective(make, static, loss, params, prepare=_float64_fields(config))
  grads = jax.jit(jax.grad(meta))(h0)
  assert set(grads) == set(h0)
  for name in h0:
    g = float(grads[name])
    assert np.isfinite(g), name
    fd = _central_difference(meta, h0, name)
    assert abs(g - fd) <= 1e-6 * (abs(fd) + 1), (name, g, fd)
  assert abs(float(grads["learning_rate"])) > 1e-3  # the test has something to compare


def test_metagradient_through_inject_hyperparams():
  """The injected state's learning rate and beta are differentiable leaves."""
  make, hyper, lr = CONFIGS["adam"]
  params, loss = _problem()
  opt = optax.inject_hyperparams(make)(lr, **hyper)

  def meta(h):
    s = opt.init(params)
    s.hyperparams.update(h)
    p, _ = jax.lax.fori_loop(0, K, lambda _, c: _step(opt, loss, *c), (params, s))
    return loss(p)

  h0 = {"learning_rate": jnp.float64(lr), "beta": jnp.float64(hyper["beta"])}
  grads = jax.jit(jax.grad(meta))(h0)
  for name in h0:
    fd = _central_difference(
      lambda h: meta({k: jnp.asarray(v) for k, v in h.items()}), {k: float(v) for k, v in h0.items()}, name
    )
    assert abs(float(grads[name]) - fd) <= 1e-6 * (abs(fd) + 1), (name, float(grads[name]), fd)


# ----------------------------------------------------------------------------
# Singular derivatives, and what a user can do.

SQRT_RULES = {  # rule -> (factory, hyperparameters, name of the second-moment field)
  "adagrad": (onnx_optax.adagrad, dict(epsilon=0.1), "h"),
  "adam": (onnx_optax.adam, dict(epsilon=0.1), "h"),
  "directml_adam": (onnx_optax.directml_adam, dict(epsilon=0.1), "v"),
  # The framework twins: the same square roots, in their frameworks' order.
  "pytorch_adagrad": (onnx_optax.pytorch_adagrad, dict(eps=0.1), "sum"),
  "pytorch_adam": (onnx_optax.pytorch_adam, dict(eps=0.1), "exp_avg_sq"),
  "keras_adam": (onnx_optax.keras_adam, dict(epsilon=0.1), "velocities"),
}


def _dead_element_problem():
  """The loss ignores w[0, 0]: its gradient is exactly 0 at every step, so H = 0 there."""
  params, _ = _problem()
  weights = jax.tree.map(jnp.ones_like, params)
  weights["w"] = weights["w"].at[0, 0].set(0.0)
  return _problem(weights)


@pytest.mark.parametrize("rule", sorted(SQRT_RULES))
def test_zero_H_metagradient_is_finite(rule):
  """Sqrt(H) at H = 0 has an infinite derivative; the rules differentiate it as 0.

  Without that (plain ``jnp.sqrt``), one element whose gradient is exactly 0
  at every step made inf * 0 = NaN and the whole meta-gradient NaN.
  """
  make, hyper, field = SQRT_RULES[rule]
  params, loss = _dead_element_problem()
  static, h0 = _split(hyper, 0.05, rule)
  meta = _meta_objective(make, static, loss, params)
  grads = jax.jit(jax.grad(meta))(h0)
  for name in h0:
    g = float(grads[name])
    fd = _central_difference(meta, h0, name)
    assert np.isfinite(g) and abs(g - fd) <= 1e-6 * (abs(fd) + 1), (name, g, fd)
  # The dead element's H is still exactly 0 (the case the test is about).
  opt = make(0.05, **hyper)
  _, state = opt.update(jax.grad(loss)(params), opt.init(params), params)
  assert float(getattr(state, field)["w"][0, 0]) == 0.0


def test_epsilon_zero_with_zero_H_is_nan_already_forward():
  """0 / 0: keep epsilon > 0 wherever a gradient element can be exactly 0."""
  params, loss = _dead_element_problem()
  opt = onnx_optax.adagrad(0.1, epsilon=0.0)
  u, _ = opt.update(jax.grad(loss)(params), opt.init(params))
  assert np.isnan(float(u["w"][0, 0]))
  assert np.all(np.isfinite(np.asarray(u["w"]).ravel()[1:]))


@pytest.mark.parametrize("rule", sorted(SQRT_RULES))
def test_derivative_at_epsilon_zero_is_regular_when_H_is_positive(rule):
  make, hyper, _ = SQRT_RULES[rule]
  (epsilon,) = hyper  # the rule's name for it
  params, loss = _problem()
  static, h0 = _split({epsilon: 0.0}, 0.05, rule)
  meta = _meta_objective(make, static, loss, params)
  g = float(jax.jit(jax.grad(meta))(h0)[epsilon])
  fd = _central_difference(meta, h0, epsilon)  # steps to epsilon = -1e-9: fine while Sqrt(H) > 0
  assert np.isfinite(g) and abs(g - fd) <= 1e-6 * (abs(fd) + 1), (g, fd)


@pytest.mark.parametrize(
  "make,decay", [(onnx_optax.adam, "alpha"), (onnx_optax.adam, "beta"), (onnx_optax.directml_adam, "beta1")]
)
def test_derivative_at_a_decay_of_zero_is_finite(make, decay):
  """The bias corrections' derivative is written out: finite at 0, exact near it.

  ``1 - beta^T`` is evaluated as ``-expm1(T * log(beta))``; differentiated
  naively that is NaN at ``beta = 0`` and cancels for ``beta^T << 1``. The
  rules give it the derivative ``-T * beta^(T - 1)`` instead.
  """
  params, loss = _problem()
  static, h0 = _split({"epsilon": 0.1}, 0.05, make.__name__)
  meta = _meta_objective(make, static, loss, params)
  grad = jax.jit(jax.grad(meta))
  jitted = jax.jit(meta)
  for value in (0.0, 1e-12):
    at = dict(h0, **{decay: value})
    g = float(grad(at)[decay])
    # One-sided (a decay cannot go below 0): truncation e * f'' / 2 ~ 1e-7.
    e = 1e-7
    fd = (float(jitted(dict(at, **{decay: value + e}))) - float(jitted(at))) / e
    assert np.isfinite(g) and abs(g - fd) <= 1e-5 * (abs(fd) + 1), (value, g, fd)


@pytest.mark.parametrize("make,decay", [(onnx_optax.adam, "beta"), (onnx_optax.directml_adam, "beta2")])
def test_second_moment_decay_of_one_is_singular(make, decay):
  """Sqrt(1 - beta^T) has an infinite derivative at beta = 1 (the spec's formula itself)."""
  params, loss = _problem()
  static, h0 = _split({"epsilon": 0.1}, 0.05, make.__name__)
  meta = _meta_objective(make, static, loss, params)
  grad = jax.jit(jax.grad(meta))
  assert not np.isfinite(float(grad(dict(h0, **{decay: 1.0}))[decay]))
  # It grows like 1 / Sqrt(1 - beta) towards the pole.
  near, nearer = (abs(float(grad(dict(h0, **{decay: 1 - d}))[decay])) for d in (1e-6, 1e-10))
  assert 10 < nearer / near < 1000
