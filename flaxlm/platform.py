"""The platform a program is built for: JAX's default backend, or the TPU that --compile_for compiles for.

The models, losses and train step choose a few things by platform while they are traced (a CPU-only form of the
weight gradient, the LM head's chunk size, CPU chunks of a batch, which attention kernels exist). Compiling for a
TPU slice from a CPU host traces them on the CPU, so they ask platform() rather than jax.default_backend():

    with building_for("tpu", "TPU v5 lite"):
        compiled = step.lower(state_shapes, batch_shapes, key).compile()
"""
import contextlib
import contextvars

import jax

_TARGET = contextvars.ContextVar("flaxlm_target", default=None)  # (platform, device kind) while building_for
NO_SPLASH_KINDS = ("TPU v2", "TPU v3")  # Mosaic cannot compile the splash kernel's matmuls for these


def platform():
    """'cpu', 'gpu' or 'tpu': the target of building_for while inside it, else JAX's default backend."""
    target = _TARGET.get()
    return target[0] if target else jax.default_backend()


def device_kind():
    """The device kind programs are built for ("TPU v5 lite"): building_for's, else this machine's first device's."""
    target = _TARGET.get()
    return target[1] if target and target[1] else jax.devices()[0].device_kind


def splash_compiles():
    """Whether programs are built for a TPU that compiles the Pallas splash kernel (v4 and newer)."""
    return platform() == "tpu" and device_kind() not in NO_SPLASH_KINDS


@contextlib.contextmanager
def building_for(name, kind=None):
    """Trace (and lower) programs for platform `name` (and device kind `kind`, "TPU v3") inside this block."""
    token = _TARGET.set((name, kind))
    try:
        yield
    finally:
        _TARGET.reset(token)
