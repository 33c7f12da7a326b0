"""PyTorch optimizer state dicts from files: resumed in JAX, written back, continued in PyTorch.

The expectation is always the run that never left PyTorch: N steps there, the
optimizer's state dict saved with ``torch.save`` (keyed by index) or from
``get_optimizer_state_dict`` (keyed by name, as DCP and FSDP2 write it; also
flattened, ``flatten_optimizer_state_dict=True``), loaded back from the file
alone, M steps in JAX, the state written back with
``to_torch_state_dict`` and loaded by ``load_state_dict`` /
``set_optimizer_state_dict`` into a fresh optimizer, K more steps in PyTorch:
equal to N + M + K PyTorch steps, to 1e-12 in float64.
"""

from __future__ import annotations

import copy
import json
import pickle
import re
import subprocess
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from torch.distributed.checkpoint.state_dict import (
  StateDictOptions,
  get_optimizer_state_dict,
  set_optimizer_state_dict,
)

from onnx_optax.interop import _torch_optim, from_torch_state_dict, to_torch_state_dict

N, M, K = 3, 3, 2

OPTIMIZERS = {
  "SGD": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.01),
  "SGD-nesterov": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True),
  "Adagrad": lambda groups: torch.optim.Adagrad(
    groups, lr=0.1, lr_decay=0.05, weight_decay=0.01, initial_accumulator_value=0.1
  ),
  "Adam": lambda groups: torch.optim.Adam(groups, lr=0.01, betas=(0.8, 0.99), weight_decay=0.01),
  "AdamW": lambda groups: torch.optim.AdamW(groups, lr=0.01, weight_decay=0.05),
}
# The second group's own options, so that the two groups differ.
SECOND = {
  "SGD": {"lr": 0.05, "momentum": 0.5},
  "SGD-nesterov": {"lr": 0.05},
  "Adagrad": {"lr": 0.2, "lr_decay": 0.0},
  "Adam": {"lr": 0.02, "weight_decay": 0.0},
  "AdamW": {"lr": 0.02, "weight_decay": 0.0},
}


def _model(seed=0):
  torch.manual_seed(seed)
  return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()


def _optimizer(kind, model, named):
  """Two groups: the weights, then the biases (not the model's order, so order matters)."""
  params = dict(model.named_parameters())
  pick = lambda names: [(n, params[n]) for n in names] if named else [params[n] for n in names]
  groups = [
    {"params": pick(["0.weight", "2.weight"])},
    {"params": pick(["0.bias", "2.bias"]), **SECOND[kind]},
  ]
  return OPTIMIZERS[kind](groups)


ORDER = ["0.weight", "2.weight", "0.bias", "2.bias"]  # the optimizer's order
X = torch.linspace(-1, 1, 15, dtype=torch.float64).reshape(5, 3)


def _loss(model):
  return (model(X) ** 2).mean() + model[0].bias.sum() ** 2


def _torch_steps(model, opt, steps):
  for _ in range(steps):
    opt.zero_grad()
    _loss(model).backward()
    opt.step()


def _jax_steps(tx, state, params, model, steps):
  """Steps in JAX, the gradients taken by PyTorch at JAX's weights (the same loss)."""
  for _ in range(steps):
    values = params if isinstance(params, dict) else dict(zip(ORDER, params))
    with torch.no_grad():
      for name, p in model.named_parameters():
        p.copy_(torch.from_numpy(np.array(values[name])))
    model.zero_grad()
    _loss(model).backward()
    grads = {n: jnp.asarray(p.grad.numpy()) for n, p in model.named_parameters()}
    g = grads if isinstance(params, dict) else [grads[n] for n in ORDER]
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def _save_load(obj, path):
  torch.save(obj, path)
  return torch.load(path, weights_only=True, map_location="cpu")


FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


