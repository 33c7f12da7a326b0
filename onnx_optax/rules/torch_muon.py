"""``torch.optim.Muon`` in PyTorch's order: momentum, Newton–Schulz in bfloat16, decoupled decay.

PyTorch 2.13's ``_single_tensor_muon`` and ``_zeropower_via_newtonschulz``
(torch/optim/_muon.py), for the two-dimensional parameters PyTorch accepts
(``Rule.ranks``: ``init`` refuses another, naming its pytree path).

**The iteration in bfloat16.** PyTorch orthogonalises in bfloat16 whatever the
parameters' dtype: ``grad.bfloat16()`` (from float64 through float32, as
``c10::BFloat16``'s conversion goes), the Frobenius norm (float32 accumulation,
rounded to bfloat16), ``clamp(min=eps)``, a division in float32 rounded to bfloat16,
then per step ``X X^T``, ``addmm(A, A, A, beta=b, alpha=c)`` and ``addmm(X, B, X,
beta=a)``, each a bfloat16 matrix product accumulated in float32 and rounded once to
bfloat16 (``b A + c A A`` in float32, one rounding). Here each product is ``jnp.dot``
of bfloat16 matrices with ``preferred_element_type=float32`` and the same single
rounding. Measured against PyTorch 2.13 on the CPU (jitted, 10 random matrices per
shape, float32 and float64 inputs): bitwise equal for every shape up to 16 x 64
(4 x 3, 2 x 4, 1 x 2, 3 x 5, 5 x 3, 13 x 1, 8 x 8, 16 x 64); from an inner dimension
of 64 on, the two float32 accumulations sum in different orders and some elements
round to the neighbouring bfloat16 number (32 x 128: 9 % of the elements, at most
0.0088 off; 256 x 256: 3 %, at most 0.001). Bitwise is therefore a measured fact for
small matrices, not a guarantee: docs/spec.md says what the conformance report checks.

**Layout.** The single buffer, ``momentum_buffer``, has the parameter's shape and
is element-wise: a transpose of a parameter transposes its buffer and swaps nothing
(to carry a state across a transposed layout, transpose the buffer with the
parameter). The iteration is not element-wise: PyTorch orthogonalises the
matrix with fewer rows (it transposes when rows > columns, and back), so the
transposed parameter takes the same iteration on the same matrix (``X X^T`` of the
wide orientation both ways: the results are each other's transposes, bit for bit),
but ``adjust_lr_fn="original"`` reads the orientation: ``sqrt(max(1, rows /
columns))`` is 1 for a wide matrix and ``sqrt(rows / columns)`` for its tall
transpose. A transposed layout is therefore another run under ``"original"``
(and the same run under ``"match_rms_adamw"``, whose ``0.2 sqrt(max(A, B))`` is
symmetric); a reshape of a parameter is another run in every case.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import Array
from jax.typing import ArrayLike

from onnx_optax import _checks, _engine, _numerics, _pytorch, registry

__all__ = [
  "PyTorchMuonScalars",
  "PyTorchMuonState",
  "newton_schulz_bfloat16",
  "pytorch_muon",
  "pytorch_muon_elementwise",
  "pytorch_muon_scalars",
]

#: PyTorch 2.13's defaults (Keller Jordan's constants).
DEFAULT_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Host:
  """A Python float kept on the host through the engine's rounding of the scalars (a static node):
  ``lr``, which PyTorch multiplies by the shape's ratio in float64 before rounding it once."""

  value: float


class PyTorchMuonScalars(NamedTuple):
  """The per-update scalars of :func:`onnx_optax.pytorch_muon`: ``lr`` (a Python float kept in
  float64 on the host, or an array for a schedule), ``1 - lr * weight_decay`` (None where
  ``weight_decay`` is the Python number 0), ``1 - momentum``, ``momentum``, ``neg_zero``, and
  ``eps`` (a per-update scalar, not a constant of the element-wise part: an injected, traced
  ``eps`` captured there would leak out of the update's derivative rule)."""

  lr: Any
  decay: Any
  one_minus_momentum: Any
  momentum: Any
  neg_zero: Any
  eps: Any


