"""Scheduled PyTorch runs through the state dicts: each step's learning rate PyTorch's, both ways.

* Into JAX: a ``learning_rate`` schedule receives the transform's count as a Python int's
  quotient would need it (int64 under ``jax_enable_x64``), so the recipe of docs/interop.md,
  ``lambda n: base * f(n + step)``, computes PyTorch's float64 rate: the carried run equals
  PyTorch's to 1e-12. A rate rounded to float32 for float64 parameters is refused, and the
  advice of the refusal, followed, gives the exact run.
* Back to PyTorch: ``to_torch_state_dict`` writes the rate of PyTorch's next step and
  ``to_torch_scheduler_state_dict`` the scheduler's state after the JAX updates; PyTorch's own
  resume (``load_state_dict`` of both, no scheduler step by hand) then continues the run that
  never left PyTorch, for every scheduler class the bridge writes; the others are refused.
* ``param_names`` places the parameters of an index-keyed state dict by name.

The expectation is always PyTorch's own run, N + M + K steps.
"""

from __future__ import annotations

import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch_runs
from interop_data import gradients, initial
from torch.optim import lr_scheduler

import onnx_optax
from onnx_optax.interop import (
  from_torch,
  from_torch_state_dict,
  to_torch_scheduler_state_dict,
  to_torch_state_dict,
  torch_param_names,
)

N, M, K = 3, 4, 3
WARMUP, TOTAL = 4, 12


def _factor(step):
  """transformers' get_linear_schedule_with_warmup factor, as PyTorch's LambdaLR evaluates it."""
  if step < WARMUP:
    return float(step) / float(max(1, WARMUP))
  return max(0.0, float(TOTAL - step) / float(max(1, TOTAL - WARMUP)))


OPTIMIZERS = {
  "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
  "Adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1),
  "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01),
}


def _saved(obj):
  """``obj`` through ``torch.save`` and ``torch.load``, as a file holds it."""
  buffer = io.BytesIO()
  torch.save(obj, buffer)
  buffer.seek(0)
  return torch.load(buffer, weights_only=True)


def _warmup_run(kind, steps):
  """PyTorch's run with the Trainer's linear warmup (a LambdaLR); the parameters after each step."""
  ps = torch_runs.torch_parameters(initial(np.float64))
  opt = OPTIMIZERS[kind](ps)
  scheduler = lr_scheduler.LambdaLR(opt, _factor)
  records = []
  for step_grads in gradients(steps, np.float64):
    for p, g in zip(ps, step_grads):
      p.grad = torch.from_numpy(g)
    opt.step()
    scheduler.step()
    records.append([p.detach().numpy().copy() for p in ps])
  return ps, opt, records


def test_a_schedule_receives_an_int64_count_under_x64():
  """The count a schedule receives: int64 under x64 (``n / 4`` is float64, as PyTorch's rate), int32 without
  (no int64 there); in both engines (an ONNX rule and a PyTorch-order twin)."""
  for x64, want in ((True, "int64"), (False, "int32")):
    with jax.enable_x64(x64):
      for make in (
        lambda s: onnx_optax.pytorch_sgd(s, momentum=0.9),
        lambda s: onnx_optax.momentum(s, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0),
      ):
        seen = []

        def schedule(n, seen=seen):
          seen.append((n.dtype.name, (n / 4).dtype.name))
          return 0.1 * (n + 1) / 4

        tx = make(schedule)
        params = jnp.ones(2)
        jax.jit(tx.update)(jnp.ones(2), tx.init(params), params)
        assert seen == [(want, "float64" if x64 else "float32")], seen


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_the_documented_schedule_recipe_is_exact_in_float64(kind):
  """N PyTorch steps with the Trainer's warmup, the state dict saved, M JAX steps with the schedule as
  docs/interop.md writes it (``base * f(n + step)``, integer arithmetic on ``n``): PyTorch's run to 1e-12.
  With an int32 count the rate was float32: 1.5e-8 relative off at the first step."""
  with jax.enable_x64(True):
    ps, opt, records = _warmup_run(kind, N)
    saved = _saved(opt.state_dict())
    _, _, want = _warmup_run(kind, N + M)
    base, step = saved["param_groups"][0]["initial_lr"], N

    def schedule(n):
      t = n + step
      return base * jnp.where(t < WARMUP, t / WARMUP, jnp.maximum(0.0, (TOTAL - t) / (TOTAL - WARMUP)))

    params = [jnp.asarray(p.detach().numpy()) for p in ps]
    tx, state = from_torch_state_dict(saved, params, learning_rate=schedule)
    params, _ = torch_runs.jax_steps(tx, state, params, gradients(N + M, np.float64)[N:])
    for x, y in zip(params, want[-1]):
      np.testing.assert_allclose(np.asarray(x), y, rtol=1e-12)


