"""Hyperparameters are keyword-only in every public and internal signature.

One table for every module (rules, transforms, references, the ONNX calls, the
input checks, the tolerance model, the bridges): a hyperparameter passed by
position, which would silently bind ``0.9`` to the wrong name, is a TypeError,
and nothing is positional-only.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import onnx_optax
import onnx_optax._checks
import onnx_optax._engine
import onnx_optax._pytorch
import onnx_optax.interop
import onnx_optax.onnx
from onnx_optax import reference, rules
from onnx_optax.conformance import scalars, tolerance
from onnx_optax.conformance.models import directml as directml_model
from onnx_optax.conformance.models import keras as keras_model
from onnx_optax.conformance.models import (
  onnx_adagrad,
  onnx_adam,
  onnx_momentum,
  torch_adagrad,
  torch_adam,
  torch_sgd,
)
from onnx_optax.conformance.models import ort as ort_model
from onnx_optax.interop import torch as torch_bridge

KEYWORD_ONLY = {
  # function: the names that must be keyword-only (hyperparameters, static arguments)
  rules.momentum_scalars: ["alpha", "beta", "norm_coefficient"],
  rules.momentum_elementwise: ["mode"],
  rules.momentum: ["alpha", "beta", "mode", "norm_coefficient"],
  rules.adagrad_scalars: ["decay_factor", "epsilon", "norm_coefficient"],
  rules.adagrad: ["decay_factor", "epsilon", "norm_coefficient"],
  rules.adam_scalars: ["alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post"],
  rules.adam: ["alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post"],
  rules.directml_adam_scalars: ["beta1", "beta2", "epsilon"],
  rules.directml_adam: ["learning_rate", "beta1", "beta2", "epsilon"],
  onnx_optax._engine.transform: [],  # the rule, then learning_rate, initial_count, state_dtype, hyper
  onnx_optax.momentum: ["alpha", "beta", "mode", "norm_coefficient", "initial_count", "state_dtype"],
  onnx_optax.adagrad: ["decay_factor", "epsilon", "norm_coefficient", "initial_count", "state_dtype"],
  onnx_optax.adam: [
    "alpha",
    "beta",
    "epsilon",
    "norm_coefficient",
    "norm_coefficient_post",
    "initial_count",
    "state_dtype",
  ],
  onnx_optax.directml_adam: ["beta1", "beta2", "epsilon", "initial_count", "state_dtype"],
  onnx_optax.onnx.from_node: ["initial_count", "state_dtype"],
  # The framework twins: their frameworks' names, keyword-only as everywhere else.
  onnx_optax.pytorch_sgd: [
    "momentum",
    "dampening",
    "weight_decay",
    "nesterov",
    "maximize",
    "initial_count",
    "state_dtype",
  ],
  rules.pytorch_sgd_scalars: ["momentum", "dampening", "weight_decay"],
  rules.pytorch_sgd_elementwise: ["nesterov", "maximize"],
  onnx_optax.pytorch_adagrad: [
    "lr_decay",
    "weight_decay",
    "initial_accumulator_value",
    "eps",
    "maximize",
    "initial_count",
    "state_dtype",
  ],
  rules.pytorch_adagrad_scalars: ["lr_decay", "eps", "weight_decay"],
  rules.pytorch_adagrad_elementwise: ["maximize"],
  onnx_optax.pytorch_adam: [
    "betas",
    "eps",
    "weight_decay",
    "decoupled_weight_decay",
    "maximize",
    "initial_count",
    "state_dtype",
  ],
  onnx_optax.pytorch_adamw: ["betas", "eps", "weight_decay", "maximize", "initial_count", "state_dtype"],
  rules.pytorch_adam_scalars: ["beta1", "beta2", "eps", "weight_decay", "decoupled_weight_decay"],
  rules.pytorch_adam_elementwise: ["maximize", "lerp_small"],
  onnx_optax.keras_adam: ["beta_1", "beta_2", "epsilon", "initial_count", "state_dtype"],
  rules.keras_adam_elementwise: ["beta_1", "beta_2", "epsilon"],
  onnx_optax._pytorch.lerp: ["small"],
  onnx_optax._checks.hyperparameter: ["minimum", "maximum", "maximum_exclusive"],
  onnx_optax._checks.count: ["minimum"],
  onnx_optax._checks.integer_scalar: ["minimum", "shape_ok", "why"],
  onnx_optax._checks.decay: ["below_one"],
  onnx_optax._checks.int64_step: ["minimum", "why"],
  rules.ort_adamw_scalars: ["alpha", "beta", "epsilon", "weight_decay", "adam_mode", "correct_bias"],
  rules.ort_adamw_elementwise: ["adam_mode"],
  rules.ort_adamw: ["alpha", "beta", "epsilon", "weight_decay", "adam_mode", "correct_bias"],
  reference.ort_adamw: ["alpha", "beta", "epsilon", "weight_decay", "adam_mode", "correct_bias", "dtype"],
  onnx_optax.ort_adamw: [
    "alpha",
    "beta",
    "epsilon",
    "weight_decay",
    "adam_mode",
    "correct_bias",
    "state_dtype",
  ],
  onnx_optax.ort_sgd: ["initial_count", "state_dtype"],
  onnx_optax.onnx.adamw_optimizer: ["alpha", "beta", "epsilon", "weight_decay", "correct_bias", "adam_mode"],
  onnx_optax.onnx.from_model: ["initial_count", "state_dtype"],
  onnx_optax.interop.from_torch: ["learning_rate"],
  onnx_optax.interop.from_keras: ["learning_rate"],
  onnx_optax.interop.to_keras: ["variables"],
  onnx_optax.interop.to_torch: [],  # no option: only nothing positional-only
  onnx_optax.interop.torch_params: [],
  onnx_optax.interop.from_torch_state_dict: ["optimizer", "learning_rate", "param_names"],
  onnx_optax.interop.to_torch_state_dict: ["optimizer", "learning_rate", "param_names"],
  onnx_optax.interop.to_torch_scheduler_state_dict: ["steps", "learning_rate"],
  onnx_optax.interop.to_trainer_checkpoint: ["steps", "learning_rate", "param_names", "optimizer"],
  onnx_optax.interop.to_lightning_checkpoint: ["steps", "learning_rate", "param_names", "optimizer"],
  onnx_optax.interop.torch_param_names: [],
  onnx_optax._checks.wide_enough: ["at_least", "why"],
  onnx_optax.interop._common.check_leaves: ["argument", "order"],
  torch_bridge._check_group: ["source"],
  torch_bridge.mapping: ["tensors", "is_leaf"],
  onnx_momentum.momentum_bounds: ["alpha", "beta", "mode", "norm_coefficient"],
  onnx_adagrad.adagrad_bounds: ["decay_factor", "epsilon", "norm_coefficient"],
  onnx_adam.adam_bounds: ["alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post"],
  directml_model.directml_adam_bounds: ["beta1", "beta2", "epsilon"],
  ort_model.ort_adamw_bounds: ["alpha", "beta", "epsilon", "weight_decay", "adam_mode", "correct_bias"],
  ort_model.ort_sgd_bounds: [],
  torch_sgd.pytorch_sgd_bounds: ["momentum", "dampening", "weight_decay", "nesterov"],
  torch_adagrad.pytorch_adagrad_bounds: ["lr_decay", "eps", "weight_decay"],
  torch_adam.pytorch_adam_bounds: ["betas", "eps", "weight_decay", "decoupled"],
  keras_model.keras_adam_bounds: ["beta_1", "beta_2", "epsilon"],
  # The conformance measurement's options.
  scalars.start: ["x64", "received", "schedule", "batch", "memo"],
  scalars.measure: ["x64", "received", "schedule"],
  tolerance.implementation_context: ["arithmetic", "scalars"],
  tolerance.register_model: ["bounds", "scalars"],
  reference.momentum: ["alpha", "beta", "mode", "norm_coefficient", "dtype"],
  reference.adagrad: ["decay_factor", "epsilon", "norm_coefficient", "dtype"],
  reference.adam: ["alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post", "dtype"],
  reference.directml_adam: ["learning_rate", "beta1", "beta2", "epsilon", "dtype"],
  reference.pytorch_sgd: ["momentum", "dampening", "weight_decay", "nesterov", "maximize", "dtype"],
  reference.pytorch_adagrad: ["lr_decay", "eps", "weight_decay", "maximize", "dtype", "scalars"],
  reference.pytorch_adam: [
    "betas",
    "eps",
    "weight_decay",
    "decoupled_weight_decay",
    "maximize",
    "dtype",
    "scalars",
  ],
}


@pytest.mark.parametrize("function", list(KEYWORD_ONLY), ids=lambda f: f"{f.__module__}.{f.__qualname__}")
def test_hyperparameters_are_keyword_only(function):
  """Hyperparameters are named at every call (as in the ONNX schema's attributes): a positional
  hyperparameter, which would silently bind ``0.9`` to the wrong name, is a TypeError."""
  import inspect

  parameters = inspect.signature(function).parameters
  kinds = {name: p.kind for name, p in parameters.items()}
  assert all(kinds[n] == inspect.Parameter.KEYWORD_ONLY for n in KEYWORD_ONLY[function])
  assert inspect.Parameter.POSITIONAL_ONLY not in kinds.values()


def test_positional_hyperparameter_is_a_type_error():
  X = np.array([1.0])
  with pytest.raises(TypeError):
    reference.directml_adam(X, X, X, X, 1, 0.1, 0.9, 0.999, 1e-8)
  with pytest.raises(TypeError):
    rules.adagrad(0.1, 0, jnp.ones(1), jnp.ones(1), jnp.ones(1), 0.0, 1e-6, 0.0)
  with pytest.raises(TypeError):
    onnx_optax.adam(0.1, 0.9)


# --- the input checks (_checks.py) and the ONNX interface (onnx.py) -----------------------------
