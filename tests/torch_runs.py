"""What the PyTorch bridge tests share: the parameters' structure and the two kinds of run.

Each run feeds the same NumPy gradients (tests/interop_data.py) to PyTorch's
``optimizer.step()`` or to a jitted transform, so that the runs differ only
in the optimizer code being compared.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from interop_data import SHAPES

GROUPS = [[0, 1], [2, 3]]  # indices into SHAPES, one list per param group


def like(dtype):
  """JAX structure of the parameters: a list in the optimizer's order (group by group)."""
  return [jax.ShapeDtypeStruct(shape, dtype) for shape in SHAPES]


def torch_parameters(values, device="cpu"):
  return [torch.nn.Parameter(torch.from_numpy(np.array(v)).to(device)) for v in values]


def torch_steps(opt, ps, grads, missing=(), *, state_of: Callable[[Any, Any], Any]):
  """``opt.step()`` per gradient list; ``missing``: (step, leaf) pairs left without grad.

  Returns, per step, the parameters (on the host) and ``state_of(opt, p)`` of each. The gradients
  go to each parameter's device.
  """
  records = []
  for t, step_grads in enumerate(grads):
    for i, (p, g) in enumerate(zip(ps, step_grads)):
      p.grad = None if (t, i) in missing else torch.from_numpy(np.array(g)).to(p.device)
    opt.step()
    records.append(([p.detach().cpu().numpy().copy() for p in ps], [state_of(opt, p) for p in ps]))
  return records


def jax_steps(tx, state, params, grads):
  step = jax.jit(tx.update)
  for step_grads in grads:
    g = jax.tree.unflatten(jax.tree.structure(params), [jnp.asarray(x) for x in step_grads])
    updates, state = step(g, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def follow_advice(error: BaseException, optimizer: Any = None, state_dict: Any = None) -> None:
  """Runs, as printed, the code that a refusal of a tensor hyperparameter tells the user to run."""
  code = re.split(r"then call from_torch(?:_state_dict)?: ", str(error), maxsplit=1)[1].split(" (", 1)[0]
  exec(code, {"optimizer": optimizer, "state_dict": state_dict})
