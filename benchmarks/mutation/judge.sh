#!/usr/bin/env bash
# The mutation run's judge: exits 0 when the (mutated) tree passes, non-zero
# when the mutant is caught. Run from the root of the copy being mutated.
#
#   1. tests/test_mutation_kills.py and the doctests of the three mutated
#      modules (pytest -x): fast, kills most mutants in seconds;
#   2. the fast tests, pytest -x, the most sensitive first ($FAST_TESTS);
#   3. the conformance command, python -m onnx_optax.conformance, on the CPU,
#      every rule and dtype, without the 10^6-element cases (--no-large) and
#      ONNX's backend cases (--no-onnx): those compare with ONNX's references,
#      not with onnx_optax.reference, and cost a minute of loading.
# Each stage stops at its first failure; a caught mutant skips the rest.
set -u
export PYTHONPATH="$PWD" PYTHONDONTWRITEBYTECODE=1 JAX_PLATFORMS=cpu
PYTEST=(python -m pytest -x -q -p no:cacheprovider --no-header)
FAST_TESTS=${FAST_TESTS:-"tests/test_bad_input.py tests/test_transforms.py tests/test_directml.py"}
caught() { echo "JUDGE: caught in stage $1"; exit "$1"; }
"${PYTEST[@]}" tests/test_mutation_kills.py onnx_optax/rules.py onnx_optax/transforms.py onnx_optax/reference.py \
  || caught 1
# shellcheck disable=SC2086
"${PYTEST[@]}" $FAST_TESTS || caught 2
# shellcheck disable=SC2086
python -m onnx_optax.conformance --platform cpu --no-large --no-onnx --quiet ${CONFORMANCE_ARGS:-} || caught 3
echo "JUDGE: passed every stage"
