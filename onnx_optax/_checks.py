"""Input checks shared by the Optax transforms, the ONNX interface and DirectML's call.

Every check runs in Python before any computation, on static information
(tree structures, shapes, dtypes) or on concrete values. Traced values (under
``jax.jit``, ``jax.vmap`` or ``optax.inject_hyperparams``) cannot be compared
in Python; their value checks are skipped and only their shape is checked,
except whether a decay rounds to 1 in a 16-bit dtype, which a host callback
checks when the program runs (:func:`decays_representable`).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

INT32_MAX = int(np.iinfo(np.int32).max)


def is_traced(value: Any) -> bool:
  return isinstance(value, jax.core.Tracer)


def hyperparameter(
  name: str,
  value: Any,
  *,
  minimum: float | None = None,
  maximum: float | None = None,
  maximum_exclusive: bool = False,
  why: str = "",
) -> Any:
  """Checks a real scalar hyperparameter; returns it unchanged.

  ``why`` explains the range; it ends a range error's message. The ranges of
  the rules' hyperparameters are decided once per kind, by the functions
  below (:func:`decay`, :func:`coefficient`, ...), not at each call site.

  Raises:
    TypeError: ``value`` is not a real scalar (a bool, a string, a complex
      number, an array with more than one element...).
    ValueError: a concrete ``value`` is not finite or outside the range.
  """
  if isinstance(value, bool) or isinstance(value, (str, bytes)) or value is None:
    raise TypeError(f"{name} must be a real number, got {value!r}")
  wide_enough(name, value)  # NumPy scalars and arrays, concrete or traced: the dtype is static.
  if isinstance(value, numbers.Number):
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
      raise TypeError(f"{name} must be a real number, got complex {value!r}")
  else:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
      raise TypeError(f"{name} must be a real number or a scalar array, got {type(value).__name__}")
    if tuple(shape) != ():
      raise TypeError(f"{name} must be a scalar, got an array of shape {tuple(shape)}")
    if dtype == np.bool_ or not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
      raise TypeError(f"{name} must be a real number, got an array of dtype {dtype}")
    if is_traced(value):
      return value
  try:
    x = float(value)
  except OverflowError:  # A Python int beyond the float range.
    raise ValueError(f"{name} must be finite, got an int of {int(value).bit_length()} bits") from None
  if not math.isfinite(x):
    raise ValueError(f"{name} must be finite, got {x}")
  because = f": {why}" if why else ""
  if minimum is not None and x < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {x}{because}")
  if maximum is not None and (x > maximum or (maximum_exclusive and x == maximum)):
    bound = f"< {maximum}" if maximum_exclusive else f"<= {maximum}"
    raise ValueError(f"{name} must be {bound}, got {x}{because}")
  return value


def wide_enough(name: str, value: Any, *, at_least: Any = None, why: str = "") -> Any:
  """A float hyperparameter array must be at least float32; returns it unchanged.

  The rules compute their scalars (bias corrections, ``1 - beta``) in the
  dtype the hyperparameters arrive in, float32 at least, and round them once
  to the compute dtype (docs/spec.md, Dtypes). A hyperparameter that arrives
  already rounded to float16 or bfloat16 is another number: bfloat16 holds
  0.999 as 1.0 and float16 holds 1e-8 as 0, so the rule would run another
  algorithm, silently. ``optax.inject_hyperparams`` does exactly this by
  default: it casts every float hyperparameter to the parameters' dtype.
  The dtype is static, so this is checked under ``jax.jit`` too.

  ``at_least``: a float dtype the value must be at least as wide as, where the
  value is computed by the caller's code and stands for a number computed in
  that dtype (a schedule of the PyTorch bridge: PyTorch's rate is a Python
  float); ``why`` says where that is so.
  """
  dtype = getattr(value, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    return value
  if jnp.finfo(dtype).bits < 32:
    raise TypeError(
      f"{name} arrived as a {dtype} array, rounded before the rule could compute with it "
      f"(bfloat16 holds 0.999 as 1.0, float16 holds 1e-8 as 0); the rules compute their scalars in "
      f"float32 at least. optax.inject_hyperparams casts float hyperparameters to the parameters' "
      f"dtype unless told otherwise: pass hyperparam_dtype=jnp.float32, as in "
      f"optax.inject_hyperparams(onnx_optax.adam, hyperparam_dtype=jnp.float32)(...), adding "
      f"static_args=('state_dtype',) when you pass state_dtype (and 'adam_mode' for ort_adamw); "
      f"elsewhere pass a Python float or a float32 array"
    )
  if at_least is not None and jnp.finfo(dtype).bits < jnp.finfo(at_least).bits:
    wide = jnp.dtype(at_least).name
    raise TypeError(
      f"{name} is a {dtype} array for {wide} parameters{why}: its value was rounded to {dtype} "
      f"(1e-8 relative for float32) before the rule could compute with it. Compute the rate in {wide}: "
      f"from Python floats and the count n as the transform passes it (an int64 array under "
      f"jax_enable_x64, where n / k is float64), with no cast in the schedule: write n, not "
      f"n.astype(jnp.int32) (an int32 n / k is {dtype}) nor jnp.asarray(n, jnp.{dtype}), and 0.1, not "
      f"jnp.{dtype}(0.1)"
    )
  return value


# -- the ranges, one per kind of hyperparameter ------------------------------------
#
# Every rule, the ONNX operators' calls and the bridges check a hyperparameter
# of a kind with that kind's function, so a range is decided once (docs/spec.md,
# "Hyperparameter ranges", gives the reasons, and tests/test_bad_input.py checks
# each bound in every rule that has the kind). Traced values are not checked.

_RANGES = "docs/spec.md, Hyperparameter ranges"


def learning_rate(name: str, value: Any) -> Any:
  """A learning rate (``R``): any finite real.

  A negative rate ascends the gradient, as in Optax (PyTorch's constructors
  refuse ``lr < 0``; its ``maximize=True`` is the bridges' way).
  """
  return hyperparameter(name, value)


def decay(name: str, value: Any, *, below_one: bool = False) -> Any:
  """A decay rate of a moment: the fraction of the state kept per update.

  In ``[0, 1]``: above 1 the state grows without bound, below 0 it flips
  sign at every update (and the bias corrections' ``beta^T`` has no real
  logarithm). ``below_one``: in ``[0, 1)``, for the first moments of the two
  Adams, whose bias correction divides by ``1 - beta^T`` (0 at 1).
  """
  why = (
    f"{name} is a decay rate, the fraction of the state kept per update, in [0, 1"
    + (f"): at 1 the bias correction 1 - {name}^T is 0, a division by zero" if below_one else "]")
    + f"; above 1 the state grows without bound, below 0 it flips sign at every update ({_RANGES})"
  )
  return hyperparameter(name, value, minimum=0.0, maximum=1.0, maximum_exclusive=below_one, why=why)


def first_moment_decay(name: str, value: Any) -> Any:
  """A first moment's decay rate where a bias correction divides by ``1 - beta^T``: ``[0, 1)``."""
  return decay(name, value, below_one=True)


def gradient_weight(name: str, value: Any) -> Any:
  """The weight of the gradient in a momentum, in ``[0, 1]``.

  ONNX Momentum's ``beta``, PyTorch's ``1 - dampening``: above 1 the gradient
  is amplified, below 0 reversed.
  """
  why = (
    f"{name} is the gradient's weight in the momentum (PyTorch's 1 - dampening), in [0, 1]; "
    f"above 1 it amplifies the gradient, below 0 it reverses it ({_RANGES})"
  )
  return hyperparameter(name, value, minimum=0.0, maximum=1.0, why=why)


def dampening(name: str, value: Any) -> Any:
  """PyTorch SGD's ``dampening``, ``1 -`` the gradient's weight in the momentum: ``[0, 1]``."""
  why = (
    f"{name} is 1 - the gradient's weight in the momentum (ONNX Momentum's beta), in [0, 1]; "
    f"above 1 it reverses the gradient, below 0 it amplifies it ({_RANGES})"
  )
  return hyperparameter(name, value, minimum=0.0, maximum=1.0, why=why)


def accumulator(name: str, value: Any) -> Any:
  """The starting value of a sum of squared gradients (PyTorch's ``initial_accumulator_value``), ``>= 0``."""
  why = f"{name} starts a sum of squares, whose square root a negative start makes NaN ({_RANGES})"
  return hyperparameter(name, value, minimum=0.0, why=why)


def coefficient(name: str, value: Any) -> Any:
  """An L2 (weight-decay) coefficient, ``>= 0``.

  ``norm_coefficient`` adds the gradient of ``0.5 * c * ||X||^2``: a negative
  ``c`` pushes the weights away from zero. PyTorch refuses a negative
  ``weight_decay`` for the same reason.
  """
  why = (
    f"{name} is an L2 (weight-decay) coefficient: a negative one pushes the weights away from 0, "
    f"and PyTorch refuses a negative weight_decay ({_RANGES})"
  )
  return hyperparameter(name, value, minimum=0.0, why=why)


def parameter_decay(name: str, value: Any) -> Any:
  """A multiplicative decay of the parameters, ``X <- (1 - c) X``, in ``[0, 1)``.

  ONNX Adam's ``norm_coefficient_post``: 1 zeroes the parameters at every
  update, above 1 flips their sign, below 0 grows them.
  """
  why = (
    f"{name} is the fraction of the parameters removed per update, X_final = (1 - {name}) X_new, "
    f"in [0, 1): 1 zeroes them at every update, above 1 flips their sign, below 0 grows them "
    f"({_RANGES})"
  )
  return hyperparameter(name, value, minimum=0.0, maximum=1.0, maximum_exclusive=True, why=why)


def learning_rate_decay(name: str, value: Any) -> Any:
  """Adagrad's learning-rate decay (PyTorch ``lr_decay``), ``>= 0``.

  ``R / (1 + T * decay_factor)`` divides by zero at ``T = -1 / decay_factor``.
  """
  why = f"R / (1 + T * {name}) divides by zero at T = -1/{name}; PyTorch refuses lr_decay < 0 ({_RANGES})"
  return hyperparameter(name, value, minimum=0.0, why=why)


def epsilon(name: str, value: Any) -> Any:
  """An epsilon added to a square root in a denominator, ``>= 0``.

  A negative epsilon can zero the denominator (``Sqrt(H) = -epsilon``).
  """
  why = f"{name} is added to a square root in a denominator, which a negative one can zero ({_RANGES})"
  return hyperparameter(name, value, minimum=0.0, why=why)


def shrink_factor(name: str, value: Any) -> Any:
  """A factor that shrinks a step size where the gradient changes sign (Rprop's ``etaminus``), in ``(0, 1)``.

  1 or above does not shrink it, 0 stops that element for good, below 0 flips the step size's
  sign. PyTorch's constructor refuses the same (``0 < etas[0] < 1``).
  """
  why = (
    f"{name} shrinks a step size, in (0, 1): at 1 or above it does not shrink it, at 0 it stops the "
    f"element for good, below 0 it flips the step size's sign; PyTorch refuses the same ({_RANGES})"
  )
  hyperparameter(name, value, minimum=0.0, maximum=1.0, maximum_exclusive=True, why=why)
  if not is_traced(value) and float(value) == 0.0:
    raise ValueError(f"{name} must be > 0, got 0.0: {why}")
  return value


def growth_factor(name: str, value: Any) -> Any:
  """A factor that grows a step size where the gradient keeps its sign (Rprop's ``etaplus``), ``> 1``.

  At 1 or below it does not grow it. PyTorch's constructor refuses the same (``1 < etas[1]``).
  """
  why = (
    f"{name} grows a step size, > 1: at 1 or below it does not grow it; PyTorch refuses the same ({_RANGES})"
  )
  hyperparameter(name, value, minimum=1.0, why=why)
  if not is_traced(value) and float(value) == 1.0:
    raise ValueError(f"{name} must be > 1, got 1.0: {why}")
  return value


def step_size(name: str, value: Any) -> Any:
  """A bound of a step's size (Rprop's ``step_sizes``), ``>= 0``: a negative one is no size."""
  why = (
    f"{name} bounds the size of a step, the magnitude of a parameter's move: a negative one is none "
    f"({_RANGES})"
  )
  return hyperparameter(name, value, minimum=0.0, why=why)


def flag(name: str, value: Any) -> bool:
  """A bool that selects the formula (ONNX stores such attributes as ints): True, False, 1 or 0.

  A concrete scalar array is read; a traced one cannot be (see :func:`static_int`).
  """
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  number = static_int(name, value, what="a bool (or the ONNX attribute's 0 / 1)")
  if number not in (0, 1):
    raise TypeError(f"{name} must be a bool (or the ONNX attribute's 0 / 1), got {value!r}")
  return bool(number)


def static_int(name: str, value: Any, what: str = "the int 0 or 1") -> int:
  """An int that selects a formula, so it must be known when the update is traced.

  A concrete integer scalar array is read (``optax.inject_hyperparams`` hands
  ints in as arrays); a traced one cannot be.
  """
  if is_traced(value):
    raise TypeError(
      f"{name} selects the formula and cannot be traced; under optax.inject_hyperparams "
      f"pass static_args=('{name}',)"
    )
  if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
    return int(value)
  shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
  if shape is not None and tuple(shape) == () and dtype is not None and jnp.issubdtype(dtype, jnp.integer):
    return int(value)
  raise TypeError(f"{name} must be {what}, got {value!r}")


def count(name: str, value: Any, *, minimum: int) -> Any:
  """Checks an update count that fits the int32 state; returns it.

  A Python int, or an integer scalar array: ``optax.inject_hyperparams``
  hands every numeric argument in as an array, traced under ``jax.jit``. A
  concrete value is range-checked and returned as a Python int; a traced one
  is returned unchecked (its value cannot be read in Python).
  """
  if isinstance(value, bool) or value is None:
    raise TypeError(f"{name} must be an int, got {value!r}")
  if not isinstance(value, numbers.Integral):
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or tuple(shape) != () or not jnp.issubdtype(dtype, jnp.integer):
      raise TypeError(f"{name} must be an int or an integer scalar array, got {value!r}")
    if is_traced(value):
      return value
  if not minimum <= int(value) <= INT32_MAX:
    raise ValueError(f"{name} must be in [{minimum}, {INT32_MAX}], got {int(value)}")
  return int(value)


def floating_dtype(name: str, dtype: Any) -> Any:
  """Checks an optional floating dtype; returns it as a NumPy dtype or None."""
  if dtype is None:
    return None
  # An array: optax.inject_hyperparams took the dtype for a schedule. (A NumPy
  # dtype object has a `shape` too, the empty shape of its sub-array.)
  if hasattr(dtype, "shape") and not isinstance(dtype, np.dtype):
    raise TypeError(
      f"{name} must be a dtype, got an array; under optax.inject_hyperparams pass "
      f"static_args=('{name}',) or a dtype object such as jnp.dtype('float32')"
    )
  try:
    dtype = jnp.dtype(dtype)
  except TypeError as e:
    raise TypeError(f"{name} must be a floating dtype, got {dtype!r}") from e
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{name} must be a floating dtype, got {dtype}")
  return dtype


def _leaves(tree: Any) -> list[tuple[str, Any]]:
  return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def floating_leaves(name: str, tree: Any) -> None:
  """Every leaf of ``tree`` must be a real floating array (or array spec)."""
  for path, leaf in _leaves(tree):
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
      raise TypeError(f"{name}{path} must be an array, got {type(leaf).__name__}")
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(
        f"{name}{path} has dtype {dtype}; onnx_optax updates real floating "
        "tensors only (float16, bfloat16, float32, float64)"
      )


def ranks(name: str, tree: Any, accepted: tuple[int, ...], rule: str) -> None:
  """Every leaf of ``tree`` has one of the ``accepted`` numbers of dimensions (``Rule.ranks``)."""
  for path, leaf in _leaves(tree):
    if len(leaf.shape) not in accepted:
      dims = " or ".join(f"{n}-D" for n in accepted)
      raise ValueError(
        f"{name}{path} has shape {tuple(leaf.shape)}: {rule} takes only {dims} parameters, as its "
        f"framework does; give the others to another transform (optax.multi_transform)"
      )


def state(state_cls: Any, value: Any) -> None:
  """``value`` is a ``state_cls`` with an integer scalar count and float leaves.

  Checked before anything is read from it: the state of another optimizer
  (another NamedTuple, a plain tuple from a hand-rolled restore) would
  otherwise fail deep inside the rule, or run with the wrong tensors.
  """
  if not isinstance(value, state_cls):
    raise TypeError(
      f"state must be the {state_cls.__name__} that this transform's init returns, got {type(value).__name__}"
    )
  dtype, shape = getattr(value.count, "dtype", None), getattr(value.count, "shape", None)
  if dtype is None or shape is None or tuple(shape) != () or not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(
      f"state.count must be an integer scalar array, got {type(value.count).__name__} "
      f"of dtype {dtype} and shape {shape}"
    )
  for field in state_cls._fields[1:]:
    floating_leaves(f"state.{field}", getattr(value, field))


def same_trees(
  updates: Any,
  others: dict[str, Any],
  shapes: Mapping[str, Callable[[tuple[int, ...]], tuple[int, ...]]] | None = None,
) -> None:
  """``updates`` and every tree in ``others`` share structure and shapes.

  Gradients must also have the dtype of their parameter (``others['params']``):
  nothing is broadcast or cast silently. ``shapes``: name -> ``shape(gradient's shape)``, the
  shape a tree's leaves have where it is not the gradient's (a state field's
  :attr:`~onnx_optax.registry.Field.shape`).
  """
  shapes = shapes or {}
  floating_leaves("updates", updates)
  structure: Any = jax.tree.structure(updates)
  for name, tree in others.items():
    if structure != jax.tree.structure(tree):
      raise ValueError(
        f"updates and {name} have different tree structures:\n"
        f"  updates: {structure}\n  {name}: {jax.tree.structure(tree)}"
      )
  grads = _leaves(updates)
  for name, tree in others.items():
    shape_of = shapes.get(name)
    for (path, g), (_, x) in zip(grads, _leaves(tree)):
      want = tuple(g.shape) if shape_of is None else tuple(shape_of(tuple(g.shape)))
      if want != tuple(x.shape):
        if shape_of is not None and want != tuple(g.shape):
          raise ValueError(
            f"{name}{path} has shape {tuple(x.shape)}, but the rule keeps it in shape {want} for "
            f"updates{path} of shape {tuple(g.shape)}; onnx_optax never broadcasts"
          )
        raise ValueError(
          f"updates{path} has shape {tuple(g.shape)} but {name}{path} has shape "
          f"{tuple(x.shape)}; onnx_optax never broadcasts"
        )
      if name == "params" and g.dtype != x.dtype:
        raise TypeError(
          f"updates{path} has dtype {g.dtype} but params{path} has dtype {x.dtype}; "
          "cast the gradient explicitly"
        )


def decays_representable(
  decays: dict[str, Any], params: Any, state_dtype: Any, may_be_one: Sequence[str] = ()
) -> None:
  """No decay rate below 1 rounds to 1, nor its ``1 - decay`` to 0, where a leaf is computed or stored.

  The rules multiply the state by the decay rounded to the compute dtype
  (the wider of the parameter's and the state's). bfloat16 has 8
  significant bits: ``beta = 0.999`` rounds to 1.0, so Adam's second moment
  would never decay and become a running sum: a different algorithm,
  silently. (float16 rounds 0.9999 to 1.0.)

  The new state is then rounded to the state's dtype. Where the decay rounds
  to 1 in that dtype, ``decay * V`` rounds back to ``V`` whenever the
  gradient's share is small: a float32 computation stored in bfloat16 with
  ``beta = 0.999`` forgets nothing either (``V`` stalls at a running sum's
  value). So the state dtype gets the same check. A concrete rate is
  checked at once. A traced one (``jax.jit(tx.init)`` of injected
  hyperparameters) is checked when the program runs, by a host callback,
  wherever a leaf is computed or stored in a 16-bit dtype: running it raises
  (as a ``JaxRuntimeError`` carrying this message), and an abstract
  evaluation (``jax.eval_shape``), which computes nothing, passes.
  ``may_be_one``: the rates whose range includes 1, for which the message
  offers ``1.0`` as the other fix.
  """
  # One check per distinct (compute, store) dtype pair, named by its first leaf: a model of
  # thousands of leaves has two or three pairs.
  pairs: dict[tuple[Any, Any], str] = {}
  for path, leaf in _leaves(params):
    stored = jnp.dtype(state_dtype or leaf.dtype)
    pairs.setdefault((jnp.promote_types(leaf.dtype, stored), stored), path)
  dtypes = [(path, computed, stored) for (computed, stored), path in pairs.items()]
  concrete = {name: v for name, v in decays.items() if not is_traced(v)}
  _decays_round(concrete, dtypes, may_be_one)
  traced = {name: v for name, v in decays.items() if is_traced(v)}
  narrow = any(jnp.finfo(d).nmant < jnp.finfo(jnp.float32).nmant for _, c, s in dtypes for d in (c, s))
  if traced and narrow:
    jax.debug.callback(functools.partial(_decays_round, dtypes=dtypes, may_be_one=may_be_one), traced)


def _decays_round(
  decays: dict[str, Any], dtypes: Sequence[tuple[str, Any, Any]], may_be_one: Sequence[str]
) -> None:
  """Raises where a rate in ``[0, 1)`` of ``decays`` rounds to 1 in a dtype.

  Its complement ``1 - value`` (at least ``2**-53``) never rounds to 0 in a dtype where the rate
  itself stays below 1: only float16's ``2**-25`` is that coarse, and there the rate rounds to 1.
  """
  for path, computed, stored in dtypes:
    for dtype, where in ((computed, "is computed in"), (stored, "stores its state in")):
      for name, value in decays.items():
        value = float(value)
        if not 0 <= value < 1:
          continue
        # NumPy, not jnp: init may run under jit, where jnp would trace it.
        if float(np.asarray(value, dtype=dtype)) == 1.0:
          one = f" or pass {name}=1.0 if that is what you mean" if name in may_be_one else ""
          raise ValueError(
            f"{name}={value} rounds to 1.0 in {dtype}, the dtype params{path} {where}, "
            f"so the moment would never decay; keep the state in float32 (state_dtype=jnp.float32){one}"
          )


def second_moment_decay_at_one(name: str, value: Any, epsilon: Any, *, always: str = "") -> None:
  """Refuses a second-moment decay of 1 where it gives NaN whatever the gradients.

  At ``beta = 1`` the second moment keeps its initial 0 (``beta * H + 0 *
  G^2``) and the bias correction ``1 - beta^T`` is 0. With ``epsilon = 0``
  every step of the Adams divides by ``Sqrt(0) + 0``: 0/0. ``always``: the
  reason when 1 gives NaN with every epsilon (ONNX Runtime's AdamW in mode 0
  divides ``M2`` by the correction, ``0 * (1 / 0)``). Traced values are not
  checked.
  """
  if is_traced(value) or float(value) != 1.0:
    return
  if always:
    raise ValueError(f"{name}=1.0 {always}; use {name} < 1 ({_RANGES})")
  if not is_traced(epsilon) and float(epsilon) == 0.0:
    raise ValueError(
      f"{name}=1.0 with epsilon=0: from a zero state the second moment never leaves 0 (its decay "
      f"keeps all of it and adds 0 * G^2), so every step divides by Sqrt(0) + 0 = 0 and is Inf or "
      f"NaN; use epsilon > 0 or {name} < 1 ({_RANGES})"
    )


#: The reason ONNX Runtime's AdamW refuses ``beta = 1`` in mode 0 (:func:`second_moment_decay_at_one`).
ORT_ADAMW_MODE0_BETA_ONE = (
  "with adam_mode=0: from a zero state the second moment M2 never leaves 0 and its bias correction "
  "1 - beta^step is 0, "
  "so M2 / (1 - beta^step) is 0 / 0 and every parameter becomes NaN (PyTorch's AdamW refuses "
  "betas[1] = 1 for the same reason)"
)


# -- operator arguments (the ONNX interface and DirectML's call) -----------------


def describe(value: Any) -> str:
  shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
  if shape is not None and dtype is not None:
    return f"an array of shape {tuple(shape)} and dtype {dtype}"
  return f"{type(value).__name__} {value!r}"


def float_scalar(name: str, value: Any) -> Any:
  """A float scalar (ONNX ``R``: float or double); returned as an array or float."""
  if isinstance(value, float):
    return hyperparameter(name, value)
  shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
  if shape is None or dtype is None or tuple(shape) != () or not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{name} must be a float scalar (ONNX: float or double), got {describe(value)}")
  return hyperparameter(name, value)


def integer_scalar(
  name: str, value: Any, *, minimum: int, shape_ok: Callable[[tuple], bool] | None = None, why: str = ""
) -> Any:
  """An integer scalar (ONNX ``T``: int64), as a JAX array of its canonical dtype.

  A concrete value must be ``>= minimum`` and fit the integer type JAX gives
  it: under the default 32-bit mode an int64 ``T`` beyond the int32 range
  raises instead of wrapping.
  """
  if isinstance(value, bool) or isinstance(value, np.bool_):
    raise TypeError(f"{name} must be an integer scalar (ONNX: int64), got {value!r}")
  dtype: Any
  if isinstance(value, numbers.Integral) and not isinstance(value, np.integer):
    # A Python int: JAX's int64 (int32 in the default mode). A NumPy integer
    # keeps its own type below, as the JAX array of the same type does.
    dtype = jax.dtypes.canonicalize_dtype(np.int64)
  else:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    scalar = shape is not None and (tuple(shape) == () or (shape_ok is not None and shape_ok(tuple(shape))))
    if not scalar or dtype is None or dtype == np.bool_ or not jnp.issubdtype(dtype, jnp.integer):
      raise TypeError(f"{name} must be an integer scalar (ONNX: int64), got {describe(value)}")
    if shape is not None and tuple(shape) != ():
      value = jnp.reshape(value, ())
    if is_traced(value):
      return value
    dtype = jax.dtypes.canonicalize_dtype(dtype)
  number = int(value)
  if number < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {number}{why}")
  if number > np.iinfo(dtype).max:
    raise ValueError(
      f"{name} = {number} does not fit {dtype}, JAX's integer type in its default 32-bit "
      "mode; run under jax.enable_x64(True) (or JAX_ENABLE_X64=1) to keep it int64"
    )
  return jnp.asarray(number, dtype)


def floating_tensor(name: str, value: Any) -> Any:
  """A real floating tensor that JAX can hold without changing its dtype."""
  shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
  if shape is None or dtype is None:
    raise TypeError(f"{name} must be an array, got {describe(value)}")
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
      f"{name} has dtype {dtype}; the tensors must be real floating "
      "(ONNX: float or double; float16 and bfloat16 are accepted too)"
    )
  if jax.dtypes.canonicalize_dtype(dtype) != dtype:
    raise TypeError(
      f"{name} has dtype {dtype}, which JAX's default 32-bit mode would truncate; "
      "run under jax.enable_x64(True) (or JAX_ENABLE_X64=1)"
    )
  return value


