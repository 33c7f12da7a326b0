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

# isort: off
# In the registry's order: the spec rules, then their twins (they register when imported).
from onnx_optax.conformance.models import onnx_momentum, onnx_adagrad, onnx_adam, directml, ort  # noqa: F401
from onnx_optax.conformance.models import torch_sgd, torch_adagrad, torch_adam, keras  # noqa: F401
from onnx_optax.conformance.models import torch_rmsprop  # noqa: F401
from onnx_optax.conformance.models import torch_adamax, torch_adadelta, torch_rprop  # noqa: F401
from onnx_optax.conformance.models import torch_radam  # noqa: F401
from onnx_optax.conformance.models import torch_nadam  # noqa: F401
from onnx_optax.conformance.models import torch_asgd  # noqa: F401
from onnx_optax.conformance.models import torch_adafactor  # noqa: F401
from onnx_optax.conformance.models import torch_muon  # noqa: F401

# isort: on
