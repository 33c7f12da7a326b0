"""onnx_optax.onnx on ONNX Runtime's optimizers (com.microsoft) against ONNX Runtime itself.

Expected values come from ONNX Runtime's CPU kernels (``onnxruntime-training``:
an ``InferenceSession`` on a model holding the node, and its training API on
the artifacts of ``generate_artifacts``), never from this package's output,
except in the equivalence tests (``from_node`` vs ``run_node``, jit vs eager).

Tolerance (``AdamWOptimizer``): element by element, the sum of two rigorous
rounding-error bounds built with ``onnx_optax.conformance.tolerance``'s
running error analysis, one per side, each in its own evaluation order:

* ours: the rules' order in float32 on this platform
  (``implementation_context``), bias corrections as ``-expm1(T log beta)``
  in the hyperparameters' dtype (``Context.one_minus_power``), mode 0's
  ``M2 / beta_correction`` as ``M2 * (1 / beta_correction)``, then
  ``X + U`` where ``U = W_new - X`` (with weight decay);
* ONNX Runtime's kernel (``adamw.cc``): float32 operations on float32
  attributes (IEEE, but for Eigen's square root, see ``_ort_context``),
  ``1 - float32(pow(alpha, step))`` with ``pow`` in double, and
  ``lr_corrected = lr * (Sqrt(beta_correction) / alpha_correction)``.

The kernel's bias corrections are the less accurate side: ``pow`` rounded to
float32 before ``1 -`` loses ``1 / (1 - beta^step)`` ulps (10^4 for
``beta = 0.9999`` at ``step = 1``), which the bound charges. Where the two
sides perform the same float32 operations on the same operands (the moments;
``SGDOptimizerV2``'s ``W + (-lr * G)``) they agree to the bit on CPU, where
XLA does not contract ``a*b + c`` into an FMA; elsewhere the bound applies.

ONNX Runtime updates the arrays it is fed in place (the kernel aliases its
inputs and its outputs, and a NumPy array in a sequence input is not
copied): every feed here is a fresh copy.
"""

from __future__ import annotations

import functools
import os
import types
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

onnx = pytest.importorskip("onnx", reason="run_node and from_node need the onnx extra")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the expectation")
from onnx import TensorProto, helper  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax import onnx as ox  # noqa: E402
from onnx_optax.conformance import tolerance  # noqa: E402

MS = "com.microsoft"
ADAMW_INPUTS = ["lr", "step", "weights", "gradients", "momentums_1", "momentums_2"]
ADAMW_OUTPUTS = ["updated_flag", "updated_weights", "updated_momentums_1", "updated_momentums_2"]
SGD_INPUTS = ["lr", "weights", "gradients"]
SGD_OUTPUTS = ["update_completed", "updated_weights"]
#: AdamWOptimizer's defaults in ONNX Runtime's schema (training_op_defs.cc), as the float32 a node stores.
ORT_DEFAULTS = dict(alpha=0.9, beta=0.999, epsilon=1e-8, weight_decay=1e-2, correct_bias=1, adam_mode=0)
CPU = jax.default_backend() == "cpu"


def _f32(x: float) -> float:
  return float(np.float32(x))


# -- ONNX Runtime ------------------------------------------------------------------------


def _session(node: Any) -> Any:
  """An InferenceSession on a model holding ``node`` alone (ir_version 10: ORT 1.19 loads up to 10)."""
  seq = functools.partial(helper.make_tensor_sequence_value_info, elem_type=TensorProto.FLOAT, shape=None)
  types = {"lr": TensorProto.FLOAT, "step": TensorProto.INT64, "update_signal": TensorProto.BOOL}
  inputs = [
    helper.make_tensor_value_info(name, types[name], []) if name in types else seq(name)
    for name in node.input
    if name
  ]
  outputs = [
    helper.make_tensor_value_info(name, TensorProto.BOOL, None) if i == 0 else seq(name)
    for i, name in enumerate(node.output)
    if name
  ]
  graph = helper.make_graph([node], "optimizer", inputs, outputs)
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
  model.ir_version = 10
  return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run_ort(node: Any, inputs: list[Any]) -> list[Any]:
  """ONNX Runtime's outputs for the node's non-empty output names, fed fresh copies."""
  feeds = {
    name: ([np.array(t, copy=True) for t in value] if isinstance(value, list) else np.array(value, copy=True))
    for name, value in zip(node.input, inputs)
    if name
  }
  return _session(node).run(None, feeds)


# -- the bound --------------------------------------------------------------------------


def _ort_context() -> tolerance.Context:
  """ONNX Runtime's CPU kernel: float32 operations on float32 attributes (exact operands).

  Its ``Sqrt`` is Eigen's vectorized root, measured up to one ulp from the
  correctly rounded one (docs/spec.md, section 5): 1.5 ulps in all, charged
  ``k_sqrt = 4`` unit roundoffs (2 ulps), as tests/test_ort_kernel.py does.
  Its other operations are IEEE. ``tiny`` is float32's smallest normal: it
  covers a kernel that flushes subnormals and one that does not. A fused
  ``a*b + c`` is one rounding where the bound counts two.
  """
  u = 2.0**-24
  return tolerance.Context(np.dtype(np.float32), u, float(np.finfo(np.float32).smallest_normal), k_sqrt=4.0)


def _ours_context() -> tolerance.Context:
  return tolerance.implementation_context(np.float32, jax.default_backend())


def _as_bounded(x: Any) -> tolerance.Bounded:
  return x if isinstance(x, tolerance.Bounded) else tolerance.Bounded(np.asarray(x, np.float64))


