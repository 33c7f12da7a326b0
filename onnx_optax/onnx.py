"""The ONNX training operators on JAX: their own calls, ``run_node``, ``from_node``.

ONNX's ``Momentum``, ``Adagrad`` and ``Adam`` (domain
``ai.onnx.preview.training``, version 1) have no runtime on an accelerator:
``onnxruntime`` cannot load them and ``onnx.reference`` is a NumPy loop. This
module executes them with JAX, jittable, on any backend, and turns a node into
the equivalent Optax transform.

* :func:`momentum`, :func:`adagrad`, :func:`adam`: the operators' own
  signatures. Inputs ``R, T`` then the variadic blocks in ONNX's order
  (``X_1..X_n, G_1..G_n`` then one block per state tensor); outputs a tuple
  in ONNX's order (``X_1_new..X_n_new`` then one block per new state).
  Attributes are keyword arguments, static under :func:`jax.jit`.
* :func:`run_node`: executes an ``onnx.NodeProto`` of one of the three
  operators; omitted attributes take the schema's defaults.
* :func:`from_node`: the equivalent Optax transform
  (:func:`onnx_optax.momentum`, :func:`onnx_optax.adagrad`,
  :func:`onnx_optax.adam` with the node's attributes).
* :func:`adam_optimizer`: DirectML's ``DML_ADAM_OPTIMIZER_OPERATOR_DESC``,
  re-exported from :mod:`onnx_optax.directml`.

ONNX Runtime trains with its own operators, in the ``com.microsoft`` domain:

* :func:`adamw_optimizer` (``AdamWOptimizer``) and :func:`sgd_optimizer_v2`
  (``SGDOptimizerV2``): the operators' own calls, sequence inputs as Python
  lists of arrays, outputs ``(updated_flag, updated sequences...)``;
* :func:`run_node` and :func:`from_node` take their nodes too
  (:func:`onnx_optax.ort_adamw`, :func:`onnx_optax.ort_sgd`);
* :func:`from_model`: the Optax transform of a model file holding one
  optimizer node, such as the ``optimizer_model.onnx`` that
  ``onnxruntime.training.artifacts.generate_artifacts`` writes.

None of these restates a formula: each tensor goes through the single-tensor
rule of :mod:`onnx_optax.rules` and ``X_new = X + U``.

Only :func:`run_node`, :func:`from_node` and :func:`from_model` need the
``onnx`` package (the ``onnx`` extra), imported when they are called; the
operator calls need JAX alone.

Types. ONNX allows ``R`` float or double, ``T`` int64 and float or double
tensors. ``R`` must be a float scalar; ``T`` an integer scalar; the tensors
may be any real floating dtype (float16 and bfloat16 too, which ONNX does not
list; see :mod:`onnx_optax.rules` for how they are computed). Each output
keeps its tensor's dtype. Under JAX's default 32-bit mode a float64 tensor or
an int64 ``T`` beyond the int32 range cannot be represented: those raise
(they would be silently truncated) and need ``jax.enable_x64``. Under x64,
``T`` stays int64.

Checks, all before any computation (each error names the argument): the
input count is ``2 + k*n`` (``k`` = 3 for Momentum and Adagrad, 4 for Adam,
``n >= 1``); ``X_i``, ``G_i`` and the state tensors of index ``i`` share one
shape and one dtype (nothing is broadcast); ``R`` is a float scalar; ``T`` is
an integer scalar, ``>= 0`` when concrete; attributes are finite real
numbers, ``mode`` is ``"standard"`` or ``"nesterov"``. Values of traced
arguments (under :func:`jax.jit`) cannot be read, so only their shape and
dtype are checked. The attributes' ranges are ONNX's (none): a value that the
Optax transform rejects (Adam's ``alpha = 1``) runs here as in ONNX.

ONNX Runtime's operators, checked likewise before any computation: the
sequences are lists or tuples (an array is not split into rows), non-empty,
of one length, their tensors of index ``i`` of one shape and dtype; ``lr``
a float scalar, ``step`` an int64 scalar (JAX's int32 in 32-bit mode; shape
``()`` or ``(1,)`` for both, as ``generate_artifacts`` declares them),
``>= 1`` when concrete with ``correct_bias = 1``; ``update_signal`` a bool
scalar; ``adam_mode`` and ``correct_bias`` 0 or 1, not mode 0 without bias
correction (ONNX Runtime refuses that pair). ONNX Runtime's CPU kernels are
float32; these calls keep each tensor's dtype, as the other operators.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from onnx_optax import onnx as ox
  >>> step = jax.jit(ox.momentum, static_argnames=("alpha", "beta", "mode", "norm_coefficient"))
  >>> X_new, V_new = step(jnp.float32(0.1), jnp.array(0), jnp.array([1.0, 2.0]),
  ...                     jnp.array([1.0, -1.0]), jnp.zeros(2), alpha=0.9, beta=0.5,
  ...                     mode="standard", norm_coefficient=0.0)
  >>> X_new
  Array([0.9, 2.1], dtype=float32)
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Sequence
from typing import Any

import optax
from jax import Array

from onnx_optax import _checks, _engine, registry
from onnx_optax._onnx_runtime import (
  MS_DOMAIN,
  MS_VERSION,
  ORT_OPERATORS,
  OrtOperator,
  adamw_optimizer,
  choice,
  sgd_optimizer_v2,
)
from onnx_optax.directml import adam_optimizer
from onnx_optax.rules import onnx_adagrad, onnx_adam, onnx_momentum

__all__ = [
  "DOMAIN",
  "MS_DOMAIN",
  "OPERATORS",
  "ORT_OPERATORS",
  "OrtOperator",
  "adagrad",
  "adam",
  "adam_optimizer",
  "adamw_optimizer",
  "from_model",
  "from_node",
  "momentum",
  "run_node",
  "sgd_optimizer_v2",
]

#: The ONNX domain of the three operators.
DOMAIN = "ai.onnx.preview.training"
#: The domain's only version, the one implemented here.
VERSION = 1


def _rules_of(domain: str) -> dict[str, registry.Rule]:
  """op_type -> the registered rule bound to that operator of ``domain``."""
  found = {}
  for rule in registry.rules():
    binding = rule.binding("onnx")
    if binding is not None and binding.domain == domain:
      found[binding.name] = rule
  return found


#: op_type -> the rule each operator of the domain runs (the registry's ONNX bindings).
_RULES = _rules_of(DOMAIN)
#: op_type -> the names of the state tensors, in ONNX's block order.
OPERATORS: dict[str, tuple[str, ...]] = {
  op: tuple(f.spec for f in rule.fields) for op, rule in _RULES.items()
}


def _tensor_count(op_type: str, n_inputs: int, what: str = "inputs") -> int:
  """``n`` for ``n_inputs = 2 + k*n``, or a ValueError naming the layout."""
  blocks = ("X", "G", *OPERATORS[op_type])
  k = len(blocks)
  n, rest = divmod(n_inputs - 2, k)
  if n_inputs < 2 + k or rest:
    layout = ", ".join(f"{b}_1..{b}_n" for b in blocks)
    raise ValueError(f"{op_type} takes 2 + {k}*n {what} (R, T, {layout}) with n >= 1; got {n_inputs}")
  return n


# -- the operators ------------------------------------------------------------------


def _run(
  rule: registry.Rule, R: Any, T: Any, inputs: Sequence[Any], hyper: dict[str, Any]
) -> tuple[Array, ...]:
  """Checks everything, then ``rule`` per tensor; outputs in ONNX's block order."""
  op_type = rule.binding("onnx").name  # type: ignore[union-attr]
  n = _tensor_count(op_type, 2 + len(inputs))
  blocks = ("X", "G", *OPERATORS[op_type])
  hyper = rule.checked(hyper)
  R = _checks.float_scalar("R", R)
  T = _checks.integer_scalar("T", T, minimum=0, why=" (T counts the updates already conducted)")
  per_tensor = [
    _checks.block([f"{b}_{i + 1}" for b in blocks], [inputs[j * n + i] for j in range(len(blocks))])
    for i in range(n)
  ]
  xs: list[Any] = []
  states: list[list[Any]] = [[] for _ in OPERATORS[op_type]]
  for X, G, *S in map(_checks.as_arrays, per_tensor):
    U, *S_new = _engine.tensor(rule, R, T, X, G, *S, **hyper)
    xs.append(X + U)
    for block, s_new in zip(states, S_new):
      block.append(s_new)
  return (*xs, *(s for block in states for s in block))


