"""Bad input gets a clear error, raised before anything is computed (issue 8).

Every error names the argument (and the pytree path where one exists), so a
run that would otherwise broadcast silently or die at step 400,000 fails at
its first call. Each test asserts the exception type and that the message
names the argument. Checks on hyperparameter *values* apply to concrete
values only: traced ones (``optax.inject_hyperparams`` under ``jax.jit``,
``jax.vmap``) pass through unchecked, which the last tests pin down.
"""

from __future__ import annotations

import copy
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from onnx_optax import reference

MOMENTUM = dict(alpha=0.9, beta=0.9, mode="standard", norm_coefficient=0.0)

# name -> (constructor, required keyword arguments)
MAKERS = {
  "momentum": (onnx_optax.momentum, MOMENTUM),
  "adagrad": (onnx_optax.adagrad, {}),
  "adam": (onnx_optax.adam, {}),
  "directml_adam": (onnx_optax.directml_adam, {}),
}
NAMES = sorted(MAKERS)


def _make(name, lr=0.1, **overrides):
  make, required = MAKERS[name]
  return make(lr, **{**required, **overrides})


def _raises(exc, *words):
  """pytest.raises matching every word of the message, literally."""
  return pytest.raises(exc, match="".join(f"(?=[\\s\\S]*{re.escape(w)})" for w in words))


# ----------------------------------------------------------------------------
# Constructors: hyperparameters


def test_decay_messages_give_the_range_of_their_kind():
  """A first moment's decay (Adam's ``alpha``) is in [0, 1) because of the bias correction; a
  second moment's (``beta``) in [0, 1]: each message says its own range and why."""
  with pytest.raises(ValueError) as alpha:
    onnx_optax.adam(0.1, alpha=1.0)
  assert "in [0, 1): at 1 the bias correction 1 - alpha^T is 0" in str(alpha.value)
  with pytest.raises(ValueError) as beta:
    onnx_optax.adam(0.1, beta=1.5)
  assert "in [0, 1]; above 1" in str(beta.value) and "bias correction" not in str(beta.value)


def test_unknown_mode():
  with _raises(ValueError, "mode", "'sgd'"):
    onnx_optax.momentum(0.1, **{**MOMENTUM, "mode": "sgd"})
  with _raises(ValueError, "mode", "'Nesterov'"):  # case matters, as in ONNX
    onnx_optax.momentum(0.1, **{**MOMENTUM, "mode": "Nesterov"})
  with _raises(TypeError, "mode", "int"):
    onnx_optax.momentum(0.1, **{**MOMENTUM, "mode": 1})


@pytest.mark.parametrize(
  "name,argument,value",
  [
    # Adam's bias correction divides by 1 - alpha^T: zero for alpha = 1.
    ("adam", "alpha", 1.0),
    ("directml_adam", "beta1", 1.0),
    # sqrt(1 - beta^T) is the root of a negative number for beta > 1; a
    # negative decay has no real log, which the bias correction takes.
    ("adam", "beta", 1.5),
    ("directml_adam", "beta2", 1.0 + 2**-20),
    ("adam", "alpha", -0.1),
    ("adam", "beta", -0.1),
    ("directml_adam", "beta1", -0.5),
    ("directml_adam", "beta2", -1e-3),
    # Adagrad's r = R / (1 + T * decay_factor) divides by zero at T = -1/decay_factor.
    ("adagrad", "decay_factor", -0.5),
    # A negative epsilon can zero the denominator.
    ("adagrad", "epsilon", -1e-6),
    ("adam", "epsilon", -1e-6),
    ("directml_adam", "epsilon", -1e-8),
  ],
)
def test_decay_rates_that_divide_by_zero_or_root_a_negative(name, argument, value):
  with _raises(ValueError, argument, str(value)):
    _make(name, **{argument: value})
  # The same value as a concrete array (what optax.inject_hyperparams hands
  # in outside jit) is checked too.
  with _raises(ValueError, argument):
    _make(name, **{argument: jnp.float32(value)})


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 10**400])
def test_non_finite_hyperparameter(name, value):
  with _raises(ValueError, "learning_rate", "finite"):
    _make(name, lr=value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
  "value",
  [
    "0.1",
    None,
    True,
    1 + 2j,
    [0.1],
    np.array([0.1, 0.2]),
    np.array([0.1]),
    np.array(True),
    jnp.array(0.1 + 0j),
    object(),
  ],
  ids=["str", "None", "bool", "complex", "list", "vector", "shape1", "bool_array", "complex_array", "object"],
)
def test_hyperparameter_of_the_wrong_type(name, value):
  with _raises(TypeError, "learning_rate"):
    _make(name, lr=value)
  argument = {"momentum": "alpha", "adagrad": "epsilon", "adam": "beta", "directml_adam": "beta2"}[name]
  with _raises(TypeError, argument):
    _make(name, **{argument: value})


