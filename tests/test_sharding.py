"""Sharded training on 8 devices (issue 5), in a process of its own.

JAX fixes the number of devices when it starts, and the rest of the suite runs
on one; so ``sharding_check.py`` runs in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (8 virtual CPU
devices). What it checks is in its docstring.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from rule_configs import RULE_CONFIGS

import onnx_optax

SCRIPT = pathlib.Path(__file__).with_name("sharding_check.py")
RULES = tuple(RULE_CONFIGS)  # the script runs every configuration of every registered rule


def test_sharded_training_on_8_devices():
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"  # the 8 virtual devices are CPU devices
  # The package as the suite imports it, wherever it lives.
  root = str(pathlib.Path(onnx_optax.__file__).resolve().parent.parent)
  env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  result = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
  output = result.stdout + result.stderr
  assert result.returncode == 0, output
  lines = result.stdout.splitlines()
  assert "ok detector" in result.stdout, output
  for rule in RULES:
    for mode in ("auto", "explicit"):
      for kind in ("plain", "injected"):
        assert any(line.startswith(f"ok {mode} {rule} {kind}:") for line in lines), (rule, mode, kind, output)
