"""ONNX Runtime's own kernels as the expectation of ort_adamw, ort_sgd and onnx_optax.reference.

``onnxruntime-training-cpu`` (the test extra) registers the ``com.microsoft``
training operators in a plain ``InferenceSession``. Each test builds a model of
one ``AdamWOptimizer`` (or ``SGDOptimizerV2``) node with sequence inputs and
runs it for STEPS updates, ``step`` from 1 as ORT's training API feeds it.

The transform is compared one update at a time from the kernel's own state
("teacher forcing": the kernel's outputs are the next inputs of both), so each
update is checked against a bound on that update alone, and an error is not
hidden by the state's magnitude. The bound (``_bound``), per element, with
``u = 2**-24`` and ``S`` the step the kernel subtracts::

  |W_ours - W_kernel| <= e * |S| + lr_eff * 4u * A1 / den + 2u (|W'| + |W_new|) + 2u |lr wd W| + u |S|

* ``e``, the relative difference of the steps:
  - the kernel rounds ``alpha^step`` (taken in double) to float32 before
    ``1 - ...``: ``u alpha^t / (1 - alpha^t)`` relative in ``alpha_correction``,
    plus ``u`` for the subtraction; likewise ``beta``, whose correction enters
    under a square root (half of it). Ours, ``-expm1(t log alpha)`` in float32,
    is within ``8u`` (XLA's log and expm1 are within a few ulps);
  - the kernel's ``Sqrt`` is Eigen's vectorized root, not correctly rounded
    (docs/spec.md, section 5: measured 1.3 ulps at most, charged ``4u``), and up
    to 5 further roundings; ours ``1 / beta_correction`` and the product (one
    ``u`` after the root), the root and 4 roundings: ``16u`` in all, and ``5u``
    for the moments' own differences entering the root (below);
* ``lr_eff * 4u * A1 / den``: under jit XLA may fuse ``alpha * M1 + (1 - alpha) * G``
  into a multiply-add, so ``M1`` differs by up to ``4u A1``, ``A1 = |alpha M1| +
  |(1 - alpha) G|`` (it may cancel: an absolute term), through ``lr_eff / den``
  (``lr / alpha_correction`` or ``lr_corrected``; ``den`` the kernel's
  denominator); ``M2``'s terms are all positive: ``8u`` relative, half of it
  through the root (the ``5u`` above);
* ``2u (|W'| + |W_new|) + 2u |lr wd W|``: the two subtractions (decay and step)
  round on each side, and the decay's product;
* ``u |S|``: ``U = W_new - X`` when it is not exact.

The moments are held to the same ``4u A1`` and ``8u B2`` (``B2 = beta M2 +
(1 - beta) G^2``). The wrong variants of ``test_the_bound_catches_wrong_variants``
(the modes swapped, the decay after the step, epsilon inside the root, ``step``
off by one, the root of the second correction dropped, ``correct_bias``
ignored) break it at some update, each by a factor the test prints; the bound
is tight enough that ``lr * weight_decay = 2e-3`` (the decay's place) is seen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

ort = pytest.importorskip("onnxruntime", reason="the test extra's onnxruntime-training-cpu")
from onnx import TensorProto, helper  # noqa: E402

import onnx_optax  # noqa: E402
from onnx_optax import _numerics, reference, rules  # noqa: E402
from onnx_optax.rules import ort as ort_rules  # noqa: E402

STEPS = 120
SHAPES = [(37,), (8, 16)]
U = 2.0**-24
HYPER = dict(alpha=0.85, beta=0.95, epsilon=1e-3, weight_decay=0.1)
LR = 0.02
VERBOSE = False  # python tests/test_ort_kernel.py prints each case's excess over the bound


def _session(op, attrs):
  """A one-node model of ``op`` (com.microsoft), sequence inputs and outputs, ir_version 10."""
  seq = lambda name: helper.make_tensor_sequence_value_info(name, TensorProto.FLOAT, None)  # noqa: E731
  scalar = lambda name, t: helper.make_tensor_value_info(name, t, [])  # noqa: E731
  if op == "AdamWOptimizer":
    ins = [scalar("lr", TensorProto.FLOAT), scalar("step", TensorProto.INT64)]
    names = ["weights", "gradients", "momentums_1", "momentums_2"]
  else:
    ins, names = [scalar("lr", TensorProto.FLOAT)], ["weights", "gradients"]
  ins += [seq(n) for n in names]
  outs = ["updated_weights", "updated_momentums_1", "updated_momentums_2"][: len(names) - 1]
  node = helper.make_node(op, [i.name for i in ins], ["flag", *outs], domain="com.microsoft", **attrs)
  graph = helper.make_graph(
    [node],
    op,
    ins,
    [helper.make_tensor_value_info("flag", TensorProto.BOOL, None), *(seq(n) for n in outs)],
  )
  model = helper.make_model(
    graph,
    opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    ir_version=10,  # ORT 1.19 reads IR versions up to 10
  )
  return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _gradients(seed):
  """STEPS float32 gradients per tensor, magnitudes over three decades (epsilon matters for some)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(STEPS):
    scale = 10.0 ** rng.uniform(-2, 1)
    out.append(
      [(scale * rng.normal(size=s) * 10.0 ** rng.uniform(-1, 0, size=s)).astype(np.float32) for s in SHAPES]
    )
  return out


