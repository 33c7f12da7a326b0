#!/usr/bin/env bash
# Everything an accelerator run should produce, in one command, into the committed files:
#
#   docs/conformance/<platform>.json, .md      python -m onnx_optax.conformance (the whole grid,
#                                              ONNX's references, the device's measured arithmetic)
#   docs/benchmarks/steps_<platform>.json, .md benchmarks/run.py       (step time per rule and size)
#   docs/benchmarks/scale_<platform>.json, .txt benchmarks/scale.py    (compile time at model scale)
#   docs/benchmarks/flax_<platform>.json, .txt  benchmarks/flax_step.py (a whole Flax NNX step)
#
# On a GPU with PyTorch it also runs tests/test_interop_torch_devices.py (the bridges with the
# optimizer's tensors on the GPU), whose result it prints and writes nothing for.
#
# Usage, from a checkout with onnx_optax, onnx, flax (and torch, off TPUs) installed:
#
#   bash benchmarks/accelerator.sh [cpu|gpu|tpu] [--quick] [--out DIR]
#
# The platform defaults to JAX's default backend. --quick: one rule, small sizes, a few repeats,
# into a temporary folder unless --out is given (a check that everything runs, minutes on a CPU;
# its numbers are not for committing). --out DIR: write DIR/docs/... instead of the checkout's docs/.
# Every step runs even if one before it failed; the exit status is the conformance command's
# (0 passed, 1 a case failed, ...; see docs/conformance.md), or 10 if only a benchmark (or the GPU bridge test) failed.
set -uo pipefail

platform=""
quick=0
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    cpu|gpu|tpu) platform="$1" ;;
    --quick) quick=1 ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (expected cpu, gpu, tpu, --quick, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2
python="${PYTHON:-python}"
if [ -z "$platform" ]; then
  platform="$("$python" -c 'import jax; print(jax.default_backend())')" || exit 3
fi
if [ -z "$out" ]; then
  if [ "$quick" = 1 ]; then out="$(mktemp -d)"; else out="$root"; fi
fi
mkdir -p "$out/docs/conformance" "$out/docs/benchmarks"
conf="$out/docs/conformance/$platform"
bench="$out/docs/benchmarks"

if [ "$quick" = 1 ]; then
  conformance_args=(--rule adam --rule ort_adamw_mode1 --dtype float32 --dtype bfloat16 --no-large)
  steps_args=(--rules adam --sizes 1M --repeats 3)
  scale_args=(--rules adam --trees mix100 --repeats 1 --step-repeats 3)
  flax_args=(--rules adam --repeats 1 --step-repeats 3 --blocks 2)
else
  conformance_args=()
  steps_args=()
  scale_args=()
  flax_args=(--rules adam,momentum)
fi
torch_args=()
if [ "$platform" = tpu ] || ! "$python" -c 'import torch' 2>/dev/null; then
  torch_args=(--no-torch)  # PyTorch has no TPU columns; without torch the JAX columns still run.
fi

echo "== conformance on $platform -> $conf.{json,md}"
"$python" -m onnx_optax.conformance --platform "$platform" --json "$conf.json" --markdown "$conf.md" \
  ${conformance_args[@]+"${conformance_args[@]}"}
status=$?

failed=0
if [ "$platform" = gpu ] && [ ${#torch_args[@]} = 0 ]; then
  echo "== the PyTorch bridges with the optimizer's tensors on the GPU (tests/test_interop_torch_devices.py)"
  "$python" -m pytest tests/test_interop_torch_devices.py -q -rs -p no:cacheprovider || failed=1
fi
echo "== step time -> $bench/steps_$platform.{json,md}"
"$python" benchmarks/run.py --device "$platform" ${torch_args[@]+"${torch_args[@]}"} ${steps_args[@]+"${steps_args[@]}"} \
  --json "$bench/steps_$platform.json" --markdown "$bench/steps_$platform.md" || failed=1
echo "== compile at scale -> $bench/scale_$platform.{json,txt}"
"$python" benchmarks/scale.py --device "$platform" ${scale_args[@]+"${scale_args[@]}"} \
  --json "$bench/scale_$platform.json" --text "$bench/scale_$platform.txt" || failed=1
echo "== whole Flax step -> $bench/flax_$platform.{json,txt}"
"$python" benchmarks/flax_step.py --device "$platform" ${flax_args[@]+"${flax_args[@]}"} \
  --json "$bench/flax_$platform.json" --text "$bench/flax_$platform.txt" || failed=1

echo "== written under $out:"
(cd "$out" && ls -l "docs/conformance/$platform".* docs/benchmarks/*_"$platform".* 2>/dev/null)
echo "conformance exit status $status; benchmarks $([ $failed = 0 ] && echo ok || echo FAILED)"
if [ "$status" != 0 ]; then exit "$status"; fi
if [ "$failed" != 0 ]; then exit 10; fi
exit 0
