"""The device mesh: one 'data' axis over every device of every process (JAX's own distribution).

Batches are split along their example axis; parameters and optimizer state are replicated or, with
--sharding fsdp, split too (flaxlm.training.sharding). Each process builds only its own rows of a global batch
and JAX assembles the global array. A multi-host run joins JAX's distributed runtime first.
"""
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from flaxlm.errors import UserError


def maybe_initialize_distributed(args=None):
    """Join a multi-host run: from --coordinator_address/--num_processes/--process_id when given (any
    platform, CPU included), else when the environment says there is one (TPU pod, SLURM,
    JAX_COORDINATOR_ADDRESS). Must run before anything touches the devices."""
    if jax.distributed.is_initialized():
        return
    address = getattr(args, "coordinator_address", None)
    count, index = getattr(args, "num_processes", None), getattr(args, "process_id", None)
    if address or count is not None or index is not None:
        check_process_flags(address, count, index)
        jax.distributed.initialize(address, count, index)
        return
    multi = (os.environ.get("JAX_COORDINATOR_ADDRESS")
             or int(os.environ.get("SLURM_NTASKS", "1")) > 1
             or len(os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",")) > 1)
    if multi:
        jax.distributed.initialize()


def join_processes(args=None):
    """(index, count) of this process: in a multi-host run (joined here, as maybe_initialize_distributed joins it)
    or (0, 1) on one host, where JAX's backends stay unstarted (a tool that forks workers needs them so)."""
    maybe_initialize_distributed(args)
    if not jax.distributed.is_initialized():
        return 0, 1
    return jax.process_index(), jax.process_count()


def sync_processes(name):
    """Wait until every process of a multi-host run gets here (a barrier over their devices); `name` must be the
    same in all of them."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def check_process_flags(address, count, index):
    if not (address and count is not None and index is not None):
        raise UserError("a multi-host run by flags needs all of --coordinator_address HOST:PORT, "
                        "--num_processes N and --process_id I; pass the missing ones")
    if count < 1 or not 0 <= index < count:
        raise UserError(f"--process_id {index} is not in 0..{count - 1} (--num_processes {count}); "
                        f"give each process its own index below --num_processes")


def make_mesh(devices=None, expert=1, context=1):
    """The 1-D 'data' mesh, devices grouped by process in process order, so that each process's
    devices hold one contiguous block of the example axis (the rows local_rows gives it). expert > 1 (--sharding
    expert): the same devices in the same order as a 2-D ('data', 'expert') mesh, each run of `expert` consecutive
    devices one expert group; the example axis is split over both axes, in the same order. context > 1
    (--context_parallel_size): a last 'context' axis, each run of `context` consecutive devices (one host's, its
    fastest links) sharing the same rows, each holding 1 / context of every sequence's positions
    (flaxlm.models.context_parallel)."""
    devices = jax.devices() if devices is None else devices
    devices = sorted(devices, key=lambda d: d.process_index)  # stable: order within a process kept
    for size, flag in ((expert, "--expert_parallel_size"), (context, "--context_parallel_size"),
                       (expert * context, "--expert_parallel_size x --context_parallel_size")):
        if len(devices) % size:
            raise UserError(f"{flag} {size} does not divide the {len(devices)} devices; use a divisor of "
                            f"{len(devices)}")
    shape, names = [len(devices) // (expert * context)], ["data"]
    for size, name in ((expert, "expert"), (context, "context")):
        if size > 1:
            shape, names = shape + [size], names + [name]
    return Mesh(np.asarray(devices).reshape(shape), tuple(names))


def batch_axes(mesh):
    """The mesh axes the example axis is split over: all of them but 'context' ('data', or ('data', 'expert'))."""
    axes = tuple(name for name in mesh.axis_names if name != "context")
    return axes[0] if len(axes) == 1 else axes


def batch_shards(mesh):
    """How many ways a batch's rows are split: the devices, over the 'context' axis's size (its devices share rows)."""
    return mesh.size // (mesh.shape["context"] if "context" in mesh.axis_names else 1)


def on_mesh(jitted, mesh):
    """`jitted` traced and run (and lowered by .lower) with `mesh` as JAX's context mesh (jax.set_mesh), which a
    kernel that XLA does not partition finds to run per device under shard_map (flaxlm.models.splash)."""
    def call(*args, **kwargs):
        with jax.set_mesh(mesh):
            return jitted(*args, **kwargs)

    def lower(*args, **kwargs):
        with jax.set_mesh(mesh):
            return jitted.lower(*args, **kwargs)
    call.lower = lower
    return call


def replicated(mesh):
    return NamedSharding(mesh, P())


def batch_sharding(mesh, leading_axes=0):
    """Split the example axis (after `leading_axes` unsplit axes, e.g. gradient accumulation)."""
    return NamedSharding(mesh, P(*([None] * leading_axes), batch_axes(mesh)))


def global_batch_size(per_device, global_size, mesh, what):
    """The global batch from --per_device_* or the global flag, checked to divide over the devices."""
    n = batch_shards(mesh)  # with context parallelism a row is one group's, not one device's
    if global_size is None:
        return per_device * n
    if global_size <= 0 or global_size % n:
        where = f"the {n} devices" if n == mesh.size else f"the {n} groups of --context_parallel_size devices"
        raise UserError(f"{what} {global_size} does not divide over {where}; "
                        f"use a multiple of {n} (or the per-device flag)")
    return global_size


def local_rows(global_rows):
    """This process's rows of a global batch of `global_rows` examples (contiguous, in order): the
    block that its devices hold in a make_mesh mesh. It reads only these rows."""
    count, index = jax.process_count(), jax.process_index()
    per = global_rows // count
    return slice(index * per, (index + 1) * per)


def to_device_batch(local_batch, sharding):
    """Numpy arrays holding this process's rows -> global jax.Arrays split over the mesh."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def is_main_process():
    return jax.process_index() == 0