def momentum(
  R: Any, T: Any, *inputs: Any, alpha: float, beta: float, mode: str, norm_coefficient: float
) -> tuple[Array, ...]:
  """ONNX ``Momentum`` (ai.onnx.preview.training, v1), the operator's call.

  ``momentum(R, T, X_1..X_n, G_1..G_n, V_1..V_n, ...)`` returns
  ``(X_1_new..X_n_new, V_1_new..V_n_new)``; the formula is
  :func:`onnx_optax.rules.momentum`'s, applied to each tensor. ``T`` is the
  number of updates already conducted (0 at the first). All four attributes
  are required, as in the schema.

  Args:
    R: learning rate, a float scalar.
    T: update count, an integer scalar ``>= 0``.
    *inputs: ``X_1..X_n, G_1..G_n, V_1..V_n``.
    alpha: decay of the momentum ``V``.
    beta: scale of the gradient from the second update on (``T > 0``).
    mode: ``"standard"`` or ``"nesterov"``.
    norm_coefficient: L2 coefficient, ``norm_coefficient * X`` is added to ``G``.
  """
  hyper = dict(alpha=alpha, beta=beta, mode=mode, norm_coefficient=norm_coefficient)
  return _run(onnx_momentum.RULE, R, T, inputs, hyper)


def adagrad(
  R: Any,
  T: Any,
  *inputs: Any,
  decay_factor: float = 0.0,
  epsilon: float = 1e-6,
  norm_coefficient: float = 0.0,
) -> tuple[Array, ...]:
  """ONNX ``Adagrad`` (ai.onnx.preview.training, v1), the operator's call.

  ``adagrad(R, T, X_1..X_n, G_1..G_n, H_1..H_n, ...)`` returns
  ``(X_1_new..X_n_new, H_1_new..H_n_new)``; the formula is
  :func:`onnx_optax.rules.adagrad`'s. Defaults are the schema's values (the
  schema stores ``epsilon`` as the float32 nearest 1e-6; :func:`run_node`
  passes exactly what the schema stores).
  """
  hyper = dict(decay_factor=decay_factor, epsilon=epsilon, norm_coefficient=norm_coefficient)
  return _run(onnx_adagrad.RULE, R, T, inputs, hyper)