@pytest.mark.parametrize("keyed", ["index", "index-named", "name", "flat"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_resume_from_a_file_and_back(kind, keyed, tmp_path):
  with jax.enable_x64(True):
    ref = _model()
    opt_ref = _optimizer(kind, ref, named=keyed == "index-named")
    _torch_steps(ref, opt_ref, N + M + K)

    model = _model()
    opt = _optimizer(kind, model, named=keyed == "index-named")
    _torch_steps(model, opt, N)
    if keyed == "name":
      saved = _save_load(get_optimizer_state_dict(model, opt), tmp_path / "optimizer.pt")
      assert set(saved["state"]) == set(ORDER)
    elif keyed == "flat":
      saved = _save_load(get_optimizer_state_dict(model, opt, options=FLAT), tmp_path / "optimizer.pt")
      assert "state.0.weight.momentum_buffer" in saved or "state.0.weight.step" in saved
    else:
      saved = _save_load(opt.state_dict(), tmp_path / "optimizer.pt")
      assert set(saved["state"]) == {0, 1, 2, 3}
    weights = _save_load(model.state_dict(), tmp_path / "model.pt")
    del opt  # from here on, the files alone

    named = {name: jnp.asarray(weights[name].numpy()) for name in ORDER}
    params = [named[n] for n in ORDER] if keyed == "index" else named
    tx, state = from_torch_state_dict(saved, params)
    params, state = _jax_steps(tx, state, params, model, M)

    back = to_torch_state_dict(state, saved)
    if keyed == "flat":  # the same keys, flattened as the template was
      assert list(back) == list(saved)
    fresh = _model(seed=1)  # other weights: every value below comes from the JAX run
    values = params if isinstance(params, dict) else dict(zip(ORDER, params))
    with torch.no_grad():
      for name, p in fresh.named_parameters():
        p.copy_(torch.from_numpy(np.array(values[name])))
    opt2 = _optimizer(kind, fresh, named=keyed == "index-named")
    if keyed in ("name", "flat"):
      options = FLAT if keyed == "flat" else None
      set_optimizer_state_dict(fresh, opt2, _save_load(back, tmp_path / "back.pt"), options=options)
    else:
      opt2.load_state_dict(_save_load(back, tmp_path / "back.pt"))
    _torch_steps(fresh, opt2, K)
    for (name, p), q in zip(fresh.named_parameters(), ref.parameters()):
      np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, err_msg=name)


def test_state_dict_keeps_the_templates_dtypes_devices_and_groups():
  """float32 and a float16 parameter: the written tensors keep the template's dtypes; ``like`` unchanged."""
  ps = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, dtype=torch.float16))]
  opt = torch.optim.AdamW([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.5}], lr=0.1)
  for p in ps:
    p.grad = torch.full_like(p, 0.5)
  opt.step()
  saved = opt.state_dict()
  saved["state"][1]["step"] = saved["state"][1]["step"].double()  # as a float64-default PyTorch keeps it
  before = {k: {f: v.clone() for f, v in e.items()} for k, e in saved["state"].items()}
  params = [jnp.ones(3, jnp.float32), jnp.ones(2, jnp.float16)]
  tx, state = from_torch_state_dict(saved, params)
  updates, state = tx.update([jnp.full(3, 0.5, jnp.float32), jnp.full(2, 0.5, jnp.float16)], state, params)
  back = to_torch_state_dict(state, saved)
  assert [g["lr"] for g in back["param_groups"]] == [0.1, 0.5]
  for key, entry in back["state"].items():
    for field, value in entry.items():
      assert value.dtype == saved["state"][key][field].dtype, (key, field)
      assert value.device == saved["state"][key][field].device
  assert float(back["state"][0]["step"]) == 2.0 and float(saved["state"][0]["step"]) == 1.0
  assert back["state"][1]["step"].dtype == torch.float64
  for key, entry in before.items():  # like is not modified
    for field, value in entry.items():
      assert torch.equal(saved["state"][key][field], value)
  torch.optim.AdamW([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.5}], lr=0.1).load_state_dict(back)


def _stepped_adamw(p):
  """An AdamW over the one parameter ``p`` after one step (its state dict has ``p``'s entry)."""
  opt = torch.optim.AdamW([p], lr=0.1)
  p.grad = torch.full_like(p, 0.5)
  opt.step()
  return opt


def test_a_state_wider_than_the_templates_dtype_is_refused():
  """A float64 run written into a float32 optimizer's template is refused, naming both dtypes:
  written as float64, ``load_state_dict`` would round the moments to the parameters' float32
  silently (planted, the written dtype taken from the state instead of the template: fails)."""
  with jax.enable_x64(True):
    opt64 = _stepped_adamw(torch.nn.Parameter(torch.ones(3, 4, dtype=torch.float64)))
    _, state = from_torch_state_dict(opt64.state_dict(), [jnp.ones((3, 4), jnp.float64)])
    opt32 = _stepped_adamw(torch.nn.Parameter(torch.ones(3, 4)))
    with pytest.raises(ValueError, match=r"dtype float64; PyTorch keeps it .*dtype float32"):
      to_torch_state_dict(state, opt32.state_dict())


def test_the_written_state_is_on_the_templates_device():
  """The written tensors are on the device of the template's (``meta`` stands in for an accelerator
  on this CPU-only PyTorch; planted, always ``cpu``: fails)."""
  saved = _stepped_adamw(torch.nn.Parameter(torch.ones(3))).state_dict()
  _, state = from_torch_state_dict(saved, [jnp.ones(3, jnp.float32)])
  on_meta = {
    "param_groups": saved["param_groups"],
    "state": {
      k: {f: v if f == "step" else v.to("meta") for f, v in e.items()} for k, e in saved["state"].items()
    },
  }
  back = to_torch_state_dict(state, on_meta)
  assert {back["state"][0][f].device.type for f in ("exp_avg", "exp_avg_sq")} == {"meta"}
  # A file of a PyTorch before `fused` and `capturable` (its step a number): the step goes where
  # PyTorch's own first step of a non-capturable Adam puts it, on the CPU (planted, the missing
  # `capturable` read as True: on meta).
  older = {
    "param_groups": [
      {k: v for k, v in g.items() if k not in ("fused", "capturable")} for g in saved["param_groups"]
    ],
    "state": {k: {**e, "step": float(e["step"])} for k, e in on_meta["state"].items()},
  }
  assert to_torch_state_dict(state, older)["state"][0]["step"].device.type == "cpu"


def test_an_optimizer_that_has_not_stepped():
  """No state yet (Adam creates it at the first step): resumed at its first step, written back."""
  with jax.enable_x64(True):
    model, ref = _model(), _model()
    opt, opt_ref = _optimizer("Adam", model, False), _optimizer("Adam", ref, False)
    _torch_steps(ref, opt_ref, 2)
    saved = opt.state_dict()
    assert not saved["state"]
    params = [jnp.asarray(dict(model.named_parameters())[n].detach().numpy()) for n in ORDER]
    tx, state = from_torch_state_dict(saved, params)
    params, state = _jax_steps(tx, state, params, model, 2)
    for x, name in zip(params, ORDER):
      np.testing.assert_allclose(
        np.asarray(x), dict(ref.named_parameters())[name].detach().numpy(), rtol=1e-12
      )
    assert set(to_torch_state_dict(state, saved)["state"]) == {0, 1, 2, 3}