def _kernel_adamw(session, t, W, G, M1, M2):
  """One kernel update; the inputs are copied (the kernel updates its inputs in place)."""
  copy = lambda xs: [np.array(x, np.float32, copy=True) for x in xs]  # noqa: E731
  flag, W, M1, M2 = session.run(
    None,
    {
      "lr": np.array(LR, np.float32),
      "step": np.array(t, np.int64),
      "weights": copy(W),
      "gradients": copy(G),
      "momentums_1": copy(M1),
      "momentums_2": copy(M2),
    },
  )
  assert bool(flag)
  return W, M1, M2


def _bound(mode, cb, t, W, G, M1, M2, M1_new, M2_new):
  """Per-element bounds on ``|dW|, |dM1|, |dM2|`` of one update (the module docstring)."""
  f = lambda v: float(np.float32(v))  # noqa: E731  # the attributes are float32
  a, b, eps, wd, lr = (
    f(HYPER["alpha"]),
    f(HYPER["beta"]),
    f(HYPER["epsilon"]),
    f(HYPER["weight_decay"]),
    f(LR),
  )
  W, G, M1, M2, M1_new, M2_new = (np.asarray(x, np.float64) for x in (W, G, M1, M2, M1_new, M2_new))
  if cb:
    ac, bc = 1 - a**t, 1 - b**t
    e_corr = (U * a**t / ac + U + 8 * U) + (U * b**t / bc + U + 8 * U) / 2
  else:
    ac, bc, e_corr = 1.0, 1.0, 0.0
  e = e_corr + 16 * U + 5 * U
  if mode == 0:
    W1 = W - W * lr * wd
    den = np.sqrt(M2_new / bc) + eps
    lr_eff = lr / ac
    S = lr_eff * M1_new / den
    W_new = W1 - S
    decay = np.abs(W * lr * wd)
  else:
    den = np.sqrt(M2_new) + eps
    lr_eff = lr * np.sqrt(bc) / ac
    S = lr_eff * M1_new / den
    W1 = W - S
    W_new = W1 - lr * wd * W1
    decay = np.abs(lr * wd * W1)
  A1 = np.abs(a * M1) + np.abs((1 - a) * G)
  B2 = b * M2 + (1 - b) * G * G
  bound_W = e * np.abs(S) + lr_eff * 4 * U * A1 / den + 2 * U * (np.abs(W1) + np.abs(W_new)) + 2 * U * decay
  return bound_W + U * np.abs(S), 4 * U * A1, 8 * U * B2


def _excess(mode, cb, seed=0, count_offset=0, ours_hyper=None):
  """max over updates and elements of ``|ours - kernel| / bound`` (W, M1, M2), teacher-forced."""
  session = _session("AdamWOptimizer", dict(HYPER, adam_mode=mode, correct_bias=cb))
  ours_hyper = dict(HYPER, adam_mode=mode, correct_bias=bool(cb)) if ours_hyper is None else ours_hyper
  opt = onnx_optax.ort_adamw(LR, **ours_hyper)
  update, apply = jax.jit(opt.update), jax.jit(optax.apply_updates)
  rng = np.random.default_rng(seed + 100)
  W = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
  M1 = [np.zeros(s, np.float32) for s in SHAPES]
  M2 = [np.zeros(s, np.float32) for s in SHAPES]
  worst = {"W": 0.0, "M1": 0.0, "M2": 0.0}
  for t, G in enumerate(_gradients(seed), start=1):
    W_k, M1_k, M2_k = _kernel_adamw(session, t, W, G, M1, M2)
    state = onnx_optax.OrtAdamWState(
      jnp.int32(t + count_offset), [jnp.asarray(m) for m in M1], [jnp.asarray(m) for m in M2]
    )
    params = [jnp.asarray(w) for w in W]
    u, new_state = update([jnp.asarray(g) for g in G], state, params)
    W_o = [np.asarray(w) for w in apply(params, u)]
    for i in range(len(SHAPES)):
      bw, b1, b2 = _bound(mode, cb, t, W[i], G[i], M1[i], M2[i], M1_k[i], M2_k[i])
      for name, got, want, bnd in (
        ("W", W_o[i], W_k[i], bw),
        ("M1", np.asarray(new_state.m1[i]), M1_k[i], b1),
        ("M2", np.asarray(new_state.m2[i]), M2_k[i], b2),
      ):
        diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
        # 0 / 0 where both are exact and the bound is 0 (G = 0 never happens here).
        ratio = float(np.max(np.where(diff == 0, 0.0, diff / np.maximum(bnd, 1e-300))))
        worst[name] = max(worst[name], ratio)
    W, M1, M2 = W_k, M1_k, M2_k
  if VERBOSE:
    print("  " + ", ".join(f"{k} at {v:.3g} of its bound" for k, v in worst.items()))
  return max(worst.values())


