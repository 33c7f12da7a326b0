"""Carrying a PyTorch run into one's own Flax NNX model: the layout map, its derivation, the journeys.

The journeys: a model defined in PyTorch and its Flax NNX port (their float64
forward passes equal first), trained some steps in PyTorch, carried with the
optimizer's state into the port by ``layout=``, trained in JAX, written back,
trained again in PyTorch. The losses at every step and the final weights are
the run that never left PyTorch's, to 1e-12, in float64. Expected values are
PyTorch's own run's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

from onnx_optax.interop import from_torch, from_torch_state_dict, to_torch, to_torch_state_dict
from onnx_optax.interop.flax_nnx import derive
from onnx_optax.interop.layout import Layout, concat, part

pytestmark = pytest.mark.usefixtures("x64")

TOL = 1e-12


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


F64 = dict(param_dtype=jnp.float64, dtype=jnp.float64)


def dtypes(dtype):
  """A Flax layer's parameters and computation in ``dtype``."""
  return dict(param_dtype=dtype, dtype=dtype)


# -- the models and their ports ----------------------------------------------------------------------

E, HEADS, VOCAB, SEQ = 8, 2, 11, 5


class TorchTransformer(torch.nn.Module):
  """Embedding, multi-head self-attention, LayerNorms, an MLP and an output head tied to the embedding."""

  def __init__(self):
    super().__init__()
    self.embed = torch.nn.Embedding(VOCAB, E)
    # No projection biases: the key's is a parameter without gradient (softmax does not see it),
    # whose rounding noise Adam's and Adagrad's normalisation would make a step.
    self.attn = torch.nn.MultiheadAttention(E, HEADS, bias=False, batch_first=True)
    self.norm1 = torch.nn.LayerNorm(E)
    self.mlp = torch.nn.Sequential(torch.nn.Linear(E, 16), torch.nn.GELU(), torch.nn.Linear(16, E))
    self.norm2 = torch.nn.LayerNorm(E)
    self.head = torch.nn.Linear(E, VOCAB, bias=False)
    self.head.weight = self.embed.weight

  def forward(self, tokens):
    h = self.embed(tokens)
    a, _ = self.attn(h, h, h, need_weights=False)
    h = self.norm1(h + a)
    h = self.norm2(h + self.mlp(h))
    return self.head(h)


def attention(query, key, value, *args, **kwargs):
  """Scaled dot-product attention in the inputs' dtype (nnx's default, jax.nn.dot_product_attention,
  was 5e-8 off PyTorch's in float64 here)."""
  weights = jax.nn.softmax(jnp.einsum("...qhd,...khd->...hqk", query / jnp.sqrt(query.shape[-1]), key))
  return jnp.einsum("...hqk,...khd->...qhd", weights, value)


class NnxTransformer(nnx.Module):
  def __init__(self, rngs, dtype=jnp.float64):
    d = dtypes(dtype)
    self.embed = nnx.Embed(VOCAB, E, rngs=rngs, **d)
    self.attn = nnx.MultiHeadAttention(
      HEADS, E, decode=False, use_bias=False, attention_fn=attention, rngs=rngs, **d
    )
    self.norm1 = nnx.LayerNorm(E, epsilon=1e-5, rngs=rngs, **d)
    gelu = lambda x: nnx.gelu(x, approximate=False)  # noqa: E731
    self.mlp = nnx.Sequential(nnx.Linear(E, 16, rngs=rngs, **d), gelu, nnx.Linear(16, E, rngs=rngs, **d))
    self.norm2 = nnx.LayerNorm(E, epsilon=1e-5, rngs=rngs, **d)

  def __call__(self, tokens):
    h = self.embed(tokens)
    h = self.norm1(h + self.attn(h))
    h = self.norm2(h + self.mlp(h))
    return self.embed.attend(h)  # the tied head


class TorchConvNet(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.conv1 = torch.nn.Conv2d(2, 4, 3, padding=1, bias=False)  # a bias before BatchNorm has no gradient
    self.bn = torch.nn.BatchNorm2d(4)
    self.conv2 = torch.nn.Conv2d(4, 3, 3, stride=2)
    self.fc = torch.nn.Linear(3 * 2 * 2, 3)

  def forward(self, x):  # NCHW
    h = torch.relu(self.bn(self.conv1(x)))
    return self.fc(torch.tanh(self.conv2(h)).flatten(1))


class TorchBatchNorm(nnx.BatchNorm):
  """nnx.BatchNorm whose running variance is PyTorch's: the batch's unbiased variance
  (nnx.BatchNorm's running variance is the biased one, which PyTorch uses only to normalize), its
  statistics in the parameters' dtype (nnx.BatchNorm keeps them in float32)."""

  def __init__(self, num_features, **kwargs):
    super().__init__(num_features, **kwargs)
    self.mean = nnx.BatchStat(jnp.zeros(num_features, kwargs["param_dtype"]))
    self.var = nnx.BatchStat(jnp.ones(num_features, kwargs["param_dtype"]))

  def __call__(self, x, use_running_average=None):
    if use_running_average:
      return super().__call__(x, use_running_average=True)
    axes = tuple(range(x.ndim - 1))
    mean, var = x.mean(axes), x.var(axes)
    n = x.size // x.shape[-1]
    self.mean[...] = self.momentum * self.mean[...] + (1 - self.momentum) * mean
    self.var[...] = self.momentum * self.var[...] + (1 - self.momentum) * var * (n / (n - 1))
    return (x - mean) / jnp.sqrt(var + self.epsilon) * self.scale[...] + self.bias[...]


class NnxConvNet(nnx.Module):
  def __init__(self, rngs, dtype=jnp.float64):
    d = dtypes(dtype)
    self.conv1 = nnx.Conv(2, 4, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, rngs=rngs, **d)
    self.bn = TorchBatchNorm(4, momentum=0.9, epsilon=1e-5, rngs=rngs, **d)
    self.conv2 = nnx.Conv(4, 3, (3, 3), strides=2, padding="VALID", rngs=rngs, **d)
    self.fc = nnx.Linear(3 * 2 * 2, 3, rngs=rngs, **d)

  def __call__(self, x):  # NCHW in, as PyTorch's; NHWC inside
    h = jax.nn.relu(self.bn(self.conv1(jnp.transpose(x, (0, 2, 3, 1)))))
    h = jnp.tanh(self.conv2(h))
    return self.fc(jnp.transpose(h, (0, 3, 1, 2)).reshape(h.shape[0], -1))  # PyTorch's flatten order


def transformer_batches(n):
  g = torch.Generator().manual_seed(1)
  return [
    (torch.randint(0, VOCAB, (3, SEQ), generator=g), torch.randint(0, VOCAB, (3, SEQ), generator=g))
    for _ in range(n)
  ]


def conv_batches(n):
  g = torch.Generator().manual_seed(2)
  return [
    (torch.randn(4, 2, 5, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (4,), generator=g))
    for _ in range(n)
  ]


def torch_loss(model, batch):
  x, y = batch
  logits = model(x)
  return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def jax_loss(model, batch):
  x, y = (jnp.asarray(t.numpy()) if isinstance(t, torch.Tensor) else t for t in batch)
  logits = model(x)
  logits = logits.reshape(-1, logits.shape[-1])
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y.reshape(-1, 1), axis=1))