def test_a_rate_narrower_than_the_parameters_is_refused_and_the_advice_works():
  """A schedule that casts its count to int32 computes a float32 rate for float64 parameters: refused
  when the transform evaluates it (under jit), with the advice to use n as passed; followed, the run is
  PyTorch's to 1e-12. float32 parameters take a float32 rate. The live bridge names the schedule as
  passed: ``learning_rate`` for one, ``learning_rate[g]`` for group g's in a list."""
  with jax.enable_x64(True):
    ps, opt, _ = _warmup_run("SGD", N)
    saved = _saved(opt.state_dict())
    _, _, want = _warmup_run("SGD", N + M)
    base = saved["param_groups"][0]["initial_lr"]

    def factor(t):
      return jnp.where(t < WARMUP, t / WARMUP, jnp.maximum(0.0, (TOTAL - t) / (TOTAL - WARMUP)))

    params = [jnp.asarray(p.detach().numpy()) for p in ps]
    tx, state = from_torch_state_dict(
      saved, params, learning_rate=lambda n: base * factor(n.astype(jnp.int32) + N)
    )
    with pytest.raises(TypeError) as refused:
      jax.jit(tx.update)([jnp.zeros_like(x) for x in params], state, params)
    message = str(refused.value)
    assert "learning_rate's value is a float32 array for float64 parameters" in message
    assert "write n, not n.astype(jnp.int32)" in message
    tx, state = from_torch_state_dict(
      saved, params, learning_rate=lambda n: base * factor(n + N)
    )  # as advised
    params, _ = torch_runs.jax_steps(tx, state, params, gradients(N + M, np.float64)[N:])
    for x, y in zip(params, want[-1]):
      np.testing.assert_allclose(np.asarray(x), y, rtol=1e-12)

    narrow = lambda n: base * factor(n.astype(jnp.int32))  # noqa: E731
    wide = lambda n: base * factor(n)  # noqa: E731
    two = [torch.nn.Parameter(torch.ones(2, dtype=torch.float64)) for _ in range(2)]
    p64 = [jnp.ones(2, jnp.float64), jnp.ones(2, jnp.float64)]
    for rate, named in ((narrow, "learning_rate's"), ([wide, narrow], "learning_rate[1]'s")):
      opt = torch.optim.SGD([{"params": [two[0]]}, {"params": [two[1]]}], lr=0.1)
      tx, state = from_torch(opt, p64, learning_rate=rate)
      with pytest.raises(TypeError, match=re.escape(f"{named} value is a float32 array")):
        jax.jit(tx.update)(p64, state, p64)

    p32 = torch.nn.Parameter(torch.ones(2))
    tx, state = from_torch(
      torch.optim.SGD([p32], lr=0.1), [jnp.ones(2, jnp.float32)], learning_rate=lambda n: jnp.float32(0.1)
    )
    jax.jit(tx.update)([jnp.ones(2, jnp.float32)], state, [jnp.ones(2, jnp.float32)])


SCHEDULERS = {
  "StepLR": lambda o: lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
  "MultiStepLR": lambda o: lr_scheduler.MultiStepLR(o, milestones=[2, 5, 8], gamma=0.3),
  "ConstantLR": lambda o: lr_scheduler.ConstantLR(o, factor=0.5, total_iters=5),
  "LinearLR": lambda o: lr_scheduler.LinearLR(o, start_factor=0.2, total_iters=5),
  "ExponentialLR": lambda o: lr_scheduler.ExponentialLR(o, gamma=0.9),
  "PolynomialLR": lambda o: lr_scheduler.PolynomialLR(o, total_iters=8, power=2.0),
  "CosineAnnealingLR": lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=5, eta_min=0.01),
  "CosineAnnealingWarmRestarts": lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2),
  "LambdaLR": lambda o: lr_scheduler.LambdaLR(o, _factor),
  "MultiplicativeLR": lambda o: lr_scheduler.MultiplicativeLR(o, lambda epoch: 0.95),
}
SAVES_NO_FUNCTION = {"LambdaLR", "MultiplicativeLR"}


