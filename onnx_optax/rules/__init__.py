"""The update rules, one module each, written once in the names and order of docs/spec.md.

Each module holds one rule (or one family): its formula, its state, its Optax
transform and its :class:`~onnx_optax.registry.Rule`, registered when the module
is imported. This package imports every module it holds (a new rule is its module and nothing
here), in the order of their names; :func:`onnx_optax.registry.rules` lists the spec rules, then
the framework twins. The modules:

* :mod:`~onnx_optax.rules.onnx_momentum`, :mod:`~onnx_optax.rules.onnx_adagrad`,
  :mod:`~onnx_optax.rules.onnx_adam`: ONNX's training operators;
* :mod:`~onnx_optax.rules.directml`: DirectML's Adam;
* :mod:`~onnx_optax.rules.ort`: ONNX Runtime's ``AdamWOptimizer`` and ``SGDOptimizerV2``;
* ``torch_<class>`` (one per ``torch.optim`` class, :mod:`~onnx_optax.rules.torch_adam` for
  Adam and AdamW) and :mod:`~onnx_optax.rules.keras`: the framework twins, the rules of
  PyTorch and Keras 3 in their operation order.

This is the only place in the package where the arithmetic of the rules is
written; the shared pieces (:mod:`onnx_optax._numerics`, :mod:`onnx_optax._pytorch`)
and the engine that maps a rule over a pytree (:mod:`onnx_optax._engine`) are
not one rule's. The ONNX interface (:mod:`onnx_optax.onnx`) and the bridges
(:mod:`onnx_optax.interop`) read the registry; they never restate a formula.
The NumPy expectations (:mod:`onnx_optax.reference`) are written
independently, from the spec, so that they can catch mistakes here.

Each rule is written in two parts, which together are the spec's formula in
the spec's order:

* ``<rule>_scalars(R, T, **hyperparameters)``: the scalars that depend only on
  the hyperparameters and ``T`` (the bias corrections, Adagrad's decayed rate,
  Momentum's ``beta_adjusted``, the decays' ``1 - beta``), a ``NamedTuple``.
  A pytree of many leaves needs them once per update, not once per leaf.
* ``<rule>_elementwise(scalars, X, G, *state, **static)``: the element-wise
  work on one tensor, with the scalars already rounded to ``X``'s dtype by
  :func:`onnx_optax._numerics.like`.

The single-tensor function ``<rule>(R, T, X, G, *state, ...)`` of this module
(``<rule>_tensor`` in the rule's own) is the two composed, with the scalars
rounded once to ``X``'s dtype (:func:`onnx_optax._engine.tensor`).

Conventions shared by every rule:

* Each function updates **one tensor** ``X`` with its gradient ``G`` and its
  state tensors. Pytrees and ONNX's variadic blocks are loops around it.
* Each returns ``(U, *new_state)`` where ``U`` is the additive update:
  ``X + U`` is the spec's ``X_new``. For rules whose spec reads
  ``X_new = X - S``, ``U`` is ``-(S)`` computed in the spec's order, and
  ``X + U`` equals ``X - S`` to the bit (IEEE ``x + (-y)`` is ``x - y``).
  This is what lets ``optax.apply_updates(params, updates)`` reproduce the
  spec exactly. The one exception is ONNX Adam with a non-zero
  ``norm_coefficient_post``, documented in :func:`onnx_optax.rules.onnx_adam.adam_tensor`.
* The scalars are computed in the dtype the hyperparameters arrive in
  (float32 for Python floats and for Optax's injected hyperparameters;
  float64 under ``jax_enable_x64``) and rounded once to ``X``'s dtype.
  Computing ``1 - beta**T`` in float16 would lose most of its digits, and
  this keeps a float16 or bfloat16 update as accurate as its own arithmetic
  allows. The bias corrections' ``1 - beta^T`` is evaluated as
  ``-expm1(T * log(beta))`` (see :func:`onnx_optax._numerics.one_minus_power`): the spec's
  number, without cancellation. The decays' ``1 - beta`` are such scalars
  too (see :func:`onnx_optax._numerics.one_minus`).
* Every element-wise operation runs in ``X``'s dtype; callers that want a
  wider compute dtype cast ``X``, ``G`` and the state before the call (the
  Optax transforms do, see ``state_dtype``).
* ``X=None`` in an element-wise part means that the parameters are not read:
  the caller knows ``norm_coefficient`` is the Python number 0, and the spec's
  ``0 * X + G`` is ``G`` for every finite ``X``. The Optax transforms use it;
  the single-tensor functions always read ``X``.
* ``T`` is an integer scalar (array or Python int). Branches on ``T > 0`` use
  :func:`jax.numpy.where`, so every rule is jittable and has no Python
  control flow on traced values.
"""

