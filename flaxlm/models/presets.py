"""Model shape presets, and building a Hugging Face config from one (create_config.py).

A preset is a plain dict: `model_type` picks the transformers config class (through
`AutoConfig.for_model`), every other key is a field of that class. The full-size presets copy the
Hugging Face hub configs exactly; the tiny/small ones are for tests and the CPU demo. A new model
family is one more entry here with its own model_type (t5, gpt2, opt, llama, ...).
"""
import difflib
import re

import yaml

from flaxlm.errors import UserError

_ROBERTA = dict(model_type="roberta", vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2, hidden_act="gelu",
                hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)
_BERT = dict(model_type="bert", vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
             layer_norm_eps=1e-12, pad_token_id=0, hidden_act="gelu",
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)


# T5 (google/t5-v1_1-* and google-t5/t5-* on the hub): v1.1 has a gated-GELU FFN and an untied LM head,
# the original a ReLU FFN and the LM head tied to the embeddings. transformers 5 reads tie_word_embeddings
# false into scale_decoder_outputs=False (flaxlm.models.t5.ties_embeddings).
_T5 = dict(model_type="t5", vocab_size=32128, d_kv=64, relative_attention_num_buckets=32,
           relative_attention_max_distance=128, dropout_rate=0.1, layer_norm_epsilon=1e-6, initializer_factor=1.0,
           decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
_T5_V1_1 = {**_T5, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
_T5_ORIGINAL = {**_T5, "feed_forward_proj": "relu", "tie_word_embeddings": True}


def _t5_shape(d_model, d_ff, layers, heads):
    return dict(d_model=d_model, d_ff=d_ff, num_layers=layers, num_decoder_layers=layers, num_heads=heads)


# Decoder-only (causal LM) families. GPT-2 (openai-community/gpt2*): learned positions, tied head.
# OPT (facebook/opt-*): opt-350m is post-LayerNorm with a 512-wide embedding projected to 1024.
# Llama-style: RoPE, RMSNorm, SwiGLU, grouped-query attention; llama-100m is our own ~100M shape.
_GPT2 = dict(model_type="gpt2", vocab_size=50257, n_positions=1024, activation_function="gelu_new",
             resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5, initializer_range=0.02,
             bos_token_id=50256, eos_token_id=50256)
_OPT = dict(model_type="opt", vocab_size=50272, max_position_embeddings=2048, do_layer_norm_before=True,
            activation_function="relu", dropout=0.1, attention_dropout=0.0, init_std=0.02, enable_bias=True,
            layer_norm_elementwise_affine=True, pad_token_id=1, bos_token_id=2, eos_token_id=2)
_LLAMA = dict(model_type="llama", vocab_size=32000, max_position_embeddings=2048, hidden_act="silu",
              rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=0.02, attention_bias=False,
              tie_word_embeddings=False, pad_token_id=None, bos_token_id=1, eos_token_id=2)


def _gpt2_shape(width, layers, heads):
    return dict(n_embd=width, n_layer=layers, n_head=heads)


def _opt_shape(width, layers, heads, ffn, proj=None, pre_ln=True):
    return dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn,
                word_embed_proj_dim=proj or width, do_layer_norm_before=pre_ln)


def _llama_shape(width, layers, heads, kv_heads, intermediate):
    return dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=intermediate)


def _shape(hidden, layers, heads, intermediate):
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=intermediate)


PRESETS = {
    "roberta-base": {**_ROBERTA, **_shape(768, 12, 12, 3072)},
    "roberta-large": {**_ROBERTA, **_shape(1024, 24, 16, 4096)},
    "bert-base-uncased": {**_BERT, **_shape(768, 12, 12, 3072)},
    "bert-large-uncased": {**_BERT, **_shape(1024, 24, 16, 4096)},
    # small shapes for tests and the CPU demo (RoBERTa positions start at pad_token_id + 1: 2 extra)
    "roberta-small": {**_ROBERTA, **_shape(128, 4, 4, 512), "vocab_size": 8192, "max_position_embeddings": 258},
    "roberta-tiny": {**_ROBERTA, **_shape(64, 2, 2, 256), "vocab_size": 1024, "max_position_embeddings": 130},
    "bert-tiny": {**_BERT, **_shape(64, 2, 2, 256), "vocab_size": 1024, "max_position_embeddings": 128},
    "t5-v1_1-small": {**_T5_V1_1, **_t5_shape(512, 1024, 8, 6)},
    "t5-v1_1-base": {**_T5_V1_1, **_t5_shape(768, 2048, 12, 12)},
    "t5-v1_1-large": {**_T5_V1_1, **_t5_shape(1024, 2816, 24, 16)},
    "t5-small": {**_T5_ORIGINAL, **_t5_shape(512, 2048, 6, 8)},
    "t5-base": {**_T5_ORIGINAL, **_t5_shape(768, 3072, 12, 12)},
    # tiny T5s for tests and the CPU demo
    "t5-v1_1-mini": {**_T5_V1_1, **_t5_shape(128, 384, 3, 4), "d_kv": 32, "vocab_size": 8192},
    "t5-v1_1-tiny": {**_T5_V1_1, **_t5_shape(64, 128, 2, 4), "d_kv": 16, "vocab_size": 1024},
    "t5-tiny": {**_T5_ORIGINAL, **_t5_shape(64, 128, 2, 4), "d_kv": 16, "vocab_size": 1024},
    "gpt2": {**_GPT2, **_gpt2_shape(768, 12, 12)},
    "gpt2-medium": {**_GPT2, **_gpt2_shape(1024, 24, 16)},
    "opt-125m": {**_OPT, **_opt_shape(768, 12, 12, 3072)},
    "opt-350m": {**_OPT, **_opt_shape(1024, 24, 16, 4096, proj=512, pre_ln=False)},
    "llama-100m": {**_LLAMA, **_llama_shape(768, 12, 12, 4, 2048), "tie_word_embeddings": True},
    # small decoders for tests and the CPU demo
    "gpt2-small": {**_GPT2, **_gpt2_shape(128, 4, 4), "vocab_size": 8192, "n_positions": 256},
    "gpt2-tiny": {**_GPT2, **_gpt2_shape(64, 2, 2), "vocab_size": 1024, "n_positions": 256},
    "opt-tiny": {**_OPT, **_opt_shape(64, 2, 2, 256), "vocab_size": 1024, "max_position_embeddings": 256},
    "opt-350m-tiny": {**_OPT, **_opt_shape(64, 2, 2, 256, proj=32, pre_ln=False), "vocab_size": 1024,
                      "max_position_embeddings": 256},
    "llama-tiny": {**_LLAMA, **_llama_shape(64, 2, 4, 2, 176), "vocab_size": 1024, "max_position_embeddings": 256},
}

