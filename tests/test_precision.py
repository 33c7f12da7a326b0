"""Low precision never changes the algorithm silently: hyperparameters and state dtypes.

Two ways a 16-bit dtype used to turn a rule into another one without a word:

* ``optax.inject_hyperparams`` casts every float hyperparameter to the
  parameters' dtype by default (``hyperparam_dtype=None``): with bfloat16
  parameters ``beta = 0.999`` arrives as 1.0, with float16 ``epsilon = 1e-8``
  as 0. The rules compute their scalars in float32 at least, so a float
  hyperparameter array narrower than float32 is refused, with the fix
  (``hyperparam_dtype=jnp.float32``), which these tests follow literally:
  injected then equals plain, bit for bit, for every rule in bfloat16 and
  float16, with and without a float32 state.
* A ``state_dtype`` in which a decay rounds to 1: the state is computed in
  float32 but stored in bfloat16, and ``0.999 * V`` rounds back to ``V``.
  ``init`` refuses it as it refuses the same decay in the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from rule_configs import RULE_CONFIGS, as_float32_sees, shaped

import onnx_optax
from onnx_optax import onnx as ox

DTYPES = [jnp.bfloat16, jnp.float16]


def _params(dtype, name):
  """A matrix and a vector, the vector as ``name``'s rule takes a leaf (``shaped``: Muon's matrices)."""
  rng = np.random.default_rng(0)
  b = 1 + rng.uniform(size=3)
  return {
    "w": jnp.asarray(rng.normal(size=(3, 2)), dtype),
    "b": jnp.asarray(b.reshape(shaped(name, 3)), dtype),
  }


def _grads(dtype, k, shapes):
  rng = np.random.default_rng(k + 1)
  # Non-zero everywhere: an injected norm_coefficient of 0 reads X, a static one does not, and
  # 0 * X + (-0.0) is +0.0 where G = -0.0 (the only input where the two differ).
  return {
    "w": jnp.asarray(rng.normal(size=(3, 2)) + 3, dtype),
    "b": jnp.asarray(rng.uniform(0.1, 1, size=3).reshape(shapes["b"]), dtype),
  }


def _run(tx, params, steps):
  state = tx.init(params)
  for k in range(steps):
    updates, state = tx.update(_grads(params["w"].dtype, k, {"b": params["b"].shape}), state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def _same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x, np.float64), np.asarray(y, np.float64))


@pytest.mark.parametrize("state_dtype", [None, jnp.float32], ids=["own_state", "float32_state"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", sorted(RULE_CONFIGS))
def test_injected_16_bit_hyperparameters_are_refused_and_the_fix_is_the_plain_transform(
  name, dtype, state_dtype
):
  config = RULE_CONFIGS[name]
  hyper = {**config.hyper, "state_dtype": state_dtype}
  statics = (*config.static_args, "state_dtype")
  params = _params(dtype, name)
  with pytest.raises(TypeError, match=r"hyperparam_dtype=jnp\.float32"):
    optax.inject_hyperparams(config.make, static_args=statics)(config.learning_rate, **hyper).init(params)
  # The advice, followed literally.
  injected = optax.inject_hyperparams(config.make, static_args=statics, hyperparam_dtype=jnp.float32)
  got_params, got_state = _run(injected(config.learning_rate, **hyper), params, 4)
  # A twin computes 1 - beta from its Python numbers in float64 (Keras, PyTorch's dampening);
  # injected as float32 arrays, it computes the plain transform's result with those float32 values.
  plain = {k: as_float32_sees(v) for k, v in config.hyper.items()} if config.framework else config.hyper
  want_params, want_state = _run(
    config.make(config.learning_rate, **plain, state_dtype=state_dtype), params, 4
  )
  _same(got_params, want_params)
  _same(got_state.inner_state, want_state)


def test_the_issue_example_directml_in_bfloat16():
  """The default hyperparameters (beta2 = 0.999) and a float32 state: refused as injected, and
  with hyperparam_dtype the plain transform's result, where a bfloat16 beta2 froze the parameters."""
  p, g = jnp.ones(2, jnp.bfloat16), jnp.array([0.5, -1.0], jnp.bfloat16)
  inject = lambda **kw: optax.inject_hyperparams(onnx_optax.directml_adam, static_args=("state_dtype",), **kw)  # noqa: E731
  with pytest.raises(TypeError, match=r"arrived as a bfloat16 array.*hyperparam_dtype=jnp\.float32"):
    inject()(0.1, state_dtype=jnp.float32).init(p)
  # The advice, literally: hyperparam_dtype, and state_dtype among the static_args.
  advised = optax.inject_hyperparams(
    onnx_optax.directml_adam, hyperparam_dtype=jnp.float32, static_args=("state_dtype",)
  )
  with pytest.raises(TypeError, match=r"static_args=\('state_dtype',\) when you pass state_dtype"):
    inject()(0.1, state_dtype=jnp.float32).init(p)
  advised(0.1, state_dtype=jnp.float32).init(p)

  def run(tx):
    x, s = p, tx.init(p)
    for _ in range(3):
      u, s = tx.update(g, s)
      x = optax.apply_updates(x, u)
    return x

  got = run(inject(hyperparam_dtype=jnp.float32)(0.1, state_dtype=jnp.float32))
  np.testing.assert_array_equal(got, run(onnx_optax.directml_adam(0.1, state_dtype=jnp.float32)))
  # float64 evaluation of DirectML's formula: G constant, so M_new / sqrt(V_new) = sign(G) c_T.
  x = np.ones(2)
  m = v = np.zeros(2)
  for T in (1, 2, 3):
    m, v = 0.9 * m + 0.1 * np.array([0.5, -1.0]), 0.999 * v + 0.001 * np.array([0.25, 1.0])
    x = x - 0.1 * np.sqrt(1 - 0.999**T) / (1 - 0.9**T) * m / (np.sqrt(v) + 1e-8)
  np.testing.assert_allclose(np.asarray(got, np.float64), x, atol=2**-7)  # bfloat16 parameters
  assert not np.array_equal(np.asarray(got, np.float64), np.ones(2))


