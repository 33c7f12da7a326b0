#!/usr/bin/env bash
# Judges the survivors of an earlier mutation run again, on REV (default HEAD):
# the same mutants (module, operator, changed line) after the tests that kill
# them landed. Usage:
#
#   bash benchmarks/mutation/rejudge.sh OLD_SHARD.sqlite... [-- REV]
#
# Environment as run.sh (SHARDS, WORK, RESULTS default
# benchmarks/mutation/rejudged.md).
set -euo pipefail
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
OLD=()
while [[ $# -gt 0 && $1 != -- ]]; do OLD+=("$(realpath "$1")"); shift; done
[[ ${1:-} == -- ]] && shift
REV=${1:-HEAD}
SHARDS=${SHARDS:-1}
WORK=${WORK:-$(mktemp -d /tmp/onnx_optax-rejudge.XXXXXX)}
RESULTS=${RESULTS:-$REPO/benchmarks/mutation/rejudged.md}
COMMIT=$(git -C "$REPO" rev-parse --short "$REV")
mkdir -p "$WORK/tree"
git -C "$REPO" archive "$REV" | tar -x -C "$WORK/tree"
cd "$WORK/tree"
PYTHONPATH=$PWD python -c "import onnx_optax, os, sys; sys.exit(not onnx_optax.__file__.startswith(os.getcwd()))"
cosmic-ray init benchmarks/mutation/cosmic-ray.toml "$WORK/session.sqlite"
python benchmarks/mutation/filter.py "$WORK/session.sqlite"
python benchmarks/mutation/filter.py "$WORK/session.sqlite" --only-survivors-of "${OLD[@]}"
start=$(date +%s)
# The baseline (the judge on the unmutated tree) runs beside the shards: if it
# fails, every "killed" below means nothing.
(cd "$WORK/tree" && bash benchmarks/mutation/judge.sh > "$WORK/baseline.log" 2>&1; echo $? > "$WORK/baseline.rc") &
pids=($!)
for ((k = 0; k < SHARDS; k++)); do
  cp -r "$WORK/tree" "$WORK/shard-$k"
  cp "$WORK/session.sqlite" "$WORK/shard-$k.sqlite"
  python benchmarks/mutation/filter.py "$WORK/shard-$k.sqlite" --shard "$k/$SHARDS" > /dev/null
  (cd "$WORK/shard-$k" && cosmic-ray exec benchmarks/mutation/cosmic-ray.toml "$WORK/shard-$k.sqlite" \
     > "$WORK/shard-$k.log" 2>&1) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
wall=$(( $(date +%s) - start ))
python benchmarks/mutation/report.py --commit "$COMMIT" --wall "$wall" --shards "$SHARDS" \
  "$WORK"/shard-*.sqlite > "$RESULTS"
echo "report: $RESULTS"
if [[ $(cat "$WORK/baseline.rc") != 0 ]]; then
  echo "BASELINE FAILED: the unmutated tree fails the judge, see $WORK/baseline.log"; exit 1
fi
echo "baseline passed"
