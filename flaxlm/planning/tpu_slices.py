"""TPU slices by the names people rent them under (v4-8, v5e-8 / v5litepod-8, v6e-16, ...), as compile-only devices.

    target = tpu_slice("v5e-8")         # its devices come from libtpu's compiler; no TPU needed
    mesh = meshlib.make_mesh(target.devices)

libtpu (pip install -r requirements-tpu.txt) compiles for a topology on any host through
jax.experimental.topologies, as MaxText's train_compile.py does. A slice of several hosts compiles as the one program
all its hosts run. A name's number counts TensorCores for v2, v3, v4 and v5p (two per chip; v4 and v5p run both
cores of a chip as one JAX device, "megacore") and chips for v5e and v6e. hbm_gib is what the TPU compiler says one
device may hold ("exceeds available HBM (15.75G)" on v5e), checked in tests/test_compile_for.py.
"""
import dataclasses
import importlib.util

from flaxlm.errors import UserError

INSTALL = "pip install -r requirements-tpu.txt (jax[tpu] at this project's jax version)"


@dataclasses.dataclass(frozen=True)
class Generation:
    """One TPU generation: its topology prefix, the device kind JAX reports, the HBM one device may use (GiB, the
    compiler's figure), whether a device is a whole chip of two cores (megacore), chips per host of a slice of
    several hosts, and its slices as {TensorCores or chips: chip grid}."""
    prefix: str
    kind: str
    hbm_gib: float
    megacore: bool
    host_chips: tuple
    grids: dict


GENERATIONS = {
    "v2": Generation("v2", "TPU v2", 7.48, False, (2, 2, 1), {8: "2x2", 32: "4x4"}),
    "v3": Generation("v3", "TPU v3", 15.48, False, (2, 2, 1), {8: "2x2", 32: "4x4", 64: "4x8", 128: "8x8"}),
    "v4": Generation("v4", "TPU v4", 30.75, True, (2, 2, 1),
                     {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8"}),
    "v5p": Generation("v5", "TPU v5", 95.74, True, (2, 2, 1),
                      {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8"}),
    "v5e": Generation("v5e", "TPU v5 lite", 15.75, False, (2, 2, 1),
                      {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}),
    "v6e": Generation("v6e", "TPU v6 lite", 31.25, False, (2, 2, 1),
                      {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}),
}
ALIASES = {"v5litepod": "v5e"}  # Google Cloud's accelerator type for v5e


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice to compile for: its name, topology ("v5e:2x4"), hosts, HBM per device and compile-only devices."""
    name: str
    topology: str
    generation: Generation
    hosts: int
    devices: list

    @property
    def num_devices(self):
        """JAX devices: chips (v4, v5p: both cores of a chip as one), TensorCores on v2 and v3."""
        return len(self.devices)

    @property
    def hbm_bytes(self):
        return int(self.generation.hbm_gib * 2 ** 30)


def known_names():
    """'v2-8, v2-32, v3-8, ...' for an error message."""
    return ", ".join(f"{g}-{n}" for g, gen in GENERATIONS.items() for n in gen.grids) + " (v5litepod-N = v5e-N)"


def parse_name(name):
    """(Generation, size, topology name) of a slice name such as v5e-8; UserError naming the known ones."""
    gen_name, _, size = str(name).lower().partition("-")
    gen = GENERATIONS.get(ALIASES.get(gen_name, gen_name))
    if gen is None or not size.isdigit() or int(size) not in gen.grids:
        raise UserError(f"--compile_for {name} is not a TPU slice known here; use one of {known_names()}")
    return gen, int(size), f"{gen.prefix}:{gen.grids[int(size)]}"


def host_bounds(gen, grid):
    """Chips per host: the whole grid when it fits one host (8 chips of v5e-8 / v6e-8, 4 of v4-8), else the
    generation's block of 4."""
    dims = [int(d) for d in grid.split("x")] + [1] * (3 - grid.count("x") - 1)
    chips = dims[0] * dims[1] * dims[2]
    one_host = chips <= 4 or (chips == 8 and not gen.megacore and gen.prefix in ("v5e", "v6e"))
    return tuple(dims) if one_host else gen.host_chips


def tpu_slice(name):
    """The Slice called `name`, its devices from libtpu's compiler. UserError for an unknown name or without libtpu."""
    gen, _, topology = parse_name(name)
    if importlib.util.find_spec("libtpu") is None:
        raise UserError(f"--compile_for needs libtpu, the TPU compiler, which is not installed; {INSTALL}")
    from jax.experimental import topologies
    kwargs = {"chips_per_host_bounds": host_bounds(gen, topology.split(":")[1])}
    if gen.megacore:
        kwargs["chip_config_name"] = "megacore"
    devices = topologies.get_topology_desc(topology_name=topology, platform="tpu", **kwargs).devices
    return Slice(name=name, topology=topology, generation=gen, hosts=len({d.process_index for d in devices}),
                 devices=list(devices))
