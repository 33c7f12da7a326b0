"""ONNX Runtime's training optimizers (com.microsoft, v1), their own calls.

:func:`adamw_optimizer` (``AdamWOptimizer``) and :func:`sgd_optimizer_v2`
(``SGDOptimizerV2``) take their sequence inputs as Python lists of arrays and
return ``(updated_flag, updated sequences...)``; :mod:`onnx_optax.onnx` re-exports
them beside ``run_node``, ``from_node`` and ``from_model``, which take their nodes.
Each tensor goes through the rule of :mod:`onnx_optax.rules.ort` and ``X_new = X + U``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import Array

from onnx_optax import _checks
from onnx_optax.rules import ort

__all__ = [
  "MS_DOMAIN",
  "MS_VERSION",
  "ORT_OPERATORS",
  "OrtOperator",
  "adamw_optimizer",
  "choice",
  "sgd_optimizer_v2",
]

#: ONNX Runtime's domain, where its training operators live.
MS_DOMAIN = "com.microsoft"
#: The version of ONNX Runtime's optimizers (``SinceVersion(1)``, the only one).
MS_VERSION = 1


def _f32(x: float) -> float:
  """The value a FLOAT attribute stores (float32)."""
  return float(np.float32(x))


class OrtOperator(NamedTuple):
  """What ONNX Runtime's schema (``training_op_defs.cc``) says of one optimizer.

  ``inputs`` and ``outputs`` are the schema's names in order; the last input
  (``update_signal``) and every output but the first are optional.
  ``attributes`` maps each attribute to its type and the schema's default,
  as the float32 value a node stores.
  """

  inputs: tuple[str, ...]
  outputs: tuple[str, ...]
  attributes: dict[str, tuple[str, Any]]


#: The schema of each ONNX Runtime optimizer that runs here, keyed by ``op_type``.
ORT_OPERATORS: dict[str, OrtOperator] = {
  "AdamWOptimizer": OrtOperator(
    inputs=("lr", "step", "weights", "gradients", "momentums_1", "momentums_2", "update_signal"),
    outputs=("updated_flag", "updated_weights", "updated_momentums_1", "updated_momentums_2"),
    attributes={
      "alpha": ("FLOAT", _f32(0.9)),
      "beta": ("FLOAT", _f32(0.999)),
      "epsilon": ("FLOAT", _f32(1e-8)),
      "weight_decay": ("FLOAT", _f32(1e-2)),
      "correct_bias": ("INT", 1),
      "adam_mode": ("INT", 0),
    },
  ),
  "SGDOptimizerV2": OrtOperator(
    inputs=("lr", "weights", "gradients", "update_signal"),
    outputs=("update_completed", "updated_weights"),
    attributes={},
  ),
}


def choice(name: str, value: Any, choices: tuple[int, ...]) -> int:
  """An INT attribute with a closed set of values (ONNX Runtime takes others for 0, or throws)."""
  if isinstance(value, bool):
    value = int(value)
  if not isinstance(value, numbers.Integral) or int(value) not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}")
  return int(value)


def _sequences(blocks: dict[str, Any]) -> list[list[Any]]:
  """The tensors of each index across ONNX Runtime's sequences, checked: same count, shape and dtype."""
  sequences = {name: _checks.tensor_sequence(name, value) for name, value in blocks.items()}
  (first, first_tensors), *rest = sequences.items()
  for name, tensors in rest:
    if len(tensors) != len(first_tensors):
      raise ValueError(
        f"{name} holds {len(tensors)} tensors but {first} holds {len(first_tensors)}; "
        "the sequences pair their tensors by index"
      )
  checked = [
    _checks.block([f"{name}[{i}]" for name in sequences], [tensors[i] for tensors in sequences.values()])
    for i in range(len(first_tensors))
  ]
  return [_checks.as_arrays(tensors) for tensors in checked]


def _flag(signal: Any, shape: tuple[int, ...]) -> Array:
  """``updated_flag``: the signal as a bool tensor of ``step``'s (SGD: ``lr``'s) shape, as ONNX Runtime's."""
  return jnp.broadcast_to(jnp.asarray(signal, dtype=bool), shape)


