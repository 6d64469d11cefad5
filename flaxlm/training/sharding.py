"""Where the train state lives on the mesh: --sharding data (every device holds all of it), fsdp or expert.

fsdp (fully sharded data parallel) splits each large array of the params and optimizer state over the
'data' axis along its largest dimension that the device count divides, so each device holds about
1/N of the state. The batch stays split over the same axis; inside the jitted step XLA gathers each
weight when it is used and reduce-scatters its gradient. Small arrays (biases, norms, counters) and
arrays with no divisible dimension stay replicated: sharding them saves nothing worth the traffic.

expert (a mixture of experts, on make_mesh's ('data', 'expert') mesh): each expert tensor [E, ...] (the fused
gate_up_proj and down_proj, their LoRA adapters and optimizer state) is split along E over the 'expert' axis, so
each device of an expert group holds E / expert_parallel_size whole experts (flaxlm.models.moe runs them there),
and along its largest other dimension over 'data' as fsdp; every other array is fsdp over all the devices.
"""
import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from flaxlm.errors import UserError

MODES = ("data", "fsdp", "expert")
# flaxlm.models.moe.SparseMoE's [E, ...] parameters, and their LoRA adapters' (flaxlm.models.expert_lora)
EXPERT_TENSORS = ("gate_up_proj", "down_proj", "lora_a", "lora_b")
MIN_SHARDED_ELEMENTS = 2**12  # arrays smaller than this stay replicated under fsdp


def state_shardings(state, mesh, mode="data"):
    """A pytree like `state` (arrays or jax.ShapeDtypeStruct leaves) of NamedSharding for `mode`."""
    if mode not in MODES:
        raise UserError(f"--sharding {mode} is unknown; use one of {', '.join(MODES)}")
    if mode == "data":
        return jax.tree.map(lambda _: NamedSharding(mesh, P()), state)
    everywhere = mesh.axis_names[0] if len(mesh.axis_names) == 1 else tuple(mesh.axis_names)
    if mode == "fsdp" or "expert" not in mesh.axis_names:
        return jax.tree.map(lambda leaf: NamedSharding(mesh, fsdp_spec(leaf.shape, mesh.size, everywhere)), state)

    def spec(path, leaf):
        if _last_key(path) in EXPERT_TENSORS and len(leaf.shape) == 3:
            return expert_spec(leaf.shape, mesh)
        return fsdp_spec(leaf.shape, mesh.size, everywhere)
    return jax.tree_util.tree_map_with_path(lambda path, leaf: NamedSharding(mesh, spec(path, leaf)), state)


def _last_key(path):
    key = path[-1] if path else None
    return str(getattr(key, "key", getattr(key, "name", key)))


def expert_spec(shape, mesh):
    """PartitionSpec of an expert tensor [E, ...]: E over 'expert', the largest other dimension over 'data'."""
    groups, data = mesh.shape["expert"], mesh.shape["data"]
    if shape[0] % groups:
        raise UserError(f"the {shape[0]} experts do not divide over --expert_parallel_size {groups}; use a divisor "
                        f"of {shape[0]}")
    return P("expert", *fsdp_spec(shape[1:], data))


def fsdp_spec(shape, num_devices, axis="data"):
    """PartitionSpec splitting the largest dimension of `shape` that num_devices divides (ties: the
    first), or replicated when the array is small or no dimension divides."""
    size = 1
    for d in shape:
        size *= d
    if size < MIN_SHARDED_ELEMENTS or num_devices == 1:
        return P()
    divisible = [i for i, d in enumerate(shape) if d % num_devices == 0]
    if not divisible:
        return P()
    dim = max(divisible, key=lambda i: (shape[i], -i))
    return P(*([None] * dim), axis)


def gather_to_host_readable(params):
    """The params with every array readable on every process: arrays already whole on this process
    are kept, arrays split over other processes' devices are gathered into numpy (for the export)."""
    def whole(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
            return x
        return multihost_utils.process_allgather(x, tiled=True)
    return jax.tree.map(whole, params)


def per_device_bytes(tree):
    """(bytes one device holds, bytes of the whole arrays) of a pytree of jax.Arrays."""
    leaves = jax.tree.leaves(tree)
    held = sum(x.addressable_shards[0].data.nbytes for x in leaves)
    return held, sum(x.nbytes for x in leaves)
