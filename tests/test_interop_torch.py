"""onnx_optax.interop against PyTorch's own SGD and Adagrad.

Every expectation is PyTorch: a run of N + M ``optimizer.step()`` calls. The
bridged runs take N steps in PyTorch and M in JAX (``from_torch``), or N in
JAX and M in PyTorch (``to_torch``), and must end at PyTorch's parameters and
state: to 1e-12 relative in float64, and within the float32 bound derived in
:func:`momentum_bound` and :func:`adagrad_bound`.

Gradients are fixed random arrays (not functions of the parameters), so that
the runs differ only by the optimizers; the parameters still feed back
through ``weight_decay``.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch_runs
from interop_data import gradients, initial
from torch_runs import GROUPS, jax_steps, like, torch_parameters

import onnx_optax
from onnx_optax.interop import from_torch, to_torch, torch_params


def _state(opt, p):
  """``(momentum_buffer or sum, step)`` of one parameter; Nones where PyTorch keeps none."""
  slot = opt.state.get(p, {})
  tensor = slot.get("momentum_buffer", slot.get("sum"))
  step = slot.get("step")
  return None if tensor is None else tensor.detach().numpy().copy(), None if step is None else float(step)


torch_steps = functools.partial(torch_runs.torch_steps, state_of=_state)


# --- the optimizers, every hyperparameter away from its default -------------


def sgd(ps, **overrides):
  groups = [
    dict(
      params=[ps[i] for i in GROUPS[0]],
      lr=0.05,
      momentum=0.9,
      dampening=0.3,
      weight_decay=0.01,
      maximize=True,
    ),
    dict(params=[ps[i] for i in GROUPS[1]], lr=0.02, momentum=0.5, nesterov=True, weight_decay=0.03),
  ]
  return torch.optim.SGD(groups, **overrides)


def sgd_plain(ps, **overrides):
  # momentum = 0: PyTorch ignores dampening and keeps no buffer.
  return torch.optim.SGD(ps, lr=0.1, momentum=0.0, dampening=0.7, weight_decay=0.02, **overrides)


def adagrad(ps, **overrides):
  groups = [
    dict(
      params=[ps[i] for i in GROUPS[0]], lr=0.3, lr_decay=0.05, eps=1e-3, weight_decay=0.02, maximize=True
    ),
    dict(params=[ps[i] for i in GROUPS[1]], lr=0.1, eps=1e-6),
  ]
  return torch.optim.Adagrad(groups, initial_accumulator_value=0.25, **overrides)


OPTIMIZERS = {"sgd": sgd, "sgd_plain": sgd_plain, "adagrad": adagrad}


# --- the float32 bounds -----------------------------------------------------

U32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff


def _groups_of(opt):
  return [group for group in opt.param_groups for _ in group["params"]]


def momentum_bound(opt64, x0, grads, records, u=U32):
  """Per leaf, twice a first-order bound on one float32 SGD run's distance from exact.

  Exact means the float64 run (``records``, from PyTorch) of the same float32
  inputs. With ``s = -1`` for ``maximize``, ``a = momentum``, ``b = 1 -
  dampening`` (1 at a parameter's first step), each rounding is at most ``u``
  relative, and so is each hyperparameter's conversion to float32. Step by
  step, with ``e`` each quantity's accumulated error::

      G  = s g + wd x            eG = wd eX + 2u (|g| + wd |x|)
      V  = a V + b G             eV = a eV + b eG + 3u (a |V_prev| + b |G|)
                                 (the first step copies G: eV = eG)
      D  = V  or  G + a V        eD = eV  or  eG + a eV + 2u (|G| + a |V|)
      x' = x - lr D              eX = eX + lr eD + 3u (|x'| + lr |D|)

  Both PyTorch and the transform are within ``eX`` of exact (products of
  errors, ``O(u^2)``, are left out: with these ten steps they are below
  1e-6 of the bound), so they are within ``2 eX`` of each other.
  """
  groups = _groups_of(opt64)
  xs = [x0] + [r[0] for r in records]
  Vs = [[None] * len(x0)] + [[v for v, _ in r[1]] for r in records]
  bounds = []
  for i, group in enumerate(groups):
    s = -1.0 if group["maximize"] else 1.0
    a, wd, lr = group["momentum"], group["weight_decay"], group["lr"]
    eX = eV = np.zeros_like(x0[i])
    for t in range(len(grads)):
      x, g, x_new = xs[t][i], grads[t][i], xs[t + 1][i]
      G = s * g + wd * x
      eG = wd * eX + 2 * u * (np.abs(g) + wd * np.abs(x))
      first = Vs[t][i] is None
      V = G if a == 0 else Vs[t + 1][i]
      if a == 0 or first:
        eV = eG
      else:
        b = 1 - group["dampening"]
        eV = a * eV + b * eG + 3 * u * (a * np.abs(Vs[t][i]) + b * np.abs(G))
      if group["nesterov"]:
        D, eD = G + a * V, eG + a * eV + 2 * u * (np.abs(G) + a * np.abs(V))
      else:
        D, eD = V, eV
      eX = eX + lr * eD + 3 * u * (np.abs(x_new) + lr * np.abs(D))
    bounds.append(2 * eX)
  return bounds


def adagrad_bound(opt64, x0, grads, records, u=U32, first_T=None):
  """Per leaf, twice a first-order bound on one float32 Adagrad run's distance from exact.

  As in :func:`momentum_bound`, against the float64 run; ``T`` is the step
  count before the update and ``H`` starts at ``initial_accumulator_value``::

      G  = s g + wd x                 eG = wd eX + 2u (|g| + wd |x|)
      H' = H + G G                    eH = eH + 2 |G| eG + 3u H'
      d  = sqrt(H') + eps             ed = eH / (2 sqrt(H')) + 3u d
      r  = lr / (1 + T lr_decay)      er = 5u r   (PyTorch: in float64, then
                                                  rounded; the transform: float32)
      q  = r G / d                    eq = (r / d) eG + |q| (er / r + ed / d + 3u)
      x' = x - q                      eX = eX + eq + 2u (|x'| + |q|)

  and the two runs are within ``2 eX`` of each other (products of errors
  left out, as there).
  """
  groups = _groups_of(opt64)
  xs = [x0] + [r[0] for r in records]
  Hs = [[r[1][i][0] for i in range(len(x0))] for r in records]
  Ts = [[r[1][i][1] for i in range(len(x0))] for r in records]
  bounds = []
  for i, group in enumerate(groups):
    s = -1.0 if group["maximize"] else 1.0
    wd, lr, decay, eps = group["weight_decay"], group["lr"], group["lr_decay"], group["eps"]
    eX = eH = np.zeros_like(x0[i])
    for t in range(len(grads)):
      x, g, x_new, H = xs[t][i], grads[t][i], xs[t + 1][i], Hs[t][i]
      T = Ts[t][i] - 1  # PyTorch's step after the update, minus one
      G = s * g + wd * x
      eG = wd * eX + 2 * u * (np.abs(g) + wd * np.abs(x))
      eH = eH + 2 * np.abs(G) * eG + 3 * u * H
      d = np.sqrt(H) + eps
      ed = np.where(H > 0, eH / (2 * np.sqrt(np.where(H > 0, H, 1))), np.sqrt(eH)) + 3 * u * d
      r = lr / (1 + T * decay)
      q = r * G / d
      eq = r / d * eG + np.abs(q) * (5 * u + ed / d + 3 * u)
      eX = eX + eq + 2 * u * (np.abs(x_new) + np.abs(q))
    bounds.append(2 * eX)
  return bounds


BOUNDS = {"sgd": momentum_bound, "sgd_plain": momentum_bound, "adagrad": adagrad_bound}


# --- the runs ----------------------------------------------------------------


def assert_close(actual, expected, bound, what):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
  err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
  worst = np.max(err - bound) if err.size else -1.0
  assert worst <= 0, f"{what}: error {np.max(err)} over the bound {bound}"


def tolerance64(expected):
  return [1e-12 * max(np.max(np.abs(e)), 1.0) for e in expected]


def reference_run(name, dtype, steps, missing=()):
  """PyTorch alone: ``steps`` steps; the records of a float64 run of the same inputs."""
  make = OPTIMIZERS[name]
  x0, grads = initial(dtype), gradients(steps, dtype)
  ps = torch_parameters(x0)
  opt = make(ps)
  records = torch_steps(opt, ps, grads, missing)
  x0_64 = [x.astype(np.float64) for x in x0]
  grads64 = [[g.astype(np.float64) for g in step] for step in grads]
  ps64 = torch_parameters(x0_64)
  opt64 = make(ps64)
  records64 = torch_steps(opt64, ps64, grads64, missing)
  return x0, grads, records, (opt64, x0_64, grads64, records64)


def expected_bounds(name, dtype, run64):
  if dtype == np.float64:
    return None
  return BOUNDS[name](*run64)


def check_final(name, dtype, params_list, state_list, records, run64):
  """The bridged run's parameters and state against PyTorch's after the last step."""
  final_x, final_state = records[-1]
  bounds = expected_bounds(name, dtype, run64)
  xs_tol = tolerance64(final_x) if bounds is None else bounds
  for i, (x, expected, tol) in enumerate(zip(params_list, final_x, xs_tol)):
    assert_close(x, expected, tol, f"parameter {i}")
  for i, (got, (expected, step)) in enumerate(zip(state_list, final_state)):
    if expected is None:  # plain SGD: no buffer in PyTorch
      continue
    got_tensor, got_step = got
    if step is not None:
      assert got_step == step, f"step of parameter {i}"
    if bounds is None:
      assert_close(got_tensor, expected, 1e-12 * max(np.max(np.abs(expected)), 1.0), f"state {i}")
    else:
      # The state's own error is not what the bound bounds; 1e-3 relative
      # is far above float32 rounding over ten steps, far below any
      # mistake in the mapping (a missing maximize flips signs, a dropped
      # dampening changes V by 30%).
      assert_close(got_tensor, expected, 1e-3 * np.abs(expected) + 1e-6, f"state {i}")


def carried_from_torch(name, dtype, N, M, missing=()):
  """N steps in PyTorch, ``from_torch``, M steps in JAX: the final params and state."""
  x0, grads, records, run64 = reference_run(name, dtype, N + M, missing)
  ps = torch_parameters(x0)
  opt = OPTIMIZERS[name](ps)
  torch_steps(opt, ps, grads[:N], missing)
  params = torch_params(opt, like(dtype))
  tx, state = from_torch(opt, params)
  params, state = jax_steps(tx, state, params, grads[N:])
  # Read the JAX state through to_torch into a fresh optimizer: PyTorch's
  # own layout, compared with PyTorch's own state.
  ps2 = torch_parameters(x0)
  opt2 = OPTIMIZERS[name](ps2)
  to_torch(state, opt2, params)
  return params, opt2, ps2, records, run64


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("N, M", [(3, 5), (0, 6), (6, 1)])
def test_from_torch_float64(name, N, M):
  with jax.enable_x64(True):
    params, opt2, ps2, records, run64 = carried_from_torch(name, np.float64, N, M)
    check_final(
      name,
      np.float64,
      [np.asarray(x) for x in jax.tree.leaves(params)],
      [_tensor_and_step(opt2, p) for p in ps2],
      records,
      run64,
    )


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_from_torch_float32(name):
  params, opt2, ps2, records, run64 = carried_from_torch(name, np.float32, 4, 6)
  check_final(
    name,
    np.float32,
    [np.asarray(x) for x in jax.tree.leaves(params)],
    [_tensor_and_step(opt2, p) for p in ps2],
    records,
    run64,
  )


def _tensor_and_step(opt, p):
  slot = opt.state.get(p, {})
  tensor = slot.get("momentum_buffer", slot.get("sum"))
  step = slot.get("step")
  return (None if tensor is None else tensor.detach().numpy(), None if step is None else float(step))


def carried_to_torch(name, dtype, N, M):
  """N steps in JAX (from a fresh optimizer), ``to_torch``, M steps in PyTorch."""
  x0, grads, records, run64 = reference_run(name, dtype, N + M)
  ps = torch_parameters(x0)
  opt = OPTIMIZERS[name](ps)
  params = torch_params(opt, like(dtype))
  tx, state = from_torch(opt, params)
  params, state = jax_steps(tx, state, params, grads[:N])
  to_torch(state, opt, params)
  torch_steps(opt, ps, grads[N:])
  return ([p.detach().numpy() for p in ps], [_tensor_and_step(opt, p) for p in ps], records, run64)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("N, M", [(3, 5), (0, 6), (6, 0)])
def test_to_torch_float64(name, N, M):
  with jax.enable_x64(True):
    xs, states, records, run64 = carried_to_torch(name, np.float64, N, M)
    check_final(name, np.float64, xs, states, records, run64)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_to_torch_float32(name):
  xs, states, records, run64 = carried_to_torch(name, np.float32, 4, 6)
  check_final(name, np.float32, xs, states, records, run64)


def test_to_torch_at_count_zero_takes_the_undamped_first_step():
  """A state at ``count = 0`` loads as no buffer: PyTorch's next step is its first, ``buf = g``.

  By hand: ``w = [1, 2]``, ``lr = 0.1``, ``g = [1, -1]``: the first step is
  ``w - lr g = [0.9, 2.1]``; a zero buffer would damp it to ``w - lr (1 -
  dampening) g = [0.93, 2.07]``. The optimizer had a buffer from an earlier
  step, which the count-0 state must remove.
  """
  w = torch.nn.Parameter(torch.tensor([5.0, 5.0]))
  opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, dampening=0.3)
  w.grad = torch.tensor([3.0, 3.0])
  opt.step()
  assert "momentum_buffer" in opt.state[w]
  params = [jnp.array([1.0, 2.0])]
  fresh = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9, dampening=0.3)
  _, state = from_torch(fresh, params)  # never stepped: count 0
  to_torch(state, opt, params)
  assert "momentum_buffer" not in opt.state[w]
  w.grad = torch.tensor([1.0, -1.0])
  opt.step()
  np.testing.assert_allclose(w.detach().numpy(), [0.9, 2.1], rtol=1e-7)
  np.testing.assert_array_equal(opt.state[w]["momentum_buffer"].numpy(), [1.0, -1.0])


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_parameters_at_different_steps(name):
  """Leaves that missed steps in PyTorch (no grad): SGD without a buffer, Adagrad at a lower step."""
  missing = {(0, 1), (1, 1), (0, 3)}  # leaf 1 gets its first grad at step 2, leaf 3 at step 1
  with jax.enable_x64(True):
    params, opt2, ps2, records, run64 = carried_from_torch(name, np.float64, 2, 4, missing)
    check_final(
      name,
      np.float64,
      [np.asarray(x) for x in jax.tree.leaves(params)],
      [_tensor_and_step(opt2, p) for p in ps2],
      records,
      run64,
    )


def test_parameters_at_different_steps_get_their_own_transforms():
  ps = torch_parameters(initial(np.float32))
  opt = sgd(ps)
  torch_steps(opt, ps, gradients(1, np.float32), missing={(0, 1)})
  tx, state = from_torch(opt, torch_params(opt, like(jnp.float32)))

  def rule_state(inner):  # maximize chains a negation before the rule
    return inner if isinstance(inner, onnx_optax.PyTorchSGDState) else inner[-1]

  counts = {label: int(rule_state(s.inner_state).count) for label, s in state.inner_states.items()}
  assert counts == {"group0.T0": 0, "group0.T1": 1, "group1": 1}


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("options", [dict(foreach=True), dict(foreach=False), dict(fused=True)])
def test_kernels_are_the_same_rule(name, options):
  """foreach and fused are PyTorch's kernels for the same update: accepted and carried exactly."""
  with jax.enable_x64(True):
    x0, grads = initial(np.float64), gradients(5, np.float64)
    ps_ref = torch_parameters(x0)
    opt_ref = OPTIMIZERS[name](ps_ref, **options)
    torch_steps(opt_ref, ps_ref, grads)
    ps = torch_parameters(x0)
    opt = OPTIMIZERS[name](ps, **options)
    torch_steps(opt, ps, grads[:2])
    params = torch_params(opt, like(jnp.float64))
    tx, state = from_torch(opt, params)
    params, _ = jax_steps(tx, state, params, grads[2:])
    for x, p in zip(jax.tree.leaves(params), ps_ref):
      np.testing.assert_allclose(x, p.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_scheduler_with_learning_rate_schedule():
  """A StepLR run continued in JAX with the same schedule shifted by the steps taken."""
  N, M = 3, 5
  with jax.enable_x64(True):
    x0, grads = initial(np.float64), gradients(N + M, np.float64)

    def run(ps, grads):
      opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
      sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
      for step_grads in grads:
        torch_steps(opt, ps, [step_grads])
        sched.step()
      return opt

    ps_ref = torch_parameters(x0)
    run(ps_ref, grads)
    ps = torch_parameters(x0)
    opt = run(ps, grads[:N])
    params = torch_params(opt, like(jnp.float64))
    with pytest.raises(ValueError, match="'initial_lr': a learning-rate scheduler is attached"):
      from_torch(opt, params)

    def torch_lr(step):  # StepLR(step_size=2, gamma=0.5) after `step` steps, in float64
      return jnp.float64(0.1) * jnp.float64(0.5) ** (step // 2)

    tx, state = from_torch(opt, params, learning_rate=lambda n: torch_lr(n + N))
    params, state = jax_steps(tx, state, params, grads[N:])
    for x, p in zip(jax.tree.leaves(params), ps_ref):
      np.testing.assert_allclose(x, p.detach().numpy(), rtol=1e-12)
    # Back to the scheduled optimizer: to_torch writes no learning rate, so the scheduler is no
    # reason to refuse.
    to_torch(state, opt, params)
    for x, p in zip(jax.tree.leaves(params), ps):
      np.testing.assert_array_equal(x, p.detach().numpy())


def test_learning_rate_per_group():
  ps = torch_parameters(initial(np.float32))
  opt = sgd(ps)
  params = torch_params(opt, like(jnp.float32))
  tx, state = from_torch(opt, params, learning_rate=[0.5, 0.0])
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, state, params)
  # Group 1 (p2, p3) has learning rate 0: no update at all.
  assert float(jnp.abs(updates[2]).max()) == 0 and float(jnp.abs(updates[3]).max()) == 0
  # Group 0 at T = 0 with maximize: -(lr) * (-1 + wd * x).
  expected = -0.5 * (-1.0 + 0.01 * params[0])
  np.testing.assert_allclose(updates[0], expected, rtol=1e-6)
  with pytest.raises(ValueError, match="learning_rate has 3 entries but the optimizer has 2 param groups"):
    from_torch(opt, params, learning_rate=[0.1, 0.2, 0.3])


def test_single_group_returns_the_plain_transform():
  ps = torch_parameters(initial(np.float32))
  opt = torch.optim.Adagrad(ps, lr=0.1)
  tx, state = from_torch(opt, torch_params(opt, like(jnp.float32)))
  assert isinstance(state, onnx_optax.PyTorchAdagradState) and int(state.count) == 0


# --- refusals ----------------------------------------------------------------


def _params32():
  ps = torch_parameters(initial(np.float32))
  return ps, like(jnp.float32)


@pytest.mark.parametrize(
  "cls, why",
  [
    (torch.optim.LBFGS, "its step calls a closure that re-evaluates the loss"),
    (torch.optim.SparseAdam, "it updates only the rows a sparse gradient touches"),
  ],
)
def test_refuses_other_optimizers(cls, why):
  """The classes no rule binds are refused with the reason, and the refusal lists every class the
  registry binds (read from the registry: a new binding changes nothing here)."""
  from onnx_optax.interop._torch_optim import listed, twins

  ps, structure = _params32()
  mapped = listed([f"torch.optim.{name} (onnx_optax.{rule.name})" for name, rule in twins().items()])
  with pytest.raises(TypeError) as refusal:
    from_torch(cls(ps), torch_params(torch.optim.SGD(ps), structure))
  message = str(refusal.value)
  assert message.startswith(f"no onnx_optax rule is {cls.__module__}.{cls.__qualname__} (")
  assert why in message and message.endswith(f": the PyTorch bridges map {mapped}")
  assert "torch.optim.RMSprop (onnx_optax.pytorch_rmsprop)" in mapped


def test_refusals_list_the_classes_in_english():
  """The refusals name the classes the registry binds, as a list read aloud, for any number of
  them (four today: ``listed`` is not reached with one or two through a refusal)."""
  from onnx_optax.interop._torch_optim import listed

  assert listed([]) == ""
  assert listed(["SGD"]) == "SGD"
  assert listed(["Adam", "AdamW"], "or") == "Adam or AdamW"
  assert listed(["SGD", "Adagrad", "Adam"]) == "SGD, Adagrad and Adam"


def test_refuses_subclasses():
  class MySGD(torch.optim.SGD):
    pass

  ps, structure = _params32()
  with pytest.raises(TypeError, match="subclasses a PyTorch optimizer"):
    from_torch(MySGD(ps, lr=0.1), structure)


def test_refuses_nesterov_with_dampening():
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)
  opt.param_groups[0]["dampening"] = 0.1  # PyTorch's constructor refuses it; an edit does not
  with pytest.raises(ValueError, match="nesterov=True with momentum=0.9 and dampening=0.1"):
    from_torch(opt, torch_params(torch.optim.SGD(ps), structure))


