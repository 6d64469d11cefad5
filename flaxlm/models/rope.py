"""Rotary position embeddings (RoPE) as transformers computes them, for every rope_type it knows.

A config's RoPE settings (transformers 5's config.rope_parameters, or an old config.json's rope_theta and
rope_scaling) become a Rope: static numbers, hashable, so a model holds one per kind of layer as a plain attribute.
The types and what each does past the context the model was trained at (original_max_position_embeddings):

    default    wavelengths 2 pi theta^(2i / H)
    linear     every frequency divided by factor (positions interpolated)
    llama3     Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth ramp between
    yarn       YaRN: the same idea with the ramp in rotations (beta_fast, beta_slow), cos and sin scaled by
               attention_factor (0.1 ln(factor) + 1 unless given; DeepSeek's mscale / mscale_all_dim)
    longrope   Phi-3: a factor per frequency, short_factor up to original_max_position_embeddings and long_factor
               past it (chosen per forward by its longest sequence), cos and sin scaled by attention_factor
    dynamic    NTK-aware: the base grows with the forward's longest sequence once it passes
               max_position_embeddings

dynamic and longrope depend on the forward's longest position, as transformers' (torch.max(position_ids) + 1). A
transformers model also remembers the longest sequence it saw (dynamic); ours computes each forward from its own
positions, which is what transformers does for a fresh model and along one generation (its sequences only grow).
Shape suffixes: B batch, T positions, R = H / 2 rotary frequencies, N heads, H head width.
"""
import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from flaxlm.errors import UserError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


def rope_parameters(config):
    """{"rope_type", "rope_theta", ...}: transformers 5 keeps them in config.rope_parameters (converting an old
    config.json's top-level rope_theta / rope_scaling); a transformers 4 config object has the old attributes."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    params.setdefault("rope_type", params.get("type", "default"))
    if params["rope_type"] in ("llama3", "yarn", "longrope"):  # transformers' standardize_rope_params
        params.setdefault("original_max_position_embeddings",
                          getattr(config, "original_max_position_embeddings", None) or config.max_position_embeddings)
    return params


@dataclass(frozen=True)
class Rope:
    """One kind of layer's RoPE. inv_freq: the R frequencies (float32 values) for sequences up to `original`
    positions; past it, longrope's long_inv_freq, or dynamic's base grown by ntk_factor; cos and sin scaled by
    attention_factor."""
    inv_freq: tuple
    attention_factor: float = 1.0
    original: int = 0  # the longest sequence the plain inv_freq serve (longrope and dynamic switch past it)
    long_inv_freq: tuple | None = None  # longrope
    ntk_factor: float | None = None  # dynamic
    theta: float = 10000.0  # dynamic: the base before it grows

    def frequencies_R(self, positions_BT):
        """The float32 frequencies [R] for a forward at these positions."""
        inv_freq_R = jnp.asarray(self.inv_freq, jnp.float32)
        if self.long_inv_freq is None and self.ntk_factor is None:
            return inv_freq_R
        length = jnp.max(positions_BT).astype(jnp.int32) + 1  # the forward's longest sequence, as transformers'
        if self.long_inv_freq is not None:
            return jnp.where(length > self.original, jnp.asarray(self.long_inv_freq, jnp.float32), inv_freq_R)
        # NTK-aware: base * (factor * L / original - (factor - 1)) ^ (dim / (dim - 2)), in float32 as torch's
        dim, factor = 2 * len(self.inv_freq), jnp.float32(self.ntk_factor)
        grown = factor * jnp.maximum(length, self.original).astype(jnp.float32) / self.original - (factor - 1)
        base = jnp.float32(self.theta) * grown ** jnp.float32(dim / (dim - 2))
        dynamic_R = 1.0 / base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
        return jnp.where(length > self.original, dynamic_R, inv_freq_R)

    def cos_sin(self, positions_BT):
        """(cos, sin) [B, T, R] float32 of angle position * frequency, scaled by attention_factor."""
        angle_BTR = positions_BT.astype(jnp.float32)[..., None] * self.frequencies_R(positions_BT)
        return jnp.cos(angle_BTR) * self.attention_factor, jnp.sin(angle_BTR) * self.attention_factor


def as_float32_tuple(x):
    return tuple(float(f) for f in np.asarray(x, np.float32))


def rope_of(config, head_dim):
    """The Rope of config's RoPE settings (rope_parameters(config)) for heads of head_dim, as transformers'
    ROPE_INIT_FUNCTIONS compute it: powers in float64, rounded to float32 (torch's float32 pow is within an ulp of
    that, numpy's float32 pow is not). A UserError for a type it does not know."""
    p = rope_parameters(config)
    kind = p["rope_type"]
    if kind not in ROPE_TYPES:
        raise UserError(f"unsupported rope_type {kind!r} in config.json's rope_parameters (rope_scaling); "
                        f"supported: {', '.join(ROPE_TYPES)}")
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise UserError("partial_rotary_factor is not supported here; remove it from config.json")
    theta = float(p["rope_theta"])
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)  # float32, as torch's
    inv_freq = 1.0 / theta ** exponent.astype(np.float64)
    as_f32 = as_float32_tuple
    if kind == "default":
        return Rope(as_f32(inv_freq))
    if kind == "linear":
        return Rope(as_f32(np.float32(inv_freq) / np.float32(p["factor"])))
    if kind == "dynamic":
        return Rope(as_f32(inv_freq), original=config.max_position_embeddings, ntk_factor=float(p["factor"]),
                    theta=theta)
    original = p["original_max_position_embeddings"]
    if kind == "llama3":
        return Rope(as_f32(llama3_frequencies(np.float32(inv_freq), p, original)))
    factor = p.get("factor") or config.max_position_embeddings / original
    if kind == "yarn":
        return Rope(as_f32(yarn_frequencies(inv_freq, p, factor, head_dim, theta, original)),
                    attention_factor=yarn_attention_factor(p, factor))
    # longrope: a factor per frequency; the short ones within the original context, the long ones past it
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    short, long = (np.asarray(p[k], np.float64) for k in ("short_factor", "long_factor"))
    if short.shape != inv_freq.shape or long.shape != inv_freq.shape:
        raise UserError(f"longrope's short_factor and long_factor need {len(inv_freq)} values each (head_dim / 2); "
                        f"fix config.json's rope_parameters")
    return Rope(as_f32(inv_freq / short), attention_factor=float(attention_factor), original=original,
                long_inv_freq=as_f32(inv_freq / long))


