"""Skips the mutants the mutation run does not judge (a cosmic-ray filter).

Usage: python tools/mutation/filter.py SESSION.sqlite [--shard K/N]

With ``--shard K/N`` it instead skips every pending job but the K-th of each N
(in job-id order), so that N copies of the tree judge disjoint parts.

With ``--only-survivors-of OLD.sqlite...`` it skips every pending job but the
mutants that survived in the OLD sessions (a run on an earlier commit): the
same module, operator and changed source line, wherever the line has moved.
``rejudge.sh`` uses it to judge a run's survivors again on a later commit.

With ``--changed-since REPO COMMIT SPEC`` it skips every pending mutant whose
source lines are all unchanged between an earlier commit and COMMIT (the one
being mutated), per module: SPEC is ``path=REV ...`` (a bare ``REV`` for
every module), REV the commit of that module's last complete run. It is the
incremental run (run.sh's ``CHANGED_SINCE``): the mutants of unchanged lines
were judged there, by tests that have only grown since.

cosmic-ray generates every replacement of every operator (4137 mutants over
the modules of cosmic-ray.toml at c4fd2b4, 1912 over rules.py, transforms.py
and reference.py at 0d0e577): an addition becomes each of ten
other binary operators, most of which (the bit operators, ``//``, ``%``) only
raise a TypeError on floats or repeat what one replacement already asks. The
judge is minutes long on a shared machine, so the run keeps one replacement per
site, the one that asks whether the test suite notices the operation at all:

* arithmetic: ``+ -> -``, ``- -> +``, ``* -> /``, ``/ -> *``, ``** -> *``;
* comparisons: the boundary (``> -> >=``, ``< -> <=``, ``>= -> >``,
  ``<= -> <``) and the negation (``== -> !=``, ``!= -> ==``, ``is -> is not``,
  ``is not -> is``);
* numbers: ``n -> n + 1`` (one of cosmic-ray's two offsets);
* ``-x -> x`` and ``not x -> x`` (dropping the operator), ``x -> not x``
  (AddNot), ``True <-> False``, ``and <-> or``, a removed decorator
  (``jax.custom_jvp``), a loop that runs zero times.

Skipped as well, whatever the operator: a mutation inside a type annotation
(every module has ``from __future__ import annotations``, so an annotation is
a string that nothing evaluates: ``Array | None`` mutated is equivalent) and
inside the module-level type aliases (``ScalarOrSchedule = float | Array |
optax.Schedule``, ``Scalars = TypeVar(...)``), used only in annotations.
Docstrings and ``__all__`` are strings and lists of strings, which no
operator of this set mutates.
"""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

KEEP = {
  "core/ReplaceBinaryOperator_Add_Sub",
  "core/ReplaceBinaryOperator_Sub_Add",
  "core/ReplaceBinaryOperator_Mul_Div",
  "core/ReplaceBinaryOperator_Div_Mul",
  "core/ReplaceBinaryOperator_Pow_Mul",
  "core/ReplaceComparisonOperator_Gt_GtE",
  "core/ReplaceComparisonOperator_Lt_LtE",
  "core/ReplaceComparisonOperator_GtE_Gt",
  "core/ReplaceComparisonOperator_LtE_Lt",
  "core/ReplaceComparisonOperator_Eq_NotEq",
  "core/ReplaceComparisonOperator_NotEq_Eq",
  "core/ReplaceComparisonOperator_Is_IsNot",
  "core/ReplaceComparisonOperator_IsNot_Is",
  "core/ReplaceUnaryOperator_Delete_USub",
  "core/ReplaceUnaryOperator_Delete_Not",
  "core/AddNot",
  "core/ReplaceTrueWithFalse",
  "core/ReplaceFalseWithTrue",
  "core/ReplaceAndWithOr",
  "core/ReplaceOrWithAnd",
  "core/RemoveDecorator",
  "core/ZeroIterationForLoop",
  "core/NumberReplacer",  # even occurrences only: the +1 offset
}
TYPE_ALIASES = {"ScalarOrSchedule", "Scalars"}


def annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
  """(start, end) positions, (line, column), of every annotation and type alias."""
  tree = ast.parse(path.read_text())
  spans = []

  def add(node):
    if node is not None:
      spans.append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)))

  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      args = node.args
      for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
          add(a.annotation)
      add(node.returns)
    elif isinstance(node, ast.AnnAssign):
      add(node.annotation)
    elif isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id in TYPE_ALIASES for t in node.targets
    ):
      add(node)
  return spans


