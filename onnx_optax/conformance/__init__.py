"""The conformance suite: every rule against float64 NumPy expectations.

``python -m onnx_optax.conformance`` runs every case on every platform JAX
finds (``cpu`` always; ``gpu``, ``tpu`` when present) and prints, per rule x
dtype x device, the number of cases, the worst error in units of the
tolerance, and pass/fail. The same cases run under pytest
(``tests/conformance``).

Modules:

* :mod:`~onnx_optax.conformance.cases`: the case grid (rules, dtypes,
  shapes, hyperparameter edges, starting states).
* :mod:`~onnx_optax.conformance.tolerance`: the tolerance model, a rounding
  error bound derived from each rule's arithmetic, per element.
* :mod:`~onnx_optax.conformance.arithmetic`: the device's element-wise
  arithmetic, measured at start-up (``k`` per operation and dtype).
* :mod:`~onnx_optax.conformance.scalars`: each rule's per-update scalars,
  evaluated on the device from the spec's formula; their measured error is
  what the tolerance charges for them.
* :mod:`~onnx_optax.conformance.check`: runs a case through its Optax
  transform on an explicitly chosen device and compares with
  :mod:`onnx_optax.reference`.
* :mod:`~onnx_optax.conformance.onnx_references`: ONNX's backend test cases
  and ``ReferenceEvaluator`` (needs the optional ``onnx`` package).
* :mod:`~onnx_optax.conformance.report`: the table, JSON and Markdown.

Only JAX, Optax and NumPy are needed, plus ``onnx`` for ONNX's references.
"""

from onnx_optax.conformance.cases import DTYPES, RULES, Case
from onnx_optax.conformance.check import CaseResult, check_outputs, platforms, run_case

__all__ = ["DTYPES", "RULES", "Case", "CaseResult", "check_outputs", "platforms", "run_case"]