def test_a_schedule_of_16_bit_values_is_refused():
  opt = onnx_optax.adam(lambda count: jnp.asarray(1e-3, jnp.bfloat16), state_dtype=jnp.float32)
  params = jnp.ones(2, jnp.bfloat16)
  with pytest.raises(TypeError, match=r"learning_rate arrived as a bfloat16 array"):
    opt.update(params, opt.init(params))
  # Traced: the dtype is static, so jit refuses it the same way.
  with pytest.raises(TypeError, match=r"learning_rate arrived as a bfloat16 array"):
    jax.jit(opt.update)(params, opt.init(params))


def test_an_onnx_call_refuses_a_16_bit_R():
  """ONNX's R is float or double; a float16 R would round every scalar of the rule."""
  X = np.ones(2, np.float16)
  with pytest.raises(TypeError, match=r"R arrived as a float16 array"):
    ox.adam(np.float16(0.1), 1, X, X, X, X)
  ox.adam(np.float32(0.1), 1, X, X, X, X)


# -- the state's dtype against the decays --------------------------------------------


@pytest.mark.parametrize(
  "make, name",
  [
    (lambda sd: onnx_optax.directml_adam(1e-3, state_dtype=sd), "beta2"),
    # The first moments' rates (beta2 at 0.9, which bfloat16 does not round to 1).
    (lambda sd: onnx_optax.directml_adam(1e-3, beta1=0.999, beta2=0.9, state_dtype=sd), "beta1"),
    (lambda sd: onnx_optax.adam(1e-3, alpha=0.999, beta=0.9, state_dtype=sd), "alpha"),
    (lambda sd: onnx_optax.ort_adamw(1e-3, alpha=0.999, beta=0.9, state_dtype=sd), "alpha"),
    (lambda sd: onnx_optax.adam(1e-3, state_dtype=sd), "beta"),
    (lambda sd: onnx_optax.ort_adamw(1e-3, state_dtype=sd), "beta"),
    (
      lambda sd: onnx_optax.momentum(
        1e-3, alpha=0.999, beta=1.0, mode="standard", norm_coefficient=0.0, state_dtype=sd
      ),
      "alpha",
    ),
  ],
)
def test_a_state_dtype_in_which_a_decay_rounds_to_1_is_refused(make, name):
  """float32 parameters, bfloat16 state (optax's mu_dtype habit): 0.999 is 1.0 in bfloat16."""
  params = {"w": jnp.ones(3, jnp.float32)}
  with pytest.raises(
    ValueError,
    match=rf"{name}=0.999 rounds to 1.0 in bfloat16, the dtype params\['w'\] stores its state in"
    r".*state_dtype=jnp.float32",
  ):
    make(jnp.bfloat16).init(params)
  make(jnp.float32).init(params)  # the fix