@pytest.mark.parametrize("name", NAMES)
def test_initial_count(name):
  with _raises(TypeError, "initial_count"):
    _make(name, initial_count=1.0)
  with _raises(TypeError, "initial_count"):
    _make(name, initial_count=True)
  with _raises(ValueError, "initial_count", "2147483648"):
    _make(name, initial_count=2**31)  # the int32 count could not hold it
  with _raises(ValueError, "initial_count", "-1"):
    _make(name, initial_count=-1)


def test_directml_adam_first_step_is_one():
  # T = 0 makes DirectML's Alpha 0/0.
  with _raises(ValueError, "initial_count", "0"):
    onnx_optax.directml_adam(0.1, initial_count=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [jnp.int32, "int8", bool, jnp.complex64, "not a dtype"])
def test_state_dtype_must_be_floating(name, dtype):
  with _raises(TypeError, "state_dtype"):
    _make(name, state_dtype=dtype)


# ----------------------------------------------------------------------------
# init: the parameters


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.bool_, jnp.complex64])
def test_non_floating_parameters(name, dtype):
  params = {"ok": jnp.ones(2), "layer": [jnp.ones(2), jnp.ones(3, dtype)]}
  with _raises(TypeError, "params['layer'][1]", str(jnp.dtype(dtype))):
    _make(name).init(params)


@pytest.mark.parametrize("name", NAMES)
def test_non_array_parameter_leaf(name):
  with _raises(TypeError, "params['w']", "float"):
    _make(name).init({"w": 1.0})


# ----------------------------------------------------------------------------
# update: gradients, state and parameters


def _setup(name, **overrides):
  opt = _make(name, **overrides)
  params = {"w": jnp.ones((2, 3)), "b": [jnp.zeros(3), jnp.ones(())]}
  return opt, params, opt.init(params)


@pytest.mark.parametrize("name", NAMES)
def test_tree_structures_differ(name):
  opt, params, state = _setup(name)
  grads = {"w": jnp.ones((2, 3)), "b": [jnp.zeros(3)]}  # one leaf missing
  with _raises(ValueError, "updates", "state.", "tree structures"):
    opt.update(grads, state, params)
  grads = {"w": jnp.ones((2, 3)), "c": [jnp.zeros(3), jnp.ones(())]}  # renamed key
  with _raises(ValueError, "tree structures"):
    opt.update(grads, state)
  # Parameters that do not match the gradients are rejected even where the
  # rule does not read them (norm_coefficient = 0).
  good = jax.tree.map(jnp.ones_like, params)
  with _raises(ValueError, "updates", "params", "tree structures"):
    opt.update(good, state, {"w": params["w"], "b": tuple(params["b"])})


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(3,), (1, 3), (2, 3, 1), (), (3, 2)])
def test_gradient_shape_differs_never_broadcast(name, shape):
  """Every one of these shapes would broadcast against (2, 3) or ()."""
  opt, params, state = _setup(name)
  grads = jax.tree.map(jnp.ones_like, params)
  grads["w"] = jnp.ones(shape)
  with _raises(ValueError, "updates['w']", str(shape), "(2, 3)", "broadcast"):
    opt.update(grads, state, params)
  with _raises(ValueError, "updates['w']", str(shape)):
    opt.update(grads, state)


@pytest.mark.parametrize("name", NAMES)
def test_gradient_dtype_differs_from_parameter(name):
  opt, params, state = _setup(name)
  grads = jax.tree.map(jnp.ones_like, params)
  grads["b"][0] = grads["b"][0].astype(jnp.float16)
  with _raises(TypeError, "updates['b'][0]", "float16", "params['b'][0]", "float32"):
    opt.update(grads, state, params)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_, jnp.complex64])
