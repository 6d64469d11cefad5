"""models.matmul: the dense layers' matmul equals lax.dot_general in value and gradients, and on CPU its
weight gradient is compiled as a plain product (no dot contracting the rows of both operands)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxlm.models import matmul
from flaxlm.models.layers import dense

DN = (((2,), (0,)), ((), ()))


def _inputs(dtype=jnp.float32):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 5, 16)), dtype)
    w = jnp.asarray(rng.standard_normal((16, 24)), dtype)
    dy = jnp.asarray(rng.standard_normal((3, 5, 24)), jnp.float32)
    return x, w, dy


def _value_and_grads(dot, x, w, dy):
    y, vjp = jax.vjp(lambda x, w: dot(x, w, DN, preferred_element_type=jnp.float32), x, w)
    return (y, *vjp(dy))


def test_value_and_gradients_equal_lax_dot_general():
    x, w, dy = _inputs()
    ours = _value_and_grads(matmul.dot_general, x, w, dy)
    ref = _value_and_grads(jax.lax.dot_general, x, w, dy)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_bfloat16_gradients_keep_their_dtypes_and_match_float32():
    x, w, dy = _inputs(jnp.bfloat16)
    y, dx, dw = _value_and_grads(matmul.dot_general, x, w, dy)
    assert (y.dtype, dx.dtype, dw.dtype) == (jnp.float32, jnp.bfloat16, jnp.bfloat16)
    _, dx32, dw32 = _value_and_grads(jax.lax.dot_general, x.astype(jnp.float32), w.astype(jnp.float32),
                                     dy.astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(dw, np.float32), np.asarray(dw32), rtol=2e-2, atol=5e-2)
    np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(dx32), rtol=2e-2, atol=5e-2)


def test_other_dimension_numbers_are_plain_dot_general():
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((2, 4, 6)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((2, 6, 3)), jnp.float32)
    batched = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(np.asarray(matmul.dot_general(a, b, batched)),
                                  np.asarray(jax.lax.dot_general(a, b, batched)))


def _transposed_lhs_dots(hlo):
    """Dots in compiled HLO text that contract dimension 0 of their left operand (x^T @ dy written as is)."""
    return [ln for ln in hlo.splitlines() if re.search(r"\bdot\(", ln) and "lhs_contracting_dims={0}" in ln]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the fast form is the CPU backend's")
def test_weight_gradient_compiles_without_a_transposed_lhs_product():
    x, w, dy = _inputs()

    def grads(dot):
        return jax.jit(lambda x, w: jax.grad(lambda w: jnp.sum(dot(x, w, DN) * dy))(w))

    ours = grads(matmul.dot_general).lower(x, w).compile().as_text()
    assert not _transposed_lhs_dots(ours)
    # the check itself: autodiff of lax.dot_general does produce that product
    assert _transposed_lhs_dots(grads(jax.lax.dot_general).lower(x, w).compile().as_text())


def test_rows_contracted_is_the_transposed_product():
    rng = np.random.default_rng(2)
    a = jnp.asarray(rng.standard_normal((32, 8)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((32, 12)), jnp.float32)
    np.testing.assert_allclose(np.asarray(matmul.rows_contracted(a, b)), np.asarray(a).T @ np.asarray(b),
                               rtol=1e-5, atol=1e-5)


def test_dense_layers_use_it():
    from flax import nnx
    layer = dense(16, 24, jnp.float32, 0.02, nnx.Rngs(0))
    assert layer.dot_general is matmul.dot_general