def _trainer_directory(path, steps, total, warmup):
  """A checkpoint directory in Hugging Face Trainer's layout, written as the Trainer writes it."""
  model = _model()
  opt = _optimizer("AdamW", model, named=False)
  schedule = lambda step: min((step + 1) / warmup, max(0.0, (total - step) / (total - warmup)))
  scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule)  # a linear schedule with warmup
  for _ in range(steps):
    opt.zero_grad()
    _loss(model).backward()
    opt.step()
    scheduler.step()
  path.mkdir()
  torch.save(opt.state_dict(), path / "optimizer.pt")
  torch.save(scheduler.state_dict(), path / "scheduler.pt")
  torch.save(model.state_dict(), path / "pytorch_model.bin")
  (path / "trainer_state.json").write_text(json.dumps({"global_step": steps, "max_steps": total}))
  return model, opt, scheduler


def test_a_trainer_checkpoint_directory(tmp_path):
  """optimizer.pt, scheduler.pt, trainer_state.json: the schedule passed as an Optax schedule shifted
  by the saved step; the JAX run equals the Trainer's own continuation to 1e-12."""
  with jax.enable_x64(True):
    total, warmup, steps = 12, 4, 5
    ref, opt_ref, sched_ref = _trainer_directory(tmp_path / "ref", steps, total, warmup)
    for _ in range(4):
      opt_ref.zero_grad()
      _loss(ref).backward()
      opt_ref.step()
      sched_ref.step()

    ckpt = tmp_path / "ref"
    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    scheduler = torch.load(ckpt / "scheduler.pt", weights_only=True)
    step = json.loads((ckpt / "trainer_state.json").read_text())["global_step"]
    assert scheduler["last_epoch"] == step
    weights = torch.load(ckpt / "pytorch_model.bin", weights_only=True)
    base = [g["initial_lr"] for g in saved["param_groups"]]

    def factor(n):  # LambdaLR's factor at its epoch n + step, in float64 as PyTorch computes it
      t = jnp.asarray(n + step, jnp.float64)
      return jnp.minimum((t + 1) / warmup, jnp.maximum(0.0, (total - t) / (total - warmup)))

    rates = [lambda n, b=b: b * factor(n) for b in base]
    params = [jnp.asarray(weights[n].numpy()) for n in ORDER]
    tx, state = from_torch_state_dict(saved, params, learning_rate=rates)
    model = _model()
    params, state = _jax_steps(tx, state, params, model, 4)
    for x, name in zip(params, ORDER):
      np.testing.assert_allclose(
        np.asarray(x), dict(ref.named_parameters())[name].detach().numpy(), rtol=1e-12
      )


# --- refusals: each names the entry, and nothing is built ---------------------


def _adam_saved():
  model = _model()
  opt = _optimizer("AdamW", model, named=False)
  _torch_steps(model, opt, 1)
  params = [jnp.asarray(dict(model.named_parameters())[n].detach().numpy(), jnp.float32) for n in ORDER]
  return opt.state_dict(), params


def test_refuses_what_it_cannot_place():
  saved, params = _adam_saved()
  with jax.enable_x64(True):
    params = [p.astype(jnp.float64) for p in params]
    with pytest.raises(TypeError, match=r"state_dict must be an optimizer state dict .*optimizer_states"):
      from_torch_state_dict({"state_dict": saved}, params)
    with pytest.raises(
      TypeError, match=r"state_dict must be an optimizer state dict .*got \['param_groups'\]"
    ):
      from_torch_state_dict({"param_groups": saved["param_groups"]}, params)
    for keys in ([0.0, 1, 2, 3], [True, 1, 2, 3]):  # neither all indices nor all names
      odd = {**saved, "param_groups": [{**saved["param_groups"][0], "params": keys}]}
      with pytest.raises(TypeError, match=r"list parameters \[.*\]: a state dict keys them all by index"):
        from_torch_state_dict(odd, params)
    shape_only = types.SimpleNamespace(shape=params[0].shape)  # no dtype: not an array
    with pytest.raises(TypeError, match=r"params\[0\] must be an array \(or jax.ShapeDtypeStruct\), got"):
      from_torch_state_dict(saved, [shape_only, *params[1:]])
    for group in ({"lr": 0.1}, [0, 1, 2, 3]):
      with pytest.raises(
        TypeError, match=r"state_dict\['param_groups'\]\[0\] must be a dict with a 'params' list"
      ):
        from_torch_state_dict({**saved, "param_groups": [group]}, params)
    with pytest.raises(
      ValueError,
      match=r"params has 2 leaves but the state dict's param groups list 4 parameters: placed by position, "
      r"the last 2 of them have no leaf",
    ):
      from_torch_state_dict(saved, params[:2])
    orphan = {**saved, "state": {**saved["state"], 7: saved["state"][0]}}
    with pytest.raises(
      ValueError, match=r"state_dict\['state'\] has entries \[7\] that no param group lists"
    ):
      from_torch_state_dict(orphan, params)
    # A message names six entries at most, and says how many there are when it leaves some out.
    six = {**saved, "state": {**saved["state"], **{k: saved["state"][0] for k in range(7, 13)}}}
    with pytest.raises(ValueError, match=r"has entries \[7, 8, 9, 10, 11, 12\] that no param group"):
      from_torch_state_dict(six, params)
    seven = {**saved, "state": {**saved["state"], **{k: saved["state"][0] for k in range(7, 14)}}}
    with pytest.raises(ValueError, match=r"has entries \[7, 8, 9, 10, 11, 12, \.\.\. \(7 in all\)\] that"):
      from_torch_state_dict(seven, params)
    twice = {
      **saved,
      "param_groups": [saved["param_groups"][0], {**saved["param_groups"][1], "params": [2, 0]}],
    }
    with pytest.raises(ValueError, match=r"list a parameter twice: \[0\]"):
      from_torch_state_dict(twice, params)
    with pytest.raises(
      ValueError,
      match=r"state_dict\['state'\]\[0\]\['exp_avg'\] has shape \(4, 3\).*params\[0\] has shape \(3, 4\)",
    ):
      from_torch_state_dict(saved, [params[0].T, *params[1:]])
    with pytest.raises(
      ValueError, match=r"state_dict\['state'\]\[0\]\['exp_avg'\] has .*dtype float64.*dtype float32"
    ):
      from_torch_state_dict(saved, [params[0].astype(jnp.float32), *params[1:]])
    bad_step = {**saved, "state": {**saved["state"], 1: {**saved["state"][1], "step": torch.tensor(2.5)}}}
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[1\]\['step'\] is 2.5, not a count"):
      from_torch_state_dict(bad_step, params)
    negative = {**saved, "state": {**saved["state"], 1: {**saved["state"][1], "step": torch.tensor(-1.0)}}}
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[1\]\['step'\] is -1.0, not a count"):
      from_torch_state_dict(negative, params)
    no_moment = {
      **saved,
      "state": {**saved["state"], 2: {k: v for k, v in saved["state"][2].items() if k != "exp_avg_sq"}},
    }
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[2\] has no \['exp_avg_sq'\]"):
      from_torch_state_dict(no_moment, params)
    # A max_exp_avg_sq in a group without amsgrad (one that had it): PyTorch's step ignores it, and so
    # does the bridge (the state keeps none).
    stray = {
      **saved,
      "state": {**saved["state"], 1: {**saved["state"][1], "max_exp_avg_sq": saved["state"][1]["exp_avg"]}},
    }
    assert not hasattr(from_torch_state_dict(stray, params)[1], "max_exp_avg_sq")
    unknown = {
      **saved,
      "state": {**saved["state"], 1: {**saved["state"][1], "momentum_buffer": saved["state"][1]["exp_avg"]}},
    }
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[1\] has \['momentum_buffer'\]"):
      from_torch_state_dict(unknown, params)


