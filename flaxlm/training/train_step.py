"""The jitted train step and the layout of the batch it takes.

    layout = BatchLayout.plan(micro_batch, accumulation_steps, mesh, tokens_per_row, chunk_tokens)
    state, shardings = initial_state(params, tx, mesh, "data")       # or "fsdp"
    step = compile_train_step(objective.loss_sums, tx, layout, shardings)
    state, metrics = step(state, layout.to_device(host_batch), key)

One step: gradient accumulation inside it (a scan over the pieces of the global batch), the loss normalized by
the global count of target tokens, a NaN/Inf update never applied (flaxlm.training.divergence). On CPU each
device's micro-batch is also cut into chunks computed in turn (cpu_chunks): more pieces, the same gradient.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding

from flaxlm.training import mesh as meshlib
from flaxlm.platform import platform as target_platform
from flaxlm.training.divergence import apply_if_finite


def make_train_step(loss_sums, tx, accum_steps, trainable=None):
    """(state, batch, key) -> (state, metrics). With accumulation, batch leaves are [accum, B, ...]. trainable: a
    tree of bools like the params (--train_only's first phase): the gradient stops at the others (zero, never
    computed), so the gradient norm (clipping, the log) is the trained parameters'."""
    def grads_and_sums(params, batch, key, *frozen):
        def f(p):
            if trainable is not None:
                p = jax.tree.map(lambda x, t: x if t else jax.lax.stop_gradient(x), p, trainable)
            sums = loss_sums(p, batch, key, *frozen)
            return sums["loss_sum"], sums
        (_, sums), grads = jax.value_and_grad(f, has_aux=True)(params)
        return grads, sums

    def step(state, batch, key, *frozen):  # frozen: (the Objective's frozen arrays,) or ()
        params = state["params"]
        if accum_steps == 1:
            grads, sums = grads_and_sums(params, batch, key, *frozen)
        else:
            def body(carry, xs):
                i, micro = xs
                out = grads_and_sums(params, micro, jax.random.fold_in(key, i), *frozen)
                return jax.tree.map(jnp.add, carry, out), None
            first = jax.tree.map(lambda x: x[0], batch)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                 jax.eval_shape(grads_and_sums, params, first, key, *frozen))
            (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(accum_steps), batch))
        count = jnp.maximum(sums["weight_sum"], 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)  # loss = sum over the global batch / global count
        metrics = {k.removesuffix("_sum"): v / count for k, v in sums.items() if k != "weight_sum"}
        metrics["grad_norm"] = optax.tree.norm(grads)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        new_params, opt_state = apply_if_finite(finite, tx, grads, state["opt_state"], params)  # NaN/Inf: no change
        metrics["finite"] = finite
        return {"step": state["step"] + 1, "params": new_params, "opt_state": opt_state}, metrics
    return step


def initial_state(params, tx, mesh, sharding):
    """(train state {step, params, opt_state} on the mesh, its shardings) for --sharding data or fsdp."""
    from flaxlm.training.sharding import state_shardings
    new_state = _new_state(tx)  # built inside jit: each device creates only its part of the optimizer state
    shardings = state_shardings(jax.eval_shape(new_state, params), mesh, sharding)
    return jax.jit(new_state, out_shardings=shardings)(jax.device_put(params, shardings["params"])), shardings


def abstract_state(params, tx, mesh, sharding):
    """(the train state initial_state would make, as jax.ShapeDtypeStructs with their shardings; the shardings)."""
    from flaxlm.training.sharding import state_shardings
    shapes = jax.eval_shape(_new_state(tx), params)
    shardings = state_shardings(shapes, mesh, sharding)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings), shardings


def _new_state(tx):
    return lambda p: {"step": jnp.zeros((), jnp.int32), "params": p, "opt_state": tx.init(p)}


