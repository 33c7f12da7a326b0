"""The conformance suite: every rule against float64 NumPy expectations.

``python -m onnx_optax.conformance`` runs every case on every platform JAX
finds (``cpu`` always; ``gpu``, ``tpu`` when present) and prints, per rule x
dtype x device, the number of cases, the worst error in units of the
tolerance, and pass/fail. The same cases run under pytest
(``tests/conformance``).

The grid reads the registry (:mod:`onnx_optax.registry`): its rules (each
expanded by its variants), their hyperparameters, state, first ``T``, edges and
dtypes. Each rule's NumPy expectation (:mod:`onnx_optax.reference`) and bound
model (:mod:`onnx_optax.conformance.models`) are registered under its name, so a
rule registered from outside the package, with its expectation
(:func:`onnx_optax.reference.register`) and its bound model
(:func:`onnx_optax.conformance.tolerance.register_model`), is in the grid, the
check and the report with no other edit.

Modules, from the lowest layer up (each imports only those above it):

* :mod:`~onnx_optax.conformance.devices`: the platforms, the chosen device,
  the dtypes a case's numbers reach the rule in.
* :mod:`~onnx_optax.conformance.arithmetic`: the device's element-wise
  arithmetic, measured at start-up (``k`` per operation and dtype), on the
  operands its caller hands it.
* :mod:`~onnx_optax.conformance.tolerance`: the error algebra, a rounding
  error bound per element, and the registry of the rules' bound models.
* :mod:`~onnx_optax.conformance.models`: each rule's bound model, one module
  per rule (its bounds and the spec's formulas of its per-update scalars).
* :mod:`~onnx_optax.conformance.cases`: the case grid (rules, dtypes,
  shapes, hyperparameter edges, starting states), read from the registry.
* :mod:`~onnx_optax.conformance.scalars`: each rule's per-update scalars,
  evaluated on the device from the spec's formula; their measured error is
  what the tolerance charges for them.
* :mod:`~onnx_optax.conformance.order`: the framework twins compared to the
  bit with their framework's float32 order.
* :mod:`~onnx_optax.conformance.check`: runs a case through its Optax
  transform on an explicitly chosen device and compares with its
  expectation.
* :mod:`~onnx_optax.conformance.onnx_references`: ONNX's backend test cases
  and ``ReferenceEvaluator`` (needs the optional ``onnx`` package).
* :mod:`~onnx_optax.conformance.report`: the table, JSON and Markdown.

Only JAX, Optax and NumPy are needed, plus ``onnx`` for ONNX's references.
"""

from onnx_optax.conformance.cases import DTYPES, Case
from onnx_optax.conformance.check import CaseResult, check_outputs, run_case
from onnx_optax.conformance.devices import platforms

__all__ = ["DTYPES", "Case", "CaseResult", "check_outputs", "platforms", "run_case"]