CASES = [(0, 1), (1, 1), (1, 0)]  # ORT refuses adam_mode=0 with correct_bias=0


@pytest.mark.parametrize("mode,cb", CASES, ids=["mode0", "mode1", "mode1_no_bias_correction"])
def test_ort_adamw_follows_the_kernel_within_the_bound(mode, cb):
  assert _excess(mode, cb) <= 1.0


def test_ort_refuses_mode0_without_bias_correction():
  """Why mode 0 runs with correct_bias=1 only: the kernel refuses the pair, and so does the transform."""
  with pytest.raises(Exception, match="correct_bias should be 1"):
    _session("AdamWOptimizer", dict(HYPER, adam_mode=0, correct_bias=0))
  with pytest.raises(ValueError, match="correct_bias"):
    onnx_optax.ort_adamw(0.1, adam_mode=0, correct_bias=False)


def test_omitted_weight_decay_is_the_schema_default():
  """ORT fills an omitted attribute from the schema (weight_decay 0.01), as ort_adamw's default."""
  rng = np.random.default_rng(3)
  W, G = [rng.normal(size=5).astype(np.float32)], [rng.normal(size=5).astype(np.float32)]
  Z = [np.zeros(5, np.float32)]
  omitted = _kernel_adamw(_session("AdamWOptimizer", {}), 1, W, G, Z, Z)[0][0]
  explicit = _kernel_adamw(_session("AdamWOptimizer", {"weight_decay": 0.01}), 1, W, G, Z, Z)[0][0]
  none = _kernel_adamw(_session("AdamWOptimizer", {"weight_decay": 0.0}), 1, W, G, Z, Z)[0][0]
  np.testing.assert_array_equal(omitted, explicit)
  assert np.any(omitted != none)
  assert onnx_optax.ort_adamw.__kwdefaults__["weight_decay"] == 0.01


# ----------------------------------------------------------------------------
# The bound has teeth: each wrong variant breaks it.


def _decay_after(s, X, G, M1, M2, *, adam_mode):
  """Mode 0 with the decay after the step instead of before."""
  U, M1_new, M2_new = _true_elementwise(s._replace(weight_decay=None), X, G, M1, M2, adam_mode=adam_mode)
  W = X + U
  return (W - W * s.lr * s.weight_decay) - X, M1_new, M2_new


def _epsilon_inside(s, X, G, M1, M2, *, adam_mode):
  """Mode 0 with epsilon inside the root."""
  M1_new = s.alpha * M1 + s.one_minus_alpha * G
  M2_new = s.beta * M2 + s.one_minus_beta * G * G
  W = X - X * s.lr * s.weight_decay
  step = (s.lr * M1_new) / (s.alpha_correction * jnp.sqrt(M2_new * s.one_over_beta_correction + s.epsilon))
  return (W - step) - X, M1_new, M2_new


def _root_dropped(R, T, **kw):
  """The square root of the second bias correction dropped (both modes)."""
  s = _true_scalars(R, T, **kw)
  if kw["adam_mode"] == 0:
    return s._replace(one_over_beta_correction=s.one_over_beta_correction**2)  # sqrt(M2) / bc
  ac, bc = (_numerics.one_minus_power(kw[d], jnp.asarray(T)) for d in ("alpha", "beta"))
  return s._replace(lr_corrected=R * bc / ac)


_true_elementwise = rules.ort_adamw_elementwise
_true_scalars = rules.ort_adamw_scalars