def test_non_floating_gradient(name, dtype):
  opt, params, state = _setup(name)
  grads = jax.tree.map(jnp.ones_like, params)
  grads["w"] = grads["w"].astype(dtype)
  with _raises(TypeError, "updates['w']", str(jnp.dtype(dtype))):
    opt.update(grads, state)


@pytest.mark.parametrize("name", NAMES)
def test_state_of_another_kind(name):
  opt, params, state = _setup(name)
  grads = jax.tree.map(jnp.ones_like, params)
  other = "adagrad" if name != "adagrad" else "adam"
  with _raises(TypeError, "state", type(state).__name__):
    opt.update(grads, _make(other).init(params), params)
  with _raises(TypeError, "state", "tuple"):
    opt.update(grads, tuple(state), params)
  with _raises(TypeError, "state.count", "float32"):
    opt.update(grads, state._replace(count=jnp.float32(3)), params)
  with _raises(TypeError, "state.count", "(2,)"):
    opt.update(grads, state._replace(count=jnp.zeros(2, jnp.int32)), params)
  field = type(state)._fields[1]
  bad = state._replace(**{field: {**getattr(state, field), "w": jnp.ones((2, 3), jnp.int32)}})
  with _raises(TypeError, f"state.{field}['w']", "int32"):
    opt.update(grads, bad, params)
  bad = state._replace(**{field: {**getattr(state, field), "w": jnp.ones((3, 2))}})
  with _raises(ValueError, "updates['w']", f"state.{field}['w']", "(3, 2)"):
    opt.update(grads, bad, params)


@pytest.mark.parametrize(
  "name,argument",
  [
    ("momentum", "norm_coefficient"),
    ("adagrad", "norm_coefficient"),
    ("adam", "norm_coefficient"),
    ("adam", "norm_coefficient_post"),
  ],
)
def test_norm_coefficient_without_params(name, argument):
  opt, params, state = _setup(name, **{argument: 0.01})
  grads = jax.tree.map(jnp.ones_like, params)
  with _raises(ValueError, "params", "norm_coefficient"):
    opt.update(grads, state)
  with _raises(ValueError, "params"):
    jax.jit(opt.update)(grads, state)
  opt.update(grads, state, params)  # and with them it runs