def torch_mlp():
  return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def nnx_mlp(rngs, dtype=jnp.float64):
  d = dtypes(dtype)
  return nnx.Sequential(nnx.Linear(4, 6, rngs=rngs, **d), nnx.tanh, nnx.Linear(6, 3, rngs=rngs, **d))


def mlp_batches(n):
  g = torch.Generator().manual_seed(4)
  return [
    (torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (5,), generator=g))
    for _ in range(n)
  ]


MODELS = {
  "transformer": (TorchTransformer, NnxTransformer, transformer_batches),
  "convnet": (TorchConvNet, NnxConvNet, conv_batches),
  # Linear layers only: their kernels are PyTorch's weights transposed (Adafactor's one operation).
  "mlp": (torch_mlp, nnx_mlp, mlp_batches),
}


def torch_model(name, dtype=torch.float64):
  torch.manual_seed(0)
  return MODELS[name][0]().to(dtype)


def port(name, dtype=torch.float64):
  return MODELS[name][1](nnx.Rngs(0), jnp.dtype(str(dtype).removeprefix("torch.")))


def carried_weights(layout, model, port_model):
  """The port with ``model``'s weights and batch statistics."""
  graphdef, params, stats = nnx.split(port_model, nnx.Param, nnx.BatchStat)
  tensors = model.state_dict()
  return graphdef, layout.to_jax(tensors, params), layout.to_jax(tensors, stats)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ports_forward_equals_pytorchs(name):
  model, batches = torch_model(name), MODELS[name][2](1)
  layout = derive(model, port(name))
  graphdef, params, stats = carried_weights(layout, model, port(name))
  model.train()
  expected = model(batches[0][0]).detach().numpy()
  got = jax.jit(lambda p, s, x: nnx.merge(graphdef, p, s)(x))(
    params, stats, jnp.asarray(batches[0][0].numpy())
  )
  np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=TOL)


# -- the journeys --------------------------------------------------------------------------------------

OPTIMIZERS = {  # options: PyTorch's other kernel (foreach=True), for its own spread in float32
  "adamw": lambda params, **options: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05, **options),
  "sgd": lambda params, **options: torch.optim.SGD(
    params, lr=5e-2, momentum=0.9, weight_decay=1e-3, **options
  ),
  "adagrad": lambda params, **options: torch.optim.Adagrad(params, lr=5e-2, lr_decay=1e-2, **options),
  # Not element-wise: factored second moments (row_var, col_var) of each matrix, and the root mean
  # squares of the parameter and the update; it commutes with a matrix transposed (Rule.commutes_with).
  "adafactor": lambda params, **options: torch.optim.Adafactor(
    params, lr=5e-2, weight_decay=1e-2, **{"foreach": False, **options}
  ),
}
N, M, K = 2, 3, 2  # steps in PyTorch, then in JAX, then in PyTorch again


def factor(t):
  return 1.0 / (1.0 + 0.25 * t)  # the schedule's factor at PyTorch's scheduler step t (LambdaLR)


def pytorch_run(name, which, dtype=torch.float64, **options):
  model = torch_model(name, dtype)
  optimizer = OPTIMIZERS[which](model.named_parameters(), **options)
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
  model.train()
  return model, optimizer, scheduler


def journey_batches(name, dtype=torch.float64):
  return [(x.to(dtype) if x.is_floating_point() else x, y) for x, y in MODELS[name][2](N + M + K)]


def uninterrupted(name, which, dtype=torch.float64, **options):
  """The run that never leaves PyTorch: its losses and its final state dict."""
  model, optimizer, scheduler = pytorch_run(name, which, dtype, **options)
  losses = [torch_step(model, optimizer, scheduler, b) for b in journey_batches(name, dtype)]
  return losses, model.state_dict()


def torch_step(model, optimizer, scheduler, batch):
  optimizer.zero_grad()
  loss = torch_loss(model, batch)
  loss.backward()
  optimizer.step()
  scheduler.step()
  return float(loss.detach())


JOURNEYS = [
  (name, which, "optimizer") for name in ("convnet", "transformer") for which in ("adagrad", "adamw", "sgd")
]
JOURNEYS += [("mlp", "adafactor", "optimizer")]
# Through files: the state dict torch.save wrote, read by path, written back and loaded.
JOURNEYS += [("transformer", "adamw", "file"), ("convnet", "sgd", "file")]


def journey(name, which, via, tmp_path, dtype=torch.float64):
  """Steps 1-N PyTorch's, N+1-N+M the port's in JAX (carried by ``layout=``), the rest PyTorch's
  again: the losses of every step and the final state dict."""
  batches = journey_batches(name, dtype)
  model, optimizer, scheduler = pytorch_run(name, which, dtype)
  losses = [torch_step(model, optimizer, scheduler, b) for b in batches[:N]]
  # The port's shapes only (no initialization to compute): the weights are PyTorch's.
  ported = nnx.eval_shape(lambda: port(name, dtype))
  layout = derive(model, ported)
  graphdef, params, stats = carried_weights(layout, model, ported)
  base = optimizer.param_groups[0]["initial_lr"]
  schedule = lambda n: base * factor(n + N)  # noqa: E731  # the PyTorch schedule, shifted
  if via == "file":
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    tx, state = from_torch_state_dict(
      tmp_path / "optimizer.pt", params, layout=layout, learning_rate=schedule
    )
  else:
    tx, state = from_torch(optimizer, params, layout=layout, learning_rate=schedule)

  def loss_fn(params, stats, batch):
    # Variables made inside the trace: the port's BatchNorm writes its statistics there.
    model_j = nnx.merge(graphdef, params, jax.tree.map(jnp.asarray, stats))
    loss = jax_loss(model_j, batch)
    return loss, nnx.state(model_j, nnx.BatchStat)

  @jax.jit
  def jax_step(params, stats, state, batch):
    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, batch)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), stats, state, loss

  for batch in batches[N : N + M]:
    params, stats, state, loss = jax_step(params, stats, state, tuple(jnp.asarray(t.numpy()) for t in batch))
    losses.append(float(loss))

  if via == "file":
    written = to_torch_state_dict(state, tmp_path / "optimizer.pt", layout=layout, learning_rate=schedule(M))
    torch.save(written, tmp_path / "optimizer-2.pt")
    optimizer.load_state_dict(torch.load(tmp_path / "optimizer-2.pt", weights_only=True))
    with torch.no_grad():
      for key, value in layout.to_torch(params).items():
        model.get_parameter(key).copy_(torch.from_numpy(np.array(value)))
  else:
    to_torch(state, optimizer, params, layout=layout)
  with torch.no_grad():
    for key, value in layout.to_torch(stats).items():  # the batch statistics, back
      model.state_dict()[key].copy_(torch.from_numpy(np.array(value)))
  for module in model.modules():  # PyTorch's own counter (read only with momentum=None)
    if isinstance(module, torch.nn.BatchNorm2d):
      module.num_batches_tracked += M
  for _ in range(M):
    scheduler.step()
  losses += [torch_step(model, optimizer, scheduler, b) for b in batches[N + M :]]
  return losses, model.state_dict()