def _scalars(c: tolerance.Context, ours: bool, lr: float, step: int, h: dict) -> tuple:
  """``lr, alpha_correction, beta_correction, lr_corrected, lr * weight_decay`` as each side computes them.

  Ours returns ``1 / beta_correction`` in the third place: the rule multiplies
  by it (XLA turns a division by a broadcast scalar into that product anyway).
  """
  if ours:  # rules.ort_adamw_scalars: in float32 (the hyperparameters' dtype), then rounded to X's.
    s = c.scalar
    assert s is not None
    if h["correct_bias"]:
      ac, bc = s.one_minus_power(h["alpha"], step), s.one_minus_power(h["beta"], step)
      lr_c = s.div(s.mul(s.const(lr), s.sqrt(bc)), ac)
    else:
      ac = bc = s.exact(1.0)
      lr_c = s.const(lr)
    lr_wd = s.mul(s.const(lr), s.const(h["weight_decay"]))
    return c.const(lr), *(c.to_elementwise(x) for x in (ac, s.div(s.exact(1.0), bc), lr_c, lr_wd))

  def correction(decay: float) -> tolerance.Bounded:
    # 1.f - static_cast<float>(std::pow(decay, step)): pow in double (1 ulp), rounded to float32.
    p = float(decay) ** step
    e = 2.0**-52 * p
    return c.sub(c.exact(1.0), tolerance.Bounded(p, e + c.u * (p + e) + c.tiny))

  if h["correct_bias"]:
    ac, bc = correction(h["alpha"]), correction(h["beta"])
    lr_c = c.mul(c.const(lr), c.div(c.sqrt(bc), ac))  # lr_corrected *= sqrt(bc) / ac
  else:
    ac = bc = c.exact(1.0)
    lr_c = c.const(lr)
  return c.const(lr), ac, bc, lr_c, c.mul(c.const(lr), c.const(h["weight_decay"]))


def _adamw_bounded(ours: bool, lr: float, step: int, X: Any, G: Any, M1: Any, M2: Any, h: dict) -> tuple:
  """One AdamWOptimizer update of one tensor in Bounded arithmetic: ``(W_new, M1_new, M2_new)``.

  ``X``, ``M1``, ``M2`` may carry errors (a previous step's bounds); ``G`` is exact.
  """
  c = _ours_context() if ours else _ort_context()
  lr_, ac, bc, lr_c, lr_wd = _scalars(c, ours, lr, step, h)
  X, M1, M2, G = _as_bounded(X), _as_bounded(M1), _as_bounded(M2), c.exact(np.asarray(G, np.float64))
  alpha, beta, eps, wd = (c.const(h[k]) for k in ("alpha", "beta", "epsilon", "weight_decay"))
  M1_new = c.add(c.mul(alpha, M1), c.mul(c.one_minus(h["alpha"]), G))
  M2_new = c.add(c.mul(beta, M2), c.mul(c.mul(c.one_minus(h["beta"]), G), G))
  if h["adam_mode"] == 0:
    W = c.sub(X, c.mul(c.mul(X, lr_), wd))
    M2_corrected = c.mul(M2_new, bc) if ours else c.div(M2_new, bc)  # Ours: bc is 1 / beta_correction.
    W_new = c.sub(W, c.div(c.mul(lr_, M1_new), c.mul(ac, c.add(c.sqrt(M2_corrected), eps))))
  else:
    W = c.sub(X, c.div(c.mul(lr_c, M1_new), c.add(c.sqrt(M2_new), eps)))
    W_new = c.sub(W, c.mul(lr_wd, W))
  if ours and h["weight_decay"] != 0:  # U = W_new - X, then optax.apply_updates' X + U.
    W_new = c.add(X, c.sub(W_new, X))
  return W_new, M1_new, M2_new


def _bounds(lr: float, step: int, X, G, M1, M2, h: dict) -> list[np.ndarray]:
  """The allowed |ours - ONNX Runtime| of ``W_new, M1_new, M2_new``: both sides' bounds."""
  a = _adamw_bounded(True, lr, step, X, G, M1, M2, h)
  b = _adamw_bounded(False, lr, step, X, G, M1, M2, h)
  return [x.e + y.e + np.abs(x.v - y.v) for x, y in zip(a, b)]


def _assert_within(actual, expected, bound, what: str) -> None:
  a64, e64 = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  assert a64.shape == e64.shape, f"{what}: shape {a64.shape} != {e64.shape}"
  err = np.abs(a64 - e64)
  assert np.all(err <= bound), f"{what}: differs by {err.max()} > bound {bound.flat[np.argmax(err - bound)]}"


# -- random AdamWOptimizer nodes -----------------------------------------------------------


def _attributes(mode: int, correct_bias: int, omit: bool, rng: np.random.Generator) -> dict:
  if omit:
    return {}
  return dict(
    alpha=_f32(rng.uniform(0.5, 0.99)),
    beta=_f32(rng.choice([rng.uniform(0.9, 0.999), 0.9999])),
    epsilon=_f32(10 ** rng.uniform(-8, -5)),
    weight_decay=_f32(rng.choice([0.0, rng.uniform(0, 0.1)])),
    correct_bias=correct_bias,
    adam_mode=mode,
  )


def _sequences(n: int, scale: str, rng: np.random.Generator) -> tuple[list, ...]:
  """weights, gradients, momentums_1, momentums_2; ``tiny``: gradients ~1e-8, where epsilon matters."""
  g = 1e-8 if scale == "tiny" else 1.0
  shapes = [(4,), (2, 3), ()][:n] if n > 1 else [(16,)]
  W = [rng.normal(size=s).astype(np.float32) for s in shapes]
  G = [(g * rng.normal(size=s)).astype(np.float32) for s in shapes]
  M1 = [(g * rng.normal(size=s)).astype(np.float32) for s in shapes]
  M2 = [(g * g * rng.uniform(0, 2, size=s)).astype(np.float32) for s in shapes]
  return W, G, M1, M2


CASES = [
  (mode, correct_bias, n, step, omit, scale)
  for mode, correct_bias in ((0, 1), (1, 1), (1, 0))
  for n in (1, 3)
  for step in (1, 2, 10, 1000)
  for omit in (False, True)
  for scale in ("normal", "tiny")
  if not (omit and (mode, correct_bias) != (0, 1))  # Omitted attributes: the schema's, mode 0.
]