# ruff: noqa: E402  (the modules register in the order of their names, before the re-exports import any)
from __future__ import annotations

from onnx_optax._discover import import_submodules

# Every module of this package holds one rule (or family) and registers it when imported: they
# are found here, not listed, so a new rule is its module and nothing in this file.
import_submodules(__name__, __path__)

from onnx_optax._numerics import like
from onnx_optax.rules import directml, onnx_adagrad, onnx_adam, onnx_momentum, ort
from onnx_optax.rules.directml import DirectMLAdamScalars, directml_adam_elementwise, directml_adam_scalars
from onnx_optax.rules.keras import KerasAdamScalars, keras_adam_elementwise, keras_adam_scalars
from onnx_optax.rules.onnx_adagrad import AdagradScalars, adagrad_elementwise, adagrad_scalars
from onnx_optax.rules.onnx_adam import AdamScalars, adam_elementwise, adam_scalars
from onnx_optax.rules.onnx_momentum import MODES, MomentumScalars, momentum_elementwise, momentum_scalars
from onnx_optax.rules.ort import (
  ADAM_MODES,
  OrtAdamWScalars,
  OrtSGDScalars,
  ort_adamw_elementwise,
  ort_adamw_scalars,
  ort_sgd_elementwise,
  ort_sgd_scalars,
)
from onnx_optax.rules.torch_adagrad import (
  PyTorchAdagradScalars,
  pytorch_adagrad_elementwise,
  pytorch_adagrad_scalars,
)
from onnx_optax.rules.torch_adam import PyTorchAdamScalars, pytorch_adam_elementwise, pytorch_adam_scalars
from onnx_optax.rules.torch_sgd import PyTorchSGDScalars, pytorch_sgd_elementwise, pytorch_sgd_scalars

# The single-tensor functions under the names this module has always given them.
momentum = onnx_momentum.momentum_tensor
adagrad = onnx_adagrad.adagrad_tensor
adam = onnx_adam.adam_tensor
directml_adam = directml.directml_adam_tensor
ort_adamw = ort.ort_adamw_tensor
ort_sgd = ort.ort_sgd_tensor

__all__ = [
  "ADAM_MODES",
  "MODES",
  "AdagradScalars",
  "AdamScalars",
  "DirectMLAdamScalars",
  "KerasAdamScalars",
  "MomentumScalars",
  "OrtAdamWScalars",
  "OrtSGDScalars",
  "PyTorchAdagradScalars",
  "PyTorchAdamScalars",
  "PyTorchSGDScalars",
  "adagrad",
  "adagrad_elementwise",
  "adagrad_scalars",
  "adam",
  "adam_elementwise",
  "adam_scalars",
  "directml_adam",
  "directml_adam_elementwise",
  "directml_adam_scalars",
  "keras_adam_elementwise",
  "keras_adam_scalars",
  "like",
  "momentum",
  "momentum_elementwise",
  "momentum_scalars",
  "ort_adamw",
  "ort_adamw_elementwise",
  "ort_adamw_scalars",
  "ort_sgd",
  "ort_sgd_elementwise",
  "ort_sgd_scalars",
  "pytorch_adagrad_elementwise",
  "pytorch_adagrad_scalars",
  "pytorch_adam_elementwise",
  "pytorch_adam_scalars",
  "pytorch_sgd_elementwise",
  "pytorch_sgd_scalars",
]
