"""Sphinx configuration of the onnx_optax API reference site.

Build (from the repository root, warnings are errors)::

    python -m sphinx -E -W --keep-going -b html docs docs/_build/html

``-E`` re-reads every page: an incremental build reports the warnings of the
pages it re-reads only, so a stale docs/_build would pass a broken page.
``--keep-going`` lists every warning before failing.

The Markdown pages of ``docs/`` are read by myst-parser; the API pages
(``docs/api/``) are generated from the docstrings by autodoc and napoleon.
The build reads no network: no intersphinx, and references to JAX, Optax,
NumPy and onnx objects in signatures stay plain text (see ``nitpick_ignore``).
"""

from __future__ import annotations

import importlib
import os
import re
import sys

# The package from this checkout, also when it is not installed (a fresh clone
# building the docs before `pip install -e .`).
sys.path.insert(0, os.path.abspath(".."))

project = "onnx_optax"
author = "onnx_optax contributors"
copyright = "onnx_optax contributors"
release = importlib.import_module("onnx_optax").__version__
version = release

extensions = [
  "myst_parser",
  "sphinx.ext.autodoc",
  "sphinx.ext.napoleon",
  "sphinx.ext.mathjax",
  "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# Raw outputs next to the reports (JSON, HLO dumps, pytest logs) are linked as
# downloads, not read as pages; the build directory is never a source.
exclude_patterns = ["_build", "**/*.json", "**/*.txt"]

# -- autodoc / napoleon ------------------------------------------------------
autodoc_default_options = {
  "members": True,
  "member-order": "bysource",
  "show-inheritance": True,
}
# Public modules list what they export in __all__; autodoc documents exactly
# that (and the module docstring), so private helpers stay off the site.
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
# The learning-rate type reads as its name, not as optax.Schedule's expansion.
autodoc_type_aliases = {
  "ScalarOrSchedule": "onnx_optax.transforms.ScalarOrSchedule",
  "transforms.ScalarOrSchedule": "onnx_optax.transforms.ScalarOrSchedule",
  "_engine.ScalarOrSchedule": "onnx_optax.transforms.ScalarOrSchedule",
}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Every Python cross-reference must resolve: a renamed function that a
# docstring still cites fails the build. Targets of other projects cannot be
# resolved without intersphinx (which needs the network); they are listed here
# by package, never this project's own names.
nitpicky = True
nitpick_ignore_regex = [
  (r"py:.*", r"(jax|jaxlib|optax|numpy|np|onnx|ml_dtypes|flax|torch|keras)(\..*)?"),
  (r"py:.*", r"(collections\.abc|typing|decimal|pathlib|os)\..*"),
  (r"py:.*", r"(Array|ArrayLike|NodeProto|Any|Callable|Sequence|Iterable|Mapping|NamedTuple)"),
]

# -- myst ---------------------------------------------------------------------
# No syntax extensions: the pages are plain CommonMark plus tables, and read
# the same on a code host ("$" is a dollar sign, not math).
myst_enable_extensions: list[str] = []
# Links to "page.md#a-section" resolve to the section's generated anchor.
myst_heading_anchors = 3

# -- HTML ---------------------------------------------------------------------
html_theme = "furo"
html_title = f"onnx_optax {release}"
html_static_path: list[str] = []


# -- Generated reports --------------------------------------------------------
# benchmarks/run.py writes its Markdown report without a heading, so the page
# would have no title and no entry in the navigation. Until the generator
# writes one, the site gives those pages the titles below; a report
# that starts with a heading is left as it is.
_REPORT_TITLES = {
  "benchmarks/steps_cpu": "Step time: CPU (raw output of benchmarks/run.py)",
  "benchmarks/steps_gpu": "Step time: NVIDIA H100 (raw output of benchmarks/run.py)",
}


def _title_reports(app, docname: str, source: list[str]) -> None:
  title = _REPORT_TITLES.get(docname)
  if title and not source[0].lstrip().startswith("#"):
    source[0] = f"# {title}\n\n{source[0]}"


# -- Links to repository files outside docs/ -----------------------------------
# The pages of docs/ also read well on a code host, where they link to files of
# the repository: ../README.md, ../notebooks/*.ipynb, ../benchmarks/run.py.
# myst-parser makes a link to an existing file that is not a page of the site
# a download (the file is copied into the site), but a link to a Markdown file
# outside docs/ is taken for a page and fails as an unknown document. Those
# become downloads too, like every other repository file outside docs/. A link
# to a file that does not exist still fails the build.


def _outside_docs_as_downloads(app, doctree) -> None:
  from sphinx import addnodes

  srcdir = os.path.realpath(app.srcdir)
  docdir = os.path.dirname(app.env.doc2path(app.env.docname))
  for node in list(doctree.findall(addnodes.pending_xref)):
    if node.get("reftype") != "myst" or node.get("refdomain") != "doc":
      continue
    target = node["reftarget"]
    if target in app.env.found_docs:
      continue
    # myst gives a page outside the source directory a docname that is its
    # path without the suffix; find the file it names.
    candidates = [
      os.path.normpath(os.path.join(srcdir, target + suffix)) for suffix in app.config.source_suffix
    ]
    path = next((c for c in candidates if os.path.isfile(c)), None)
    if path is None or os.path.realpath(path).startswith(srcdir + os.sep):
      continue
    download = addnodes.download_reference(
      refdomain=None,
      reftype="myst",
      refdoc=node["refdoc"],
      refexplicit=True,
      reftarget=os.path.relpath(path, docdir),
    )
    content = node[0].deepcopy()
    content["classes"] = ["xref", "download", "myst"]
    download += content
    node.replace_self(download)


# -- NamedTuple fields ----------------------------------------------------------
# A NamedTuple's fields carry Python's generated docstring "Alias for field
# number N". The field stays listed (its name is the state's or the scalar's
# name in docs/spec.md), without that text.


def _drop_generated_field_docs(app, what, name, obj, options, lines):
  if (
    what in ("attribute", "property")
    and len(lines) <= 2
    and lines
    and re.fullmatch(r"Alias for field number \d+", lines[0].strip())
  ):
    lines.clear()


# -- Re-exported names ----------------------------------------------------------
# The package documents its functions under the names users call
# (onnx_optax.adam, onnx_optax.interop.from_torch), while a docstring in the
# defining module cites them by their local name (:func:`to_keras` in
# onnx_optax.interop.keras). autodoc records that alias for classes only; for
# a function, a reference that does not resolve is looked up again by the
# Python object it names: if that very function or class is documented under
# another name, the reference goes there (an attribute reference, Case.field
# in a module that imports Case, goes to the field of the documented class).
# A name that names nothing documented still fails the build.


def _import_object(name: str):
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    try:
      for attr in parts[i:]:
        obj = getattr(obj, attr)
    except AttributeError:
      return None
    return obj
  return None


def _resolve_reexports(app, env, node, contnode):
  import inspect

  if node.get("refdomain") != "py" or not node.get("reftarget"):
    return None
  target, module = node["reftarget"].lstrip("~."), node.get("py:module")
  parts = target.split(".")
  # The longest prefix of the target that names a function or class (an
  # attribute reference such as Case.unchecked_limit keeps its tail).
  for i in range(len(parts), 0, -1):
    prefix, rest = ".".join(parts[:i]), parts[i:]
    names = ([f"{module}.{prefix}"] if module else []) + [prefix]
    obj = next((o for o in map(_import_object, names) if o is not None), None)
    if inspect.isfunction(obj) or inspect.isclass(obj):
      break
  else:
    return None
  domain = env.get_domain("py")
  for documented in list(domain.objects):
    if documented.startswith("onnx_optax") and _import_object(documented) is obj:
      return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], ".".join([documented, *rest]), node, contnode
      )
  return None


def setup(app):
  app.connect("missing-reference", _resolve_reexports)
  app.connect("source-read", _title_reports)
  app.connect("autodoc-process-docstring", _drop_generated_field_docs)
  # Before the environment collects the downloads of the page (priority 500).
  app.connect("doctree-read", _outside_docs_as_downloads, priority=400)
