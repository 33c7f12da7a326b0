"""onnx_optax.interop against PyTorch's own Adam and AdamW.

``torch.optim.AdamW`` is ONNX Runtime's ``AdamWOptimizer`` with
``adam_mode=0`` (:func:`onnx_optax.ort_adamw`), and ``torch.optim.Adam``
with its coupled ``weight_decay`` is ``optax.add_decayed_weights(wd)``
chained before it with ``weight_decay=0``: the same numbers in exact
arithmetic, computed in another order (docs/adam_family.md).

Every expectation is PyTorch: a run of N + M ``optimizer.step()`` calls. The
bridged runs take N steps in PyTorch and M in JAX (``from_torch``), or N in
JAX and M in PyTorch (``to_torch``), and must end at PyTorch's parameters and
state: to 1e-12 relative in float64, and within the float32 bound derived in
:func:`adam_bound`. Gradients are fixed random arrays, so that the runs differ
only by the optimizers; the parameters still feed back through the weight
decay.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch_runs
from interop_data import SHAPES, gradients, initial
from torch_runs import GROUPS, jax_steps, like, torch_parameters

import onnx_optax
from onnx_optax.interop import _torch_optim, from_torch, to_torch, torch_params

U32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff


def adam_state(opt, p):
  """``(exp_avg, exp_avg_sq, step)`` of one parameter; Nones before its first step."""
  slot = opt.state.get(p, {})
  if "exp_avg" not in slot:
    return None, None, None
  return (
    slot["exp_avg"].detach().numpy().copy(),
    slot["exp_avg_sq"].detach().numpy().copy(),
    float(slot["step"]),
  )


torch_steps = functools.partial(torch_runs.torch_steps, state_of=adam_state)


# --- the optimizers, every hyperparameter away from its default -------------


def adamw(ps, **overrides):
  groups = [
    dict(
      params=[ps[i] for i in GROUPS[0]],
      lr=0.05,
      betas=(0.8, 0.99),
      eps=1e-3,
      weight_decay=0.05,
      maximize=True,
    ),
    dict(params=[ps[i] for i in GROUPS[1]], lr=0.02, eps=1e-6, weight_decay=0.2),
  ]
  return torch.optim.AdamW(groups, **overrides)


def adam(ps, **overrides):
  # Coupled L2 in one group, none in the other (PyTorch skips a zero decay).
  groups = [
    dict(
      params=[ps[i] for i in GROUPS[0]],
      lr=0.03,
      betas=(0.85, 0.995),
      eps=1e-4,
      weight_decay=0.04,
      maximize=True,
    ),
    dict(params=[ps[i] for i in GROUPS[1]], lr=0.01, eps=1e-7),
  ]
  return torch.optim.Adam(groups, **overrides)


def adam_decoupled(ps, **overrides):
  # Adam(decoupled_weight_decay=True) is AdamW (torch 2.13's AdamW sets it).
  return torch.optim.Adam(
    ps, lr=0.04, betas=(0.7, 0.9), eps=1e-5, weight_decay=0.1, decoupled_weight_decay=True, **overrides
  )


OPTIMIZERS = {"adamw": adamw, "adam": adam, "adam_decoupled": adam_decoupled}


# --- the float32 bound --------------------------------------------------------


def adam_bound(opt64, x0, grads, records, u=U32):
  """Per leaf, twice a first-order bound on one float32 run's distance from exact: ``(x, m, v)``.

  Exact is the float64 run (``records``, from PyTorch) of the same float32
  inputs. Each rounding, and each hyperparameter's conversion to float32, is
  at most ``u = 2^-24`` relative; ``e*`` is each quantity's accumulated
  error, ``s = -1`` for ``maximize``, ``t`` PyTorch's step after its
  increment (the transform's ``count``). Per step::

      coupled (Adam):    G  = s g + wd x           eG = wd eX + 3u (|g| + wd |x|)
                         xd = x                    exd = eX
      decoupled (AdamW): G  = s g                  eG = 0
                         xd = x - x lr wd          exd = eX + 2u |x| + 4u lr wd |x|
                         (PyTorch: x * (1 - lr wd), the factor rounded once; the
                         transform: two products and a subtraction)
      m  = b1 m + (1 - b1) G       em = b1 em + (1 - b1) eG + 5u (|m_prev| + |G|)
      v  = b2 v + (1 - b2) G^2     ev = b2 ev + 2 (1 - b2) |G| eG + 6u (|v_prev| + G^2)

  (PyTorch computes ``m + (1 - b1)(G - m)`` (lerp) and rounds ``1 - b``
  from float64; the transform takes ``1 - float32(b)``, off by ``u b``
  absolute: both within the ``5u`` / ``6u`` terms.) The bias corrections
  ``c = 1 - b^t``: PyTorch's are float64 numbers rounded once (``u``); the
  transform's are ``-expm1(t log b)`` of ``float32(b)``, whose exponent is
  off by ``u t (1 + 2 |log b|)``, which ``expm1`` turns into a relative
  error of ``b^t / (1 - b^t)`` times that::

      ec / c = u (t (1 + 2 |log b|) b^t / (1 - b^t) + 3)
      r  = sqrt(v / c2)            er = r (ev / (2 v) + ec2 / (2 c2) + 3u)
      d  = r + eps                 ed = er + 2u d
      q  = lr m / (c1 d)           eq = lr / (c1 d) em + |q| (ec1 / c1 + ed / d + 5u)
      x' = xd - q                  eX = exd + eq + 3u (|x'| + |q|)

  (PyTorch divides ``sqrt(v)`` by ``sqrt(c2)`` and multiplies by ``lr /
  c1``; the transform divides ``v`` by ``c2`` under the root and ``lr m`` by
  ``c1 d``; the ``3u`` and ``5u`` count the longer of the two. The last
  ``3u`` covers the transform's ``U = (xd - q) - x`` and ``x + U``.) Both
  runs are within these bounds of exact (products of errors, ``O(u^2)``, left
  out), so within twice them of each other.
  """
  groups = [group for group in opt64.param_groups for _ in group["params"]]
  xs = [x0] + [r[0] for r in records]
  zeros = [(np.zeros_like(x), np.zeros_like(x), 0.0) for x in x0]
  states = [zeros] + [r[1] for r in records]
  bounds = []
  for i, group in enumerate(groups):
    s = -1.0 if group["maximize"] else 1.0
    lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    decoupled = group["decoupled_weight_decay"]
    eX = em = ev = np.zeros_like(x0[i])
    for k in range(len(grads)):
      x, g, x_new = xs[k][i], grads[k][i], xs[k + 1][i]
      m_prev, v_prev, _ = states[k][i]
      m, v, t = states[k + 1][i]
      if decoupled:
        G, eG = s * g, 0.0
        exd = eX + 2 * u * np.abs(x) + 4 * u * lr * wd * np.abs(x)
      else:
        G = s * g + wd * x
        eG = wd * eX + 3 * u * (np.abs(g) + wd * np.abs(x))
        exd = eX
      em = b1 * em + (1 - b1) * eG + 5 * u * (np.abs(m_prev) + np.abs(G))
      ev = b2 * ev + 2 * (1 - b2) * np.abs(G) * eG + 6 * u * (np.abs(v_prev) + G * G)
      c1, c2 = 1 - b1**t, 1 - b2**t
      ec1 = u * (t * (1 + 2 * abs(np.log(b1))) * b1**t / c1 + 3) * c1
      ec2 = u * (t * (1 + 2 * abs(np.log(b2))) * b2**t / c2 + 3) * c2
      r = np.sqrt(v / c2)
      er = r * (ev / (2 * np.where(v > 0, v, 1.0)) + ec2 / (2 * c2) + 3 * u) + np.where(v > 0, 0, np.sqrt(ev))
      d = r + eps
      ed = er + 2 * u * d
      q = lr * m / (c1 * d)
      eq = lr / (c1 * d) * em + np.abs(q) * (ec1 / c1 + ed / d + 5 * u)
      eX = exd + eq + 3 * u * (np.abs(x_new) + np.abs(q))
    bounds.append((2 * eX, 2 * em, 2 * ev))
  return bounds


# --- the runs ----------------------------------------------------------------


def assert_close(actual, expected, bound, what):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
  err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
  worst = np.max(err - bound) if err.size else -1.0
  assert worst <= 0, f"{what}: error {np.max(err)} over the bound {np.min(bound)}..{np.max(bound)}"


def tol64(expected):
  return 1e-12 * max(np.max(np.abs(expected)), 1.0)


def reference_run(name, dtype, steps, missing=(), **options):
  """PyTorch alone: ``steps`` steps; and the records of a float64 run of the same inputs."""
  make = OPTIMIZERS[name]
  x0, grads = initial(dtype), gradients(steps, dtype)
  ps = torch_parameters(x0)
  records = torch_steps(make(ps, **options), ps, grads, missing)
  x0_64 = [x.astype(np.float64) for x in x0]
  grads64 = [[g.astype(np.float64) for g in step] for step in grads]
  ps64 = torch_parameters(x0_64)
  opt64 = make(ps64, **options)
  records64 = torch_steps(opt64, ps64, grads64, missing)
  return x0, grads, records, (opt64, x0_64, grads64, records64)


def check_final(dtype, xs, states, records, run64):
  """The bridged run's parameters and state against PyTorch's after the last step."""
  final_x, final_state = records[-1]
  bounds = adam_bound(*run64) if dtype == np.float32 else None
  for i, (x, expected) in enumerate(zip(xs, final_x)):
    assert_close(x, expected, tol64(expected) if bounds is None else bounds[i][0], f"parameter {i}")
  for i, ((m, v, step), (m_ref, v_ref, step_ref)) in enumerate(zip(states, final_state)):
    assert step == step_ref, f"step of parameter {i}: {step} != {step_ref}"
    assert_close(m, m_ref, tol64(m_ref) if bounds is None else bounds[i][1], f"exp_avg {i}")
    assert_close(v, v_ref, tol64(v_ref) if bounds is None else bounds[i][2], f"exp_avg_sq {i}")


def carried_from_torch(name, dtype, N, M, missing=(), **options):
  """N steps in PyTorch, ``from_torch``, M steps in JAX; the JAX state read back through ``to_torch``."""
  x0, grads, records, run64 = reference_run(name, dtype, N + M, missing, **options)
  ps = torch_parameters(x0)
  opt = OPTIMIZERS[name](ps, **options)
  torch_steps(opt, ps, grads[:N], missing)
  params = torch_params(opt, like(dtype))
  tx, state = from_torch(opt, params)
  params, state = jax_steps(tx, state, params, grads[N:])
  # Read the JAX state through to_torch into a fresh optimizer: PyTorch's
  # own layout, compared with PyTorch's own state.
  ps2 = torch_parameters(x0)
  opt2 = OPTIMIZERS[name](ps2, **options)
  to_torch(state, opt2, params)
  xs = [np.asarray(x) for x in jax.tree.leaves(params)]
  return xs, [adam_state(opt2, p) for p in ps2], records, run64


def carried_to_torch(name, dtype, N, M, **options):
  """N steps in JAX (from a fresh optimizer), ``to_torch``, M steps in PyTorch."""
  x0, grads, records, run64 = reference_run(name, dtype, N + M, **options)
  ps = torch_parameters(x0)
  opt = OPTIMIZERS[name](ps, **options)
  params = torch_params(opt, like(dtype))
  tx, state = from_torch(opt, params)
  params, state = jax_steps(tx, state, params, grads[:N])
  to_torch(state, opt, params)
  torch_steps(opt, ps, grads[N:])
  return [p.detach().numpy() for p in ps], [adam_state(opt, p) for p in ps], records, run64


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("N, M", [(3, 5), (0, 6), (6, 1)])
def test_from_torch_float64(name, N, M):
  with jax.enable_x64(True):
    check_final(np.float64, *carried_from_torch(name, np.float64, N, M))


def test_coupled_weight_decay_of_one():
  """A coupled ``weight_decay`` of 1 (group 1 takes the constructor's): L2 at full weight, as
  PyTorch adds it; no value of the decay but 0 skips it."""
  with jax.enable_x64(True):
    check_final(np.float64, *carried_from_torch("adam", np.float64, 3, 5, weight_decay=1.0))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("N, M", [(3, 5), (0, 6), (6, 0)])
def test_to_torch_float64(name, N, M):
  with jax.enable_x64(True):
    check_final(np.float64, *carried_to_torch(name, np.float64, N, M))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("options", [{}, dict(foreach=True), dict(fused=True)])
def test_from_torch_float32(name, options):
  check_final(np.float32, *carried_from_torch(name, np.float32, 4, 6, **options))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_to_torch_float32(name):
  check_final(np.float32, *carried_to_torch(name, np.float32, 4, 6))


def test_float32_bound_has_teeth():
  """The bound is far below what a wrong mapping changes: Hugging Face's AdamW (mode 1) fails it.

  Mode 1 differs from PyTorch's rule only in where epsilon and the decay sit
  (docs/adam_family.md); the bound must tell the two apart in float32.
  """
  x0, grads, records, run64 = reference_run("adamw", np.float32, 10)
  bounds = adam_bound(*run64)
  ps = torch_parameters(x0)
  opt = adamw(ps)
  params = torch_params(opt, like(jnp.float32))
  tx, state = from_torch(opt, params)
  ours, _ = jax_steps(tx, state, params, grads)
  for i, (x, e, b) in enumerate(zip(jax.tree.leaves(ours), records[-1][0], bounds)):
    assert_close(x, e, b[0], f"parameter {i}")
  hf = optax.multi_transform(
    {
      "a": optax.chain(
        optax.scale(-1.0),
        onnx_optax.ort_adamw(0.05, alpha=0.8, beta=0.99, epsilon=1e-3, weight_decay=0.05, adam_mode=1),
      ),
      "b": onnx_optax.ort_adamw(0.02, epsilon=1e-6, weight_decay=0.2, adam_mode=1),
    },
    ["a", "a", "b", "b"],
  )
  wrong, _ = jax_steps(hf, hf.init(params), params, grads)
  for i, (x, e, b) in enumerate(zip(jax.tree.leaves(wrong), records[-1][0], bounds)):
    excess = np.abs(np.asarray(x, np.float64) - e) - b[0]
    assert np.max(excess) > 0, f"parameter {i}: mode 1 within the bound"


# --- step counts, kernels, flags ---------------------------------------------


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_parameters_at_different_steps(name):
  """Leaves that missed steps in PyTorch (no grad) are at lower steps: their own transforms."""
  missing = {(0, 1), (1, 1), (0, 3)}  # leaf 1 gets its first grad at step 2, leaf 3 at step 1
  with jax.enable_x64(True):
    check_final(np.float64, *carried_from_torch(name, np.float64, 2, 4, missing))


def test_counts_are_torch_steps():
  ps = torch_parameters(initial(np.float32))
  opt = adam(ps)
  torch_steps(opt, ps, gradients(3, np.float32), missing={(0, 1), (1, 1), (2, 1)})
  tx, state = from_torch(opt, torch_params(opt, like(jnp.float32)))

  def rule_state(inner):
    found = [s for s in jax.tree.leaves(inner, is_leaf=lambda s: isinstance(s, onnx_optax.PyTorchAdamState))]
    (only,) = [s for s in found if isinstance(s, onnx_optax.PyTorchAdamState)]
    return only

  counts = {label: int(rule_state(s).count) for label, s in state.inner_states.items()}
  # p1 never had a gradient (no state: count 0); p0 took 3 steps; group 1 took 3.
  assert counts == {"group0.T0": 0, "group0.T3": 3, "group1": 3}
  assert float(opt.state[ps[0]]["step"]) == 3 and ps[1] not in opt.state


def test_no_step_yet_is_count_zero():
  ps = torch_parameters(initial(np.float32))
  opt = torch.optim.AdamW(ps, lr=0.1)
  tx, state = from_torch(opt, torch_params(opt, [jax.ShapeDtypeStruct(s, jnp.float32) for s in SHAPES]))
  assert isinstance(state, onnx_optax.PyTorchAdamState) and int(state.count) == 0
  assert all(float(jnp.abs(m).max()) == 0 for m in state.exp_avg + state.exp_avg_sq)


@pytest.mark.parametrize("name", ["adamw", "adam"])
@pytest.mark.parametrize("options", [dict(foreach=True), dict(foreach=False), dict(fused=True)])
def test_kernels_are_the_same_rule(name, options):
  """foreach and fused are PyTorch's kernels for the same update: carried both ways to 1e-12."""
  with jax.enable_x64(True):
    check_final(np.float64, *carried_from_torch(name, np.float64, 2, 3, **options))
    check_final(np.float64, *carried_to_torch(name, np.float64, 2, 3, **options))


@pytest.fixture
def capturable_on_cpu(monkeypatch):
  """PyTorch runs capturable Adam on accelerators only; its arithmetic runs on the CPU as well."""
  module = importlib.import_module("torch.optim.adam")  # torch.optim's namespace deletes the name
  monkeypatch.setattr(module, "_get_capturable_supported_devices", lambda supports_xla=True: ["cpu"])


@pytest.mark.parametrize("options", [dict(capturable=True), dict(capturable=True, foreach=True)])
def test_capturable(capturable_on_cpu, options):
  """The capturable kernels (bias corrections as tensors, in the step tensor's dtype).

  Their ``step`` lives with the parameter in the default dtype; with a
  float64 default it is float64 and the run is float64 throughout (with a
  float32 step, PyTorch's own float64 run carries float32 bias corrections:
  docs/interop.md).
  """
  default = torch.get_default_dtype()
  torch.set_default_dtype(torch.float64)
  try:
    with jax.enable_x64(True):
      check_final(np.float64, *carried_from_torch("adamw", np.float64, 3, 3, **options))
      check_final(np.float64, *carried_to_torch("adam", np.float64, 3, 3, **options))
  finally:
    torch.set_default_dtype(default)
  check_final(np.float32, *carried_from_torch("adamw", np.float32, 4, 6, **options))


def test_to_torch_writes_steps_where_pytorch_keeps_them():
  """A fresh optimizer gets ``step`` tensors of PyTorch's own dtype and device, counting updates done."""
  for options, dtype in [({}, torch.float32), (dict(fused=True), torch.float32)]:
    ps = torch_parameters(initial(np.float32))
    opt = adamw(ps, **options)
    params = torch_params(opt, like(jnp.float32))
    tx, state = from_torch(opt, params)
    params, state = jax_steps(tx, state, params, gradients(2, np.float32))
    to_torch(state, opt, params)
    ps_ref = torch_parameters(initial(np.float32))
    opt_ref = adamw(ps_ref, **options)
    torch_steps(opt_ref, ps_ref, gradients(2, np.float32))
    for p, p_ref in zip(ps, ps_ref):
      step, step_ref = opt.state[p]["step"], opt_ref.state[p_ref]["step"]
      assert step.dtype == step_ref.dtype == dtype and step.device == step_ref.device
      assert float(step) == float(step_ref) == 2


def test_scheduler_with_learning_rate_schedule():
  """A StepLR AdamW run continued in JAX: the schedule also scales the decoupled decay."""
  N, M = 3, 5
  with jax.enable_x64(True):
    x0, grads = initial(np.float64), gradients(N + M, np.float64)

    def run(ps, grads):
      opt = torch.optim.AdamW(ps, lr=0.1, weight_decay=0.3)
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

    def torch_lr(step):  # StepLR(step_size=2, gamma=0.5) after `step` steps
      return jnp.float64(0.1) * jnp.float64(0.5) ** (step // 2)

    tx, state = from_torch(opt, params, learning_rate=lambda n: torch_lr(n + N))
    params, _ = jax_steps(tx, state, params, grads[N:])
    for x, p in zip(jax.tree.leaves(params), ps_ref):
      np.testing.assert_allclose(x, p.detach().numpy(), rtol=1e-12)


# --- refusals ----------------------------------------------------------------


def _params32():
  return torch_parameters(initial(np.float32)), like(jnp.float32)


def amsgrad_optimizer(cls, ps, mixed, amsgrad=True):
  """AMSGrad in group 0 (every option away from its default), in group 1 too unless ``mixed``;
  ``amsgrad=False``: the same optimizer without it."""
  return cls(
    [
      dict(
        params=[ps[i] for i in GROUPS[0]],
        lr=0.05,
        betas=(0.8, 0.9),
        eps=1e-3,
        weight_decay=0.05,
        amsgrad=amsgrad,
        maximize=True,
      ),
      dict(
        params=[ps[i] for i in GROUPS[1]], lr=0.02, eps=1e-6, weight_decay=0.2, amsgrad=amsgrad and not mixed
      ),
    ]
  )


def amsgrad_state(opt, p):
  """``(exp_avg, exp_avg_sq, max_exp_avg_sq or None, step)`` of one parameter."""
  slot = opt.state[p]
  keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
  values = [slot[k].detach().numpy().copy() if k in slot else None for k in keys]
  return (*values, float(slot["step"]))


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("mixed", [False, True], ids=["amsgrad", "amsgrad_in_one_group"])
@pytest.mark.parametrize("direction", ["from_torch", "to_torch"])
def test_amsgrad_is_carried_both_ways(cls, mixed, direction):
  """``amsgrad=True`` (``max_exp_avg_sq``, in a group of its own or in both): 3 steps on one side
  and 5 on the other end at PyTorch's own run of 8 steps, parameters and state (the running
  maximum included) within 1e-12 in float64. The maximum matters on this run (it differs from
  ``exp_avg_sq`` and from a run without amsgrad), and a group without amsgrad keeps none."""
  N, M = 3, 5
  x0, grads = initial(np.float64), gradients(N + M, np.float64)
  steps = functools.partial(torch_runs.torch_steps, state_of=amsgrad_state)
  ps = torch_parameters(x0)
  records = steps(amsgrad_optimizer(cls, ps, mixed), ps, grads)
  final_x, final_state = records[-1]
  plain = torch_parameters(x0)
  steps(amsgrad_optimizer(cls, plain, mixed, amsgrad=False), plain, grads)
  assert not np.allclose(plain[0].detach().numpy(), final_x[0])
  assert any(not np.array_equal(s[1], s[2]) for s in final_state if s[2] is not None)
  with jax.enable_x64(True):
    ps = torch_parameters(x0)
    opt = amsgrad_optimizer(cls, ps, mixed)
    if direction == "from_torch":
      steps(opt, ps, grads[:N])
      params = torch_params(opt, like(np.float64))
      tx, state = from_torch(opt, params)
      params, state = jax_steps(tx, state, params, grads[N:])
      ps = torch_parameters(x0)
      opt = amsgrad_optimizer(cls, ps, mixed)
      to_torch(state, opt, params)
      xs = [np.asarray(x) for x in jax.tree.leaves(params)]
    else:
      params = torch_params(opt, like(np.float64))
      tx, state = from_torch(opt, params)
      params, state = jax_steps(tx, state, params, grads[:N])
      to_torch(state, opt, params)
      steps(opt, ps, grads[N:])
      xs = [p.detach().numpy() for p in ps]
  for i, (x, want) in enumerate(zip(xs, final_x)):
    np.testing.assert_allclose(x, want, rtol=0, atol=tol64(want), err_msg=f"parameter {i}")
  for i, (got, want) in enumerate(zip([amsgrad_state(opt, p) for p in ps], final_state)):
    assert got[3] == want[3] and (got[2] is None) == (want[2] is None), f"parameter {i}"
    for name, a, b in zip(("exp_avg", "exp_avg_sq", "max_exp_avg_sq"), got[:3], want[:3]):
      if b is not None:
        np.testing.assert_allclose(a, b, rtol=0, atol=tol64(b), err_msg=f"{name} {i}")


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_amsgrad_state_and_optimizer_must_agree(cls):
  """A state without ``max_exp_avg_sq`` is not loaded into a group with amsgrad (PyTorch's step
  would find none), nor one with it into a group without: refused, naming both state classes."""
  ps, structure = _params32()
  plain_state = from_torch(cls(ps, lr=0.1), structure)[1]
  with pytest.raises(
    ValueError, match=r"PyTorchAdamState, but param_groups\[0\]'s options take a PyTorchAdamAMSGradState"
  ):
    to_torch(plain_state, cls(ps, lr=0.1, amsgrad=True))
  amsgrad_state_ = from_torch(cls(ps, lr=0.1, amsgrad=True), structure)[1]
  with pytest.raises(ValueError, match=r"PyTorchAdamAMSGradState, but .* take a PyTorchAdamState"):
    to_torch(amsgrad_state_, cls(ps, lr=0.1))


def test_adamw_whose_group_says_coupled_continues_coupled():
  """PyTorch's Adam step reads ``decoupled_weight_decay`` from the group, whatever the class: an
  AdamW whose group is set to False runs the coupled (L2) decay (checked: it differs from AdamW's
  own run), and ``from_torch`` continues that run, to 1e-12 in float64 (planted, the group's flag
  ignored and the class's twin kept: every element differs)."""
  x0 = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
  grads = [torch.randn(3, generator=torch.Generator().manual_seed(k), dtype=torch.float64) for k in range(5)]

  def run(steps, coupled):
    w = torch.nn.Parameter(x0.clone())
    opt = torch.optim.AdamW([w], lr=0.05, weight_decay=0.5)
    if coupled:
      opt.param_groups[0]["decoupled_weight_decay"] = False
    for g in grads[:steps]:
      w.grad = g.clone()
      opt.step()
    return w, opt

  (ref, _), (w, opt) = run(5, coupled=True), run(2, coupled=True)
  assert not torch.allclose(run(5, coupled=False)[0], ref)
  with jax.enable_x64(True):
    params = [jnp.asarray(w.detach().numpy())]
    tx, state = from_torch(opt, params)
    for g in grads[2:]:
      updates, state = tx.update([jnp.asarray(g.numpy())], state, params)
      params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(np.asarray(params[0]), ref.detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize(
  "options, key",
  [
    (dict(lr=torch.tensor(0.01)), "lr"),
    (dict(lr=0.01, betas=(torch.tensor(0.9), torch.tensor(0.99))), "betas"),
    (dict(lr=0.01, eps=torch.tensor(1e-3)), "eps"),
    (dict(lr=0.01, weight_decay=torch.tensor(0.1)), "weight_decay"),
  ],
)
def test_refuses_tensor_hyperparameters(options, key):
  """Refused, also with ``learning_rate=`` (PyTorch's own steps would still compute in float32); the
  advice, run as printed, makes the optimizer's hyperparameters floats, and the carried run then
  equals PyTorch's."""
  ps, structure = _params32()
  opt = torch.optim.AdamW(ps, **options)
  with pytest.raises(ValueError, match=rf"param_groups\[0\]\['{key}'\] is a tensor.*Python float") as refused:
    from_torch(opt, structure)
  with pytest.raises(ValueError, match=rf"param_groups\[0\]\['{key}'\] is a tensor"):
    from_torch(opt, structure, learning_rate=0.01)
  torch_runs.follow_advice(refused.value, opt)
  grads = gradients(3, np.float32)
  torch_steps(opt, ps, grads[:1])
  params = torch_params(opt, structure)
  tx, state = from_torch(opt, params)
  params, _ = jax_steps(tx, state, params, grads[1:])
  torch_steps(opt, ps, grads[1:])
  for x, p in zip(jax.tree.leaves(params), ps):
    np.testing.assert_allclose(x, p.detach().numpy(), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("betas, index", [((1.0, 0.999), 0), ((0.9, 1.5), 1), ((-0.1, 0.999), 0)])
def test_refuses_betas_out_of_range_by_their_pytorch_name(betas, index):
  """``betas`` edited after construction (PyTorch checks them only then): refused under
  ``param_groups[0]['betas'][k]``, not under the transform's ``alpha``/``beta``. ``betas[0] = 1``
  (the bias correction ``1 - beta1^t`` is 0) is refused; so is ``betas[1] = 1``, where PyTorch's
  constructor refuses it and its step, edited in, gives NaN (``exp_avg_sq / (1 - 1^t)``)."""
  ps, structure = _params32()
  opt = torch.optim.AdamW(ps, lr=0.1)
  opt.param_groups[0]["betas"] = betas
  with pytest.raises(ValueError, match=rf"param_groups\[0\]\['betas'\]\[{index}\]"):
    from_torch(opt, structure)
  opt.param_groups[0]["betas"] = (0.9, 1.0)
  with pytest.raises(ValueError, match=r"param_groups\[0\]\['betas'\]\[1\] must be < 1.0.*division by zero"):
    from_torch(opt, structure)
  with pytest.raises(ValueError, match=r"betas\[1\] must be < 1.0"):
    onnx_optax.pytorch_adam(0.1, betas=(0.9, 1.0))


def test_refuses_complex_parameters():
  ps = [torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))]
  opt = torch.optim.Adam(ps, lr=0.1)
  with pytest.raises(ValueError, match=r"\['params'\]\[0\] is complex: .*torch.view_as_real"):
    from_torch(opt, [jnp.zeros(3, jnp.complex64)])


def test_refuses_differentiable():
  ps, structure = _params32()
  opt = torch.optim.AdamW(ps, lr=0.1, differentiable=True)
  with pytest.raises(ValueError, match="differentiable=True"):
    from_torch(opt, structure)


def test_refuses_subclasses_and_unknown_options():
  class MyAdamW(torch.optim.AdamW):
    pass

  ps, structure = _params32()
  with pytest.raises(TypeError, match="subclasses a PyTorch optimizer"):
    from_torch(MyAdamW(ps, lr=0.1), structure)
  opt = torch.optim.Adam(ps, lr=0.1)
  opt.param_groups[0]["nesterov"] = True  # an option some other Adam has (NAdam's momentum decay)
  with pytest.raises(ValueError, match=r"options \['nesterov'\] that torch.optim.Adam does not have"):
    from_torch(opt, structure)


def test_refuses_other_adam_family_optimizers():
  """The Adam family's classes that no twin binds (read from the registry: others bind some now)."""
  ps, structure = _params32()
  family = (torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax)
  for cls in (c for c in family if c.__name__ not in _torch_optim.twins()):
    with pytest.raises(TypeError, match=rf"no onnx_optax rule is torch.optim.*{cls.__name__}"):
      from_torch(cls(ps), structure)


@pytest.mark.parametrize("step", [2.0**31, 2.5, -1.0])
def test_refuses_a_step_that_is_not_a_count(step):
  """The count is PyTorch's ``step``, an int32: PyTorch's ``step`` must be an integer in
  [0, 2**31 - 1]; the largest is carried."""
  ps, structure = _params32()
  opt = adamw(ps)
  torch_steps(opt, ps, gradients(1, np.float32))
  opt.state[ps[0]]["step"] = torch.tensor(step, dtype=torch.float64)  # float32 would round 2**31 - 1
  with pytest.raises(ValueError, match=rf"AdamW's step of a parameter is {step}, not a count of updates"):
    from_torch(opt, structure)
  for carried in (2.0**31 - 1, 0.0):  # 0: a state loaded before any step
    opt.state[ps[0]]["step"] = torch.tensor(carried, dtype=torch.float64)
    from_torch(opt, structure)


def test_to_torch_writes_steps_up_to_float32s_exact_range():
  """PyTorch's Adam ``step`` (the updates done) is ORT's count minus one, a float32 on fused and
  capturable paths: 2**24 is written, 2**24 + 1 refused; a count of 0 (no update done before the
  next, only without bias correction) has no PyTorch step and is refused."""
  ps, structure = _params32()
  opt = adamw(ps)
  params = torch_params(opt, structure)

  def state(count, **options):
    return onnx_optax.ort_adamw(0.1, weight_decay=0.0, initial_count=count, **options).init(params)

  to_torch(state(2**24 + 1), opt, params)
  assert float(opt.state[ps[0]]["step"]) == 2**24
  with pytest.raises(ValueError, match=r"has count 16777218, beyond 2\*\*24"):
    to_torch(state(2**24 + 2), opt, params)
  with pytest.raises(
    ValueError, match=r"count 0: .*step 1 or later \(count >= 1, ort_adamw's initial_count\)"
  ):
    to_torch(state(0, adam_mode=1, correct_bias=False), opt, params)


def test_to_torch_refuses_before_writing():
  ps, structure = _params32()
  opt = adamw(ps)
  torch_steps(opt, ps, gradients(2, np.float32))
  before = [(p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()}) for p in ps]
  params = torch_params(opt, structure)
  tx, state = from_torch(opt, params)
  sgd_state = from_torch(torch.optim.SGD(ps, lr=0.1, momentum=0.9), params)[1]
  needs = "PyTorchSGDState, this optimizer needs PyTorchAdamState or PyTorchAdamAMSGradState or OrtAdamWState"
  with pytest.raises(TypeError, match=needs):
    to_torch(sgd_state, opt, params)
  narrow = jax.tree.map(lambda x: x.astype(jnp.float16) if x.dtype == jnp.float32 else x, state)
  with pytest.raises(
    ValueError, match=r"the state of param_groups\[0\]\['params'\]\[0\] has shape \(3,\) and dtype float16"
  ):
    to_torch(narrow, opt, params)
  for p, (x, slot) in zip(ps, before):
    assert torch.equal(p.detach(), x)
    assert all(torch.equal(opt.state[p][k], v) for k, v in slot.items())


# --- the rest of the family (docs/adam_family.md) ------------------------------


def _torch_run(opt, ps, grads):
  for step_grads in grads:
    for p, g in zip(ps, step_grads):
      p.grad = torch.from_numpy(np.array(g))
    opt.step()


@pytest.mark.parametrize(
  "make_torch, make_optax",
  [
    (
      lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-3),
      lambda: optax.adam(0.02, b1=0.8, b2=0.99, eps=1e-3),
    ),
    (
      lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.1),
      lambda: optax.chain(optax.add_decayed_weights(0.1), optax.adam(0.02, b1=0.8, b2=0.99, eps=1e-3)),
    ),
    (
      lambda ps: torch.optim.AdamW(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.1),
      lambda: optax.adamw(0.02, b1=0.8, b2=0.99, eps=1e-3, weight_decay=0.1),
    ),
  ],
  ids=["adam", "adam_l2", "adamw"],
)
def test_optax_adam_and_adamw_are_torchs(make_torch, make_optax):
  """``optax.adam`` / ``adamw`` are PyTorch's ``Adam`` / ``AdamW`` in exact arithmetic (another order).

  PyTorch's state loads into Optax's as ``ScaleByAdamState(count=step,
  mu=exp_avg, nu=exp_avg_sq)`` (Optax's ``count`` counts updates done, as
  ``step`` does): 30 steps in PyTorch, 70 in Optax, against 100 in PyTorch, to
  1e-12 in float64.
  """
  N, M = 30, 70
  with jax.enable_x64(True):
    x0, grads = initial(np.float64), gradients(N + M, np.float64)
    ps_ref = torch_parameters(x0)
    _torch_run(make_torch(ps_ref), ps_ref, grads)
    ps = torch_parameters(x0)
    opt = make_torch(ps)
    _torch_run(opt, ps, grads[:N])
    params = [jnp.asarray(p.detach().numpy()) for p in ps]
    tx = make_optax()
    state = optax.tree_utils.tree_set(
      tx.init(params),
      count=jnp.asarray(N, jnp.int32),
      mu=[jnp.asarray(opt.state[p]["exp_avg"].numpy()) for p in ps],
      nu=[jnp.asarray(opt.state[p]["exp_avg_sq"].numpy()) for p in ps],
    )
    params, _ = jax_steps(tx, state, params, grads[N:])
    for i, (x, p) in enumerate(zip(params, ps_ref)):
      expected = p.detach().numpy()
      assert_close(np.asarray(x), expected, tol64(expected), f"parameter {i}")