@pytest.mark.parametrize("mode, correct_bias, n, step, omit, scale", CASES)
def test_adamw_node_agrees_with_onnxruntime(mode, correct_bias, n, step, omit, scale):
  rng = np.random.default_rng(zlib.crc32(repr((mode, correct_bias, n, step, omit, scale)).encode()))
  attributes = _attributes(mode, correct_bias, omit, rng)
  node = helper.make_node("AdamWOptimizer", ADAMW_INPUTS, ADAMW_OUTPUTS, domain=MS, **attributes)
  full = {k: _f32(v) if isinstance(v, float) else v for k, v in {**ORT_DEFAULTS, **attributes}.items()}
  W, G, M1, M2 = _sequences(n, scale, rng)
  lr, T = np.array(rng.uniform(0.001, 0.1), np.float32), np.array(step, np.int64)
  expected = _run_ort(node, [lr, T, W, G, M1, M2])
  ours = ox.run_node(node, lr, T, W, G, M1, M2)
  assert len(ours) == 4 and bool(ours[0]) and ours[0].dtype == np.bool_ and ours[0].shape == ()
  assert bool(expected[0])
  for i in range(n):
    bounds = _bounds(float(lr), step, W[i], G[i], M1[i], M2[i], full)
    for k, what in enumerate(("updated_weights", "updated_momentums_1", "updated_momentums_2")):
      actual, exp = ours[1 + k][i], expected[1 + k][i]
      assert actual.dtype == np.float32 and actual.shape == W[i].shape
      _assert_within(actual, exp, bounds[k], f"{what}[{i}]")
      if k > 0 and CPU:  # The same float32 operations on the same operands.
        np.testing.assert_array_equal(actual, exp, err_msg=f"{what}[{i}] not to the bit")


def test_tiny_gradients_make_epsilon_matter():
  """The "tiny" cases above are ones where epsilon (1e-8 by default) changes the step (by 1% or more)."""
  rng = np.random.default_rng(0)
  W, G, M1, M2 = _sequences(1, "tiny", rng)
  args = (np.float32(0.01), np.int64(10), W, G, M1, M2)
  with_eps = ox.adamw_optimizer(*args, epsilon=_f32(1e-8), weight_decay=0.0)[1][0]
  without = ox.adamw_optimizer(*args, epsilon=0.0, weight_decay=0.0)[1][0]
  assert np.all(np.abs(W[0] - with_eps) < 0.99 * np.abs(W[0] - without))


def test_bound_is_tight_enough_to_see_a_mode_swap():
  """The bound does not hide the modes' difference: mode 1's result fails the comparison with ORT's mode 0."""
  rng = np.random.default_rng(1)
  W, G, M1, M2 = _sequences(1, "normal", rng)
  h = {k: _f32(v) if isinstance(v, float) else v for k, v in ORT_DEFAULTS.items()}
  mode0 = _run_ort(
    helper.make_node("AdamWOptimizer", ADAMW_INPUTS, ADAMW_OUTPUTS, domain=MS),
    [np.float32(0.05), np.int64(3), W, G, M1, M2],
  )[1][0]
  mode1 = ox.adamw_optimizer(np.float32(0.05), np.int64(3), W, G, M1, M2, **{**h, "adam_mode": 1})[1][0]
  bound = _bounds(_f32(0.05), 3, W[0], G[0], M1[0], M2[0], h)[0]
  assert np.any(np.abs(np.asarray(mode1, np.float64) - mode0) > bound)


def test_outputs_present_or_absent_as_the_node_declares():
  rng = np.random.default_rng(2)
  W, G, M1, M2 = _sequences(2, "normal", rng)
  inputs = [np.float32(0.05), np.int64(2), W, G, M1, M2]
  full = ox.run_node(helper.make_node("AdamWOptimizer", ADAMW_INPUTS, ADAMW_OUTPUTS, domain=MS), *inputs)
  # generate_artifacts' nodes declare the flag alone (ONNX Runtime updates its inputs in place).
  flag_only = helper.make_node("AdamWOptimizer", ADAMW_INPUTS, ["updated_flag"], domain=MS)
  (flag,) = ox.run_node(flag_only, *inputs)
  (ort_flag,) = _run_ort(flag_only, inputs)
  assert bool(flag) and bool(ort_flag)
  gaps = helper.make_node("AdamWOptimizer", ADAMW_INPUTS, ["f", "", "", "m2"], domain=MS)
  ours = ox.run_node(gaps, *inputs)
  expected = _run_ort(gaps, inputs)  # ONNX Runtime returns the named outputs: flag, momentums_2.
  assert len(ours) == 4 and ours[1] is None and ours[2] is None
  assert len(expected) == 2
  for mine, theirs, complete in zip(ours[3], expected[1], full[3]):
    np.testing.assert_array_equal(mine, complete)
    if CPU:
      np.testing.assert_array_equal(mine, theirs)
  weights_only = helper.make_node("AdamWOptimizer", ADAMW_INPUTS, ["f", "w"], domain=MS)
  ours = ox.run_node(weights_only, *inputs)
  assert len(ours) == 2
  jax.tree.map(np.testing.assert_array_equal, ours[1], full[1])
  sgd = helper.make_node("SGDOptimizerV2", SGD_INPUTS, ["done"], domain=MS)
  (done,) = ox.run_node(sgd, np.float32(0.1), W, G)
  assert bool(done) and bool(_run_ort(sgd, [np.float32(0.1), W, G])[0])


