#!/usr/bin/env bash
# The mutation run's judge: exits 0 when the (mutated) tree passes, non-zero
# when the mutant is caught. Run from the root of the copy being mutated.
#
# A mutant changes one module; the judge runs only the tests that exercise
# that module, so that a mutant is judged in seconds rather than minutes. It
# finds the module by comparing the copy's onnx_optax/ with the unmutated
# export $MUTATION_PRISTINE (run.sh sets it); when nothing differs (the
# baseline) or MUTATION_PRISTINE is unset, it runs the stages of every
# module of $MODULES (run.sh's list; default all).
#
# Stages per module (pytest -x; each stage stops at its first failure, a
# caught mutant skips the rest):
#   rules.py, transforms.py, reference.py:
#     1. the fast tests of every term ($KILLS: the rules' values against the
#        reference, their derivatives, the keyword-only table, the input
#        checks' edges, the ONNX calls) and the three modules' doctests;
#     2. the fast tests ($FAST_TESTS, the most sensitive first);
#     3. the conformance command on the CPU, every rule and dtype, without
#        the 10^6-element cases (--no-large) and ONNX's backend cases
#        (--no-onnx), which compare with ONNX's references, not with
#        onnx_optax.reference, and cost a minute of loading.
#   _checks.py:  1. tests/test_bad_input.py and its doctests;
#                2. $KILLS, the transforms', DirectML's and
#                   the ONNX interface's tests.
#   onnx.py:     1. tests/test_onnx_interface.py, tests/test_onnx_ort.py and
#                   the doctests;
#                2. tests/test_bad_input.py, $KILLS.
#   conformance/tolerance.py:
#                1. tests/conformance/test_conformance_tolerance.py and its doctests;
#                2. the conformance command (a bound too tight fails a case);
#                3. tests/conformance/test_conformance_teeth.py (a bound too
#                   loose lets a planted wrong rule pass).
#   interop/torch.py, interop/keras.py: 1. that bridge's tests (for PyTorch
#                   test_interop_torch.py and test_interop_torch_adam.py) and
#                   doctests; 2. its tests in tests/test_bad_input.py;
#   interop/_common.py, interop/__init__.py: 1. both bridges' tests and
#                   doctests; 2. their tests in tests/test_bad_input.py.
#
# JAX's persistent compilation cache (one per copy, kept across its mutants)
# holds the programs a mutant leaves unchanged: a mutant of tolerance.py or of
# a bridge compiles nothing new, and its conformance stage takes 14 s instead
# of 58, the teeth 34 s instead of 148 (measured on a 2-core machine). The cache is
# keyed on the program itself, so a mutated rule is compiled afresh.
set -u
export PYTHONPATH="$PWD" PYTHONDONTWRITEBYTECODE=1 JAX_PLATFORMS=cpu
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/.jax-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
PYTEST=(python -m pytest -x -q -p no:cacheprovider --no-header)
FAST_TESTS=${FAST_TESTS:-"tests/test_bad_input.py tests/test_transforms.py tests/test_directml.py"}
CONFORMANCE=(python -m onnx_optax.conformance --platform cpu --no-large --no-onnx --quiet)
caught() { echo "JUDGE: caught in stage $1"; exit "$1"; }
# The fast tests that make every term of the core modules and of the checks count.
KILLS=(tests/test_rule_values.py tests/test_derivatives.py tests/test_signatures.py tests/test_input_checks.py
  tests/test_onnx_calls.py)
# The keyword-only signatures of every module, in one table.
KEYWORDS=(tests/test_signatures.py::test_hyperparameters_are_keyword_only)

core() {
  "${PYTEST[@]}" "${KILLS[@]}" onnx_optax/rules.py onnx_optax/transforms.py \
    onnx_optax/reference.py || caught 1
  # shellcheck disable=SC2086
  "${PYTEST[@]}" $FAST_TESTS || caught 2
  # shellcheck disable=SC2086
  "${CONFORMANCE[@]}" ${CONFORMANCE_ARGS:-} || caught 3
}
checks() {
  "${PYTEST[@]}" tests/test_bad_input.py onnx_optax/_checks.py || caught 1
  "${PYTEST[@]}" "${KILLS[@]}" tests/test_transforms.py tests/test_directml.py \
    tests/test_onnx_interface.py tests/test_onnx_ort.py || caught 2
}
onnx_interface() {
  "${PYTEST[@]}" tests/test_onnx_interface.py tests/test_onnx_ort.py onnx_optax/onnx.py || caught 1
  "${PYTEST[@]}" tests/test_bad_input.py "${KILLS[@]}" || caught 2
}
tolerance() {
  "${PYTEST[@]}" tests/conformance/test_conformance_tolerance.py onnx_optax/conformance/tolerance.py \
    "${KEYWORDS[@]}" || caught 1
  # shellcheck disable=SC2086
  "${CONFORMANCE[@]}" ${CONFORMANCE_ARGS:-} || caught 2
  "${PYTEST[@]}" tests/conformance/test_conformance_teeth.py || caught 3
}
interop_torch() {
  "${PYTEST[@]}" tests/test_interop_torch.py tests/test_interop_torch_adam.py onnx_optax/interop/torch.py \
    "${KEYWORDS[@]}" || caught 1
  "${PYTEST[@]}" tests/test_bad_input.py -k torch || caught 2
}
interop_keras() {
  "${PYTEST[@]}" tests/test_interop_keras.py onnx_optax/interop/keras.py "${KEYWORDS[@]}" || caught 1
  "${PYTEST[@]}" tests/test_bad_input.py -k keras || caught 2
}
interop() {
  "${PYTEST[@]}" tests/test_interop_torch.py tests/test_interop_torch_adam.py tests/test_interop_keras.py \
    onnx_optax/interop/ "${KEYWORDS[@]}" || caught 1
  "${PYTEST[@]}" tests/test_bad_input.py -k "torch or keras" || caught 2
}

changed=()
if [[ -n ${MUTATION_PRISTINE:-} && $(realpath "$MUTATION_PRISTINE") != $(realpath .) ]]; then
  while IFS= read -r f; do
    cmp -s "$f" "$MUTATION_PRISTINE/$f" || changed+=("$f")
  done < <(find onnx_optax -name '*.py' | sort)
fi
group() {
  case $1 in
    onnx_optax/rules.py | onnx_optax/transforms.py | onnx_optax/reference.py) echo core ;;
    onnx_optax/_checks.py) echo checks ;;
    onnx_optax/onnx.py) echo onnx_interface ;;
    onnx_optax/conformance/tolerance.py) echo tolerance ;;
    onnx_optax/interop/torch.py) echo interop_torch ;;
    onnx_optax/interop/keras.py) echo interop_keras ;;
    onnx_optax/interop*) echo interop ;;
    *) echo core ;;
  esac
}
if [[ ${#changed[@]} -eq 1 ]]; then
  echo "JUDGE: mutated ${changed[0]}"
  "$(group "${changed[0]}")"
else
  # The baseline (or a run by hand): the stages of every module of $MODULES
  # (run.sh's; default all), each group once.
  [[ ${#changed[@]} -gt 1 ]] && echo "JUDGE: several modules differ (${changed[*]}): every stage"
  groups=()
  for m in ${MODULES:-onnx_optax/rules.py onnx_optax/_checks.py onnx_optax/onnx.py \
    onnx_optax/conformance/tolerance.py onnx_optax/interop}; do
    g=$(group "$m")
    [[ " ${groups[*]} " == *" $g "* ]] || groups+=("$g")
  done
  for g in "${groups[@]}"; do "$g"; done
fi
echo "JUDGE: passed every stage"