@pytest.mark.parametrize("name, which, via", JOURNEYS)
def test_journey_pytorch_jax_pytorch_equals_pytorch(name, which, via, tmp_path):
  expected, expected_weights = uninterrupted(name, which)
  losses, final = journey(name, which, via, tmp_path)
  np.testing.assert_allclose(losses, expected, rtol=TOL, atol=0)
  for key, value in expected_weights.items():
    np.testing.assert_allclose(final[key].numpy(), value.numpy(), rtol=0, atol=TOL, err_msg=key)


def ulps(values, reference):
  """Each value's distance from its reference in float32 ulps of the reference."""
  values, reference = np.asarray(values, np.float64), np.asarray(reference, np.float32)
  return np.abs(values - reference) / np.spacing(np.abs(reference))


@pytest.mark.parametrize("name, which", [("transformer", "adamw"), ("convnet", "sgd"), ("mlp", "adafactor")])
def test_journey_float32_within_pytorchs_spread(name, which, tmp_path):
  """In float32 (the schedule's scalars in float64, as PyTorch's), within the bridges' float32 bound
  (tests/test_interop_torch_family.py, docs/interop.md): the final weights and batch statistics
  within ``max(4 ulp, 2 x PyTorch's own spread)`` of the largest of them, the spread being the
  uninterrupted run's against PyTorch's other kernel's (``foreach=True``), and each loss within
  ``max(4 ulp, 2 x`` that run's``)`` of the uninterrupted run's. The JAX steps' losses and
  gradients are the port's own arithmetic (XLA's float32, not PyTorch's); seen on an AMD EPYC: the
  weights 0.12, 0.5 and 1 ulp off, the losses at most 2, 2 and 1 ulp, PyTorch's spread 0 but for
  Adafactor's (whose foreach kernel sums its means in another order)."""
  expected, want = uninterrupted(name, which, torch.float32)
  other_losses, other = uninterrupted(name, which, torch.float32, foreach=True)
  losses, got = journey(name, which, "optimizer", tmp_path, torch.float32)
  floats = [key for key, value in want.items() if value.is_floating_point()]
  scale = max(float(want[key].abs().max()) for key in floats)
  spread = max(float((want[key] - other[key]).abs().max()) for key in floats)
  bound = max(4 * float(np.spacing(np.float32(scale))), 2 * spread)
  for key, value in want.items():
    np.testing.assert_allclose(got[key].numpy(), value.numpy(), rtol=0, atol=bound, err_msg=key)
  loss_bound = np.maximum(4.0, 2 * ulps(other_losses, expected))
  assert np.all(ulps(losses, expected) <= loss_bound), (ulps(losses, expected), loss_bound)


