"""The PyTorch-order and Keras-order twins in the conformance suite: they conform, and the
suite has teeth for them.

The twins (``pytorch_sgd``, ``pytorch_adagrad``, ``pytorch_adam``, ``pytorch_adamw``,
``keras_adam``) run the grid's twin cases (``cases.TWINS``, in their registered dtypes) against
``reference.pytorch_*`` (Keras's Adam against ``reference.directml_adam`` at ``T = count + 1``).
Each mutant below replaces one part of a twin on its registered
:class:`~onnx_optax.registry.Rule` (``scalars`` or ``elementwise``: the engine looks them up there
when it traces) with one plausible mistake, the kind a framework port makes: ONNX
Runtime's ``1 - float32(beta2)`` in place of PyTorch's float64 ``1 - beta2``, a bias
correction at the wrong step, a term moved. The suite's cases of that twin must fail in
every twin dtype. The order mutants round otherwise than PyTorch and nothing more (a product
rounded where PyTorch fuses it, fused where PyTorch rounds it, a root and a quotient swapped):
within the bound, they must fail the comparison with PyTorch's float32 order on the CPU.
``python tests/conformance/test_conformance_twins.py`` prints the margins (the worst error /
tolerance over the cases, "(order)" where that comparison fails) recorded in docs/conformance.md.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from onnx_optax import _pytorch, registry
from onnx_optax.conformance import cases as grid
from onnx_optax.conformance import check, devices
from onnx_optax.rules import torch_adam

PLATFORMS = devices.platforms()
TWIN_DTYPES = ("float32", "float64", "float16", "bfloat16")


@pytest.mark.parametrize("rule,dtype", [(r, d) for r in grid.TWINS for d in grid.dtypes_of(r)])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_twin_conforms(platform, rule, dtype):
  if dtype == "float64" and not devices.has_float64(platform):
    pytest.skip(f"{platform} has no float64 arithmetic")
  results = list(check.results(grid.cases(rule, dtype), platform))  # the row in one program, as the report
  failures = [f"{r.name}: worst {r.worst:.3g} at {r.where} {r.error}" for r in results if not r.passed]
  assert not failures, "\n".join(failures)


def test_twins_have_their_own_grid():
  """Every twin has cases in every dtype it declares, and none in the others (no silent empty
  rows). The twins of PyTorch's classes in all four dtypes; Keras's Adam in float32 and float64."""
  for rule in grid.TWINS:
    declared = grid.dtypes_of(rule)
    assert set(declared) <= set(TWIN_DTYPES), (rule, declared)
    # PyTorch steps float16 parameters on the CPU (its float16 state, float32 opmath): every
    # twin of a torch.optim class is checked there, and in every other dtype unless its
    # declaration says why not (Conformance.why_not, which the report prints).
    declaration = registry.get(grid.base_rule(rule))
    if any(b.kind == "torch" for b in declaration.bindings):
      assert declaration.conformance is not None
      left_out = set(TWIN_DTYPES) - set(declared)
      assert "float16" in declared and left_out <= set(declaration.conformance.why_not), (rule, declared)
    assert rule != "keras_adam" or declared == ("float32", "float64"), declared
    for dtype in declared:
      names = [c.name for c in grid.cases(rule, dtype)]
      # bfloat16: the five cases every twin has there (the tiny-gradient and epsilon cases only
      # where the rule has such terms: Rprop has neither).
      assert len(names) == len(set(names)) >= (17 if dtype != "bfloat16" else 5), (rule, dtype)
      # bfloat16 parameters train with a float32 state (PyTorch's mixed precision); float16
      # parameters with PyTorch's own float16 state.
      assert dtype != "bfloat16" or {c.state_dtype for c in grid.cases(rule, dtype)} == {"float32"}
      assert dtype != "float16" or {c.state_dtype for c in grid.cases(rule, dtype)} == {None}
    for dtype in set(grid.DTYPES) - set(declared):
      with pytest.raises(ValueError, match=f"the grid runs {rule} in"):
        grid.cases(rule, dtype)


# -- the mutants -----------------------------------------------------------------------------

_sgd, _adagrad = registry.get("pytorch_sgd"), registry.get("pytorch_adagrad")
_adam, _keras = registry.get("pytorch_adam"), registry.get("keras_adam")
_radam = registry.get("pytorch_radam")
_sgd_scalars, _adagrad_scalars = _sgd.scalars, _adagrad.scalars
_adam_scalars, _keras_elementwise = _adam.scalars, _keras.elementwise


def _sgd_no_first_copy(lr, count, **kw):
  """The buffer decayed and dampened at the first step too (PyTorch copies the gradient)."""
  return _sgd_scalars(lr, count, **kw)._replace(first=jnp.asarray(False))


def _sgd_dampening_swapped(lr, count, **kw):
  """``dampening`` where PyTorch has ``1 - dampening``."""
  s = _sgd_scalars(lr, count, **kw)
  return s._replace(one_minus_dampening=kw["dampening"]) if s.one_minus_dampening is not None else s


def _adagrad_step_not_minus_one(lr, count, **kw):
  """``clr = lr / (1 + step * lr_decay)``: PyTorch's ``step - 1`` read as ``step``."""
  return _adagrad_scalars(lr, jnp.asarray(count) + 1, **kw)