def skip_reason(mutation, spans) -> str | None:
  op = mutation.operator_name
  if op not in KEEP:
    return "operator not in the run's set"
  if op == "core/NumberReplacer" and mutation.occurrence % 2:
    return "NumberReplacer -1 offset (the run keeps +1)"
  start, end = tuple(mutation.start_pos), tuple(mutation.end_pos)
  # cosmic-ray's columns are parso's (0-based), as ast's col_offset.
  if any(s <= start and end <= e for s, e in spans.get(str(mutation.module_path), [])):
    return "inside a type annotation or type alias"
  return None


def shard(session: str, k: int, n: int) -> None:
  with use_db(session, WorkDB.Mode.open) as db:
    jobs = sorted(item.job_id for item in db.pending_work_items)
    others = [j for i, j in enumerate(jobs) if i % n != k]
    db.set_multiple_results(
      others, WorkResult(output=f"other shard (not {k}/{n})", worker_outcome=WorkerOutcome.SKIPPED)
    )


def _hunk(diff: str) -> tuple[list[str], tuple[str, str]]:
  """A unified diff's context lines, and its removed and added lines, without line numbers."""
  lines = [l for l in diff.split("\n") if l[:1] in " -+" and not l.startswith(("---", "+++"))]
  context = [l.strip() for l in lines if l.startswith(" ")]
  minus = " / ".join(l[1:].strip() for l in lines if l.startswith("-"))
  plus = " / ".join(l[1:].strip() for l in lines if l.startswith("+"))
  return context, (minus, plus)