def test_the_carried_state_is_in_the_ports_layout():
  model = torch_model("transformer")
  optimizer = torch.optim.AdamW(model.named_parameters(), lr=1e-2)
  torch_step(
    model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor), transformer_batches(1)[0]
  )
  layout = derive(model, port("transformer"))
  _, params, _ = carried_weights(layout, model, port("transformer"))
  _, state = from_torch(optimizer, params, layout=layout, learning_rate=1e-2)
  in_proj = optimizer.state[model.attn.in_proj_weight]["exp_avg"].numpy()
  # PyTorch's packed rows 8:16 are the key projection, head h at columns h*4:(h+1)*4 of the kernel.
  key_kernel = np.asarray(state.exp_avg["attn"]["key"]["kernel"][...])
  assert key_kernel.shape == (E, HEADS, E // HEADS)
  np.testing.assert_array_equal(key_kernel[:, 1, :], in_proj[8 + 4 : 8 + 8, :].T)
  assert int(state.count) == 1


# -- the map itself -------------------------------------------------------------------------------------


def test_a_leaf_concatenated_from_two_parameters_steps_as_pytorch():
  start = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
  grads = [
    torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(1, 5)
  ]

  def run():
    a, b = torch.nn.Parameter(start[:3].clone()), torch.nn.Parameter(start[3:].clone())
    return a, b, torch.optim.AdamW([("a", a), ("b", b)], lr=0.1, weight_decay=0.1)

  def step(a, b, optimizer, g):
    a.grad, b.grad = g[:3].clone(), g[3:].clone()
    optimizer.step()

  a, b, optimizer = run()
  for g in grads:
    step(a, b, optimizer, g)
  expected = torch.cat([a, b]).detach().numpy()

  a, b, optimizer = run()
  for g in grads[:2]:
    step(a, b, optimizer, g)
  layout = Layout({"ab": concat(["a", "b"])}, shapes={"a": (3,), "b": (3,)})
  params = layout.to_jax({"a": a, "b": b})
  tx, state = from_torch(optimizer, params, layout=layout)
  assert state.exp_avg["ab"].shape == (6,)
  updates, state = tx.update({"ab": jnp.asarray(grads[2].numpy())}, state, params)
  params = optax.apply_updates(params, updates)
  to_torch(state, optimizer, params, layout=layout)
  step(a, b, optimizer, grads[3])
  np.testing.assert_allclose(torch.cat([a, b]).detach().numpy(), expected, rtol=0, atol=TOL)
  assert float(optimizer.state[b]["step"]) == 4


def test_concatenated_parameters_at_different_steps_are_refused():
  a, b = (torch.nn.Parameter(torch.ones(3, dtype=torch.float64)) for _ in range(2))
  optimizer = torch.optim.Adam([("a", a), ("b", b)], lr=0.1)
  a.grad = torch.ones(3, dtype=torch.float64)
  optimizer.step()  # b has no grad: a at step 1, b at step 0
  layout = Layout({"ab": concat(["a", "b"])}, shapes={"a": (3,), "b": (3,)})
  with pytest.raises(ValueError, match=r"'ab' is made of PyTorch parameters \['a', 'b'\] at different steps"):
    from_torch(optimizer, layout.to_jax({"a": a, "b": b}), layout=layout)
  # Its advice: separate leaves.
  separate = Layout({"a": "a", "b": "b"}, shapes={"a": (3,), "b": (3,)})
  _, state = from_torch(optimizer, separate.to_jax({"a": a, "b": b}), layout=separate)
  assert sorted(int(masked.inner_state.count) for masked in state.inner_states.values()) == [0, 1]


@pytest.mark.parametrize(
  ("leaves", "message"),
  [
    (
      {"x": "w", "y": "w"},
      r"'w' is in several JAX leaves \['x', 'y'\]: a tensor used twice \(a tied weight\)",
    ),
    ({"x": part("w").take(0, 0, 2)}, r"rows 2:4 of axis 0 of the PyTorch tensor 'w' are in no JAX leaf"),
    (
      {"x": part("w").take(0, 0, 3), "y": part("w").take(0, 2, 4)},
      r"rows 2:3 of the PyTorch tensor 'w' are in two JAX leaves",
    ),
    (
      {"x": part("w").transpose(0, 0)},
      r"permutes axes \(0, 0\), not a permutation of a tensor of shape \(4, 6\)",
    ),
    ({"x": part("w").reshape(5, 5)}, r"reshapes a tensor of shape \(4, 6\) to \(5, 5\), of another size"),
    ({"x": "v"}, r"'x' is made of 'v', which shapes= does not list"),
    ({"x": part("w").take(0, 0, 5)}, r"takes rows 0:5 of axis 0 of a tensor of shape \(4, 6\)"),
  ],
)
def test_a_layout_that_does_not_tile_its_tensors_is_refused(leaves, message):
  with pytest.raises(ValueError, match=message):
    Layout(leaves, shapes={"w": (4, 6)})


def test_a_shape_the_layout_does_not_make_is_refused_before_any_step():
  model = torch.nn.Linear(3, 2).double()
  optimizer = torch.optim.SGD(model.named_parameters(), lr=0.1)
  wrong = Layout(
    {"kernel": "weight", "bias": "bias"}, shapes={"weight": (2, 3), "bias": (2,)}
  )  # no transpose
  params = {"kernel": jnp.zeros((3, 2)), "bias": jnp.zeros(2)}
  with pytest.raises(ValueError, match=r"the JAX leaf 'kernel' has shape \(3, 2\); the layout makes it part"):
    from_torch(optimizer, params, layout=wrong)
  with pytest.raises(
    ValueError, match=r"the JAX leaf 'kernel' has shape \(3, 2\) and dtype float64; the layout"
  ):
    wrong.to_jax(dict(model.named_parameters()), params)


def test_an_optimizer_without_names_is_refused_with_a_layout():
  model = torch.nn.Linear(3, 2).double()
  layout = derive(model, nnx.Linear(3, 2, rngs=nnx.Rngs(0), **F64))
  params = layout.to_jax(model.state_dict())
  with pytest.raises(ValueError, match=r"build it from model.named_parameters\(\)"):
    from_torch(torch.optim.SGD(model.parameters(), lr=0.1), params, layout=layout)
  from_torch(torch.optim.SGD(model.named_parameters(), lr=0.1), params, layout=layout)  # the advice


# -- derivation's refusals --------------------------------------------------------------------------------


class TorchBlock(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.proj = torch.nn.Linear(4, 4)
    self.ln_f = torch.nn.LayerNorm(4)


class NnxBlockRenamed(nnx.Module):
  def __init__(self, rngs):
    self.proj = nnx.Linear(4, 4, rngs=rngs, **F64)
    self.final_norm = nnx.LayerNorm(4, rngs=rngs, **F64)


def test_a_missing_rename_is_refused_and_the_rename_it_asks_for_derives():
  model, ported = TorchBlock().double(), NnxBlockRenamed(nnx.Rngs(0))
  with pytest.raises(
    ValueError,
    match=r"no counterpart in the port: the PyTorch module 'ln_f' \(LayerNorm, tensors "
    r"\{'weight': \(4,\), 'bias': \(4,\)\}\) and the port's 'ln_f'.*pass renames=",
  ):
    derive(model, ported)
  layout = derive(model, ported, renames={"ln_f": "final_norm"})
  assert layout.sources("final_norm.scale") == ["ln_f.weight"]


def test_a_layer_paired_with_another_kind_is_refused():
  model = torch.nn.Sequential(torch.nn.Linear(4, 4))
  ported = nnx.Sequential(nnx.LayerNorm(4, rngs=nnx.Rngs(0)))
  with pytest.raises(
    ValueError,
    match=r"a Linear pairs with an nnx.Linear, not a LayerNorm: the PyTorch module '0'"
    r" \(Linear, tensors \{'weight': \(4, 4\), 'bias': \(4,\)\}\) and the port's 'layers.0'",
  ):
    derive(model, ported)


def test_a_port_built_with_other_sizes_is_refused_with_both_shapes():
  with pytest.raises(
    ValueError,
    match=r"Linear '<root>' / Linear '<root>': the port's leaf 'kernel' has shape "
    r"\(3, 5\); part\('weight'\).transpose\(1, 0\) makes the PyTorch tensor 'weight' \(2, 3\) a \(3, 2\)",
  ):
    derive(torch.nn.Linear(3, 2), nnx.Linear(3, 5, rngs=nnx.Rngs(0)))


def test_attention_with_biases_and_other_key_and_value_sizes():
  for kdim in (None, 6):
    torch.manual_seed(0)
    model = torch.nn.MultiheadAttention(8, 2, kdim=kdim, vdim=kdim, batch_first=True).double()
    ported = nnx.MultiHeadAttention(
      2, 8, in_kv_features=kdim, decode=False, attention_fn=attention, rngs=nnx.Rngs(0), **F64
    )
    layout = derive(model, ported)
    graphdef, params = nnx.split(ported, nnx.Param)
    q, kv = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 4, kdim or 8, dtype=torch.float64)
    expected, _ = model(q, kv, kv, need_weights=False)
    got = nnx.merge(graphdef, layout.to_jax(model.state_dict(), params))(
      jnp.asarray(q.numpy()), jnp.asarray(kv.numpy())
    )
    np.testing.assert_allclose(np.asarray(got), expected.detach().numpy(), rtol=0, atol=TOL)
    back = layout.to_torch(layout.to_jax(model.state_dict(), params))
    assert all(np.array_equal(np.asarray(back[n]), t.numpy()) for n, t in model.state_dict().items())


def test_other_heads_are_refused():
  with pytest.raises(ValueError, match=r"PyTorch's 2 heads of 4 against the port's 4 of 2"):
    derive(torch.nn.MultiheadAttention(8, 2), nnx.MultiHeadAttention(4, 8, decode=False, rngs=nnx.Rngs(0)))


def test_a_transposed_convolution_without_transpose_kernel_is_refused():
  model = torch.nn.ConvTranspose2d(2, 3, 3)
  with pytest.raises(ValueError, match=r"nnx.ConvTranspose with transpose_kernel=True"):
    derive(model, nnx.ConvTranspose(2, 3, (3, 3), rngs=nnx.Rngs(0)))
  # Its advice: the port built with transpose_kernel=True pairs, and computes PyTorch's convolution.
  model = model.double()
  ported = nnx.ConvTranspose(2, 3, (3, 3), padding="VALID", transpose_kernel=True, rngs=nnx.Rngs(0), **F64)
  layout = derive(model, ported)
  graphdef, params = nnx.split(ported, nnx.Param)
  x = torch.randn(1, 2, 4, 4, dtype=torch.float64)
  got = nnx.merge(graphdef, layout.to_jax(model.state_dict(), params))(
    jnp.asarray(x.numpy().transpose(0, 2, 3, 1))
  )
  np.testing.assert_allclose(
    np.asarray(got), model(x).detach().numpy().transpose(0, 2, 3, 1), atol=TOL, rtol=0
  )


def test_a_port_leaf_made_of_nothing_is_refused():
  class Extra(nnx.Module):
    def __init__(self, rngs):
      self.proj = nnx.Linear(4, 4, rngs=rngs)
      self.ln_f = nnx.LayerNorm(4, rngs=rngs)
      self.gate = nnx.Param(jnp.zeros(4))

  with pytest.raises(
    ValueError, match=r"the port's leaves \[\('gate', \(4,\)\)\] are made of no PyTorch tensor"
  ):
    derive(TorchBlock(), Extra(nnx.Rngs(0)))


# -- wrong maps that shapes cannot tell: the check of docs/interop.md ---------------------------------------


def one_step_check(model, ported, layout, batch):
  """docs/interop.md's check: one batch's loss and gradients, the port's against PyTorch's."""
  graphdef, params, stats = nnx.split(ported, nnx.Param, nnx.BatchStat)
  tensors = model.state_dict()
  params, stats = layout.to_jax(tensors, params), layout.to_jax(tensors, stats)
  model.zero_grad()
  loss = torch_loss(model, batch)
  loss.backward()
  expected = layout.to_jax({n: p.grad for n, p in model.named_parameters()}, params)

  def loss_fn(params):
    return jax_loss(nnx.merge(graphdef, params, jax.tree.map(jnp.asarray, stats)), batch)

  got_loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
  np.testing.assert_allclose(float(got_loss), float(loss.detach()), rtol=1e-12)
  for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=0, atol=1e-12)


