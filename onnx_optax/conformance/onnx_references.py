"""ONNX's own references: the backend test cases and the ReferenceEvaluator.

Needs the optional ``onnx`` package (the ``onnx`` extra); the rest of the
suite does not.

* :func:`backend_cases`: ONNX's test cases for the three operators
  (``test_momentum``, ``test_nesterov_momentum``, ``test_momentum_multiple``,
  ``test_adagrad``, ``test_adagrad_multiple``, ``test_adam``,
  ``test_adam_multiple``), inputs and expected outputs as the installed
  ``onnx`` package generates them (importing its case modules runs their
  exporters; nothing is copied by hand). :func:`run_backend_case` runs one
  through the Optax transform: state built from the ONNX inputs,
  hyperparameters from the node's attributes with the schema's defaults for
  omitted ones.
* :func:`evaluator_cases`: random nodes (several tensors, ``T > 0``,
  optional attributes omitted, float64) run by
  ``onnx.reference.ReferenceEvaluator`` and by the transforms.
  Known deviations of the evaluator (onnx 1.16 to 1.23 at least), found by
  :func:`evaluator_casts_to_float32` and the tests:

  - multi-tensor ``Adam`` casts every output to float32, whatever the input
    dtype (``op_adam.py``: ``xs.append(a.astype(np.float32))``); those
    nodes are checked against the spec (:mod:`onnx_optax.reference`) in
    float64 instead, and the evaluator's float32 outputs only to float32;
  - FLOAT attributes reach the operators as ``np.float32`` scalars, so with
    float64 tensors ``1 - norm_coefficient_post`` (and ``1 - alpha``,
    ``1 - beta`` where not exact) is rounded to float32: the evaluator's
    float64 Adam is float32-accurate in ``X_final`` when
    ``norm_coefficient_post != 0``. Its tolerance says so
    (:func:`onnx_optax.conformance.tolerance.evaluator_context`);
  - ``Adam`` evaluates ``r_adjusted * (v_new / h_sqrt)`` where the schema's
    text reads ``R_adjusted * V_new / H_sqrt``: one rounding apart, inside
    the tolerance (a chain of products and quotients has the same bound in
    any order).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from onnx_optax import registry
from onnx_optax.conformance import check, devices, scalars, tolerance
from onnx_optax.conformance.cases import suite_rule, suite_rule_of
from onnx_optax.conformance.check import CaseResult

__all__ = [
  "BACKEND_CASES",
  "backend_case_rule",
  "backend_cases",
  "evaluator_cases",
  "evaluator_casts_to_float32",
  "node_rule",
  "run_backend_case",
  "run_evaluator_case",
]

DOMAIN = "ai.onnx.preview.training"
BACKEND_CASES = (
  "test_momentum",
  "test_nesterov_momentum",
  "test_momentum_multiple",
  "test_adagrad",
  "test_adagrad_multiple",
  "test_adam",
  "test_adam_multiple",
)


def _operator(op_type: str) -> registry.Rule:
  """The registered rule bound to ONNX's ``op_type`` in the training domain."""
  for rule in registry.rules():
    binding = rule.binding("onnx")
    if binding is not None and binding.name == op_type and binding.domain == DOMAIN:
      return rule
  raise LookupError(f"no registered rule is bound to {DOMAIN} {op_type}")


def _state_blocks(op_type: str) -> int:
  """The number of state blocks of an operator: its rule's state tensors."""
  return len(_operator(op_type).fields)


def backend_cases() -> dict[str, Any]:
  """ONNX's test cases for the three operators, by name (``onnx`` TestCase tuples)."""
  import onnx.backend.test.case.node as node_cases

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    # Importing a case module runs its exporters, which register the cases.
    from onnx.backend.test.case.node import adagrad, adam, momentum  # noqa: F401
  found = {c.name: c for c in node_cases._NodeTestCases if c.name in BACKEND_CASES}
  if len(found) != len(BACKEND_CASES):  # Registered under a filter before: collect them all.
    found = {c.name: c for c in node_cases.collect_testcases(None) if c.name in BACKEND_CASES}
  missing = set(BACKEND_CASES) - set(found)
  if missing:
    raise LookupError(f"the installed onnx package has no test cases {sorted(missing)}")
  return found


