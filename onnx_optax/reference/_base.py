"""The registry of expectations, and the helper both families of expectations share.

Imports nothing of the package: :mod:`onnx_optax.reference`'s modules register their steps here,
and the package re-exports :func:`register`, :func:`expectation`, :func:`get`, :data:`RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = ["RULES", "Expectation", "expectation", "get", "register", "unregister"]


class Expectation(NamedTuple):
  """A rule's registered expectation."""

  #: ``step(R, T, X, G, *state, dtype=np.float64, **hyperparameters)``: the rule's outputs on one
  #: tensor, ``(X_new, *new_state)``, computed in ``dtype`` (``None``: ``X``'s).
  step: Callable[..., tuple[np.ndarray, ...]]
  #: The number of state tensors.
  state: int
  #: The expectation follows its framework's float32 operation order, each fused multiply-add
  #: rounded once, and takes ``scalars={name: value}`` for the step-dependent scalars a
  #: framework computes otherwise: in float32 it is that framework's arithmetic to the bit where
  #: the operations are correctly rounded (the conformance check then compares to the bit).
  framework_order: bool = False


_EXPECTATIONS: dict[str, Expectation] = {}

#: name -> ``(step, number of state tensors)`` of every registered expectation.
RULES: dict[str, tuple[Callable[..., tuple[np.ndarray, ...]], int]] = {}


def register(
  name: str, step: Callable[..., tuple[np.ndarray, ...]], *, state: int, framework_order: bool = False
) -> Expectation:
  """Registers ``step`` as the expectation of the rule ``name`` (see :class:`Expectation`).

  Raises:
    ValueError: an expectation of that name is registered already.
  """
  if name in _EXPECTATIONS:
    raise ValueError(f"an expectation named {name!r} is registered already")
  _EXPECTATIONS[name] = Expectation(step, state, framework_order)
  RULES[name] = (step, state)
  return _EXPECTATIONS[name]


def expectation(name: str, *, state: int, framework_order: bool = False) -> Callable[[Any], Any]:
  """A decorator: :func:`register` the decorated step under ``name``, and return it unchanged."""

  def decorate(step: Any) -> Any:
    register(name, step, state=state, framework_order=framework_order)
    return step

  return decorate


def unregister(name: str) -> None:
  """Removes an expectation registered from outside the package (for tests)."""
  del _EXPECTATIONS[name], RULES[name]


def get(name: str) -> Expectation:
  """The expectation registered under a rule's name.

  Raises:
    KeyError: none is; the message lists the registered ones.
  """
  try:
    return _EXPECTATIONS[name]
  except KeyError:
    raise KeyError(
      f"no NumPy expectation registered for {name!r}: register one with onnx_optax.reference.register "
      f"(registered: {', '.join(_EXPECTATIONS)})"
    ) from None


def _arrays(dtype: Any, *values: Any) -> list[np.ndarray]:
  if dtype is None:
    dtype = np.asarray(values[0]).dtype  # X comes first in every call below.
  return [np.asarray(v, dtype=dtype) for v in values]