def llama3_frequencies(inv_freq, p, original):
    """Llama 3.1's: wavelengths over original / low_freq_factor divided by factor, under original /
    high_freq_factor kept, a smooth ramp between."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def yarn_frequencies(inv_freq, p, factor, dim, theta, original):
    """YaRN's: frequencies that turn fewer than beta_slow times over the original context divided by factor, more
    than beta_fast times kept, a linear ramp between (over frequency indices, the bounds truncated to integers
    unless truncate is false)."""
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def index_turning(rotations):  # the (fractional) frequency index that turns `rotations` times over original
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = index_turning(beta_fast), index_turning(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    kept = 1 - ramp  # 1: the frequency as it was (extrapolated); 0: divided by factor (interpolated)
    return inv_freq / factor * (1 - kept) + inv_freq * kept


def yarn_attention_factor(p, factor):
    """YaRN's scale of cos and sin: attention_factor if given, else 0.1 ln(factor) + 1 (DeepSeek: the ratio of
    that with mscale to that with mscale_all_dim)."""
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if p.get("mscale") and p.get("mscale_all_dim"):
        return float(mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"]))
    return float(mscale(factor))


def rotate(x_BTNH, cos_BTR, sin_BTR):
    """x rotated in (first half, second half) pairs (Hugging Face's rotate_half) by the angles whose cos and sin
    are given, in float32; returns x's dtype."""
    cos_BT1R, sin_BT1R = cos_BTR[:, :, None], sin_BTR[:, :, None]
    x1_BTNR, x2_BTNR = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1_BTNR * cos_BT1R - x2_BTNR * sin_BT1R, x2_BTNR * cos_BT1R + x1_BTNR * sin_BT1R],
                           axis=-1).astype(x_BTNH.dtype)


def rope(x_BTNH, positions_BT, rope_):
    """x rotated by its positions under Rope rope_ (rotate_half pairs); returns x's dtype."""
    return rotate(x_BTNH, *rope_.cos_sin(positions_BT))


def with_rope_scaling(config, scaling):
    """A copy of a RoPE model's config extended by `scaling` (a dict of rope_parameters, as --rope_scaling gives
    it: {"rope_type": "yarn", "factor": 4.0}): the new type replaces the old on every layer (on the full_attention
    layers of a model with a RoPE per layer type: Gemma 3's and ModernBERT's local layers keep theirs), rope_theta
    kept, original_max_position_embeddings the positions the model had unless given, max_position_embeddings
    original * factor. A UserError for what cannot be."""
    import copy
    params_of = getattr(config, "rope_parameters", None)
    if not params_of:
        raise UserError(f"--rope_scaling changes rotary position embeddings, and {config.model_type} has none (or a "
                        f"fixed one); extend a RoPE model (Llama, Mistral, Qwen, Gemma, ModernBERT)")
    if not isinstance(scaling, dict) or "rope_type" not in scaling:
        raise UserError('--rope_scaling takes a JSON object with a rope_type, e.g. \'{"rope_type": "yarn", '
                        '"factor": 4.0}\'')
    kind = scaling["rope_type"]
    if kind == "dynamic":
        raise UserError("--rope_scaling dynamic is an inference-time scaling (transformers grows the base with the "
                        "input) and is not trained with; use yarn, linear, llama3 or longrope to train at a longer "
                        "--block_size")
    if kind not in ROPE_TYPES:
        raise UserError(f"--rope_scaling rope_type {kind!r} is not one of {', '.join(ROPE_TYPES)}")
    factor = scaling.get("factor")
    if kind != "default" and (not isinstance(factor, (int, float)) or factor < 1):
        raise UserError(f"--rope_scaling {kind} needs a factor of at least 1 (how many times longer the context "
                        f"gets), e.g. \"factor\": 4.0")
    config = copy.deepcopy(config)
    nested = isinstance(params_of.get("full_attention"), dict)
    old = dict(params_of["full_attention"] if nested else params_of)
    original = int(scaling.get("original_max_position_embeddings") or config.max_position_embeddings)
    new = {"rope_theta": old.get("rope_theta"), **scaling}
    if kind in ("llama3", "yarn", "longrope"):
        new["original_max_position_embeddings"] = original
    new = {k: (float(v) if k == "factor" else v) for k, v in new.items() if v is not None}
    config.rope_parameters = {**params_of, "full_attention": new} if nested else new
    config.max_position_embeddings = int(round(original * (factor or 1)))
    return config
