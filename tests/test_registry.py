"""The registry is the one place a rule is declared, and the package is laid out in one direction.

* Each rule's name is spelled as a string at most three times in the package (its
  registration, its NumPy expectation, its bound model; ``__all__`` aside): every other
  table is derived from the registry.
* No import circle anywhere in ``onnx_optax/``, function-level imports included.
* No module of the package over 800 lines.
* Each registered rule's declaration agrees with its transform (defaults, state fields,
  the hyperparameters its conformance and test configurations use).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rule_configs import shaped

import onnx_optax
from onnx_optax import _checks, registry
from onnx_optax.conformance import cases as grid

PACKAGE = pathlib.Path(onnx_optax.__file__).resolve().parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
RULES = list(registry.rules())


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in SOURCES}


def _strings(tree: ast.AST) -> list[str]:
  """The string constants of a module, docstrings and ``__all__`` lists left out."""
  skip: set[int] = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip.add(id(body[0].value))
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
      skip.update(id(n) for n in ast.walk(node.value))
  return [
    node.value
    for node in ast.walk(tree)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
  ]


def _reads_an_option_of_that_name(name: str, path: pathlib.Path) -> bool:
  """A module that declares or reads a framework's hyperparameter spelled like a rule (PyTorch SGD's
  ``momentum``): the twin of that framework's optimizer, and the bridges."""
  declares = any(
    name in rule.hyperparameters and path == pathlib.Path(inspect.getfile(rule.transform)) for rule in RULES
  )
  return declares or (path.parent.name == "interop" and any(name in r.hyperparameters for r in RULES))


def test_a_rule_name_is_spelled_at_most_three_times():
  """Its registration, its NumPy expectation and its bound model: every other table reads the registry.

  A rule's name that is also a framework's option (``momentum``, PyTorch SGD's) is not counted
  where that option is declared or read.
  """
  counts = {rule.name: 0 for rule in RULES}
  where: dict[str, list[str]] = {rule.name: [] for rule in RULES}
  for path in SOURCES:
    for value in _strings(ast.parse(path.read_text())):
      if value in counts and _reads_an_option_of_that_name(value, path):
        continue
      if value in counts:
        counts[value] += 1
        where[value].append(str(path.relative_to(PACKAGE)))
  over = {name: where[name] for name, n in counts.items() if n > 3}
  assert not over, f"rule names spelled more than three times: {over}"


def _imports(module: str, path: pathlib.Path) -> set[str]:
  """The package's modules that ``module`` imports, at module level or inside a function."""
  found: set[str] = set()
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(
          package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
        )
      names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    else:
      continue
    found.update(name for name in names if name in MODULES and name != module)
  return found