def test_refuses_names_missing_on_either_side():
  model = _model()
  opt = _optimizer("SGD", model, named=False)
  _torch_steps(model, opt, 1)
  saved = get_optimizer_state_dict(model, opt)
  with jax.enable_x64(True):
    params = {n: jnp.asarray(p.detach().numpy()) for n, p in model.named_parameters()}
    from_torch_state_dict(saved, params)  # the names match
    renamed = {("2.b" if n == "2.bias" else n): v for n, v in params.items()}
    with pytest.raises(ValueError, match=r"no leaf for \['2.bias'\]; leaves named \['2.b'\]"):
      from_torch_state_dict(saved, renamed)
    _, state = from_torch_state_dict(saved, params)
    keyed_other = {
      **saved,
      "param_groups": [saved["param_groups"][0], {**saved["param_groups"][1], "params": ["0.bias", "2.b"]}],
    }
    keyed_other["state"] = {("2.b" if k == "2.bias" else k): v for k, v in saved["state"].items()}
    with pytest.raises(ValueError, match=r"state is keyed by names that are not.*no leaf for \['2.b'\]"):
      to_torch_state_dict(state, keyed_other)


def test_a_dict_for_a_state_dict_without_names_gets_advice_it_can_follow():
  """``params`` (and a state) keyed by name for a state dict keyed by index, without ``param_names``:
  refused with advice for a caller who has the state dict (not ``torch_params(optimizer)``, for an
  optimizer such a caller does not have), and each fix it names, followed as printed, resumes the run
  (to 1e-12 of the run that never left PyTorch, written back and loaded by PyTorch)."""
  from onnx_optax.interop import torch_param_names

  with jax.enable_x64(True):
    ref = _model()
    opt_ref = _optimizer("SGD", ref, named=False)
    _torch_steps(ref, opt_ref, N + M + K)
    model = _model()
    opt = _optimizer("SGD", model, named=False)
    _torch_steps(model, opt, N)
    saved = opt.state_dict()  # keyed by index; the optimizer was built without names
    named = {n: jnp.asarray(p.detach().numpy()) for n, p in model.named_parameters()}
    with pytest.raises(
      ValueError, match=r"params is a dict .*the state dict keys its parameters by index"
    ) as e:
      from_torch_state_dict(saved, named)
    advice = str(e.value)
    assert "torch_params" not in advice and "optimizer.param_groups" not in advice, advice
    assert "param_names=" in advice and "torch_param_names(optimizer, model)" in advice, advice

    # Fix 1, a list in the state dict's order (its param_groups' 'params', group by group).
    order = [ORDER[i] for group in saved["param_groups"] for i in group["params"]]
    tx, state = from_torch_state_dict(saved, [named[n] for n in order])
    # Fix 2, param_names= (torch_param_names for the optimizer that saved it), params keyed by those names.
    names = torch_param_names(opt, model)
    tx2, state2 = from_torch_state_dict(saved, named, param_names=names)
    params, state = _jax_steps(tx, state, [named[n] for n in order], model, M)
    params2, state2 = _jax_steps(tx2, state2, named, model, M)
    # The named state written into the index-keyed template: the same advice, and its fix.
    with pytest.raises(ValueError, match=r"state is a dict .*pass param_names=") as e:
      to_torch_state_dict(state2, saved)
    assert "torch_params" not in str(e.value), e.value
    for values, back in (
      (dict(zip(order, params)), to_torch_state_dict(state, saved)),
      (params2, to_torch_state_dict(state2, saved, param_names=names)),
    ):
      fresh = _model(seed=1)
      with torch.no_grad():
        for name, p in fresh.named_parameters():
          p.copy_(torch.from_numpy(np.array(values[name])))
      opt2 = _optimizer("SGD", fresh, named=False)
      opt2.load_state_dict(back)
      _torch_steps(fresh, opt2, K)
      for (name, p), q in zip(fresh.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, err_msg=name)


