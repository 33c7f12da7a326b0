"""Runs a case through an Optax transform on a device and checks it.

:func:`run_case` builds the transform and its state (``count = T`` and the
case's state tensors), places everything on the chosen device, applies one
jitted ``update`` + ``optax.apply_updates`` and returns the outputs.
:func:`check_case` compares them with :mod:`onnx_optax.reference` in float64
in units of the tolerance of :mod:`onnx_optax.conformance.tolerance`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import onnx_optax
from onnx_optax import reference
from onnx_optax.conformance import tolerance
from onnx_optax.conformance.cases import INT32_MAX, Case, numpy_dtype

__all__ = ["CaseResult", "check_outputs", "compare", "device", "platforms", "run_case", "x64"]

_PLATFORM_ORDER = ("cpu", "gpu", "tpu")


def platforms() -> list[str]:
  """The platforms JAX finds: ``cpu`` always, then ``gpu`` and ``tpu`` if present."""
  found = []
  for platform in _PLATFORM_ORDER:
    try:
      if jax.devices(platform):
        found.append(platform)
    except RuntimeError:  # No backend for this platform.
      pass
  return found


def device(platform: str) -> jax.Device:
  """The first device of a platform, chosen explicitly (not JAX's default)."""
  return jax.devices(platform)[0]


def has_float64(platform: str) -> bool:
  """TPUs have no float64 arithmetic."""
  return platform != "tpu"


def make_transform(rule: str, R: float, hyper: dict[str, Any], state_dtype: str | None = None,
                   ) -> optax.GradientTransformationExtraArgs:
  """The Optax transform of a suite rule name with Python-float hyperparameters."""
  extra = {} if state_dtype is None else {"state_dtype": numpy_dtype(state_dtype)}
  if rule.startswith("momentum"):
    return onnx_optax.momentum(R, **hyper, **extra)
  return {"adagrad": onnx_optax.adagrad, "adam": onnx_optax.adam,
          "directml_adam": onnx_optax.directml_adam}[rule](R, **hyper, **extra)


_STATE_CLS = {"momentum": onnx_optax.MomentumState, "adagrad": onnx_optax.AdagradState,
              "adam": onnx_optax.AdamState, "directml_adam": onnx_optax.DirectMLAdamState}


def _tree(leaves: list[Any]) -> Any:
  """One leaf: the array itself; several: a nested dict (a multi-leaf pytree)."""
  if len(leaves) == 1:
    return leaves[0]
  return {"a": {"b": leaves[0], "c": leaves[1]}, "d": list(leaves[2:])}  # Flattens in this order.


def run_transform(rule: str, dtype: str, platform: str, R: float, T: int, hyper: dict[str, Any],
                  X: list[np.ndarray], G: list[np.ndarray], state: list[list[np.ndarray]],
                  state_dtype: str | None = None,
                  ) -> tuple[list[np.ndarray], list[list[np.ndarray]], int]:
  """One jitted update of ``rule`` on the first ``platform`` device.

  Returns:
    ``(X_new, state_new, count)``: the new tensors, the new state tensors (in
    the spec's order) and the new count, as NumPy arrays.
  """
  base = "momentum" if rule.startswith("momentum") else rule
  with jax.enable_x64(numpy_dtype(dtype) == np.float64):
    dev = device(platform)
    put = lambda leaves: _tree([jax.device_put(np.asarray(x), dev) for x in leaves])  # noqa: E731
    params, grads = put(X), put(G)
    opt_state = _STATE_CLS[base](jax.device_put(jnp.asarray(T, jnp.int32), dev), *(put(s) for s in state))
    opt = make_transform(rule, R, hyper, state_dtype)

    def step(params, grads, opt_state):
      updates, new_state = opt.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), new_state

    with jax.default_device(dev):
      new_params, new_state = jax.jit(step)(params, grads, opt_state)
    placed = {d for leaf in jax.tree.leaves((new_params, new_state)) for d in leaf.devices()}
    if placed != {dev}:  # The platform under test must be the one that computed.
      raise RuntimeError(f"outputs on {placed}, expected {dev}")
    leaves = lambda tree: [np.asarray(x) for x in jax.tree.leaves(tree)]  # noqa: E731
    return leaves(new_params), [leaves(s) for s in new_state[1:]], int(new_state.count)


def expected(rule: str, R: float, T: int, X, G, state, hyper) -> list[tuple[np.ndarray, ...]]:
  """The spec's outputs per leaf, from :mod:`onnx_optax.reference` in float64."""
  outs = []
  for i, (x, g) in enumerate(zip(X, G)):
    s = [block[i] for block in state]
    if rule == "directml_adam":
      outs.append(reference.directml_adam(x, s[0], s[1], g, T, learning_rate=R, **hyper))
    else:
      base = "momentum" if rule.startswith("momentum") else rule
      outs.append(reference.RULES[base][0](R, T, x, g, *s, **hyper))
  return outs


