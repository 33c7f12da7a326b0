"""torch.optim.Adamax's capturable=True is refused by the PyTorch bridges (no transform follows it)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

torch = pytest.importorskip("torch")

from onnx_optax.interop import from_torch  # noqa: E402


def test_adamax_capturable_is_refused_with_what_to_do():
  """With capturable=True PyTorch computes its bias correction from the float32 step tensor and
  divides by exp_inf times it: refused, naming the option and the fix (which then carries)."""
  p = torch.nn.Parameter(torch.ones(3))
  opt = torch.optim.Adamax([p], lr=0.01, capturable=True)
  with pytest.raises(ValueError, match=r"capturable=True.*Set group\['capturable'\] = False"):
    from_torch(opt, [jnp.ones(3)])
  for group in opt.param_groups:
    group["capturable"] = False
  from_torch(opt, [jnp.ones(3)])