# -- SGDOptimizerV2 -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3])
def test_sgd_node_agrees_with_onnxruntime(n):
  rng = np.random.default_rng(3 + n)
  node = helper.make_node("SGDOptimizerV2", SGD_INPUTS, SGD_OUTPUTS, domain=MS)
  for _ in range(5):
    W, G, _, _ = _sequences(n, "normal", rng)
    lr = np.array(rng.uniform(0.001, 1.0), np.float32)
    expected = _run_ort(node, [lr, W, G])
    done, ours = ox.run_node(node, lr, W, G)
    assert bool(done) and done.dtype == np.bool_ and bool(expected[0])
    for i in range(n):
      # W + (-lr * G): two float32 roundings on both sides.
      bound = 2.0**-24 * (np.abs(lr * G[i]) + np.abs(expected[1][i])) * 2
      _assert_within(ours[i], expected[1][i], bound, f"updated_weights[{i}]")
      if CPU:
        np.testing.assert_array_equal(ours[i], expected[1][i])


# -- update_signal --------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["AdamWOptimizer", "SGDOptimizerV2"])
@pytest.mark.parametrize("signal", [False, True])
def test_update_signal(op, signal):
  """False leaves every tensor as it was and the flag False, as ONNX Runtime; True is the plain update."""
  rng = np.random.default_rng(5)
  W, G, M1, M2 = _sequences(2, "normal", rng)
  if op == "AdamWOptimizer":
    names, outputs, inputs = ADAMW_INPUTS, ADAMW_OUTPUTS, [np.float32(0.05), np.int64(4), W, G, M1, M2]
    kept = [W, M1, M2]
  else:
    names, outputs, inputs = SGD_INPUTS, SGD_OUTPUTS, [np.float32(0.05), W, G]
    kept = [W]
  node = helper.make_node(op, [*names, "update_signal"], outputs, domain=MS)
  plain = helper.make_node(op, names, outputs, domain=MS)
  sig = np.array(signal)
  expected = _run_ort(node, [*inputs, sig])
  ours = ox.run_node(node, *inputs, sig)
  assert bool(ours[0]) is signal and bool(expected[0]) is signal
  jitted = jax.jit(functools.partial(ox.run_node, node))(*inputs, jnp.asarray(signal))  # A traced signal.
  assert bool(jitted[0]) is signal
  reference = kept if not signal else ox.run_node(plain, *inputs)[1:]
  for k, (mine, traced, theirs, want) in enumerate(zip(ours[1:], jitted[1:], expected[1:], reference)):
    for i, (a, t, e, w) in enumerate(zip(mine, traced, theirs, want)):
      np.testing.assert_array_equal(a, w)
      if not signal:  # Untouched, to the bit, on every platform, traced or not.
        np.testing.assert_array_equal(t, w)
        np.testing.assert_array_equal(e, w)
      elif op == "AdamWOptimizer":  # Compiled, the update may round differently from eager: the bound.
        h = {k: _f32(v) if isinstance(v, float) else v for k, v in ORT_DEFAULTS.items()}
        _assert_within(t, e, _bounds(_f32(0.05), 4, W[i], G[i], M1[i], M2[i], h)[k], f"traced {k}[{i}]")
      else:
        _assert_within(t, e, 4 * 2.0**-24 * (np.abs(0.05 * G[i]) + np.abs(e)), f"traced [{i}]")


# -- jit -----------------------------------------------------------------------------------


def test_run_node_under_jit_with_traced_step():
  node = helper.make_node("AdamWOptimizer", ADAMW_INPUTS, ADAMW_OUTPUTS, domain=MS, adam_mode=1)
  rng = np.random.default_rng(6)
  step = jax.jit(functools.partial(ox.run_node, node))
  h = {k: _f32(v) if isinstance(v, float) else v for k, v in {**ORT_DEFAULTS, "adam_mode": 1}.items()}
  for T in (1, 7):
    W, G, M1, M2 = _sequences(2, "normal", rng)
    ours = step(np.float32(0.01), jnp.asarray(T), W, G, M1, M2)
    expected = _run_ort(node, [np.float32(0.01), np.int64(T), W, G, M1, M2])
    for i in range(2):
      bounds = _bounds(_f32(0.01), T, W[i], G[i], M1[i], M2[i], h)
      for k in range(3):
        _assert_within(ours[1 + k][i], expected[1 + k][i], bounds[k], f"jit output {k}[{i}]")
  assert step._cache_size() == 1


# -- from_node -----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "op, attributes",
  [
    ("AdamWOptimizer", {}),
    ("AdamWOptimizer", dict(adam_mode=1, epsilon=1e-6, weight_decay=0.0)),  # generate_artifacts' node
    ("AdamWOptimizer", dict(adam_mode=1, alpha=0.8, beta=0.99, weight_decay=0.05)),
    ("AdamWOptimizer", dict(adam_mode=1, correct_bias=0, weight_decay=0.01)),
    ("AdamWOptimizer", dict(adam_mode=0, alpha=0.5, beta=0.75, epsilon=1e-5, weight_decay=0.0)),
    ("SGDOptimizerV2", {}),
  ],
)
def test_from_node_one_update_equals_one_node_execution(op, attributes):
  rng = np.random.default_rng(7)
  params = {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in (("a", (3,)), ("b", (2, 2)))}
  grads = {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32) for k, v in params.items()}
  lr = 0.05
  names, outputs = (ADAMW_INPUTS, ADAMW_OUTPUTS) if op == "AdamWOptimizer" else (SGD_INPUTS, SGD_OUTPUTS)
  node = helper.make_node(op, names, outputs, domain=MS, **attributes)
  opt = ox.from_node(node, lr)
  updates, state = opt.update(grads, opt.init(params), params)
  new_params = optax.apply_updates(params, updates)
  W, G = [params["a"], params["b"]], [grads["a"], grads["b"]]
  if op == "AdamWOptimizer":
    zeros = [jnp.zeros_like(w) for w in W]
    # ONNX Runtime's training loop feeds step = its count + 1: 1 at the first update.
    _, W_new, M1_new, M2_new = ox.run_node(node, np.float32(lr), np.int64(1), W, G, zeros, zeros)
    jax.tree.map(np.testing.assert_array_equal, [state.m1["a"], state.m1["b"]], M1_new)
    jax.tree.map(np.testing.assert_array_equal, [state.m2["a"], state.m2["b"]], M2_new)
    assert int(state.count) == 2
    full = {**ORT_DEFAULTS, **attributes}
    full = {k: _f32(v) if isinstance(v, float) else v for k, v in full.items()}
    full["correct_bias"] = bool(full["correct_bias"])
    same = onnx_optax.ort_adamw(lr, **full)
  else:
    _, W_new = ox.run_node(node, np.float32(lr), W, G)
    same = onnx_optax.ort_sgd(lr)
  np.testing.assert_array_equal(new_params["a"], W_new[0])
  np.testing.assert_array_equal(new_params["b"], W_new[1])
  # And the transform is the one the node names, with its attributes (schema defaults filled in).
  reference_updates, _ = same.update(grads, same.init(params), params)
  jax.tree.map(np.testing.assert_array_equal, updates, reference_updates)


