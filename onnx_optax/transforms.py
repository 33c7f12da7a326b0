"""The rules as Optax ``GradientTransformation``\\ s over pytrees.

Each public function closes over its hyperparameters and returns an
``optax.GradientTransformationExtraArgs``. Each is defined in its rule's module
(:mod:`onnx_optax.rules`), beside the rule's formula and its registration, and
built by the one engine (:mod:`onnx_optax._engine`), which maps the rule over the
leaves of a pytree, keeps the update count, and settles dtypes. This module
gathers them (``onnx_optax.<rule>`` is the same function).

Common semantics
----------------

``count`` (the state's first field) is the spec's ``T``: the value the *next*
update runs with. It starts at ``initial_count`` (0 for the ONNX rules, whose
``T`` counts the updates already conducted; 1 for DirectML Adam and ONNX
Runtime's AdamW, whose first update must run with ``T = 1``) and grows by one per update, saturating at the
int32 maximum (``optax.safe_increment``) instead of wrapping.

``learning_rate`` is a float or an Optax schedule. A schedule is evaluated at
the number of updates this transform has applied, ``count - initial_count``
(0 at the first update, as for every Optax optimizer), whatever ``T`` the rule
itself uses. That number is an int32 array, int64 under ``jax_enable_x64``:
there ``n / k`` is float64, as a Python float is (an int32 count would make
``optax.linear_schedule``'s rate float32, rounded to 1e-8 relative).

Dtypes: the state is stored in ``state_dtype`` (default: each parameter's
dtype). Each leaf is computed in the wider of its parameter's dtype and its
state's dtype, the new state is rounded to ``state_dtype`` and the update to
the parameter's dtype. ``state_dtype=jnp.float32`` with float16 or bfloat16
parameters is the documented way to keep accumulators (Adagrad's ``H`` grows
without bound) in range and precise. The count is an int32 scalar.

``norm_coefficient`` (and ONNX Adam's ``norm_coefficient_post``) need the
parameters: ``update(grads, state, params)``. When such a coefficient is the
Python number 0 the parameters are not read at all (the spec's ``0 * X``
differs from nothing only for non-finite ``X``), so ``update`` works without
them and the step moves fewer bytes.

``None`` leaves, and the ``optax.MaskedNode`` leaves that ``optax.masked``
hands in, have no state and pass through untouched.
"""

from onnx_optax._engine import ScalarOrSchedule
from onnx_optax.rules.directml import DirectMLAdamState, directml_adam
from onnx_optax.rules.keras import KerasAdamState, keras_adam
from onnx_optax.rules.onnx_adagrad import AdagradState, adagrad
from onnx_optax.rules.onnx_adam import AdamState, adam
from onnx_optax.rules.onnx_momentum import MomentumState, momentum
from onnx_optax.rules.ort import OrtAdamWState, OrtSGDState, ort_adamw, ort_sgd
from onnx_optax.rules.torch_adadelta import PyTorchAdadeltaState, pytorch_adadelta
from onnx_optax.rules.torch_adafactor import PyTorchAdafactorState, pytorch_adafactor
from onnx_optax.rules.torch_adagrad import PyTorchAdagradState, pytorch_adagrad
from onnx_optax.rules.torch_adam import PyTorchAdamAMSGradState, PyTorchAdamState, pytorch_adam, pytorch_adamw
from onnx_optax.rules.torch_adamax import PyTorchAdamaxState, pytorch_adamax
from onnx_optax.rules.torch_asgd import PyTorchASGDState, pytorch_asgd
from onnx_optax.rules.torch_muon import PyTorchMuonState, pytorch_muon
from onnx_optax.rules.torch_nadam import PyTorchNAdamState, pytorch_nadam
from onnx_optax.rules.torch_radam import PyTorchRAdamState, pytorch_radam
from onnx_optax.rules.torch_rmsprop import PyTorchRMSpropState, pytorch_rmsprop
from onnx_optax.rules.torch_rprop import PyTorchRpropState, pytorch_rprop
from onnx_optax.rules.torch_sgd import PyTorchSGDState, pytorch_sgd

__all__ = [
  "AdagradState",
  "AdamState",
  "DirectMLAdamState",
  "KerasAdamState",
  "MomentumState",
  "OrtAdamWState",
  "OrtSGDState",
  "PyTorchAdadeltaState",
  "PyTorchAdafactorState",
  "PyTorchAdagradState",
  "PyTorchASGDState",
  "PyTorchAdamAMSGradState",
  "PyTorchAdamState",
  "PyTorchAdamaxState",
  "PyTorchMuonState",
  "PyTorchNAdamState",
  "PyTorchRAdamState",
  "PyTorchRMSpropState",
  "PyTorchRpropState",
  "PyTorchSGDState",
  "ScalarOrSchedule",
  "adagrad",
  "adam",
  "directml_adam",
  "keras_adam",
  "momentum",
  "ort_adamw",
  "ort_sgd",
  "pytorch_adadelta",
  "pytorch_adafactor",
  "pytorch_adagrad",
  "pytorch_adam",
  "pytorch_adamax",
  "pytorch_adamw",
  "pytorch_asgd",
  "pytorch_muon",
  "pytorch_nadam",
  "pytorch_radam",
  "pytorch_rmsprop",
  "pytorch_rprop",
  "pytorch_sgd",
]
