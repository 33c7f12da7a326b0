"""Every ``python`` code block of README.md and docs/*.md runs as printed.

Each block runs alone, as a reader who copies that one block into a fresh
interpreter runs it: its imports and the small setup it needs are in the
block. And each page runs as a reader who pastes the whole page runs it: its
blocks in order, in one namespace, so that a block does not break what an
earlier one set up (JAX's ``jax_enable_x64``, ``XLA_FLAGS``, a name reused).

Every run is a fresh Python process (a block that sets ``XLA_FLAGS`` or
``KERAS_BACKEND`` does so before it imports JAX or Keras, as the reader's
script would), with none of those variables inherited, started in an empty
temporary directory of its own (checkpoints and files the examples write land
there). A page's first block alone is the first step of the page's run, so it
is not run twice. The runs of a page go in parallel, one per CPU. A new page of
``docs/`` is picked up without editing this file.

A line ``print(x)  # value`` promises that output: the block's first printed
lines must be the promised values, in order. Blocks that are not Python
(``bash``, ``text``: shell recipes, outlines, sketches) are not run; a shell
recipe that starts several processes is a ``bash`` block, a Python example
that needs several processes starts them itself.
"""

from __future__ import annotations

import concurrent.futures
import json
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
# The slowest run (docs/optax.md in sequence: Orbax, Flax NNX, two extra
# processes) takes about a minute on a 2-core machine.
TIMEOUT_S = 600
# What a reader's fresh shell does not have: the page decides these itself.
UNSET = ("XLA_FLAGS", "KERAS_BACKEND", "JAX_ENABLE_X64", "JAX_PLATFORMS")

RUNNER = textwrap.dedent(
  """
  import contextlib, io, json, re, sys, traceback

  page, blocks = sys.argv[2], json.load(open(sys.argv[1]))
  namespace = {"__name__": "__main__"}
  for number, line, code in blocks:
    where = f"{page}, block {number} (line {line})"
    out = io.StringIO()
    try:
      with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), namespace)
    except BaseException:
      sys.stdout.write(out.getvalue())
      print(f"FAILED: {where}", file=sys.stderr)
      raise
    sys.stdout.write(out.getvalue())
    promised = [p.strip() for p in re.findall(r"print\\(.*\\)\\s*#\\s*(.+)", code)]
    printed = out.getvalue().splitlines()
    if printed[: len(promised)] != promised:
      sys.exit(f"{where} printed {printed[: len(promised)]}, the page promises {promised}")
  """
)


def blocks(page: pathlib.Path) -> list[tuple[int, str]]:
  """The page's ``python`` blocks with the line each starts on."""
  text = page.read_text()
  return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def _name(page: pathlib.Path) -> str:
  return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def _run(name: str, numbered: list[tuple[int, int, str]], directory: pathlib.Path) -> str | None:
  """Runs ``numbered`` (number, line, code) in order in one fresh process; what failed, or None."""
  directory.mkdir(parents=True)
  source = directory / "blocks.json"
  source.write_text(json.dumps(numbered))
  runner = directory / "run_blocks.py"
  runner.write_text(RUNNER)
  work = directory / "cwd"
  work.mkdir()
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
  for variable in UNSET:
    env.pop(variable, None)
  result = subprocess.run(
    [sys.executable, str(runner), str(source), name],
    cwd=work,
    env=env,
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
  )
  if result.returncode == 0:
    return None
  what = "in sequence" if len(numbered) > 1 else f"block {numbered[0][0]} (line {numbered[0][1]}) alone"
  return f"{name}, {what}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


