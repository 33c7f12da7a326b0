"""docs/spec.md's range table and the checks agree, value by value at each boundary.

The ranges are read from the table "Hyperparameter ranges" itself (the
``range`` column of each kind's row), not restated here: at the lower bound
and at its neighbour below, at the upper bound and its neighbours on both
sides, every rule that has the kind must accept what the table includes and
refuse, naming the argument, what it excludes, through every entry point: the
Optax transform, the ONNX operator's call, DirectML's call and ONNX Runtime's
call. Then the arithmetic at the edges: the values refused because the
formula divides by zero (ONNX Runtime AdamW's ``beta = 1`` in mode 0; a
second-moment decay of 1 with ``epsilon = 0``), and the degenerate values
that are legal, with what they do (ONNX Adam's ``beta = 1``).
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import onnx_optax
from onnx_optax import directml
from onnx_optax import onnx as ox

SPEC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "spec.md"

MOMENTUM = dict(alpha=0.9, beta=0.9, mode="standard", norm_coefficient=0.0)
ONES, ZEROS = np.ones(3, np.float32), np.zeros(3, np.float32)

#: kind (the table's first column) -> (rule, argument, extra keyword arguments) of that kind.
KINDS: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
  "learning rate": [
    (r, "learning_rate", {}) for r in ("momentum", "adagrad", "adam", "directml_adam", "ort_adamw")
  ],
  "decay rate of a moment": [
    ("momentum", "alpha", {}),
    ("adam", "beta", {}),
    ("directml_adam", "beta2", {}),
    ("ort_adamw", "beta", {"adam_mode": 1}),
  ],
  "second-moment decay divided by its correction": [("ort_adamw", "beta", {"adam_mode": 0})],
  "decay rate of a first moment with bias correction": [
    ("adam", "alpha", {}),
    ("directml_adam", "beta1", {}),
    ("ort_adamw", "alpha", {}),
  ],
  "weight of the gradient": [("momentum", "beta", {})],
  "L2 coefficient": [
    ("momentum", "norm_coefficient", {}),
    ("adagrad", "norm_coefficient", {}),
    ("adam", "norm_coefficient", {}),
    ("ort_adamw", "weight_decay", {}),
  ],
  "decay of the parameters": [("adam", "norm_coefficient_post", {})],
  "learning-rate decay": [("adagrad", "decay_factor", {})],
  "epsilon": [(r, "epsilon", {}) for r in ("adagrad", "adam", "directml_adam", "ort_adamw")],
}


def _table() -> dict[str, tuple[str, str]]:
  """kind -> (hyperparameters cell, range cell), from docs/spec.md."""
  text = SPEC.read_text()
  section = text[text.index("## Hyperparameter ranges") :]
  section = section[: section.index("\n## ")]
  rows = {}
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
    if line.startswith("| ") and len(cells) == 4 and cells[0] not in ("kind", "---"):
      rows[cells[0]] = (cells[1], cells[2])
  return rows


def _bounds(range_cell: str) -> tuple[float, float, bool, bool]:
  """``(lo, hi, lo_included, hi_included)`` of a range cell: ``[0, 1)``, ``>= 0``, ``finite``."""
  if range_cell == "finite":
    return -np.inf, np.inf, False, False
  if m := re.fullmatch(r"`>= (\S+)`", range_cell):
    return float(m[1]), np.inf, True, False
  m = re.fullmatch(r"`([\[(])(\S+), (\S+)([\])])`", range_cell)
  assert m, f"a range the test cannot read: {range_cell}"
  return float(m[2]), float(m[3]), m[1] == "[", m[4] == "]"


def _probes(lo, hi, lo_in, hi_in):
  """(value, accepted) at each finite bound and its float32 neighbours; the infinities for 'finite'.

  float32 neighbours: the parameters here are float32, and a decay that
  float32 rounds to 1 is refused by another check (docs/numerics.md).
  """
  f32 = lambda x, to: float(np.nextafter(np.float32(x), np.float32(to)))  # noqa: E731
  probes = []
  for bound, included, inward in ((lo, lo_in, np.inf), (hi, hi_in, -np.inf)):
    if np.isfinite(bound):
      probes += [(bound, included), (f32(bound, inward), True), (f32(bound, -inward), False)]
    else:
      probes += [(bound, False), (f32(bound, -bound), True)]
  return probes


def _transform(rule, argument, value, extra):
  make = getattr(onnx_optax, rule)
  hyper = {**(MOMENTUM if rule == "momentum" else {}), **extra}
  if argument == "learning_rate":
    return make(value, **hyper).init({"w": jnp.ones(3)})
  return make(0.1, **{**hyper, argument: value}).init({"w": jnp.ones(3)})


def _call(rule, argument, value, extra):
  """The operator's own call (ONNX, DirectML or ONNX Runtime) with one hyperparameter set."""
  X = G = np.ones(3, np.float32)
  zeros = np.zeros(3, np.float32)
  if rule == "directml_adam":
    hyper = dict(learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8)
    return directml.adam_optimizer(X, zeros, zeros, G, np.uint32(1), **{**hyper, argument: value})
  if rule == "ort_adamw":
    name = "lr" if argument == "learning_rate" else argument
    lr = np.float32(value) if name == "lr" else np.float32(0.1)
    hyper = {} if name == "lr" else {argument: value}
    return ox.adamw_optimizer(lr, np.int64(1), [X], [G], [zeros], [zeros], **extra, **hyper)
  states = {"momentum": 1, "adagrad": 1, "adam": 2}[rule]
  required = MOMENTUM if rule == "momentum" else {}
  R = np.float32(value) if argument == "learning_rate" else np.float32(0.1)
  hyper = {} if argument == "learning_rate" else {argument: value}
  return getattr(ox, rule)(R, 1, X, G, *[zeros] * states, **{**required, **hyper})