def adam(
  R: Any,
  T: Any,
  *inputs: Any,
  alpha: float = 0.9,
  beta: float = 0.999,
  epsilon: float = 1e-6,
  norm_coefficient: float = 0.0,
  norm_coefficient_post: float = 0.0,
) -> tuple[Array, ...]:
  """ONNX ``Adam`` (ai.onnx.preview.training, v1), the operator's call.

  ``adam(R, T, X_1..X_n, G_1..G_n, V_1..V_n, H_1..H_n, ...)`` returns
  ``(X_1_final.., V_1_new.., H_1_new..)``; the formula is
  :func:`onnx_optax.rules.adam`'s (``R_adjusted * V_new / H_sqrt`` in the
  schema text's order). With a non-zero ``norm_coefficient_post`` the output
  is ``X + (X_final - X)``: ``X_final`` to the bit where the two are within a
  factor of two of each other, and within one ulp of ``max(|X|, |X_final|)``
  in general.
  """
  hyper = dict(
    alpha=alpha,
    beta=beta,
    epsilon=epsilon,
    norm_coefficient=norm_coefficient,
    norm_coefficient_post=norm_coefficient_post,
  )
  return _run(onnx_adam.RULE, R, T, inputs, hyper)


#: ONNX Runtime's optimizers (com.microsoft), their rules (the registry's bindings).
_ORT_RULES = _rules_of(MS_DOMAIN)
_ORT_CALLS: dict[str, Callable[..., tuple[Any, ...]]] = {
  "AdamWOptimizer": adamw_optimizer,
  "SGDOptimizerV2": sgd_optimizer_v2,
}