def _unless_skipped(
  signal: Any,
  update: Callable[..., tuple[Array, ...]],
  kept: Callable[..., tuple[Array, ...]],
  per_tensor: list[list[Any]],
) -> list[list[Array]]:
  """``update`` on each index's tensors where ``signal`` holds, else ``kept`` (the inputs, untouched).

  ``update_signal = False`` is a skipped step (mixed precision's overflow
  check): the kernel touches nothing. A concrete False computes no tensor;
  a traced signal selects element-wise, the inputs' bits kept.
  """
  outputs: list[tuple[Array, ...]] = []
  for tensors in per_tensor:
    old = kept(*tensors)
    if signal is False:
      outputs.append(old)
      continue
    new = update(*tensors)
    if signal is not True:
      new = tuple(jnp.where(signal, n, o) for n, o in zip(new, old))
    outputs.append(new)
  return [list(block) for block in zip(*outputs)]


def adamw_optimizer(
  lr: Any,
  step: Any,
  weights: Sequence[Any],
  gradients: Sequence[Any],
  momentums_1: Sequence[Any],
  momentums_2: Sequence[Any],
  update_signal: Any = None,
  *,
  alpha: float = 0.9,
  beta: float = 0.999,
  epsilon: float = 1e-8,
  weight_decay: float = 1e-2,
  correct_bias: int = 1,
  adam_mode: int = 0,
) -> tuple[Array, list[Array], list[Array], list[Array]]:
  """ONNX Runtime's ``AdamWOptimizer`` (com.microsoft, v1), the operator's call.

  Not DirectML's :func:`adam_optimizer`. Per tensor, the rule of
  :func:`onnx_optax.rules.ort_adamw` (the CPU kernel's operation order, in
  the tensor's dtype), with ``alpha_correction = 1 - alpha^step`` and
  ``beta_correction = 1 - beta^step`` when ``correct_bias = 1`` (else 1):

  * ``adam_mode = 0`` (PyTorch's ``AdamW``): ``W <- W - W * lr * weight_decay``;
    ``M1 <- alpha * M1 + (1 - alpha) * G``; ``M2 <- beta * M2 + (1 - beta) * G^2``;
    ``W <- W - lr * M1 / (alpha_correction * (Sqrt(M2 / beta_correction) + epsilon))``;
  * ``adam_mode = 1`` (Hugging Face's ``AdamW``): the same moments;
    ``W <- W - lr_corrected * M1 / (Sqrt(M2) + epsilon)`` with
    ``lr_corrected = lr * Sqrt(beta_correction) / alpha_correction``;
    then ``W <- W - lr * weight_decay * W``.

  The sequences are Python lists (or tuples) of arrays, paired by index;
  outputs keep each tensor's dtype. ONNX Runtime updates its inputs in
  place; JAX returns new arrays.

  Args:
    lr: learning rate, a float scalar (shape ``()`` or ``(1,)``, as the
      models of ``generate_artifacts`` declare it).
    step: ONNX Runtime's update count, an int64 scalar (shape ``()`` or
      ``(1,)``): 1 at the first update (its training loop feeds its step
      count + 1). With ``correct_bias = 1`` a concrete step must be at least
      1 (at 0 the corrections are 0, a denominator).
    weights, gradients, momentums_1, momentums_2: the sequences.
    update_signal: optional bool scalar; False skips the update: every
      tensor is returned as it was and ``updated_flag`` is False.
    alpha, beta: the moments' decays (PyTorch's ``betas``): ``alpha`` in
      ``[0, 1)``; ``beta`` in ``[0, 1)`` with ``adam_mode=0`` (at 1,
      ``M2 / (1 - beta^step)`` is 0/0), in ``[0, 1]`` with ``adam_mode=1``
      (1 and ``epsilon = 0``: refused, every step is 0/0).
    epsilon: added to the root of the second moment.
    weight_decay: the decoupled weight decay.
    correct_bias: 1 (bias corrections) or 0 (with ``adam_mode = 1`` only, as ONNX Runtime).
    adam_mode: 0 or 1, see above.

  Returns:
    ``(updated_flag, updated_weights, updated_momentums_1, updated_momentums_2)``:
    a bool array of ``step``'s shape, then three lists.

  Example:
    >>> import numpy as np
    >>> from onnx_optax import onnx as ox
    >>> flag, (W,), (M1,), (M2,) = ox.adamw_optimizer(
    ...     np.float32(0.1), np.int64(1), [np.array([1.0, 2.0], np.float32)],
    ...     [np.array([0.5, -0.5], np.float32)], [np.zeros(2, np.float32)],
    ...     [np.zeros(2, np.float32)], weight_decay=0.0)
    >>> flag, W
    (Array(True, dtype=bool), Array([0.9, 2.1], dtype=float32))
  """
  correct_bias = choice("correct_bias", correct_bias, (0, 1))
  adam_mode = choice("adam_mode", adam_mode, (0, 1))
  hyper = ort.RULE.checked(
    dict(
      alpha=alpha,
      beta=beta,
      epsilon=epsilon,
      weight_decay=weight_decay,
      adam_mode=adam_mode,
      correct_bias=correct_bias,
    )
  )
  lr = _checks.one_element_float("lr", lr)
  flag_shape = tuple(getattr(step, "shape", ()))
  step = _checks.int64_step(
    "step",
    step,
    minimum=1 if correct_bias else 0,
    why=" (with correct_bias=1, 1 - alpha**step divides: ONNX Runtime's first update has step 1)"
    if correct_bias
    else "",
  )
  signal = _checks.bool_scalar("update_signal", update_signal)
  per_tensor = _sequences(
    dict(weights=weights, gradients=gradients, momentums_1=momentums_1, momentums_2=momentums_2)
  )

  # The scalars once per update, before any tensor.
  scalars, elementwise = ort.RULE.bind(ort.RULE, hyper)
  s = scalars(lr, step)

  def update(W, G, M1, M2):
    U, M1_new, M2_new = elementwise(ort.RULE.policy.round_scalars(s, W.dtype), W, G, M1, M2)
    return W + U, M1_new, M2_new

  W, M1, M2 = _unless_skipped(signal, update, lambda W, G, M1, M2: (W, M1, M2), per_tensor)
  return _flag(signal, flag_shape), W, M1, M2


