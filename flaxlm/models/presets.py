"""Model shape presets, and building a Hugging Face config from one (create_config.py).

A preset is a plain dict: `model_type` picks the transformers config class (through
`AutoConfig.for_model`), every other key is a field of that class. Each family's file holds its presets
(Family.presets): the full-size ones copy the Hugging Face hub configs exactly; the tiny/small ones are for
tests and the CPU demo. PRESETS gathers them from the registry.
"""
import difflib
import re

import yaml

from flaxlm.errors import UserError
from flaxlm.models.registry import FAMILIES

PRESETS = {name: fields for f in FAMILIES.values() for name, fields in f.presets.items()}

# Special tokens looked up by text when the tokenizer does not name them (e.g. a bare tokenizer.json).
_SPECIAL_TOKENS = {"pad_token_id": ("<pad>", "[PAD]"), "bos_token_id": ("<s>",), "eos_token_id": ("</s>",)}
_SEQUENCE_TOKENS = {"bos_token_id": "cls_token_id", "eos_token_id": "sep_token_id"}  # WordPiece: [CLS] ... [SEP]
_NOT_OVERRIDABLE = {"model_type", "transformers_version", "_name_or_path"}
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")  # 1e-5: a string to yaml 1.1


def get_preset(name):
    """The preset dict (a copy) for name; UserError naming the closest preset and its family's presets (or the
    families that have presets) when unknown."""
    if name not in PRESETS:
        near = difflib.get_close_matches(str(name), list(PRESETS), n=1)
        if near:
            model_type = PRESETS[near[0]]["model_type"]
            same = [p for p, fields in PRESETS.items() if fields["model_type"] == model_type]
            hint = f"did you mean {near[0]}? {model_type} presets: {', '.join(same)}"
        else:
            hint = f"presets exist for {', '.join(dict.fromkeys(f['model_type'] for f in PRESETS.values()))}"
        raise UserError(f"unknown preset '{name}'; {hint}; create_config.py --list_presets lists all {len(PRESETS)}")
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


def special_ids(tokenizer, encoder_decoder=False):
    """The tokenizer's pad/bos/eos ids; a tokenizer without bos/eos (WordPiece) gives its [CLS]/[SEP] ids, one
    with neither None, so that a preset's ids of other tokens (RoBERTa's bos 0, eos 2) do not stay. encoder_decoder
    (T5): no bos, and decoder_start_token_id is the pad id."""
    vocab = tokenizer.get_vocab()
    out = {}
    for key, texts in _SPECIAL_TOKENS.items():
        tid = getattr(tokenizer, key, None)
        if tid is None:
            tid = next((vocab[t] for t in texts if t in vocab), None)
        if tid is None and key in _SEQUENCE_TOKENS:
            tid = getattr(tokenizer, _SEQUENCE_TOKENS[key], None)
        if tid is not None:
            out[key] = int(tid)
        elif key in _SEQUENCE_TOKENS:
            out[key] = None
    if encoder_decoder:  # T5, mT5, UMT5: no bos; the decoder starts from the pad token
        out.pop("bos_token_id", None)
        if "pad_token_id" in out:
            out["decoder_start_token_id"] = out["pad_token_id"]
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
    fields = get_preset(preset)
    model_type = fields.pop("model_type")
    return config_for(model_type, fields, tokenizer, overrides, f"comes from the preset ({model_type}); pick "
                                                                 f"another --preset instead")


def config_for(model_type, fields, tokenizer=None, overrides=None, fixed_type="cannot be overridden"):
    """model_type's transformers config: its defaults changed by fields, then sized to tokenizer (see
    build_config), overrides winning. fixed_type: what the error says when overrides try to change model_type."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    fields = dict(fields)
    if isinstance(overrides, (list, tuple)):
        overrides = parse_overrides(overrides)
    overrides = dict(overrides or {})

    default = AutoConfig.for_model(model_type)
    valid = _valid_keys(default) | set(fields)  # and the preset's own keys (DeBERTa's position_buckets)
    for key, value in overrides.items():
        if key == "model_type":
            raise UserError(f"model_type {fixed_type}")
        if key not in valid:
            near = difflib.get_close_matches(key, sorted(valid), n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise UserError(f"unknown config key '{key}' for {model_type}{hint}")
        overrides[key] = _check_value(key, value, getattr(default, key, None))

    if tokenizer is not None:
        fields["vocab_size"] = len(tokenizer)
        fields.update(special_ids(tokenizer, default.is_encoder_decoder))
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


def human(n):
    """125_000_000 -> '125M'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
