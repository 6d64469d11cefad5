"""The dense layers' matmul, with a weight gradient that XLA's CPU backend runs at full speed.

    y = dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))   # as in nnx.Linear(dot_general=...)

is lax.dot_general. Why: autodiff writes the kernel's gradient as x^T @ dy contracting the rows of both (a
"transposed-lhs" product); XLA's CPU backend hands that form to Eigen, which on a 2-core Zen 4 runs it at
about 105 GFLOP/s, while the plain form goes to YNNPACK at 147-187, the transpose included (1024 rows,
256-1024 wide). On CPU the backward pass here therefore first writes x^T out (a transpose of the layer's
input, an optimization barrier keeping XLA from folding it back into the product) and then multiplies in the
plain form. Elsewhere (GPU, TPU: transposed operands cost nothing there) and for any other dimension numbers
it is lax.dot_general itself.
"""
import functools

import jax
import jax.numpy as jnp

from flaxlm.platform import platform


def dot_general(x, kernel, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
    """lax.dot_general; on CPU, for x [..., D] times kernel [D, F], with the fast weight gradient above."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    plain = (tuple(lhs_contract), tuple(rhs_contract), tuple(lhs_batch), tuple(rhs_batch)) == (
        (x.ndim - 1,), (0,), (), ())
    if not plain or kernel.ndim != 2 or out_sharding is not None or platform() != "cpu":
        return jax.lax.dot_general(x, kernel, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type, out_sharding=out_sharding)
    return _matmul(x, kernel, precision, preferred_element_type)


def rows_contracted(a_MK, b_MN, precision=None):
    """a_MK^T @ b_MN, float32 [K, N], the sum over the M rows (a weight gradient); on CPU in the fast form above."""
    if platform() == "cpu":
        a_KM = jax.lax.optimization_barrier(a_MK.T)
        return jnp.matmul(a_KM, b_MN, precision=precision, preferred_element_type=jnp.float32)
    return jnp.einsum("mk,mn->kn", a_MK, b_MN, precision=precision, preferred_element_type=jnp.float32)


def _last_axis(x, kernel, precision, preferred_element_type):
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision,
                               preferred_element_type=preferred_element_type)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(x, kernel, precision, preferred_element_type):
    return _last_axis(x, kernel, precision, preferred_element_type)


def _matmul_fwd(x, kernel, precision, preferred_element_type):
    return _last_axis(x, kernel, precision, preferred_element_type), (x, kernel)


def _matmul_bwd(precision, preferred_element_type, residuals, dy):
    x, kernel = residuals
    dy = dy.astype(kernel.dtype)
    dx = jax.lax.dot_general(dy, kernel, (((dy.ndim - 1,), (1,)), ((), ())), precision=precision,
                             preferred_element_type=jnp.float32).astype(x.dtype)
    dkernel = rows_contracted(x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1]), precision)
    dkernel = dkernel.astype(kernel.dtype)
    return dx, dkernel


_matmul.defvjp(_matmul_fwd, _matmul_bwd)