def _adam_ort_one_minus_beta2(lr, count, **kw):
  """ONNX Runtime's ``1 - float32(beta2)`` (0.00099998713 for 0.999) for PyTorch's ``float32(1 - beta2)``."""
  return _adam_scalars(lr, count, **kw)._replace(one_minus_beta2=1 - jnp.float32(kw["beta2"]))


def _adam_bias_correction_at_count(lr, count, **kw):
  """The bias corrections at ``count`` (updates done) where PyTorch has ``step = count + 1``: a
  0/0 at the first update, ``beta^T`` one power off after."""
  return _adam_scalars(lr, jnp.asarray(count) - 1, **kw)


def _adam_one_minus_beta2_in_float32(lr, count, **kw):
  """``1 - beta2`` rounded to float32 before it meets a float64 tensor (PyTorch's is the float64
  number): 1e-8 relative, which a bound that charged a host scalar float32's unit roundoff
  would let pass. Where the twin computes in float32 it is PyTorch's own rounding."""
  return _adam_scalars(lr, count, **kw)._replace(one_minus_beta2=float(np.float32(1 - kw["beta2"])))


def _adam_lerp_weight_beta1(lr, count, **kw):
  """The lerp toward the gradient with weight ``beta1`` (the decay) instead of ``1 - beta1``."""
  return _adam_scalars(lr, count, **kw)._replace(one_minus_beta1=kw["beta1"])


def _keras_alpha_at_count(s, X, G, m, v, **kw):
  """Keras's ``alpha`` at ``iterations`` where Keras has ``iterations + 1`` (0/0 at the first)."""
  return _keras_elementwise(s._replace(count=jnp.asarray(s.count) - 1), X, G, m, v, **kw)