def sgd_optimizer_v2(
  lr: Any, weights: Sequence[Any], gradients: Sequence[Any], update_signal: Any = None
) -> tuple[Array, list[Array]]:
  """ONNX Runtime's ``SGDOptimizerV2`` (com.microsoft, v1), the operator's call.

  Per tensor ``W <- W + (-lr * G)`` (:func:`onnx_optax.rules.ort_sgd`), to
  the bit of ONNX Runtime's CPU kernel. The operator has no ``step`` input.

  Args:
    lr: learning rate, a float scalar (shape ``()`` or ``(1,)``).
    weights, gradients: the sequences, lists of arrays paired by index.
    update_signal: optional bool scalar; False returns the weights as they
      were and ``update_completed`` False.

  Returns:
    ``(update_completed, updated_weights)``: a bool array of ``lr``'s
    shape, and a list.

  Example:
    >>> import numpy as np
    >>> from onnx_optax import onnx as ox
    >>> done, (W,) = ox.sgd_optimizer_v2(np.float32(0.1), [np.array([1.0, 2.0], np.float32)],
    ...                                  [np.array([1.0, -1.0], np.float32)])
    >>> done, W
    (Array(True, dtype=bool), Array([0.9, 2.1], dtype=float32))
  """
  flag_shape = tuple(getattr(lr, "shape", ()))
  lr = _checks.one_element_float("lr", lr)
  signal = _checks.bool_scalar("update_signal", update_signal)
  per_tensor = _sequences(dict(weights=weights, gradients=gradients))

  def update(W, G):
    # SGDOptimizerV2 has no step; the rule's T is not read.
    (U,) = ort.ort_sgd_tensor(lr, 0, W, G)
    return (W + U,)

  (W,) = _unless_skipped(signal, update, lambda W, G: (W,), per_tensor)
  return _flag(signal, flag_shape), W
