"""The README's examples run and print what the README says they print."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_examples():
  assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index):
  code = BLOCKS[index]
  if "from onnx" in code:
    pytest.importorskip("onnx", reason="the example needs the onnx extra")
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, f"README.md example {index}", "exec"), {})
  # A line `print(x)  # value` promises that output.
  promised = re.findall(r"print\(.*\)\s*#\s*(.+)", code)
  printed = out.getvalue().splitlines()
  assert printed[: len(promised)] == [p.strip() for p in promised]
