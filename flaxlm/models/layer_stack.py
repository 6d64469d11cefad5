"""How a model runs its stack of identical layers: a Python loop or one jax.lax.scan, each layer optionally
rematerialized (jax.checkpoint), and which kernel computes attention.

    model = create_model(config, execution=Execution(scan=True, remat="dots_saveable"))
    x_BLD = run_layers(layers, x_BLD, lambda i, layer, x, extra: layer(x, mask, fold_key(key, i + 1)), execution)

Execution is a static attribute of the model (part of its graphdef), never saved: the parameters keep their
per-layer layout (layers/0/..., layers/1/...) whatever it says, so checkpoints and Hugging Face exports are
the same with or without it (but for vocab_multiple's padded vocabulary rows, which the checkpoints of a run
hold and its exports do not). Under scan the layers' parameters are stacked at call time (one copy of the
stack's weights per step; the gradient flows back to each layer's own parameters) and XLA compiles one layer
instead of N: same results, much less compile time for deep models.
"""
import contextlib
import contextvars
import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from flaxlm.config.options import ATTENTION_IMPLEMENTATIONS, REMAT_POLICIES  # the flags' choices, named once
from flaxlm.errors import UserError
from flaxlm.platform import NO_SPLASH_KINDS, device_kind, platform


@dataclasses.dataclass(frozen=True)
class Execution:
    """scan: the layers under jax.lax.scan; remat: what each layer keeps for the backward pass (REMAT_POLICIES:
    none keeps everything, full nothing, dots_saveable the matmul outputs, dots_with_no_batch_dims_saveable the
    outputs of matmuls against weights); attention: jax.nn.dot_product_attention's implementation (auto: JAX
    chooses); vocab_multiple: a causal LM's vocabulary tables padded in memory to a multiple of it
    (flaxlm.models.vocab_padding; 1: not padded), the one field that changes parameter shapes (never the export's).
    """
    scan: bool = False
    remat: str = "none"
    attention: str = "auto"
    vocab_multiple: int = 1

    def __post_init__(self):
        if self.vocab_multiple < 1:
            raise UserError(f"--pad_vocab_multiple {self.vocab_multiple} must be at least 1 (1: no padding)")
        if self.remat not in REMAT_POLICIES:
            raise UserError(f"unknown remat policy {self.remat!r}; use one of {', '.join(REMAT_POLICIES)}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise UserError(f"unknown attention implementation {self.attention!r}; use one of "
                            f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")

    @property
    def attention_implementation(self):
        """attention()'s `implementation`: None (JAX chooses; splash on a TPU where it applies), "xla", "cudnn" or
        "splash"."""
        return None if self.attention == "auto" else self.attention

    def check(self, dtype):
        """UserError when this machine or the compute dtype cannot run the chosen attention kernel."""
        if self.attention == "splash" and platform() == "gpu":
            raise UserError("--attention_implementation splash is the TPU's kernel; on a GPU use cudnn or auto")
        if self.attention == "splash" and platform() == "tpu":
            check_splash_compiles(device_kind())
        if self.attention != "cudnn":
            return
        if platform() != "gpu":
            raise UserError("--attention_implementation cudnn needs an NVIDIA GPU; use auto or xla")
        if jnp.dtype(dtype) == jnp.float32:
            raise UserError("--attention_implementation cudnn needs --dtype bfloat16 or float16; use auto or xla "
                            "for float32")


def check_splash_compiles(kind, where="this TPU"):
    """UserError when --attention_implementation splash meets a TPU whose compiler cannot build the kernel."""
    if kind in NO_SPLASH_KINDS:
        raise UserError(f"--attention_implementation splash needs a TPU v4 or newer: Mosaic cannot compile the splash "
                        f"kernel for {kind} ({where}); use auto (XLA attention there) or xla")


def checkpoint_policy(name):
    """The jax.checkpoint policy of a REMAT_POLICIES name ("full": save nothing, recompute everything)."""
    return jax.checkpoint_policies.nothing_saveable if name == "full" else getattr(jax.checkpoint_policies, name)


class Carried:
    """Values the layers add to as they run (value: a pytree of arrays, e.g. an MoE's router statistics), opened
    with carrying() around a forward pass. A layer reads and replaces carried().value; run_layers threads value
    through its scan carry and its jax.checkpoint boundaries, so what a layer computes under --scan_layers or a
    remat policy leaves it as a value of the outer trace (a Python list would hold leaked inner tracers)."""

    def __init__(self, value):
        self.value = value


_CARRIED = contextvars.ContextVar("carried", default=None)


def carried():
    """The Carried of the innermost carrying() block, or None outside one."""
    return _CARRIED.get()


@contextlib.contextmanager
def carrying(box):
    """box (a Carried) is carried() inside the block; read box.value after it."""
    token = _CARRIED.set(box)
    try:
        yield box
    finally:
        _CARRIED.reset(token)


def run_layers(layers, x, call, execution=None, per_layer=None):
    """x through `layers` in order: x = call(i, layer, x, per_layer[i]) for i = 0, 1, ... (per_layer: one pytree
    of arrays per layer, e.g. T5's cross-attention keys and values, or None).

    Under execution.scan, i is a traced int32 (fold it into a dropout key; do not branch on it), and the
    layers' parameters and per_layer inputs are stacked along a new leading axis: the layers must repeat (same
    graphdef as the layer a period before: identical layers, or Gemma 2's local/global pairs), each step of the
    scan runs one period of them, and layers past the last whole period run after it. With a remat policy each
    layer's call goes through jax.checkpoint. Inside a carrying() block, carried().value travels with x."""
    execution = execution or Execution()
    box = carried()
    if box is None or (not execution.scan and execution.remat == "none"):
        return _run_layers(layers, x, call, execution, per_layer)

    def call_carrying(i, layer, x_and_value, extra):
        x, box.value = x_and_value  # the carried values as this (possibly inner) trace sees them
        x = call(i, layer, x, extra)
        return x, box.value
    x, box.value = _run_layers(layers, (x, box.value), call_carrying, execution, per_layer)
    return x


def _run_layers(layers, x, call, execution, per_layer):
    per_layer = [None] * len(layers) if per_layer is None else list(per_layer)
    if not layers or (not execution.scan and execution.remat == "none"):
        for i, (layer, extra) in enumerate(zip(layers, per_layer)):
            x = call(i, layer, x, extra)
        return x
    graphdefs, states = zip(*(nnx.split(layer) for layer in layers))

    def layer_fn(graphdef, i):
        """(x, state, extra) -> x: layer i rebuilt from its state (params), rematerialized if asked."""
        def apply(x, state, extra):
            return call(i, nnx.merge(graphdef, state), x, extra)
        if execution.remat == "none":
            return apply
        return jax.checkpoint(apply, policy=checkpoint_policy(execution.remat), prevent_cse=not execution.scan)

    if not execution.scan:  # remat alone: i stays a Python int
        for i, (graphdef, state, extra) in enumerate(zip(graphdefs, states, per_layer)):
            x = layer_fn(graphdef, i)(x, state, extra)
        return x
    period = repeating_period(graphdefs)
    if period == len(layers) > 1:
        raise UserError("--scan_layers needs layers that repeat, but this model's layers all differ in a static "
                        "setting (e.g. GPT-2's scale_attn_by_inverse_layer_idx); drop --scan_layers")
    groups = len(layers) // period  # scanned: groups of `period` layers; the rest after them in a loop

    def body(x, xs):
        g, states, extras = xs
        for j in range(period):
            x = layer_fn(graphdefs[j], g * period + j)(x, states[j], extras[j])
        return x, None
    stack = lambda *arrays: jnp.stack(arrays)  # noqa: E731  (leaf by leaf, across the groups)
    in_groups = lambda items, j: [items[g * period + j] for g in range(groups)]  # noqa: E731
    with _layer_scan():
        x, _ = jax.lax.scan(body, x, (jnp.arange(groups, dtype=jnp.int32),
                                      [jax.tree.map(stack, *in_groups(states, j)) for j in range(period)],
                                      [jax.tree.map(stack, *in_groups(per_layer, j)) for j in range(period)]))
    for i in range(groups * period, len(layers)):
        x = layer_fn(graphdefs[i], i)(x, states[i], per_layer[i])
    return x


_IN_LAYER_SCAN = contextvars.ContextVar("in_layer_scan", default=False)


def in_layer_scan():
    """Whether the layers being traced run under run_layers' jax.lax.scan: one kernel per layer group, run once
    per group, forward in order and backward in reverse (cudnn_dropout.where_not)."""
    return _IN_LAYER_SCAN.get()


@contextlib.contextmanager
def _layer_scan():
    token = _IN_LAYER_SCAN.set(True)
    try:
        yield
    finally:
        _IN_LAYER_SCAN.reset(token)


def repeating_period(graphdefs):
    """The smallest p such that layer i is built like layer i % p (Gemma 2's local/global pairs: 2; Gemma 3's five
    local layers and a global one: 6); the layers past the last whole group must repeat the pattern's start too."""
    n = len(graphdefs)
    return next(p for p in range(1, n + 1) if all(graphdefs[i] == graphdefs[i % p] for i in range(n)))