def test_refuses_unknown_options():
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
  torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)  # cycles momentum too
  with pytest.raises(ValueError, match=r"options \[.*'max_lr'.*\] that torch.optim.SGD does not have"):
    from_torch(opt, structure, learning_rate=0.1)


def test_refuses_differentiable():
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9, differentiable=True)
  with pytest.raises(ValueError, match="differentiable=True"):
    from_torch(opt, structure)


def test_refuses_mismatched_params():
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1)
  params = [jnp.zeros(v.shape, v.dtype) for v in structure]
  with pytest.raises(
    ValueError,
    match=r"params\[1\] has shape \(4, 2\) but the PyTorch "
    r"param_groups\[0\]\['params'\]\[1\] has shape \(2, 4\)",
  ):
    from_torch(opt, [params[0], jnp.zeros((4, 2)), *params[2:]])
  with pytest.raises(ValueError, match=r"params\[2\] has dtype float16 but .* has dtype float32"):
    from_torch(opt, [*params[:2], jnp.zeros((), jnp.float16), params[3]])
  with pytest.raises(ValueError, match="params has 3 leaves but the PyTorch optimizer has 4"):
    from_torch(opt, params[:3])


def test_names_named_parameters():
  layer = torch.nn.Linear(2, 1)
  opt = torch.optim.SGD(layer.named_parameters(), lr=0.1)
  with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\] \('bias'\)"):
    from_torch(opt, [jnp.zeros((1, 2)), jnp.zeros((2,))])