def test_refuses_other_optimizers_and_tells_adam_from_adamw():
  model = _model()
  other = torch.optim.LBFGS(model.parameters(), lr=0.1)  # a class no rule binds
  params = [jnp.zeros(p.shape) for p in model.parameters()]
  options = r"\(options \['history_size', 'line_search_fn', 'lr', .*'tolerance_grad'\]\)"
  classes = re.escape(_torch_optim.listed(list(_torch_optim.twins()), "or"))  # the registry's, in order
  with pytest.raises(TypeError, match=rf"param groups {options} are not those of torch.optim.{classes} in"):
    from_torch_state_dict(other.state_dict(), params)
  saved, params32 = _adam_saved()
  old = {
    **saved,
    "param_groups": [
      {k: v for k, v in g.items() if k != "decoupled_weight_decay"} for g in saved["param_groups"]
    ],
  }
  with jax.enable_x64(True):
    params = [p.astype(jnp.float64) for p in params32]
    with pytest.raises(TypeError, match=r"pass optimizer='Adam' or 'AdamW'"):
      from_torch_state_dict(old, params)
    _, by_class = from_torch_state_dict(old, params, optimizer=torch.optim.AdamW)
    _, inferred = from_torch_state_dict(saved, params)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), by_class, inferred))
    with pytest.raises(
      TypeError, match=r"optimizer='SGD', but state_dict's param groups are torch.optim.Adam's"
    ):
      from_torch_state_dict(saved, params, optimizer="SGD")
    kinds = re.escape(_torch_optim.listed([repr(k) for k in _torch_optim.twins()], "or"))
    with pytest.raises(TypeError, match=rf"optimizer must be {kinds} \(or the class\), got 'LBFGS'"):
      from_torch_state_dict(saved, params, optimizer="LBFGS")


def test_adagrad_without_sum_is_refused():
  """A parameter added after the constructor has no 'sum' until its first step; PyTorch fills it from the
  constructor's value, which the state dict does not hold."""
  model = _model()
  opt = torch.optim.Adagrad([model[0].weight], lr=0.1)
  opt.add_param_group({"params": [model[0].bias]})
  saved = opt.state_dict()
  with jax.enable_x64(True):
    params = [jnp.asarray(model[0].weight.detach().numpy()), jnp.asarray(model[0].bias.detach().numpy())]
    with pytest.raises(ValueError, match=r"Adagrad's state has no 'sum' for state_dict\['state'\]\[1\]"):
      from_torch_state_dict(saved, params)


