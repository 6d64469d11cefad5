"""The platform a program is built for: JAX's default backend, or the TPU that --compile_for compiles for.

The models, losses and train step choose a few things by platform while they are traced (a CPU-only form of the
weight gradient, the LM head's chunk size, CPU chunks of a batch, which attention kernels exist). Compiling for a
TPU slice from a CPU host traces them on the CPU, so they ask platform() rather than jax.default_backend():

    with building_for("tpu"):
        compiled = step.lower(state_shapes, batch_shapes, key).compile()
"""
import contextlib
import contextvars

import jax

_TARGET = contextvars.ContextVar("flaxlm_target_platform", default=None)


def platform():
    """'cpu', 'gpu' or 'tpu': the target of building_for while inside it, else JAX's default backend."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def building_for(name):
    """Trace (and lower) programs for platform `name` inside this block."""
    token = _TARGET.set(name)
    try:
        yield
    finally:
        _TARGET.reset(token)