def test_the_refused_bfloat16_state_would_have_stalled():
  """What the refusal prevents: DirectML's second moment computed in float32 and stored in bfloat16
  (NumPy and ml_dtypes, the rule's arithmetic), G = 0.5 for 5,000 steps, then G = 0 for 1,000: the
  float64 moving average is 0.25 (1 - 0.999^5000) = 0.2483, then 0.0913; the bfloat16 state stalls at
  0.0625 and forgets nothing. The transform refuses that state, eagerly and when a jitted init runs
  with a traced beta2; the float32 state the message advises follows float64."""
  import ml_dtypes

  def moment(G, n, v, dtype):
    for _ in range(n):
      v = (np.float32(0.999) * np.float32(v) + np.float32(1 - np.float32(0.999)) * np.float32(G * G)).astype(
        dtype
      )
    return v

  want = 0.25 * (1 - 0.999**5000)
  v = moment(0.5, 5000, np.zeros((), ml_dtypes.bfloat16), ml_dtypes.bfloat16)
  assert [float(v), float(moment(0.0, 1000, v, ml_dtypes.bfloat16))] == [0.0625, 0.0625]
  with pytest.raises(ValueError, match=r"beta2=0.999 rounds to 1.0 in bfloat16"):
    onnx_optax.directml_adam(1e-3, beta2=0.999, state_dtype=jnp.bfloat16).init(jnp.ones(1, jnp.float32))
  init = jax.jit(
    lambda b: onnx_optax.directml_adam(1e-3, beta2=b, state_dtype=jnp.bfloat16).init(jnp.ones(1))
  )
  with pytest.raises(Exception, match=r"beta2=0.99.* rounds to 1.0 in bfloat16"):
    jax.block_until_ready(init(0.999))

  opt = onnx_optax.directml_adam(1e-3, beta2=0.999, state_dtype=jnp.float32)

  def steps(state, G, n):
    return jax.lax.scan(lambda s, _: (opt.update(jnp.full(1, G), s)[1], None), state, length=n)[0]

  state = steps(opt.init(jnp.ones(1, jnp.float32)), 0.5, 5000)
  assert float(state.v[0]) == pytest.approx(want, rel=1e-4, abs=0)
  assert float(steps(state, 0.0, 1000).v[0]) == pytest.approx(want * 0.999**1000, rel=1e-4, abs=0)