# -- ONNX nodes -----------------------------------------------------------------------


def _node_domain(node: Any) -> str:
  """The domain of an ``onnx.NodeProto`` that runs here: ONNX's training domain or ONNX Runtime's."""
  import onnx  # The optional extra; the operator calls do not need it.

  if not isinstance(node, onnx.NodeProto):
    raise TypeError(f"node must be an onnx.NodeProto, got {type(node).__name__}")
  if node.domain not in (DOMAIN, MS_DOMAIN):
    raise ValueError(
      f"node.domain must be {DOMAIN!r} (ONNX's training operators) or {MS_DOMAIN!r} (ONNX Runtime's "
      f"optimizers), got {node.domain!r} (op_type {node.op_type!r})"
    )
  return node.domain


def _ort_node_attributes(node: Any, opset: int | None) -> tuple[str, dict[str, Any]]:
  """As :func:`_node_attributes` for ONNX Runtime's optimizers (schema: :data:`ORT_OPERATORS`).

  ``correct_bias`` and ``adam_mode`` must be 0 or 1: ONNX Runtime's kernel
  treats any ``correct_bias`` other than 1 as 0 and throws at run time on
  another ``adam_mode``; both are refused here, before anything runs.
  """
  if _node_domain(node) != MS_DOMAIN:
    raise ValueError(f"node.domain must be {MS_DOMAIN!r}, got {node.domain!r} (op_type {node.op_type!r})")
  if node.op_type not in ORT_OPERATORS:
    raise ValueError(
      f"node.op_type must be one of {tuple(ORT_OPERATORS)} in {MS_DOMAIN}, got {node.op_type!r}"
    )
  if opset is not None and (isinstance(opset, bool) or opset != MS_VERSION):
    raise ValueError(f"opset {opset!r}: {node.op_type} of {MS_DOMAIN} exists in version {MS_VERSION} only")
  attributes = _read_attributes(node, ORT_OPERATORS[node.op_type].attributes)
  for name in ("correct_bias", "adam_mode"):
    if name in attributes:
      attributes[name] = choice(f"node.attribute {name!r}", attributes[name], (0, 1))
  return node.op_type, attributes


def _ort_node_io(
  op_type: str, names: Sequence[str], what: str, schema: tuple[str, ...], required: int
) -> None:
  """``names`` (the node's inputs or outputs) against the schema: count, and no required one omitted."""
  if not required <= len(names) <= len(schema):
    raise ValueError(
      f"{what}: {op_type} has {required} to {len(schema)} {what.split('.')[1]}s ({', '.join(schema)}), "
      f"the node lists {len(names)}"
    )
  for i, name in enumerate(names[:required]):
    if not name:
      raise ValueError(f"{what}[{i}] ({schema[i]}) is empty, but {op_type} requires it")


