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

None of these restates a formula: each tensor goes through the single-tensor
rule of :mod:`onnx_optax.rules` and ``X_new = X + U``.

Only :func:`run_node` and :func:`from_node` need the ``onnx`` package (the
``onnx`` extra), imported when they are called; the operator calls need JAX
alone.

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
from collections.abc import Callable, Sequence
from typing import Any

import optax
from jax import Array

from onnx_optax import _checks, rules, transforms
from onnx_optax.directml import adam_optimizer

__all__ = [
  "DOMAIN",
  "OPERATORS",
  "adagrad",
  "adam",
  "adam_optimizer",
  "from_node",
  "momentum",
  "run_node",
]

#: The ONNX domain of the three operators.
DOMAIN = "ai.onnx.preview.training"
#: The domain's only version, the one implemented here.
VERSION = 1
#: op_type -> the names of the state tensors, in ONNX's block order.
OPERATORS: dict[str, tuple[str, ...]] = {
  "Momentum": ("V",),
  "Adagrad": ("H",),
  "Adam": ("V", "H"),
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
  op_type: str, rule: Callable[..., tuple[Array, ...]], R: Any, T: Any, inputs: Sequence[Any]
) -> tuple[Array, ...]:
  """Checks everything, then ``rule`` per tensor; outputs in ONNX's block order."""
  n = _tensor_count(op_type, 2 + len(inputs))
  blocks = ("X", "G", *OPERATORS[op_type])
  R = _checks.float_scalar("R", R)
  T = _checks.integer_scalar("T", T, minimum=0, why=" (T counts the updates already conducted)")
  per_tensor = [
    _checks.block([f"{b}_{i + 1}" for b in blocks], [inputs[j * n + i] for j in range(len(blocks))])
    for i in range(n)
  ]
  xs: list[Any] = []
  states: list[list[Any]] = [[] for _ in OPERATORS[op_type]]
  for X, G, *S in map(_checks.as_arrays, per_tensor):
    U, *S_new = rule(R, T, X, G, *S)
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
  if not isinstance(mode, str) or mode not in rules.MODES:
    raise ValueError(f"mode must be one of {rules.MODES}, got {mode!r}")
  hyper = dict(
    alpha=_checks.decay("alpha", alpha),
    beta=_checks.gradient_weight("beta", beta),
    norm_coefficient=_checks.coefficient("norm_coefficient", norm_coefficient),
  )

  def rule(R, T, X, G, V):
    return rules.momentum(R, T, X, G, V, mode=mode, **hyper)

  return _run("Momentum", rule, R, T, inputs)


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
  hyper = dict(
    decay_factor=_checks.learning_rate_decay("decay_factor", decay_factor),
    epsilon=_checks.epsilon("epsilon", epsilon),
    norm_coefficient=_checks.coefficient("norm_coefficient", norm_coefficient),
  )

  def rule(R, T, X, G, H):
    return rules.adagrad(R, T, X, G, H, **hyper)

  return _run("Adagrad", rule, R, T, inputs)


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
  is ``X + (X_final - X)``, within one rounding of ``X_final``.
  """
  hyper = dict(
    alpha=_checks.decay("alpha", alpha, below_one=True),
    beta=_checks.decay("beta", beta),
    epsilon=_checks.epsilon("epsilon", epsilon),
    norm_coefficient=_checks.coefficient("norm_coefficient", norm_coefficient),
    norm_coefficient_post=_checks.parameter_decay("norm_coefficient_post", norm_coefficient_post),
  )

  def rule(R, T, X, G, V, H):
    return rules.adam(R, T, X, G, V, H, **hyper)

  return _run("Adam", rule, R, T, inputs)


_CALLS: dict[str, Callable[..., tuple[Array, ...]]] = {"Momentum": momentum, "Adagrad": adagrad, "Adam": adam}


# -- ONNX nodes -----------------------------------------------------------------------


def _node_attributes(node: Any, opset: int | None) -> tuple[str, dict[str, Any]]:
  """Checks ``node`` and returns its op_type and attributes, schema defaults filled in.

  What a bare ``NodeProto`` lets us check: its type, its domain (must be
  ``ai.onnx.preview.training``; the default domain ``""`` is rejected) and its
  op_type. Its version lives in the model's ``opset_import``, which a node
  does not carry: pass ``opset`` to have it checked (the domain has only
  version 1).
  """
  import onnx  # The optional extra; the operator calls do not need it.

  if not isinstance(node, onnx.NodeProto):
    raise TypeError(f"node must be an onnx.NodeProto, got {type(node).__name__}")
  if node.domain != DOMAIN:
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

  attributes: dict[str, Any] = {}
  for attribute in node.attribute:
    name = attribute.name
    if name not in schema.attributes:
      raise ValueError(
        f"node.attribute: {node.op_type} has no attribute {name!r} (it has {sorted(schema.attributes)})"
      )
    if name in attributes:
      raise ValueError(f"node.attribute: {name!r} is given twice")
    if attribute.ref_attr_name:
      raise ValueError(
        f"node.attribute {name!r} refers to a function attribute ({attribute.ref_attr_name!r}); "
        "run the node after the function is inlined"
      )
    expected = schema.attributes[name].type
    if attribute.type != expected:
      raise TypeError(
        f"node.attribute {name!r} must be of type {onnx.AttributeProto.AttributeType.Name(expected)}, "
        f"got {onnx.AttributeProto.AttributeType.Name(attribute.type)}"
      )
    attributes[name] = onnx.helper.get_attribute_value(attribute)
  for name, formal in schema.attributes.items():
    if name in attributes:
      continue
    if formal.required:
      raise ValueError(f"node.attribute: {node.op_type} requires {name!r} (the schema has no default)")
    attributes[name] = onnx.helper.get_attribute_value(formal.default_value)
  # STRING attributes (Momentum's mode) come back as bytes.
  return node.op_type, {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attributes.items()}


def run_node(node: Any, *inputs: Any, opset: int | None = None) -> tuple[Array, ...]:
  """Executes an ONNX ``Momentum``, ``Adagrad`` or ``Adam`` node with JAX.

  Attributes that the node omits take the defaults of the schema that the
  ``onnx`` package ships (``onnx.defs.get_schema(op, 1, DOMAIN)``);
  Momentum's are all required, and a node missing one is an error. The node
  itself is checked in Python, once per trace; under :func:`jax.jit` close
  over it (a ``NodeProto`` is not hashable, so it cannot be a static
  argument).

  Args:
    node: an ``onnx.NodeProto`` of domain ``ai.onnx.preview.training``.
    *inputs: ``R, T`` and the variadic tensors, in the node's input order.
    opset: the model's ``opset_import`` version for the domain, if known
      (a bare node does not carry it); checked to select version 1.

  Returns:
    The node's outputs, a tuple in ONNX's order.

  Raises:
    TypeError, ValueError: the node is not one of the three operators, an
      attribute is unknown, mistyped or missing, the inputs do not match the
      node (count, shapes, dtypes), see the module docstring.

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
  op_type, attributes = _node_attributes(node, opset)
  if len(node.input) != len(inputs):
    raise ValueError(f"node.input lists {len(node.input)} inputs but {len(inputs)} were given")
  n = _tensor_count(op_type, len(inputs))
  n_outputs = n * (1 + len(OPERATORS[op_type]))
  if len(node.output) != n_outputs:
    raise ValueError(
      f"node.output lists {len(node.output)} outputs; {op_type} with {n} tensors has {n_outputs}"
    )
  return _CALLS[op_type](*inputs, **attributes)