# -- a real optimizer_model.onnx ---------------------------------------------------------------


@functools.cache
def _artifacts(kind: str) -> str:
  """generate_artifacts on a small PyTorch MLP exported to ONNX; the directory.

  onnx 1.23 writes ``ir_version`` 14, which ONNX Runtime 1.19 does not load
  (it stops at 10): the models are saved back with 10, nothing else changed.
  """
  import io
  import tempfile

  torch = pytest.importorskip("torch")
  from onnxruntime.training import artifacts

  torch.manual_seed(0)
  net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).train()
  buffer = io.BytesIO()
  torch.onnx.export(
    net,
    (torch.randn(5, 4),),
    buffer,
    input_names=["x"],
    output_names=["y"],
    do_constant_folding=False,  # Keeps the parameters as initializers, which generate_artifacts trains.
    dynamo=False,
  )
  model = onnx.load_from_string(buffer.getvalue())
  directory = tempfile.mkdtemp(prefix=f"onnx_optax_{kind}_")
  artifacts.generate_artifacts(
    model,
    requires_grad=[p.name for p in model.graph.initializer],
    loss=artifacts.LossType.MSELoss,
    optimizer=getattr(artifacts.OptimType, kind),
    artifact_directory=directory,
  )
  for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
    path = os.path.join(directory, name)
    saved = onnx.load(path)
    saved.ir_version = min(saved.ir_version, 10)
    onnx.save(saved, path)
  return directory


STEPS = 8


def _ort_training_run(directory: str, lr: float) -> tuple[dict, list[dict], list[dict]]:
  """ONNX Runtime's training API: STEPS steps; the initial parameters, each step's gradients and result."""
  from onnxruntime.training.api import CheckpointState, Module, Optimizer

  state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
  module = Module(
    os.path.join(directory, "training_model.onnx"), state, os.path.join(directory, "eval_model.onnx")
  )
  optimizer = Optimizer(os.path.join(directory, "optimizer_model.onnx"), module)
  optimizer.set_learning_rate(lr)
  module.train()
  names = [name for name, _ in state.parameters]
  initial = {name: state.parameters[name].data.copy() for name in names}
  rng = np.random.default_rng(8)
  grads, params = [], []
  for _ in range(STEPS):
    x = rng.normal(size=(5, 4)).astype(np.float32)
    y = rng.normal(size=(5, 3)).astype(np.float32)
    module(x, y)
    grads.append({name: state.parameters[name].grad.copy() for name in names})
    optimizer.step()
    module.lazy_reset_grad()
    params.append({name: state.parameters[name].data.copy() for name in names})
  return initial, grads, params


@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_from_model_steps_as_onnxruntime_training(kind):
  """generate_artifacts' optimizer_model.onnx: from_model's transform, fed ORT's gradients, follows ORT."""
  directory = _artifacts(kind)
  path = os.path.join(directory, "optimizer_model.onnx")
  lr = _f32(0.05)
  initial, grads, expected = _ort_training_run(directory, lr)
  assert any(not np.array_equal(initial[k], expected[-1][k]) for k in initial), "ORT's run moved nothing"
  opt = ox.from_model(path, learning_rate=lr)
  assert opt is not None and callable(opt.update)
  params = {k: jnp.asarray(v) for k, v in initial.items()}
  state = opt.init(params)
  update = jax.jit(opt.update)
  node = onnx.load(path).graph.node[0]
  h = {**ORT_DEFAULTS, **{a.name: helper.get_attribute_value(a) for a in node.attribute}}
  # Each side's bound on its distance to the exact trajectory (float64), carried from step to step.
  zeros = {k: np.zeros_like(v, np.float64) for k, v in initial.items()}
  tracks = {k: [(v, zeros[k], zeros[k])] * 2 for k, v in initial.items()}
  sgd_error = dict(zeros)
  for t in range(STEPS):
    g = {k: jnp.asarray(v) for k, v in grads[t].items()}
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    for k in params:
      what = f"step {t + 1}, {k}"
      if kind == "SGD":
        # W + (-lr * G), two float32 roundings per side and step, added up over the steps.
        sgd_error[k] = sgd_error[k] + 2 * 2 * 2.0**-24 * (np.abs(lr * grads[t][k]) + np.abs(expected[t][k]))
        _assert_within(params[k], expected[t][k], sgd_error[k], what)
        if CPU:
          np.testing.assert_array_equal(params[k], expected[t][k], err_msg=what)
        continue
      tracks[k] = [
        _adamw_bounded(ours, lr, t + 1, X, grads[t][k], M1, M2, h)
        for ours, (X, M1, M2) in zip((True, False), tracks[k])
      ]
      (w_ours, *_), (w_ort, *_) = tracks[k]
      _assert_within(params[k], expected[t][k], w_ours.e + w_ort.e + np.abs(w_ours.v - w_ort.v), what)


# -- bad input ----------------------------------------------------------------------------


def _good(n: int = 2) -> list[Any]:
  W, G, M1, M2 = _sequences(n, "normal", np.random.default_rng(9))
  return [np.float32(0.05), np.int64(3), W, G, M1, M2]


def _replace(inputs: list, i: int, value: Any) -> list:
  return [value if j == i else x for j, x in enumerate(inputs)]


