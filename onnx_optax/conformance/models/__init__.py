"""The rules' bound models, one module per rule (or family), mirroring :mod:`onnx_optax.rules`.

Each module holds one rule's bound model (:class:`~onnx_optax.conformance.tolerance.BoundModel`):
its formula written in the error algebra of :mod:`onnx_optax.conformance.tolerance`, in the
rule's evaluation order (which is also its NumPy expectation's), and the spec's formulas of its
per-update scalars (evaluated on the device by :mod:`onnx_optax.conformance.scalars`), and
registers them under the rule's name when it is imported. These are bounds, not the rules: a
mistake here can loosen or tighten the suite, never change the expected values (those come from
:mod:`onnx_optax.reference`).

A rule registered from outside the package registers its own model with
:func:`onnx_optax.conformance.tolerance.register_model`; nothing here needs to change.
"""

from onnx_optax._discover import import_submodules

# Every module here holds one rule's model and registers it when imported: found, not listed.
import_submodules(__name__, __path__)
