"""Every ``python`` code block of README.md and docs/*.md runs as printed.

A page is read as a reader reads it: its blocks in order, in one namespace
(a later block uses what an earlier one defined), in a fresh Python process
(a page that sets ``XLA_FLAGS`` or ``KERAS_BACKEND`` does so before it
imports JAX or Keras, as the reader's script would), started in an empty
temporary directory (checkpoints and files the examples write land there).
A new page of ``docs/`` is picked up without editing this file.

A line ``print(x)  # value`` promises that output: the block's first printed
lines must be the promised values, in order. Blocks that are not Python
(``bash``, ``text``: shell recipes, outlines) are not run; a shell recipe
that starts several processes is a ``bash`` block, a Python example that
needs several processes starts them itself.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A fence at the start of a line; the info string must be exactly "python".
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", flags=re.S | re.M)
# The slowest page (docs/optax.md: Orbax, Flax NNX, two extra processes) takes
# about a minute on a 2-core machine.
TIMEOUT_S = 600

RUNNER = textwrap.dedent(
  """
  import contextlib, io, json, re, sys, traceback

  blocks = json.load(open(sys.argv[1]))
  namespace = {"__name__": "__main__"}
  for i, (line, code) in enumerate(blocks):
    out = io.StringIO()
    try:
      with contextlib.redirect_stdout(out):
        exec(compile(code, f"{sys.argv[2]}, block {i + 1} (line {line})", "exec"), namespace)
    except BaseException:
      sys.stdout.write(out.getvalue())
      print(f"FAILED: {sys.argv[2]}, block {i + 1} (line {line})", file=sys.stderr)
      raise
    sys.stdout.write(out.getvalue())
    promised = [p.strip() for p in re.findall(r"print\\(.*\\)\\s*#\\s*(.+)", code)]
    printed = out.getvalue().splitlines()
    if printed[: len(promised)] != promised:
      sys.exit(
        f"{sys.argv[2]}, block {i + 1} (line {line}) printed {printed[: len(promised)]}, "
        f"the page promises {promised}"
      )
  """
)


def blocks(page: pathlib.Path) -> list[tuple[int, str]]:
  """The page's ``python`` blocks with the line each starts on."""
  text = page.read_text()
  return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def _name(page: pathlib.Path) -> str:
  return str(page.relative_to(ROOT))


RUNNABLE = [page for page in PAGES if blocks(page)]


def test_pages_are_found():
  """The README and the guides have examples (a broken pattern would find none)."""
  names = {_name(page) for page in RUNNABLE}
  assert {"README.md", "docs/optax.md", "docs/interop.md", "docs/onnx.md", "docs/index.md"} <= names


def test_the_block_pattern(tmp_path):
  """Only ``python`` fences are taken, whole, with their line numbers."""
  page = tmp_path / "page.md"
  page.write_text(
    "a\n```python\nx = 1\n```\n```bash\nls\n```\n```pythonic\ny\n```\n```python\nz = 2\n\n```\n"
  )
  assert blocks(page) == [(2, "x = 1\n"), (11, "z = 2\n\n")]


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_page_runs_as_printed(page, tmp_path):
  import json

  source = tmp_path / "blocks.json"
  source.write_text(json.dumps(blocks(page)))
  runner = tmp_path / "run_blocks.py"
  runner.write_text(RUNNER)
  work = tmp_path / "cwd"
  work.mkdir()
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
  # The page decides these itself, as a reader's fresh shell would.
  for name in ("XLA_FLAGS", "KERAS_BACKEND", "JAX_ENABLE_X64", "JAX_PLATFORMS"):
    env.pop(name, None)
  result = subprocess.run(
    [sys.executable, str(runner), str(source), _name(page)],
    cwd=work,
    env=env,
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
  )
  assert result.returncode == 0, f"{_name(page)}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