def _two_groups(values):
  ps = torch_runs.torch_parameters(values)
  groups = [{"params": [ps[i] for i in g]} for g in torch_runs.GROUPS]
  groups[1]["lr"] = 0.05
  return ps, torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=0.01)


def _scheduled_steps(ps, opt, scheduler, grads):
  """PyTorch's loop: ``opt.step()`` then ``scheduler.step()``; the groups' rates each step used."""
  rates = []
  for step_grads in grads:
    for p, g in zip(ps, step_grads):
      p.grad = torch.from_numpy(g)
    rates.append([group["lr"] for group in opt.param_groups])
    opt.step()
    scheduler.step()
  return rates


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_a_scheduled_run_written_back_resumes_in_pytorchs_own_resume(name, tmp_path):
  """N steps with a scheduler, both state dicts saved; M JAX steps at PyTorch's rates; written back with
  to_torch_state_dict and to_torch_scheduler_state_dict; a fresh optimizer and scheduler load both, as a
  client resumes, and take K steps with no scheduler step by hand: the parameters equal PyTorch's run
  to 1e-12, and the scheduler's state equals its own (the rates to the bit). Before, the written groups
  kept the template's rate: SGD + StepLR resumed at 0.05 where the scheduler said 0.025."""
  grads = gradients(N + M + K, np.float64)
  with jax.enable_x64(True):
    ps_ref, opt_ref = _two_groups(initial(np.float64))
    scheduler_ref = SCHEDULERS[name](opt_ref)
    rates = _scheduled_steps(ps_ref, opt_ref, scheduler_ref, grads)
    rates.append([group["lr"] for group in opt_ref.param_groups])

    ps, opt = _two_groups(initial(np.float64))
    scheduler = SCHEDULERS[name](opt)
    _scheduled_steps(ps, opt, scheduler, grads[:N])
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp_path / "scheduler.pt")
    saved = torch.load(tmp_path / "optimizer.pt", weights_only=True)
    saved_scheduler = torch.load(tmp_path / "scheduler.pt", weights_only=True)

    params = [jnp.asarray(p.detach().numpy()) for p in ps]
    table = jnp.asarray(rates)  # the JAX steps at PyTorch's own rates
    schedules = [lambda n, g=g: table[n + N, g] for g in range(2)]
    tx, state = from_torch_state_dict(saved, params, learning_rate=schedules)
    params, state = torch_runs.jax_steps(tx, state, params, grads[N : N + M])

    given = [float(table[N + M, g]) for g in range(2)] if name in SAVES_NO_FUNCTION else None
    later = to_torch_scheduler_state_dict(saved_scheduler, saved, steps=M, learning_rate=given)
    written = to_torch_state_dict(state, saved, learning_rate=later["_last_lr"])
    torch.save(written, tmp_path / "optimizer.pt")
    torch.save(later, tmp_path / "scheduler.pt")

    ps2, opt2 = _two_groups([np.asarray(x) for x in params])
    scheduler2 = SCHEDULERS[name](opt2)  # as a client builds them, then loads both files
    opt2.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    scheduler2.load_state_dict(torch.load(tmp_path / "scheduler.pt", weights_only=True))
    _scheduled_steps(ps2, opt2, scheduler2, grads[N + M :])
    for p, q in zip(ps2, ps_ref):
      np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12)
    assert scheduler2.state_dict()["last_epoch"] == scheduler_ref.state_dict()["last_epoch"] == N + M + K
    assert scheduler2.get_last_lr() == scheduler_ref.get_last_lr()
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt_ref.param_groups]


def _stepped(make_scheduler=lambda o: lr_scheduler.StepLR(o, step_size=1, gamma=0.5)):
  ps, opt = _two_groups(initial(np.float32))
  scheduler = make_scheduler(opt)
  _scheduled_steps(ps, opt, scheduler, gradients(N, np.float32))
  params = [jnp.asarray(p.detach().numpy()) for p in ps]
  tx, state = from_torch_state_dict(opt.state_dict(), params, learning_rate=0.1)
  return opt, scheduler, state


