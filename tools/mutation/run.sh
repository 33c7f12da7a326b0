#!/usr/bin/env bash
# The mutation run of docs/mutation.md, end to end, on a copy of the tree.
#
#   bash tools/mutation/run.sh [REV]      (REV: a commit, default HEAD)
#
# From a fresh clone: python3 -m venv .venv && . .venv/bin/activate &&
# pip install -e ".[test,mutation]" && bash tools/mutation/run.sh
#
# cosmic-ray edits the modules it mutates in place, so the run never touches
# the working tree: it exports REV (git archive) into $WORK and mutates there.
# Environment: SHARDS (default 1) copies judged in parallel, one mutant at a
# time each; WORK (default a new /tmp directory); MODULES: the modules (or
# folders) to mutate, separated by blanks, default cosmic-ray.toml's
# module-path (all of them); SKIP_BASELINE=1 skips the judge on the unmutated
# tree; FAST_TESTS, CONFORMANCE_ARGS: see judge.sh;
# SURVIVORS_OF: shard databases of an earlier run (one path per line) whose
# survivors are the only mutants judged (rejudge.sh sets it); RESUME=1 with
# the WORK of an interrupted run judges its pending mutants (cosmic-ray exec
# skips the judged ones) and writes the report of the whole run;
# CHANGED_SINCE="path=REV ..." (or a bare REV for every module): the
# incremental run, only the mutants on lines changed since each module's REV
# (the commit of its last complete run) are judged, see filter.py.
# Writes the report to tools/mutation/results.md (RESULTS overrides).
set -euo pipefail
# The whole script is one block, read before it runs: bash reads a script as it
# goes, and an edit of this file during an hour-long run would otherwise be
# executed from the middle (it happened: the report step read garbage).
{
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
REV=${1:-HEAD}
SHARDS=${SHARDS:-1}
WORK=${WORK:-$(mktemp -d /tmp/onnx_optax-mutation.XXXXXX)}
RESULTS=${RESULTS:-$REPO/tools/mutation/results.md}
COMMIT=$(git -C "$REPO" rev-parse --short "$REV")

if [[ ${RESUME:-0} == 1 ]]; then
  COMMIT=$(cat "$WORK/commit")
  echo "resuming the run of $COMMIT: $(ls -d "$WORK"/shard-*.sqlite | wc -l) shard(s), SHARDS ignored"
  cd "$WORK/tree"
  export MODULES=${MODULES:-} MUTATION_PRISTINE=$WORK/tree
  start=$(date +%s)
  pids=()
  for db in "$WORK"/shard-*.sqlite; do
    k=$(basename "$db" .sqlite)
    # An interrupted cosmic-ray may have left its last mutant in the copy.
    rm -rf "${WORK:?}/$k/onnx_optax" && cp -r "$WORK/tree/onnx_optax" "$WORK/$k/"
    (cd "$WORK/$k" && cosmic-ray exec "$WORK/cosmic-ray.toml" "$db" >> "$WORK/$k.log" 2>&1) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  wall=$(( $(date +%s) - start ))
  python tools/mutation/report.py --commit "$COMMIT" --wall "$wall" \
    --shards "$(ls -d "$WORK"/shard-*.sqlite | wc -l)" "$WORK"/shard-*.sqlite > "$RESULTS"
  echo "report (wall time: the resumed part only): $RESULTS"
  sed -n '1,/^## Surviving/p' "$RESULTS"
  exit 0
fi
echo "mutation run of $COMMIT in $WORK, $SHARDS shard(s)"
mkdir -p "$WORK/tree"
echo "$COMMIT" > "$WORK/commit"
git -C "$REPO" archive "$REV" | tar -x -C "$WORK/tree"
cd "$WORK/tree"
# The judge must see this copy's onnx_optax, not an installed (editable) one.
PYTHONPATH=$PWD python -c "import onnx_optax, os, sys; sys.exit(not onnx_optax.__file__.startswith(os.getcwd()))"

CONFIG=$WORK/cosmic-ray.toml
cp tools/mutation/cosmic-ray.toml "$CONFIG"
if [[ -n ${MODULES:-} ]]; then
  python - "$CONFIG" "$MODULES" <<'PY'
import re, sys
path, modules = sys.argv[1], sys.argv[2].split()
text = open(path).read()
paths = ", ".join(f'"{m}"' for m in modules)
text, n = re.subn(r"module-path = \[[^\]]*\]", f"module-path = [{paths}]", text)
assert n == 1, "no module-path in cosmic-ray.toml"
open(path, "w").write(text)
PY
fi
grep -A8 "^module-path" "$CONFIG" | sed "/^excluded/,$ d"
export MODULES=${MODULES:-}
# judge.sh finds the mutated module by comparing a shard with this unmutated copy.
export MUTATION_PRISTINE=$WORK/tree
cosmic-ray init "$CONFIG" "$WORK/session.sqlite"
python tools/mutation/filter.py "$WORK/session.sqlite"
if [[ -n ${CHANGED_SINCE:-} ]]; then
  python tools/mutation/filter.py "$WORK/session.sqlite" --changed-since "$REPO" "$COMMIT" "$CHANGED_SINCE"
fi
if [[ -n ${SURVIVORS_OF:-} ]]; then
  mapfile -t OLD <<< "$SURVIVORS_OF"
  python tools/mutation/filter.py "$WORK/session.sqlite" --only-survivors-of "${OLD[@]}"
fi

start=$(date +%s)
pids=()
if [[ ${SKIP_BASELINE:-0} != 1 ]]; then
  # The baseline (the judge on the unmutated tree) runs beside the shards: if it
  # fails, every "killed" below means nothing.
  (cd "$WORK/tree" && bash tools/mutation/judge.sh > "$WORK/baseline.log" 2>&1; echo $? > "$WORK/baseline.rc") &
  pids+=($!)
fi
for ((k = 0; k < SHARDS; k++)); do
  cp -r "$WORK/tree" "$WORK/shard-$k"
  cp "$WORK/session.sqlite" "$WORK/shard-$k.sqlite"
  python tools/mutation/filter.py "$WORK/shard-$k.sqlite" --shard "$k/$SHARDS" > /dev/null
  (cd "$WORK/shard-$k" && cosmic-ray exec "$CONFIG" "$WORK/shard-$k.sqlite" \
     > "$WORK/shard-$k.log" 2>&1) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
wall=$(( $(date +%s) - start ))

python tools/mutation/report.py --commit "$COMMIT" --wall "$wall" --shards "$SHARDS" \
  "$WORK"/shard-*.sqlite > "$RESULTS"
echo "report: $RESULTS"
sed -n '1,/^## Surviving/p' "$RESULTS"
if [[ ${SKIP_BASELINE:-0} != 1 ]]; then
  if [[ $(cat "$WORK/baseline.rc") != 0 ]]; then
    echo "BASELINE FAILED: the unmutated tree fails the judge, see $WORK/baseline.log"; exit 1
  fi
  echo "baseline passed"
fi
exit 0
}