def test_ort_adamw_mode1_is_onnx_adam_with_post_decay():
  """Hugging Face's AdamW (mode 1) is ONNX Adam from ``T = 1`` with ``norm_coefficient_post = lr wd``.

  Both put epsilon after the bias correction ("epsilon hat") and shrink the
  already updated weights; without decay mode 1 is DirectML Adam. Float64,
  100 steps, to 1e-12: two rules written independently in rules.py, each
  checked against its own reference elsewhere (ORT's kernel, ONNX's
  reference evaluator, Keras).
  """
  lr, wd, hyper = 0.02, 0.1, dict(alpha=0.8, beta=0.99, epsilon=1e-3)
  with jax.enable_x64(True):
    x0, grads = initial(np.float64), gradients(100, np.float64)
    params = [jnp.asarray(x) for x in x0]
    pairs = [
      (
        onnx_optax.ort_adamw(lr, **hyper, weight_decay=wd, adam_mode=1),
        onnx_optax.adam(lr, **hyper, norm_coefficient_post=lr * wd, initial_count=1),
      ),
      (
        onnx_optax.ort_adamw(lr, **hyper, weight_decay=0.0, adam_mode=1),
        onnx_optax.directml_adam(lr, beta1=0.8, beta2=0.99, epsilon=1e-3),
      ),
    ]
    for ours, theirs in pairs:
      a, _ = jax_steps(ours, ours.init(params), params, grads)
      b, _ = jax_steps(theirs, theirs.init(params), params, grads)
      for i, (x, y) in enumerate(zip(a, b)):
        assert_close(np.asarray(x), np.asarray(y), tol64(np.asarray(y)), f"parameter {i}")
      # and not mode 0: epsilon's place matters at eps = 1e-3
      c, _ = jax_steps(
        onnx_optax.ort_adamw(lr, **hyper, weight_decay=0.0),
        onnx_optax.ort_adamw(lr, **hyper).init(params),
        params,
        grads,
      )
      assert max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(c, b)) > 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_state_round_trips_bit_for_bit(dtype):
  """bfloat16 / float16 moments and the float32 step go to JAX and back unchanged."""
  ps = [torch.nn.Parameter(torch.randn(5, generator=torch.Generator().manual_seed(0)).to(dtype))]
  # betas[1] = 0.99: 0.999 rounds to 1 in bfloat16, which the transform refuses (next test).
  opt = torch.optim.AdamW(ps, lr=0.1, betas=(0.9, 0.99))
  for seed in (1, 2):
    ps[0].grad = torch.randn(5, generator=torch.Generator().manual_seed(seed)).to(dtype)
    opt.step()
  name = str(dtype).removeprefix("torch.")
  params = torch_params(opt, [jax.ShapeDtypeStruct((5,), jnp.dtype(name))])
  tx, state = from_torch(opt, params)
  assert state.exp_avg[0].dtype == state.exp_avg_sq[0].dtype == jnp.dtype(name) and int(state.count) == 2
  ps2 = [torch.nn.Parameter(torch.zeros(5, dtype=dtype))]
  opt2 = torch.optim.AdamW(ps2, lr=0.1, betas=(0.9, 0.99))
  to_torch(state, opt2, params)
  slot, slot2 = opt.state[ps[0]], opt2.state[ps2[0]]
  for key in ("exp_avg", "exp_avg_sq", "step"):
    assert slot2[key].dtype == slot[key].dtype and torch.equal(slot2[key], slot[key]), key
  assert torch.equal(ps2[0], ps[0])