def _in(inputs: list, k: int, i: int, value: Any) -> list:
  """``inputs`` with tensor ``i`` of sequence input ``k`` replaced."""
  sequence = list(inputs[k])
  sequence[i] = value
  return _replace(inputs, k, sequence)


GOOD = _good()
W0 = GOOD[2][0]


@pytest.mark.parametrize(
  "inputs, kwargs, error, match",
  [
    # Sequences: lengths, types, shapes, dtypes.
    (_replace(GOOD, 3, GOOD[3][:1]), {}, ValueError, "gradients holds 1 tensors but weights holds 2"),
    (_replace(GOOD, 5, [*GOOD[5], W0]), {}, ValueError, "momentums_2 holds 3 tensors but weights holds 2"),
    (_replace(GOOD, 2, W0), {}, TypeError, "weights must be a list of arrays"),
    (_replace(GOOD, 2, []), {}, ValueError, "weights is empty"),
    (_in(GOOD, 4, 1, GOOD[4][1].T), {}, ValueError, r"momentums_1\[1\] has shape \(3, 2\) but weights\[1\]"),
    (_in(GOOD, 3, 0, GOOD[3][0].astype(np.float16)), {}, TypeError, r"gradients\[0\] has dtype float16"),
    (_in(GOOD, 2, 0, W0.astype(np.int32)), {}, TypeError, r"weights\[0\] has dtype int32"),
    (_in(GOOD, 5, 1, GOOD[5][1].tolist()), {}, TypeError, r"momentums_2\[1\] must be an array"),
    # lr.
    (_replace(GOOD, 0, 1), {}, TypeError, "lr must be a float scalar"),
    (
      _replace(GOOD, 0, np.array([0.1, 0.2], np.float32)),
      {},
      TypeError,
      r"lr must be a float scalar .*\(2,\)",
    ),
    (_replace(GOOD, 0, float("nan")), {}, ValueError, "lr must be finite"),
    # step.
    (_replace(GOOD, 1, np.float32(3)), {}, TypeError, "step must be an integer scalar"),
    (_replace(GOOD, 1, 3.0), {}, TypeError, "step must be an integer scalar"),
    (_replace(GOOD, 1, True), {}, TypeError, "step must be an integer scalar"),
    (_replace(GOOD, 1, np.int8(3)), {}, TypeError, "step must be an int64 scalar"),
    (_replace(GOOD, 1, np.uint64(3)), {}, TypeError, "step must be an int64 scalar"),
    (
      _replace(GOOD, 1, np.array([3, 4], np.int64)),
      {},
      TypeError,
      r"step must be an integer scalar .*\(2,\)",
    ),
    (_replace(GOOD, 1, np.int64(0)), {}, ValueError, "step must be >= 1.*correct_bias"),
    (_replace(GOOD, 1, np.int64(-1)), dict(adam_mode=1, correct_bias=0), ValueError, "step must be >= 0"),
    (_replace(GOOD, 1, np.int64(2**40)), {}, ValueError, "does not fit int32.*enable_x64"),
    # update_signal.
    ([*GOOD, np.float32(1)], {}, TypeError, "update_signal must be a bool scalar"),
    ([*GOOD, np.array([True, False])], {}, TypeError, "update_signal must be a bool scalar"),
    ([*GOOD, types.SimpleNamespace(dtype=np.dtype(bool))], {}, TypeError, "update_signal must be a bool"),
    # Attributes.
    (GOOD, dict(adam_mode=2), ValueError, r"adam_mode must be one of \(0, 1\)"),
    (GOOD, dict(adam_mode="1"), ValueError, r"adam_mode must be one of \(0, 1\)"),
    (GOOD, dict(correct_bias=2), ValueError, r"correct_bias must be one of \(0, 1\)"),
    (GOOD, dict(adam_mode=0, correct_bias=0), ValueError, "correct_bias=False with adam_mode=0"),
    (GOOD, dict(alpha="0.9"), TypeError, "alpha must be a real number"),
    (GOOD, dict(epsilon=float("inf")), ValueError, "epsilon must be finite"),
    # Ranges: alpha in [0, 1) (the bias correction divides by 1 - alpha^step), beta in [0, 1].
    (GOOD, dict(alpha=1.0), ValueError, r"alpha must be < 1.0.*bias correction 1 - alpha\^T is 0"),
    (GOOD, dict(beta=1.5), ValueError, r"beta must be <= 1.0"),
    (GOOD, dict(weight_decay=-0.1), ValueError, r"weight_decay must be >= 0"),
    # Shape (1,) is ONNX Runtime's scalar; (1, 1) is not one.
    (_replace(GOOD, 0, np.full((1, 1), 0.1, np.float32)), {}, TypeError, r"lr must be a float .*\(1, 1\)"),
    (_replace(GOOD, 1, np.full((1, 1), 3, np.int64)), {}, TypeError, r"step must be an integer .*\(1, 1\)"),
  ],
)
def test_bad_adamw_inputs(inputs, kwargs, error, match):
  with pytest.raises(error, match=match):
    ox.adamw_optimizer(*inputs, **kwargs)


def test_bad_inputs_raise_with_a_skipped_step_too():
  """The checks come before the update_signal: a skipped step does not hide a bad call."""
  with pytest.raises(ValueError, match="gradients holds 1 tensors"):
    ox.adamw_optimizer(*_replace(GOOD, 3, GOOD[3][:1]), np.array(False))
  with pytest.raises(ValueError, match="correct_bias=False with adam_mode=0"):
    ox.adamw_optimizer(*GOOD, False, adam_mode=0, correct_bias=0)


