"""Checkpoints with Orbax (issue 5).

Orbax (``orbax-checkpoint``) is JAX's standard checkpointing library: the one
Flax, MaxText and the JAX documentation use; it saves any pytree of arrays
(our states are NamedTuples of arrays), keeps dtypes and shardings, and
restores onto a target described by ``jax.ShapeDtypeStruct``\\ s, so a
restore needs no live state. The states hold nothing else: no Python numbers,
no functions (hyperparameters live in the transform, or as arrays in
``optax.inject_hyperparams``' state), so there is nothing for a checkpoint to
miss.

The claim tested: training resumed from a checkpoint taken after step k
follows, to the bit, the trajectory of a run that never stopped. Both runs
execute the same compiled step on the same inputs, so bit-equality is the
honest expectation on any device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from rule_configs import RULE_CONFIGS, shaped

from onnx_optax import registry

ocp = pytest.importorskip(
  "orbax.checkpoint", reason="orbax-checkpoint is in the test extra: pip install onnx_optax[test]"
)

# Every configuration of every registered rule, the framework twins included.
CONFIGS = {k: (c.make, c.hyper, c.static_args) for k, c in RULE_CONFIGS.items()}
#: The rules whose learning rate only starts a state field (Rprop's step sizes) take a float, not
#: a schedule (the engine refuses one): their count is restored all the same.
AT_INIT = {k for k, c in RULE_CONFIGS.items() if not registry.get(c.rule).reads_learning_rate}
STEPS, K = 12, 5


def _setup(config, injected):
  make, hyper, static = CONFIGS[config]
  schedule = optax.exponential_decay(0.05, transition_steps=3, decay_rate=0.7)
  # A schedule, so that resuming must also restore the count it reads.
  factory = optax.inject_hyperparams(make, static_args=(*static, "state_dtype")) if injected else make
  opt = factory(float(schedule(0)) if config in AT_INIT else schedule, **hyper, state_dtype=jnp.float32)
  rng = np.random.default_rng(0)
  # A bfloat16 leaf with a float32 state: the checkpoint must keep both dtypes.
  params = {
    "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.bfloat16),
    "b": jnp.asarray(rng.normal(size=shaped(config, 3)), jnp.float32),
  }
  grads = [
    jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params) for _ in range(STEPS)
  ]

  @jax.jit
  def step(p, s, g):
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

  return opt, params, grads, step


def _assert_bitwise(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(
      np.asarray(x, np.float64) if x.dtype == jnp.bfloat16 else np.asarray(x),
      np.asarray(y, np.float64) if y.dtype == jnp.bfloat16 else np.asarray(y),
    )


@pytest.mark.parametrize("injected", [False, True], ids=["plain", "injected"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_resume_from_checkpoint_is_bitwise_identical(config, injected, tmp_path):
  opt, params, grads, step = _setup(config, injected)

  # The run that never stops.
  p, s = params, opt.init(params)
  uninterrupted = []
  for g in grads:
    p, s = step(p, s, g)
    uninterrupted.append((p, s))

  # Stop after step K, save, forget everything, restore, go on.
  p, s = params, opt.init(params)
  for g in grads[:K]:
    p, s = step(p, s, g)
  path = tmp_path / "ckpt"
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, {"params": p, "opt_state": s})
    checkpointer.wait_until_finished()
  saved = {"params": p, "opt_state": s}
  del p, s

  # The restore target comes from shapes alone: a fresh process has no state.
  target = jax.eval_shape(lambda: {"params": params, "opt_state": opt.init(params)})
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(path, target)
  _assert_bitwise(restored, saved)
  assert isinstance(restored["opt_state"], type(saved["opt_state"]))  # NamedTuples come back

  p, s = restored["params"], restored["opt_state"]
  for k, g in enumerate(grads[K:], start=K):
    p, s = step(p, s, g)
    _assert_bitwise((p, s), uninterrupted[k])