def pytorch_muon_scalars(
  lr: ArrayLike, count: ArrayLike, *, momentum: float, weight_decay: float, eps: float
) -> PyTorchMuonScalars:
  """``1 - lr * weight_decay`` and ``1 - momentum`` in Python float64 for Python numbers, as PyTorch."""
  static_lr = not _checks.is_traced(lr) and not hasattr(lr, "dtype")
  return PyTorchMuonScalars(
    _Host(float(lr)) if static_lr else lr,  # type: ignore[arg-type]
    None
    if _numerics.is_static_zero(weight_decay)
    else _pytorch.host_or_traced(lr, lambda r: 1 - r * weight_decay)
    if static_lr
    else 1 - jnp.asarray(lr) * weight_decay,
    _pytorch.host_or_traced(momentum, lambda m: 1 - m),
    momentum,
    _pytorch.neg_zero(count),
    eps,
  )


def _ratio(shape: tuple[int, ...], adjust_lr_fn: str | None) -> float:
  """PyTorch's ``_adjust_lr`` factor (Python float64): ``sqrt(max(1, A / B))`` or ``0.2 sqrt(max(A, B))``."""
  A, B = shape[:2]
  if adjust_lr_fn is None or adjust_lr_fn == "original":
    return math.sqrt(max(1, A / B))
  return 0.2 * math.sqrt(max(A, B))


