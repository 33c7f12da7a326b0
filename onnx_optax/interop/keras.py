"""Keras 3 ``keras.optimizers.Adam`` state to and from :func:`onnx_optax.keras_adam`.

Keras 3's Adam is DirectML Adam (docs/spec.md): epsilon after the bias
correction, which Keras folds into the step size
``alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` with ``t = iterations + 1``.
Its moment updates ``m += (g - m) * (1 - beta_1)`` are DirectML's
``M_new = Beta1 * M + (1 - Beta1) * G`` rearranged (equal up to rounding), so
:func:`from_keras` returns the rule's Keras-order twin, :func:`onnx_optax.keras_adam`,
whose float32 runs follow Keras's (docs/spec.md, "PyTorch-order twins"):

=============================  ==============================================
``keras.optimizers.Adam``      :func:`onnx_optax.keras_adam`
=============================  ==============================================
``learning_rate``              ``learning_rate``
``beta_1``, ``beta_2``         ``beta_1``, ``beta_2``
``epsilon``                    ``epsilon``
``iterations``                 ``state.count``
``_momentums[i]``              ``state.momentums``
``_velocities[i]``             ``state.velocities``
=============================  ==============================================

:func:`to_keras` also loads the states of DirectML Adam
(:func:`onnx_optax.directml_adam`, ``count = iterations + 1``) and, from
``T = 1`` on, of ONNX ``Adam`` (``onnx_optax.adam(lr, alpha=beta_1,
beta=beta_2, epsilon=epsilon, initial_count=iterations + 1)`` with
``AdamState(count, v=m, h=v)``), the same rule.

The bridges work on every Keras backend: they read and assign Keras
variables through ``keras.ops``. Importing this module does not import Keras;
set ``KERAS_BACKEND`` before anything imports it, as Keras requires.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optax

from onnx_optax import _checks, registry
from onnx_optax.interop import _common
from onnx_optax.rules import onnx_adam
from onnx_optax.rules.keras import KerasAdamState

__all__ = ["from_keras", "to_keras"]

# Base-optimizer options that change the update and that no rule has, with
# the values that leave the update alone and what to do instead. Keras's
# weight_decay=0.0 subtracts x * 0 * lr (x itself for finite x), and its
# loss_scale_factor=1.0 scales the loss by 1 and the gradients by 1 / 1: both
# change nothing, as None does.
_OPTIONS = (
  (
    "amsgrad",
    (False,),
    "AMSGrad keeps the maximum of the second moments; no onnx_optax rule "
    "does (optax.amsgrad is the nearest, with epsilon inside the bias correction)",
  ),
  (
    "weight_decay",
    (None, 0.0),
    "Keras decays the weights before the step (x -= lr * wd * x), "
    "decoupled from the gradient, which no onnx_optax rule does; "
    "optax.chain(onnx_optax.directml_adam(...), optax.add_decayed_weights(-lr * wd)) is the "
    "same update up to rounding",
  ),
  (
    "clipnorm",
    (None,),
    "Keras clips each gradient's norm and the rules do not clip: clip in "
    "JAX before the transform, optax.chain(<per-leaf norm clipping>, tx)",
  ),
  ("clipvalue", (None,), "clip in JAX with optax.chain(optax.clip(value), ...)"),
  ("global_clipnorm", (None,), "clip in JAX with optax.chain(optax.clip_by_global_norm(norm), ...)"),
  ("use_ema", (False,), "keep an average in JAX with optax.ema or a copy of the parameters"),
  ("gradient_accumulation_steps", (None,), "accumulate in JAX with optax.MultiSteps"),
  ("loss_scale_factor", (None, 1.0), "scale the loss and unscale the gradients yourself"),
)


# ONNX Adam with norm_coefficient = norm_coefficient_post = 0 is DirectML's Adam (docs/spec.md), the rule
# the Keras twin is the twin of, from T = 1 on: to_keras loads its state too, its T counted as
# DirectML's. The registry binds ONNX Adam to no Keras optimizer; this bridge reads its state.
_ALSO_LOADED = (onnx_adam.RULE,)


def _keras() -> Any:
  return _common.require("keras", "onnx_optax.interop.keras")


def _twin() -> registry.Rule:
  """The rule the registry binds to ``keras.optimizers.Adam`` (``Binding("keras", "Adam")``)."""
  bound = [rule for rule in registry.rules() if (b := rule.binding("keras")) is not None and b.name == "Adam"]
  if len(bound) != 1:
    raise LookupError(f"the registry binds {len(bound)} rules to keras.optimizers.Adam, not one")
  return bound[0]


def from_keras(
  optimizer: Any,
  params: Any,
  *,
  learning_rate: Any = None,
) -> tuple[optax.GradientTransformationExtraArgs, KerasAdamState]:
  """The transform and state that continue a Keras 3 Adam run in JAX.

  ``optimizer`` may have taken any number of steps, zero included (an
  optimizer that was never built holds no moments: they start at zero).
  With ``tx, state = from_keras(optimizer, params)``, each
  ``updates, state = tx.update(grads, state)`` followed by
  ``optax.apply_updates(params, updates)`` is the ``optimizer.apply(grads,
  variables)`` Keras would have taken (float64: equal to about 1e-15 per step;
  float32: within the rounding of the two implementations, see
  docs/interop.md).

  Args:
    optimizer: a ``keras.optimizers.Adam``.
    params: the JAX parameters, whose ``jax.tree.leaves`` are the variables
      the optimizer was built with, in that order (``model.trainable_variables``),
      with the same shapes and dtypes.
    learning_rate: None to use the optimizer's. Needed when the optimizer has
      a ``LearningRateSchedule`` or a callable: a float, or a schedule
      ``n -> lr`` of the number ``n`` of updates made in JAX, i.e. the Keras
      schedule evaluated at ``n + optimizer.iterations``.

  Returns:
    ``(tx, state)``: ``onnx_optax.keras_adam`` with the optimizer's
    hyperparameters and ``initial_count = iterations``, and its
    ``KerasAdamState`` holding the moments.

  Raises:
    TypeError: another optimizer (Keras ``AdamW``, ``SGD``, ...), or a
      subclass of Adam.
    ValueError: an option the rule lacks (``amsgrad``, ``weight_decay``,
      clipping, EMA, gradient accumulation, loss scaling), a schedule without
      ``learning_rate``, or params that do not match the variables.

  Example:
    >>> import os; os.environ.setdefault("KERAS_BACKEND", "jax")
    'jax'
    >>> import keras, numpy as np, jax.numpy as jnp, optax
    >>> from onnx_optax.interop import from_keras
    >>> w = keras.Variable(np.array([1.0, 2.0], np.float32))
    >>> opt = keras.optimizers.Adam(learning_rate=0.1)
    >>> opt.apply([np.array([1.0, -1.0], np.float32)], [w])
    >>> params = [jnp.asarray(w.numpy())]
    >>> tx, state = from_keras(opt, params)
    >>> int(state.count)  # iterations
    1
    >>> updates, state = tx.update([jnp.array([0.5, 0.5])], state)
    >>> opt.apply([np.array([0.5, 0.5], np.float32)], [w])
    >>> bool(jnp.allclose(optax.apply_updates(params, updates)[0], w.numpy()))
    True
  """
  keras = _keras()
  _check_optimizer(keras, optimizer)
  if learning_rate is None:
    schedule = optimizer._learning_rate
    if not isinstance(schedule, keras.Variable):
      raise ValueError(
        f"the optimizer's learning rate is a {type(schedule).__name__}, which is not part of "
        f"its state: pass learning_rate= a float, or a schedule n -> lr of the number n of "
        f"JAX updates (the Keras schedule evaluated at n + iterations, here "
        f"n + {_iterations(keras, optimizer)})"
      )
    rate = _common.real_number("learning_rate", keras.ops.convert_to_numpy(schedule))
    learning_rate = _checks.learning_rate("the optimizer's learning_rate", rate)
  leaves, treedef, paths = _common.leaf_paths(params)
  variables = _variables(optimizer)
  if variables is not None:
    _common.check_leaves(leaves, paths, _described(variables), "Keras")
  rule = _twin()
  binding = rule.binding("keras")
  names = binding.names if binding is not None else {}

  def name(h: str) -> str:
    return names.get(h, h)

  # Each checked by the rule's declared check, under Keras's name (docs/spec.md, "Hyperparameter ranges").
  options = {h: _common.real_number(name(h), getattr(optimizer, name(h))) for h in rule.hyperparameters}
  tx = rule.transform(
    learning_rate, **rule.checked(options, name=name), initial_count=_iterations(keras, optimizer)
  )
  state = tx.init(params)
  if variables is not None:
    moments = [optimizer._momentums, optimizer._velocities]
    state = _common.fill(
      state,
      treedef,
      [
        [_common.put_like(keras.ops.convert_to_numpy(m), leaf) for m, leaf in zip(field, leaves)]
        for field in moments
      ],
    )
  return tx, _common.counts_placed(state, leaves)


def to_keras(state: Any, optimizer: Any, params: Any = None, *, variables: Any = None) -> None:
  """Loads a transform's state (and optionally the weights) into a Keras 3 Adam.

  ``state`` is a :class:`~onnx_optax.KerasAdamState` (of
  :func:`from_keras`'s transform, after any number of JAX updates), a
  :class:`~onnx_optax.DirectMLAdamState` or an ONNX
  :class:`~onnx_optax.AdamState` with ``count >= 1``, for a transform
  with the optimizer's hyperparameters. Afterwards ``optimizer.apply(grads,
  variables)`` continues the JAX run. Keras keeps one step count for all
  variables, so every leaf must have the same ``count``.

  Args:
    state: the transform's state.
    optimizer: the ``keras.optimizers.Adam`` to load.
    params: optional JAX parameters to assign to the optimizer's variables
      (leaves in the order of those variables).
    variables: the variables to build the optimizer with, when it has not
      been built yet (``model.trainable_variables``); ignored otherwise.

  Everything is checked before a variable is assigned or the optimizer built.

  Example:
    >>> import os; os.environ.setdefault("KERAS_BACKEND", "jax")
    'jax'
    >>> import keras, numpy as np, jax.numpy as jnp, optax, onnx_optax
    >>> from onnx_optax.interop import to_keras
    >>> params = [jnp.array([1.0, 2.0])]
    >>> tx = onnx_optax.directml_adam(0.1, epsilon=0.0)
    >>> state = tx.init(params)
    >>> updates, state = tx.update([jnp.array([1.0, -1.0])], state)
    >>> params = optax.apply_updates(params, updates)
    >>> w = keras.Variable(np.array([1.0, 2.0], np.float32))
    >>> opt = keras.optimizers.Adam(learning_rate=0.1, epsilon=0.0)
    >>> to_keras(state, opt, params, variables=[w])
    >>> int(opt.iterations), w.numpy()
    (1, array([0.9, 2.1], dtype=float32))
  """
  keras = _keras()
  _check_optimizer(keras, optimizer)
  built = _variables(optimizer)
  if built is None:
    if variables is None:
      raise ValueError(
        "the optimizer has not been built, so it has no variables to load the moments into: "
        "pass variables=model.trainable_variables (in the order of params)"
      )
    built = list(variables)
  described = _described(built)
  twin = _twin()
  spec_rules = tuple(rule for rule in (twin.twin_of, *_ALSO_LOADED) if rule is not None)
  owners = _common.positions(state, len(built), tuple(dict.fromkeys(r.state for r in (twin, *spec_rules))))
  # Keras's iterations: the twin's count; the spec rules' T (counted as the rule the twin is the twin of:
  # its first count where the twin's is 0) minus that offset. ``counts`` holds iterations + 1.
  offset = twin.twin_of.first_count() - twin.first_count() if twin.twin_of is not None else 0
  counts = {
    int(owner.rule_state.count) + (1 if isinstance(owner.rule_state, twin.state) else 1 - offset)
    for owner in owners
  }
  if len(counts) != 1:
    raise ValueError(
      f"the leaves of state have the counts {sorted(counts)}; Keras keeps one step count for all variables"
    )
  (count,) = counts
  if count < 1:
    raise ValueError(
      "state has count 0: ONNX Adam's T = 0 update has no bias correction, which Keras's "
      "Adam never takes; only a state with count >= 1 continues in Keras"
    )
  moments: list[list[np.ndarray]] = [[], []]
  for owner, (shape, dtype, where) in zip(owners, described):
    for field, value in zip(moments, owner.values):
      if tuple(value.shape) != shape or _common.dtype_name(value.dtype) != dtype:
        raise ValueError(
          f"the state of {where} has shape {tuple(value.shape)} and dtype "
          f"{_common.dtype_name(value.dtype)}; Keras keeps it with the variable's shape "
          f"{shape} and dtype {dtype}"
        )
      field.append(np.asarray(value))
  new_params = None
  if params is not None:
    leaves, _, paths = _common.leaf_paths(params)
    _common.check_leaves(leaves, paths, described, "Keras")
    new_params = [np.asarray(leaf) for leaf in leaves]

  if not optimizer.built:
    optimizer.build(built)
  optimizer.iterations.assign(count - 1)
  for field, values in zip((optimizer._momentums, optimizer._velocities), moments):
    for variable, value in zip(field, values):
      variable.assign(value)
  if new_params is not None:
    for variable, value in zip(built, new_params):
      variable.assign(value)


def _check_optimizer(keras: Any, optimizer: Any) -> None:
  cls = type(optimizer)
  if isinstance(optimizer, keras.optimizers.AdamW):
    raise TypeError(
      "keras.optimizers.AdamW decays the weights before the step (x -= lr * wd * x), "
      "decoupled from the gradient, which no onnx_optax rule does; "
      "optax.chain(onnx_optax.directml_adam(...), optax.add_decayed_weights(-lr * wd)) is "
      "the same update up to rounding"
    )
  # On some backends keras.optimizers.Adam(...) builds the backend's own class
  # (torch: keras.src.backend.torch.optimizers.torch_adam.Adam, the same
  # update with foreach kernels); those are Keras's Adam too.
  backend_adam = cls.__name__ == "Adam" and cls.__module__.startswith("keras.src.backend.")
  if not (cls is keras.optimizers.Adam or backend_adam):
    if isinstance(optimizer, keras.optimizers.Adam):
      raise TypeError(
        f"{cls.__module__}.{cls.__qualname__} subclasses keras.optimizers.Adam and may change "
        f"its step; the bridge maps keras.optimizers.Adam itself"
      )
    raise TypeError(
      f"no onnx_optax rule is {cls.__module__}.{cls.__qualname__}: the Keras bridge maps "
      f"keras.optimizers.Adam (DirectML Adam)"
    )
  for name, neutral, instead in _OPTIONS:
    value = getattr(optimizer, name, neutral[0])
    if not any(_is_neutral(value, n) for n in neutral):
      raise ValueError(f"the optimizer has {name}={value!r}: {instead}")


def _is_neutral(value: Any, neutral: Any) -> bool:
  """``value`` is ``neutral`` or equal to it (options are compared by value: ``use_ema=0`` is ``False``)."""
  return value is neutral or (value is not None and neutral is not None and bool(value == neutral))


def _iterations(keras: Any, optimizer: Any) -> int:
  return int(keras.ops.convert_to_numpy(optimizer.iterations))


def _variables(optimizer: Any) -> list[Any] | None:
  return list(optimizer._trainable_variables) if optimizer.built else None


def _described(variables: list[Any]) -> list[tuple[tuple[int, ...], str, str]]:
  return [
    (tuple(v.shape), _common.dtype_name(v.dtype), f"variable {i} ({v.path!r})")
    for i, v in enumerate(variables)
  ]
