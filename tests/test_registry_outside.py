"""A rule defined outside the package, registered, and picked up by the tests built from the registry.

The rule here is RMS-scaled SGD (RMSprop without momentum), written as a rule
module of the package is: its formula in two parts, its state, its Optax
transform through :func:`onnx_optax._engine.transform` and its
:class:`~onnx_optax.registry.Rule`; beside it its NumPy expectation, written from
the formula alone, and the tests' tolerance model of it::

    V_new = beta * V + (1 - beta) * G * G
    X_new = X - R * G / (Sqrt(V_new) + epsilon)

Nothing else is edited: registered (a fixture here, the ``pytest_configure`` hook
of this module loaded as a plugin, ``pytest -p test_registry_outside``), the rule
is in :func:`onnx_optax.registry.rules`, its transform is checked and mapped over
pytrees by the engine from its declaration alone (hyperparameter ranges, a decay
that rounds to 1, the state's type and fields), and the parametrized tests of
``tests/test_transforms.py``, which iterate ``rule_configs.RULE_CONFIGS``, collect it
and pass: a subprocess runs them with the plugin and reads which ran.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from onnx_optax import _checks, _engine, _numerics, reference, registry

NAME = "rms_scaled_sgd"

# -- the rule's module ---------------------------------------------------------------------------


class RMSScaledSGDScalars(NamedTuple):
  """The per-update scalars: the learning rate and the hyperparameters, ``1 - beta`` once."""

  R: Any
  beta: Any
  one_minus_beta: Any
  epsilon: Any


def rms_scaled_sgd_scalars(R: Any, T: Any, *, beta: Any, epsilon: Any) -> RMSScaledSGDScalars:
  """``T`` is not read: the rule has no bias correction."""
  del T
  return RMSScaledSGDScalars(R, beta, _numerics.one_minus(beta), epsilon)


def rms_scaled_sgd_elementwise(s: RMSScaledSGDScalars, X: Any, G: Any, V: Any) -> tuple[Any, Any]:
  """``V_new = beta V + (1 - beta) G G``; ``U = -(R G / (Sqrt(V_new) + epsilon))``: ``X + U`` is
  ``X - R G / (Sqrt(V_new) + epsilon)`` to the bit."""
  del X  # not read
  V_new = s.beta * V + s.one_minus_beta * G * G
  return -(s.R * G / (_numerics.sqrt(V_new) + s.epsilon)), V_new


class RMSScaledSGDState(NamedTuple):
  """``count`` (updates done) and the running mean of squared gradients ``v``."""

  count: Any  # shadows tuple.count, as in Optax's states
  v: optax.Updates


def rms_scaled_sgd(
  learning_rate: Any,
  *,
  beta: float = 0.9,
  epsilon: float = 1e-8,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """RMS-scaled SGD as an Optax transform (the engine's, from :data:`RULE`)."""
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, dict(beta=beta, epsilon=epsilon))


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  return (lambda R, T: rule.scalars(R, T, **hyper), rule.elementwise)


RULE = registry.Rule(
  name=NAME,
  transform=rms_scaled_sgd,
  state=RMSScaledSGDState,
  fields=(registry.Field("v", "V", second_moment=True),),
  hyperparameters={
    "beta": registry.Hyperparameter(_checks.decay, decay=True, may_be_one=True),
    "epsilon": registry.Hyperparameter(_checks.epsilon),
  },
  scalars=rms_scaled_sgd_scalars,
  elementwise=rms_scaled_sgd_elementwise,
  bind=_bind,
  minimum_count=0,
  policy=_engine.SPEC,
  conformance=registry.Conformance(
    hyper=dict(beta=0.9, epsilon=1e-6),
    tests=registry.TestConfig(dict(beta=0.8, epsilon=0.3), 0.05, "beta"),
  ),
)

# -- its NumPy expectation, from the formula alone ----------------------------------------------


def expected(R, T, X, G, V, *, beta, epsilon, dtype=np.float64):
  """``(X_new, V_new)`` in ``dtype``."""
  del T
  X, G, V, R, beta, epsilon = (np.asarray(v, dtype) for v in (X, G, V, R, beta, epsilon))
  V_new = beta * V + (1 - beta) * G * G
  return X - R * G / (np.sqrt(V_new) + epsilon), V_new


# -- registering it ---------------------------------------------------------------------------


def register() -> None:
  """The rule (its declaration holds the tests' tolerance model of it: it does not read ``X``, no
  feedback, no first moment: the default ``Trajectory``) and its expectation under its name."""
  registry.register(RULE)
  reference.RULES[NAME] = (expected, 1)


def unregister() -> None:
  registry.unregister(NAME)
  reference.RULES.pop(NAME, None)


def pytest_configure(config: pytest.Config) -> None:
  """Loaded as a plugin (``pytest -p test_registry_outside``): registered before any test module is
  collected, so that ``rule_configs.RULE_CONFIGS`` holds the rule's configuration."""
  register()


def pytest_unconfigure(config: pytest.Config) -> None:
  unregister()


# -- the tests ----------------------------------------------------------------------------------


@pytest.fixture
def outside():
  register()
  try:
    yield RULE
  finally:
    unregister()


def test_registered_it_is_a_rule_of_the_registry_and_of_the_test_configurations(outside):
  import rule_configs

  assert registry.get(NAME) is RULE and RULE in list(registry.rules())
  (config,) = [c for c in rule_configs.configurations().values() if c.rule == NAME]
  assert config.name == NAME and config.make is rms_scaled_sgd and config.state_cls is RMSScaledSGDState
  assert config.hyper == {"beta": 0.8, "epsilon": 0.3} and config.learning_rate == 0.05
  assert config.static_args == () and config.first_count == 0
  assert rule_configs.expectation(NAME) == (expected, 1)
  with pytest.raises(ValueError, match="registered already"):
    registry.register(RULE)


