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
# caught mutant skips the rest; "the doctests": those of the mutated module,
# of the group's modules on the baseline):
#   core: rules/*.py, _engine.py, _numerics.py, _pytorch.py, registry.py,
#   transforms.py, reference/*.py:
#     1. the fast tests of every term ($KILLS: the rules' values against the
#        reference, their derivatives, the keyword-only table, the input
#        checks' edges, the ONNX calls, the registry's declarations) and the
#        doctests; for the twins' modules (rules/torch_*.py, rules/keras.py,
#        _pytorch.py) and the engine also their bitwise tests against their
#        frameworks (tests/test_float32_carry.py; Keras's: tests/test_keras_twin.py);
#     2. the fast tests ($FAST_TESTS, the most sensitive first),
#        tests/test_numerics.py, every rule injected ($INJECTION), the
#        meta-gradients through a learning rate and a zero second moment
#        ($DERIVATIVES) and the declarations checked against outside
#        sources ($DECLARED);
#     3. the conformance command on the CPU, every rule and dtype, without
#        the 10^6-element cases (--no-large) and ONNX's backend cases
#        (--no-onnx), which compare with ONNX's references, not with
#        onnx_optax.reference, and cost a minute of loading.
#   _checks.py:  1. tests/test_bad_input.py and its doctests;
#                2. $KILLS, the transforms', DirectML's and
#                   the ONNX interface's tests, and the dtype checks'
#                   ($PRECISION: 16-bit hyperparameters, decays that round
#                   to 1, a second-moment decay of 1 with epsilon 0), and
#                   the PyTorch schedules' (a rate as wide as the parameters).
#   onnx.py, _onnx_runtime.py, directml.py:
#                1. tests/test_onnx_interface.py, tests/test_onnx_ort.py,
#                   tests/test_directml.py and the doctests;
#                2. tests/test_bad_input.py, $KILLS.
#   conformance/tolerance.py, arithmetic.py, scalars.py, models/*.py:
#                1. tests/conformance/test_conformance_tolerance.py,
#                   test_conformance_arithmetic.py, test_conformance_registry.py
#                   and the doctests;
#                2. the conformance command (a bound too tight fails a case);
#                3. tests/conformance/test_conformance_teeth.py and
#                   test_conformance_twins.py (a bound too loose lets a
#                   planted wrong rule pass).
#   interop/torch.py: 1. test_interop_torch.py, test_interop_torch_adam.py,
#                   test_interop_torch_mapping.py, the state-dict bridge's
#                   tests (it builds its transform through from_torch's code:
#                   test_interop_torch_state_dict.py,
#                   test_interop_torch_schedules.py) and the doctests;
#                2. FSDP2's live optimizer (test_interop_fsdp.py: torch_params'
#                   refusal of a shard a rank lacks needs two ranks);
#                3. its tests in tests/test_bad_input.py.
#   interop/torch_state_dict.py, interop/torch_checkpoints.py,
#   interop/torch_trainer.py, interop/torch_lightning.py:
#                1. test_interop_torch_state_dict.py,
#                   test_interop_torch_schedules.py,
#                   test_interop_torch_mapping.py and the doctests;
#                2. the clients' journeys (test_interop_clients.py: Trainer,
#                   Lightning) and FSDP2's (test_interop_fsdp.py);
#                3. the PyTorch tests in tests/test_bad_input.py.
#   interop/_torch_placement.py, _torch_optim.py, _dtensor.py (shared by the
#   PyTorch functions): the stages of both above, every PyTorch test file.
#   interop/keras.py: 1. test_interop_keras.py and the doctests;
#                2. its tests in tests/test_bad_input.py.
#   interop/_common.py, interop/__init__.py: 1. every bridge's tests and the
#                doctests; 2. the clients' and FSDP2's; 3. the bridges' tests
#                in tests/test_bad_input.py.
# Every stage 1 also runs the keyword-only table ($KEYWORDS).
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
  tests/test_onnx_calls.py tests/test_registry.py)
# Every rule with its hyperparameters injected (optax.inject_hyperparams, eager and jitted: traced
# hyperparameters take the rules' array paths).
INJECTION=(tests/test_optax_integration.py::test_inject_hyperparams_matches_plain_rule_and_reference)
# The derivative of an update as the meta-gradients see it (the engine's custom_jvp rule, the safe
# square root's, a rule's hyperparameters closed over or carried as operands): through a learning
# rate, and through a zero second moment.
DERIVATIVES=(tests/test_metagradients.py::test_metagradient_matches_central_difference
  tests/test_metagradients.py::test_zero_H_metagradient_is_finite)
# What a rule declares besides its formula, against an outside source: the decay rates that a
# 16-bit state would store as 1 (named by hand, not read from the declaration), ONNX Runtime's
# defaults and Optax's count, and every declared edge a case of the grid.
DECLARED=(tests/test_precision.py::test_a_state_dtype_in_which_a_decay_rounds_to_1_is_refused
  tests/test_onnx_ort.py::test_the_transforms_defaults_are_ort_schemas_and_training_loop
  tests/conformance/test_conformance_suite.py::test_every_declared_edge_is_a_case)