def cpu_chunks(rows_per_device, tokens_per_row, chunk_tokens, platform=None):
    """How many pieces each device's micro-batch is cut into for the forward/backward pass: on CPU, pieces of
    at least chunk_tokens tokens (their activations and logits stay in cache: ~20% faster steps at 4096
    tokens); elsewhere 1. The gradient is the same sum either way."""
    platform = platform or target_platform()
    if platform != "cpu" or not chunk_tokens:
        return 1
    return max(k for k in range(1, rows_per_device + 1)
               if rows_per_device % k == 0 and rows_per_device // k * tokens_per_row >= min(
                   chunk_tokens, rows_per_device * tokens_per_row))


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """How a global batch reaches the train step: `accum` pieces of `piece_rows` rows each (every piece split
    over the devices), summed inside the step. The pieces are the --gradient_accumulation_steps micro-batches,
    each cut into `chunks` on CPU (cpu_chunks; 1 on accelerators)."""
    global_batch: int
    devices: int  # the row shards: the devices, or their --context_parallel_size groups
    accumulation_steps: int
    chunks: int
    piece_rows: int  # rows of one piece, over all devices
    accum: int  # pieces per step: accumulation_steps * chunks
    local_rows: object  # this process's rows of a global batch (a slice or an index array)
    sharding: NamedSharding  # of the device batch: [accum, piece_rows, ...] (or [piece_rows, ...] for one piece)
    context: int = 1  # devices sharing each row's positions (--context_parallel_size)

    @classmethod
    def plan(cls, micro_batch, accumulation_steps, mesh, tokens_per_row, chunk_tokens):
        """The layout of micro_batch rows per accumulation step (a multiple of the mesh's devices)."""
        shards = meshlib.batch_shards(mesh)  # the devices, or their groups under context parallelism
        chunks = cpu_chunks(micro_batch // shards, tokens_per_row, chunk_tokens)
        piece_rows, accum = micro_batch // chunks, accumulation_steps * chunks
        return cls(global_batch=micro_batch * accumulation_steps, devices=shards,
                   accumulation_steps=accumulation_steps, chunks=chunks, piece_rows=piece_rows, accum=accum,
                   local_rows=_accum_slice(meshlib.local_rows(piece_rows), piece_rows, accum),
                   sharding=meshlib.batch_sharding(mesh, leading_axes=1 if accum > 1 else 0),
                   context=mesh.size // shards)

    def pieces(self, batch):
        """A host batch of this process's rows, its leaves reshaped to [accum, rows, ...] for the step."""
        if self.accum == 1:
            return batch
        return {k: v.reshape(self.accum, -1, *v.shape[1:]) for k, v in batch.items()}

    def to_device(self, batch):
        """A host batch of this process's rows -> the global device batch the step takes."""
        return meshlib.to_device_batch(self.pieces(batch), self.sharding)

    def describe(self):
        """'global batch 64 (8 devices x 4 x 2 accumulation, each device computing 2 chunks in turn)'."""
        chunks = f", each device computing {self.chunks} chunks in turn" if self.chunks > 1 else ""
        groups = f"{self.devices} devices" if self.context == 1 else \
            f"{self.devices} groups of {self.context} devices (context parallel)"
        return (f"global batch {self.global_batch} ({groups} x "
                f"{self.piece_rows * self.chunks // self.devices} x {self.accumulation_steps} accumulation{chunks})")


def compile_train_step(loss_sums, tx, layout, shardings, donate=True, trainable=None, frozen=None):
    """make_train_step jitted over the mesh: the state placed as `shardings` (initial_state's) and, when
    `donate`, updated in place; the batch as `layout` says; the metrics whole on every device. frozen: the
    Objective's frozen arrays (or their ShapeDtypeStructs), taken after the key where they are placed."""
    mesh = layout.sharding.mesh
    repl = meshlib.replicated(mesh)
    frozen_shardings = () if frozen is None else (jax.tree.map(lambda x: x.sharding, frozen),)
    return meshlib.on_mesh(jax.jit(make_train_step(loss_sums, tx, layout.accum, trainable),
                                   in_shardings=(shardings, layout.sharding, repl, *frozen_shardings),
                                   out_shardings=(shardings, repl), donate_argnums=0 if donate else ()), mesh)


def _accum_slice(local, piece_rows, accum):
    """This process's rows of a global batch of accum pieces, so that each piece is split over the devices the
    same way (rows reshaped to [accum, piece_rows, ...] afterwards)."""
    if accum == 1:
        return local
    return np.concatenate([np.arange(piece_rows)[local] + i * piece_rows for i in range(accum)])
