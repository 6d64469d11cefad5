"""Model FLOPs per train step (analytic) and the device peak they are measured against, for MFU.

Counts matmul FLOPs (2 per multiply-add); a train step is 3x the forward (forward + 2x backward).
"""
import time

import jax
import jax.numpy as jnp

# Dense peak FLOP/s per device (one JAX device) in bf16, from the vendors' data sheets.
PEAK_BF16 = {
    "TPU v2": 22.5e12, "TPU v3": 61.5e12, "TPU v4": 137.5e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
    "TPU v5": 229.5e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "NVIDIA H100": 989e12, "NVIDIA H200": 989e12, "NVIDIA A100": 312e12, "NVIDIA L4": 121e12,
    "NVIDIA A10G": 125e12, "NVIDIA V100": 125e12,
}


def encoder_mlm_train_flops(config, batch, seq_len, num_predictions):
    """FLOPs of one train step of a masked-LM encoder. BERT/RoBERTa/ELECTRA/DeBERTa: the last layer and the MLM
    head run only at the masked slots (the last layer's keys and values still cover every position); ELECTRA's
    generator: embeddings and head embedding_size wide, projected to and from hidden_size. ModernBERT: every layer
    in full, then the head at the masked slots."""
    d, n, p = config.hidden_size, config.num_hidden_layers, num_predictions
    e = getattr(config, "embedding_size", None) or d
    head = p * (2 * d * e + 2 * e * config.vocab_size)
    project = seq_len * 2 * e * d if e != d else 0
    if config.model_type == "modernbert" or not n:
        encoder = n * encoder_layer_flops(config, seq_len, seq_len)
    else:
        encoder = (n - 1) * encoder_layer_flops(config, seq_len, seq_len) + encoder_layer_flops(config, seq_len, p)
    return 3 * batch * (project + encoder + head)


def encoder_layer_flops(config, keys, queries):
    """Forward FLOPs of one encoder layer computing `queries` rows over `keys` positions: the key and value
    projections of every position; the query and output projections, the MLP (two matrices; ModernBERT's GeGLU
    three), the scores and the weighted sum of each query row (over all keys, as computed: ModernBERT's local
    layers mask the keys outside their window); DeBERTa's c2p scores of each query and p2c scores of each key
    against the 2 * span relative positions (projecting the position table, once a step and not a row, is left
    out)."""
    d, f = config.hidden_size, config.intermediate_size
    mlp = 3 if config.model_type == "modernbert" else 2
    flops = keys * 4 * d * d + queries * (4 * d * d + 2 * mlp * d * f + 4 * keys * d)
    if config.model_type == "deberta-v2" and config.relative_attention:
        from flaxlm.models.deberta_v2 import position_types, relative_span
        types, positions = position_types(config), 2 * relative_span(config)[2]
        flops += 2 * positions * d * (queries * ("c2p" in types) + keys * ("p2c" in types))
    return flops


def electra_train_flops(generator, discriminator, seq_len, num_predictions):
    """FLOPs of one replaced-token-detection train step per row (ELECTRA, DeBERTa-v3): the generator's masked-LM
    step (encoder_mlm_train_flops) and the discriminator's over every token: embeddings projected when
    embedding_size != hidden_size, every layer in full, its head (dense hidden -> hidden, then one logit)."""
    d = discriminator.hidden_size
    e = getattr(discriminator, "embedding_size", None) or d
    project = seq_len * 2 * e * d if e != d else 0
    head = seq_len * (2 * d * d + 2 * d)
    encoder = discriminator.num_hidden_layers * encoder_layer_flops(discriminator, seq_len, seq_len)
    return encoder_mlm_train_flops(generator, 1, seq_len, num_predictions) + 3 * (project + encoder + head)


