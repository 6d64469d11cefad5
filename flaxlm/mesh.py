"""The device mesh: one 'data' axis over every device of every process (JAX's own distribution).

Parameters and optimizer state are replicated; batches are split along their example axis. Each
process builds only its own rows of a global batch and JAX assembles the global array.
"""
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from flaxlm.errors import UserError


def maybe_initialize_distributed():
    """Join a multi-host run when the environment says there is one (TPU pod, SLURM, coordinator)."""
    multi = (os.environ.get("JAX_COORDINATOR_ADDRESS")
             or int(os.environ.get("SLURM_NTASKS", "1")) > 1
             or len(os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",")) > 1)
    if multi and not jax.distributed.is_initialized():
        jax.distributed.initialize()


def make_mesh(devices=None):
    devices = jax.devices() if devices is None else devices
    return Mesh(np.asarray(devices), ("data",))


def replicated(mesh):
    return NamedSharding(mesh, P())


def batch_sharding(mesh, leading_axes=0):
    """Split the example axis (after `leading_axes` unsplit axes, e.g. gradient accumulation)."""
    return NamedSharding(mesh, P(*([None] * leading_axes), "data"))


def global_batch_size(per_device, global_size, mesh, what):
    """The global batch from --per_device_* or the global flag, checked to divide over the devices."""
    n = mesh.size
    if global_size is None:
        return per_device * n
    if global_size <= 0 or global_size % n:
        raise UserError(f"{what} {global_size} does not divide over the {n} devices; "
                        f"use a multiple of {n} (or the per-device flag)")
    return global_size


def local_rows(global_rows):
    """This process's rows of a global batch of `global_rows` examples (contiguous, in order)."""
    count, index = jax.process_count(), jax.process_index()
    per = global_rows // count
    return slice(index * per, (index + 1) * per)


def to_device_batch(local_batch, sharding):
    """Numpy arrays holding this process's rows -> global jax.Arrays split over the mesh."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def is_main_process():
    return jax.process_index() == 0
