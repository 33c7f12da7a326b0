"""The platforms and devices the suite runs on, and the dtypes a case's numbers reach the rule in.

The lowest layer of the conformance package: it imports nothing of the package,
and every other module of it may import it (the arithmetic measurement, the
per-update scalars, the check, the report).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_dtypes
import numpy as np

__all__ = ["device", "has_float64", "numpy_dtype", "platforms", "received", "received_dtype"]

_PLATFORM_ORDER = ("cpu", "gpu", "tpu")


def platforms() -> list[str]:
  """The platforms JAX finds: ``cpu`` always, then ``gpu`` and ``tpu`` if present."""
  found = []
  for platform in _PLATFORM_ORDER:
    try:
      if jax.devices(platform):
        found.append(platform)
    except RuntimeError:  # No backend for this platform.
      pass
  return found


def device(platform: str) -> jax.Device:
  """The first device of a platform, chosen explicitly (not JAX's default)."""
  return jax.devices(platform)[0]


def has_float64(platform: str) -> bool:
  """TPUs have no float64 arithmetic."""
  return platform != "tpu"


def numpy_dtype(name: str) -> np.dtype:
  """The NumPy dtype of a dtype name (bfloat16 from ml_dtypes)."""
  return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def received_dtype(dtype: str, state_dtype: str | None = None) -> np.dtype:
  """The dtype a Python-float hyperparameter reaches a spec rule in: float64 under x64, else float32.

  The runner enables x64 when the parameters or the state are float64; a Python float then
  becomes a float64, otherwise a float32.
  """
  x64 = np.float64 in (numpy_dtype(dtype), numpy_dtype(state_dtype or dtype))
  return np.dtype(np.float64 if x64 else np.float32)


def received(R: float, hyper: dict[str, Any], dtype: Any) -> tuple[float, dict[str, Any]]:
  """``R`` and the hyperparameters as the rule receives them: each float rounded to ``dtype``.

  The expectation is computed from these values, so that the tolerance
  charges the arithmetic under test, not the rounding of its inputs
  (``algebra.Context.received``).

  Example:
    >>> received(0.1, {"alpha": 0.9, "mode": "standard"}, np.float32)
    (0.10000000149011612, {'alpha': 0.8999999761581421, 'mode': 'standard'})
  """
  rnd = lambda v: float(np.asarray(v, np.float64).astype(dtype))  # noqa: E731
  return rnd(R), {k: rnd(v) if isinstance(v, float) else v for k, v in hyper.items()}