VARIANTS = {
  "modes_swapped_0": (0, 1, dict(ours=dict(adam_mode=1))),
  "modes_swapped_1": (1, 1, dict(ours=dict(adam_mode=0))),
  "decay_after_the_step": (0, 1, dict(elementwise=_decay_after)),
  "epsilon_inside_the_root": (0, 1, dict(elementwise=_epsilon_inside)),
  "step_off_by_one_mode0": (0, 1, dict(count_offset=1)),
  "step_off_by_one_mode1": (1, 1, dict(count_offset=1)),
  "root_of_beta_correction_dropped_0": (0, 1, dict(scalars=_root_dropped)),
  "root_of_beta_correction_dropped_1": (1, 1, dict(scalars=_root_dropped)),
  "correct_bias_ignored": (1, 0, dict(ours=dict(correct_bias=True))),
  "correct_bias_ignored_other_way": (1, 1, dict(ours=dict(correct_bias=False))),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_bound_catches_wrong_variants(variant, monkeypatch):
  mode, cb, how = VARIANTS[variant]
  if "elementwise" in how:
    monkeypatch.setattr(ort_rules.RULE, "elementwise", how["elementwise"])
  if "scalars" in how:
    monkeypatch.setattr(ort_rules.RULE, "scalars", how["scalars"])
  ours = {**HYPER, "adam_mode": mode, "correct_bias": bool(cb), **how.get("ours", {})}
  if ours["adam_mode"] == 0:
    ours["correct_bias"] = True
  excess = _excess(mode, cb, count_offset=how.get("count_offset", 0), ours_hyper=ours)
  assert excess > 1.0, f"{variant}: within the bound ({excess:.2f} of it)"
  if VERBOSE:
    print(f"{variant}: {excess:.3g} times the bound")


# ----------------------------------------------------------------------------
# The NumPy expectation against the kernel


@pytest.mark.parametrize("mode,cb", CASES, ids=["mode0", "mode1", "mode1_no_bias_correction"])
def test_reference_is_the_kernel_up_to_its_square_root(mode, cb):
  """reference.ort_adamw in float32 is the kernel's arithmetic: moments to the bit, W within the root's error.

  The kernel's Sqrt is not correctly rounded (up to 4u charged, module
  docstring), then up to 5 roundings may go either way on each side: ``14u``
  of the step, plus the last rounding of each subtraction on each side.
  """
  session = _session("AdamWOptimizer", dict(HYPER, adam_mode=mode, correct_bias=cb))
  rng = np.random.default_rng(7)
  n = 4099  # Eigen's packets and its scalar tail
  W, G = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
  M1 = (0.3 * rng.normal(size=n)).astype(np.float32)
  M2 = np.abs(rng.normal(size=n)).astype(np.float32)
  f32 = {k: np.float32(v) for k, v in HYPER.items()}
  for t in (1, 2, 50):
    (W_k,), (M1_k,), (M2_k,) = _kernel_adamw(session, t, [W], [G], [M1], [M2])
    W_r, M1_r, M2_r = reference.ort_adamw(
      np.float32(LR), t, W, G, M1, M2, **f32, adam_mode=mode, correct_bias=cb, dtype=np.float32
    )
    np.testing.assert_array_equal(M1_r, M1_k)
    np.testing.assert_array_equal(M2_r, M2_k)
    S = np.abs(np.asarray(W, np.float64) - W_r)
    bound = 14 * U * S + 2 * (np.spacing(np.abs(W_r)) + np.spacing(np.abs(W)))
    assert np.all(np.abs(W_r.astype(np.float64) - W_k) <= bound), t
    assert np.any(W_r != W_k)  # the root is not correctly rounded: this is not the bit


# ----------------------------------------------------------------------------
# SGDOptimizerV2


def test_ort_sgd_is_the_kernel_to_the_bit():
  """W + (-lr * G) in float32: the same two roundings, over STEPS updates from the kernel's own W."""
  session = _session("SGDOptimizerV2", {})
  opt = onnx_optax.ort_sgd(LR)
  update, apply = jax.jit(opt.update), jax.jit(optax.apply_updates)
  rng = np.random.default_rng(5)
  W = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
  params = [jnp.asarray(w) for w in W]
  state = opt.init(params)
  for G in _gradients(5):
    flag, W = session.run(
      None,
      {"lr": np.array(LR, np.float32), "weights": [w.copy() for w in W], "gradients": [g.copy() for g in G]},
    )
    assert bool(flag)
    u, state = update([jnp.asarray(g) for g in G], state)
    params = apply(params, u)
    for p, w in zip(params, W):
      np.testing.assert_array_equal(np.asarray(p), w)
  assert int(state.count) == STEPS


if __name__ == "__main__":
  # The margins: PYTHONPATH=. python tests/test_ort_kernel.py
  VERBOSE = True
  for mode, cb in CASES:
    print(f"adam_mode={mode} correct_bias={cb}: {_excess(mode, cb):.3g} of the bound")
  mp = pytest.MonkeyPatch()
  for name in sorted(VARIANTS):
    with mp.context() as m:
      test_the_bound_catches_wrong_variants(name, m)