def test_state_is_sharded_like_the_parameters():
  """Parameters placed with a NamedSharding over two devices: the state comes back with the same sharding,
  each device holding half of each moment. In a fresh interpreter with two CPU devices."""
  code = textwrap.dedent("""
      import os
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
      import jax, jax.numpy as jnp, numpy as np, torch
      from jax.sharding import Mesh, NamedSharding, PartitionSpec
      from onnx_optax.interop import from_torch_state_dict
      sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), PartitionSpec("d"))
      p = torch.nn.Parameter(torch.arange(4.0))
      opt = torch.optim.AdamW([p], lr=0.1)
      p.grad = torch.arange(4.0) + 1
      opt.step()
      params = [jax.device_put(np.arange(4.0, dtype=np.float32), sharding)]
      _, state = from_torch_state_dict(opt.state_dict(), params)
      moments = (state.exp_avg[0], opt.state[p]["exp_avg"]), (state.exp_avg_sq[0], opt.state[p]["exp_avg_sq"])
      for moment, want in moments:
        sizes = [s.data.shape[0] for s in moment.addressable_shards]
        same = np.array_equal(np.asarray(moment), want.numpy())
        print(moment.sharding == sharding, sizes, same)
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split("\n")[:2] == ["True [2, 2] True"] * 2, out


def test_bfloat16_state_round_trips_bit_for_bit():
  """A bfloat16 model's SGD state, saved and resumed: the buffer arrives bit for bit and goes back so."""
  import ml_dtypes

  p = torch.nn.Parameter(torch.randn(5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16))
  opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
  p.grad = torch.randn(5, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
  opt.step()
  saved = opt.state_dict()
  params = [jnp.asarray(p.detach().float().numpy().astype(ml_dtypes.bfloat16))]
  _, state = from_torch_state_dict(saved, params)
  assert state.momentum_buffer[0].dtype == jnp.bfloat16
  np.testing.assert_array_equal(
    np.asarray(state.momentum_buffer[0], np.float32), saved["state"][0]["momentum_buffer"].float().numpy()
  )
  back = to_torch_state_dict(state, saved)
  assert torch.equal(back["state"][0]["momentum_buffer"], saved["state"][0]["momentum_buffer"])
  assert back["state"][0]["momentum_buffer"].dtype == torch.bfloat16


@pytest.mark.parametrize("kind", ["SGD", "Adagrad", "Adam", "AdamW"])
def test_a_state_dict_of_an_older_pytorch(kind):
  """Groups without the options PyTorch added later (maximize, foreach, differentiable, fused,
  capturable, decoupled_weight_decay) and a Python-number step, as older versions saved them: read
  as the behaviour they had (an Adam's or AdamW's file named by ``optimizer=``, which the file
  cannot tell apart; Adam's weight decay coupled, as ``torch.optim.Adam.load_state_dict`` reads
  it: planted, decoupled by default, the Adam case fails), and written back with a step PyTorch
  reads."""
  with jax.enable_x64(True):
    ref = _model()
    opt_ref = _optimizer(kind, ref, named=False)
    _torch_steps(ref, opt_ref, N + M)
    model = _model()
    opt = _optimizer(kind, model, named=False)
    _torch_steps(model, opt, N)
    saved = opt.state_dict()
    later = {"maximize", "foreach", "differentiable", "fused", "capturable", "decoupled_weight_decay"}
    saved["param_groups"] = [{k: v for k, v in g.items() if k not in later} for g in saved["param_groups"]]
    for entry in saved["state"].values():
      if "step" in entry:
        entry["step"] = float(entry["step"])
    params = [jnp.asarray(dict(model.named_parameters())[n].detach().numpy()) for n in ORDER]
    options = {"optimizer": kind} if kind.startswith("Adam") else {}
    tx, state = from_torch_state_dict(saved, params, **options)
    params, state = _jax_steps(tx, state, params, model, M)
    for x, name in zip(params, ORDER):
      np.testing.assert_allclose(
        np.asarray(x), dict(ref.named_parameters())[name].detach().numpy(), rtol=1e-12
      )
    back = to_torch_state_dict(state, saved, **options)
    assert all(float(e["step"]) == N + M for e in back["state"].values() if "step" in e)


def test_a_tensor_lr_in_a_state_dict_is_refused_and_the_advice_works():
  """A saved ``Adam(lr=torch.tensor(...))``: refused with advice about the state dict (there is no
  optimizer); run as printed on the state dict and on the optimizer that takes the run back, the
  carried run equals PyTorch's."""
  import torch_runs

  with jax.enable_x64(True):
    ref, model = _model(), _model()
    make = lambda m: torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01, dtype=torch.float64))
    opt_ref, opt = make(ref), make(model)
    with pytest.raises(ValueError) as refused_live:
      from_torch_state_dict(opt.state_dict(), [jnp.zeros(p.shape, jnp.float64) for p in model.parameters()])
    message = str(refused_live.value)
    assert (
      "in the state dict, then call from_torch_state_dict: for group in state_dict['param_groups']" in message
    )
    for o in (opt_ref, opt):  # the code as printed, on each optimizer's groups (what its state dict saves)
      torch_runs.follow_advice(refused_live.value, state_dict={"param_groups": o.param_groups})
    _torch_steps(ref, opt_ref, N + M)
    _torch_steps(model, opt, N)
    saved = opt.state_dict()
    params = [jnp.asarray(p.detach().numpy()) for p in model.parameters()]
    tx, state = from_torch_state_dict(saved, params)
    params, _ = _jax_steps_list(tx, state, params, model, M)
    for x, q in zip(params, ref.parameters()):
      np.testing.assert_allclose(np.asarray(x), q.detach().numpy(), rtol=1e-12)


def _jax_steps_list(tx, state, params, model, steps):
  """Steps in JAX on a list in the model's order (a one-group optimizer's order)."""
  names = [n for n, _ in model.named_parameters()]
  for _ in range(steps):
    with torch.no_grad():
      for (_, p), x in zip(model.named_parameters(), params):
        p.copy_(torch.from_numpy(np.array(x)))
    model.zero_grad()
    _loss(model).backward()
    grads = [jnp.asarray(dict(model.named_parameters())[n].grad.numpy()) for n in names]
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


class _Tied(torch.nn.Module):
  """GPT-2's tie in small: the output layer's weight is the embedding's (``lm_head.weight = wte.weight``)."""

  def __init__(self):
    super().__init__()
    self.wte = torch.nn.Embedding(5, 3)
    self.ln = torch.nn.LayerNorm(3)
    self.lm_head = torch.nn.Linear(3, 5, bias=False)
    self.lm_head.weight = self.wte.weight

  def forward(self, tokens):
    return self.lm_head(self.ln(self.wte(tokens)))