def test_bad_sgd_inputs():
  lr, _, W, G, _, _ = GOOD
  with pytest.raises(ValueError, match="gradients holds 1 tensors but weights holds 2"):
    ox.sgd_optimizer_v2(lr, W, G[:1])
  with pytest.raises(TypeError, match=r"gradients\[1\] has dtype float64"):
    ox.sgd_optimizer_v2(lr, W, [G[0], G[1].astype(np.float64)])
  with pytest.raises(TypeError, match="lr must be a float scalar"):
    ox.sgd_optimizer_v2(np.int64(1), W, G)
  with pytest.raises(TypeError, match="gradients must be a list of arrays"):
    ox.sgd_optimizer_v2(lr, W, G[0])


def test_shape_one_scalars_as_generate_artifacts_declares_them():
  """lr and step of shape (1,) (optimizer_model.onnx's inputs): accepted, the flag has step's shape."""
  lr, step, *rest = GOOD
  flag, W, _, _ = ox.adamw_optimizer(np.array([lr]), np.array([step]), *rest)
  plain = ox.adamw_optimizer(lr, step, *rest)
  assert flag.shape == (1,) and bool(flag[0])
  jax.tree.map(np.testing.assert_array_equal, W, plain[1])
  done, _ = ox.sgd_optimizer_v2(np.array([lr]), rest[0], rest[1])
  assert done.shape == (1,)


def _adamw_node(inputs=ADAMW_INPUTS, outputs=ADAMW_OUTPUTS, domain=MS, **attributes):
  return helper.make_node("AdamWOptimizer", inputs, outputs, domain=domain, **attributes)


@pytest.mark.parametrize(
  "node, inputs, error, match",
  [
    (_adamw_node(domain=""), GOOD, ValueError, "node.domain must be"),
    (_adamw_node(domain="ai.onnx.preview.training"), GOOD, ValueError, "node.op_type must be one of"),
    (helper.make_node("AdamOptimizer", ADAMW_INPUTS, ["f"], domain=MS), GOOD, ValueError, "node.op_type"),
    (_adamw_node(adam_mode=2), GOOD, ValueError, r"node.attribute 'adam_mode' must be one of \(0, 1\)"),
    (_adamw_node(correct_bias=-1), GOOD, ValueError, r"node.attribute 'correct_bias' must be one of"),
    (_adamw_node(adam_mode=1.0), GOOD, TypeError, "'adam_mode' must be of type INT"),
    (_adamw_node(alpha=1), GOOD, TypeError, "'alpha' must be of type FLOAT"),
    (_adamw_node(lambda_=0.1), GOOD, ValueError, "no attribute 'lambda_'"),
    (_adamw_node(inputs=ADAMW_INPUTS[:5]), GOOD[:5], ValueError, "node.input: AdamWOptimizer has 6 to 7"),
    (_adamw_node(inputs=[*ADAMW_INPUTS, "s", "x"]), [*GOOD, None, None], ValueError, "has 6 to 7 inputs"),
    (
      _adamw_node(inputs=["lr", "", *ADAMW_INPUTS[2:]]),
      GOOD,
      ValueError,
      r"node.input\[1\] \(step\) is empty",
    ),
    (_adamw_node(), GOOD[:5], ValueError, "node.input lists 6 inputs but 5 were given"),
    (_adamw_node(inputs=[*ADAMW_INPUTS, ""]), [*GOOD, np.array(True)], ValueError, "pass None for it"),
    (_adamw_node(inputs=[*ADAMW_INPUTS, "s"]), [*GOOD, None], ValueError, "named 's' but None was given"),
    (_adamw_node(outputs=[]), GOOD, ValueError, "node.output: AdamWOptimizer has 1 to 4 outputs"),
    (_adamw_node(outputs=[*ADAMW_OUTPUTS, "x"]), GOOD, ValueError, "has 1 to 4 outputs"),
    (_adamw_node(outputs=["", "w"]), GOOD, ValueError, r"node.output\[0\] \(updated_flag\) is empty"),
  ],
)
def test_bad_nodes(node, inputs, error, match):
  with pytest.raises(error, match=match):
    ox.run_node(node, *inputs)


def test_empty_optional_input_is_none():
  node = _adamw_node(inputs=[*ADAMW_INPUTS, ""])
  ours = ox.run_node(node, *GOOD, None)
  jax.tree.map(np.testing.assert_array_equal, ours, ox.run_node(_adamw_node(), *GOOD))


def test_opset():
  assert len(ox.run_node(_adamw_node(), *GOOD, opset=1)) == 4
  with pytest.raises(ValueError, match="opset 2: AdamWOptimizer of com.microsoft exists in version 1 only"):
    ox.run_node(_adamw_node(), *GOOD, opset=2)


def test_bad_nodes_for_from_node():
  with pytest.raises(ValueError, match=r"node.attribute 'adam_mode' must be one of"):
    ox.from_node(_adamw_node(adam_mode=3), 0.1)
  with pytest.raises(ValueError, match="correct_bias=False with adam_mode=0"):
    ox.from_node(_adamw_node(correct_bias=0), 0.1)
  with pytest.raises(ValueError, match="node.input: AdamWOptimizer has 6 to 7 inputs"):
    ox.from_node(_adamw_node(inputs=ADAMW_INPUTS[:4]), 0.1)
  with pytest.raises(ValueError, match=r"node.input\[0\] \(lr\) is empty"):
    ox.from_node(helper.make_node("SGDOptimizerV2", ["", "w", "g"], ["f"], domain=MS), 0.1)


# -- from_model refusals ----------------------------------------------------------------------


def _model(nodes: list, opset: int = 1) -> Any:
  seq = functools.partial(helper.make_tensor_sequence_value_info, elem_type=TensorProto.FLOAT, shape=None)
  names = sorted({name for node in nodes for name in node.input if name})
  inputs = [
    helper.make_tensor_value_info(n, TensorProto.FLOAT if n == "lr" else TensorProto.INT64, [1])
    if n in ("lr", "step")
    else seq(n)
    for n in names
  ]
  outputs = [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.BOOL, [1])]
  graph = helper.make_graph(nodes, "optimizer", inputs, outputs)
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, opset)])