def _wide(x: Array) -> Array:
  """``x`` widened to float32 where it is narrower (exact: no rounding), else as it is."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _bf16_product(a: Array, b: Array) -> Array:
  """A bfloat16 matrix product accumulated in float32 (PyTorch's CPU ``mm``), not yet rounded
  (wider inputs, where the roundings are taken as the identity: in their own dtype)."""
  dt = jnp.promote_types(a.dtype, jnp.float32)
  return jnp.dot(a, b, preferred_element_type=dt, precision=jax.lax.Precision.HIGHEST)


def newton_schulz_bfloat16(
  update: Array, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: Any
) -> Array:
  """PyTorch's ``_zeropower_via_newtonschulz`` on the CPU, in bfloat16 (see the module docstring).

  Every rounding to float32 or bfloat16 goes through :func:`onnx_optax._numerics.round_inside`
  (the rule declares :attr:`~onnx_optax.registry.Rule.rounds_inside`); with those taken as the
  identity the iteration runs in ``update``'s dtype.
  """
  a, b, c = (jnp.float32(v) for v in ns_coefficients)
  f32, bf16 = jnp.float32, jnp.bfloat16
  # Sharded over explicit mesh axes (the type carries the sharding): the products contract a
  # sharded axis, whose output sharding explicit axes do not guess. The iteration reads the whole
  # matrix, as PyTorch's Muon does: replicated for it, the result resharded as the input.
  # The type's own mesh, so that no mesh context is needed (jax.make_mesh's axes are explicit).
  sharding: Any = getattr(jax.typeof(update), "sharding", None)
  explicit = any(getattr(sharding, "spec", None) or ())
  if explicit:
    update = jax.sharding.reshard(
      update, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    )
  x = _numerics.round_inside(_numerics.round_inside(update, f32), bf16)  # grad.bfloat16(), as c10 converts
  tall = update.shape[0] > update.shape[1]
  if tall:
    x = x.T
  xf = _wide(x)
  norm = _numerics.round_inside(jnp.sqrt(jnp.sum(xf * xf)), bf16)  # ortho_grad.norm(): float32 sums
  eps = jnp.asarray(eps)
  floor = _numerics.round_inside(_numerics.round_inside(eps, f32), bf16)  # clamp(min=eps) in bfloat16
  norm = jnp.maximum(norm, floor)
  x = _numerics.round_inside(_pytorch.divide_by_scalar(xf, _wide(norm)), bf16)  # div_: float32, rounded once

  def step(_: Any, x: Array) -> Array:
    gram = _numerics.round_inside(_bf16_product(x, x.T), bf16)
    gram_update = _numerics.round_inside(c * _bf16_product(gram, gram) + b * _wide(gram), bf16)
    return _numerics.round_inside(_bf16_product(gram_update, x) + a * _wide(x), bf16)

  if isinstance(x, jax.core.Tracer):
    # Traced: a loop, not ns_steps copies of the step, one step's program to compile (a third of
    # the compile time of three small matrices at PyTorch's 5 steps); the same values to the bit.
    x = jax.lax.fori_loop(0, ns_steps, step, x)
  else:  # eager: op by op (a loop would be compiled again at every call, for its new closure)
    for i in range(ns_steps):
      x = step(i, x)
  x = x.T if tall else x
  return jax.sharding.reshard(x, sharding) if explicit else x


def _lerp(start: Array, end: Array, weight: Any, small: bool | None) -> Array:
  if small is None:  # weight injected (traced): PyTorch's branch at run time
    return jnp.where(
      jnp.abs(weight) < 0.5,
      _pytorch.lerp(start, end, weight, small=True),
      _pytorch.lerp(start, end, weight, small=False),
    )
  return _pytorch.lerp(start, end, weight, small=small)


def pytorch_muon_elementwise(
  s: PyTorchMuonScalars,
  X: Array | None,
  G: Array,
  momentum_buffer: Array,
  *,
  nesterov: bool,
  ns_coefficients: tuple[float, float, float],
  ns_steps: int,
  adjust_lr_fn: str | None,
  small: tuple[bool | None, bool | None] = (None, None),
) -> tuple[Array, Array]:
  """``torch.optim.Muon``'s step on one matrix, in ``_single_tensor_muon``'s order::

      buf.lerp_(grad, 1 - momentum)
      update = grad.lerp(buf, momentum) if nesterov else buf
      update = _zeropower_via_newtonschulz(update, ns_coefficients, ns_steps, eps)   bfloat16
      param.mul_(1 - lr * weight_decay)
      param.add_(update, alpha=-lr * ratio(param.shape, adjust_lr_fn))

  ``small``: whether ``|1 - momentum|`` and ``|momentum|`` are below 0.5, the branches of
  PyTorch's two lerps (None: decided at run time). Returns ``(U, momentum_buffer_new)``, ``U``
  written in place (``X_new - X``).
  """
  if G.ndim != 2:
    raise ValueError(f"torch.optim.Muon takes 2-D parameters only, got shape {G.shape}")
  if X is None:
    raise ValueError("this update writes the parameters in place: call update(grads, state, params)")
  dt = _pytorch.opmath(G.dtype, momentum_buffer.dtype, X.dtype)
  g, x = G.astype(dt), X.astype(dt)
  buf = _pytorch.stored(
    _lerp(momentum_buffer.astype(dt), g, s.one_minus_momentum, small[0]), momentum_buffer.dtype
  )
  if nesterov:
    update = _pytorch.stored(_lerp(g, buf.astype(dt), s.momentum, small[1]), G.dtype)
  else:
    update = buf
  ortho = newton_schulz_bfloat16(update, ns_coefficients, ns_steps, s.eps)
  ratio = _ratio(tuple(G.shape), adjust_lr_fn)
  # add_(update, alpha=-adjusted_lr): the scalar in the common dtype of the parameter and the
  # bfloat16 update (float32 for float16 parameters); lr * ratio in float64 on the host.
  common = jnp.promote_types(X.dtype, jnp.bfloat16)
  if isinstance(s.lr, _Host):
    neg = jnp.asarray(-(s.lr.value * ratio), dt)
  else:
    neg = -(jnp.asarray(s.lr, dt) * jnp.asarray(ratio, dt))
  neg = _pytorch.alpha(neg, common)
  if s.decay is not None:
    x = _pytorch.stored(x * s.decay, X.dtype, jnp.asarray(s.neg_zero, dt)).astype(dt)
  x_new = _pytorch.stored(ortho.astype(dt) * neg + x, X.dtype)
  return _pytorch.in_place(x_new, X), buf.astype(momentum_buffer.dtype)


class PyTorchMuonState(NamedTuple):
  """State of :func:`pytorch_muon`: ``count`` (the updates done; PyTorch keeps none) and
  ``momentum_buffer``."""

  count: Array  # type: ignore[assignment]  # shadows tuple.count, as in Optax's states
  momentum_buffer: optax.Updates


def pytorch_muon(
  learning_rate: _engine.ScalarOrSchedule,
  *,
  weight_decay: float = 0.1,
  momentum: float = 0.95,
  nesterov: bool = True,
  ns_coefficients: tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS,
  eps: float = 1e-7,
  ns_steps: int = 5,
  adjust_lr_fn: str | None = None,
  initial_count: int = 0,
  state_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  """``torch.optim.Muon``, in PyTorch's order (PyTorch 2.13's ``_single_tensor_muon``)::

      buf.lerp_(grad, 1 - momentum)
      update = grad.lerp(buf, momentum) if nesterov else buf
      update = _zeropower_via_newtonschulz(update, ns_coefficients, ns_steps, eps)   bfloat16
      param.mul_(1 - lr * weight_decay)
      param.add_(update, alpha=-lr * ratio)

  ``ratio`` is ``sqrt(max(1, rows / columns))`` (``adjust_lr_fn`` None or ``"original"``) or
  ``0.2 sqrt(max(rows, columns))`` (``"match_rms_adamw"``). Every parameter must be a matrix
  (PyTorch refuses others; give biases to another transform with ``optax.multi_transform``).
  The Newton–Schulz iteration runs in bfloat16 whatever the parameters' dtype, as in PyTorch:
  the module's docstring says what is bitwise and what was measured. Defaults are PyTorch's.

  Args:
    learning_rate: ``lr``, a float or an Optax schedule.
    weight_decay: decoupled decay, ``param *= 1 - lr * weight_decay``, ``>= 0``.
    momentum: in ``[0, 1]``.
    nesterov: orthogonalise ``grad.lerp(buf, momentum)`` instead of ``buf``.
    ns_coefficients: ``(a, b, c)`` of the quintic ``a X + b (X X^T) X + c (X X^T)^2 X``.
    eps: the floor of the norm the iteration's input is divided by, ``>= 0``.
    ns_steps: the iteration's steps, in ``[0, 100)``.
    adjust_lr_fn: None, ``"original"`` or ``"match_rms_adamw"``.
    initial_count: updates done before the first update here (nothing reads it).
    state_dtype: dtype of the buffer; default each parameter's (PyTorch's).

  Example:
    >>> import jax.numpy as jnp, optax, onnx_optax
    >>> opt = onnx_optax.pytorch_muon(0.1, weight_decay=0.0, momentum=0.0, nesterov=False)
    >>> params = jnp.zeros((1, 2))
    >>> updates, state = opt.update(jnp.array([[3.0, 4.0]]), opt.init(params), params)
    >>> optax.apply_updates(params, updates)  # (0.6, 0.8) scaled: the quintic stops near 0.68
    Array([[-0.04101562, -0.0546875 ]], dtype=float32)
  """
  hyper = dict(
    weight_decay=weight_decay,
    momentum=momentum,
    nesterov=nesterov,
    ns_coefficients=ns_coefficients,
    eps=eps,
    ns_steps=ns_steps,
    adjust_lr_fn=adjust_lr_fn,
  )
  return _engine.transform(RULE, learning_rate, initial_count, state_dtype, hyper)


def _small(value: Any) -> bool | None:
  return None if _checks.is_traced(value) else bool(abs(value) < 0.5)


def _bind(rule: registry.Rule, hyper: dict[str, Any]) -> tuple[Any, Any]:
  momentum, weight_decay, eps = hyper["momentum"], hyper["weight_decay"], hyper["eps"]
  small = (_small(1 - momentum) if not _checks.is_traced(momentum) else None, _small(momentum))
  static = {k: hyper[k] for k in ("nesterov", "ns_coefficients", "ns_steps", "adjust_lr_fn")}
  return (
    lambda R, T: rule.scalars(R, T, momentum=momentum, weight_decay=weight_decay, eps=eps),
    lambda s, X, G, buf: rule.elementwise(s, X, G, buf, small=small, **static),
  )


def _coefficients(name: str, value: Any) -> tuple[float, float, float]:
  if not isinstance(value, (tuple, list)) or len(value) != 3:
    raise ValueError(f"{name} must be three numbers (a, b, c), got {value!r} (PyTorch refuses it too)")
  return tuple(float(_checks.float_scalar(f"{name}[{i}]", v)) for i, v in enumerate(value))  # type: ignore[return-value]


def _ns_steps(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 100:
    raise ValueError(f"{name} must be a Python int in [0, 100) (PyTorch refuses 100 and more), got {value!r}")
  return value


def _eps(name: str, value: Any) -> Any:
  why = (
    f"{name} is the floor of the norm the iteration's input is divided by (clamp(min=eps)): a negative "
    f"one floors nothing, and a zero momentum then divides 0 by 0 (docs/spec.md, Muon)"
  )
  return _checks.hyperparameter(name, value, minimum=0.0, why=why)


def _adjust_lr_fn(name: str, value: Any) -> str | None:
  if value not in ADJUST_LR_FNS:
    raise ValueError(f"{name} must be None, 'original' or 'match_rms_adamw' (PyTorch's two), got {value!r}")
  return value


def _refuse(kind: str, g: int, group: Any, advice: Any) -> None:
  """Parameters that are not matrices (PyTorch's constructor refuses them; a state dict may hold one)."""
  for j, p in enumerate(group["params"]):
    if len(p.shape) != 2:
      raise ValueError(
        f"param_groups[{g}]['params'][{j}] has shape {tuple(p.shape)}: torch.optim.{kind} takes "
        f"2-D parameters only"
      )


def _gain(h: Any, R: float, T0: int, steps: int) -> float:
  """Only the decoupled decay reads ``X``: ``lr * weight_decay``."""
  return R * float(h["weight_decay"])


RULE = registry.register(
  registry.Rule(
    name="pytorch_muon",
    transform=pytorch_muon,
    state=PyTorchMuonState,
    fields=(registry.Field("momentum_buffer", "momentum_buffer"),),
    hyperparameters={
      "weight_decay": registry.Hyperparameter(_checks.coefficient),
      "momentum": registry.Hyperparameter(_checks.decay),
      "nesterov": registry.Hyperparameter(_checks.flag, static=True),
      "ns_coefficients": registry.Hyperparameter(_coefficients, static=True),
      "eps": registry.Hyperparameter(_eps),
      "ns_steps": registry.Hyperparameter(_ns_steps, static=True),
      "adjust_lr_fn": registry.Hyperparameter(_adjust_lr_fn, static=True),
    },
    scalars=pytorch_muon_scalars,
    elementwise=pytorch_muon_elementwise,
    bind=_bind,
    minimum_count=0,
    policy=_engine.FRAMEWORK,
    always_reads_params="PyTorch's Muon writes them in place (param.mul_, then param.add_)",
    ranks=(2,),
    reduces=True,  # the iteration's matrix products: each element from the whole matrix
    rounds_inside=True,  # the iteration in bfloat16 (newton_schulz_bfloat16)
    bindings=(
      registry.Binding("optax", "optax.contrib.muon"),  # not the same rule (docs/from_optax.md)
      registry.Binding(
        "torch",
        "Muon",
        torch=registry.TorchOptimizer(
          options=frozenset(
            {"weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn"}
          ),
          signature=frozenset({"ns_coefficients", "ns_steps"}),
          step=False,
          # A tensor lr, momentum, weight_decay or eps: _adjust_lr, 1 - lr * weight_decay, the
          # lerps' weights and the clamp computed in the tensor's dtype, not in float64.
          numbers=frozenset({"lr", "momentum", "weight_decay", "eps"}),
          lacks=frozenset({"maximize", "foreach", "differentiable"}),
          refuse=_refuse,
          examples={
            "plain": dict(lr=0.02, weight_decay=0.0, momentum=0.9, nesterov=False),
            "nesterov": dict(lr=0.02, weight_decay=0.1, momentum=0.95),
            "match_rms_adamw": dict(lr=0.02, momentum=0.3, adjust_lr_fn="match_rms_adamw", eps=1e-5),
            "coefficients": dict(
              lr=0.02, momentum=0.9, ns_coefficients=(2.0, -1.5, 0.5), ns_steps=3, adjust_lr_fn="original"
            ),
          },
        ),
      ),
    ),
    conformance=registry.Conformance(
      trajectory=registry.Trajectory(_gain),
      hyper=dict(weight_decay=0.1, momentum=0.9, nesterov=True, eps=1e-7),
      tests=registry.TestConfig(dict(weight_decay=0.1, momentum=0.9, nesterov=True)),
      dtypes=("float32", "float64", "float16"),
      # The iteration runs in float32 and bfloat16 whatever the parameters' dtype: a float64
      # gradient beyond float32's range is inf there (NaN out, in PyTorch as in the twin), so the
      # float64 huge case takes float32's (its squares summed in float32 stay finite).
      huge={"float64": 1e15},
      why_not={
        "bfloat16": "the twins' bfloat16 rows keep a float32 state beside bfloat16 parameters, which "
        "torch.optim.Muon does not take (lerp_ of a float32 momentum_buffer toward a bfloat16 gradient: "
        "expected dtype float for `end`, seen)"
      },
      edges=(
        registry.Edge("nesterov=0", {"hyper": {"nesterov": False}}),
        registry.Edge("momentum=0.3", {"hyper": {"momentum": 0.3}}),  # both lerps' other branches
        registry.Edge("weight_decay=0", {"hyper": {"weight_decay": 0.0}}),
        registry.Edge("adjust_lr_fn=match_rms_adamw", {"hyper": {"adjust_lr_fn": "match_rms_adamw"}}),
        registry.Edge("ns_steps=0", {"hyper": {"ns_steps": 0}}),  # the normalised input alone
        registry.Edge(
          "ns_coefficients,ns_steps=3", {"hyper": {"ns_coefficients": (2.0, -1.5, 0.5), "ns_steps": 3}}
        ),
        registry.Edge("shape=4x4", {"shapes": ((4, 4),)}),
        registry.Edge("shape=9x3", {"shapes": ((9, 3),)}),  # the transpose
        registry.Edge("shape=3x9", {"shapes": ((3, 9),)}),
        # Singular: a rank-one matrix (one singular value; the Gram matrix is 1 x 1).
        registry.Edge("shape=1x7", {"shapes": ((1, 7),)}),
        # Near a singular matrix: a nearly rank-one gradient (Case.gradient "near_singular") from a
        # zero buffer at the first update, so that the iteration's input is a multiple of it (0.19 G
        # with nesterov): one singular value dominates, the others 1e-4 to 1e-3 of it. Wide, and
        # tall (the iteration transposes it).
        registry.Edge(
          "gradient=near_singular",
          {"gradient": "near_singular", "state": "zero", "T": 0, "shapes": ((8, 16),)},
        ),
        registry.Edge(
          "gradient=near_singular,shape=16x8",
          {"gradient": "near_singular", "state": "zero", "T": 0, "shapes": ((16, 8),)},
        ),
        # The norm below eps: clamped to eps, the iteration's input far inside the unit ball.
        registry.Edge("eps=1000", {"hyper": {"eps": 1000.0}}),
      ),
    ),
  )
)
