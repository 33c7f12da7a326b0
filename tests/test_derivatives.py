"""The rules' custom derivatives: the bias corrections' ``1 - beta^T`` and ``Sqrt``.

Against float64 central differences and hand-derived values: the zero
subgradient of ``Sqrt`` at ``H = 0`` in reverse and forward mode, and finite,
right derivatives at ``T = 0``, where ONNX Adam's unused bias-correction branch
is a 0/0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import onnx_optax
from onnx_optax import rules


def _central_difference(f, x, h=1e-6):
  return (f(x + h) - f(x - h)) / (2 * h)


@pytest.mark.parametrize("name", ["adam", "directml_adam", "adagrad"])
def test_derivatives_match_central_differences(name):
  """The custom derivatives (``1 - beta^T`` and ``Sqrt``) against float64 central differences,
  with respect to a decay (through the bias correction) and to the state ``H`` (through Sqrt)."""

  def step(decay, H):
    X, G, V = (jnp.float64(v) for v in (0.5, -0.8, 0.3))
    if name == "adam":
      return rules.adam(
        0.1,
        3,
        X,
        G,
        V,
        H,
        alpha=0.7,
        beta=decay,
        epsilon=0.1,
        norm_coefficient=0.2,
        norm_coefficient_post=0.0,
      )[0]
    if name == "directml_adam":
      return rules.directml_adam(X, V, H, G, 3, learning_rate=0.1, beta1=0.7, beta2=decay, epsilon=0.1)[0]
    return rules.adagrad(0.1, 3, X, G, H, decay_factor=decay, epsilon=0.1, norm_coefficient=0.2)[0]

  with jax.enable_x64(True):
    for argnum, at in [(0, 0.6), (1, 0.6)]:
      args = [jnp.float64(0.6), jnp.float64(0.6)]
      got = float(jax.grad(lambda *a: step(*a), argnums=argnum)(*args))

      def f(v, args=args, argnum=argnum):
        a = list(args)
        a[argnum] = jnp.float64(v)
        return float(step(*a))

      want = _central_difference(f, at)
      assert got == pytest.approx(want, rel=1e-6, abs=1e-9), (name, argnum)


def test_derivative_through_zero_second_moment_is_the_zero_subgradient():
  """At ``H_new = 0`` the derivative of ``Sqrt`` is taken as 0 (see ``rules._sqrt``): the
  derivative of the update with respect to ``H`` is then 0 (epsilon > 0), not ``beta / (2 * 0)``
  nor any other number."""
  with jax.enable_x64(True):
    zero = jnp.float64(0.0)
    d = jax.grad(
      lambda H: (
        rules.adam(
          0.1,
          3,
          zero,
          zero,
          zero,
          H,
          alpha=0.7,
          beta=0.6,
          epsilon=0.1,
          norm_coefficient=0.0,
          norm_coefficient_post=0.0,
        )[2].sum()
        + rules.adam(
          0.1,
          3,
          zero,
          jnp.float64(1.0),
          zero,
          H,
          alpha=0.7,
          beta=0.6,
          epsilon=0.1,
          norm_coefficient=0.0,
          norm_coefficient_post=0.0,
        )[0]
      )
    )(zero)
    # H_new = 0.6 H; d H_new / d H = 0.6. The second term: V_new = 0.3, H_new = 0.4 + 0.6 H,
    # U = -R_adjusted * 0.3 / (sqrt(H_new) + 0.1),
    # dU/dH = R_adjusted * 0.3 * 0.6 / (2 sqrt(0.4) (sqrt(0.4) + 0.1)^2).
    R_adjusted = 0.1 * (1 - 0.6**3) ** 0.5 / (1 - 0.7**3)
    want = 0.6 + R_adjusted * 0.3 * 0.6 / (2 * 0.4**0.5 * (0.4**0.5 + 0.1) ** 2)
    assert float(d) == pytest.approx(want, rel=1e-12, abs=0)
    U = lambda H: rules.adam(
      0.1,
      3,
      zero,
      zero,
      jnp.float64(1.0),
      H,
      alpha=0.7,
      beta=0.6,
      epsilon=0.1,
      norm_coefficient=0.0,
      norm_coefficient_post=0.0,
    )[0]
    # V_new = 0.7, H_new = 0.6 H = 0 at H = 0: d Sqrt is 0 there, so dU/dH = 0, in reverse
    # and in forward mode (a tangent that is not linear in H_dot differs only in forward mode).
    assert float(jax.grad(U)(zero)) == 0.0
    assert float(jax.jacfwd(U)(zero)) == 0.0
    assert float(jax.jvp(U, (zero,), (zero,))[1]) == 0.0


# The documented defaults (the ONNX schemas'; DirectML's "typical" values), with


def test_first_update_derivatives_are_finite_and_right():
  """At T = 0 ONNX Adam has no bias correction, and the unused branch (1 - alpha^0 = 0, a 0/0)
  must not leak a NaN into derivatives: dU/dalpha = -R (V - G) / H_sqrt, by hand."""
  with jax.enable_x64(True):
    X, G, V, H = (jnp.float64(v) for v in (0.5, -0.8, 0.3, 0.6))

    def U(alpha, beta, R):
      return rules.adam(
        R, 0, X, G, V, H, alpha=alpha, beta=beta, epsilon=0.1, norm_coefficient=0.0, norm_coefficient_post=0.0
      )[0]

    d_alpha, d_beta, d_R = jax.grad(U, argnums=(0, 1, 2))(
      jnp.float64(0.7), jnp.float64(0.6), jnp.float64(0.1)
    )
    H_new = 0.6 * 0.6 + 0.4 * 0.64
    H_sqrt = H_new**0.5 + 0.1
    V_new = 0.7 * 0.3 + 0.3 * -0.8
    assert float(d_alpha) == pytest.approx(-0.1 * (0.3 - -0.8) / H_sqrt, rel=1e-12, abs=0)
    assert float(d_R) == pytest.approx(-V_new / H_sqrt, rel=1e-12, abs=0)
    # dU/dbeta = R V_new / H_sqrt^2 * dSqrt(H_new)/dbeta, dH_new/dbeta = H - G^2.
    assert float(d_beta) == pytest.approx(
      0.1 * V_new / H_sqrt**2 * (0.6 - 0.64) / (2 * H_new**0.5), rel=1e-12, abs=0
    )


def _equations(jaxpr, primitive: str | None = None) -> int:
  """The equations of a jaxpr (those of ``primitive`` only, if given), in its sub-jaxprs too."""
  count = 0
  for eqn in jaxpr.eqns:
    count += primitive is None or eqn.primitive.name == primitive
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          count += _equations(inner, primitive)
  return count


@pytest.mark.parametrize("name", ["adam", "adagrad", "directml_adam"])
def test_an_update_traces_as_many_custom_jvps_for_three_leaves_as_for_one(name):
  """The leaves of an update are one ``custom_jvp`` (``_engine``), inside which the square root is
  plain (``_numerics.plain_sqrt``): a tree of many leaves traces and lowers no more of them than
  one leaf (the scalars' ``1 - beta^T`` have their own). Planted, ``plain_sqrt``'s default
  ``False`` (the safe square root's ``custom_jvp`` in every leaf) fails this."""

  def calls(params):
    tx = getattr(onnx_optax, name)(learning_rate=0.1)
    return _equations(jax.make_jaxpr(tx.update)(params, tx.init(params), params).jaxpr, "custom_jvp_call")

  one = calls({"a": jnp.ones(3)})
  assert one >= 1
  assert calls({"a": jnp.ones(3), "b": jnp.ones((2, 2)), "c": jnp.ones(())}) == one


@pytest.mark.parametrize("name", ["adam", "adagrad", "pytorch_adam"])
def test_a_derivative_through_the_learning_rate_alone_leaves_the_gradients_constant(name):
  """The leaves' JVP rule differentiates only the inputs whose tangent is not a symbolic zero: the
  derivative of an update through its learning rate alone traces fewer operations than through
  the learning rate and the gradients, whose terms it does not compute as products with zero
  tangents. Planted, the rule's ``symbolic_zeros=False`` (every input differentiated, a zero
  tangent materialized for each one held constant) gives both the same count and fails this."""
  params = {"a": jnp.ones(3), "b": jnp.ones((2, 2))}
  grads = {"a": jnp.full(3, 0.5), "b": jnp.full((2, 2), -0.25)}

  def update(lr, g):
    tx = getattr(onnx_optax, name)(learning_rate=lr)
    return tx.update(g, tx.init(params), params)[0]

  through_lr = jax.make_jaxpr(lambda lr: jax.jvp(lambda r: update(r, grads), (lr,), (1.0,)))(0.1)
  through_both = jax.make_jaxpr(lambda lr: jax.jvp(update, (lr, grads), (1.0, grads)))(0.1)
  alone, both = _equations(through_lr.jaxpr), _equations(through_both.jaxpr)
  assert alone < both