def test_to_torch_refuses_before_writing():
  ps, structure = _params32()
  opt = sgd(ps)
  grads = gradients(2, np.float32)
  torch_steps(opt, ps, grads)
  before = [(p.detach().clone(), opt.state[p]["momentum_buffer"].clone()) for p in ps]
  params = torch_params(opt, structure)
  tx, state = from_torch(opt, params)
  ada_state = from_torch(torch.optim.Adagrad(ps), params)[1]
  with pytest.raises(
    TypeError,
    match="state holds a PyTorchAdagradState, this optimizer needs PyTorchSGDState or MomentumState",
  ):
    to_torch(ada_state, opt, params)
  wide = jax.tree.map(lambda x: x.astype(jnp.float16) if x.dtype == jnp.float32 else x, state)
  with pytest.raises(
    ValueError,
    match=r"the state of param_groups\[0\]\['params'\]\[0\] has shape "
    r"\(3,\) and dtype float16",
  ):
    to_torch(wide, opt, params)
  with pytest.raises(ValueError, match=r"params\[0\] has shape \(4,\)"):
    to_torch(state, opt, [jnp.zeros(4), *params[1:]])
  for p, (x, buffer) in zip(ps, before):
    assert torch.equal(p.detach(), x) and torch.equal(opt.state[p]["momentum_buffer"], buffer)