def _node_attributes(node: Any, opset: int | None) -> tuple[str, dict[str, Any]]:
  """Checks ``node`` and returns its op_type and attributes, schema defaults filled in.

  What a bare ``NodeProto`` lets us check: its type, its domain (must be
  ``ai.onnx.preview.training``; the default domain ``""`` is rejected) and its
  op_type. Its version lives in the model's ``opset_import``, which a node
  does not carry: pass ``opset`` to have it checked (the domain has only
  version 1).
  """
  import onnx  # The optional extra; the operator calls do not need it.

  if _node_domain(node) != DOMAIN:
    raise ValueError(f"node.domain must be {DOMAIN!r}, got {node.domain!r} (op_type {node.op_type!r})")
  if node.op_type not in OPERATORS:
    raise ValueError(f"node.op_type must be one of {tuple(OPERATORS)}, got {node.op_type!r}")
  if opset is not None:
    if isinstance(opset, bool) or not isinstance(opset, numbers.Integral) or opset < 1:
      raise ValueError(f"opset must be a positive int (the model's opset_import for {DOMAIN}), got {opset!r}")
    # get_schema(op, 2, ...) would answer with version 1 even though the
    # domain has no version 2: check the domain's registered range first.
    low, high = onnx.defs.C.schema_version_map().get(DOMAIN, (VERSION, VERSION))
    if not low <= opset <= high:
      raise ValueError(f"opset {opset}: {DOMAIN} has versions {low} to {high} in this onnx package")
    try:
      since = onnx.defs.get_schema(node.op_type, int(opset), DOMAIN).since_version
    except onnx.defs.SchemaError as e:
      raise ValueError(f"opset {opset}: no {node.op_type} schema in {DOMAIN}") from e
    if since != VERSION:
      raise ValueError(
        f"opset {opset} selects {node.op_type} version {since}; only version {VERSION} is implemented"
      )
  schema = onnx.defs.get_schema(node.op_type, VERSION, DOMAIN)
  get_value = onnx.helper.get_attribute_value
  formals = {
    name: (formal.type, _REQUIRED if formal.required else get_value(formal.default_value))
    for name, formal in schema.attributes.items()
  }
  return node.op_type, _read_attributes(node, formals)


_REQUIRED = object()


def _read_attributes(node: Any, formals: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
  """The node's attributes checked against ``formals``, defaults filled in.

  ``formals``: name -> (type, default or ``_REQUIRED``), the type an
  ``onnx.AttributeProto.AttributeType`` value or its name.
  """
  import onnx

  names = onnx.AttributeProto.AttributeType
  attributes: dict[str, Any] = {}
  for attribute in node.attribute:
    name = attribute.name
    if name not in formals:
      raise ValueError(f"node.attribute: {node.op_type} has no attribute {name!r} (it has {sorted(formals)})")
    if name in attributes:
      raise ValueError(f"node.attribute: {name!r} is given twice")
    if attribute.ref_attr_name:
      raise ValueError(
        f"node.attribute {name!r} refers to a function attribute ({attribute.ref_attr_name!r}); "
        "run the node after the function is inlined"
      )
    expected = formals[name][0]
    expected = names.Value(expected) if isinstance(expected, str) else expected
    if attribute.type != expected:
      raise TypeError(
        f"node.attribute {name!r} must be of type {names.Name(expected)}, got {names.Name(attribute.type)}"
      )
    attributes[name] = onnx.helper.get_attribute_value(attribute)
  for name, (_, default) in formals.items():
    if name in attributes:
      continue
    if default is _REQUIRED:
      raise ValueError(f"node.attribute: {node.op_type} requires {name!r} (the schema has no default)")
    attributes[name] = default
  # STRING attributes (Momentum's mode) come back as bytes.
  return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attributes.items()}