def test_a_flattened_state_dict_keeps_groups_whose_options_differ_in_keys():
  """A group added after the scheduler has no ``initial_lr``: flattened, its parameters are still
  their own group (planted, groups merged whenever their keys differ: the second group's rate and
  weight decay are the first's, and written back its parameters gain ``initial_lr``)."""
  with jax.enable_x64(True):
    model = _model()
    p = dict(model.named_parameters())
    opt = torch.optim.SGD([p["0.weight"], p["2.weight"]], lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.add_param_group({"params": [p["0.bias"], p["2.bias"]], "lr": 0.05, "weight_decay": 0.1})
    _torch_steps(model, opt, 1)
    scheduler.step()
    flat = get_optimizer_state_dict(model, opt, options=FLAT)
    named = {n: jnp.asarray(q.detach().numpy()) for n, q in model.named_parameters()}
    _, state = from_torch_state_dict(flat, named, learning_rate=[0.05, 0.05])
    written = to_torch_state_dict(state, flat, learning_rate=[0.05, 0.05])
    # Options equal but not the same objects (each value unpickled on its own): still two groups
    # (planted, options compared by identity alone: a group per parameter, and two rates refused).
    apart = {key: pickle.loads(pickle.dumps(value)) for key, value in flat.items()}
    assert apart["param_groups.0.bias.lr"] is not apart["param_groups.2.bias.lr"]
    from_torch_state_dict(apart, named, learning_rate=[0.05, 0.05])
  assert sorted(written) == sorted(flat)
  assert [written[f"param_groups.{n}.weight_decay"] for n in ORDER] == [0, 0, 0.1, 0.1]


def test_a_tied_weight_listed_twice_is_named():
  """A model's ``state_dict()`` lists a tied weight under both names, the optimizer once: the extra leaf is
  named (by name where both sides have names, by position in a list, by value where the state dict has no
  names), and the missing one too; ``named_parameters()``, as the message says, is accepted."""
  torch.manual_seed(0)
  model = _Tied()
  opt = torch.optim.AdamW(model.parameters(), lr=0.1)
  model(torch.tensor([0, 1, 2])).sum().backward()
  opt.step()
  weights = {name: jnp.asarray(value.numpy()) for name, value in model.state_dict().items()}
  assert list(weights) == ["wte.weight", "ln.weight", "ln.bias", "lm_head.weight"]
  equal = r"params\['lm_head.weight'\] and params\['wte.weight'\] are equal element for element: a model's"
  by_name, by_index = get_optimizer_state_dict(model, opt), opt.state_dict()
  with pytest.raises(ValueError, match=rf"leaves named \['lm_head.weight'\]\..*\({equal}"):
    from_torch_state_dict(by_name, weights)
  renamed = {("ln.b" if name == "ln.bias" else name): value for name, value in weights.items()}
  with pytest.raises(
    ValueError, match=r"no leaf for \['ln.bias'\]; leaves named \['lm_head.weight', 'ln.b'\]"
  ):
    from_torch_state_dict(by_name, renamed)
  with pytest.raises(
    ValueError,
    match=r"4 leaves but .* list 3 parameters: placed by position, params\[3\] has no parameter "
    r"\(params\[0\] and params\[3\] are equal element for element",
  ):
    from_torch_state_dict(by_index, list(weights.values()))
  with pytest.raises(ValueError, match=r"params\[0\] and params\[3\] are equal element for element"):
    from_torch_state_dict(by_index, [np.asarray(w) for w in weights.values()])  # NumPy leaves alike
  shapes = [jax.ShapeDtypeStruct(w.shape, w.dtype) for w in weights.values()]  # no values to compare
  with pytest.raises(ValueError, match=r"params\[3\] has no parameter \(a model's state_dict\(\) lists"):
    from_torch_state_dict(by_index, shapes)
  with pytest.raises(ValueError, match=rf"keys them by index, with no names to tell .*\({equal}"):
    from_torch_state_dict(by_index, weights)
  named = {name: jnp.asarray(p.detach().numpy()) for name, p in model.named_parameters()}
  misnamed = {("ln.b" if name == "ln.bias" else name): value for name, value in named.items()}
  with pytest.raises(
    ValueError, match=r"params is keyed by names that are not the state dict's parameters' names: no leaf for"
  ) as refused:  # as many leaves: no tie
    from_torch_state_dict(by_name, misnamed)
  assert "tied weight" not in str(refused.value) and "The state dict's names are [" in str(refused.value)
  _, state = from_torch_state_dict(by_name, named)
  assert int(state.count) == 1


def _amsgrad_adam(model):
  """Adam with amsgrad in the weights' group, not in the biases' (which then keep no max_exp_avg_sq)."""
  params = dict(model.named_parameters())
  return torch.optim.Adam(
    [
      {"params": [params["0.weight"], params["2.weight"]], "amsgrad": True},
      {"params": [params["0.bias"], params["2.bias"]], "lr": 0.02},
    ],
    lr=0.01,
    betas=(0.8, 0.9),
    weight_decay=0.01,
  )


@pytest.mark.parametrize("form", ["index", "flat"])
def test_amsgrad_is_carried(form, tmp_path):
  """``amsgrad=True`` (in one group of two): N steps in PyTorch, its state dict (by index, and
  flattened) read, M steps in JAX, written back with to_torch_state_dict, K more in PyTorch: PyTorch's
  own run of N + M + K steps, parameters and running maxima within 1e-12; the group without amsgrad
  keeps no max_exp_avg_sq, as PyTorch's."""
  N, M, K = 2, 3, 2
  ref = _model()
  opt_ref = _amsgrad_adam(ref)
  _torch_steps(ref, opt_ref, N + M + K)

  model = _model()
  opt = _amsgrad_adam(model)
  _torch_steps(model, opt, N)
  options = FLAT if form == "flat" else None
  saved = _save_load(
    get_optimizer_state_dict(model, opt, options=FLAT) if form == "flat" else opt.state_dict(),
    tmp_path / "optimizer.pt",
  )
  with jax.enable_x64(True):
    named = {name: jnp.asarray(p.detach().numpy()) for name, p in model.named_parameters()}
    params = named if form == "flat" else [named[n] for n in ORDER]
    tx, state = from_torch_state_dict(saved, params)
    params, state = _jax_steps(tx, state, params, model, M)
    back = to_torch_state_dict(state, saved)
  fresh = _model(seed=1)
  values = params if isinstance(params, dict) else dict(zip(ORDER, params))
  with torch.no_grad():
    for name, p in fresh.named_parameters():
      p.copy_(torch.from_numpy(np.array(values[name])))
  opt2 = _amsgrad_adam(fresh)
  if form == "flat":
    set_optimizer_state_dict(fresh, opt2, _save_load(back, tmp_path / "back.pt"), options=options)
  else:
    opt2.load_state_dict(_save_load(back, tmp_path / "back.pt"))
  _torch_steps(fresh, opt2, K)
  for (name, p), q in zip(fresh.named_parameters(), ref.parameters()):
    np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, err_msg=name)
  for p, q in zip(fresh.parameters(), ref.parameters()):
    mine, theirs = opt2.state[p], opt_ref.state[q]
    assert ("max_exp_avg_sq" in mine) == ("max_exp_avg_sq" in theirs)
    if "max_exp_avg_sq" in theirs:
      assert not torch.equal(theirs["max_exp_avg_sq"], theirs["exp_avg_sq"])  # the maximum matters
      np.testing.assert_allclose(mine["max_exp_avg_sq"].numpy(), theirs["max_exp_avg_sq"].numpy(), rtol=1e-12)