def test_import_needs_neither_torch_nor_keras():
  """``import onnx_optax.interop`` imports neither; a call without torch says what to install.

  Run in a fresh interpreter: this process has imported torch already.
  """
  code = textwrap.dedent("""
      import sys
      import onnx_optax, onnx_optax.interop
      assert "torch" not in sys.modules and "keras" not in sys.modules, "imported eagerly"
      sys.modules["torch"] = None  # as if torch were not installed
      try:
        onnx_optax.interop.from_torch(object(), [])
      except ImportError as error:
        print(error)
      sys.modules["keras"] = None
      try:
        onnx_optax.interop.from_keras(object(), [])
      except ImportError as error:
        print(error)
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert "needs torch, which is not installed: pip install 'onnx_optax[interop]'" in out.stdout
  assert "needs keras, which is not installed: pip install 'onnx_optax[interop]'" in out.stdout


def test_adagrad_param_group_added_later():
  """A group added after the constructor has no state until its first step: T = 0, H from the defaults."""
  with jax.enable_x64(True):
    x0, grads = initial(np.float64)[:2], [g[:2] for g in gradients(6, np.float64)]

    def run(ps, steps, grads):
      opt = torch.optim.Adagrad([ps[0]], lr=0.2, initial_accumulator_value=0.3)
      torch_steps(opt, ps[:1], [g[:1] for g in grads[:2]])
      opt.add_param_group({"params": [ps[1]], "lr": 0.05, "lr_decay": 0.1})
      torch_steps(opt, ps, grads[2:steps])
      return opt

    ps_ref = torch_parameters(x0)
    run(ps_ref, 6, grads)
    ps = torch_parameters(x0)
    opt = run(ps, 2, grads)
    assert "sum" not in opt.state[ps[1]]  # what this test is about
    params = torch_params(opt, [jax.ShapeDtypeStruct(x.shape, jnp.float64) for x in x0])
    tx, state = from_torch(opt, params)
    params, _ = jax_steps(tx, state, params, grads[2:])
    for x, p in zip(params, ps_ref):
      np.testing.assert_allclose(x, p.detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_state_round_trips_bit_for_bit(dtype):
  ps = [torch.nn.Parameter(torch.randn(5, generator=torch.Generator().manual_seed(0)).to(dtype))]
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
  ps[0].grad = torch.randn(5, generator=torch.Generator().manual_seed(1)).to(dtype)
  opt.step()
  name = str(dtype).removeprefix("torch.")
  params = torch_params(opt, [jax.ShapeDtypeStruct((5,), jnp.dtype(name))])
  assert np.array_equal(np.asarray(params[0], np.float32), ps[0].detach().float().numpy())
  tx, state = from_torch(opt, params)
  assert state.momentum_buffer[0].dtype == jnp.dtype(name)
  ps2 = [torch.nn.Parameter(torch.zeros(5, dtype=dtype))]
  opt2 = torch.optim.SGD(ps2, lr=0.1, momentum=0.9)
  to_torch(state, opt2, params)
  assert torch.equal(opt2.state[ps2[0]]["momentum_buffer"], opt.state[ps[0]]["momentum_buffer"])
  assert torch.equal(ps2[0], ps[0]) and opt2.state[ps2[0]]["momentum_buffer"].dtype == dtype


# ----------------------------------------------------------------------------
# What a PyTorch user holds: tensors, named_parameters(), no `like` at all


def _mlp():
  torch.manual_seed(0)
  return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()


def test_torch_params_takes_tensors_or_nothing():
  """``list(model.parameters())`` and ``like=None`` give the weights, exactly, in the optimizer's order."""
  with jax.enable_x64(True):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    want = [p.detach().numpy() for p in model.parameters()]
    for params in (torch_params(opt, list(model.parameters())), torch_params(opt)):
      assert isinstance(params, list)
      for x, w in zip(params, want, strict=True):
        assert x.dtype == jnp.float64 and np.array_equal(np.asarray(x), w)
  # float64 without x64 would be truncated: refused, with the fix.
  with pytest.raises(ValueError, match="jax_enable_x64"):
    torch_params(opt)


def test_torch_params_places_the_optimizers_own_tensors_by_identity():
  """``dict(model.named_parameters())`` sorts its keys ('10' before '2'): each tensor lands on itself.

  Same shapes throughout, so only the tensors' identity tells the order (a
  match by position would put parameter 10's values at key '2').
  """
  with jax.enable_x64(True):
    ps = torch.nn.ParameterList([torch.nn.Parameter(torch.full((3,), float(i))) for i in range(11)])
    opt = torch.optim.SGD(ps.parameters(), lr=0.1)
    like = dict(ps.named_parameters())
    assert jax.tree.leaves(like)[2] is ps[10]  # sorted keys: not the optimizer's order
    params = torch_params(opt, like)
    for name, p in ps.named_parameters():
      np.testing.assert_array_equal(np.asarray(params[name]), p.detach().numpy(), err_msg=name)
    # Some of the optimizer's tensors beside other leaves: nothing places them.
    with pytest.raises(ValueError, match=r"like holds some of the optimizer's parameters but not each"):
      torch_params(opt, dict(like, **{"0": jax.ShapeDtypeStruct((3,), jnp.float32)}))
    with pytest.raises(ValueError, match=r"like holds some of the optimizer's parameters but not each"):
      torch_params(opt, dict(like, extra=jax.ShapeDtypeStruct((3,), jnp.float32)))  # each, and one more


def test_named_parameters_are_matched_by_name():
  """An optimizer built from ``named_parameters()``: dicts keyed by those names, in any order.

  N = 2 SGD steps in PyTorch, ``from_torch`` on the dict that ``torch_params``
  returns, M = 3 steps in JAX, ``to_torch`` (state alone, then weights) and
  one more PyTorch step: equal to the all-PyTorch run of 6 steps (float64,
  1e-12). Leaves sorted by name ('0.bias' first) are not the optimizer's
  order (weight first), so a match by position would fail on shapes.
  """
  with jax.enable_x64(True):
    model, ref = _mlp(), _mlp()
    x = torch.linspace(-1, 1, 15, dtype=torch.float64).reshape(5, 3)

    def loss(m):
      return (m(x) ** 2).mean()

    def torch_step(m, opt):
      opt.zero_grad()
      loss(m).backward()
      opt.step()

    make = lambda m: torch.optim.SGD(
      m.named_parameters(), lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.01
    )
    opt, opt_ref = make(model), make(ref)
    for _ in range(6):
      torch_step(ref, opt_ref)
    for _ in range(2):
      torch_step(model, opt)

    params = torch_params(opt)
    assert list(params) == sorted(n for n, _ in model.named_parameters())  # not the optimizer's order
    tx, state = from_torch(opt, params)
    for _ in range(3):
      with torch.no_grad():
        for name, p in model.named_parameters():
          p.copy_(torch.from_numpy(np.array(params[name])))
      model.zero_grad()
      loss(model).backward()
      grads = {name: jnp.asarray(p.grad.numpy()) for name, p in model.named_parameters()}
      updates, state = tx.update(grads, state, params)
      params = optax.apply_updates(params, updates)
    to_torch(state, opt)  # the state's dict is matched by name too
    for name, p in model.named_parameters():
      np.testing.assert_array_equal(
        opt.state[p]["momentum_buffer"].numpy(), np.asarray(state.momentum_buffer[name])
      )
    to_torch(state, opt, params)
    torch_step(model, opt)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
      np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, err_msg=name)


