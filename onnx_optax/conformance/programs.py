"""The compiled programs of a run: the programs of a row of cases compiled as one, ahead of use.

XLA's compilation is most of a conformance run's time: a CPU compiles one
update of a rule in a tenth of a second or more, most of it the same for a
small program as for a large one. So the runner does not compile one program
per case. A :class:`Batch` collects the computations of a row of cases (their
updates, their scalars): each distinct one, by key, is a *slot*, traced once
(``jax.jit`` of its function; a case whose computation cannot be traced fails
alone); the slots are compiled together, as one XLA program that holds one copy
of each, on a pool of threads (XLA compiles without Python's lock) while
earlier rows are checked. The program runs in rounds: round ``i`` computes the
``i``-th request of every slot (a slot with fewer requests repeats its last),
so that requests of one slot (cases that differ only in values the slot takes
as arguments: ``T``, the inputs, a spec rule's hyperparameters) share its copy.

Each copy is its slot's computation as ``jax.jit`` would compile it alone: the
copies share no operand, and nothing is computed across them. The suite
checks that the outputs are those of one program per case, to the bit
(``tests/conformance/test_conformance_suite.py``).

A batch lives for one row of one run: a test that plants a wrong part of a
rule between two runs gets programs traced from it.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any

import jax

__all__ = ["Batch", "compiles"]

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_LOCK = threading.Lock()
_COMPILED = [0]


def _pool() -> concurrent.futures.ThreadPoolExecutor:
  global _POOL
  with _LOCK:
    if _POOL is None:
      _POOL = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="conformance-compile"
      )
    return _POOL


def compiles() -> int:
  """The number of programs the batches of this process compiled."""
  return _COMPILED[0]


def _compile(lowered: Any) -> Any:
  compiled = lowered.compile()
  with _LOCK:
    _COMPILED[0] += 1
  return compiled


class _Slot:
  def __init__(self, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    self.function = jax.jit(function)
    self.requests: list[tuple[Any, ...]] = [args]
    self.error: Exception | None = None


class Batch:
  """Computations by key, compiled as one program (see the module docstring).

  Example:
    >>> import jax.numpy as jnp
    >>> batch = Batch()
    >>> double = batch.add(("double",), lambda x: 2 * x, jnp.arange(3.0))
    >>> triple = batch.add(("double",), lambda x: 3 * x, jnp.ones(3))  # The key decides.
    >>> square = batch.add(("square",), lambda x: x * x, jnp.arange(2.0))
    >>> len(batch)  # Two slots: "double" (two requests) and "square".
    2
    >>> batch.close()
    >>> double().tolist(), triple().tolist(), square().tolist()
    ([0.0, 2.0, 4.0], [2.0, 2.0, 2.0], [0.0, 1.0])
  """

  def __init__(self) -> None:
    self._slots: dict[Hashable, _Slot] = {}
    self._compiled: concurrent.futures.Future | None = None
    self._rounds: dict[int, list[Any]] = {}
    self._error: Exception | None = None

  def __len__(self) -> int:
    """The number of slots: the distinct computations, one copy each in the program."""
    return len(self._slots)

  def add(self, key: Hashable, function: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    """Adds a request; returns ``result()``, ``function(*args)``'s outputs, after :meth:`close`.

    ``key`` must determine the computation: requests of one key run one ``jax.jit(function)``
    on arguments of the same shapes and dtypes (the first request's ``function`` is the slot's).
    ``result()`` raises what tracing, compiling or running the computation raised.
    """
    slot = self._slots.get(key)
    if slot is None:
      slot = self._slots[key] = _Slot(function, args)
      index = 0
    else:
      slot.requests.append(args)
      index = len(slot.requests) - 1
    return lambda: self._result(slot, index)

  def close(self) -> None:
    """Traces each slot (in this thread), lowers the program and starts compiling it (in the pool)."""
    for slot in self._slots.values():
      try:
        slot.function.trace(*slot.requests[0])
      except Exception as e:  # noqa: BLE001 -- the slot's requests raise it.
        slot.error = e
    self._live = [slot for slot in self._slots.values() if slot.error is None]
    if not self._live:
      return
    functions = [slot.function for slot in self._live]

    def program(arguments):
      return [f(*args) for f, args in zip(functions, arguments)]

    try:
      lowered = jax.jit(program).lower(self._round_args(0))
    except Exception as e:  # noqa: BLE001 -- every request raises it.
      self._error = e
      return
    self._compiled = _pool().submit(_compile, lowered)

  def _round_args(self, i: int) -> list[tuple[Any, ...]]:
    return [slot.requests[min(i, len(slot.requests) - 1)] for slot in self._live]

  def _result(self, slot: _Slot, index: int) -> Any:
    if slot.error is not None:
      raise slot.error
    if self._error is not None:
      raise self._error
    if self._compiled is None:
      raise RuntimeError("the batch is not closed")
    if index not in self._rounds:
      self._rounds[index] = self._compiled.result()(self._round_args(index))
    return self._rounds[index][self._live.index(slot)]