def block(names: Sequence[str], values: Sequence[Any]) -> list[Any]:
  """Tensors that must share the first one's shape and dtype (never broadcast)."""
  tensors = [floating_tensor(name, value) for name, value in zip(names, values)]
  first, first_name = tensors[0], names[0]
  for name, tensor in zip(names[1:], tensors[1:]):
    if tuple(tensor.shape) != tuple(first.shape):
      raise ValueError(
        f"{name} has shape {tuple(tensor.shape)} but {first_name} has shape "
        f"{tuple(first.shape)}; the tensors are never broadcast"
      )
    if tensor.dtype != first.dtype:
      raise TypeError(f"{name} has dtype {tensor.dtype} but {first_name} has dtype {first.dtype}")
  return tensors


def as_arrays(tensors: Sequence[Any]) -> list[Any]:
  """JAX arrays of checked tensors: called once every check has passed."""
  return [t if is_traced(t) else jnp.asarray(t) for t in tensors]


# -- ONNX Runtime's com.microsoft optimizers (sequences, flags) --------------------


def _one_element(value: Any) -> Any:
  """``value`` of shape ``(1,)`` as a scalar (ONNX Runtime's models declare ``lr`` and ``step`` [1])."""
  shape = getattr(value, "shape", None)
  if shape is not None and tuple(shape) == (1,) and hasattr(value, "reshape"):
    return value.reshape(())
  return value