def test_unregistered_it_is_gone():
  import rule_configs

  register()
  unregister()
  assert NAME not in {rule.name for rule in registry.rules()}
  assert NAME not in rule_configs.configurations() and NAME not in reference.RULES
  with pytest.raises(KeyError, match=NAME):
    registry.get(NAME)


def test_its_transform_follows_its_expectation(outside):
  """Ten jitted updates of a pytree against the expectation, within the tests' trajectory bound."""
  import rule_configs

  config = rule_configs.configurations()[NAME]
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": [rng.normal(size=4).astype(np.float32)]}
  grads = [jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), params) for _ in range(10)]
  opt = config.make(config.learning_rate, **config.hyper)
  p, state = jax.tree.map(jnp.asarray, params), opt.init(params)
  got = []
  for g in grads:
    u, state = jax.jit(opt.update)(g, state, p)
    p = optax.apply_updates(p, u)
    got.append(jax.tree.leaves(p))
  X0 = jax.tree.leaves(params)
  xs, _, T = rule_configs.trajectory(
    NAME, X0, [jax.tree.leaves(g) for g in grads], config.initial_state(X0), 0, [0.05] * 10, **config.seen()
  )
  tols = rule_configs.trajectory_tolerances(NAME, config.seen(), 0.05, X0, xs, 2.0**-24)
  for k, (a, b) in enumerate(zip(got, xs)):
    for x, y in zip(a, b):
      np.testing.assert_allclose(np.asarray(x), y, rtol=0, atol=tols[k], err_msg=f"step {k}")
  assert int(state.count) == T == 10
  # The bound has teeth: an update 1% too large is outside it.
  wrong, _, _ = rule_configs.trajectory(
    NAME, X0, [jax.tree.leaves(g) for g in grads], config.initial_state(X0), 0, [0.0505] * 10, **config.seen()
  )
  assert np.max(np.abs(np.asarray(got[0][0]) - wrong[0][0])) > tols[0]


def test_the_engine_checks_it_from_its_declaration(outside):
  """The hyperparameters' ranges of their kinds, a decay that rounds to 1 where the state is
  stored (the spec policy refuses it), and the state's type and fields: nothing written for it."""
  with pytest.raises(ValueError, match=r"beta must be <= 1.0"):
    rms_scaled_sgd(0.1, beta=1.5)
  with pytest.raises(ValueError, match=r"epsilon must be >= 0"):
    rms_scaled_sgd(0.1, epsilon=-1.0)
  with pytest.raises(ValueError, match=r"beta=0.999 rounds to 1.0 in bfloat16.*or pass beta=1.0"):
    rms_scaled_sgd(0.1, beta=0.999, state_dtype=jnp.bfloat16).init(jnp.ones(2))
  opt = rms_scaled_sgd(0.1)
  params = {"w": jnp.ones(3)}
  state = opt.init(params)
  with pytest.raises(TypeError, match=rf"onnx_optax.{NAME}: state must be the RMSScaledSGDState"):
    opt.update(params, tuple(state))
  with pytest.raises(TypeError, match=r"state.v\['w'\] has dtype int32"):
    opt.update(params, state._replace(v={"w": jnp.ones(3, jnp.int32)}))
  with pytest.raises(
    ValueError, match=r"updates\['w'\] has shape \(3,\) but state.v\['w'\] has shape \(2,\)"
  ):
    opt.update(params, state._replace(v={"w": jnp.ones(2)}))


#: The tests of tests/test_transforms.py parametrized by rule_configs.RULE_CONFIGS (the
#: transforms against the expectation, the count, the state's buffers, dtypes and checks).
TRANSFORM_TESTS = (
  "test_trajectory_matches_reference",
  "test_eager_update_is_spec_x_new_to_the_bit",
  "test_count_is_T_and_starts_at_initial_count",
  "test_count_saturates_and_updates_stay_finite",
  "test_state_buffers_are_distinct_and_donatable",
  "test_none_leaves_pass_through",
  "test_dtype_policy",
  "test_update_refuses_a_state_that_is_not_its_own",
)


def test_the_transform_tests_collect_it_with_no_other_edit(tmp_path):
  """``pytest -p test_registry_outside tests/test_transforms.py -k rms_scaled_sgd``: every test that
  iterates the configurations runs for the rule registered from outside, and passes."""
  tests = pathlib.Path(__file__).parent
  root = str(pathlib.Path(onnx_optax.__file__).resolve().parent.parent)
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([str(tests), root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  report = tmp_path / "report.xml"
  argv = ["-p", "test_registry_outside", "-p", "no:cacheprovider", "-q", "-k", NAME, f"--junitxml={report}"]
  result = subprocess.run(
    [sys.executable, "-m", "pytest", *argv, str(tests / "test_transforms.py")],
    cwd=root,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
  cases = ET.parse(report).getroot().iter("testcase")
  ran: dict[str, list[str]] = {}
  for case in cases:
    name = case.get("name", "")
    assert NAME in name, name
    assert not [child.tag for child in case], (name, [child.tag for child in case])  # no failure, skip
    ran.setdefault(name.split("[")[0], []).append(name)
  assert set(ran) == set(TRANSFORM_TESTS), sorted(ran)
  assert len(ran["test_trajectory_matches_reference"]) == 8 and len(ran["test_dtype_policy"]) == 5
  assert NAME not in {rule.name for rule in registry.rules()}, "the subprocess registered it, not this one"