def tolerances(rule: str, dtype: str, platform: str, R: float, T: int, X, G, state, hyper,
               state_dtype: str | None = None) -> list[tuple[np.ndarray, ...]]:
  """Per leaf and output: bound(implementation) + bound(reference)."""
  base = "momentum" if rule.startswith("momentum") else rule
  impl = tolerance.implementation_context(numpy_dtype(dtype), platform,
                                          state_dtype and numpy_dtype(state_dtype))
  ref = tolerance.reference_context()
  outs = []
  for i, (x, g) in enumerate(zip(X, G)):
    s = [block[i] for block in state]
    a = tolerance.bounds(base, impl, R, T, x, g, s, **hyper)
    b = tolerance.bounds(base, ref, R, T, x, g, s, **hyper)
    outs.append(tuple(p + q for p, q in zip(a, b)))
  return outs


def compare(got: np.ndarray, want: np.ndarray, tol: np.ndarray) -> tuple[float, int, int]:
  """Worst ``|got - want| / tol``; the index of the worst element; loose elements.

  NaN must match NaN and an infinity the same infinity (ratio 0, else inf).
  Where ``tol`` is infinite the element is not checked beyond its
  finiteness. Elements whose tolerance reaches the expected value's
  magnitude (the dtype cannot hold the result, e.g. bfloat16's
  ``1 - 0.999 == 0``) are counted as *loose*: the check holds, but
  guarantees no significant digit there.
  """
  want = np.asarray(want, np.float64)
  tol = np.broadcast_to(np.asarray(tol, np.float64), want.shape).ravel()
  got = np.broadcast_to(np.asarray(got).astype(np.float64), want.shape).ravel()
  want = want.ravel()
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    diff = np.abs(got - want)
    ratio = np.where(diff == 0, 0.0, diff / tol)
  same_special = (np.isnan(got) & np.isnan(want)) | (np.isinf(want) & (got == want))
  special = ~np.isfinite(got) | ~np.isfinite(want)
  ratio = np.where(special, np.where(same_special, 0.0, np.inf), ratio)
  unbounded = np.isinf(tol) & ~special
  ratio = np.where(unbounded, 0.0, ratio)
  loose = ~special & (tol >= np.abs(want)) & (want != 0)
  if ratio.size == 0:
    return 0.0, 0, 0
  worst = int(np.argmax(ratio))
  return float(ratio[worst]), worst, int(loose.sum())


@dataclass
class CaseResult:
  """The outcome of one case on one platform.

  ``worst`` is the largest error over all outputs and elements in units of
  the tolerance (``<= 1`` passes); ``where`` names that element; ``loose``
  counts the elements whose tolerance reaches their magnitude (see
  :func:`compare`).
  """

  rule: str
  dtype: str
  name: str
  platform: str
  worst: float
  where: str
  loose: int = 0
  count_ok: bool = True
  error: str = ""

  @property
  def passed(self) -> bool:
    return self.worst <= 1.0 and self.count_ok and not self.error


OUTPUT_NAMES = {"momentum": ("X_new", "V_new"), "adagrad": ("X_new", "H_new"),
                "adam": ("X_final", "V_new", "H_new"), "directml_adam": ("X_new", "M_new", "V_new")}


def check_outputs(case: Case, platform: str, got_x, got_state, got_count: int | None, inputs=None) -> CaseResult:
  """Checks given outputs of ``case`` (from any implementation) against the reference."""
  X, G, state = inputs if inputs is not None else case.inputs()
  want = expected(case.rule, case.R, case.T, X, G, state, case.hyper)
  tol = tolerances(case.rule, case.dtype, platform, case.R, case.T, X, G, state, case.hyper,
                   case.state_dtype)
  names = OUTPUT_NAMES[case.base_rule]
  worst, where, loose = 0.0, "", 0
  for leaf in range(len(X)):
    got = [got_x[leaf]] + [s[leaf] for s in got_state]
    for k, name in enumerate(names):
      ratio, index, n = compare(got[k], want[leaf][k], tol[leaf][k])
      loose += n
      if ratio > worst or not where:
        flat_got = np.asarray(got[k]).astype(np.float64).ravel()
        worst, where = ratio, (f"{name}[leaf {leaf}, element {index}]: got {float(flat_got[index])!r}, "
                               f"expected {float(np.ravel(want[leaf][k])[index])!r}")
  count_ok = got_count is None or got_count == min(case.T + 1, INT32_MAX)
  return CaseResult(case.rule, case.dtype, case.name, platform, worst, where, loose, count_ok)


def run_case(case: Case, platform: str = "cpu") -> CaseResult:
  """Runs ``case`` through its Optax transform on ``platform`` and checks it."""
  inputs = case.inputs()
  try:
    got_x, got_state, count = run_transform(case.rule, case.dtype, platform, case.R, case.T,
                                            case.hyper, *inputs, state_dtype=case.state_dtype)
  except Exception as e:  # noqa: BLE001 -- reported as a failure with its message.
    return CaseResult(case.rule, case.dtype, case.name, platform, float("inf"), "", error=repr(e))
  return check_outputs(case, platform, got_x, got_state, count, inputs)