def _one_line_changed(function: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
  """``function`` (a part of a twin, in its module of :mod:`onnx_optax.rules`) with one line of its
  source replaced: a wrong variant that differs from the twin there alone (``old == new``: the
  twin's own code, recompiled; ``test_unchanged_recompilations_pass`` and
  ``test_unmutated_copies_pass`` show it passes)."""
  source = textwrap.dedent(inspect.getsource(function))
  assert source.count(old) == 1, f"{function.__name__} no longer has the line {old!r}"
  namespace = dict(vars(sys.modules[function.__module__]))
  exec(compile(source.replace(old, new), f"<variant of {function.__qualname__}>", "exec"), namespace)  # noqa: S102
  return namespace[function.__name__]


#: A line of a twin and its wrong variant: ``(function, old line, new line)``, compiled by
#: :func:`_one_line_changed` when the mutant is planted.
Line = tuple[Callable[..., Any], str, str]

#: ``sqrt(sum + eps)`` where PyTorch adds ``eps`` after the root.
_ADAGRAD_EPS = (
  _adagrad.elementwise,
  "  std = _pytorch.stored(_pytorch.stored(_numerics.sqrt(sum_new), state_sum.dtype) + s.eps, "
  "state_sum.dtype)",
  "  std = _pytorch.stored(_numerics.sqrt(sum_new + s.eps), state_sum.dtype)",
)
#: Keras's ``1 - beta_2`` computed from the variable's ``beta_2`` (``1 - float32(0.999)``) where
#: Keras subtracts in Python float64.
_KERAS_ONE_MINUS = (
  _keras.elementwise,
  "  v_new = v + d_v * _weak(1 - beta_2, d_v)",
  "  v_new = v + d_v * _weak(1 - jnp.asarray(beta_2, dt), d_v)",
)

#: (name, the twins it breaks, {part of each twin's registered Rule: replacement, or a line}).
MUTANTS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
  ("sgd_no_first_copy", ("pytorch_sgd",), {"scalars": _sgd_no_first_copy}),
  ("sgd_dampening_swapped", ("pytorch_sgd",), {"scalars": _sgd_dampening_swapped}),
  ("adagrad_step_not_minus_one", ("pytorch_adagrad",), {"scalars": _adagrad_step_not_minus_one}),
  ("adagrad_eps_inside_sqrt", ("pytorch_adagrad",), {"elementwise": _ADAGRAD_EPS}),
  ("adam_ort_one_minus_beta2", ("pytorch_adam", "pytorch_adamw"), {"scalars": _adam_ort_one_minus_beta2}),
  (
    "adam_bias_correction_at_count",
    ("pytorch_adam", "pytorch_adamw"),
    {"scalars": _adam_bias_correction_at_count},
  ),
  (
    "adam_one_minus_beta2_in_float32",
    ("pytorch_adam", "pytorch_adamw"),
    {"scalars": _adam_one_minus_beta2_in_float32},
  ),
  ("adam_lerp_weight_beta1", ("pytorch_adam", "pytorch_adamw"), {"scalars": _adam_lerp_weight_beta1}),
  ("keras_ort_one_minus_beta_2", ("keras_adam",), {"elementwise": _KERAS_ONE_MINUS}),
  ("keras_alpha_at_count", ("keras_adam",), {"elementwise": _keras_alpha_at_count}),
]


#: Lines of the twins whose wrong variants differ from PyTorch only in rounding: within the
#: rounding-error bound in every dtype, they fail the float32 comparison with PyTorch's own order
#: (``order.order_mismatch``, where the device's arithmetic is correctly rounded: the CPU).
_SGD_FMA = "  return _pytorch.in_place(g * s.neg_lr + x, X), buf_new"
_DECAY_ROUNDED = "  v2 = _pytorch.stored(exp_avg_sq.astype(dt) * s.beta2, exp_avg_sq.dtype, nz)"
_DIVIDE = (
  "    _pytorch.stored(_pytorch.divide_by_scalar(root, s.bias_correction2_sqrt), exp_avg_sq.dtype) + s.eps,"
)

_RADAM_SCALED = "  scaled = _pytorch.stored(corrected * s.lr, exp_avg.dtype, nz)"
_RADAM_ROOT = "  root = _pytorch.stored(root + s.eps, exp_avg_sq.dtype, nz)"