def test_every_kind_is_a_row_of_the_table_and_names_its_hyperparameters():
  table = _table()
  # The learning rate's row names it as `learning_rate` (`R`); every other argument by name.
  assert set(KINDS) == set(table), set(KINDS) ^ set(table)
  for kind, pairs in KINDS.items():
    cell = table[kind][0]
    for _, argument, _ in pairs:
      assert f"`{argument}`" in cell, (kind, argument)


@pytest.mark.parametrize(
  "kind,rule,argument,extra", [(k, r, a, e) for k, pairs in KINDS.items() for r, a, e in pairs]
)
def test_each_boundary_of_the_table_is_the_checks(kind, rule, argument, extra):
  lo, hi, lo_in, hi_in = _bounds(_table()[kind][1])
  for value, accepted in _probes(lo, hi, lo_in, hi_in):
    for entry in (_transform, _call):
      if accepted:
        entry(rule, argument, value, extra)
      else:
        with pytest.raises(ValueError, match=argument if argument != "learning_rate" else "must be finite"):
          entry(rule, argument, value, extra)


# -- the arithmetic at the edges ------------------------------------------------------


def _updates(tx, grads, params, steps):
  state, out = tx.init(params), []
  for _ in range(steps):
    u, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, u)
    out.append(params)
  return out


def test_ort_adamw_beta_one_in_mode_0_is_refused_with_the_reason():
  """At beta = 1 mode 0 computes M2 / (1 - beta^step) = 0 / 0: NaN for every parameter."""
  for make in (
    lambda: onnx_optax.ort_adamw(0.1, beta=1.0),
    lambda: onnx_optax.ort_adamw(0.1, beta=np.float32(1.0), adam_mode=0),
    lambda: _call("ort_adamw", "beta", 1.0, {"adam_mode": 0}),
  ):
    with pytest.raises(ValueError, match=r"beta=1.0 with adam_mode=0.*0 / 0.*use beta < 1"):
      make()
  # The formula itself, traced so that no check can see the value: NaN everywhere.
  with jax.enable_x64(True):
    run = jax.jit(
      lambda b: _updates(onnx_optax.ort_adamw(0.1, beta=b), jnp.array([0.5, -1.0]), jnp.ones(2), 2)
    )
    assert np.all(np.isnan(run(1.0)[-1]))
  # Mode 1 at beta = 1: legal, and every update is 0 (lr_corrected = lr * Sqrt(0) / ...).
  out = _updates(
    onnx_optax.ort_adamw(0.1, beta=1.0, adam_mode=1, weight_decay=0.0), jnp.ones(2), jnp.ones(2), 3
  )
  assert all(np.array_equal(x, np.ones(2)) for x in out)
  # Without bias correction, lr * M1 / epsilon at every update (the table's words), in float64.
  with jax.enable_x64(True):
    tx = onnx_optax.ort_adamw(0.1, beta=1.0, adam_mode=1, correct_bias=False, weight_decay=0.0, epsilon=1e-4)
    out = _updates(tx, jnp.array([1.0, -1.0]), jnp.zeros(2), 2)
    M1 = [0.1 * np.array([1.0, -1.0]), (0.9 * 0.1 + 0.1) * np.array([1.0, -1.0])]
    np.testing.assert_allclose(out[0], -0.1 * M1[0] / 1e-4, rtol=1e-12)
    np.testing.assert_allclose(out[1], out[0] - 0.1 * M1[1] / 1e-4, rtol=1e-12)


@pytest.mark.parametrize(
  "make",
  [
    lambda eps: onnx_optax.adam(0.1, beta=1.0, epsilon=eps),
    lambda eps: onnx_optax.directml_adam(0.1, beta2=1.0, epsilon=eps),
    lambda eps: onnx_optax.ort_adamw(0.1, beta=1.0, adam_mode=1, epsilon=eps),
    lambda eps: ox.adam(np.float32(0.1), 1, ONES, ONES, ZEROS, ZEROS, beta=1.0, epsilon=eps),
    lambda eps: directml.adam_optimizer(
      ONES, ZEROS, ZEROS, ONES, 1, learning_rate=0.1, beta1=0.9, beta2=1.0, epsilon=eps
    ),
    lambda eps: ox.adamw_optimizer(
      np.float32(0.1), 1, [ONES], [ONES], [ZEROS], [ZEROS], adam_mode=1, beta=1.0, epsilon=eps
    ),
  ],
)
def test_second_moment_decay_one_with_epsilon_zero_is_refused(make):
  """From a zero state the second moment stays 0 at decay 1: with epsilon = 0 every step is x / 0."""
  with pytest.raises(ValueError, match=r"=1.0 with epsilon=0.*Sqrt\(0\) \+ 0"):
    make(0.0)
  make(1e-8)


def test_onnx_adam_beta_one_is_legal_and_degenerate_as_documented():
  """The table's example: the first update is R * V_new / epsilon, every later one 0."""
  with jax.enable_x64(True):
    X, G = jnp.array([1.0, 2.0]), jnp.array([1.0, -1.0])
    out = _updates(onnx_optax.adam(0.1, beta=1.0, epsilon=1e-4), G, X, 3)
    # float64 evaluation of the formula: V_new = (1 - 0.9) G, H_new = 0, X - R * V_new / (0 + epsilon).
    first = np.array([1.0, 2.0]) - 0.1 * (0.1 * np.array([1.0, -1.0])) / 1e-4
    np.testing.assert_allclose(out[0], first, rtol=1e-12)
    np.testing.assert_allclose(out[0], [-99.0, 102.0], rtol=1e-12)
    assert all(np.array_equal(x, out[0]) for x in out[1:])