def encoder_decoder_train_flops(config, batch, inputs_length, targets_length):
    """FLOPs of one train step of a T5 encoder-decoder (T5Config): encoder self-attention over the inputs,
    decoder causal self-attention (counted in full, as computed) and cross-attention whose keys and values
    cover the encoder length, FFNs of 2 or (gated) 3 matrices, and the LM head over the vocabulary at every
    target position."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    inner = config.num_heads * config.d_kv  # q/k/v/o width; need not be d_model
    L, T = inputs_length, targets_length
    ffn = (3 if config.is_gated_act else 2) * 2 * d * f  # per token
    encoder_layer = L * (4 * 2 * d * inner + ffn + 2 * 2 * L * inner)  # q,k,v,o; ffn; scores + weighted sum
    decoder_layer = (T * (4 * 2 * d * inner + 2 * 2 * T * inner)  # self-attention
                     + T * 2 * 2 * d * inner + L * 2 * 2 * d * inner + T * 2 * 2 * L * inner  # cross: q,o; k,v; attn
                     + T * ffn)
    head = T * 2 * d * v
    forward = config.num_layers * encoder_layer + config.num_decoder_layers * decoder_layer + head
    return 3 * batch * forward


def decoder_lm_train_flops(config, params, batch, seq_len):
    """FLOPs of one train step of a decoder-only LM: every kernel of `params` (the nested parameter dict)
    once per token (an MoE layer's experts: the num_experts_per_tok a token runs), the LM head (a tied one is the
    token embedding table) and causal attention counted in full, as computed (scores + weighted sum over seq_len
    keys). The model's FLOPs: vocabulary rows padded in memory (--pad_vocab_multiple) are not counted."""
    import numpy as np
    kernels, head = 0, 0
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        name, top = (str(getattr(p, "key", p)) for p in (path[-1], path[0]))
        if name == "kernel":  # an untied head's: its vocab_size columns
            kernels += x.shape[0] * min(x.shape[1], config.vocab_size) if top == "lm_head" else int(np.prod(x.shape))
        elif name in ("gate_up_proj", "down_proj") and x.ndim == 3:  # an MoE's experts [E, ...]: a token runs k of E
            kernels += int(np.prod(x.shape)) * config.num_experts_per_tok // x.shape[0]
        elif name == "embedding" and (x.shape[0] == config.vocab_size or top == "embed") and not any(
                "lm_head" in str(getattr(p, "key", p)) for p in path):
            head = max(head, min(x.shape[0], config.vocab_size) * x.shape[1])  # the token embeddings
    if not getattr(config, "tie_word_embeddings", True):
        head = 0  # the untied head is a kernel, counted above
    heads = config.num_attention_heads
    inner = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    attention = config.num_hidden_layers * 2 * 2 * seq_len * inner
    return 3 * batch * seq_len * (2 * (kernels + head) + attention)


def device_peak_flops(dtype="float32", override=None):
    """(peak FLOP/s of one device, where the figure comes from)."""
    if override:
        return float(override), "--peak_flops"
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", "")
    if dev.platform != "cpu":
        for name, peak in sorted(PEAK_BF16.items(), key=lambda kv: -len(kv[0])):
            if kind.startswith(name):
                scale = 1.0 if dtype in ("bfloat16", "float16") else 0.5
                src = f"{kind} data sheet, bf16 dense" + ("" if scale == 1 else " x0.5 for fp32/tf32")
                return peak * scale, src
        return None, f"unknown device {kind!r}: pass --peak_flops"
    return measure_cpu_peak(dtype), f"measured {dtype} matmul on this CPU"


def mesh_peak_flops(mesh, dtype="float32", override=None):
    """(peak FLOP/s of all the mesh's devices or None when unknown, where the figure comes from). On CPU the
    measured figure is the whole backend's already."""
    peak, source = device_peak_flops(dtype, override)
    if peak is None:
        return None, source
    return peak * (1 if jax.devices()[0].platform == "cpu" else mesh.size), source


_CPU_PEAK = {}


def measure_cpu_peak(dtype="float32", n=1024, min_seconds=1.0, max_reps=200):
    """Best observed matmul FLOP/s of the whole CPU backend (one device per host by default): the fastest
    of many n x n matmuls over at least min_seconds, so a moment of contention does not lower it."""
    if dtype not in _CPU_PEAK:
        a = jnp.ones((n, n), dtype)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        best, start = float("inf"), time.perf_counter()
        for _ in range(max_reps):
            t = time.perf_counter()
            f(a).block_until_ready()
            best = min(best, time.perf_counter() - t)
            if t - start > min_seconds:
                break
        _CPU_PEAK[dtype] = 2 * n ** 3 / best
    return _CPU_PEAK[dtype]