#: (name, the twins it breaks, {part: a line, or "divide_by_scalar": the shared helper of _pytorch}).
ORDER_MUTANTS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
  (
    "adam_denominator_sqrt_of_quotient",  # sqrt(v / bias_correction2) + eps
    ("pytorch_adam", "pytorch_adamw"),
    {
      "elementwise": (
        _adam.elementwise,
        _DIVIDE,
        "    _pytorch.stored(_numerics.sqrt(_pytorch.divide_by_scalar(v, s.bias_correction2_sqrt * "
        "s.bias_correction2_sqrt)), v.dtype) + s.eps,",
      )
    },
  ),
  (
    "sgd_param_add_unfused",  # param.add_(grad, alpha=-lr) as a rounded product, then a sum
    ("pytorch_sgd",),
    {
      "elementwise": (
        _sgd.elementwise,
        _SGD_FMA,
        "  return _pytorch.in_place(_pytorch.stored(g * s.neg_lr, g.dtype, nz) + x, X), buf_new",
      )
    },
  ),
  (
    "adam_exp_avg_sq_decay_fused",  # exp_avg_sq.mul_(beta2) fused into the addcmul_ after it
    ("pytorch_adam",),
    {
      "moments": (
        torch_adam.moments,
        _DECAY_ROUNDED,
        "  v2 = _pytorch.stored(exp_avg_sq.astype(dt) * s.beta2, exp_avg_sq.dtype)",
      )
    },
  ),
  # a * (1 / b): one rounding more than PyTorch's a / b
  ("adam_reciprocal_division", ("pytorch_adam",), {"divide_by_scalar": lambda a, b: a * (1 / b)}),
  (
    "radam_step_product_contracted",  # exp_avg / bc1 * lr fused into the parameter's subtraction
    ("pytorch_radam",),
    {"elementwise": (_radam.elementwise, _RADAM_SCALED, _RADAM_SCALED.replace(", nz)", ")"))},
  ),
  (
    "radam_rsqrt_at_eps_0",  # sqrt(v) + 0 folded: XLA's rsqrt(v) for 1 / sqrt(v)
    ("pytorch_radam",),
    {"elementwise": (_radam.elementwise, _RADAM_ROOT, _RADAM_ROOT.replace(", nz)", ")"))},
  ),
]


def _compiled(part: Any, same: bool = False) -> Any:
  """A part as planted: a line compiled into its variant (``same``: the line kept), else itself."""
  if isinstance(part, tuple):
    function, old, new = part
    return _one_line_changed(function, old, old if same else new)
  return part


#: The parts planted on a module rather than on a twin's Rule: a helper several twins call.
_MODULE_PARTS = {"divide_by_scalar": _pytorch, "moments": torch_adam}


def _plant(mp: pytest.MonkeyPatch, twins: tuple[str, ...], parts: dict[str, Any], same: bool = False) -> None:
  """Plants ``parts`` on each twin's registered Rule (``"scalars"``, ``"elementwise"``: the engine
  looks them up there), or on the module of a shared helper (:data:`_MODULE_PARTS`:
  ``_pytorch.divide_by_scalar``, ``torch_adam.moments``, PyTorch Adam's first half)."""
  for part, value in parts.items():
    if part in _MODULE_PARTS:
      mp.setattr(_MODULE_PARTS[part], part, _compiled(value, same))
      continue
    compiled = _compiled(value, same)
    for twin in twins:
      mp.setattr(registry.get(twin), part, compiled)


def _results(rule: str, dtype: str, stop: bool) -> list[check.CaseResult]:
  out = []
  cases = grid.cases(rule, dtype)
  # Every case: the row compiled as one program, as the report runs it; up to the first failure:
  # case by case (a mutant is mostly caught by the first).
  for case, r in zip(cases, check.results(cases) if not stop else map(check.run_case, cases)):
    assert not r.error, f"{case.id} raised {r.error}"  # A crash would be caught for the wrong reason.
    out.append(r)
    if stop and not r.passed:
      break
  return out


#: Mutants that cannot be wrong in some dtype, and why.
EQUIVALENT = {
  # In float64 the variable's beta_2 is the Python float: 1 - beta_2 is Keras's own number.
  "keras_ort_one_minus_beta_2": ("float64",),
  # Computing in float32 (float32 and bfloat16 parameters), the twin rounds 1 - beta2 to float32 itself.
  "adam_one_minus_beta2_in_float32": ("float32", "float16", "bfloat16"),
}

