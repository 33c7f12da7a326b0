"""The mutation run's report, in Markdown, from one or more cosmic-ray sessions.

Usage: python tools/mutation/report.py [--commit C] [--wall S] [--baseline S]
       [--shards N] SESSION.sqlite...

The sessions are the shards of one run (tools/mutation/run.sh): each job
was judged in exactly one of them and skipped ("other shard") in the others.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.metadata
import re
import sqlite3

OTHER_SHARD = "other shard"


def load(paths):
  jobs = {}
  for path in paths:
    con = sqlite3.connect(path)
    rows = con.execute(
      "SELECT m.job_id, m.module_path, m.operator_name, m.occurrence, m.start_pos_row, m.start_pos_col, "
      "r.worker_outcome, r.test_outcome, r.output, r.diff FROM mutation_specs m "
      "LEFT JOIN work_results r ON r.job_id = m.job_id"
    )
    for job_id, module, op, occ, row, col, worker, test, output, diff in rows:
      if output and output.startswith(OTHER_SHARD):
        continue
      if job_id in jobs and jobs[job_id]["worker"] is not None and worker is None:
        continue
      jobs[job_id] = dict(
        module=module,
        op=op.removeprefix("core/"),
        occ=occ,
        row=row,
        col=col,
        worker=worker and worker.lower(),
        test=test and test.lower(),
        output=output or "",
        diff=diff or "",
      )
  return jobs


def status(job):
  if job["worker"] is None:
    return "pending"
  if job["worker"] == "skipped":
    return "skipped"
  if job["worker"] == "timeout":
    return "killed"  # cosmic-ray: a judge that runs past the timeout kills the mutant
  return job["test"] or job["worker"]


def changed_lines(diff):
  minus = [l[1:].strip() for l in diff.splitlines() if l.startswith("-") and not l.startswith("---")]
  plus = [l[1:].strip() for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
  return " / ".join(minus), " / ".join(plus)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("sessions", nargs="+")
  parser.add_argument("--commit", default="?")
  parser.add_argument("--wall", type=int)
  parser.add_argument("--baseline", type=int)
  parser.add_argument("--shards", type=int, default=1)
  args = parser.parse_args()
  jobs = load(args.sessions)
  counts = collections.Counter(status(j) for j in jobs.values())
  judged = [j for j in jobs.values() if status(j) in ("killed", "survived", "incompetent")]
  killed = counts["killed"]
  survived = [j for j in jobs.values() if status(j) == "survived"]
  stage = collections.Counter()
  for j in judged:
    if status(j) == "killed":
      m = re.search(r"JUDGE: caught in stage (\d)", j["output"])
      stage["timeout" if j["worker"] == "timeout" else (m.group(1) if m else "?")] += 1
  skip_reasons = collections.Counter(
    j["output"].removeprefix("skipped: ") for j in jobs.values() if status(j) == "skipped"
  )

  p = print
  p("# Mutation run: results")
  p()
  p(
    f"- commit: `{args.commit}`; cosmic-ray {importlib.metadata.version('cosmic-ray')}; "
    f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
  )
  if args.wall is not None:
    p(
      f"- wall time: {args.wall} s for the mutants ({args.shards} shard(s) in parallel)"
      + (f", {args.baseline} s for the baseline judge" if args.baseline else "")
    )
  p(
    f"- mutants generated: {len(jobs)}; skipped by filter.py: {counts['skipped']}; judged: {len(judged)}"
    + (f"; NOT YET JUDGED: {counts['pending']}" if counts["pending"] else "")
  )
  for reason, n in sorted(skip_reasons.items()):
    p(f"  - skipped, {reason}: {n}")
  p(
    f"- killed: {killed} (judge stage 1: {stage['1']}, stage 2: {stage['2']}, stage 3: {stage['3']}, "
    f"timeout: {stage['timeout']}, unknown: {stage['?']}); survived: {len(survived)}; "
    f"incompetent: {counts['incompetent']}"
  )
  if killed + len(survived):
    total = killed + len(survived)
    p(f"- **mutation score: {killed}/{total} = {100 * killed / total:.1f}%** (killed / (killed + survived))")
  p()
  p("| module | judged | killed | survived |")
  p("|---|---:|---:|---:|")
  for module in sorted({j["module"] for j in jobs.values()}):
    js = [j for j in judged if j["module"] == module]
    p(
      f"| {module} | {len(js)} | {sum(status(j) == 'killed' for j in js)} | "
      f"{sum(status(j) == 'survived' for j in js)} |"
    )
  p()
  p("## Surviving mutants")
  p()
  p("Verdicts (equivalent, or the test that now kills it): tools/mutation/LOG.md.")
  p()
  p("| module:line | operator | before | after |")
  p("|---|---|---|---|")
  for j in sorted(survived, key=lambda j: (j["module"], j["row"], j["col"], j["op"])):
    before, after = changed_lines(j["diff"])
    p(f"| {j['module']}:{j['row']} | {j['op']} | `{before}` | `{after}` |")


if __name__ == "__main__":
  main()