# The checks of dtypes (_checks.wide_enough, decays_representable): a hyperparameter rounded to 16 bits
# before the rule sees it, a decay rate that a 16-bit dtype rounds to 1, eager and traced.
PRECISION=(tests/test_precision.py::test_injected_16_bit_hyperparameters_are_refused_and_the_fix_is_the_plain_transform
  tests/test_precision.py::test_a_schedule_of_16_bit_values_is_refused
  tests/test_precision.py::test_an_onnx_call_refuses_a_16_bit_R
  tests/test_precision.py::test_a_state_dtype_in_which_a_decay_rounds_to_1_is_refused
  tests/test_precision.py::test_a_traced_decay_is_checked_when_the_program_runs
  tests/test_precision.py::test_a_float32_program_has_no_decay_callback
  tests/test_ranges.py::test_second_moment_decay_one_with_epsilon_zero_is_refused)
# The keyword-only signatures of every module, in one table.
KEYWORDS=(tests/test_signatures.py::test_hyperparameters_are_keyword_only)
CORE=(onnx_optax/rules/ onnx_optax/_engine.py onnx_optax/_numerics.py onnx_optax/_pytorch.py
  onnx_optax/registry.py onnx_optax/transforms.py onnx_optax/reference/)
MEASUREMENT=(onnx_optax/conformance/tolerance.py onnx_optax/conformance/arithmetic.py
  onnx_optax/conformance/scalars.py onnx_optax/conformance/models/)
TORCH_BRIDGE=(tests/test_interop_torch.py tests/test_interop_torch_adam.py tests/test_interop_torch_mapping.py)
TORCH_FILES=(tests/test_interop_torch_state_dict.py tests/test_interop_torch_schedules.py
  tests/test_interop_torch_mapping.py)
TORCH_CLIENTS=(tests/test_interop_clients.py tests/test_interop_fsdp.py)
# The doctests of the stage: the mutated module's (judge.sh's second argument), else the group's.
doctests() { if [[ -n ${MUTATED:-} ]]; then echo "$MUTATED"; else echo "$@"; fi; }

core() {
  local twins=()
  case ${MUTATED:-} in
    onnx_optax/rules/keras.py) twins=(tests/test_keras_twin.py) ;;
    onnx_optax/rules/torch_*.py | onnx_optax/_pytorch.py) twins=(tests/test_float32_carry.py) ;;
    # The engine maps the twins too (their policy: no casts, X whenever given).
    onnx_optax/_engine.py | "") twins=(tests/test_float32_carry.py tests/test_keras_twin.py) ;;
  esac
  # shellcheck disable=SC2046
  "${PYTEST[@]}" "${KILLS[@]}" "${twins[@]}" $(doctests "${CORE[@]}") || caught 1
  # shellcheck disable=SC2086
  "${PYTEST[@]}" $FAST_TESTS tests/test_numerics.py "${INJECTION[@]}" "${DERIVATIVES[@]}" \
    "${DECLARED[@]}" || caught 2
  # shellcheck disable=SC2086
  "${CONFORMANCE[@]}" ${CONFORMANCE_ARGS:-} || caught 3
}
checks() {
  # shellcheck disable=SC2046
  "${PYTEST[@]}" tests/test_bad_input.py $(doctests onnx_optax/_checks.py) || caught 1
  "${PYTEST[@]}" "${KILLS[@]}" tests/test_transforms.py tests/test_directml.py \
    tests/test_onnx_interface.py tests/test_onnx_ort.py "${PRECISION[@]}" \
    tests/test_interop_torch_schedules.py || caught 2
}
onnx_interface() {
  # shellcheck disable=SC2046
  "${PYTEST[@]}" tests/test_onnx_interface.py tests/test_onnx_ort.py tests/test_directml.py \
    $(doctests onnx_optax/onnx.py onnx_optax/_onnx_runtime.py onnx_optax/directml.py) || caught 1
  "${PYTEST[@]}" tests/test_bad_input.py "${KILLS[@]}" || caught 2
}
measurement() {
  # shellcheck disable=SC2046
  "${PYTEST[@]}" tests/conformance/test_conformance_tolerance.py tests/conformance/test_conformance_arithmetic.py \
    tests/conformance/test_conformance_registry.py $(doctests "${MEASUREMENT[@]}") "${KEYWORDS[@]}" || caught 1
  # shellcheck disable=SC2086
  "${CONFORMANCE[@]}" ${CONFORMANCE_ARGS:-} || caught 2
  "${PYTEST[@]}" tests/conformance/test_conformance_teeth.py tests/conformance/test_conformance_twins.py || caught 3
}
interop_torch() {
  # shellcheck disable=SC2046
  "${PYTEST[@]}" "${TORCH_BRIDGE[@]}" tests/test_interop_torch_state_dict.py tests/test_interop_torch_schedules.py \
    $(doctests onnx_optax/interop/torch.py) "${KEYWORDS[@]}" || caught 1
  "${PYTEST[@]}" tests/test_interop_fsdp.py || caught 2
  "${PYTEST[@]}" tests/test_bad_input.py -k torch || caught 3
}
interop_torch_files() {
  # shellcheck disable=SC2046
  "${PYTEST[@]}" "${TORCH_FILES[@]}" \
    $(doctests onnx_optax/interop/torch_state_dict.py onnx_optax/interop/torch_checkpoints.py \
      onnx_optax/interop/torch_trainer.py onnx_optax/interop/torch_lightning.py) \
    "${KEYWORDS[@]}" || caught 1
  "${PYTEST[@]}" "${TORCH_CLIENTS[@]}" || caught 2
  "${PYTEST[@]}" tests/test_bad_input.py -k torch || caught 3
}
interop_torch_shared() {
  # shellcheck disable=SC2046
  "${PYTEST[@]}" "${TORCH_BRIDGE[@]}" tests/test_interop_torch_state_dict.py tests/test_interop_torch_schedules.py \
    $(doctests onnx_optax/interop/_torch_placement.py onnx_optax/interop/_torch_optim.py \
      onnx_optax/interop/_dtensor.py) "${KEYWORDS[@]}" || caught 1
  "${PYTEST[@]}" "${TORCH_CLIENTS[@]}" || caught 2
  "${PYTEST[@]}" tests/test_bad_input.py -k torch || caught 3
}
interop_keras() {
  # shellcheck disable=SC2046
  "${PYTEST[@]}" tests/test_interop_keras.py $(doctests onnx_optax/interop/keras.py) "${KEYWORDS[@]}" || caught 1
  "${PYTEST[@]}" tests/test_bad_input.py -k keras || caught 2
}
interop() {
  # shellcheck disable=SC2046
  "${PYTEST[@]}" "${TORCH_BRIDGE[@]}" tests/test_interop_torch_state_dict.py tests/test_interop_torch_schedules.py \
    tests/test_interop_keras.py $(doctests onnx_optax/interop/) "${KEYWORDS[@]}" || caught 1
  "${PYTEST[@]}" "${TORCH_CLIENTS[@]}" || caught 2
  "${PYTEST[@]}" tests/test_bad_input.py -k "torch or keras" || caught 3
}

