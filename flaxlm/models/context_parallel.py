"""Context parallelism: each sequence's positions split over the mesh's 'context' axis (--context_parallel_size), so
that a sequence too long for one device's memory trains on C devices.

Under jit over a mesh with a 'context' axis (flaxlm.training.mesh.make_mesh; on_mesh makes it JAX's context mesh), a
causal LM's forward (flaxlm.models.decoder.CausalLM) runs its layers on the sequence in the load-balanced order and
split over 'context': device c holds chunks c and 2C - 1 - c of 2C equal chunks. Causal attention's work grows with
a query's position, so each device then has the same share of it (MaxText's and Megatron's load balancing); the
order is undone before the final norm, so the head and the loss see the sequence as it was.

Everything per token (projections, MLP, norms, RoPE at each token's own position, experts) runs on 1 / C of the
positions. attention() gathers the keys and values of the whole sequence (an all-gather over 'context': MaxText's
all_gather strategy, Llama 3's) back in their own order, and each device computes the scores of its own queries
only, [T / C, T] instead of [T, T]: masked by the queries' positions in the sequence (causal, a sliding window, the
documents of a packed row, padding). XLA places the collectives from the sharding constraints here; the numbers are
those of the run without it (tests/test_context_parallel.py), up to dropout, whose masks are drawn in the new order.

    with sequence_order(order_T):           # CausalLM.__call__ sets it for its layers; attention() reads it
        ...
"""
import contextlib
import contextvars

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

_ORDER = contextvars.ContextVar("context_parallel_order", default=None)


def context_size():
    """The size of JAX's context mesh's 'context' axis (a --context_parallel_size run's), else 1."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty or "context" not in mesh.axis_names else mesh.shape["context"]


def balanced_order(T, C):
    """int32 [T]: the sequence's positions in the load-balanced order, device c's T / C of them contiguous: chunks c
    and 2C - 1 - c of 2C (T a multiple of 2C)."""
    chunks = np.arange(T, dtype=np.int32).reshape(2 * C, T // (2 * C))
    return np.concatenate([np.concatenate([chunks[c], chunks[2 * C - 1 - c]]) for c in range(C)])


def split_over_context(x_BT):
    """x [B, T, ...] constrained to its rows over the batch axes and T over 'context'."""
    return _constrain(x_BT, "context")


def whole_on_each_device(x_BT):
    """x [B, T, ...] constrained to its rows over the batch axes and all of T on each device of a group."""
    return _constrain(x_BT, None)


def batch_axes(mesh):
    """The mesh axes a batch's rows are split over: all but 'context' (whose devices share rows)."""
    return tuple(name for name in mesh.axis_names if name != "context")


def _constrain(x_BT, sequence_axis):
    batch = batch_axes(jax.sharding.get_abstract_mesh())
    return jax.lax.with_sharding_constraint(x_BT, P(batch, sequence_axis, *([None] * (x_BT.ndim - 2))))


@contextlib.contextmanager
def sequence_order(order_T):
    """The order (numpy int32 [T], balanced_order's) in which the layers inside hold the sequence; attention() reads
    it (current_order) to mask by each query's position."""
    token = _ORDER.set(order_T)
    try:
        yield
    finally:
        _ORDER.reset(token)


def current_order():
    """sequence_order's order, or None outside one (no context parallelism)."""
    return _ORDER.get()


def check_length(T, C):
    """A UserError unless a sequence of T positions splits into 2C equal chunks (C 1: any)."""
    if C > 1 and T % (2 * C):
        from flaxlm.errors import UserError
        raise UserError(f"rows of {T} tokens do not split into 2 x --context_parallel_size {C} equal chunks (the "
                        f"load-balanced order); use a --block_size (--max_seq_length) that is a multiple of {2 * C}")
