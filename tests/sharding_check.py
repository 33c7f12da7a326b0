"""Sharded training with every configuration of every rule on 8 devices (run by test_sharding.py).

JAX fixes its device count when it starts, so this runs in a process of its
own, on 8 virtual CPU devices::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHONPATH=. python tests/sharding_check.py

(the flag is set here if the caller did not). It checks, for every rule and
with the hyperparameters plain and injected (``optax.inject_hyperparams``):

* Auto axes (``jax.sharding.AxisType.Auto``, the default): with parameters
  placed by ``NamedSharding`` (one leaf sharded over both mesh axes, one over
  one, one replicated), ``opt.init`` gives a state sharded like the
  parameters; a jitted step leaves the updates, the new parameters and the
  state sharded like the parameters; and the compiled program contains no
  collective (all-gather, all-reduce, reduce-scatter, all-to-all,
  collective-permute): every operation of every rule is element-wise, so each
  device updates its own shard.
* Explicit axes (``jax.sharding.AxisType.Explicit`` under ``jax.set_mesh``):
  the state's types (shape, dtype and sharding) after ``init``, eager and
  jitted, equal those after ``update`` and those of the parameters, so the
  state can be a ``jax.lax.scan`` carry.

Prints one ``ok`` line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import functools
import os
import re
import sys

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def _configs():
  """Every configuration of every registered rule (tests/rule_configs.py), the twins included."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from rule_configs import RULE_CONFIGS

  return {k: (c.make, c.hyper, c.static_args, c.rule) for k, c in RULE_CONFIGS.items()}


def _leaves(config):
  """The vectors ``b`` (8,) and ``c`` (3,) as ``config``'s rule takes a leaf (``shaped``: a rule of
  matrices, Muon's, gets (8, 1) along ``model`` and (3, 1) replicated; None: vectors), ``w``
  (16, 8) as it is."""
  from jax.sharding import PartitionSpec as P
  from rule_configs import shaped

  b, c = (shaped(config, s) if config is not None else s for s in ((8,), (3,)))
  specs = {"w": P("data", "model"), "b": P("model", *(None,) * (len(b) - 1)), "c": P()}
  return {"w": (16, 8), "b": b, "c": c}, specs