def test_a_decay_that_rounds_to_one_is_carried_as_pytorch_runs_it():
  """bfloat16 rounds ``exp_avg_sq.mul_(0.999)`` back to ``exp_avg_sq``: PyTorch's bfloat16 moment
  never decays, and the PyTorch-order twin does as PyTorch does (the spec-order rule refuses
  such a decay), to the bit over a step."""
  ps = [torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0], dtype=torch.bfloat16))]
  opt = torch.optim.AdamW(ps, lr=0.1)
  ps[0].grad = torch.tensor([0.25, 0.5, -1.0], dtype=torch.bfloat16)
  opt.step()
  params = torch_params(opt, [jax.ShapeDtypeStruct((3,), jnp.bfloat16)])
  tx, state = from_torch(opt, params)
  g = jnp.array([0.5, -0.25, 1.0], jnp.bfloat16)
  updates, state = tx.update([g], state, params)
  ps[0].grad = torch.tensor([0.5, -0.25, 1.0], dtype=torch.bfloat16)
  opt.step()
  ours = np.asarray(optax.apply_updates(params, updates)[0], np.float32)
  assert np.array_equal(ours, ps[0].detach().float().numpy())
  assert np.array_equal(
    np.asarray(state.exp_avg_sq[0], np.float32), opt.state[ps[0]]["exp_avg_sq"].float().numpy()
  )
