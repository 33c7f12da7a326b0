"""``python -m onnx_optax.conformance``: the table, JSON, Markdown and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import jax.numpy as jnp
import pytest

from onnx_optax import rules
from onnx_optax.conformance import __main__ as cli
from onnx_optax.conformance import check

SMALL = ["--platform", "cpu", "--rule", "adagrad", "--dtype", "float32", "--no-large", "--no-onnx", "--quiet"]


def test_report_writes_table_json_and_markdown(tmp_path, capsys):
  js, md = tmp_path / "r.json", tmp_path / "r.md"
  assert cli.main(SMALL + ["--json", str(js), "--markdown", str(md)]) == 0
  table = capsys.readouterr().out
  assert "adagrad" in table and "PASSED" in table
  report = json.loads(js.read_text())
  assert report["passed"] and report["jax"] and report["date"] and report["devices"]["cpu"]
  (row,) = report["rows"]
  assert row["rule"] == "adagrad" and row["dtype"] == "float32" and row["cases"] > 10
  assert 0 < row["worst"] <= 1
  text = md.read_text()
  assert "JAX " in text and "| cpu | adagrad | float32 |" in text


def test_report_fails_on_a_wrong_rule(monkeypatch, capsys):
  def wrong(s, X, G, H):
    U, H_new = original(s, X, G, H)
    return U * jnp.asarray(1.001, U.dtype), H_new

  original = rules.adagrad_elementwise
  monkeypatch.setattr(rules, "adagrad_elementwise", wrong)
  assert cli.main(SMALL) == 1
  assert "FAIL" in capsys.readouterr().out


def test_missing_platform_exits_2(capsys):
  missing = [p for p in ("gpu", "tpu") if p not in check.platforms()]
  if not missing:
    pytest.skip("this machine has both a GPU and a TPU")
  assert cli.main(["--platform", missing[0], "--quiet"]) == 2
  assert "finds no" in capsys.readouterr().err


def test_module_runs_as_a_command():
  out = subprocess.run(
    [sys.executable, "-m", "onnx_optax.conformance", "--help"], capture_output=True, text=True, check=True
  ).stdout
  assert "--platform" in out and "--json" in out and "--markdown" in out