changed=()
if [[ -n ${MUTATION_PRISTINE:-} && $(realpath "$MUTATION_PRISTINE") != $(realpath .) ]]; then
  while IFS= read -r f; do
    cmp -s "$f" "$MUTATION_PRISTINE/$f" || changed+=("$f")
  done < <(find onnx_optax -name '*.py' | sort)
fi
group() {
  case $1 in
    onnx_optax/rules | onnx_optax/rules/*.py | onnx_optax/_engine.py | onnx_optax/_numerics.py) echo core ;;
    onnx_optax/_pytorch.py | onnx_optax/registry.py | onnx_optax/transforms.py) echo core ;;
    onnx_optax/reference | onnx_optax/reference/*.py) echo core ;;
    onnx_optax/_checks.py) echo checks ;;
    onnx_optax/onnx.py | onnx_optax/_onnx_runtime.py | onnx_optax/directml.py) echo onnx_interface ;;
    onnx_optax/conformance/tolerance.py | onnx_optax/conformance/arithmetic.py) echo measurement ;;
    onnx_optax/conformance/scalars.py | onnx_optax/conformance/models*) echo measurement ;;
    onnx_optax/interop/torch.py) echo interop_torch ;;
    onnx_optax/interop/torch_state_dict.py | onnx_optax/interop/torch_checkpoints.py) echo interop_torch_files ;;
    onnx_optax/interop/torch_trainer.py | onnx_optax/interop/torch_lightning.py) echo interop_torch_files ;;
    onnx_optax/interop/_torch_placement.py | onnx_optax/interop/_torch_optim.py) echo interop_torch_shared ;;
    onnx_optax/interop/_dtensor.py) echo interop_torch_shared ;;
    onnx_optax/interop/keras.py) echo interop_keras ;;
    onnx_optax/interop*) echo interop ;;
    *) echo "JUDGE: no stages for $1 (add it to group() in judge.sh)" >&2; exit 99 ;;
  esac
}
if [[ ${#changed[@]} -eq 1 ]]; then
  echo "JUDGE: mutated ${changed[0]}"
  MUTATED=${changed[0]}
  g=$(group "$MUTATED") || exit 99
  "$g"
else
  # The baseline (or a run by hand): the stages of every module of $MODULES
  # (run.sh's; default all), each group once.
  [[ ${#changed[@]} -gt 1 ]] && echo "JUDGE: several modules differ (${changed[*]}): every stage"
  groups=()
  for m in ${MODULES:-onnx_optax/rules onnx_optax/_checks.py onnx_optax/onnx.py \
    onnx_optax/conformance/tolerance.py onnx_optax/interop}; do
    g=$(group "$m") || exit 99
    [[ " ${groups[*]} " == *" $g "* ]] || groups+=("$g")
  done
  for g in "${groups[@]}"; do "$g"; done
fi
echo "JUDGE: passed every stage"