def test_a_schedulers_template_needs_the_rate_and_the_advice_works():
  """like's groups carry initial_lr: without learning_rate the written lr would be the rate at like's
  step; refused, quoting the value that keeps like's, which, passed as printed, is written."""
  opt, _, state = _stepped()
  with pytest.raises(ValueError) as refused:
    to_torch_state_dict(state, opt.state_dict())
  message = str(refused.value)
  assert "like's param groups have 'initial_lr'" in message and "to_torch_scheduler_state_dict" in message
  advice = re.search(r"(learning_rate=\[[^\]]*\]) keeps like's", message)
  assert advice is not None, message
  written = eval(
    f"to_torch_state_dict(state, like, {advice.group(1)})",
    {**globals(), "state": state, "like": opt.state_dict()},
  )
  assert (
    [g["lr"] for g in written["param_groups"]] == [g["lr"] for g in opt.param_groups] == [0.0125, 0.00625]
  )
  with pytest.raises(TypeError, match=r"learning_rate is a schedule; .* learning_rate=schedule\(m\)"):
    to_torch_state_dict(state, opt.state_dict(), learning_rate=lambda n: 0.1)
  with pytest.raises(TypeError, match=r"learning_rate\[1\] is a schedule"):
    to_torch_state_dict(state, opt.state_dict(), learning_rate=[0.1, lambda n: 0.1])
  tensor_lr = opt.state_dict()
  tensor_lr["param_groups"][0]["lr"] = torch.tensor(0.0125, dtype=torch.float64)
  written = to_torch_state_dict(state, tensor_lr, learning_rate=0.5)
  assert (
    written["param_groups"][0]["lr"].dtype == torch.float64 and float(written["param_groups"][0]["lr"]) == 0.5
  )


def test_one_group_of_named_parameters_under_a_scheduler():
  """``AdamW(named_parameters())`` under a scheduler, one group: it keeps every option PyTorch 2.13
  has, ``param_names`` and ``initial_lr`` included, and the state dict alone still says AdamW.
  Written back without a rate, it is refused, quoting the one rate that keeps like's, which, passed
  as printed, is written."""
  ps = torch_runs.torch_parameters(initial(np.float32))
  opt = torch.optim.AdamW([(f"w{i}", p) for i, p in enumerate(ps)], lr=0.01, weight_decay=0.01)
  scheduler = lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
  _scheduled_steps(ps, opt, scheduler, gradients(N, np.float32))
  like = opt.state_dict()
  assert {"param_names", "initial_lr", "decoupled_weight_decay"} <= set(like["param_groups"][0])
  params = {f"w{i}": jnp.asarray(p.detach().numpy()) for i, p in enumerate(ps)}
  tx, state = from_torch_state_dict(like, params, learning_rate=0.01)
  assert type(state).__name__ == "PyTorchAdamState" and int(state.count) == N
  with pytest.raises(ValueError) as refused:
    to_torch_state_dict(state, like)
  advice = re.search(r"(learning_rate=\S+) keeps like's", str(refused.value))
  assert advice is not None and advice.group(1) == f"learning_rate={opt.param_groups[0]['lr']!r}", (
    refused.value
  )
  written = eval(
    f"to_torch_state_dict(state, like, {advice.group(1)})", {**globals(), "state": state, "like": like}
  )
  assert written["param_groups"][0]["lr"] == opt.param_groups[0]["lr"] == 0.01 * 0.5**N


def test_a_group_added_after_the_scheduler_still_needs_the_rate():
  """A group added with ``add_param_group`` after the scheduler was built has no ``initial_lr``, the
  scheduled group has: its ``lr`` is still the schedule's at like's step, and the rate is still
  needed (planted, needed only when every group is scheduled: the stale rate is written)."""
  a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
  opt = torch.optim.SGD([a], lr=0.1, momentum=0.9)
  scheduler = lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
  opt.add_param_group({"params": [b], "lr": 0.05})
  for p in (a, b):
    p.grad = torch.ones_like(p)
  opt.step()
  scheduler.step()
  saved = opt.state_dict()
  assert ["initial_lr" in g for g in saved["param_groups"]] == [True, False]
  _, state = from_torch_state_dict(saved, [jnp.ones(2), jnp.ones(2)], learning_rate=[0.05, 0.05])
  with pytest.raises(ValueError, match="like's param groups have 'initial_lr'"):
    to_torch_state_dict(state, saved)


