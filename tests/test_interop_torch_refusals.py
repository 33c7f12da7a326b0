"""The refusals every ``torch.optim`` twin declares (``registry.TorchOptimizer.numbers`` and
``.capturable``), raised by the PyTorch bridges for a live optimizer and for a state dict, each
followed as printed: the advice makes the group carry.

Collected from the registry: a twin that declares an option a Python number, or declares what
``capturable=True`` changes, is checked here with nothing to add.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from torch_runs import follow_advice

torch = pytest.importorskip("torch")

from onnx_optax import registry  # noqa: E402
from onnx_optax.interop import _torch_optim, from_torch, from_torch_state_dict  # noqa: E402


def _declared():
  return {kind: _torch_optim.declared(kind) for kind in _torch_optim.twins()}


NUMBERS = [(kind, key) for kind, d in _declared().items() for key in sorted(d.numbers)]
CAPTURABLE = [kind for kind, d in _declared().items() if d.capturable]


def _optimizer(kind: str, **options):
  """A ``torch.optim.<kind>`` over one matrix (a shape every twin takes, ``Rule.ranks`` included),
  with the options of its binding's first example."""
  p = torch.nn.Parameter(torch.ones(2, 3))
  (example, *_) = _declared()[kind].examples.values()
  return getattr(torch.optim, kind)([p], **{**example, **options}), [jnp.ones((2, 3), jnp.float32)]


def _tensor(value):
  """``value`` as PyTorch tensors (a pair's items each), as a user's scheduler may leave it."""
  if isinstance(value, (tuple, list)):
    return tuple(torch.tensor(float(v)) for v in value)
  return torch.tensor(float(value))


def test_the_declarations_are_collected():
  """The classes whose arithmetic changes with a tensor option or with ``capturable`` are all
  here (the six that declared them when the declarations were made, and any later one)."""
  assert {"Adam", "AdamW", "Adamax", "ASGD", "NAdam", "RAdam", "Rprop"} <= {k for k, _ in NUMBERS}
  assert {"Adamax", "ASGD", "NAdam", "RAdam"} <= set(CAPTURABLE)


@pytest.mark.parametrize("kind, key", NUMBERS)
@pytest.mark.parametrize("source", ["optimizer", "state_dict"])
def test_a_tensor_option_is_refused_and_the_advice_carries_it(kind, key, source):
  """A tensor where PyTorch computes its step's scalars in the tensor's dtype: refused naming the
  group, the key and the class, before any state is built; the code printed, run as printed,
  makes it a Python float, and the same call then carries the optimizer."""
  opt, params = _optimizer(kind)
  opt.param_groups[0][key] = _tensor(opt.param_groups[0][key])
  _refused_then_carried(
    opt, params, source, rf"param_groups\[0\]\['{key}'\] is a tensor.*torch\.optim\.{kind} then"
  )


@pytest.mark.parametrize("kind", CAPTURABLE)
@pytest.mark.parametrize("source", ["optimizer", "state_dict"])
def test_capturable_is_refused_and_the_advice_carries_it(kind, source):
  """``capturable=True`` where it changes the class's rounding (its scalars as float32 tensors):
  refused naming the class and what changes; turned off as printed, the same call carries."""
  opt, params = _optimizer(kind, capturable=True)
  _refused_then_carried(
    opt, params, source, rf"param_groups\[0\] has capturable=True: torch\.optim\.{kind} then .*Turn it off"
  )


def _refused_then_carried(opt, params, source, pattern):
  """The bridge of ``source`` (a live optimizer, or its state dict) refuses with ``pattern``; the
  code the refusal prints, run as printed on what the user holds, makes the same call carry."""
  if source == "optimizer":
    with pytest.raises(ValueError, match=pattern) as refused:
      from_torch(opt, params)
    follow_advice(refused.value, optimizer=opt)
    from_torch(opt, params)
  else:
    state_dict = opt.state_dict()
    with pytest.raises(ValueError, match=pattern) as refused:
      from_torch_state_dict(state_dict, params)
    follow_advice(refused.value, state_dict=state_dict)
    from_torch_state_dict(state_dict, params)


def test_a_declared_number_must_be_an_option_of_the_class():
  """A twin's declaration names only options its class has (a misspelt key would refuse nothing)."""
  for rule in registry.rules():
    binding = rule.binding("torch")
    if binding is not None and binding.torch is not None:
      assert binding.torch.numbers <= binding.torch.keys(), rule.name