#: Mutants within the bound of some dtype, and why: not the twin's bits, but no bound of that
#: dtype can tell them from it.
BELOW_THE_BOUND = {
  # 1 - float32(0.999) is 1.3e-5 relative off float32(1 - 0.999): a fortieth of float16's unit
  # roundoff, in a term stored in PyTorch's float16 state. Caught in float32, float64 and
  # bfloat16 (a float32 state).
  "adam_ort_one_minus_beta2": ("float16",),
}


@pytest.mark.parametrize(
  "name,twins,parts,dtype",
  [
    pytest.param(name, twins, parts, dtype, id=f"{name}-{dtype}")
    for name, twins, parts in MUTANTS
    for dtype in TWIN_DTYPES
    if dtype not in EQUIVALENT.get(name, ()) + BELOW_THE_BOUND.get(name, ())
    and any(dtype in grid.dtypes_of(r) for r in twins)
  ],
)
def test_wrong_twin_is_caught(monkeypatch, name, twins, parts, dtype):
  _plant(monkeypatch, twins, parts)
  for rule in twins:
    if dtype not in grid.dtypes_of(rule):
      continue
    failed = [r for r in _results(rule, dtype, stop=True) if not r.passed]
    assert failed, f"{name} passes the {rule} {dtype} cases"
    print(f"{name} {rule} {dtype}: caught by {failed[0].name} at {failed[0].worst:.3g} x tolerance")


@pytest.mark.parametrize("name", sorted(EQUIVALENT))
def test_equivalent_mutants_are_bit_identical(monkeypatch, name):
  """Where a mutant is declared equivalent, it gives the very bits of the twin."""
  ((_, twins, parts),) = [m for m in MUTANTS if m[0] == name]
  for rule in twins:
    for dtype in EQUIVALENT[name]:
      for case in grid.cases(rule, dtype)[:8]:
        args = (case.rule, case.dtype, "cpu", case.R, case.T, case.hyper, *case.inputs())
        want = check.run_transform(*args)
        with monkeypatch.context() as m:
          _plant(m, twins, parts)
          got = check.run_transform(*args)
        for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
          assert np.asarray(w).tobytes() == np.asarray(g).tobytes(), (name, case.id)


@pytest.mark.parametrize("name,twins,parts", ORDER_MUTANTS, ids=[m[0] for m in ORDER_MUTANTS])
def test_rounding_order_variant_is_caught_by_pytorchs_float32_order(monkeypatch, name, twins, parts):
  """A variant that only rounds otherwise than PyTorch: within the bound, but in float32 on the CPU
  (correctly rounded arithmetic) not PyTorch's order, which the report says."""
  _plant(monkeypatch, twins, parts)
  caught = None
  for case in (c for rule in twins for c in grid.cases(rule, "float32")):
    r = check.run_case(case)
    assert not r.error and r.worst <= 1, f"{name} {case.id}: beyond the bound, not a rounding variant"
    if r.order:
      caught = r
      break
  assert caught is not None, f"{name} passes the float32 cases of {twins}"
  print(f"{name}: {caught.rule} {caught.name} is not PyTorch's float32 order: {caught.order}")


def test_adamw_without_decay_returns_the_addend_not_an_in_place_write(monkeypatch):
  """AdamW at ``weight_decay=0`` multiplies the parameters by 1 (exact) and ends in ``addcdiv_``:
  its update is the addend ``q``, as Adam's, not ``X_new - X``. A variant that writes it in place
  lands on the same ``X + U`` but its ``U`` carries ``X``'s rounding, which the bound model of the
  float32 ``weight_decay=0`` case does not allow (a model that charged the in-place write there
  let it pass)."""
  _plant(
    monkeypatch,
    ("pytorch_adamw",),
    {
      "elementwise": (
        _adam.elementwise,
        "  return _pytorch.added(x, q, X, dt, G), *state",
        "  return (_pytorch.in_place(x + q, X) if x is not None else _pytorch.added(x, q, X, dt, G)), *state",
      )
    },
  )
  failed = {r.name: r.worst for r in _results("pytorch_adamw", "float32", stop=False) if not r.passed}
  assert "weight_decay=0" in failed, f"the in-place variant passes: {failed}"