@pytest.mark.parametrize(
  "make, what",
  [
    (lambda o: lr_scheduler.ReduceLROnPlateau(o), "ReduceLROnPlateau's: it steps on a metric"),
    (lambda o: lr_scheduler.CyclicLR(o, 0.01, 0.1), "CyclicLR's: it also cycles the momentum"),
    (lambda o: lr_scheduler.OneCycleLR(o, 0.1, total_steps=20), "OneCycleLR's: it also cycles the momentum"),
    (
      lambda o: lr_scheduler.SequentialLR(
        o, [lr_scheduler.ConstantLR(o, 0.5, 2), lr_scheduler.ExponentialLR(o, 0.9)], [2]
      ),
      "SequentialLR's or a ChainedScheduler's",
    ),
    (
      lambda o: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(o, 0.5, 2), lr_scheduler.ExponentialLR(o, 0.9)]
      ),
      "SequentialLR's or a ChainedScheduler's",
    ),
  ],
)
def test_schedulers_whose_state_cannot_be_written_are_refused(make, what):
  ps, opt = _two_groups(initial(np.float32))
  scheduler = make(opt)
  with pytest.raises(TypeError, match=f"scheduler_state_dict is a {re.escape(what)}"):
    to_torch_scheduler_state_dict(scheduler.state_dict(), opt.state_dict(), steps=2)


def test_scheduler_refusals_name_what_is_missing_and_the_advice_works():
  """A LambdaLR saves no function: refused without learning_rate, accepted with the rate; a replayed
  scheduler checks a given rate; a scheduler and an optimizer of other steps, bad steps, not a
  scheduler: each refused."""
  opt, scheduler, _ = _stepped(lambda o: lr_scheduler.LambdaLR(o, lambda epoch: 0.5**epoch))
  with pytest.raises(ValueError, match=r"does not save its functions .* learning_rate=schedule\(2\)"):
    to_torch_scheduler_state_dict(scheduler.state_dict(), opt.state_dict(), steps=2)
  schedule = lambda n: [0.1 * 0.5 ** (n + N), 0.05 * 0.5 ** (n + N)]
  later = to_torch_scheduler_state_dict(
    scheduler.state_dict(), opt.state_dict(), steps=2, learning_rate=schedule(2)
  )
  assert later["_last_lr"] == [0.1 * 0.5**5, 0.05 * 0.5**5] and later["last_epoch"] == N + 2
  assert scheduler.state_dict()["last_epoch"] == N  # not modified

  opt, scheduler, _ = _stepped()
  assert to_torch_scheduler_state_dict(
    scheduler.state_dict(), opt.state_dict(), steps=1, learning_rate=[0.00625, 0.003125]
  )
  with pytest.raises(
    ValueError, match=r"learning_rate\[0\] is 0.0125, but the StepLR .* gives 0.00625 after 1 steps"
  ):
    to_torch_scheduler_state_dict(scheduler.state_dict(), opt.state_dict(), steps=1, learning_rate=0.0125)
  saved_states = scheduler.state_dict(), opt.state_dict()
  assert to_torch_scheduler_state_dict(*saved_states, steps=0) == scheduler.state_dict()  # no update yet
  # A schedule at its end, rate 0: a given 0.0, or an integer 0, agrees.
  opt_end, ended, _ = _stepped(lambda o: lr_scheduler.PolynomialLR(o, total_iters=N + 1, power=1.0))
  ended_states = ended.state_dict(), opt_end.state_dict()
  for zero in (0.0, np.int64(0)):
    later = to_torch_scheduler_state_dict(*ended_states, steps=1, learning_rate=zero)
    assert later["_last_lr"] == [0.0, 0.0]
  # A given rate agrees to the square root of its dtype's epsilon, relative: 2**-26 (1.49e-8) for a Python
  # float, 2**-11.5 (3.45e-4) for a float32.
  for off, dtype in ((1.3e-8, float), (1.7e-8, float), (3e-4, np.float32), (4e-4, np.float32)):
    given = [dtype(0.00625 * (1 + off)), 0.003125]
    if off in (1.3e-8, 3e-4):
      later = to_torch_scheduler_state_dict(*saved_states, steps=1, learning_rate=given)
      assert later["_last_lr"] == [0.00625, 0.003125]  # the scheduler's own
    else:
      with pytest.raises(ValueError, match=r"learning_rate\[0\] is 0.0062\d*, but the StepLR"):
        to_torch_scheduler_state_dict(*saved_states, steps=1, learning_rate=given)
  other_step = opt.state_dict()
  other_step["param_groups"][0]["lr"] = 0.1
  with pytest.raises(ValueError, match=r"were not saved at the same step"):
    to_torch_scheduler_state_dict(scheduler.state_dict(), other_step, steps=1)
  for steps in (-1, 1.5, True):
    with pytest.raises(ValueError, match=r"steps must be the number of JAX updates, an int >= 0"):
      to_torch_scheduler_state_dict(scheduler.state_dict(), opt.state_dict(), steps=steps)
  with pytest.raises(
    TypeError, match=r"must be a learning-rate scheduler's state dict .* got \['param_groups', 'state'\]"
  ):
    to_torch_scheduler_state_dict(opt.state_dict(), opt.state_dict(), steps=1)
  with pytest.raises(TypeError, match=r"must be a learning-rate scheduler's state dict .* got list$"):
    to_torch_scheduler_state_dict([scheduler.state_dict()], opt.state_dict(), steps=1)
  for like in ({"state": {}}, [opt.state_dict()]):
    with pytest.raises(TypeError, match=r"like must be an optimizer state dict \(\{'state'"):
      to_torch_scheduler_state_dict(scheduler.state_dict(), like, steps=1)
  odd = {**scheduler.state_dict(), "warmup": 3}
  with pytest.raises(TypeError, match=r"has the options \['gamma', 'step_size', 'warmup'\]"):
    to_torch_scheduler_state_dict(odd, opt.state_dict(), steps=1)
  base = ("base_lrs", "last_epoch", "_step_count", "_last_lr")  # what every scheduler saves, no options
  bare = {k: v for k, v in scheduler.state_dict().items() if k in base}
  with pytest.raises(TypeError, match=r"has the options \[\], which are not those of"):
    to_torch_scheduler_state_dict(bare, opt.state_dict(), steps=1)