def attributes(node: Any) -> dict[str, Any]:
  """The node's attributes, with the schema's defaults for omitted ones."""
  import onnx
  from onnx import helper

  schema = onnx.defs.get_schema(node.op_type, 1, DOMAIN)
  attrs = {
    name: helper.get_attribute_value(a.default_value)
    for name, a in schema.attributes.items()
    if a.default_value.name
  }
  attrs.update({a.name: helper.get_attribute_value(a) for a in node.attribute})
  return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}


def _rule(op_type: str, attrs: dict[str, Any]) -> str:
  """The suite rule of a node: its operator's rule, the variant its attributes select (Momentum's mode)."""
  return suite_rule_of(_operator(op_type), attrs).name


def node_rule(node: Any) -> str:
  """The suite rule (a name of ``cases.RULES``) a node of ONNX's training operators computes."""
  return _rule(node.op_type, attributes(node))


def backend_case_rule(case: Any) -> tuple[str, str]:
  """``(rule, dtype)`` of one of ONNX's backend test cases, read without running it (for filters)."""
  (_, _, *tensors), _ = case.data_sets[0]
  return node_rule(case.model.graph.node[0]), str(np.asarray(tensors[0]).dtype)


def _split(op_type: str, tensors: list[np.ndarray]) -> tuple[list, list, list[list]]:
  """ONNX's variadic blocks ``X.., G.., S1.., S2..`` -> ``(X, G, state)``."""
  k = 2 + _state_blocks(op_type)
  n = len(tensors) // k
  blocks = [list(tensors[i * n : (i + 1) * n]) for i in range(k)]
  return blocks[0], blocks[1], blocks[2:]


def _check(
  label: str,
  rule: str,
  dtype: str,
  platform: str,
  R: float,
  T: int,
  hyper: dict,
  X,
  G,
  state,
  want: list[np.ndarray],
  other: tolerance.Context,
) -> CaseResult:
  """Runs the transform and compares with ``want`` (ONNX's output order).

  The tolerance is the implementation's bound plus the bound of the other
  side's evaluation (``other``).
  """
  try:
    got_x, got_state, count, _ = check.run_transform(rule, dtype, platform, R, T, hyper, X, G, state)
  except Exception as e:  # noqa: BLE001 -- reported as a failure.
    return CaseResult(rule, dtype, label, platform, float("inf"), "", error=repr(e))
  base = suite_rule(rule).rule.name
  if check.PINNED:
    impl = tolerance.implementation_context(np.dtype(dtype), platform)
  else:
    # The device's arithmetic and the node's scalars as the device computes them, their error
    # against the Python floats themselves (received float64: the rounding to float32 included).
    measured = scalars.measure(rule, platform, R, T, hyper, x64=dtype == "float64", received=np.float64)
    impl = tolerance.implementation_context(
      np.dtype(dtype), platform, arithmetic=check.measured_arithmetic(platform), scalars=measured
    )
  n = len(X)
  got = list(got_x) + [x for block in got_state for x in block]
  worst, where, loose, unchecked = 0.0, "", 0, 0
  for i in range(n):
    s = [block[i] for block in state]
    tols = [
      a + b
      for a, b in zip(
        tolerance.bounds(base, impl, R, T, X[i], G[i], s, **hyper),
        tolerance.bounds(base, other, R, T, X[i], G[i], s, **hyper),
      )
    ]
    for k, tol in enumerate(tols):
      ratio, index, m, inf = check.compare(got[k * n + i], want[k * n + i], tol)
      loose, unchecked = loose + m, unchecked + inf
      if ratio > worst or not where:
        worst, where = ratio, f"output {k * n + i}, element {index}"
  count_ok = count == T + 1
  return CaseResult(rule, dtype, label, platform, worst, where, loose, count_ok, unchecked=unchecked)


def run_backend_case(name: str, platform: str = "cpu", cases: dict[str, Any] | None = None) -> CaseResult:
  """One ONNX backend test case through the Optax transform on ``platform``."""
  case = (cases or backend_cases())[name]
  node = case.model.graph.node[0]
  (R, T, *tensors), want = case.data_sets[0]
  attrs = attributes(node)
  rule = _rule(node.op_type, attrs)
  X, G, state = _split(node.op_type, list(tensors))
  dtype = str(np.asarray(X[0]).dtype)
  # ONNX computed its expectations with NumPy in float32 (scalars partly in
  # float64): bounded like the implementation on an IEEE CPU.
  other = tolerance.implementation_context(np.dtype(dtype), "cpu")
  return _check(
    f"onnx:{name}",
    rule,
    dtype,
    platform,
    float(R),
    int(T),
    attrs,
    X,
    G,
    state,
    [np.asarray(w) for w in want],
    other,
  )