def _edit(change: tuple[str, str]) -> tuple[tuple[str, str], ...]:
  """The replaced pieces of a changed line (``("*", "/")``), wherever the line was wrapped."""
  import difflib

  minus, plus = change
  ops = difflib.SequenceMatcher(None, minus, plus).get_opcodes()
  return tuple((minus[i1:i2], plus[j1:j2]) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def _around_edit(change: tuple[str, str], k: int = 8) -> tuple[str, str]:
  """The ``k`` characters before and after a changed line's edit, blanks dropped."""
  import difflib

  minus, plus = ("".join(x.split()) for x in change)
  edits = [op for op in difflib.SequenceMatcher(None, minus, plus).get_opcodes() if op[0] != "equal"]
  i1, i2 = edits[0][1], edits[-1][2]
  return minus[max(0, i1 - k) : i1], minus[i2 : i2 + k]


def _rewrapped(old: tuple[str, str], new: tuple[str, str]) -> bool:
  """Whether two changed lines read the same around their edit, as far as both go (a line
  wrapped or joined since)."""
  (b1, a1), (b2, a2) = _around_edit(old), _around_edit(new)
  return (b1.endswith(b2) or b2.endswith(b1)) and (a1.startswith(a2) or a2.startswith(a1))


def only_survivors_of(session: str, old_sessions: list[str]) -> None:
  """Keeps, for each survivor of the old sessions, the pending mutant of the same module and
  operator that changes the same line the same way; among several (``*,`` is on many lines),
  the one whose surrounding lines match best. A survivor whose line was rewrapped since is
  matched by its function and its edit (``*`` to ``/`` in ``adagrad_scalars``)."""
  import difflib
  import sqlite3

  from cosmic_ray.mutating import mutate_code
  from cosmic_ray.plugins import get_operator

  wanted = []
  for old in old_sessions:
    con = sqlite3.connect(old)
    for module, op, definition, diff in con.execute(
      "SELECT m.module_path, m.operator_name, m.definition_name, r.diff FROM mutation_specs m "
      "JOIN work_results r ON r.job_id = m.job_id WHERE r.test_outcome = 'SURVIVED'"
    ):
      context, change = _hunk(diff)
      wanted.append((module, op, change, context, definition))
  sources: dict[str, str] = {}
  candidates: dict[int, list[tuple[int, str]]] = {i: [] for i in range(len(wanted))}
  loose: dict[int, list[str]] = {i: [] for i in range(len(wanted))}
  # The pending work items do not carry definition_name; the table does.
  definitions = dict(sqlite3.connect(session).execute("SELECT job_id, definition_name FROM mutation_specs"))
  with use_db(session, WorkDB.Mode.open) as db:
    pending = list(db.pending_work_items)
    for item in pending:
      (m,) = item.mutations
      path = str(m.module_path)
      code = sources.setdefault(path, Path(path).read_text())
      mutated = mutate_code(code, get_operator(m.operator_name)(**(m.operator_args or {})), m.occurrence)
      diff = "\n".join(difflib.unified_diff(code.split("\n"), (mutated or "").split("\n"), lineterm=""))
      context, change = _hunk(diff)
      for i, (w_module, w_op, w_change, w_context, w_definition) in enumerate(wanted):
        if (w_module, w_op, w_change) == (path, m.operator_name, change):
          shared = sum(1 for a, b in zip(context, w_context) if a == b)
          candidates[i].append((shared, item.job_id))
        elif (w_module, w_op, w_definition, _edit(w_change)) == (
          path,
          m.operator_name,
          definitions[item.job_id],
          _edit(change),
        ) and _rewrapped(w_change, change):
          loose[i].append(item.job_id)
    keep: set[str] = set()
    for i, found in candidates.items():
      if not found and len(loose[i]) == 1:
        keep.add(loose[i][0])
        continue
      if not found:
        print(f"not found on this commit: {wanted[i][0]} {wanted[i][1]} {wanted[i][2]}")
        continue
      best = max(shared for shared, _ in found)
      keep.update(job for shared, job in found if shared == best)
    others = [item.job_id for item in pending if item.job_id not in keep]
    db.set_multiple_results(
      others,
      # "skipped: ...", not "other shard": report.py leaves other shards' jobs out of every count, and
      # these were generated all the same (the rejudge of e202de7 reported 1644 generated, not 1912).
      WorkResult(
        output="skipped: not a survivor of the run being re-judged", worker_outcome=WorkerOutcome.SKIPPED
      ),
    )
  print(f"re-judging {len(keep)} mutants for the {len(wanted)} survivors")


def _lines_changed(repo: str, rev: str, commit: str, path: str) -> set[int]:
  """The line numbers, in ``commit``'s version of ``path``, that differ from ``rev``'s."""
  import re
  import subprocess

  diff = subprocess.run(
    ["git", "-C", repo, "diff", "-U0", rev, commit, "--", path], capture_output=True, text=True, check=True
  ).stdout
  lines: set[int] = set()
  for m in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
    start, count = int(m[1]), int(m[2] or 1)
    lines.update(range(start, start + count))
  return lines


def changed_since(session: str, repo: str, commit: str, spec: str) -> None:
  """Skips the pending mutants whose lines are all unchanged since their module's REV."""
  default: str | None = None
  revs: dict[str, str] = {}
  for word in spec.split():
    path, _, given = word.rpartition("=")
    if path:
      revs[path] = given
    else:
      default = given
  changed: dict[str, set[int] | None] = {}
  kept: collections.Counter[str] = collections.Counter()
  with use_db(session, WorkDB.Mode.open) as db:
    unchanged = []
    for item in db.pending_work_items:
      (m,) = item.mutations
      path = str(m.module_path)
      if path not in changed:
        since = revs.get(path, default)
        changed[path] = None if since is None else _lines_changed(repo, since, commit, path)
      lines = changed[path]
      if lines is None or any(row in lines for row in range(m.start_pos[0], m.end_pos[0] + 1)):
        kept[path] += 1
      else:
        unchanged.append(item.job_id)
    db.set_multiple_results(
      unchanged,
      WorkResult(
        output="skipped: line unchanged since the module's last complete run",
        worker_outcome=WorkerOutcome.SKIPPED,
      ),
    )
  for path in sorted(changed):
    since = revs.get(path, default)
    print(f"{path}: {kept[path]} mutants on lines changed since {since or '(all judged)'}")
  print(f"skipped {len(unchanged):5d}: line unchanged since the module's last complete run")


def main(session: str) -> None:
  with use_db(session, WorkDB.Mode.open) as db:
    spans: dict[str, list] = {}
    skipped, kept = [], 0
    for item in db.pending_work_items:
      for m in item.mutations:
        if str(m.module_path) not in spans:
          spans[str(m.module_path)] = annotation_spans(Path(m.module_path))
      reasons = [skip_reason(m, spans) for m in item.mutations]
      if any(reasons):
        skipped.append((item.job_id, next(r for r in reasons if r)))
      else:
        kept += 1
    for reason in sorted({r for _, r in skipped}):
      ids = [j for j, r in skipped if r == reason]
      db.set_multiple_results(
        ids, WorkResult(output=f"skipped: {reason}", worker_outcome=WorkerOutcome.SKIPPED)
      )
      print(f"skipped {len(ids):5d}: {reason}")
    print(f"kept    {kept:5d}")


if __name__ == "__main__":
  if len(sys.argv) >= 4 and sys.argv[2] == "--only-survivors-of":
    only_survivors_of(sys.argv[1], sys.argv[3:])
  elif len(sys.argv) == 6 and sys.argv[2] == "--changed-since":
    changed_since(sys.argv[1], *sys.argv[3:])
  elif len(sys.argv) == 4 and sys.argv[2] == "--shard":
    k, n = map(int, sys.argv[3].split("/"))
    shard(sys.argv[1], k, n)
  else:
    main(sys.argv[1])