def test_a_flattened_state_dict_with_state_of_no_listed_parameter_is_refused():
  """A flattened DCP key whose parameter no ``param_groups.<name>.<option>`` key lists (a nested state, or an
  edited dict): refused, naming the key and the flag; the same dict without it is read, its groups those
  of the optimizer (the runs of parameters with equal options)."""
  model = _model()
  opt = _optimizer("AdamW", model, named=False)
  _torch_steps(model, opt, 1)
  flat = get_optimizer_state_dict(model, opt, options=FLAT)
  with jax.enable_x64(True):
    params = {n: jnp.asarray(p.detach().numpy()) for n, p in model.named_parameters()}
    from_torch_state_dict(flat, params)
    # The groups are read back as the runs of parameters with equal options: two here.
    from_torch_state_dict(flat, params, learning_rate=[0.01, 0.02])
    with pytest.raises(ValueError, match=r"learning_rate has 4 entries but the optimizer has 2 param groups"):
      from_torch_state_dict(flat, params, learning_rate=[0.01] * 4)
    nested = {**flat, "state.0.weight.shampoo.factor": torch.ones(3)}
    with pytest.raises(
      ValueError,
      match=r"state_dict\['state.0.weight.shampoo.factor'\] \(a flattened DCP state dict, "
      r"flatten_optimizer_state_dict=True\) is the state of no parameter",
    ):
      from_torch_state_dict(nested, params)


def test_a_piece_that_lacks_a_shard_is_not_put():
  """The guard under the bridge's own check: a host's piece of an array is put only where it holds every
  shard the target's devices need."""
  from onnx_optax.interop import _common

  piece = _common.HostPiece(np.arange(2.0), (2,), (4,))
  assert _common.missing_region(piece, jax.ShapeDtypeStruct((4,), jnp.float32)) == ((0, 4),)
  with pytest.raises(ValueError, match=r"this process holds \(\(2, 4\),\) of an array of shape \(4,\), not"):
    _common.put_like(piece, jnp.zeros(4))
  whole = _common.HostPiece(np.arange(4.0), (0,), (4,))
  assert _common.missing_region(whole, jnp.zeros(4)) is None
  np.testing.assert_array_equal(_common.put_like(whole, jnp.zeros(4)), np.arange(4.0))


@pytest.mark.parametrize("saved_by, read_as", [("Adam", "AdamW"), ("AdamW", "Adam")])
def test_a_file_read_as_the_other_adam_continues_as_that_class_loads_it(saved_by, read_as):
  """An Adam's file (``decoupled_weight_decay=False``) read with ``optimizer="AdamW"`` contradicts
  itself: refused before anything is read, naming the group's option; the advice followed literally
  (the flag set True in every group) continues as ``torch.optim.AdamW.load_state_dict`` of that file
  does. ``torch.optim.Adam``'s of an AdamW's file keeps the file's True: no contradiction. The
  expectation is PyTorch's run: the file loaded into the named class, then K more steps."""
  model = _model()
  opt = _optimizer(saved_by, model, named=False)
  _torch_steps(model, opt, N)
  saved = opt.state_dict()
  if saved_by == "Adam":
    with jax.enable_x64(True):
      params = [jnp.asarray(p.detach().numpy()) for p in model.parameters()]
      with pytest.raises(
        ValueError,
        match=r"optimizer='AdamW', but state_dict\['param_groups'\]\[0\]\['decoupled_weight_decay'\] is "
        r"False: .* pass optimizer='Adam', the file's class, or leave optimizer=None; .* set "
        r"'decoupled_weight_decay' to True in every group of state_dict\['param_groups'\] first",
      ):
        from_torch_state_dict(saved, params, optimizer=read_as)
    saved = copy.deepcopy(saved)
    for group in saved["param_groups"]:  # the advice, as written
      group["decoupled_weight_decay"] = True
  values = {n: p.detach().clone() for n, p in model.named_parameters()}
  ref = _model(seed=1)
  with torch.no_grad():
    for name, p in ref.named_parameters():
      p.copy_(values[name])
  groups = dict(ref.named_parameters())
  theirs = getattr(torch.optim, read_as)(
    [{"params": [groups[n] for n in ORDER[:2]]}, {"params": [groups[n] for n in ORDER[2:]]}], lr=0.5
  )
  theirs.load_state_dict(copy.deepcopy(saved))  # its steps write the loaded moments in place
  _torch_steps(ref, theirs, K)
  with jax.enable_x64(True):
    params = [jnp.asarray(values[n].numpy()) for n in ORDER]
    tx, state = from_torch_state_dict(saved, params, optimizer=read_as)
    params, _ = _jax_steps(tx, state, params, _model(seed=2), K)
  for name, ours in zip(ORDER, params):
    np.testing.assert_allclose(
      np.asarray(ours), dict(ref.named_parameters())[name].detach().numpy(), rtol=1e-12, err_msg=name
    )