def evaluator_cases(seed: int = 0) -> list[tuple[str, Any, list[np.ndarray]]]:
  """Random float64 nodes for the ReferenceEvaluator: ``(label, node, inputs)``.

  Three tensors of odd shapes, ``T`` in ``[1, 1000]``; Adagrad and Adam with
  every attribute omitted (schema defaults), and with some given; Momentum
  (whose attributes are all required) in both modes.
  """
  from onnx import helper

  rng = np.random.default_rng(seed)
  shapes = [(3,), (2, 5), (7,)]
  out: list[tuple[str, Any, list[np.ndarray]]] = []
  specs: list[tuple[str, dict[str, Any]]] = [
    ("Momentum", dict(alpha=0.9, beta=0.7, mode="standard", norm_coefficient=0.01)),
    ("Momentum", dict(alpha=0.8, beta=0.5, mode="nesterov", norm_coefficient=0.02)),
    ("Adagrad", {}),
    ("Adagrad", dict(decay_factor=0.1, epsilon=1e-4, norm_coefficient=0.01)),
    ("Adam", {}),
    ("Adam", dict(alpha=0.8, beta=0.99, epsilon=1e-4, norm_coefficient=0.01, norm_coefficient_post=0.02)),
  ]
  for op, attrs in specs:
    for n in (1, 3):
      k = 2 + _state_blocks(op)
      names = [f"{block}{i}" for block in ["X", "G", "S", "Q"][:k] for i in range(n)]
      outputs = [f"{name}_new" for name in names[:n] + names[2 * n :]]
      node = helper.make_node(op, ["R", "T"] + names, outputs, domain=DOMAIN, **attrs)
      R = np.array(rng.uniform(0.01, 0.1), np.float64)
      T = np.array(rng.integers(1, 1000), np.int64)
      tensors: list[np.ndarray] = []
      for block in range(k):
        for shape in shapes[:n]:
          x = rng.uniform(0.1, 2.0, size=shape)
          second_moment = block >= 2 and _operator(op).fields[block - 2].second_moment
          if not second_moment:
            x = x * rng.choice([-1.0, 1.0], size=shape)
          tensors.append(x)
      label = (
        f"evaluator:{op}{'(' + attrs['mode'] + ')' if 'mode' in attrs else ''}"
        f"{',defaults' if not attrs else ''},n={n}"
      )
      out.append((label, node, [R, T, *tensors]))
  return out


def evaluate(node: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
  """``onnx.reference.ReferenceEvaluator`` on one node."""
  from onnx import helper
  from onnx.reference import ReferenceEvaluator

  graph = helper.make_graph(
    [node],
    "g",
    [
      helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
      for name, x in zip(node.input, inputs)
    ],
    [helper.make_tensor_value_info(name, 0, None) for name in node.output],
  )
  model = helper.make_model(
    graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
  )
  return list(ReferenceEvaluator(model).run(None, dict(zip(node.input, inputs))))


def evaluator_casts_to_float32(outputs: list[np.ndarray]) -> bool:
  """True when the evaluator returned a float32 output (its multi-tensor Adam does for any input)."""
  return any(np.asarray(o).dtype == np.float32 for o in outputs)


def run_evaluator_case(label: str, node: Any, inputs: list[np.ndarray], platform: str = "cpu") -> CaseResult:
  """The transform against the ReferenceEvaluator, in float64.

  Where the evaluator returns float32 for float64 inputs (multi-tensor Adam,
  see the module docstring) the expectation is the spec in float64
  (:mod:`onnx_optax.reference`) instead, and the label says so.
  """
  if not devices.has_float64(platform):
    return CaseResult(label, "float64", label, platform, 0.0, "skipped: no float64 on this platform")
  R, T, *tensors = inputs
  attrs = attributes(node)
  rule = _rule(node.op_type, attrs)
  X, G, state = _split(node.op_type, tensors)
  want = evaluate(node, inputs)
  if evaluator_casts_to_float32(want):
    label += " (evaluator casts to float32: checked against the spec)"
    per_leaf = check.expected(rule, float(R), int(T), X, G, state, attrs)
    k = len(per_leaf[0])
    want = [per_leaf[i][j] for j in range(k) for i in range(len(X))]
  other = tolerance.reference_context() if label.endswith("spec)") else tolerance.evaluator_context()
  return _check(label, rule, "float64", platform, float(R), int(T), attrs, X, G, state, want, other)