def test_from_model_takes_a_model_proto_or_a_path(tmp_path):
  node = _adamw_node(outputs=["updated_flag"], adam_mode=1, weight_decay=0.05)
  model = _model([node])
  path = tmp_path / "optimizer_model.onnx"
  onnx.save(model, path)
  params = {"w": jnp.asarray(W0)}
  grads = {"w": jnp.asarray(GOOD[3][0])}
  expected = ox.from_node(node, 0.01)
  want, _ = expected.update(grads, expected.init(params), params)
  for source in (model, path, str(path)):
    opt = ox.from_model(source, learning_rate=0.01)
    got, _ = opt.update(grads, opt.init(params), params)
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_from_model_refusals():
  adamw = _adamw_node(outputs=["f1"])
  sgd = helper.make_node("SGDOptimizerV2", SGD_INPUTS, ["f2"], domain=MS)
  clip = helper.make_node("InplaceClipGradNorm", ["gradients"], ["clipped"], domain=MS, max_norm=1.0)
  clipped = _adamw_node(inputs=[*ADAMW_INPUTS[:3], "clipped", *ADAMW_INPUTS[4:]], outputs=["f1"])
  with pytest.raises(ValueError, match="model.graph holds no optimizer node.*its nodes: com.microsoft.Inpl"):
    ox.from_model(_model([clip]), learning_rate=0.1)
  with pytest.raises(ValueError, match="model.graph holds 2 optimizer nodes") as two:
    ox.from_model(_model([adamw, sgd]), learning_rate=0.1)
  # Nodes are described by domain, type and name where they have one (these have none).
  assert "(com.microsoft.AdamWOptimizer, com.microsoft.SGDOptimizerV2)" in str(two.value)
  adamw.name = "opt"
  with pytest.raises(ValueError, match=r"\(com.microsoft.AdamWOptimizer 'opt', com.micro"):
    ox.from_model(_model([adamw, sgd]), learning_rate=0.1)
  adamw.name = ""
  with pytest.raises(ValueError, match="nodes besides the optimizer .*InplaceClipGradNorm"):
    ox.from_model(_model([clip, clipped]), learning_rate=0.1)
  with pytest.raises(ValueError, match="opset 2: AdamWOptimizer of com.microsoft exists in version 1 only"):
    ox.from_model(_model([adamw], opset=2), learning_rate=0.1)
  with pytest.raises(TypeError, match="model must be a path or an onnx.ModelProto"):
    ox.from_model(_model([adamw]).SerializeToString(), learning_rate=0.1)
  with pytest.raises(ValueError, match="node.attribute 'adam_mode' must be one of"):
    ox.from_model(_model([_adamw_node(outputs=["f"], adam_mode=5)]), learning_rate=0.1)


def test_from_model_takes_onnx_training_nodes_too():
  node = helper.make_node(
    "Adagrad", ["R", "T", "X", "G", "H"], ["X_new", "H_new"], domain="ai.onnx.preview.training"
  )
  graph = helper.make_graph(
    [node],
    "g",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.input],
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output],
  )
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.preview.training", 1)])
  params = {"w": jnp.asarray(W0)}
  grads = {"w": jnp.asarray(GOOD[3][0])}
  got, _ = ox.from_model(model, 0.1).update(grads, ox.from_model(model, 0.1).init(params), params)
  want, _ = ox.from_node(node, 0.1).update(grads, ox.from_node(node, 0.1).init(params), params)
  jax.tree.map(np.testing.assert_array_equal, got, want)
  bad = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.preview.training", 2)])
  with pytest.raises(ValueError, match="opset 2"):
    ox.from_model(bad, 0.1)


def test_the_operator_calls_defaults_are_ort_schemas():
  """``onnx_optax.onnx.adamw_optimizer``'s keyword defaults are AdamWOptimizer's schema defaults (the
  node reader's are checked against ONNX Runtime itself above): a call without them is the
  node without attributes."""
  import inspect

  defaults = {
    name: p.default
    for name, p in inspect.signature(ox.adamw_optimizer).parameters.items()
    if p.kind == inspect.Parameter.KEYWORD_ONLY
  }
  assert defaults == ORT_DEFAULTS


def test_the_transforms_defaults_are_ort_schemas_and_training_loop():
  """``onnx_optax.ort_adamw``'s defaults are the schema's (a transform made without them runs the
  node without attributes, whose defaults ONNX Runtime itself checks above), and it starts at
  ``step = 1``, as ONNX Runtime's training loop feeds it. ``SGDOptimizerV2`` has no step, so
  ``ort_sgd`` counts as Optax does: ``optax.scale_by_schedule``'s count, 0 at ``init``."""
  import inspect

  parameters = inspect.signature(onnx_optax.ort_adamw).parameters
  defaults = {name: parameters[name].default for name in ORT_DEFAULTS}
  assert defaults == ORT_DEFAULTS
  assert parameters["initial_count"].default == 1
  params = jnp.ones(3)
  ours, theirs = onnx_optax.ort_sgd(0.1), optax.scale_by_schedule(lambda count: 0.1)
  state, optax_state = ours.init(params), theirs.init(params)
  for _ in range(2):
    assert int(state.count) == int(optax_state.count)
    _, state = ours.update(params, state)
    _, optax_state = theirs.update(params, optax_state)
  assert int(state.count) == int(optax_state.count) == 2


def test_a_concrete_true_update_signal_costs_no_select():
  """``update_signal=True`` known at trace time is the plain update: none of the per-tensor
  ``select`` that a traced signal adds (one per output tensor) in the program."""
  lr, step, W, G, M1, M2 = GOOD

  def selects(*signal):  # (): no signal; (True,): a Python True; (): traced below
    program = jax.make_jaxpr(lambda *a: ox.adamw_optimizer(*a, *signal))(lr, step, W, G, M1, M2)
    return str(program).count("select_n")

  traced = jax.make_jaxpr(lambda s, *a: ox.adamw_optimizer(*a, s))(jnp.asarray(True), lr, step, W, G, M1, M2)
  assert selects(True) == selects() < str(traced).count("select_n")
