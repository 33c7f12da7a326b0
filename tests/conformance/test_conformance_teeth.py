"""The suite has teeth: deliberately wrong variants of each rule are caught.

Each mutant is a copy of a rule of :mod:`onnx_optax.rules` with one plausible
mistake. It replaces the rule (``monkeypatch``), so the mutant runs through
the very path the suite checks (the Optax transform, jit, apply_updates),
and the suite's cases of that rule must fail in every dtype. (In bfloat16
the default beta = 0.999 rounds to 1; the state_dtype=float32 cases and the
tiny-gradient case with R = 1 are what catch the epsilon-placement mutants
there.)
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from onnx_optax import rules
from onnx_optax.conformance import cases as grid
from onnx_optax.conformance import check

_like, _omp, _sqrt = rules._like, rules._one_minus_power, rules._sqrt


# -- Momentum -------------------------------------------------------------------------

def _momentum(R, T, X, G, V, *, alpha, beta, mode, norm_coefficient,
              first_step_rule=True, t_shift=0, nesterov_uses_old_v=False):
  T = jnp.asarray(T) + t_shift
  beta_adjusted = jnp.where(T > 0, beta, 1) if first_step_rule else beta
  R, alpha, beta_adjusted, norm_coefficient = _like(X, R, alpha, beta_adjusted, norm_coefficient)
  G_regularized = norm_coefficient * X + G
  V_new = alpha * V + beta_adjusted * G_regularized
  if mode == "standard":
    return -(R * V_new), V_new
  return -(R * (G_regularized + alpha * (V if nesterov_uses_old_v else V_new))), V_new


def momentum_first_step_rule_dropped(*args, **kw):
  return _momentum(*args, **kw, first_step_rule=False)


def momentum_T_off_by_one(*args, **kw):
  return _momentum(*args, **kw, t_shift=-1)


def momentum_nesterov_old_V(*args, **kw):
  return _momentum(*args, **kw, nesterov_uses_old_v=True)


# -- Adagrad --------------------------------------------------------------------------

def _adagrad(R, T, X, G, H, *, decay_factor, epsilon, norm_coefficient, t_shift=0, eps_in_sqrt=False):
  r = R / (1 + (jnp.asarray(T) + t_shift) * decay_factor)
  r, norm_coefficient, epsilon = _like(X, r, norm_coefficient, epsilon)
  G_regularized = norm_coefficient * X + G
  H_new = H + G_regularized * G_regularized
  H_adaptive = jnp.sqrt(H_new + epsilon) if eps_in_sqrt else _sqrt(H_new) + epsilon
  return -(r * G_regularized / H_adaptive), H_new


def adagrad_epsilon_in_sqrt(*args, **kw):
  return _adagrad(*args, **kw, eps_in_sqrt=True)


def adagrad_T_off_by_one(*args, **kw):
  return _adagrad(*args, **kw, t_shift=1)


# -- ONNX Adam ------------------------------------------------------------------------

def _adam(R, T, X, G, V, H, *, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post,
          t_shift=0, eps_in_sqrt=False, optax_epsilon=False, correct_at_0=False, drop_post=False):
  T = jnp.asarray(T) + t_shift
  T_used = jnp.maximum(T, 1)
  bias_1, bias_2 = _omp(alpha, T_used), _omp(beta, T_used)
  corrected = (T > 0) | correct_at_0
  R_adjusted = jnp.where(corrected, R * jnp.sqrt(bias_2) / bias_1, R)
  R_, alpha, beta, epsilon, norm_coefficient, post = _like(
      X, R_adjusted, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post)
  G_regularized = norm_coefficient * X + G
  V_new = alpha * V + (1 - alpha) * G_regularized
  H_new = beta * H + (1 - beta) * G_regularized * G_regularized
  if optax_epsilon:  # optax.adam: epsilon added to the bias-corrected sqrt(H).
    b1, b2, r = _like(X, jnp.where(corrected, bias_1, 1), jnp.where(corrected, bias_2, 1), R)
    step = r * (V_new / b1) / (jnp.sqrt(H_new / b2) + epsilon)
  else:
    H_sqrt = jnp.sqrt(H_new + epsilon) if eps_in_sqrt else _sqrt(H_new) + epsilon
    step = R_ * V_new / H_sqrt
  X_new = X - step
  X_final = X_new if drop_post else (1 - post) * X_new
  return X_final - X, V_new, H_new


def adam_epsilon_in_sqrt(*args, **kw):
  return _adam(*args, **kw, eps_in_sqrt=True)


def adam_T_off_by_one(*args, **kw):
  return _adam(*args, **kw, t_shift=1)


def adam_optax_epsilon(*args, **kw):
  return _adam(*args, **kw, optax_epsilon=True)


def adam_bias_correction_at_T0(*args, **kw):
  return _adam(*args, **kw, correct_at_0=True)


def adam_norm_coefficient_post_dropped(*args, **kw):
  return _adam(*args, **kw, drop_post=True)


# -- DirectML Adam --------------------------------------------------------------------

def _directml(X, M, V, G, T, *, learning_rate, beta1, beta2, epsilon, t_shift=0, eps_in_sqrt=False,
              optax_epsilon=False):
  T = jnp.asarray(T) + t_shift
  bias_1, bias_2 = _omp(beta1, T), _omp(beta2, T)
  step_size = learning_rate * jnp.sqrt(bias_2) / bias_1
  step_size, b1, b2, epsilon = _like(X, step_size, beta1, beta2, epsilon)
  M_new = b1 * M + (1 - b1) * G
  V_new = b2 * V + (1 - b2) * G * G
  if optax_epsilon:
    c1, c2, r = _like(X, bias_1, bias_2, learning_rate)
    return -(r * (M_new / c1) / (jnp.sqrt(V_new / c2) + epsilon)), M_new, V_new
  root = jnp.sqrt(V_new + epsilon) if eps_in_sqrt else _sqrt(V_new) + epsilon
  return -(step_size * M_new / root), M_new, V_new


def directml_epsilon_in_sqrt(*args, **kw):
  return _directml(*args, **kw, eps_in_sqrt=True)


def directml_T_off_by_one(*args, **kw):
  return _directml(*args, **kw, t_shift=-1)


def directml_optax_epsilon(*args, **kw):
  return _directml(*args, **kw, optax_epsilon=True)


MUTANTS = [
    ("momentum", ("momentum_standard", "momentum_nesterov"), momentum_first_step_rule_dropped),
    ("momentum", ("momentum_standard", "momentum_nesterov"), momentum_T_off_by_one),
    ("momentum", ("momentum_nesterov",), momentum_nesterov_old_V),
    ("adagrad", ("adagrad",), adagrad_epsilon_in_sqrt),
    ("adagrad", ("adagrad",), adagrad_T_off_by_one),
    ("adam", ("adam",), adam_epsilon_in_sqrt),
    ("adam", ("adam",), adam_T_off_by_one),
    ("adam", ("adam",), adam_optax_epsilon),
    ("adam", ("adam",), adam_bias_correction_at_T0),
    ("adam", ("adam",), adam_norm_coefficient_post_dropped),
    ("directml_adam", ("directml_adam",), directml_epsilon_in_sqrt),
    ("directml_adam", ("directml_adam",), directml_T_off_by_one),
    ("directml_adam", ("directml_adam",), directml_optax_epsilon),
]


def _caught(rule: str, dtype: str) -> str | None:
  """The first case of the suite that fails, or None."""
  for case in grid.cases(rule, dtype, large=False):
    result = check.run_case(case)
    # A mutant that crashes would be "caught" for the wrong reason.
    assert not result.error, f"{case.id} raised {result.error}"
    if not result.passed:
      return case.name
  return None


@pytest.mark.parametrize("dtype", grid.DTYPES)
@pytest.mark.parametrize("target,suite_rules,mutant", MUTANTS, ids=[m.__name__ for _, _, m in MUTANTS])
def test_wrong_variant_is_caught(monkeypatch, target, suite_rules, mutant, dtype):
  monkeypatch.setattr(rules, target, mutant)
  for rule in suite_rules:
    assert _caught(rule, dtype) is not None, f"{mutant.__name__} passes the {rule} {dtype} cases"


@pytest.mark.parametrize("target,rule,mutant", [
    ("momentum", "momentum_nesterov", _momentum), ("adagrad", "adagrad", _adagrad),
    ("adam", "adam", _adam), ("directml_adam", "directml_adam", _directml)])
def test_unmutated_copies_pass(monkeypatch, target, rule, mutant):
  """The mutants' common body is right: without a mutation they pass the suite."""
  monkeypatch.setattr(rules, target, mutant)
  assert _caught(rule, "float32") is None