# --- every other refusal of the bridges: each test fails if the code accepts ----


def test_to_torch_refuses_an_adagrad_count_beyond_float32():
  """PyTorch's Adagrad ``step`` is float32, exact to 2**24: a larger count is refused, 2**24 is not."""
  ps, structure = _params32()
  opt = torch.optim.Adagrad(ps, lr=0.1)
  params = torch_params(opt, structure)
  beyond = onnx_optax.adagrad(0.1, initial_count=2**24 + 1).init(params)
  with pytest.raises(ValueError, match=r"has count 16777217, beyond 2\*\*24, where torch's float32 step"):
    to_torch(beyond, opt, params)
  assert all(float(opt.state[p]["step"]) == 0 for p in ps)  # nothing written (the constructor's state)
  to_torch(onnx_optax.adagrad(0.1, initial_count=2**24).init(params), opt, params)
  assert float(opt.state[ps[0]]["step"]) == 2**24


@pytest.mark.parametrize("step", [2.5, -1.0, 2.0**31])
def test_refuses_adagrad_step_that_is_not_a_count(step):
  ps, structure = _params32()
  opt = torch.optim.Adagrad(ps, lr=0.1)
  torch_steps(opt, ps, gradients(1, np.float32))
  opt.state[ps[2]]["step"] = torch.tensor(step)
  with pytest.raises(ValueError, match=rf"Adagrad's step of a parameter is {step}, not a count of updates"):
    from_torch(opt, structure)