def planted(layout, path, source):
  return Layout({**layout.leaves, path: source}, layout.shapes)


def test_the_check_passes_for_the_derived_layouts():
  for name in MODELS:
    model = torch_model(name)
    one_step_check(model, port(name), derive(model, port(name)), MODELS[name][2](1)[0])


@pytest.mark.parametrize(
  ("path", "source"),
  [
    # a transpose left out, in a square projection (8 x 8): the shapes cannot tell
    ("attn.out.kernel", part("attn.out_proj.weight").reshape(HEADS, E // HEADS, E)),
    # the heads split in the wrong order: (in, head_dim, heads) read as (in, heads, head_dim)
    (
      "attn.query.kernel",
      part("attn.in_proj_weight")
      .take(0, 0, E)
      .transpose(1, 0)
      .reshape(E, E // HEADS, HEADS)
      .transpose(0, 2, 1),
    ),
  ],
)
def test_a_wrong_map_that_shapes_cannot_tell_fails_the_check(path, source):
  model = torch_model("transformer")
  wrong = planted(derive(model, port("transformer")), path, source)
  with pytest.raises(AssertionError):
    one_step_check(model, port("transformer"), wrong, transformer_batches(1)[0])


class TorchZoo(torch.nn.Module):
  """The other layers of derive's table, in containers, with a parameter of its own under another name."""

  def __init__(self):
    super().__init__()
    self.convs = torch.nn.ModuleList([torch.nn.Conv1d(2, 4, 3), torch.nn.Conv3d(1, 2, 2)])
    self.norms = torch.nn.ModuleDict(
      {"group": torch.nn.GroupNorm(2, 4), "rms": torch.nn.RMSNorm(4, eps=1e-6)}
    )
    self.gate = torch.nn.Parameter(torch.randn(4))


class NnxZoo(nnx.Module):
  def __init__(self, rngs):
    self.convs = nnx.List(
      [
        nnx.Conv(2, 4, (3,), padding="VALID", rngs=rngs, **F64),
        nnx.Conv(1, 2, (2, 2, 2), padding="VALID", rngs=rngs, **F64),
      ]
    )
    self.norms = nnx.Dict(
      group=nnx.GroupNorm(4, num_groups=2, epsilon=1e-5, rngs=rngs, **F64),
      rms=nnx.RMSNorm(4, epsilon=1e-6, rngs=rngs, **F64),
    )
    self.scale = nnx.Param(jnp.zeros(4))


def test_the_other_layers_containers_and_a_renamed_parameter():
  torch.manual_seed(0)
  model = TorchZoo().double()
  for p in model.parameters():  # the norms' weights away from their initial ones and zeros
    torch.nn.init.normal_(p)
  ported = NnxZoo(nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"the PyTorch tensor 'gate' \(4,\) has no leaf 'gate' in the port"):
    derive(model, ported)
  layout = derive(model, ported, renames={"gate": "scale"})  # the refusal's advice
  graphdef, params = nnx.split(ported, nnx.Param)
  port_model = nnx.merge(graphdef, layout.to_jax(model.state_dict(), params))
  x1, x3 = torch.randn(2, 2, 7, dtype=torch.float64), torch.randn(2, 1, 3, 3, 3, dtype=torch.float64)
  h = model.convs[0](x1)  # (N, C, L)
  expected = [
    h,
    model.convs[1](x3),
    model.norms["group"](h),
    model.norms["rms"](h.transpose(1, 2)) * model.gate,
  ]
  hj = port_model.convs[0](jnp.asarray(x1.numpy().transpose(0, 2, 1)))  # (N, L, C)
  got = [
    hj.transpose(0, 2, 1),
    port_model.convs[1](jnp.asarray(x3.numpy().transpose(0, 2, 3, 4, 1))).transpose(0, 4, 1, 2, 3),
    port_model.norms["group"](hj).transpose(0, 2, 1),
    port_model.norms["rms"](hj) * port_model.scale[...],
  ]
  for g, e in zip(got, expected):
    np.testing.assert_allclose(np.asarray(g), e.detach().numpy(), rtol=0, atol=TOL)


def test_a_rule_on_whole_matrices_is_refused_under_an_operation_it_does_not_declare(monkeypatch):
  import dataclasses

  from onnx_optax.interop import layout as layout_module

  # SGD's rule as if it computed on whole matrices (Rule.ranks, torch.optim.Muon's (2,)).
  rule_of = layout_module._rule
  monkeypatch.setattr(layout_module, "_rule", lambda node: dataclasses.replace(rule_of(node), ranks=(2,)))
  model = torch.nn.Linear(3, 2).double()
  optimizer = torch.optim.SGD(model.named_parameters(), lr=0.1, momentum=0.9)
  layout = derive(model, nnx.Linear(3, 2, rngs=nnx.Rngs(0), **F64))
  with pytest.raises(
    ValueError,
    match=r"computes on whole matrices \(ranks \(2,\)\), and its step need not commute "
    r"with the operations \['transpose_last_two'\] of the JAX leaf 'kernel'",
  ):
    from_torch(optimizer, layout.to_jax(model.state_dict()), layout=layout)
  # In PyTorch's own layout (the refusal's advice) it is carried.
  same = Layout({"weight": "weight", "bias": "bias"}, layout.shapes)
  from_torch(optimizer, same.to_jax(model.state_dict()), layout=same)


def test_a_muon_weight_is_refused_under_a_transpose():
  """torch.optim.Muon's twin declares ranks (2,) and no ``commutes_with``: the transpose of its weight
  into nnx.Linear's kernel is refused, naming the rule; in PyTorch's own layout it is carried."""
  model = torch.nn.Linear(3, 2, bias=False).double()
  optimizer = torch.optim.Muon(model.named_parameters(), lr=0.02)
  model.weight.grad = torch.ones_like(model.weight)
  optimizer.step()  # a momentum_buffer to carry
  layout = derive(model, nnx.Linear(3, 2, use_bias=False, rngs=nnx.Rngs(0), **F64))
  with pytest.raises(
    ValueError,
    match=r"the rule pytorch_muon computes on whole matrices \(ranks \(2,\)\), and its step need not "
    r"commute with the operations \['transpose_last_two'\] of the JAX leaf 'kernel'",
  ):
    from_torch(optimizer, layout.to_jax(model.state_dict()), layout=layout)
  same = Layout({"weight": "weight"}, layout.shapes)
  _, state = from_torch(optimizer, same.to_jax(model.state_dict()), layout=same)
  np.testing.assert_array_equal(
    np.asarray(state.momentum_buffer["weight"]), optimizer.state[model.weight]["momentum_buffer"].numpy()
  )


class TorchAttend(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.attn = torch.nn.MultiheadAttention(4, 2, bias=False, batch_first=True)
    self.fc = torch.nn.Linear(4, 2)

  def forward(self, x):
    return self.fc(self.attn(x, x, x, need_weights=False)[0])


class NnxAttend(nnx.Module):
  def __init__(self, rngs):
    self.attn = nnx.MultiHeadAttention(
      2, 4, decode=False, use_bias=False, attention_fn=attention, rngs=rngs, **F64
    )
    self.fc = nnx.Linear(4, 2, rngs=rngs, **F64)

  def __call__(self, x):
    return self.fc(self.attn(x))


@pytest.mark.parametrize(
  "make",
  [
    lambda params: torch.optim.NAdam(params, lr=1e-2, momentum_decay=4e-3),  # mu_product: one per parameter
    lambda params: torch.optim.ASGD(params, lr=1e-2, t0=1.0),  # eta, mu: one per parameter
  ],
  ids=["nadam", "asgd"],
)
def test_per_tensor_fields_follow_their_parameter_into_split_leaves(make):
  g = torch.Generator().manual_seed(3)
  batches = [
    (
      torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
      torch.randn(2, 3, 2, generator=g, dtype=torch.float64),
    )
    for _ in range(5)
  ]

  def run():
    torch.manual_seed(0)
    model = TorchAttend().double()
    return model, make(model.named_parameters())

  def step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
    loss.backward()
    optimizer.step()
    return float(loss.detach())

  model, optimizer = run()
  expected = [step(model, optimizer, b) for b in batches]
  expected_weights = model.state_dict()

  model, optimizer = run()
  losses = [step(model, optimizer, b) for b in batches[:2]]
  ported = NnxAttend(nnx.Rngs(0))
  layout = derive(model, ported)
  graphdef, params = nnx.split(ported, nnx.Param)
  params = layout.to_jax(model.state_dict(), params)
  tx, state = from_torch(optimizer, params, layout=layout)

  def loss_fn(params, x, y):
    return jnp.mean((nnx.merge(graphdef, params)(x) - y) ** 2)

  for x, y in batches[2:4]:
    loss, grads = jax.value_and_grad(loss_fn)(params, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
    losses.append(float(loss))
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  to_torch(state, optimizer, params, layout=layout)
  losses.append(step(model, optimizer, batches[4]))

  np.testing.assert_allclose(losses, expected, rtol=TOL, atol=0)
  for key, value in expected_weights.items():
    np.testing.assert_allclose(model.state_dict()[key].numpy(), value.numpy(), rtol=0, atol=TOL, err_msg=key)


def test_the_maps_other_refusals():
  with pytest.raises(ValueError, match=r"take\(\) comes first and once"):
    part("w").transpose(1, 0).take(0, 0, 1)
  with pytest.raises(
    ValueError, match=r"concatenates parts of shapes \[\(4, 6\), \(2,\)\] along axis 0: the other axes"
  ):
    Layout({"x": concat(["w", "b"])}, shapes={"w": (4, 6), "b": (2,)})
  with pytest.raises(ValueError, match=r"'w' is split along several axes \[0, 1\]: split one axis"):
    Layout({"x": part("w").take(0, 0, 4), "y": part("w").take(1, 0, 6)}, shapes={"w": (4, 6)})
  layout = Layout({"x": part("w").take(0, 0, 2), "y": part("w").take(0, 2, 4)}, shapes={"w": (4, 6)})
  with pytest.raises(ValueError, match=r"'x' is made of the PyTorch tensor 'w', which is not given"):
    layout.to_jax({"v": np.zeros((4, 6))})
  with pytest.raises(ValueError, match=r"the JAX leaf 'z' is in no entry of the layout"):
    layout.to_jax({"w": np.zeros((4, 6))}, {"z": jnp.zeros(3)})
  with pytest.raises(
    ValueError, match=r"the PyTorch tensor 'w' is also in the JAX leaves \['y'\], which are not given"
  ):
    layout.to_torch({"x": jnp.zeros((2, 6))})
  with jax.enable_x64(False):
    with pytest.raises(ValueError, match=r"'w' has dtype float64, which JAX's default 32-bit mode truncates"):
      layout.to_jax({"w": np.zeros((4, 6))})
  assert layout.to_jax({"w": np.zeros((4, 6))})["x"].dtype == jnp.float64  # with jax_enable_x64, the advice


def test_derives_other_refusals():
  with pytest.raises(ValueError, match=r"renames \['nothing'\] name no PyTorch module or tensor"):
    derive(torch.nn.Linear(3, 2), nnx.Linear(3, 2, rngs=nnx.Rngs(0)), renames={"nothing": "kernel"})
  with pytest.raises(
    ValueError, match=r"add_bias_kv and add_zero_attn have no nnx.MultiHeadAttention counterpart"
  ):
    derive(
      torch.nn.MultiheadAttention(8, 2, add_bias_kv=True),
      nnx.MultiHeadAttention(2, 8, decode=False, rngs=nnx.Rngs(0)),
    )


def test_a_split_parameters_per_tensor_field_edited_apart_is_refused_on_the_way_back():
  torch.manual_seed(0)
  model = TorchAttend().double()
  optimizer = torch.optim.NAdam(model.named_parameters(), lr=1e-2)
  layout = derive(model, NnxAttend(nnx.Rngs(0)))
  params = layout.to_jax(model.state_dict())
  _, state = from_torch(optimizer, params, layout=layout)
  mu = jax.tree.map(lambda v: v, state.mu_product)  # a copy, edited below
  mu["attn"]["key"]["kernel"] = mu["attn"]["key"]["kernel"] * 0.5  # by hand: PyTorch keeps one per parameter
  with pytest.raises(
    ValueError, match=r"'attn.in_proj_weight' is in several JAX leaves whose 'mu_product' differ"
  ):
    to_torch(state._replace(mu_product=mu), optimizer, layout=layout)
  with pytest.raises(ValueError, match=r"the JAX leaf 'fc.kernel' has shape \(2, 4\); the layout makes it"):
    to_torch(
      state, optimizer, {**params, "fc": {**params["fc"], "kernel": params["fc"]["kernel"].T}}, layout=layout
    )


def test_a_state_dict_without_names_is_refused_with_a_layout_and_its_advice_carries(tmp_path):
  """A state dict keyed by index, of an optimizer built from ``parameters()``: the layout names
  PyTorch's parameters, so it is refused until ``param_names`` names them, as the error says."""
  from onnx_optax.interop import torch_param_names

  model = torch_model("transformer")
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
  layout = derive(model, port("transformer"))
  _, params, _ = carried_weights(layout, model, port("transformer"))
  saved = optimizer.state_dict()
  with pytest.raises(ValueError, match=r"layout=.*param_names=torch_param_names\(optimizer, model\)"):
    from_torch_state_dict(saved, params, layout=layout)
  tx, state = from_torch_state_dict(
    saved, params, layout=layout, param_names=torch_param_names(optimizer, model)
  )
  with pytest.raises(ValueError, match=r"to_torch_state_dict\(\.\.\., layout=\.\.\.\)"):
    to_torch_state_dict(state, saved, layout=layout)
  written = to_torch_state_dict(state, saved, layout=layout, param_names=torch_param_names(optimizer, model))
  assert written["param_groups"][0]["params"] == saved["param_groups"][0]["params"]


def test_a_trainer_checkpoint_into_the_port_and_back(tmp_path):
  """A Trainer checkpoint's ``optimizer.pt`` read into the port (``from_torch_state_dict(...,
  layout=)``), stepped, and written back by ``to_trainer_checkpoint(..., layout=)``: its
  ``optimizer.pt`` holds in PyTorch's names what ``to_torch_state_dict`` writes for the state,
  which the file journeys above load and continue exactly."""
  from onnx_optax.interop import to_trainer_checkpoint

  batches = MODELS["transformer"][2](N)
  model, optimizer, scheduler = pytorch_run("transformer", "adamw")
  for batch in batches:
    torch_step(model, optimizer, scheduler, batch)
  source = tmp_path / f"checkpoint-{N}"
  source.mkdir()
  torch.save(optimizer.state_dict(), source / "optimizer.pt")
  torch.save(scheduler.state_dict(), source / "scheduler.pt")
  (source / "trainer_state.json").write_text(f'{{"global_step": {N}}}')
  layout = derive(model, port("transformer"))
  _, params, _ = carried_weights(layout, model, port("transformer"))
  base = optimizer.param_groups[0]["initial_lr"]
  schedule = lambda n: base * factor(n + N)  # noqa: E731
  tx, state = from_torch_state_dict(source / "optimizer.pt", params, layout=layout, learning_rate=schedule)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)
  _, state = tx.update(grads, state, params)
  target = to_trainer_checkpoint(
    state, source, tmp_path / "out", steps=1, learning_rate=schedule, layout=layout
  )
  written = torch.load(target / "optimizer.pt", weights_only=True)
  expected = to_torch_state_dict(state, source / "optimizer.pt", layout=layout, learning_rate=schedule(1))
  assert written["param_groups"] == expected["param_groups"]
  for key, entry in expected["state"].items():
    for field, value in entry.items():
      np.testing.assert_array_equal(
        written["state"][key][field].numpy(), value.numpy(), err_msg=f"{key} {field}"
      )


def test_a_rule_that_reduces_is_refused_under_an_operation_it_does_not_declare():
  """Adafactor's step reduces over each tensor (its factored moments, its root mean squares): a
  transposed kernel is carried (the journey above), rows of ``in_proj_weight`` are refused."""
  torch.manual_seed(0)
  model = TorchAttend().double()
  optimizer = torch.optim.Adafactor(model.named_parameters(), lr=1e-2, foreach=False)
  model(torch.randn(2, 3, 4, dtype=torch.float64)).square().sum().backward()
  optimizer.step()
  layout = derive(model, NnxAttend(nnx.Rngs(0)))
  with pytest.raises(
    ValueError,
    match=r"the rule pytorch_adafactor reduces over each tensor, and its step need not commute with the "
    r"operations \['reshape', 'take'\] of the JAX leaf 'attn.key.kernel' \(part\('attn.in_proj_weight'\)",
  ):
    from_torch(optimizer, layout.to_jax(model.state_dict()), layout=layout)
  # Its advice: that parameter in PyTorch's own layout (the others as the port has them).
  own = {path: leaf for path, leaf in layout.leaves.items() if not path.startswith("attn.")}
  own.update({name: name for name in layout.shapes if name.startswith("attn.")})
  same = Layout(own, layout.shapes)
  _, state = from_torch(optimizer, same.to_jax(model.state_dict()), layout=same)
  np.testing.assert_array_equal(
    state.row_var["attn"]["in_proj_weight"], optimizer.state[model.attn.in_proj_weight]["row_var"].numpy()
  )
  np.testing.assert_array_equal(  # the transposed kernel: its row means are PyTorch's column means
    state.row_var["fc"]["kernel"], optimizer.state[model.fc.weight]["col_var"].numpy().T
  )


# -- a Trainer's own checkpoint into the port and its own resume out of it -------------------------------

TRAINER_WARMUP, TRAINER_TOTAL, TRAINER_N, TRAINER_M, TRAINER_LR = 2, 6, 2, 2, 1e-2


class TrainerMLP(torch.nn.Module):
  """The MLP as a Trainer trains it: its forward returns the loss, and records it (the Trainer's own
  log rounds it to 4 digits)."""

  def __init__(self):
    super().__init__()
    self.net = torch_mlp()
    self.losses = []

  def forward(self, x, labels):
    loss = torch_loss(self.net, (x, labels))
    self.losses.append(float(loss.detach()))
    return {"loss": loss}


class NnxTrainerMLP(nnx.Module):
  def __init__(self, rngs):
    self.net = nnx_mlp(rngs)

  def __call__(self, x):
    return self.net(x)


def trainer_data():
  g = torch.Generator().manual_seed(5)
  return [
    {"x": torch.randn(4, generator=g, dtype=torch.float64), "labels": torch.randint(0, 3, (), generator=g)}
    for _ in range(8)
  ]


def trainer(directory):
  """A Trainer of the MLP (AdamW, its default fused kernel; weight decay: two param groups; the
  default linear schedule with warmup; no gradient clipping, which the port's loop would repeat)."""
  import transformers

  transformers.logging.set_verbosity_error()
  args = transformers.TrainingArguments(
    str(directory),
    per_device_train_batch_size=4,  # two batches an epoch
    max_steps=TRAINER_TOTAL,
    save_steps=TRAINER_N,
    learning_rate=TRAINER_LR,
    warmup_steps=TRAINER_WARMUP,
    weight_decay=0.01,
    max_grad_norm=0.0,
    optim="adamw_torch_fused",
    train_sampling_strategy="sequential",  # the batches of the JAX steps are known
    report_to="none",
    use_cpu=True,
    logging_steps=1000,
    disable_tqdm=True,
  )
  torch.manual_seed(0)
  return transformers.Trainer(model=TrainerMLP().double(), args=args, train_dataset=trainer_data())


def trainer_schedule(step):
  """The Trainer's schedule (linear, with warmup) at its scheduler's step ``n + step``, in JAX."""

  def schedule(n):
    t = n + step
    return TRAINER_LR * jnp.where(
      t < TRAINER_WARMUP,
      t / TRAINER_WARMUP,
      jnp.maximum(0.0, (TRAINER_TOTAL - t) / (TRAINER_TOTAL - TRAINER_WARMUP)),
    )

  return schedule


def test_a_trainer_checkpoint_continued_in_the_port_and_resumed_by_the_trainer(tmp_path):
  """A Trainer's ``checkpoint-N`` read into the Flax NNX port (``from_torch_state_dict(...,
  layout=)``), trained M steps in JAX with the port's own gradients, written back as ``checkpoint-
  N+M`` (``to_trainer_checkpoint(..., layout=)``, the weights as the Trainer saves a plain module's),
  and resumed by ``Trainer.train(resume_from_checkpoint=...)`` itself to the end: the losses of every
  step after N and the final weights are the uninterrupted Trainer run's, to 1e-12 in float64."""
  import json

  import safetensors.torch

  from onnx_optax.interop import to_trainer_checkpoint, torch_param_names

  reference = trainer(tmp_path / "reference")
  reference.train()
  checkpoint = tmp_path / "reference" / f"checkpoint-{TRAINER_N}"
  step = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]

  resumed = trainer(tmp_path / "port")  # builds the optimizer as the run did: its groups, its order
  names = torch_param_names(resumed.create_optimizer(), resumed.model)
  ported = NnxTrainerMLP(nnx.Rngs(0))
  layout = derive(resumed.model, ported)
  graphdef, params = nnx.split(ported, nnx.Param)
  params = layout.to_jax(safetensors.torch.load_file(checkpoint / "model.safetensors"), params)
  schedule = trainer_schedule(step)
  tx, state = from_torch_state_dict(
    checkpoint / "optimizer.pt", params, layout=layout, learning_rate=schedule, param_names=names
  )
  assert state.inner_states["group0"].inner_state.exp_avg["net"]["layers"][0]["kernel"].shape == (4, 6)

  @jax.jit
  def jax_step(params, state, x, y):
    loss, grads = jax.value_and_grad(lambda p: jax_loss(nnx.merge(graphdef, p), (x, y)))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  data, losses = trainer_data(), []
  for k in range(TRAINER_N, TRAINER_N + TRAINER_M):  # the Trainer's batches of steps N + 1, ..., N + M
    batch = data[4 * (k % 2) : 4 * (k % 2) + 4]
    x = jnp.asarray(torch.stack([d["x"] for d in batch]).numpy())
    y = jnp.asarray(torch.stack([d["labels"] for d in batch]).numpy())
    params, state, loss = jax_step(params, state, x, y)
    losses.append(float(loss))

  target = tmp_path / "port" / f"checkpoint-{TRAINER_N + TRAINER_M}"
  target.mkdir(parents=True)
  weights = {name: torch.from_numpy(np.array(value)) for name, value in layout.to_torch(params).items()}
  safetensors.torch.save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
  to_trainer_checkpoint(
    state, checkpoint, target, steps=TRAINER_M, learning_rate=schedule, param_names=names, layout=layout
  )
  resumed.train(resume_from_checkpoint=str(target))

  losses += resumed.model.losses
  np.testing.assert_allclose(losses, reference.model.losses[TRAINER_N:], rtol=TOL, atol=0)
  final = resumed.model.state_dict()
  for key, value in reference.model.state_dict().items():
    np.testing.assert_allclose(final[key].numpy(), value.numpy(), rtol=0, atol=TOL, err_msg=key)