def test_a_traced_decay_is_checked_when_the_program_runs():
  """``jax.jit(tx.init)`` of injected hyperparameters traces the decays: with a bfloat16 state,
  ``beta2 = 0.999`` would silently become 1.0. Running the program checks them (a host callback) and
  raises with the message and its fix; an abstract evaluation computes nothing and passes; the
  fix (a float32 state) passes under jit; a decay bfloat16 holds (0.9) passes."""
  params = [jnp.ones(2, jnp.bfloat16)]
  inj = optax.inject_hyperparams(
    onnx_optax.directml_adam, hyperparam_dtype=jnp.float32, static_args=("state_dtype",)
  )
  with pytest.raises(Exception, match=r"beta2=0.999.* rounds to 1.0 in bfloat16.*state_dtype=jnp.float32"):
    jax.block_until_ready(jax.jit(inj(0.1).init)(params))
  shapes = jax.eval_shape(inj(0.1).init, params)
  assert shapes.inner_state.v[0].dtype == jnp.bfloat16
  with pytest.raises(ValueError, match=r"beta2=0.999.* rounds to 1.0 in bfloat16"):
    inj(0.1).init(params)  # outside jit: checked at once
  state = jax.jit(inj(0.1, state_dtype=jnp.float32).init)(params)
  assert state.inner_state.v[0].dtype == jnp.float32
  jax.block_until_ready(jax.jit(inj(0.1, beta2=0.9).init)(params))


def test_a_float32_program_has_no_decay_callback():
  """The host callback that checks a traced decay is added only where a 16-bit dtype could round it
  to 1: a jitted float32 init (injected hyperparameters, traced decays) has none, while a bfloat16
  one has it. Planted, ``nmant < float32's`` as ``<=`` put a callback, a host round trip per
  init, in every float32 program."""
  inj = optax.inject_hyperparams(
    onnx_optax.directml_adam, hyperparam_dtype=jnp.float32, static_args=("state_dtype",)
  )

  def callbacks(dtype, **kw):
    jaxpr = jax.make_jaxpr(inj(0.1, **kw).init)([jnp.ones(2, dtype)])
    return str(jaxpr).count("callback")

  assert callbacks(jnp.float32) == 0
  assert callbacks(jnp.bfloat16, beta2=0.9) > 0


# -- PyTorch's 16-bit stores (the framework twins) -------------------------------------------------

_TORCH_16 = {"float16": "float16", "bfloat16": "bfloat16"}


def _sweep(dtype: str) -> np.ndarray:
  """float32 values over every binade of ``dtype``, its subnormals and its overflow included, each
  with its neighbours and the halfway points between ``dtype``'s numbers (the ties), both signs,
  zeros, infinities and a NaN."""
  info = ml_dtypes.finfo(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float16)
  low = float(info.smallest_subnormal)
  exponents = np.arange(np.log2(low) - 2, min(np.log2(float(info.max)) + 2, 127))  # float32's too
  rng = np.random.default_rng(0)
  base = np.exp2(exponents)[:, None] * (1 + rng.uniform(0, 1, (exponents.size, 16)))
  ties = np.exp2(exponents)[:, None] * (1 + (2 * np.arange(8) + 1) * 2.0 ** -(info.nmant + 1))
  tiny_ties = low * (np.arange(12) + 0.5)  # halfway between two subnormals, 0 and the smallest
  values = np.concatenate([base.ravel(), ties.ravel(), tiny_ties, [0.0, np.inf, np.nan, 2.0**-149]])
  values = values.astype(np.float32)
  neighbours = np.concatenate([np.nextafter(values, np.inf), np.nextafter(values, -np.inf)])
  values = np.concatenate([values, neighbours])
  return np.concatenate([values, -values])


