"""How an error in the parameters feeds back into later updates: the terms of each rule's
:class:`~onnx_optax.registry.Trajectory`, the tests' tolerance model of a run of many updates.

An error ``e`` in ``X`` moves the next update by at most ``gain * e`` through the coefficients
that read ``X`` (``norm_coefficient``, PyTorch's ``weight_decay``, a decoupled decay). These are
bounds written from the formulas (docs/spec.md), never from the implementation; the tests
(``tests/rule_configs.trajectory_tolerances``) compound them over a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["adagrad", "adam", "bias_steps", "momentum", "none"]


def none(h: Mapping[str, Any], R: float, T0: int, steps: int) -> float:
  """A rule that does not read ``X`` (or reads it only through its own rounding)."""
  return 0.0


def momentum(alpha: float, c: float, R: float) -> float:
  """``V`` sums an error ``c e`` with weights ``beta alpha^j``: ``|dV| <= c e / (1 - alpha)``, and
  ``|dU| <= R c e (1 + alpha) / (1 - alpha)`` (Nesterov's ``R (G' + alpha V)`` too)."""
  return 0.0 if c == 0 else R * c * (1 + alpha) / (1 - alpha)


def adagrad(c: float, eps: float, R: float) -> float:
  """``r G' / (sqrt(H) + epsilon)`` moves by ``r c e / epsilon`` through ``G'`` and by as much
  again through ``H`` (``G'^2 <= H``): ``2 R c / epsilon``."""
  if c == 0:
    return 0.0
  if eps <= 0:
    raise ValueError(f"the tolerance model needs epsilon > 0 to bound 1 / (sqrt(H) + epsilon), got {eps}")
  return 2 * R * c / eps


def adam(c: float, eps: float, rate: float) -> float:
  """``V`` is an average (weights sum to 1), ``|dV| <= c e``; through ``V`` and ``H`` alike
  ``2 max(rate) c / epsilon``, ``rate`` the largest factor of ``V / (sqrt(H) + epsilon)``."""
  if c == 0:
    return 0.0
  if eps <= 0:
    raise ValueError(f"the tolerance model needs epsilon > 0 to bound 1 / (sqrt(H) + epsilon), got {eps}")
  return 2 * rate * c / eps


def bias_steps(T0: int, steps: int, start: int = 1) -> np.ndarray:
  """The bias corrections' exponents of a run: ``T`` (or the framework's ``step``) from ``start``."""
  return np.arange(max(T0, start), T0 + steps + 1, dtype=np.float64)