def test_a_package_of_self_registering_modules_imports_them_all_in_the_order_of_names(tmp_path, monkeypatch):
  """A new rule is its module: ``onnx_optax.rules`` and ``onnx_optax.conformance.models`` import
  every module they hold (``_discover.import_submodules``), private ones left alone."""
  from onnx_optax._discover import import_submodules

  package = tmp_path / "found_here"
  package.mkdir()
  (package / "__init__.py").write_text("ORDER = []\n")
  for name in ("b_rule", "a_rule", "_private"):
    (package / f"{name}.py").write_text(f"import found_here\nfound_here.ORDER.append({name!r})\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    import found_here

    assert import_submodules("found_here", found_here.__path__) == ["found_here.a_rule", "found_here.b_rule"]
    assert found_here.ORDER == ["a_rule", "b_rule"]
  finally:
    for name in [m for m in sys.modules if m.split(".")[0] == "found_here"]:
      del sys.modules[name]


def test_rules_lists_the_spec_rules_then_the_twins():
  spec = [rule.policy.name == "spec" for rule in RULES]
  assert spec == sorted(spec, reverse=True) and spec[0] and not spec[-1]


@pytest.mark.parametrize(
  "rule", [r for r in RULES if r.transform.__module__.startswith("onnx_optax.rules.")], ids=lambda r: r.name
)
def test_a_rule_of_the_package_is_exported_by_its_name(rule):
  """``onnx_optax.<rule>`` and its state class are public names (written out in
  :mod:`onnx_optax.transforms`, so that type checkers see them); the message names the line to add."""
  for family_member in rule.family():
    for obj in (family_member.transform, family_member.state):
      assert getattr(onnx_optax, obj.__name__, None) is obj, (
        f"add `from {obj.__module__} import {obj.__name__}` and {obj.__name__!r} to __all__ in "
        "onnx_optax/transforms.py"
      )
      assert obj.__name__ in onnx_optax.__all__


def test_no_import_circle():
  """Imports run one way (registry and checks -> engine -> rules -> interfaces -> conformance)."""
  graph = {module: _imports(module, path) for module, path in MODULES.items()}
  circles, stack, state = [], [], {}

  def visit(module: str) -> None:
    state[module] = "open"
    stack.append(module)
    for other in sorted(graph[module]):
      if state.get(other) == "open":
        circles.append(stack[stack.index(other) :] + [other])
      elif other not in state:
        visit(other)
    stack.pop()
    state[module] = "done"

  for module in sorted(graph):
    if module not in state:
      visit(module)
  assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_800_lines(path):
  assert len(path.read_text().splitlines()) <= 800


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_declaration_agrees_with_the_transform(rule):
  """The transform takes every declared hyperparameter, the state's fields are ``count`` then the
  declared ones, and the conformance and test configurations name only declared hyperparameters."""
  parameters = inspect.signature(rule.transform).parameters
  assert list(parameters)[0] == "learning_rate"
  assert set(rule.hyperparameters) == set(parameters) - {"learning_rate", "initial_count", "state_dtype"}
  assert rule.state._fields == ("count", *(f.name for f in rule.fields))
  assert getattr(onnx_optax, rule.name) is rule.transform
  assert registry.get(rule.name) is rule
  assert rule.conformance is not None
  configurations = [rule.conformance.hyper, rule.conformance.tests.hyper]
  configurations += [v.hyper for v in rule.variants] + [t.hyper for t in rule.conformance.more_tests.values()]
  configurations += [e.changes.get("hyper", {}) for e in rule.conformance.edges]
  for hyper in configurations:
    assert set(hyper) <= set(rule.hyperparameters), hyper
  for field in rule.fields:
    starts = (*rule.hyperparameters, registry.LEARNING_RATE)  # a hyperparameter, or the learning rate
    assert not isinstance(field.initial, str) or field.initial in starts
  # A variant's own test configuration runs the variant (its hyperparameters among the configuration's),
  # and no two variants of a rule are the same configuration in the suite.
  for variant in rule.variants:
    if variant.tests is not None:
      assert {k: variant.tests.hyper.get(k) for k in variant.hyper} == dict(variant.hyper), variant.suffix
  suite = _suite_configurations(rule)
  assert all(a != b for i, a in enumerate(suite) for b in suite[i + 1 :]), rule.name
  # The rule's own test configuration runs: the rule's, or that of a variant that derives its own from it.
  assert not rule.variants or any(v.tests is None for v in rule.variants), rule.name


def _suite_configurations(rule: registry.Rule) -> list[dict]:
  """The hyperparameters the conformance grid runs the rule with: one per variant, else the rule's."""
  return [dict(s.hyper) for s in grid.suite_rules().values() if s.rule is rule]


def test_a_name_is_registered_once():
  with pytest.raises(ValueError, match="registered already"):
    registry.register(RULES[0])
  with pytest.raises(KeyError, match=r"registered: (\w+, )*momentum, "):
    registry.get("no_such_rule")


def test_commutes_with_names_layout_operations_and_the_rules_fields():
  rule = registry.get("pytorch_adafactor")
  for wrong, message in [
    ({"rotate": {}}, r"commutes_with names 'rotate', not one of the layout operations \('take'"),
    ({"transpose_last_two": {"row_var": "row_means"}}, r"names \['row_means'\], which are not fields"),
  ]:
    with pytest.raises(ValueError, match=message):
      registry.register(registry.replace(rule, name="commutes_check", commutes_with=wrong))
  assert "commutes_check" not in {r.name for r in registry.rules()}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_flags_are_declared_static(rule):
  """A flag selects the formula while the update traces (``if maximize:``), so it is declared
  static (:attr:`onnx_optax.registry.Hyperparameter.static`): the tests' ``static_args`` for
  ``optax.inject_hyperparams`` are read from that, and the PyTorch bridge reads a static option
  as it is, the others as real numbers."""
  flags = {h for h, declared in rule.hyperparameters.items() if declared.check is _checks.flag}
  static = {h for h, declared in rule.hyperparameters.items() if declared.static}
  assert flags <= static, f"{rule.name}: flags {sorted(flags - static)} not declared static"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_hyperparameters_that_are_not_numbers_are_declared_static(rule):
  """A hyperparameter given as something other than a real number (PyTorch's ``betas``, a pair; a
  flag; a mode) cannot be injected as an array nor read by the PyTorch bridge as a real number
  (``_torch_optim`` reads the static options as they are): it is declared static. Planted,
  ``betas`` declared ``static=False`` left every test of the judge's stages for the Adam twin
  passing (the bridge and ``inject_hyperparams`` tests, which it breaks, are not among them)."""
  assert rule.conformance is not None
  given = [rule.conformance.hyper, rule.conformance.tests.hyper]
  given += [test.hyper for test in rule.conformance.more_tests.values()]
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
  odd = {h for hyper in given for h, v in hyper.items() if not number(v)}
  static = {h for h, declared in rule.hyperparameters.items() if declared.static}
  assert odd <= static, f"{rule.name}: {sorted(odd - static)} not declared static"


def _edge_parts(name: str) -> list[tuple[str, str | None]]:
  return [(part.partition("=")[0], part.partition("=")[2] or None) for part in name.split(",")]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_edges_are_what_their_names_say(rule):
  """Each conformance edge is the case its name reports (``momentum=0``, ``beta=1,T=0``,
  ``betas[0]=0.3``, ``alpha=0.999,state=0``, ``gradient=near_singular``; a bare name,
  ``nesterov``: that hyperparameter set, not zero), so that the report's row of an edge at 0
  does run the hyperparameter at 0."""
  assert rule.conformance is not None
  for edge in rule.conformance.edges:
    hyper = edge.changes.get("hyper", {})
    for key, value in _edge_parts(edge.name):
      where = f"{rule.name} edge {edge.name!r}"
      if key == "state":  # state=0: zeros; state=tight: a named drawing of the grid (cases.py)
        assert edge.changes["state"] == ("zero" if value == "0" else value) != "random", where
      elif key in ("T", "R"):
        assert value is not None and edge.changes[key] == float(value), where
      elif key == "|X|":  # |X|=0.001: the parameters' magnitude
        assert value is not None and edge.changes["x_scale"] == float(value), where
      elif key == "gradient":  # gradient=near_singular: a named drawing of the grid (cases.py)
        assert edge.changes["gradient"] == value, where
      elif key == "shape":  # shape=9x3: the case's one leaf (a rule of matrices, Rule.ranks)
        assert value is not None and edge.changes["shapes"] == (tuple(map(int, value.split("x"))),), where
      elif value is None:
        assert hyper.get(key) not in (None, 0, False), where
      elif key.endswith("]"):
        base, index = key[:-1].split("[")
        assert hyper[base][int(index)] == float(value), where
      elif isinstance(hyper.get(key), str):  # a named choice: adjust_lr_fn=match_rms_adamw
        assert hyper[key] == value, where
      else:
        assert hyper[key] == float(value), where


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_more_test_configurations_set_what_they_are_named_after(rule):
  """A configuration of :attr:`~onnx_optax.registry.Conformance.more_tests` named after a
  hyperparameter (``pytorch_sgd_nesterov``) runs with it set: the tests of that variant do
  run it."""
  assert rule.conformance is not None
  for suffix, config in rule.conformance.more_tests.items():
    for key, value in _edge_parts(suffix):
      if key in rule.hyperparameters and value is None:
        assert config.hyper.get(key) not in (None, 0, False), f"{rule.name}_{suffix}: {key} not set"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_tiny_gradient_cases_set_their_coefficients_to_zero(rule):
  """:attr:`~onnx_optax.registry.Conformance.tiny_gradient` sets to 0 each coefficient whose term
  (``coefficient * X``) would dwarf a gradient of epsilon's size, so that the grid's tiny-gradient
  cases do run a tiny gradient through the rule (a nonzero value there, planted: PyTorch SGD's
  ``weight_decay`` 1.0, left every report row passing)."""
  assert rule.conformance is not None
  for name, value in rule.conformance.tiny_gradient.items():
    assert name in rule.hyperparameters, f"{rule.name}: tiny_gradient names {name!r}"
    assert value == 0.0 and not isinstance(value, bool), f"{rule.name}: tiny_gradient {name}={value!r}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_float_hyperparameters_are_not_static(rule):
  """A hyperparameter whose default is a float selects no formula (a 0 or a 1 is told apart while
  the update traces, ``_numerics.is_static``), so it is not declared static: it can be injected
  (``optax.inject_hyperparams``) and traced. Planted, ``Hyperparameter.static`` defaulting to True
  left every other test passing."""
  defaults = inspect.signature(rule.transform).parameters
  for name, declared in rule.hyperparameters.items():
    if isinstance(defaults[name].default, float):
      assert not declared.static, f"{rule.name}: {name} (default {defaults[name].default}) declared static"


def test_declarations_are_immutable():
  """A rule's declarations (its fields, hyperparameters, policy, bindings and conformance grid)
  cannot be changed after registration: every layer reads them, and a layer that wrote one would
  change what the others read. Planted, each ``frozen=False`` left every other test passing."""
  for rule in RULES:
    assert rule.conformance is not None
    declared = [
      *rule.fields,
      *rule.hyperparameters.values(),
      rule.policy,
      *rule.bindings,
      rule.conformance,
      rule.conformance.tests,
    ]
    for thing in declared:
      field = dataclasses.fields(thing)[0].name
      with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(thing, field, getattr(thing, field))


@pytest.mark.parametrize(
  "rule", [r for r in RULES if any(isinstance(f.initial, str) for f in r.fields)], ids=lambda r: r.name
)
def test_a_state_starts_at_the_value_its_hyperparameter_gives(rule):
  """A state field whose initial value is a hyperparameter (PyTorch Adagrad's
  ``initial_accumulator_value``, where ``torch.optim.Adagrad`` starts its ``sum``) starts at that
  value, 0 and 1 included. Planted, the engine's zero test ``value == 0`` as ``value == 1``, as
  ``value != 0``, or its ``and`` as ``or`` (states of ones or of 0.25 started at zeros) left every
  other test passing."""
  for field in rule.fields:
    if isinstance(field.initial, str):
      for value in (0.0, 1.0, 0.25):
        if field.initial == registry.LEARNING_RATE:  # a field that starts at the learning rate
          tx = rule.transform(value)
        else:
          tx = rule.transform(0.1, **{field.initial: value})
        state = tx.init({"a": jnp.ones(3), "b": jnp.ones(())})
        for leaf in jax.tree.leaves(getattr(state, field.name)):
          np.testing.assert_array_equal(np.asarray(leaf), np.full(leaf.shape, value, np.float32))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_a_field_declared_a_second_moment_is_never_negative(rule):
  """:attr:`~onnx_optax.registry.Field.second_moment`: a running mean or sum of squares, never
  negative (the conformance grid and the tests draw such a state non-negative). After updates with
  gradients of both signs, from the state ``init`` gives, each field declared so is still >= 0. Planted,
  ``Field.second_moment`` defaulting to True (a momentum buffer declared a second moment) left every
  other test passing."""
  assert rule.conformance is not None
  tx = rule.transform(0.1, **rule.conformance.hyper)
  shape = shaped(rule.name, 4)  # a leaf the rule takes (Rule.ranks: Muon's matrices)
  params = {"a": jnp.ones(shape)}
  state = tx.init(params)
  for grads in (jnp.array([-1.0, -2.0, 0.5, -0.25]), jnp.array([-3.0, 1.0, -0.5, -2.0])):
    _, state = tx.update({"a": grads.reshape(shape)}, state, params)
  for field in rule.fields:
    if field.second_moment:
      assert np.all(np.asarray(getattr(state, field.name)["a"]) >= 0), f"{rule.name}: {field.name}"


@pytest.mark.parametrize(
  "rule", [r for r in RULES if any(h.decay for h in r.hyperparameters.values())], ids=lambda r: r.name
)
def test_a_stalling_decays_refusal_offers_1_only_where_1_is_accepted(rule):
  """A decay rate that rounds to 1 in bfloat16 is refused at ``init``; the refusal offers
  ``name=1.0`` exactly where the rule accepts 1 (:attr:`~onnx_optax.registry.Hyperparameter.may_be_one`),
  and that advice, followed literally, works. Planted, ``may_be_one`` defaulting to True (Adam's
  ``alpha=1.0`` offered, then refused) left every other test passing, and so did ONNX Runtime
  AdamW's ``may_be_one`` for ``adam_mode == 2`` while only mode 0 was checked here."""
  assert rule.conformance is not None
  params = {"a": jnp.ones(3, jnp.bfloat16)}
  # In each of the suite's configurations: whether 1 is accepted may depend on a mode (ONNX
  # Runtime AdamW's beta = 1 only with adam_mode=1).
  for base in _suite_configurations(rule):
    for name, declared in rule.hyperparameters.items():
      if not declared.decay:
        continue
      hyper = {**base, name: 0.999}
      with pytest.raises(ValueError, match=rf"{name}=0.999 rounds to 1.0 in bfloat16") as refused:
        rule.transform(0.1, **hyper).init(params)
      offered = re.search(rf"pass {name}=1\.0", str(refused.value)) is not None
      try:
        rule.transform(0.1, **{**hyper, name: 1.0}).init(params)
        accepted = True
      except ValueError:
        accepted = False
      assert offered == accepted, (rule.name, base, name, str(refused.value))


@pytest.mark.parametrize(
  "rule", [r for r in RULES if r.policy.name == "spec" and not r.always_reads_params], ids=lambda r: r.name
)
def test_a_spec_rule_leaves_parameters_it_does_not_need_unread(rule):
  """The spec rules read ``X`` only where a coefficient multiplies it (``norm_coefficient``,
  ``weight_decay``; docs/spec.md, "Optax transforms"): with each such coefficient the Python
  number 0, the parameters handed to ``update`` do not reach the update, not even as ``0 * X``
  (NaN where ``X`` is infinite). Planted, the spec policy's ``params_when_given=True`` (``X``
  handed to every rule whenever given) left every other test passing."""
  assert rule.conformance is not None
  hyper = {**rule.conformance.hyper, **{h: 0.0 for h in rule.params_for}}
  tx = rule.transform(0.1, **hyper)
  params = {"a": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array([3.0, -1.0])}
  grads = {"a": jnp.array([0.25, -0.5, 1.0]), "b": jnp.array([-0.75, 2.0])}
  state = tx.init(params)
  unread, _ = tx.update(grads, state)
  infinite = jax.tree.map(lambda x: jnp.full_like(x, jnp.inf) * jnp.sign(x), params)
  given, _ = tx.update(grads, state, infinite)
  for path, u in jax.tree_util.tree_leaves_with_path(given):
    assert np.all(np.isfinite(np.asarray(u))), (rule.name, jax.tree_util.keystr(path), u)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), unread, given)