def one_element_float(name: str, value: Any) -> Any:
  """A float scalar of shape ``()`` or ``(1,)`` (ONNX Runtime's ``lr``), returned with shape ``()``."""
  shape = getattr(value, "shape", None)
  if shape is not None and tuple(shape) not in ((), (1,)):
    raise TypeError(f"{name} must be a float scalar (shape () or (1,)), got {describe(value)}")
  return float_scalar(name, _one_element(value))


def int64_step(name: str, value: Any, *, minimum: int, why: str = "") -> Any:
  """ONNX Runtime's ``step``: an int64 scalar of shape ``()`` or ``(1,)``, ``>= minimum`` when concrete.

  A Python int, or an int64 array; an int32 array too, because JAX's default
  32-bit mode holds every int64 as int32 (a concrete value beyond int32
  raises in that mode, see :func:`integer_scalar`). Other integer dtypes
  (int8, uint64...) are not ONNX Runtime's type and are refused.
  """
  dtype = getattr(value, "dtype", None)
  if (
    dtype is not None
    and not isinstance(value, (bool, np.bool_))
    and jnp.issubdtype(dtype, jnp.integer)
    and np.dtype(dtype) not in (np.dtype(np.int64), np.dtype(np.int32))
  ):
    raise TypeError(f"{name} must be an int64 scalar (ONNX Runtime's step is int64), got {describe(value)}")
  return integer_scalar(name, value, minimum=minimum, shape_ok=lambda shape: shape == (1,), why=why)


def bool_scalar(name: str, value: Any) -> Any:
  """A boolean scalar (ONNX ``tensor(bool)``, shape ``()`` or ``(1,)``); ``None`` is True.

  Returns a Python bool when concrete, the traced scalar otherwise.
  """
  if value is None:
    return True
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
  if shape is None or dtype is None or dtype != np.bool_ or tuple(shape) not in ((), (1,)):
    raise TypeError(f"{name} must be a bool scalar (ONNX: tensor(bool)), got {describe(value)}")
  value = _one_element(value)
  return value if is_traced(value) else bool(value)


def tensor_sequence(name: str, value: Any) -> list[Any]:
  """ONNX Runtime's ``seq(tensor)``: a non-empty list or tuple (an array is not split into rows)."""
  if not isinstance(value, (list, tuple)):
    raise TypeError(f"{name} must be a list of arrays (ONNX Runtime's seq(tensor)), got {describe(value)}")
  if not value:
    raise ValueError(f"{name} is empty; ONNX Runtime's optimizers need at least one tensor")
  return list(value)
