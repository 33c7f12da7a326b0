"""onnx_optax: the optimizers of ONNX training, ONNX Runtime and DirectML as Optax transforms.

The update rules of ONNX ``Momentum``, ``Adagrad`` and ``Adam``
(ai.onnx.preview.training, v1), of ONNX Runtime's training operators
``AdamWOptimizer`` and ``SGDOptimizerV2`` (com.microsoft, v1) and of DirectML's
``DML_ADAM_OPTIMIZER_OPERATOR_DESC``, as jittable, pure
``optax.GradientTransformation``\\ s over pytrees.

Layers, one place each:

* :mod:`onnx_optax.registry`: the registry every layer reads, one :class:`~onnx_optax.registry.Rule`
  per rule.
* :mod:`onnx_optax.rules`: the update rules, one module per rule (its formula, state,
  transform and registration).
* :mod:`onnx_optax.transforms`: the Optax transforms, gathered (re-exported here).
* :mod:`onnx_optax.onnx`: the ONNX operators' own calls, ``run_node`` and
  ``from_node``; the DirectML operator's call, re-exported.
* :mod:`onnx_optax.directml`: DirectML's Adam call, in its operand order.
* :mod:`onnx_optax.interop`: optimizer state to and from PyTorch and Keras 3.
* :mod:`onnx_optax.reference`: NumPy expectations written from the spec.
* :mod:`onnx_optax.conformance`: the conformance suite and report
  (``python -m onnx_optax.conformance``).

The spec, each rule's formulas, ``T``, defaults, dtypes and operand orders:
docs/spec.md.
"""

from onnx_optax import registry as registry  # the registry, filled by the rules
from onnx_optax import rules as rules
from onnx_optax import transforms as _transforms
from onnx_optax.transforms import *  # noqa: F403  # every rule's transform and state, by its name

__version__ = "0.1.0"

#: The rules' transforms and states (:mod:`onnx_optax.transforms` lists them, one line a rule).
__all__ = [name for name in _transforms.__all__ if name != "ScalarOrSchedule"]