@pytest.mark.parametrize("name", NAMES)
def test_errors_come_before_any_computation_and_inputs_are_untouched(name):
  """A failed call leaves the state usable; a good call modifies no input.

  NumPy inputs are the ones that could be modified in place; every input is
  compared with a deep copy taken before the calls.
  """
  opt = _make(name, **({"norm_coefficient": 0.01} if name != "directml_adam" else {}))
  params = {"w": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
  grads = {"w": np.full((2, 3), 0.5, np.float32), "b": np.arange(3, dtype=np.float32)}
  kept = copy.deepcopy((params, grads))
  state = opt.init(params)
  state_kept = jax.tree.map(np.array, state)
  with pytest.raises(ValueError):
    opt.update({**grads, "b": np.ones(4, np.float32)}, state, params)
  updates, new_state = opt.update(grads, state, params)
  for a, b in zip(jax.tree.leaves((params, grads, state)), jax.tree.leaves((*kept, state_kept))):
    np.testing.assert_array_equal(np.asarray(a), b)
  assert int(new_state.count) == int(state.count) + 1


# ----------------------------------------------------------------------------
# Traced hyperparameters are left alone


@pytest.mark.parametrize(
  "name,argument,bad",
  [
    ("adam", "alpha", 1.0),
    ("directml_adam", "beta1", 1.0),
    ("adagrad", "decay_factor", -0.5),
    ("momentum", "alpha", float("nan")),
  ],
)
def test_injected_hyperparameters_checked_when_concrete_not_when_traced(name, argument, bad):
  make, required = MAKERS[name]
  opt = optax.inject_hyperparams(make)(0.1, **required)
  params = {"w": jnp.ones(3)}
  state = opt.init(params)
  grads = {"w": jnp.full(3, 0.5)}
  state = state._replace(hyperparams={**state.hyperparams, argument: jnp.float32(bad)})
  with _raises(ValueError, argument):  # concrete: checked on every update
    opt.update(grads, state, params)
  # Traced: the value cannot be read in Python; the spec's arithmetic runs.
  updates, _ = jax.jit(opt.update)(grads, state, params)
  assert updates["w"].shape == (3,)


# Every hyperparameter of each rule, with the defaults of the ONNX schemas
# (the README's table) where MAKERS leaves them out: what the reference needs.
REFERENCE_HYPER = {
  "momentum": MOMENTUM,
  "adagrad": dict(decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0),
  "adam": dict(alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0),
  "directml_adam": dict(beta1=0.9, beta2=0.999, epsilon=1e-8),
}


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_hyperparameters(name):
  """vmap over the learning rate and a decay rate: traced, so unchecked, and right.

  Right: each batch member's second update is the float64 NumPy reference's
  (two steps from a zero state, the hyperparameters rounded to float32 as
  the transform sees them), within two updates' roundings: ROUNDINGS = 16
  unit roundoffs of the update each, times ``1 / (1 - alpha)`` for the Adam
  rules, whose first moment rounds relative to ``G``, not ``(1 - alpha) G``.
  """
  make, required = MAKERS[name]
  argument = {"momentum": "beta", "adagrad": "decay_factor", "adam": "beta", "directml_adam": "beta2"}[name]
  params = {"w": jnp.ones(3)}
  grads = {"w": jnp.array([0.5, -1.0, 2.0])}

  def one(lr, value):
    opt = make(lr, **{**required, argument: value})
    state = opt.init(params)
    for _ in range(2):
      updates, state = opt.update(grads, state, params)
    return updates

  lrs, values = jnp.array([0.1, 0.2]), jnp.array([0.5, 0.25])
  batched = jax.vmap(one)(lrs, values)
  step, n_state = reference.RULES[name]
  X, G = np.ones(3), np.asarray(grads["w"], np.float64)
  for i in range(2):
    hyper = {
      k: (v if isinstance(v, str) else float(np.float32(v)))
      for k, v in {**REFERENCE_HYPER[name], argument: float(values[i])}.items()
    }
    R, T = float(lrs[i]), 1 if name == "directml_adam" else 0
    S = [np.zeros(3)] * n_state
    for k in range(2):  # the parameters stay at X: only the state moves
      X_new, *S = step(R, T + k, X, G, *S, **hyper)
    want = X_new - X
    alpha = hyper.get("alpha", 0.0) if name == "adam" else hyper.get("beta1", 0.0)
    tol = 2 * 16 * 2.0**-24 * float(np.max(np.abs(want))) / (1 - alpha)
    np.testing.assert_allclose(np.asarray(batched["w"][i], np.float64), want, rtol=0, atol=tol)


# ----------------------------------------------------------------------------
# Hyperparameter ranges: one per kind, the same in every rule, call and bridge

# kind -> (lowest valid, highest valid or None, whether the highest is excluded,
#          the (rule, argument) pairs of that kind). Written from docs/spec.md's
# table "Hyperparameter ranges", not from onnx_optax._checks.
KINDS = {
  "decay rate": (0.0, 1.0, False, [("momentum", "alpha"), ("adam", "beta"), ("directml_adam", "beta2")]),
  "first-moment decay": (0.0, 1.0, True, [("adam", "alpha"), ("directml_adam", "beta1")]),
  "gradient weight": (0.0, 1.0, False, [("momentum", "beta")]),
  "L2 coefficient": (
    0.0,
    None,
    False,
    [("momentum", "norm_coefficient"), ("adagrad", "norm_coefficient"), ("adam", "norm_coefficient")],
  ),
  "parameter decay": (0.0, 1.0, True, [("adam", "norm_coefficient_post")]),
  "learning-rate decay": (0.0, None, False, [("adagrad", "decay_factor")]),
  "epsilon": (0.0, None, False, [("adagrad", "epsilon"), ("adam", "epsilon"), ("directml_adam", "epsilon")]),
}
RANGED = [(kind, rule, argument) for kind, (*_, pairs) in KINDS.items() for rule, argument in pairs]


def _outside(kind):
  """Values just outside the kind's range, each with the bound its message must state."""
  lo, hi, open_hi, _ = KINDS[kind]
  out = [(lo - 1e-3, f">= {lo}"), (lo - 1.0, f">= {lo}")]
  if hi is not None:
    out += [(hi, f"< {hi}")] if open_hi else [(hi + 1e-3, f"<= {hi}"), (hi + 0.5, f"<= {hi}")]
  return out


def _inside(kind):
  lo, hi, open_hi, _ = KINDS[kind]
  return [lo, 0.5 if hi is None else (hi - 2**-10 if open_hi else hi)]


def _onnx_call(rule, argument, value):
  """The ONNX operator's call of ``rule`` with one attribute set, on one float32 tensor."""
  from onnx_optax import onnx as onnx_calls

  X = G = np.ones(3, np.float32)
  states = {"momentum": 1, "adagrad": 1, "adam": 2}[rule]
  call = getattr(onnx_calls, rule)
  return call(
    np.float32(0.1), 1, X, G, *[np.zeros(3, np.float32)] * states, **{**_required(rule), argument: value}
  )


def _required(rule):
  return MOMENTUM if rule == "momentum" else {}


def test_every_hyperparameter_has_a_kind():
  """No numeric hyperparameter of a rule is left out of the table (and so unchecked)."""
  import inspect

  for rule, (make, _) in MAKERS.items():
    numeric = {
      n
      for n, p in inspect.signature(make).parameters.items()
      if p.kind is p.KEYWORD_ONLY and n not in ("mode", "initial_count", "state_dtype")
    }
    assert numeric == {a for r, a in KINDS_PAIRS if r == rule}, rule


KINDS_PAIRS = {(rule, argument) for _, rule, argument in RANGED}


@pytest.mark.parametrize("kind,rule,argument", RANGED)
def test_range_of_each_kind_in_every_rule(kind, rule, argument):
  """Just outside the kind's range: refused, naming the argument, the bound and the docs' table.

  On the range's edges: accepted (and the transform initializes). The ONNX
  operators' calls refuse and accept the same values.
  """
  for value, bound in _outside(kind):
    with _raises(ValueError, argument, bound, "Hyperparameter ranges"):
      _make(rule, **{argument: value})
    with _raises(ValueError, argument):  # concrete arrays too (inject_hyperparams outside jit)
      _make(rule, **{argument: np.float32(value)})
    if rule != "directml_adam":
      with _raises(ValueError, argument, bound):
        _onnx_call(rule, argument, value)
  for value in _inside(kind):
    _make(rule, **{argument: value}).init({"w": jnp.ones(3)})
    if rule != "directml_adam":
      _onnx_call(rule, argument, value)


def test_learning_rate_may_be_negative():
  """A negative learning rate ascends, as in Optax; only non-finite ones are refused."""
  opt = onnx_optax.adagrad(-0.1, epsilon=0.0)
  updates, _ = opt.update(jnp.array([2.0]), opt.init(jnp.array([1.0])))
  assert float(updates[0]) == pytest.approx(0.1)


def test_injected_zero_norm_coefficient_names_static_args():
  """An injected 0.0 is an array, traced under jit: the message says why and what to do."""
  opt = optax.inject_hyperparams(onnx_optax.momentum)(
    0.1, alpha=0.9, beta=0.9, mode="standard", norm_coefficient=0.0
  )
  params = jnp.ones(3)
  state = opt.init(params)
  with _raises(
    ValueError, "injected", "traced", "static_args=('norm_coefficient',)", "update(grads, state, params)"
  ):
    opt.update(jnp.ones(3), state)
  opt.update(jnp.ones(3), state, params)  # either fix works
  static = optax.inject_hyperparams(onnx_optax.momentum, static_args=("norm_coefficient",))
  opt = static(0.1, alpha=0.9, beta=0.9, mode="standard", norm_coefficient=0.0)
  opt.update(jnp.ones(3), opt.init(params))


def test_pytorch_sgd_nesterov_refusal_checks_concrete_values_only():
  """``nesterov=True`` needs ``momentum > 0`` and ``dampening = 0`` (torch.optim.SGD's own
  refusal), named as passed; once either of the two is injected (traced under jit) the pair is
  not checked, and the update runs: a traced momentum beside a Python dampening is not read
  as a bool. Expected values: the NumPy expectation of torch.optim.SGD."""
  for hyper in (dict(momentum=0.0), dict(momentum=0.9, dampening=0.1)):
    with _raises(ValueError, "nesterov=True needs momentum > 0 and dampening = 0"):
      onnx_optax.pytorch_sgd(0.1, nesterov=True, **hyper)
  static = ("dampening", "nesterov", "maximize")
  opt = optax.inject_hyperparams(onnx_optax.pytorch_sgd, static_args=static)(0.1, momentum=0.9, nesterov=True)
  X, grads = np.array([1.0, -2.0, 0.5]), [np.array([0.5, -0.25, 1.0]), np.array([-1.0, 0.75, 0.5])]
  update = jax.jit(opt.update)
  x, state, buf = jnp.asarray(X, jnp.float32), opt.init(jnp.asarray(X, jnp.float32)), np.zeros(3)
  for count, g in enumerate(grads):
    updates, state = update(jnp.asarray(g, jnp.float32), state, x)
    x = optax.apply_updates(x, updates)
    X, buf = reference.pytorch_sgd(
      0.1, count, X, g, buf, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=True, maximize=False
    )
    np.testing.assert_allclose(np.asarray(x), X, rtol=1e-6)


@pytest.mark.parametrize(
  "build,option,value,named",
  [
    ("SGD", "momentum", 1.5, "param_groups[0]['momentum']"),
    ("SGD", "momentum", -0.1, "param_groups[0]['momentum']"),
    ("SGD", "dampening", 1.5, "param_groups[0]['dampening']"),
    ("SGD", "dampening", -0.5, "param_groups[0]['dampening']"),
    ("SGD", "weight_decay", -1e-4, "param_groups[0]['weight_decay']"),
    ("Adagrad", "weight_decay", -1e-4, "param_groups[0]['weight_decay']"),
    ("Adagrad", "lr_decay", -0.1, "param_groups[0]['lr_decay']"),
    ("Adagrad", "eps", -1e-10, "param_groups[0]['eps']"),
    ("SGD", "lr", float("nan"), "param_groups[0]['lr']"),
  ],
)
def test_torch_bridge_checks_ranges_under_pytorch_names(build, option, value, named):
  """The ranges of the kinds, checked under PyTorch's names (a group edited after the constructor)."""
  import torch

  from onnx_optax.interop import from_torch

  p = torch.nn.Parameter(torch.ones(3))
  opt = getattr(torch.optim, build)([p], lr=0.1, **({"momentum": 0.9} if build == "SGD" else {}))
  opt.param_groups[0][option] = value
  with _raises(ValueError, named):
    from_torch(opt, [jnp.ones(3)])


@pytest.mark.parametrize(
  "option,value", [("beta_1", 1.0), ("beta_1", -0.1), ("beta_2", 1.001), ("epsilon", -1e-7)]
)
def test_keras_bridge_checks_ranges_under_keras_names(option, value):
  import os

  os.environ.setdefault("KERAS_BACKEND", "jax")
  import keras

  from onnx_optax.interop import from_keras

  opt = keras.optimizers.Adam(learning_rate=0.1, **{option: value})
  with _raises(ValueError, option, "Hyperparameter ranges"):
    from_keras(opt, [jnp.ones(3)])


def test_keras_without_its_backend_says_which_to_set():
  """Keras 3 imports TensorFlow unless KERAS_BACKEND says otherwise: the error names the fix.

  In a fresh interpreter with KERAS_BACKEND unset and TensorFlow made
  unimportable, as on a machine where only the interop extra is installed.
  """
  import subprocess
  import sys
  import textwrap

  code = textwrap.dedent("""
      import sys
      sys.modules["tensorflow"] = None  # as if TensorFlow were not installed
      import onnx_optax.interop
      try:
        onnx_optax.interop.from_keras(object(), [])
      except ImportError as error:
        print(error)
  """)
  env = {k: v for k, v in __import__("os").environ.items() if k != "KERAS_BACKEND"}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
  assert "failed to import its backend 'tensorflow'" in out.stdout and "KERAS_BACKEND=jax" in out.stdout, out


@pytest.mark.parametrize("make", [onnx_optax.pytorch_adam, onnx_optax.pytorch_adamw])
@pytest.mark.parametrize("i", [0, 1])
def test_pytorch_betas_must_be_python_numbers(make, i):
  """PyTorch's ``betas`` are Python numbers (its ``1 - beta`` and its ``lerp`` branch are Python
  float arithmetic): a JAX array among them, concrete or traced, is refused naming ``betas[i]``,
  and the advice, a Python number, works. Planted, the loop over the pair run zero times let
  a concrete array through (read with ``float()``)."""
  betas = [0.9, 0.999]
  betas[i] = jnp.float32(betas[i])
  with _raises(TypeError, f"betas[{i}] must be a Python number"):
    make(0.1, betas=tuple(betas))
  betas[i] = float(betas[i])
  tx = make(0.1, betas=tuple(betas))
  updates, _ = tx.update(jnp.ones(2), tx.init(jnp.ones(2)), jnp.ones(2))
  assert np.all(np.isfinite(np.asarray(updates)))


@pytest.mark.parametrize("betas", [(0.9, 0.999, 0.5), (0.9,), 0.9], ids=["three", "one", "number"])
def test_pytorch_betas_must_be_a_pair(betas):
  """``betas`` is a pair: three numbers are refused, not truncated to the first two (planted,
  the pair test's ``or`` as ``and`` let them through), nor is one number read as a pair."""
  with _raises(TypeError, "betas must be a pair (beta1, beta2)"):
    onnx_optax.pytorch_adam(0.1, betas=betas)


@pytest.mark.parametrize(
  "adam_mode, correct_bias",
  [(True, True), (1.0, True), (2, True), ("1", True), (1, 2), (1, 0.5), (0, False)],
  ids=["mode-bool", "mode-float", "mode-2", "mode-str", "bias-2", "bias-float", "mode0-uncorrected"],
)
def test_ort_adamw_scalars_refuse_what_the_transform_refuses(adam_mode, correct_bias):
  """The function-level ``rules.ort_adamw_scalars`` (called without a transform's checks before it)
  refuses every ``adam_mode`` / ``correct_bias`` that :func:`onnx_optax.ort_adamw` refuses, with the
  same message: a bool or a float is not ONNX Runtime's int attribute, even when it equals 0 or 1."""
  hyper = dict(alpha=0.9, beta=0.999, epsilon=1e-8, weight_decay=0.01)
  with pytest.raises((TypeError, ValueError), match="adam_mode|correct_bias") as transform:
    onnx_optax.ort_adamw(0.1, **hyper, adam_mode=adam_mode, correct_bias=correct_bias)
  with pytest.raises((TypeError, ValueError), match="adam_mode|correct_bias") as function:
    onnx_optax.rules.ort_adamw_scalars(
      np.float32(0.1), 1, **hyper, adam_mode=adam_mode, correct_bias=correct_bias
    )
  assert (type(function.value), str(function.value)) == (type(transform.value), str(transform.value))


@pytest.mark.parametrize("adam_mode", [True, 1.0, 2, "1"], ids=["bool", "float", "2", "str"])
def test_ort_adamw_elementwise_refuses_the_modes_the_transform_refuses(adam_mode):
  """``rules.ort_adamw_elementwise`` takes ``adam_mode`` too, and refuses it as the transform does
  (before, its own range test accepted ``True`` and ``1.0``)."""
  with pytest.raises((TypeError, ValueError)) as transform:
    onnx_optax.ort_adamw(0.1, adam_mode=adam_mode)
  s = onnx_optax.rules.ort_adamw_scalars(
    np.float32(0.1), 1, alpha=0.9, beta=0.999, epsilon=1e-8, weight_decay=0.0, adam_mode=1, correct_bias=True
  )
  x = jnp.ones(2)
  with pytest.raises((TypeError, ValueError)) as function:
    onnx_optax.rules.ort_adamw_elementwise(s, x, x, x, x, adam_mode=adam_mode)
  assert (type(function.value), str(function.value)) == (type(transform.value), str(transform.value))


@pytest.mark.parametrize(
  "value",
  [np.float32(1.0), jnp.asarray(1.0), np.array([1]), jnp.asarray([1, 1])],
  ids=["float32-scalar", "jax-float-scalar", "int-shape-1", "int-shape-2"],
)
def test_a_formula_selecting_int_is_an_integer_scalar(value):
  """``adam_mode`` and the 0 / 1 flags accept an integer scalar array (``optax.inject_hyperparams``
  hands ints in as arrays), never a float array, even one that holds 1.0, nor an integer array of
  another shape: both would be read by ``int()`` (a float truncated, a shape dropped). Planted,
  the check's shape-and-dtype ``and`` as ``or`` accepted all four."""
  with _raises(TypeError, "adam_mode must be the int 0 or 1"):
    onnx_optax.ort_adamw(0.1, adam_mode=value)
  with _raises(TypeError, "correct_bias must be a bool (or the ONNX attribute's 0 / 1)"):
    onnx_optax.ort_adamw(0.1, adam_mode=1, correct_bias=value)
  assert onnx_optax.ort_adamw(0.1, adam_mode=np.int32(1), correct_bias=jnp.asarray(1)) is not None