def page_failures(page: pathlib.Path, directory: pathlib.Path) -> list[str]:
  """The page in sequence and each block after the first alone, in parallel: what failed."""
  numbered = [(number, line, code) for number, (line, code) in enumerate(blocks(page), start=1)]
  runs = [numbered] + [[block] for block in numbered[1:]]
  workers = min(len(runs), os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    results = pool.map(lambda k: _run(_name(page), runs[k], directory / f"run{k}"), range(len(runs)))
    return [failure for failure in results if failure is not None]


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


def test_what_the_runs_catch(tmp_path):
  """A block that needs an earlier one fails alone; a broken promise and a page out of order fail."""
  pages = {
    "needs_an_earlier_block": "```python\nx = 41\n```\n\n```python\nprint(x + 1)  # 42\n```\n",
    "breaks_a_promise": "```python\nx = 41\n```\n\n```python\nx = 41\nprint(x)  # 42\n```\n",
    "out_of_order": (
      "```python\nimport os\nos.environ['MODE'] = 'a'\n```\n\n"
      "```python\nimport os\nprint(os.environ.setdefault('MODE', 'b'))  # b\n```\n"
    ),
    "complete": "```python\nx = 41\nprint(x + 1)  # 42\n```\n\n```python\nprint(2)  # 2\n```\n",
  }
  failures = {}
  for name, text in pages.items():
    (tmp_path / f"{name}.md").write_text(text)
    failures[name] = page_failures(tmp_path / f"{name}.md", tmp_path / name)
  assert [f.split(":")[0] for f in failures["needs_an_earlier_block"]] == [
    "needs_an_earlier_block.md, block 2 (line 5) alone"
  ]
  assert "NameError: name 'x' is not defined" in failures["needs_an_earlier_block"][0]
  assert [f.split(":")[0] for f in failures["breaks_a_promise"]] == [
    "breaks_a_promise.md, in sequence",
    "breaks_a_promise.md, block 2 (line 5) alone",
  ]
  assert "printed ['41'], the page promises ['42']" in failures["breaks_a_promise"][1]
  assert [f.split(":")[0] for f in failures["out_of_order"]] == ["out_of_order.md, in sequence"]
  assert failures["complete"] == []


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_page_runs_as_printed(page, tmp_path):
  """The page top to bottom in one process, and each of its blocks alone in a fresh one."""
  failures = page_failures(page, tmp_path)
  assert not failures, "\n\n".join(failures)


# -- Install lines ------------------------------------------------------------
# onnx_optax is installed from a clone (`pip install ".[extra]"`); it is on no
# package index, so `pip install onnx_optax[...]` fails for a reader.
INSTALL_PAGES = [
  *PAGES,
  ROOT / "notebooks" / "README.md",
  ROOT / "CONTRIBUTING.md",
]
# The arguments of one `pip install`, up to the end of the command: a shell
# separator, a comment, a line continuation or the end of inline code.
PIP_INSTALL = re.compile(r"pip install((?:[ \t]+[^\s`#;|&\\]+)*)")
# This project as a requirement: the clone (`.`, `./`, `-e .`) or its name.
THIS_PROJECT = re.compile(r"^(?P<what>\.|\./|onnx[_-]optax)(?:\[(?P<extras>[^\]]*)\])?$")


def _extras() -> dict[str, list[str]]:
  import tomllib

  return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def install_problems(text: str, extras: set[str]) -> tuple[list[str], int]:
  """What is wrong with the `pip install` lines of ``text``, and how many name this project."""
  import shlex

  problems, ours = [], 0
  for line_number, line in enumerate(text.splitlines(), start=1):
    for match in PIP_INSTALL.finditer(line):
      for token in shlex.split(match.group(1)):
        found = THIS_PROJECT.match(token)
        if not found:
          continue
        ours += 1
        if found["what"] not in (".", "./"):
          problems.append(f'line {line_number}: {token!r} is on no package index: pip install ".[...]"')
        unknown = sorted({e.strip() for e in (found["extras"] or "").split(",") if e.strip()} - extras)
        if unknown:
          problems.append(f"line {line_number}: {token!r} names extras pyproject.toml lacks: {unknown}")
  return problems, ours


def test_install_lines_work_from_a_clone():
  """Every `pip install` of this project installs the clone with extras pyproject.toml has."""
  extras = set(_extras())
  problems, counts = [], {}
  for page in INSTALL_PAGES:
    found, counts[_name(page)] = install_problems(page.read_text(), extras)
    problems += [f"{_name(page)}, {problem}" for problem in found]
  assert not problems, "\n".join(problems)
  # The pattern finds the install lines it checks (a broken one would find none).
  assert all(counts[n] for n in ("README.md", "CONTRIBUTING.md", "notebooks/README.md", "docs/interop.md"))


def test_the_install_check_catches_a_wrong_line():
  """An index install, an unknown extra, quoted or inline, is caught; third parties' extras are not ours."""
  extras = {"onnx", "interop"}
  wrong = "\n".join(
    [
      'pip install "onnx_optax[interop]"',
      "`pip install onnx_optax[onnx]`",
      'pip install -e ".[onnx,no]" && y',
    ]
  )
  problems, ours = install_problems(wrong, extras)
  assert [p.split(":")[0] for p in problems] == ["line 1", "line 2", "line 3"]
  assert "['no']" in problems[2] and ours == 3
  right = 'pip install ".[onnx]"  # not .[no]\npip install -q "jax[tpu]" onnx\npip install -e .\n'
  assert install_problems(right, extras) == ([], 2)


def test_the_client_examples_name_their_extra():
  """The pages whose examples run Hugging Face's Trainer or Lightning install the `clients` extra.

  That extra holds every client those examples import, and the `test` extra (which runs
  them) includes it.
  """
  extras = _extras()
  names = {re.split(r"[\s=<>\[;~!]", r, maxsplit=1)[0].lower() for r in extras["clients"]}
  assert {"transformers", "accelerate", "safetensors", "lightning"} <= names
  assert any(re.fullmatch(r"onnx_optax\[[\w,]*\bclients\b[\w,]*\]", r) for r in extras["test"])
  clients = re.compile(r"^\s*(?:import|from)\s+[^\n]*\b(transformers|lightning|safetensors)\b", re.M)
  pages = [page for page in PAGES if any(clients.search(code) for _, code in blocks(page))]
  assert "docs/interop.md" in {_name(page) for page in pages}
  install = re.compile(r"pip install[^\n`#]*[\"']?\.\[[^\]]*\bclients\b")
  assert all(install.search(page.read_text()) for page in pages), [_name(p) for p in pages]


def test_the_interop_page_lists_every_torch_optim_class():
  """docs/interop.md's table of `torch.optim`'s classes has one row per optimizer class PyTorch
  ships, and says of each what the registry says: the twin a bound class is carried onto
  (`onnx_optax.<twin>`), refused otherwise. A class bound or unbound without its row changed
  fails here."""
  torch = pytest.importorskip("torch", reason="torch is in the test extra")
  from onnx_optax import registry

  shipped = {
    name
    for name in dir(torch.optim)
    if isinstance(getattr(torch.optim, name), type)
    and issubclass(getattr(torch.optim, name), torch.optim.Optimizer)
    and name != "Optimizer"
  }
  bound = {b.name: rule.name for rule in registry.rules() if (b := rule.binding("torch")) is not None}
  text = (ROOT / "docs" / "interop.md").read_text()
  section = text.split("## Every `torch.optim` class", 1)[1].split("\n## ", 1)[0]
  rows = dict(re.findall(r"^\| `torch\.optim\.(\w+)` \| ([^|]+) \|", section, flags=re.M))
  assert set(rows) == shipped, sorted(set(rows) ^ shipped)
  for name, cell in rows.items():
    if name in bound:
      assert f"`onnx_optax.{bound[name]}`" in cell, (name, cell)
    else:
      assert cell.strip().startswith("refused"), (name, cell)


def test_the_api_page_documents_every_public_name():
  """docs/api/onnx_optax.rst has an ``autofunction`` or ``autoclass`` for each name in
  ``onnx_optax.__all__``: a rule exported without its entry (or an entry for a name that is
  gone) fails here."""
  import onnx_optax

  text = (ROOT / "docs" / "api" / "onnx_optax.rst").read_text()
  documented = set(re.findall(r"^\.\. auto(?:function|class):: onnx_optax\.(\w+)$", text, flags=re.M))
  assert documented == set(onnx_optax.__all__), sorted(documented ^ set(onnx_optax.__all__))