def from_node(
  node: Any, learning_rate: transforms.ScalarOrSchedule, *, initial_count: int = 0, state_dtype: Any = None
) -> optax.GradientTransformationExtraArgs:
  """The Optax transform equivalent to an ONNX training node.

  ``Momentum`` gives :func:`onnx_optax.momentum`, ``Adagrad``
  :func:`onnx_optax.adagrad`, ``Adam`` :func:`onnx_optax.adam`, with the
  node's attributes (the schema's defaults for omitted ones). ``R`` is an
  input of the node, not an attribute: pass it as ``learning_rate`` (a float
  or an Optax schedule). The transform's state holds ONNX's ``T`` as
  ``count``, starting at ``initial_count`` (0, as a node run from zero state
  with ``T = 0``): one update from ``init`` equals one execution of the node
  with ``T = 0`` and zero state tensors. The hyperparameters' ranges (for
  example Adam's ``alpha < 1``) are checked as in the operators' calls.

  Args:
    node: an ``onnx.NodeProto`` of domain ``ai.onnx.preview.training``.
    learning_rate: ``R``.
    initial_count: ``T`` of the first update.
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
  op_type, attributes = _node_attributes(node, None)
  if len(node.input):
    _tensor_count(op_type, len(node.input), "node inputs")
  makers: dict[str, Callable[..., Any]] = {
    "Momentum": transforms.momentum,
    "Adagrad": transforms.adagrad,
    "Adam": transforms.adam,
  }
  make = makers[op_type]
  return make(learning_rate, initial_count=initial_count, state_dtype=state_dtype, **attributes)
