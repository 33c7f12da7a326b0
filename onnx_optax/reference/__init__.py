"""NumPy expectations for the rules, written from docs/spec.md alone.

Nothing here imports JAX or calls :mod:`onnx_optax.rules`: these functions are
an independent transcription of the spec, so that the tests and the
conformance suite can catch mistakes in the JAX code. They compute in
``dtype`` (float64 by default, the expectation the tolerance model assumes);
``dtype=None`` computes in the dtype of ``X``.

Single-step functions take and return NumPy arrays and return the spec's
outputs in the spec's order (``X_new`` first). :func:`trajectory` runs one
rule over many steps on a list of tensors.

**Registered by rule.** Each rule's expectation is registered under the
rule's name (:func:`expectation`, :func:`register`), as one *step*
``step(R, T, X, G, *state, dtype=np.float64, **hyperparameters) -> (X_new,
*new_state)``, ``T`` the rule's count at this update (its state's
``count``): the conformance suite and the tests look it up by the rule's
name (:func:`get`). A rule registered from outside the package registers
its own expectation, written from its spec::

    from onnx_optax import reference

    def sign_sgd(R, T, X, G, *, dtype=np.float64):
      X, G, R = (np.asarray(v, dtype) for v in (X, G, R))
      return (X - R * np.sign(G),)

    reference.register("sign_sgd", sign_sgd, state=0)

The expectations live in two modules, re-exported here: ``onnx_optax.reference.spec`` (ONNX's,
DirectML's, ONNX Runtime's and Keras's rules) and ``onnx_optax.reference.pytorch`` (the
``torch.optim`` twins, in PyTorch's operation order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from onnx_optax.reference import _base, pytorch, spec
from onnx_optax.reference._base import Expectation, expectation, get, register, unregister

# Every expectation of the two modules, by their own __all__: a new one is written in its module only.
from onnx_optax.reference.pytorch import *  # noqa: F403
from onnx_optax.reference.spec import *  # noqa: F403

__all__ = ["RULES", "Expectation", "expectation", "get", "register", "trajectory", "unregister"]
__all__ += spec.__all__
__all__ += pytorch.__all__

#: name -> ``(step, number of state tensors)`` of every registered expectation.
RULES = _base.RULES


def trajectory(
  rule: str,
  X: Sequence[np.ndarray],
  grads: Sequence[Sequence[np.ndarray]] | Callable[[int, list[np.ndarray]], Sequence[np.ndarray]],
  state: Sequence[Sequence[np.ndarray]],
  T: int,
  learning_rates: Sequence[float],
  dtype: Any = np.float64,
  **hyperparameters: Any,
) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]], int]:
  """Runs ``rule`` for ``len(learning_rates)`` steps on a list of tensors.

  Args:
    rule: a registered rule's name (:data:`RULES`).
    X: the tensors (the leaves of a pytree, in any fixed order).
    grads: per step, one gradient per tensor; or a function
      ``grads(step, X) -> gradients`` of the current tensors.
    state: one list of tensors per state field, in the spec's order
      (Momentum ``[V]``; Adagrad ``[H]``; ONNX Adam ``[V, H]``; DirectML
      ``[M, V]``; ONNX Runtime AdamW ``[M1, M2]``; SGD ``[]``).
    T: the spec's ``T`` at the first step; it grows by one per step.
    learning_rates: ``R`` for each step.
    dtype: compute dtype (``None``: each tensor's own).
    **hyperparameters: the rule's keyword arguments.

  Returns:
    ``(xs, state, T)``: ``xs[k]`` holds the tensors after step ``k``; the
    final state and the ``T`` of the next step.
  """
  step, n_state = RULES[rule]
  if len(state) != n_state:
    raise ValueError(f"{rule} has {n_state} state tensors per parameter, got {len(state)}")
  X = [np.asarray(x) for x in X]
  S = [list(s) for s in state]
  xs = []
  for k, R in enumerate(learning_rates):
    G = grads(k, X) if callable(grads) else grads[k]
    outputs = [
      step(R, T, x, g, *(s[i] for s in S), dtype=dtype, **hyperparameters)
      for i, (x, g) in enumerate(zip(X, G))
    ]
    X = [out[0] for out in outputs]
    S = [[out[1 + j] for out in outputs] for j in range(n_state)]
    xs.append(X)
    T += 1
  return xs, S, T
