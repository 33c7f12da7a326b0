"""DirectML's ``DML_ADAM_OPTIMIZER_OPERATOR_DESC`` as a JAX call.

For code ported from DirectML: :func:`adam_optimizer` takes the operator's
tensors in its operand order (``InputParametersTensor``,
``InputFirstMomentTensor``, ``InputSecondMomentTensor``, ``GradientTensor``,
``TrainingStepTensor``) and its constants (``LearningRate``, ``Beta1``,
``Beta2``, ``Epsilon``) as keyword arguments, and returns
``(OutputParametersTensor, OutputFirstMomentTensor, OutputSecondMomentTensor)``.
The formula is :func:`onnx_optax.rules.directml_adam`'s; the Optax transform
is :func:`onnx_optax.directml_adam`.

Differences from DirectML, on purpose:

* Tensors of any shape (DirectML: 4-D) and any real floating dtype
  (DirectML: float32 and float16); the four tensors must share shape and
  dtype, as DirectML requires. Outputs keep that dtype. Nothing is in place:
  JAX returns new arrays (donate the inputs under :func:`jax.jit` for
  DirectML's aliasing).
* The training step is an integer scalar: shape ``()`` or DirectML's
  ``{1, 1, 1, 1}`` (any shape of ones). DirectML's text requires UINT32
  while its support table lists FLOAT32/FLOAT16; this follows the text.
  Any integer type is read in its own type (``np.uint32(2**32 - 1)`` as a
  uint32, as ``jnp.uint32`` is; a Python int as JAX's int64, int32 in the
  default mode). It must be ``>= 1``: at ``T = 0`` the bias correction
  ``sqrt(1 - Beta2^0) / (1 - Beta1^0)`` is 0/0. A concrete 0 raises; a traced
  0 (under :func:`jax.jit`) gives NaN.
* DirectML gives no defaults and no ranges. Every constant is required here,
  and the ranges of :func:`onnx_optax.directml_adam` are checked
  (``0 <= beta1 < 1``, ``0 <= beta2 <= 1``, ``epsilon >= 0``), outside of
  which the result is not finite; ``beta2 = 1`` with ``epsilon = 0`` is
  refused too (the second moment stays 0: every step is 0/0).
"""

from __future__ import annotations

from typing import Any

from jax import Array

from onnx_optax import _checks
from onnx_optax.rules import directml as rule

__all__ = ["adam_optimizer"]


def adam_optimizer(
  input_parameters: Any,
  input_first_moment: Any,
  input_second_moment: Any,
  gradient: Any,
  training_step: Any,
  *,
  learning_rate: float,
  beta1: float,
  beta2: float,
  epsilon: float,
) -> tuple[Array, Array, Array]:
  """DirectML Adam (``DML_OPERATOR_ADAM_OPTIMIZER``) on one tensor::

      M_new = Beta1 * M + (1 - Beta1) * G
      V_new = Beta2 * V + (1 - Beta2) * G * G
      Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)
      X_new = X - LearningRate * Alpha * M_new / (sqrt(V_new) + Epsilon)

  Args:
    input_parameters: ``X``.
    input_first_moment: ``M`` (zeros at the first step).
    input_second_moment: ``V`` (zeros at the first step).
    gradient: ``G``.
    training_step: ``T``, an integer scalar ``>= 1`` (1 at the first step).
    learning_rate: ``LearningRate``, the step size.
    beta1: ``Beta1``, the first moment's decay, in ``[0, 1)`` (DirectML calls
      0.9 typical).
    beta2: ``Beta2``, the second moment's decay, in ``[0, 1]`` (typical: 0.999);
      1 is degenerate (every update is 0) and refused with ``epsilon = 0``.
    epsilon: ``Epsilon``, added to ``sqrt(V_new)``, ``>= 0`` (typical: 1e-8, or
      ``FLT_EPSILON`` for float32).

  Returns:
    ``(output_parameters, output_first_moment, output_second_moment)``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from onnx_optax.directml import adam_optimizer
    >>> X, M, V = jnp.array([1.0, 2.0]), jnp.zeros(2), jnp.zeros(2)
    >>> step = jax.jit(adam_optimizer, static_argnames=("learning_rate", "beta1", "beta2", "epsilon"))
    >>> X, M, V = step(X, M, V, jnp.array([3.0, -0.5]), jnp.array(1, jnp.uint32),
    ...                learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=0.0)
    >>> X
    Array([0.9, 2.1], dtype=float32)
  """
  learning_rate = _checks.learning_rate("learning_rate", learning_rate)
  hyper = rule.RULE.checked(dict(beta1=beta1, beta2=beta2, epsilon=epsilon))
  X, M, V, G = _checks.block(
    ("input_parameters", "input_first_moment", "input_second_moment", "gradient"),
    (input_parameters, input_first_moment, input_second_moment, gradient),
  )
  T = _checks.integer_scalar(
    "training_step",
    training_step,
    minimum=1,
    shape_ok=lambda shape: all(d == 1 for d in shape),
    why=" (at T = 0, Alpha = sqrt(1 - beta2^0) / (1 - beta1^0) is 0/0)",
  )
  X, M, V, G = _checks.as_arrays((X, M, V, G))
  U, M_new, V_new = rule.directml_adam_tensor(X, M, V, G, T, learning_rate=learning_rate, **hyper)
  return X + U, M_new, V_new
