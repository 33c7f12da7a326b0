"""The parameters and gradients that the interop tests feed both frameworks.

The same NumPy values go to PyTorch or Keras and to JAX, so that the runs
differ only in the optimizer code being compared.
"""

from __future__ import annotations

import numpy as np

SHAPES = [(3,), (2, 4), (), (5,)]


def initial(dtype, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=shape).astype(dtype) for shape in SHAPES]


def gradients(steps, dtype, seed=1):
  rng = np.random.default_rng(seed)
  return [[rng.normal(size=shape).astype(dtype) for shape in SHAPES] for _ in range(steps)]
