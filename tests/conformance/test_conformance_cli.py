"""``python -m onnx_optax.conformance --rule``: a function's name (README's rules table) or a variant's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from onnx_optax import registry
from onnx_optax.conformance import __main__ as cli
from onnx_optax.conformance import cases, check

#: No device work: the pinned constants (nothing measured), every case recorded as passed.
QUICK = ["--platform", "cpu", "--dtype", "float32", "--no-large", "--no-onnx", "--pinned", "--quiet"]


@pytest.fixture
def recorded(monkeypatch):
  """The suite rules of the cases a run checks, in order (each case passes; nothing is computed)."""
  seen: list[str] = []

  def record(run_cases, platform="cpu", pinned=None):
    for case in run_cases:
      seen.append(case.rule)
      yield check.CaseResult(case.rule, case.dtype, case.name, platform, 0.0, "")

  monkeypatch.setattr(check, "results", record)
  return seen


@pytest.mark.parametrize(
  "given, selected",
  [
    (["momentum"], ["momentum_standard", "momentum_nesterov"]),
    (["ort_adamw"], ["ort_adamw_mode0", "ort_adamw_mode1"]),
    (["momentum_nesterov"], ["momentum_nesterov"]),  # A variant's own name: that variant only.
    (["adagrad", "momentum"], ["adagrad", "momentum_standard", "momentum_nesterov"]),
    # Named twice, by the function and by a variant: checked once.
    (["ort_adamw", "ort_adamw_mode1"], ["ort_adamw_mode0", "ort_adamw_mode1"]),
  ],
)
def test_a_function_name_checks_all_its_variants(recorded, capsys, given, selected):
  argv = [arg for name in given for arg in ("--rule", name)] + QUICK
  assert cli.main(argv) == cli.PASSED
  assert list(dict.fromkeys(recorded)) == selected
  assert len(recorded) == sum(len(cases.cases(rule, "float32", large=False)) for rule in selected)
  table = capsys.readouterr().out
  assert [line.split()[1] for line in table.splitlines() if line.startswith("cpu    ")] == selected


def test_every_function_and_every_suite_rule_is_accepted():
  """Each registered rule the suite checks, by its function's name, selects its variants (or
  itself); each suite rule is accepted by its own name."""
  accepted = cli.rule_names()
  for rule in registry.rules():
    if rule.conformance is None:
      continue
    variants = tuple(f"{rule.name}_{v.suffix}" for v in rule.variants) or (rule.name,)
    # A flag that adds state fields (Rule.flagged: Adam's amsgrad) is a suite rule of its own too.
    flagged = tuple(f"{rule.name}_{flag}" for flag, r in rule.flagged.items() if r.conformance)
    assert accepted[rule.name] == variants + flagged
  for name in cases.names():  # itself (and, named like its function, that function's flagged rules)
    assert accepted[name][0] == name and all(n.startswith(name) for n in accepted[name])
  assert set(accepted) == {r.name for r in registry.rules() if r.conformance} | set(cases.names())


def _help() -> str:
  out = subprocess.run(
    [sys.executable, "-m", "onnx_optax.conformance", "--help"], capture_output=True, text=True, check=True
  ).stdout
  return " ".join(out.split())


def test_help_and_the_usage_error_list_what_rule_accepts(capsys):
  help_text = _help()
  assert "momentum: momentum_standard, momentum_nesterov" in help_text
  assert "ort_adamw: ort_adamw_mode0, ort_adamw_mode1" in help_text
  assert "{" + ",".join(cli.rule_names()) + "}" in help_text.replace(" ", "")
  with pytest.raises(SystemExit) as exit_:
    cli.main(["--rule", "no_such_rule"])
  assert exit_.value.code == cli.USAGE
  err = capsys.readouterr().err
  assert "invalid choice: 'no_such_rule'" in err
  for name in ("momentum", "momentum_nesterov", "ort_adamw", "ort_adamw_mode0", "adam", "keras_adam"):
    assert f"'{name}'" in err, name