def run_node(node: Any, *inputs: Any, opset: int | None = None) -> tuple[Any, ...]:
  """Executes an ONNX training node, or an ONNX Runtime optimizer node, with JAX.

  Nodes of ``ai.onnx.preview.training`` (``Momentum``, ``Adagrad``,
  ``Adam``): attributes that the node omits take the defaults of the schema
  that the ``onnx`` package ships (``onnx.defs.get_schema(op, 1, DOMAIN)``);
  Momentum's are all required, and a node missing one is an error. The
  outputs are a tuple in ONNX's order.

  Nodes of ``com.microsoft`` (ONNX Runtime's ``AdamWOptimizer`` and
  ``SGDOptimizerV2``, see :func:`adamw_optimizer`, :func:`sgd_optimizer_v2`):
  omitted attributes take ONNX Runtime's schema defaults
  (:data:`ORT_OPERATORS`); the sequence inputs are lists of arrays; an input
  the node leaves empty (``""``, the optional ``update_signal``) is passed
  as ``None``. The outputs are those the node declares, in the schema's
  order: ``updated_flag`` (``update_completed``) and each optional updated
  sequence the node names, ``None`` where its name is ``""``. (ONNX
  Runtime updates the input sequences in place, so the models of
  ``generate_artifacts`` declare the flag alone; JAX cannot: declare the
  outputs, or call the operator, which returns them all.)

  The node itself is checked in Python, once per trace; under
  :func:`jax.jit` close over it (a ``NodeProto`` is not hashable, so it
  cannot be a static argument).

  Args:
    node: an ``onnx.NodeProto`` of domain ``ai.onnx.preview.training`` or
      ``com.microsoft``.
    *inputs: the node's inputs in its order: ``R, T`` and the variadic
      tensors; or ``lr, step, weights, ...``.
    opset: the model's ``opset_import`` version for the node's domain, if
      known (a bare node does not carry it); checked to select version 1.

  Returns:
    The node's outputs, a tuple.

  Raises:
    TypeError, ValueError: the node is not one of the five operators, an
      attribute is unknown, mistyped, missing or out of its set, the inputs
      do not match the node (count, sequence lengths, shapes, dtypes), see
      the module docstring.

  Example:
    >>> import functools, jax, jax.numpy as jnp
    >>> from onnx import helper
    >>> from onnx_optax.onnx import run_node
    >>> node = helper.make_node(
    ...     "Adagrad", ["R", "T", "X", "G", "H"], ["X_new", "H_new"],
    ...     domain="ai.onnx.preview.training", epsilon=0.0)
    >>> step = jax.jit(functools.partial(run_node, node))
    >>> X_new, H_new = step(jnp.float32(0.1), jnp.array(0), jnp.array([1.0, 2.0]),
    ...                     jnp.array([2.0, -4.0]), jnp.zeros(2))
    >>> X_new, H_new
    (Array([0.9, 2.1], dtype=float32), Array([ 4., 16.], dtype=float32))
  """
  if _node_domain(node) == MS_DOMAIN:
    return _run_ort_node(node, inputs, opset)
  op_type, attributes = _node_attributes(node, opset)
  if len(node.input) != len(inputs):
    raise ValueError(f"node.input lists {len(node.input)} inputs but {len(inputs)} were given")
  n = _tensor_count(op_type, len(inputs))
  n_outputs = n * (1 + len(OPERATORS[op_type]))
  if len(node.output) != n_outputs:
    raise ValueError(
      f"node.output lists {len(node.output)} outputs; {op_type} with {n} tensors has {n_outputs}"
    )
  return _run(_RULES[op_type], inputs[0], inputs[1], inputs[2:], attributes)


def _run_ort_node(node: Any, inputs: Sequence[Any], opset: int | None) -> tuple[Any, ...]:
  op_type, attributes = _ort_node_attributes(node, opset)
  schema = ORT_OPERATORS[op_type]
  _ort_node_io(op_type, node.input, "node.input", schema.inputs, len(schema.inputs) - 1)
  _ort_node_io(op_type, node.output, "node.output", schema.outputs, 1)
  if len(node.input) != len(inputs):
    raise ValueError(f"node.input lists {len(node.input)} inputs but {len(inputs)} were given")
  for i, (name, value) in enumerate(zip(node.input, inputs)):
    if not name and value is not None:
      raise ValueError(
        f"node.input[{i}] ({schema.inputs[i]}) is empty: pass None for it, got {_checks.describe(value)}"
      )
    if name and value is None:
      raise ValueError(f"node.input[{i}] ({schema.inputs[i]}) is named {name!r} but None was given")
  outputs = _ORT_CALLS[op_type](*inputs, **attributes)
  return tuple(output if name else None for output, name in zip(outputs, node.output))