# Special tokens looked up by text when the tokenizer does not name them (e.g. a bare tokenizer.json).
_SPECIAL_TOKENS = {"pad_token_id": ("<pad>", "[PAD]"), "bos_token_id": ("<s>",), "eos_token_id": ("</s>",)}
_NOT_OVERRIDABLE = {"model_type", "transformers_version", "_name_or_path"}
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")  # 1e-5: a string to yaml 1.1


def get_preset(name):
    """The preset dict (a copy) for name; UserError listing the presets when unknown."""
    if name not in PRESETS:
        near = difflib.get_close_matches(str(name), list(PRESETS), n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise UserError(f"unknown preset '{name}'; {hint}presets: {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def parse_overrides(items):
    """['key=value', ...] -> {key: value}; values are yaml-typed (4 -> int, 0.1 -> float, true -> bool)."""
    out = {}
    for item in items or ():
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--set expects key=value, got '{item}'")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str) and _FLOAT.match(value.strip()):
            value = float(value)
        out[key] = value
    return out


def _valid_keys(config):
    keys = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
    return {k for k in keys if not k.startswith("_")} - _NOT_OVERRIDABLE


def _check_value(key, value, default):
    """The override's type must fit the default's (number for number, bool for bool); floats accept ints."""
    if value is None or default is None or (key.endswith("_token_id") and isinstance(value, list)):
        return value
    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise UserError(f"config key '{key}' takes true or false, got {value!r}")
    if numeric and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise UserError(f"config key '{key}' takes a number, got {value!r}")
    if isinstance(default, int) and numeric and isinstance(value, float):
        if not value.is_integer():
            raise UserError(f"config key '{key}' takes an integer, got {value!r}")
        return int(value)
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _special_ids(tokenizer):
    vocab = tokenizer.get_vocab()
    out = {}
    for key, texts in _SPECIAL_TOKENS.items():
        tid = getattr(tokenizer, key, None)
        if tid is None:
            tid = next((vocab[t] for t in texts if t in vocab), None)
        if tid is not None:
            out[key] = int(tid)
    return out


def _check_shapes(config):
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "num_decoder_layers", "d_ff", "d_kv", "relative_attention_num_buckets"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value <= 0:
            raise UserError(f"config key '{key}' must be positive, got {value}")
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if getattr(config, "head_dim", None) is None and hidden and heads and hidden % heads:
        raise UserError(f"hidden_size {hidden} must be divisible by num_attention_heads {heads}")


def build_config(preset, tokenizer=None, overrides=None):
    """A transformers config from a preset name, sized to tokenizer, with overrides winning.

    overrides: {key: value} or ['key=value', ...]. With a tokenizer, vocab_size = len(tokenizer) and
    pad/bos/eos ids are the tokenizer's (T5: pad and eos, decoder_start_token_id = pad, no bos).
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    fields = get_preset(preset)
    model_type = fields.pop("model_type")
    if isinstance(overrides, (list, tuple)):
        overrides = parse_overrides(overrides)
    overrides = dict(overrides or {})

    default = AutoConfig.for_model(model_type)
    valid = _valid_keys(default)
    for key, value in overrides.items():
        if key == "model_type":
            raise UserError(f"model_type comes from the preset ({model_type}); pick another --preset instead")
        if key not in valid:
            near = difflib.get_close_matches(key, sorted(valid), n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise UserError(f"unknown config key '{key}' for {model_type}{hint}")
        overrides[key] = _check_value(key, value, getattr(default, key, None))

    if tokenizer is not None:
        fields["vocab_size"] = len(tokenizer)
        special = _special_ids(tokenizer)
        if model_type == "t5":  # no bos; the decoder starts from the pad token, as in every T5
            special.pop("bos_token_id", None)
            if "pad_token_id" in special:
                special["decoder_start_token_id"] = special["pad_token_id"]
        fields.update(special)
        vocab_size = overrides.get("vocab_size")
        if vocab_size is not None and vocab_size < len(tokenizer):
            raise UserError(f"tokenizer has {len(tokenizer)} tokens but vocab_size is {vocab_size}; "
                            f"raise vocab_size or drop the override")
    fields.update(overrides)
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except (TypeError, ValueError, StrictDataclassError) as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        raise UserError(f"bad config value: {lines[-1] if lines else type(e).__name__}") from None
    _check_shapes(config)
    return config


def count_params(config):
    """Parameters of the model `config` describes (built abstractly, nothing allocated); None if unknown."""
    from flaxlm.models import abstract_model, count_params as count
    try:
        return count(abstract_model(config)[1])
    except UserError:
        return None


def human(n):
    """125_000_000 -> '125M'."""
    if n is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