def test_refuses_nesterov_without_momentum():
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)
  opt.param_groups[0]["momentum"] = 0.0  # PyTorch's constructor refuses it; an edit does not
  with pytest.raises(ValueError, match="nesterov=True with momentum=0.0 and dampening=0"):
    from_torch(opt, structure)


def _edited(edit):
  """An SGD with momentum whose param group ``edit`` changes after the constructor."""
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)
  edit(opt.param_groups[0])
  return opt, structure


@pytest.mark.parametrize(
  "edit, match",
  [
    (lambda g: g.update(dampening=0.1), "nesterov=True with momentum=0.9 and dampening=0.1"),
    (lambda g: g.update(momentum=0), "nesterov=True with momentum=0 and dampening=0"),
    (lambda g: g.update(differentiable=True), "differentiable=True"),
    (lambda g: g.update(max_lr=0.1), r"options \['max_lr'\] that torch.optim.SGD does not have"),
  ],
)
def test_to_torch_refuses_the_groups_from_torch_refuses(edit, match):
  """``to_torch`` checks the param groups too: the state would continue a run PyTorch steps differently."""
  opt, structure = _edited(lambda g: None)
  params = torch_params(opt, structure)
  _, state = from_torch(opt, params)
  edit(opt.param_groups[0])
  with pytest.raises(ValueError, match=match):
    to_torch(state, opt, params)
  assert not opt.state


@pytest.mark.parametrize(
  "value, error, match",
  [
    (True, TypeError, r"param_groups\[0\]\['lr'\] must be a real number, got True"),
    (None, TypeError, r"param_groups\[0\]\['lr'\] must be a real number, got None"),
    ("0.1", TypeError, r"param_groups\[0\]\['lr'\] must be a real scalar, got str '0.1'"),
    (torch.tensor([0.1, 0.2]), TypeError, r"param_groups\[0\]\['lr'\] must be a real scalar, got Tensor"),
  ],
)
def test_refuses_a_learning_rate_that_is_not_a_real_scalar(value, error, match):
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
  opt.param_groups[0]["lr"] = value
  with pytest.raises(error, match=match):
    from_torch(opt, structure)


@pytest.mark.parametrize(
  "value, match",
  [
    ("0.1", r"learning_rate must be a real scalar, got str '0.1'"),  # a string is no sequence of rates
    (True, r"learning_rate must be a real number, got True"),
  ],
)
def test_refuses_a_learning_rate_argument_that_is_not_a_number(value, match):
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
  with pytest.raises(TypeError, match=match):
    from_torch(opt, structure, learning_rate=value)


def test_refuses_a_hyperparameter_numpy_cannot_read():
  class Unreadable:
    def __array__(self, *args, **kwargs):
      raise RuntimeError("no")

  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
  opt.param_groups[0]["weight_decay"] = Unreadable()
  with pytest.raises(
    TypeError, match=r"param_groups\[0\]\['weight_decay'\] must be a real number, got Unreadable"
  ):
    from_torch(opt, structure)


def test_a_scalar_tensor_learning_rate_is_read_with_its_value():
  """The accepting side of the check above: PyTorch's tensor ``lr`` is a real scalar."""
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=torch.tensor(0.5), momentum=0.9)
  params = torch_params(opt, structure)
  tx, state = from_torch(opt, params)
  updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
  np.testing.assert_allclose(updates[0], -0.5 * np.ones(3), rtol=1e-7)
  # One that requires grad (a learned rate) is read by its value too, also given as learning_rate=.
  learned = torch.tensor(0.25, requires_grad=True)
  opt.param_groups[0]["lr"] = learned
  for given in (None, learned):
    tx, state = from_torch(opt, params, learning_rate=given)
    updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
    np.testing.assert_allclose(updates[0], -0.25 * np.ones(3), rtol=1e-7)


def test_refuses_a_leaf_that_is_not_an_array():
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1)
  params = [jnp.zeros(v.shape, v.dtype) for v in structure]
  with pytest.raises(TypeError, match=r"params\[2\] must be an array \(or jax.ShapeDtypeStruct\), got float"):
    from_torch(opt, [*params[:2], 0.0, params[3]])


def test_to_torch_refuses_states_it_cannot_place():
  """A state with no rule state, another number of leaves, a leaf owned twice or by nobody."""
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
  params = torch_params(opt, structure)
  rule = onnx_optax.momentum(0.1, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0)
  cases = [
    (
      optax.sgd(0.1, momentum=0.9).init(params),
      TypeError,
      "state holds no PyTorchSGDState or MomentumState: pass the state",
    ),
    (
      rule.init([params[0], params[1], params[2]]),
      ValueError,
      "has 3 leaves but the optimizer has 4",
    ),
    (optax.chain(rule, rule).init(params), ValueError, "parameter 0 has state in two places"),
    (
      optax.multi_transform({"a": rule, "b": optax.set_to_zero()}, ["a", "a", "b", "b"]).init(params),
      ValueError,
      r"parameters \[2, 3\] have no state in state",
    ),
  ]
  for state, error, match in cases:
    with pytest.raises(error, match=match):
      to_torch(state, opt, params)
  assert not opt.state


def test_to_torch_refuses_a_state_of_another_shape():
  ps, structure = _params32()
  opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
  params = torch_params(opt, structure)
  rule = onnx_optax.momentum(0.1, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0)
  state = rule.init([params[0], jnp.zeros((4, 2)), *params[2:]])
  with pytest.raises(
    ValueError, match=r"the state of param_groups\[0\]\['params'\]\[1\] has shape \(4, 2\) and dtype float32"
  ):
    to_torch(state, opt, params)
  assert not opt.state


def test_torch_params_and_to_torch_refuse_what_from_torch_refuses():
  ps, structure = _params32()
  with pytest.raises(TypeError, match="no onnx_optax rule is torch.optim.lbfgs.LBFGS"):
    torch_params(torch.optim.LBFGS(ps), structure)
  with pytest.raises(TypeError, match="no onnx_optax rule is torch.optim.sparse_adam.SparseAdam"):
    to_torch(None, torch.optim.SparseAdam(ps), None)
  opt = torch.optim.SGD(ps, lr=0.1)
  with pytest.raises(ValueError, match=r"like has 3 leaves but the PyTorch optimizer has 4"):
    torch_params(opt, [structure[0], structure[1], structure[2]])