def main() -> int:
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  if jax.device_count() < 8:
    print(f"FAIL: need 8 devices, have {jax.device_count()} (XLA_FLAGS={os.environ.get('XLA_FLAGS')})")
    return 1

  def tree(config=None):
    """The parameters, their gradients and specs (as ``config``'s rule takes leaves, ``_leaves``)."""
    shapes, specs = _leaves(config)
    rng = np.random.default_rng(0)
    values = {k: rng.normal(size=shapes[k]).astype(np.float32) for k in ("w", "b", "c")}
    grad_values = {k: (0.5 * v + 0.1).astype(np.float32) for k, v in values.items()}
    return values, grad_values, specs

  # The closures below read these; each configuration rebinds them to its own leaves.
  values, grad_values, specs = tree()

  def check(condition, message):
    if not condition:
      raise AssertionError(message)

  def same_sharding(tree, params, what):
    for (path, leaf), p in zip(jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(params)):
      # A field of its own shape (Field.shape: one scalar per parameter, replicated; Adafactor's
      # factors, sharded as the parameter along the axes they keep: the explicit-axes check below
      # holds init's types to the update's) is on the parameter's devices; a parameter-shaped one
      # sharded like the parameter.
      own_shape = leaf.shape != p.shape
      check(
        (
          leaf.sharding.device_set == p.sharding.device_set
          and (what != "init state" or leaf.sharding.is_equivalent_to(placed_as(leaf, p), leaf.ndim))
        )
        if own_shape
        else leaf.sharding.is_equivalent_to(p.sharding, p.ndim),
        f"{what}{jax.tree_util.keystr(path)} is {leaf.sharding}, the parameter is {p.sharding}",
      )

  def placed_as(leaf, p):
    """Where init places a field of its own shape: a factored one (the parameter's axes, some of
    them 1) sharded as the parameter along the axes it keeps, any other replicated."""
    spec = tuple(p.sharding.spec) + (None,) * (p.ndim - len(p.sharding.spec))
    if leaf.ndim != p.ndim or any(n not in (m, 1) for n, m in zip(leaf.shape, p.shape)):
      spec = ()
    else:
      spec = tuple(a if n == m else None for a, n, m in zip(spec, leaf.shape, p.shape))
    return NamedSharding(p.sharding.mesh, P(*spec))

  def state_fields(state, injected):
    inner = state.inner_state if injected else state
    return list(inner[1:])  # the per-parameter trees, after the count

  def put_on(mesh, tree):
    return {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in tree.items()}

  def collectives(hlo):
    return sorted({c for c in COLLECTIVES if re.search(rf"\b{c}(-start)?\(", hlo)})

  # The detector must see a collective where there is one: a sum over a
  # sharded array needs an all-reduce.
  mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  w = jax.device_put(values["w"], NamedSharding(mesh, specs["w"]))
  summed = collectives(jax.jit(jnp.sum).lower(w).compile().as_text())
  check(summed, "the collective detector found nothing in a sharded sum")
  print(f"ok detector: a sharded sum compiles to {summed}")

  def check_config(opt, label, injected, reduces=False):
    # Auto axes.
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    put = functools.partial(put_on, mesh)
    params, grads = put(values), put(grad_values)
    state = opt.init(params)
    for field in state_fields(state, injected):
      same_sharding(field, params, "init state")

    def step(g, s, p):
      u, s = opt.update(g, s, p)
      return optax.apply_updates(p, u), u, s

    jitted = jax.jit(step)
    hlo = jitted.lower(grads, state, params).compile().as_text()
    found = collectives(hlo)
    # A rule whose step reduces over a whole tensor (Rule.reduces: Adafactor's norms and factored
    # means) needs the sharded parameter's other shards: its collectives are its arithmetic.
    check(not found or reduces, f"compiled step contains collectives {found}")
    p, s = params, state
    for _ in range(3):
      p, u, s = jitted(grads, s, p)
    same_sharding(p, params, "new params")
    same_sharding(u, params, "updates")
    for field in state_fields(s, injected):
      same_sharding(field, params, "updated state")
    print(f"ok auto {label}: state and updates sharded like the params, no collective")

    # Explicit axes.
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    with jax.set_mesh(mesh):
      put = functools.partial(put_on, mesh)
      params, grads = put(values), put(grad_values)
      param_types = jax.tree.map(jax.typeof, params)
      eager = opt.init(params)
      from_jit = jax.jit(opt.init)(params)
      types = jax.tree.map(jax.typeof, eager)
      check(
        jax.tree.map(jax.typeof, from_jit) == types,
        f"jit(init) types {jax.tree.map(jax.typeof, from_jit)} != init types {types}",
      )
      for field in state_fields(eager, injected):
        if jax.tree.map(jnp.shape, field) != jax.tree.map(jnp.shape, params):
          same_sharding(field, params, "init state (explicit axes)")  # a field of its own shape
          continue
        check(
          jax.tree.map(jax.typeof, field) == param_types,
          f"init state types {jax.tree.map(jax.typeof, field)} != parameter types {param_types}",
        )
      p, _, s = jax.jit(step)(grads, eager, params)
      check(
        jax.tree.map(jax.typeof, s) == types,
        f"state types after update {jax.tree.map(jax.typeof, s)} != after init {types}",
      )
      # So the state is a valid scan carry.
      body = lambda c, _: (step(grads, c[1], c[0])[::2], None)
      jax.jit(lambda c: jax.lax.scan(body, c, length=3))((params, eager))
    print(f"ok explicit {label}: state types after init == after update == param types {param_types}")

  failures = 0
  from onnx_optax import registry

  for name, (make, hyper, static, rule) in _configs().items():
    values, grad_values, specs = tree(name)
    for injected in (False, True):
      label = f"{name} {'injected' if injected else 'plain'}"
      opt = (optax.inject_hyperparams(make, static_args=static) if injected else make)(0.05, **hyper)
      try:
        check_config(opt, label, injected, registry.get(rule).reduces)
      except Exception as e:  # report every configuration, then fail
        failures += 1
        print(f"FAIL {label}: {type(e).__name__}: {e}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