def test_adam_lerp_on_the_other_branch_fails_the_bfloat16_bound(monkeypatch):
  """PyTorch's lerp has two branches (``_pytorch.lerp``): ``start + w * (end - start)`` for ``|w| <
  0.5``, ``end + (w - 1) * (end - start)`` otherwise. Taking the other one rounds ``(w - 1) * (end -
  start)``, a term up to ten times larger at ``betas[0] = 0.9``: beyond the bfloat16 bound (state
  in float32, where no float32-order check runs), which follows PyTorch's branch (a model that
  always took the second branch let it pass)."""
  lerp = _pytorch.lerp
  monkeypatch.setattr(
    _pytorch, "lerp", lambda start, end, weight, *, small: lerp(start, end, weight, small=not small)
  )
  failed = [r.name for r in _results("pytorch_adam", "bfloat16", stop=False) if not r.passed]
  assert failed, "the other lerp branch passes the bfloat16 cases"


def test_unchanged_recompilations_pass(monkeypatch):
  """The variants' mechanism alone (the twin's source recompiled, no line changed) passes the
  float32 cases of its twin, compared to the bit (the first eight: every case runs unchanged
  code in ``test_twin_conforms``)."""
  for _, twins, parts in ORDER_MUTANTS[:3]:
    with monkeypatch.context() as m:
      _plant(m, twins, parts, same=True)
      results = list(check.results(grid.cases(twins[0], "float32")[:8]))
    assert all(r.passed and r.order_checked for r in results), [(r.name, r.order) for r in results]


@pytest.mark.parametrize("dtype", TWIN_DTYPES)
def test_unmutated_copies_pass(monkeypatch, dtype):
  """The one-line mutants of :data:`MUTANTS` are made from the twin's own code: recompiled with
  that line kept, it passes every case of its twin in every dtype."""
  for _, twins, parts in MUTANTS:
    if not any(isinstance(p, tuple) for p in parts.values()):
      continue
    for rule in (r for r in twins if dtype in grid.dtypes_of(r)):
      with monkeypatch.context() as m:
        _plant(m, (rule,), parts, same=True)
        failed = [
          f"{r.name}: {r.worst:.3g} {r.where}" for r in _results(rule, dtype, stop=False) if not r.passed
        ]
      assert not failed, (rule, failed)


def _margins() -> None:
  """Prints, per mutant, twin and dtype, the worst error / tolerance over every case."""
  mp = pytest.MonkeyPatch()
  print("| mutant | twin | " + " | ".join(TWIN_DTYPES) + " |\n|---|---|" + "---:|" * len(TWIN_DTYPES))
  mutants = MUTANTS + ORDER_MUTANTS
  for name, twins, parts in mutants:
    for rule in twins:
      cells = []
      for dtype in TWIN_DTYPES:
        if dtype in EQUIVALENT.get(name, ()):
          cells.append("equivalent")
          continue
        if dtype not in grid.dtypes_of(rule):
          cells.append("")
          continue
        with mp.context() as m:
          _plant(m, (rule,), parts)
          results = _results(rule, dtype, stop=False)
        other = [r for r in results if not r.passed and r.worst <= 1 and not r.order]
        worst = float("inf") if other else max(r.worst for r in results)
        cells.append(f"{worst:.3g}" + (" (order)" if any(r.order for r in results) else ""))
      print(f"| {name} | {rule} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  _margins()