def _counts(state):
  """The ``count`` of every rule state in a carried state tree."""
  return [int(s.count) for s in jax.tree.leaves(state, is_leaf=lambda s: hasattr(s, "count"))]


def test_adagrad_steps_up_to_int32s_maximum_are_carried():
  """``from_torch`` takes any integer ``step`` up to 2**31 - 1 (the count's int32 range)."""
  ps, structure = _params32()
  opt = torch.optim.Adagrad(ps, lr=0.1)
  torch_steps(opt, ps, gradients(1, np.float32))
  for p in ps:
    opt.state[p]["step"] = torch.tensor(2.0**31 - 1, dtype=torch.float64)
  _, state = from_torch(opt, structure)
  counts = _counts(state)
  assert counts and set(counts) == {2**31 - 1}


def test_to_torch_keeps_the_step_tensors_dtype():
  """An Adagrad ``step`` that PyTorch holds as float64 (a float64 default dtype at construction)
  is written back as float64 on its device, not as the float32 of a fresh state."""
  ps, structure = _params32()
  opt = torch.optim.Adagrad(ps, lr=0.1)
  for p in ps:
    opt.state[p]["step"] = torch.tensor(0.0, dtype=torch.float64)
  params = torch_params(opt, structure)
  to_torch(onnx_optax.adagrad(0.1, initial_count=3).init(params), opt, params)
  steps = [opt.state[p]["step"] for p in ps]
  assert {(step.dtype, step.device.type) for step in steps} == {(torch.float64, "cpu")}
  assert {float(opt.state[p]["step"]) for p in ps} == {3.0}
  # And on its device: PyTorch's "meta" device stands in for an accelerator on this CPU machine.
  opt.state[ps[0]]["step"] = torch.tensor(0.0, device="meta")
  to_torch(onnx_optax.adagrad(0.1, initial_count=3).init(params), opt, params)
  assert opt.state[ps[0]]["step"].device.type == "meta"


def test_to_torch_puts_a_fused_adams_first_step_on_the_parameters_device():
  """A fused (or capturable) Adam keeps ``step`` on the parameter's device, as PyTorch's own first
  step does; "meta" parameters stand in for an accelerator's on this CPU machine."""
  ps = [torch.nn.Parameter(torch.zeros(3, device="meta"))]
  for options in (dict(fused=True), dict(capturable=True)):
    opt = torch.optim.Adam(ps, lr=0.1, **options)
    to_torch(onnx_optax.ort_adamw(0.1, weight_decay=0.0, initial_count=3).init([jnp.zeros(3)]), opt)
    step = opt.state[ps[0]]["step"]
    assert (step.device.type, step.dtype) == ("meta", torch.float32), options


def test_like_may_hold_other_tensors_of_the_same_shapes():
  """``like`` made of tensors that are not the optimizer's (a copy of the model) is read for its
  structure, shapes and dtypes, by position; the optimizer's own tensors are placed by identity."""
  ps = [torch.nn.Parameter(torch.full((3,), float(k))) for k in range(2)]  # one shape: only order tells
  opt = torch.optim.SGD(ps, lr=0.1)
  params = torch_params(opt, [p.detach().clone() for p in ps])
  assert [float(x[0]) for x in jax.tree.leaves(params)] == [0.0, 1.0]
  assert [float(x[0]) for x in torch_params(opt, ps[::-1])] == [1.0, 0.0]  # each tensor's own values


def test_dtype_names_of_torch_jax_and_strings_agree():
  """``torch.float32``, ``jnp.float32`` (a scalar type, whose ``str`` is not a dtype name) and
  ``"float32"`` are one dtype; a torch dtype NumPy lacks keeps its name."""
  from onnx_optax.interop import _common

  assert {_common.dtype_name(d) for d in (torch.float32, jnp.float32, "float32", np.dtype("float32"))} == {
    "float32"
  }
  assert _common.dtype_name(torch.bfloat16) == _common.dtype_name(jnp.bfloat16) == "bfloat16"
  assert _common.dtype_name(torch.complex32) == "complex32"


def test_plain_sgd_state_is_a_first_step_state():
  """``momentum = 0``: PyTorch keeps no buffer and no step, so the state is the one of an update
  without history, count 0, as for an SGD with momentum that has not stepped (the update is the
  same at any count there: ``beta = 1``)."""
  ps, structure = _params32()
  opt = sgd_plain(ps)
  torch_steps(opt, ps, gradients(3, np.float32))
  _, state = from_torch(opt, structure)
  counts = _counts(state)
  assert counts and set(counts) == {0}


def test_to_torch_writes_no_buffer_for_plain_sgd():
  """``momentum = 0``: PyTorch keeps no ``momentum_buffer``, so ``to_torch`` writes none, whatever
  the count."""
  ps, structure = _params32()
  opt = sgd_plain(ps)
  params = torch_params(opt, structure)
  plain = dict(alpha=0.0, beta=1.0, mode="standard", norm_coefficient=0.02)
  rule = onnx_optax.momentum(0.1, **plain, initial_count=5)
  to_torch(rule.init(params), opt, params)
  assert all("momentum_buffer" not in opt.state[p] for p in ps)


@pytest.mark.parametrize(
  "options",
  [dict(momentum=1.0), dict(momentum=0.0, dampening=1.5)],
  ids=["momentum 1", "momentum 0, dampening 1.5"],
)
def test_sgd_edges_pytorch_accepts_are_carried(options):
  """``momentum = 1`` (allowed by PyTorch: no decay of the buffer) is carried with its buffer.
  ``momentum = 0`` with ``dampening = 1.5``: PyTorch's constructor accepts it (it checks no
  dampening) and its step ignores it, so the bridge carries it as plain SGD instead of refusing a
  dampening outside ``[0, 1]``. Equal to PyTorch's run."""
  N, M = 3, 4
  with jax.enable_x64(True):
    x0, grads = initial(np.float64), gradients(N + M, np.float64)
    ps_ref = torch_parameters(x0)
    torch_steps(torch.optim.SGD(ps_ref, lr=0.01, **options), ps_ref, grads)
    ps = torch_parameters(x0)
    opt = torch.optim.SGD(ps, lr=0.01, **options)
    torch_steps(opt, ps, grads[:N])
    params = torch_params(opt, like(jnp.float64))
    tx, state = from_torch(opt, params)
    params, _ = jax_steps(tx, state, params, grads[N:])
    for x, p in zip(jax.tree.leaves(params), ps_ref):
      np.testing.assert_allclose(x, p.detach().numpy(), rtol=1e-12)


