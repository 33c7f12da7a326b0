"""Every rule inside Flax NNX: ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` (issue 13).

A small MLP is trained with ``optimizer.update(model, grads)`` inside
``nnx.jit``, gradients from ``nnx.grad``. Each step is checked against the
NumPy reference (:mod:`onnx_optax.reference`, float64) applied to the same
inputs: the parameters, the optimizer state and ``T`` read from the model and
the optimizer before the step, the gradients the step computed. The allowed
difference is the conformance suite's per-element bound on the rounding error
of the rule's arithmetic in the dtype used (:mod:`onnx_optax.conformance.tolerance`,
derived in docs/conformance.md), plus that of the float64 reference; not a
fitted ``rtol``. Checking each step from the state before it keeps the bound
rigorous (errors of earlier steps are inputs, not accumulated slack).

Flax hands ``update`` the parameters (``tx.update(grads, state, params)``),
so the rules' ``norm_coefficient`` works; the model also holds a plain
``nnx.Variable`` that ``wrt=nnx.Param`` must leave alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from rule_configs import RULE_CONFIGS, elementwise, expectation

from onnx_optax import registry
from onnx_optax.conformance import tolerance

pytest.importorskip("flax", reason="flax is in the flax and test extras: pip install onnx_optax[flax]")
from flax import nnx  # noqa: E402

NAMES = sorted(RULE_CONFIGS)
STEPS = 4


class MLP(nnx.Module):
  """Two dense layers and a fixed output scale that is not a parameter; without biases for a rule
  of matrices only (``Rule.ranks``: Muon's kernels)."""

  def __init__(self, rngs: nnx.Rngs, dtype=jnp.float32, bias=True):
    self.hidden = nnx.Linear(5, 7, use_bias=bias, rngs=rngs, dtype=dtype, param_dtype=dtype)
    self.out = nnx.Linear(7, 3, use_bias=bias, rngs=rngs, dtype=dtype, param_dtype=dtype)
    self.scale = nnx.Variable(jnp.asarray(1.5, dtype))  # not an nnx.Param: not trained

  def __call__(self, x):
    return self.scale[...] * self.out(jax.nn.tanh(self.hidden(x)))


def _data(dtype):
  rng = np.random.default_rng(5)
  return jnp.asarray(rng.normal(size=(16, 5)), dtype), jnp.asarray(rng.normal(size=(16, 3)), dtype)


@nnx.jit
def _train_step(model, optimizer, x, y):
  loss = lambda m: jnp.mean((m(x) - y).astype(jnp.float32) ** 2)
  grads = nnx.grad(loss)(model)  # the nnx.Param leaves: nnx.grad's default wrt
  optimizer.update(model, grads)
  return nnx.as_pure(grads)


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _snapshot(model, optimizer):
  """(T, parameter leaves, one list of leaves per state tensor), as NumPy arrays."""
  state = nnx.as_pure(optimizer.opt_state)
  inner = state.inner_state if hasattr(state, "inner_state") else state
  params = _leaves(nnx.as_pure(nnx.state(model, nnx.Param)))
  return int(inner.count), params, [_leaves(field) for field in inner[1:]]


def _as64(x):
  return np.asarray(x, np.float64)


def _bound_hyper(hyper):
  """The hyperparameters as the conformance suite's bound models take them: its grid's. The twins'
  ``maximize`` is False in every test configuration (a sign the grid does not vary), PyTorch
  Adagrad's ``initial_accumulator_value`` is the state the step starts from, not a term of it,
  and ``decoupled_weight_decay`` is the bound's ``decoupled``."""
  out = {k: v for k, v in hyper.items() if k not in ("maximize", "initial_accumulator_value")}
  assert not hyper.get("maximize", False), "the bound models have no maximize"
  if "decoupled_weight_decay" in out:
    out["decoupled"] = out.pop("decoupled_weight_decay")
  return out


def _check_step(config, R, before, grads, after, *, dtype, state_dtype=None, hyper=None, impl=None):
  """The step from ``before`` with ``grads`` equals the reference within its bound.

  ``hyper``: the hyperparameters as the transform got them, from which the expectation is
  computed (default: the configuration's Python numbers); the bound charges the rounding of the
  configuration's Python numbers either way. ``impl``: the implementation's rounding context
  (default: the transform's in ``dtype`` with ``state_dtype``).
  """
  T, X, S = before
  T_after, X_after, S_after = after
  assert T_after == T + 1
  step, _ = expectation(config.rule)
  impl = impl or tolerance.implementation_context(dtype, state_dtype=state_dtype)
  ref = tolerance.reference_context()
  hyper = config.hyper if hyper is None else hyper
  for i, (x, g) in enumerate(zip(X, grads)):
    s = [_as64(field[i]) for field in S]
    # The gradient in its own dtype, as the transform got it (a float64 one is exact either way):
    # Muon forms its bfloat16 iteration's input in the gradient's arithmetic.
    expected = step(R, T, _as64(x), g, *s, **hyper)
    bound = [
      a + b
      for a, b in zip(
        tolerance.bounds(config.rule, impl, R, T, _as64(x), _as64(g), s, **_bound_hyper(config.hyper)),
        tolerance.bounds(config.rule, ref, R, T, _as64(x), _as64(g), s, **_bound_hyper(config.hyper)),
      )
    ]
    got = [X_after[i]] + [field[i] for field in S_after]
    for name, have, want, tol in zip(["X_new"] + [f"state {k}" for k in range(len(S))], got, expected, bound):
      assert np.all(np.isfinite(tol)), f"leaf {i} {name}: no finite bound, the check would be vacuous"
      excess = np.abs(_as64(have) - want) / np.maximum(tol, np.finfo(np.float64).tiny)
      assert np.all(np.abs(_as64(have) - want) <= tol), (
        f"{config.rule} T={T} leaf {i} {name}: {np.max(excess):.3g} times the rounding bound"
      )


@pytest.mark.parametrize("name", NAMES)
def test_nnx_optimizer_follows_the_reference(name):
  config = RULE_CONFIGS[name]
  model = MLP(nnx.Rngs(0), bias=elementwise(name))
  optimizer = nnx.Optimizer(model, config.make(config.learning_rate, **config.hyper), wrt=nnx.Param)
  assert isinstance(optimizer.opt_state, config.state_cls)
  x, y = _data(jnp.float32)
  before = _snapshot(model, optimizer)
  assert before[0] == config.first_count
  n_params = len(before[1])
  assert n_params == (4 if elementwise(name) else 2) and all(len(field) == n_params for field in before[2]), (
    "state only for the nnx.Params"
  )
  for _ in range(STEPS):
    grads = _leaves(_train_step(model, optimizer, x, y))
    after = _snapshot(model, optimizer)
    _check_step(config, config.learning_rate, before, grads, after, dtype=np.float32)
    assert any(np.any(a != b) for a, b in zip(before[1], after[1])), "the step did not move the parameters"
    before = after
  assert int(optimizer.step[...]) == STEPS
  assert float(model.scale[...]) == 1.5, "wrt=nnx.Param trained a plain nnx.Variable"


@pytest.mark.parametrize(
  # A rule whose learning rate only starts its state (Rprop) is held to that by
  # tests/test_optax_integration.py::test_a_rate_that_only_starts_the_state.
  "name",
  [n for n in NAMES if registry.get(RULE_CONFIGS[n].rule).reads_learning_rate],
)
def test_injected_learning_rate_changed_through_the_optimizer_state(name):
  config = RULE_CONFIGS[name]
  old, new = config.learning_rate, 3 * config.learning_rate
  tx = optax.inject_hyperparams(config.make, static_args=config.static_args)(old, **config.hyper)
  model = MLP(nnx.Rngs(1), bias=elementwise(name))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x, y = _data(jnp.float32)
  before = _snapshot(model, optimizer)
  for k in range(STEPS):
    if k == 2:
      # nnx.Optimizer keeps the Optax state as variables: write into one.
      optimizer.opt_state.hyperparams["learning_rate"][...] = new
      assert optimizer.opt_state.hyperparams["learning_rate"][...].dtype == jnp.float32
    R = old if k < 2 else new
    grads = _leaves(_train_step(model, optimizer, x, y))
    after = _snapshot(model, optimizer)
    # Injected, every hyperparameter is a float32 array: a twin computes 1 - beta from that
    # number, not from the Python float its framework would subtract from in float64.
    _check_step(config, R, before, grads, after, dtype=np.float32, hyper=config.injected())
    if k == 2:
      # The check can tell the rates apart: the old one is far outside the bound.
      with pytest.raises(AssertionError, match="times the rounding bound"):
        _check_step(config, old, before, grads, after, dtype=np.float32, hyper=config.injected())
    before = after


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", NAMES)
def test_state_dtype_keeps_a_float32_state_for_half_precision_params(name, dtype):
  config = RULE_CONFIGS[name]
  model = MLP(nnx.Rngs(2), dtype=dtype, bias=elementwise(name))
  tx = config.make(config.learning_rate, **config.hyper, state_dtype=jnp.float32)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x, y = _data(dtype)
  before = _snapshot(model, optimizer)
  for _ in range(STEPS):
    grads = _leaves(_train_step(model, optimizer, x, y))
    after = _snapshot(model, optimizer)
    assert all(p.dtype == dtype for p in after[1])
    assert all(s.dtype == np.float32 for field in after[2] for s in field)
    assert all(g.dtype == dtype for g in grads)
    if config.rule != "keras_adam":
      _check_step(config, config.learning_rate, before, grads, after, dtype=dtype, state_dtype=np.float32)
    else:
      _check_keras_half_step(config, before, grads, after, dtype)
    before = after


def _check_keras_half_step(config, before, grads, after, dtype):
  """Keras's Adam computes in the variable's dtype (``square(g)``, and its ``alpha`` from
  ``cast(beta_2) ** local_step``, ``1 - ...``): the float32 bound of a float32 state does not
  hold, the betas are those the 16-bit dtype holds. bfloat16 holds ``beta_2 = 0.999`` as 1.0, so
  ``alpha`` is 0 and the parameters stay where they are, as Keras's own Adam's do (the twins accept
  a decay that stalls in a 16-bit dtype: their policy declares it), while the moments move.
  float16 holds it as 0.99902 (a bias correction 2.4% smaller than 0.999's): the parameters move
  as DirectML's step with ``alpha`` from the float16 betas and learning rate, within 8 float16
  roundings of ``alpha``, one of ``square(g)`` and two of ``X + U`` (``U`` half a float16
  subnormal where it underflows); the moments, stored in float32, within 4 float32 roundings
  (``g g`` one float16 rounding more, or half a subnormal)."""
  T, X, S = before
  X_after, S_after = after[1], after[2]
  if dtype == jnp.bfloat16:
    assert float(np.asarray(config.hyper["beta_2"], jnp.bfloat16)) == 1.0
    for a, b in zip(X, X_after):
      np.testing.assert_array_equal(a, b)
    assert any(np.any(a != b) for a, b in zip(S[0], S_after[0])), "the moments did not move"
    return
  h = config.hyper
  b1, b2, lr = (float(np.float16(v)) for v in (h["beta_1"], h["beta_2"], config.learning_rate))
  alpha = lr * np.sqrt(1 - b2 ** (T + 1)) / (1 - b1 ** (T + 1))
  u16, u32 = 2.0**-11, 2.0**-24
  for i, (x, g) in enumerate(zip(X, grads)):
    x, g, m, v = _as64(x), _as64(g), _as64(S[0][i]), _as64(S[1][i])
    m_new = m + (g - m) * (1 - h["beta_1"])
    v_new = v + (g * g - v) * (1 - h["beta_2"])
    np.testing.assert_array_less(
      np.abs(_as64(S_after[0][i]) - m_new), 4 * u32 * (np.abs(m) + np.abs(g)) + 1e-300
    )
    # g g rounded in float16, half its least subnormal (2^-25) where it underflows.
    tol_v = (u16 * (g * g) + 2.0**-25) * (1 - h["beta_2"]) + 4 * u32 * (g * g + v)
    np.testing.assert_array_less(np.abs(_as64(S_after[1][i]) - v_new), tol_v + 1e-300)
    step = alpha * m_new / (np.sqrt(v_new) + h["epsilon"])
    tol = (8 + 1) * u16 * np.abs(step) + 2 * u16 * (np.abs(x) + np.abs(step)) + 2.0**-25
    np.testing.assert_array_less(np.abs(_as64(X_after[i]) - (x - step)), tol + 1e-300, err_msg=f"leaf {i}")