def from_node(
  node: Any,
  learning_rate: _engine.ScalarOrSchedule,
  *,
  initial_count: int | None = None,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """The Optax transform equivalent to an ONNX training node or an ONNX Runtime optimizer node.

  ``Momentum`` gives :func:`onnx_optax.momentum`, ``Adagrad``
  :func:`onnx_optax.adagrad`, ``Adam`` :func:`onnx_optax.adam`;
  ``AdamWOptimizer`` (com.microsoft) gives :func:`onnx_optax.ort_adamw` and
  ``SGDOptimizerV2`` :func:`onnx_optax.ort_sgd`; each with the node's
  attributes (the schema's defaults for omitted ones). The learning rate is
  an input of the node, not an attribute: pass it as ``learning_rate`` (a
  float or an Optax schedule). The transform's state holds the update count
  (ONNX's ``T``, ONNX Runtime's ``step``) as ``count``, starting at
  ``initial_count``; ``None`` keeps the transform's default, which is the
  count of a first update: ``T = 0`` for ONNX's operators, ``step = 1`` for
  ``AdamWOptimizer`` (ONNX Runtime's training loop feeds its step count
  + 1). One update from ``init`` equals one execution of the node on zero
  state tensors with that count. The hyperparameters' ranges (for example
  Adam's ``alpha < 1``) are checked as in the operators' calls. An
  ``update_signal`` input has no counterpart in a transform, which always
  updates (skipping a step is the caller's choice, as in
  ``optax.apply_if_finite``).

  Args:
    node: an ``onnx.NodeProto`` of domain ``ai.onnx.preview.training`` or
      ``com.microsoft``.
    learning_rate: ``R`` (ONNX Runtime: ``lr``).
    initial_count: the count of the first update; None: the transform's
      default.
    state_dtype: see :func:`onnx_optax.momentum`.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from onnx import helper
    >>> from onnx_optax.onnx import from_node
    >>> node = helper.make_node(
    ...     "Adagrad", ["R", "T", "X", "G", "H"], ["X_new", "H_new"],
    ...     domain="ai.onnx.preview.training", epsilon=0.0)
    >>> opt = from_node(node, 0.1)
    >>> params = jnp.array([1.0, 2.0])
    >>> updates, state = opt.update(jnp.array([2.0, -4.0]), opt.init(params))
    >>> optax.apply_updates(params, updates)
    Array([0.9, 2.1], dtype=float32)
  """
  count: dict[str, Any] = {} if initial_count is None else {"initial_count": initial_count}
  if _node_domain(node) == MS_DOMAIN:
    op_type, attributes = _ort_node_attributes(node, None)
    schema = ORT_OPERATORS[op_type]
    if len(node.input):
      _ort_node_io(op_type, node.input, "node.input", schema.inputs, len(schema.inputs) - 1)
    return _ORT_RULES[op_type].transform(learning_rate, state_dtype=state_dtype, **count, **attributes)
  op_type, attributes = _node_attributes(node, None)
  if len(node.input):
    _tensor_count(op_type, len(node.input), "node inputs")
  return _RULES[op_type].transform(learning_rate, state_dtype=state_dtype, **count, **attributes)


def _describe_node(node: Any) -> str:
  return f"{node.domain or 'ai.onnx'}.{node.op_type}" + (f" {node.name!r}" if node.name else "")


def from_model(
  model: Any,
  learning_rate: _engine.ScalarOrSchedule,
  *,
  initial_count: int | None = None,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """The Optax transform of an optimizer model, such as ONNX Runtime's ``optimizer_model.onnx``.

  ``onnxruntime.training.artifacts.generate_artifacts`` writes an
  ``optimizer_model.onnx`` whose graph is one ``AdamWOptimizer`` node
  (``OptimType.AdamW``: ``adam_mode=1``, Hugging Face's AdamW, with
  ``epsilon=1e-6``, ``weight_decay=0``, ``correct_bias=1``) or one
  ``SGDOptimizerV2`` node (``OptimType.SGD``). This finds the model's single
  optimizer node and returns :func:`from_node` of it; any optimizer node of
  :func:`from_node` is accepted (ONNX's ``Momentum``, ``Adagrad``,
  ``Adam`` too).

  Refused, before anything else: a model with no optimizer node, with
  several (one transform cannot stand for them: call :func:`from_node` on
  each and combine them, for example with ``optax.multi_transform``), or
  with any other node (``generate_artifacts``' ``clip_grad`` adds
  ``InplaceClipGradNorm``, whose clipping the transform would leave out:
  chain the clipping yourself and call :func:`from_node`). The model's
  ``opset_import`` for the node's domain, when present, must select version
  1.

  The learning rate is a graph input (``learning_rate``) fed at each step:
  pass it as ``learning_rate``. The count, as in :func:`from_node`, starts
  at the count of a first update (``step = 1`` for ``AdamWOptimizer``, as
  ONNX Runtime's training loop feeds it); to continue a run, pass
  ``initial_count``.

  Args:
    model: a path to an ONNX model (``str`` or ``os.PathLike``) or an
      ``onnx.ModelProto``.
    learning_rate: the learning rate, a float or an Optax schedule.
    initial_count: see :func:`from_node`.
    state_dtype: see :func:`onnx_optax.momentum`.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from onnx import TensorProto, helper
    >>> from onnx_optax.onnx import from_model
    >>> seq = lambda name: helper.make_tensor_sequence_value_info(name, TensorProto.FLOAT, None)
    >>> node = helper.make_node(
    ...     "AdamWOptimizer",
    ...     ["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"],
    ...     ["updated_flag"], domain="com.microsoft", adam_mode=1, epsilon=1e-6, weight_decay=0.0)
    >>> graph = helper.make_graph(
    ...     [node], "optimizer",
    ...     [helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
    ...      helper.make_tensor_value_info("step", TensorProto.INT64, [1])]
    ...     + [seq(n) for n in node.input[2:]],
    ...     [helper.make_tensor_value_info("updated_flag", TensorProto.BOOL, [1])])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1)])
    >>> opt = from_model(model, learning_rate=0.1)
    >>> params = {"w": jnp.array([1.0, 2.0])}
    >>> updates, state = opt.update({"w": jnp.array([0.5, -0.5])}, opt.init(params), params)
    >>> optax.apply_updates(params, updates)["w"]  # 0.1 per element at the first step, less epsilon's share
    Array([0.9000063, 2.0999937], dtype=float32)
  """
  import onnx  # The optional extra.

  if isinstance(model, (str, os.PathLike)):
    model = onnx.load(os.fspath(model))
  elif not isinstance(model, onnx.ModelProto):
    raise TypeError(f"model must be a path or an onnx.ModelProto, got {type(model).__name__}")
  nodes = list(model.graph.node)
  kinds = {(DOMAIN, op) for op in OPERATORS} | {(MS_DOMAIN, op) for op in ORT_OPERATORS}
  found = [i for i, node in enumerate(nodes) if (node.domain, node.op_type) in kinds]
  listed = ", ".join(_describe_node(node) for node in nodes) or "none"
  if not found:
    raise ValueError(
      f"model.graph holds no optimizer node ({', '.join(f'{d}.{op}' for d, op in sorted(kinds))}); "
      f"its nodes: {listed}"
    )
  if len(found) > 1:
    raise ValueError(
      f"model.graph holds {len(found)} optimizer nodes "
      f"({', '.join(_describe_node(nodes[i]) for i in found)}); "
      "from_model returns one transform: call from_node on each node (optax.multi_transform combines them)"
    )
  node = nodes[found[0]]
  others = [_describe_node(other) for i, other in enumerate(nodes) if i != found[0]]
  if others:
    raise ValueError(
      f"model.graph holds nodes besides the optimizer {_describe_node(node)}: {', '.join(others)}; the "
      "transform would leave their work out (chain its Optax equivalent yourself and call from_node on "
      "the optimizer node)"
    )
  versions = {opset.domain: opset.version for opset in model.opset_import}
  if node.domain in versions:
    opset = int(versions[node.domain])
    if node.domain == MS_DOMAIN:
      _ort_node_attributes(node, opset)
    else:
      _node_attributes(node, opset)
  return from_node(node, learning_rate, initial_count=initial_count, state_dtype=state_dtype)
