"""The hyperparameters the tests run each rule with, in one place.

Every term of every formula matters with these values: non-zero
norm_coefficient, beta != 1, epsilon comparable to sqrt(H), decay_factor > 0,
norm_coefficient_post > 0. (test_numerics uses realistic defaults instead.)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

import onnx_optax


class RuleConfig(NamedTuple):
  rule: str            # the key of onnx_optax.reference.RULES
  make: Callable[..., Any]
  state_cls: type
  hyper: dict[str, Any]
  learning_rate: float
  sweep: str           # a second hyperparameter to sweep, besides the learning rate


RULE_CONFIGS = {
    "momentum_standard": RuleConfig(
        "momentum", onnx_optax.momentum, onnx_optax.MomentumState,
        dict(alpha=0.9, beta=0.7, mode="standard", norm_coefficient=0.05), 0.05, "alpha"),
    "momentum_nesterov": RuleConfig(
        "momentum", onnx_optax.momentum, onnx_optax.MomentumState,
        dict(alpha=0.8, beta=0.6, mode="nesterov", norm_coefficient=0.05), 0.05, "beta"),
    "adagrad": RuleConfig(
        "adagrad", onnx_optax.adagrad, onnx_optax.AdagradState,
        dict(decay_factor=0.2, epsilon=0.5, norm_coefficient=0.05), 0.3, "decay_factor"),
    "adam": RuleConfig(
        "adam", onnx_optax.adam, onnx_optax.AdamState,
        dict(alpha=0.85, beta=0.95, epsilon=0.3, norm_coefficient=0.05, norm_coefficient_post=0.01),
        0.05, "beta"),
    "directml_adam": RuleConfig(
        "directml_adam", onnx_optax.directml_adam, onnx_optax.DirectMLAdamState,
        dict(beta1=0.85, beta2=0.95, epsilon=0.3), 0.05, "beta1"),
}


def first_count(rule: str) -> int:
  """The spec's ``T`` at a rule's first update (DirectML's step starts at 1)."""
  return 1 if rule == "directml_adam" else 0


def as_float32_sees(value: Any) -> Any:
  """A hyperparameter as a float32 transform sees it (Python floats are weak float32)."""
  return value if isinstance(value, str) else float(np.float32(value))