def _pytorch_store(x: np.ndarray, dtype: str) -> np.ndarray:
  import torch

  return torch.from_numpy(x).to(getattr(torch, _TORCH_16[dtype])).float().numpy()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_stored_is_pytorchs_16_bit_conversion_subnormals_included(dtype):
  """``_pytorch.stored`` of a float32 result in float16 or bfloat16 is PyTorch's conversion to the
  bit (``Tensor.to``: round to nearest even), on every value of the sweep: subnormals (float16's
  from 2^-24, 1e-6 and 3e-8 among them), ties, overflow to inf, signed zeros, NaN. Both of its
  ways: the CPU's conversion (jitted and eager) and ``rounded_to`` (the other platforms', run here
  on the CPU). Planted, ``lax.reduce_precision`` alone (float16's subnormals flushed to 0, 1e-6
  stored as 0) fails it in float16."""
  from onnx_optax import _pytorch

  x = _sweep(dtype)
  want = _pytorch_store(x, dtype).view(np.uint32)
  narrow = jnp.dtype(dtype)
  ways = {
    "stored": lambda x: _pytorch.stored(x, narrow),
    "rounded_to": lambda x: _pytorch.rounded_to(x, narrow),
  }
  checked = 0
  for name, f in ways.items():
    for run in (f, jax.jit(f)):
      got = np.asarray(run(jnp.asarray(x)))
      assert got.dtype == np.float32
      differ = np.flatnonzero((got.view(np.uint32) != want) & ~(np.isnan(got) & np.isnan(x)))
      assert differ.size == 0, (name, x[differ[:4]], got[differ[:4]], want.view(np.float32)[differ[:4]])
      checked += 1
  subnormal = (x != 0) & (np.abs(x) < float(jnp.finfo(narrow).smallest_normal))
  assert checked == 4 and subnormal.sum() > 100
  if dtype == "float16":
    assert (
      _pytorch_store(np.array([1e-6, 3e-8], np.float32), dtype).tolist()
      == [
        float(np.float16(1e-6)),
        float(np.float16(3e-8)),
      ]
      != [0.0, 0.0]
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_alpha_is_pytorchs_16_bit_scalar(dtype):
  """``_pytorch.alpha``: the scalar of PyTorch's ``add(other, alpha=a)`` and ``add_(a)`` on 16-bit
  tensors, which ATen's CPU kernel converts to the tensors' dtype, through float32 (a double one
  ulp of float32 above a float16 tie rounds to the tie's even side, not up). Expected: PyTorch's
  own ``zeros.add(ones, alpha=a)`` and ``zeros.add_(a)``. float32 keeps the scalar as it is.
  Planted, the scalar returned unrounded fails it."""
  import torch

  from onnx_optax import _pytorch

  one = 1.0 + (2.0**-11 if dtype == "float16" else 2.0**-8)  # a tie of the dtype, exact in float32
  scalars = [0.01, 1e-8, 1e-4, 0.9, 1 - 0.9, -1e-3, one + 2.0**-40, 3e-39]
  t = getattr(torch, dtype)
  for a in scalars:
    want = {
      float(torch.zeros(40, dtype=t).add(torch.ones(40, dtype=t), alpha=a)[0]),
      float(torch.zeros(40, dtype=t).add_(a)[0]),
    }
    got = _pytorch.alpha(jnp.asarray(a, jnp.float32), jnp.dtype(dtype))
    assert {float(got)} == want, (a, float(got), want)
  assert _pytorch.alpha(0.01, jnp.float32) == 0.01 and _pytorch.alpha(None, jnp.dtype(dtype)) is None


def test_keras_adam_takes_no_step_on_bfloat16_with_beta_2_that_rounds_to_1():
  """What ``keras_adam``'s docstring and docs/interop.md say: Keras casts ``beta_2`` to the
  variable's dtype, so in bfloat16 a ``beta_2`` from 0.998046875 (the halfway point below 1,
  rounded to 1.0, even) up, Keras's default 0.999 among them, makes ``1 - beta_2 ** step`` 0
  and every update zero, as Keras 3.15.1 itself does (measured with ``keras.optimizers.Adam``
  on a bfloat16 variable, JAX backend); just below the halfway point, and in float32, it moves."""
  x = jnp.linspace(-1, 1, 6)
  g = jnp.linspace(0.3, -0.5, 6)

  def updates(dtype, **hyper):
    tx = onnx_optax.keras_adam(1e-3, **hyper)
    state = tx.init(x.astype(dtype))
    for _ in range(3):
      u, state = tx.update(g.astype(dtype), state, x.astype(dtype))
    return np.asarray(u, np.float32)

  for beta_2 in (0.999, 0.998046875):
    assert not updates(jnp.bfloat16, beta_2=beta_2).any(), beta_2
  assert updates(jnp.bfloat16, beta_2=0.998).all()
  assert updates(jnp.float32).all()