def test_carried_state_is_placed_like_the_parameters():
  """Parameters sharded over two devices: the state ``from_torch`` builds is sharded alike
  (``_common.put_like``), not left on the default device. In a fresh interpreter with two CPU
  devices (the device count is fixed when JAX starts)."""
  code = textwrap.dedent("""
      import os
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
      import jax, jax.numpy as jnp, numpy as np, torch
      from jax.sharding import Mesh, NamedSharding, PartitionSpec
      from onnx_optax.interop import from_torch
      sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), PartitionSpec("d"))
      p = torch.nn.Parameter(torch.arange(4.0))
      opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
      p.grad = torch.ones(4)
      opt.step()
      params = [jax.device_put(jnp.arange(4.0, dtype=jnp.float32), sharding)]
      _, state = from_torch(opt, params)
      (buffer,) = [x for x in jax.tree.leaves(state) if getattr(x, "shape", ()) == (4,)]
      print(buffer.sharding == sharding, len(buffer.sharding.device_set))
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["True", "2"], out


def test_a_jitted_step_of_a_carried_run_compiles_once():
  """The count too is placed on the parameters' devices (their mesh, replicated): the first jitted step
  gets the count as every later one does, and compiles once. ``init`` leaves it on the default device
  and the step returns it on the mesh, a new input sharding and a second compilation. PyTorch's and
  Keras's bridges, and parameters on one device that is not the default one (the count goes there), in
  a fresh interpreter with two CPU devices."""
  code = textwrap.dedent("""
      import os
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
      os.environ["KERAS_BACKEND"] = "jax"
      import jax, jax.numpy as jnp, keras, numpy as np, optax, torch
      from jax.sharding import Mesh, NamedSharding, PartitionSpec
      from onnx_optax.interop import from_keras, from_torch
      mesh = Mesh(np.array(jax.devices()), ("d",))
      sharding = NamedSharding(mesh, PartitionSpec("d"))
      p = torch.nn.Parameter(torch.arange(4.0))
      opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
      p.grad = torch.ones(4)
      opt.step()
      w = keras.Variable(np.arange(4.0, dtype=np.float32))
      kopt = keras.optimizers.Adam(learning_rate=0.1)
      kopt.apply([np.ones(4, np.float32)], [w])
      replicated = NamedSharding(mesh, PartitionSpec())
      second = jax.sharding.SingleDeviceSharding(jax.devices()[1])  # not the default device
      for carried, where, count_at in (
          (from_torch(opt, [jax.device_put(jnp.arange(4.0), sharding)]), sharding, replicated),
          (from_keras(kopt, [jax.device_put(jnp.arange(4.0), sharding)]), sharding, replicated),
          (from_torch(opt, [jax.device_put(jnp.arange(4.0), second)]), second, second)):
        tx, state = carried
        params = [jax.device_put(jnp.arange(4.0), where)]
        @jax.jit
        def step(params, state):
          updates, state = tx.update([jnp.ones(4)], state, params)
          return optax.apply_updates(params, updates), state
        placed = state.count.sharding == count_at
        for _ in range(3):
          params, state = step(params, state)
        print(placed, step._cache_size())
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split("\n")[:3] == ["True 1", "True 1", "True 1"], out


def test_a_group_option_is_checked_by_the_twins_declared_check(monkeypatch):
  """The bridge has no range of its own: the check the registry declares for the twin's hyperparameter
  decides, naming the option as the PyTorch user wrote it. A stricter check planted in the declaration
  refuses ``momentum=0.9`` under ``param_groups[0]['momentum']`` (a bridge that checked with its own
  range would let it through, and the transform would refuse it as ``momentum``)."""
  from onnx_optax import registry

  (rule,) = [r for r in registry.rules() if r.binding("torch") and r.binding("torch").name == "SGD"]

  def at_most_half(name, value):
    if value > 0.5:
      raise ValueError(f"{name} must be <= 0.5 (planted)")
    return value

  monkeypatch.setitem(rule.hyperparameters, "momentum", registry.Hyperparameter(at_most_half))
  ps, structure = _params32()
  with pytest.raises(ValueError, match=r"^param_groups\[0\]\['momentum'\] must be <= 0.5 \(planted\)$"):
    from_torch(torch.optim.SGD(ps, lr=0.1, momentum=0.9), torch_params(torch.optim.SGD(ps), structure))
  from_torch(torch.optim.SGD(ps, lr=0.1, momentum=0.5), torch_params(torch.optim.SGD(ps), structure))


def test_a_rule_registered_later_is_found_in_a_state():
  """The rule states the bridges look for are the registry's, read when they look: a rule registered
  from outside the package is found inside an ``optax.chain``, and not once it is unregistered."""
  from typing import NamedTuple

  from onnx_optax import registry
  from onnx_optax.interop import _common
  from onnx_optax.rules import torch_sgd

  class OutsideState(NamedTuple):
    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in the rules' states
    momentum_buffer: list

  state = (optax.EmptyState(), OutsideState(jnp.zeros([], jnp.int32), [jnp.ones(3)]))
  with pytest.raises(TypeError, match="state holds no OutsideState"):
    _common.positions(state, 1, (OutsideState,))
  registry.register(registry.replace(torch_sgd.RULE, name="outside_sgd", state=OutsideState, bindings=()))
  try:
    ((rule_state, values),) = _common.positions(state, 1, (OutsideState,))
    assert rule_state is state[1] and values[0] is state[1].momentum_buffer[0]
  finally:
    registry.unregister("outside_sgd")
  with pytest.raises(TypeError, match="state holds no OutsideState"):
    _common.positions(state, 1, (OutsideState,))


def test_a_state_tensor_in_another_dtype_is_refused_not_cast():
  """A float32 momentum buffer put by hand on a bfloat16 parameter: refused (casting it would round it);
  the advice, run as printed, stores it as PyTorch's own steps would, and the state then carries."""
  p = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
  opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
  opt.state[p]["momentum_buffer"] = torch.full((3,), 1 / 3)  # float32: not a bfloat16 number
  params = torch_params(opt)
  with pytest.raises(
    ValueError,
    match=r"state tensor of param_groups\[0\]\['params'\]\[0\] has shape \(3,\) "
    r"and dtype float32, not the parameter's \(3,\) and bfloat16",
  ) as refused:
    from_torch(opt, params)
  fix = str(refused.value).split("Store it so (", 1)[1].split(") if that", 1)[0]
  key = "momentum_buffer"
  exec(fix, {"optimizer": opt, "p": p, "key": key})
  _, state = from_torch(opt, params)
  assert state.momentum_buffer[0].dtype == jnp.bfloat16
  assert np.array_equal(np.asarray(state.momentum_buffer[0], np.float32), opt.state[p][key].float().numpy())