def test_param_names_place_an_index_keyed_state_dict_by_name():
  """Two parameters of one shape: keyed by the names torch_param_names gives, each JAX leaf meets its
  own state, in any dict order; the names are checked."""
  model = torch.nn.Sequential(
    torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)
  ).double()
  decay = [model[0].weight, model[2].weight]  # decayed first, as the Trainer groups them
  rest = [p for p in model.parameters() if all(p is not q for q in decay)]
  opt = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=0.01)
  for i, p in enumerate(model.parameters()):
    p.grad = torch.full_like(p, float(i + 1))
  opt.step()
  saved = _saved(opt.state_dict())
  names = torch_param_names(opt, model)
  assert names == ["0.weight", "2.weight", "0.bias", "1.weight", "1.bias", "2.bias", "3.weight", "3.bias"]
  with jax.enable_x64(True):
    params = {n: jnp.asarray(p.detach().numpy()) for n, p in reversed(list(model.named_parameters()))}
    _, state = from_torch_state_dict(saved, params, param_names=names)
    exp_avg = {}  # each group's transform holds its own leaves (the others are masked)
    for inner in state.inner_states.values():
      exp_avg.update(
        {n: v for n, v in inner.inner_state.exp_avg.items() if not isinstance(v, optax.MaskedNode)}
      )
    for i, name in enumerate(names):
      np.testing.assert_array_equal(np.asarray(exp_avg[name]), saved["state"][i]["exp_avg"].numpy())
    back = to_torch_state_dict(state, saved, param_names=names)
    for i in range(len(names)):
      assert torch.equal(back["state"][i]["exp_avg_sq"], saved["state"][i]["exp_avg_sq"])
    renamed = {("1.w" if n == "1.weight" else n): v for n, v in params.items()}
    with pytest.raises(ValueError, match=r"no leaf for \['1.weight'\]; leaves named \['1.w'\]"):
      from_torch_state_dict(saved, renamed, param_names=names)
    with pytest.raises(ValueError, match=r"param_names has 7 entries but state_dict's param groups list 8"):
      from_torch_state_dict(saved, params, param_names=names[:7])
    with pytest.raises(ValueError, match=r"param_names names several parameters \['0.bias'\]"):
      from_torch_state_dict(saved, params, param_names=[*names[:3], "0.bias", *names[4:]])
    with pytest.raises(TypeError, match=r"param_names must be a list of names"):
      from_torch_state_dict(saved, params, param_names="0.weight")
    named = {
      **saved,
      "param_groups": [
        {**g, "param_names": names[:2] if i == 0 else names[2:]} for i, g in enumerate(saved["param_groups"])
      ],
    }
    with pytest.raises(
      ValueError, match=r"param_names\[1\] is '0.bias', but state_dict names its parameter 1 '2.weight'"
    ):
      from_torch_state_dict(named, params, param_names=[names[0], names[2], names[1], *names[3:]])
  with pytest.raises(
    ValueError,
    match=r"optimizer.param_groups\[0\]\['params'\]\[0\] \(shape \(4, 3\)\) is not a parameter of model",
  ):
    torch_param_names(opt, torch.nn.Linear(3, 4))
