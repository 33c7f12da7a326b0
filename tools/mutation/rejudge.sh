#!/usr/bin/env bash
# Judges the survivors of an earlier mutation run again, on REV (default HEAD):
# the same mutants (module, operator, changed line) after the tests that kill
# them landed. Usage:
#
#   bash tools/mutation/rejudge.sh OLD_SHARD.sqlite... [-- REV]
#
# Environment as run.sh (SHARDS, WORK, RESULTS default
# tools/mutation/rejudged.md).
set -euo pipefail
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
OLD=()
while [[ $# -gt 0 && $1 != -- ]]; do OLD+=("$(realpath "$1")"); shift; done
[[ ${1:-} == -- ]] && shift
# run.sh with the survivor filter: the same export, baseline, shards and report.
SURVIVORS_OF=$(printf '%s\n' "${OLD[@]}") \
  RESULTS=${RESULTS:-$REPO/tools/mutation/rejudged.md} \
  WORK=${WORK:-$(mktemp -d /tmp/onnx_optax-rejudge.XXXXXX)} \
  exec bash "$REPO/tools/mutation/run.sh" "${1:-HEAD}"
