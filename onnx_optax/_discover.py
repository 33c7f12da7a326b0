"""Importing every module of a package, for the packages whose modules register themselves.

:mod:`onnx_optax.rules` (one rule per module) and :mod:`onnx_optax.conformance.models` (one
rule's bound model per module) are read through the registries their modules fill when
imported; the packages import them all with :func:`import_submodules` and list none by name.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable


def import_submodules(package: str, path: Iterable[str]) -> list[str]:
  """Imports every module directly under ``package`` (``path`` is its ``__path__``), in the
  order of their names, and returns their qualified names. Private modules (``_name``) are
  left alone."""
  names = sorted(info.name for info in pkgutil.iter_modules(list(path)) if not info.name.startswith("_"))
  for name in names:
    importlib.import_module(f"{package}.{name}")
  return [f"{package}.{name}" for name in names]
