"""mT5 and UMT5: the multilingual T5 v1.1 models, each under its own model_type, tensor for tensor Hugging Face's
MT5ForConditionalGeneration and UMT5ForConditionalGeneration, built from flaxlm.models.t5's modules.

- mT5 is T5 v1.1 (gated-GELU FFN, untied LM head, no output scaling) with a 250k SentencePiece vocabulary;
- UMT5 is mT5 with a relative-position bias table in every layer's self-attention (encoder and decoder), not
  only in each stack's first block; cross-attention has none.

The two share one file because they differ from T5 in the same way (their own config class, an LM head that is
always untied) and from each other by one flag. Every released checkpoint (google/mt5-*, google/umt5-*) has an
untied head, and transformers 5's MT5Config / UMT5Config force tie_word_embeddings to true whatever config.json
says, so the config cannot tell: the head here is always untied, and export writes tie_word_embeddings false.
A checkpoint without lm_head.weight (transformers 5 saves a model built from a config that way) starts its head
from the shared embeddings, scaled as transformers computes such a tied head (UMT5: the decoder output times
d_model**-0.5 unless its config says scale_decoder_outputs false; mT5: unscaled).

Note: transformers 5.0-5.23's UMT5ForConditionalGeneration scales the decoder output by d_model**-0.5 whenever
config.tie_word_embeddings, which its config forces, so it scales an untied checkpoint too (transformers 4, and
T5X, which trained UMT5, do not); 5.24 reads config.json's tie_word_embeddings false into scale_decoder_outputs
and does not. This module computes the released models as trained.
"""
from flaxlm.models import t5
from flaxlm.models.family import Family


class MT5ForConditionalGeneration(t5.T5ForConditionalGeneration):
    """mT5: T5 v1.1 with an untied LM head whatever config.tie_word_embeddings says."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution, tied=False)


class UMT5ForConditionalGeneration(t5.T5ForConditionalGeneration):
    """UMT5: mT5 with a relative-position bias table in every block's self-attention."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution, tied=False, bias_per_layer=True)


def never_tied(config):
    """config.json's tie_word_embeddings on export: false, as in every released mT5 / UMT5."""
    return False


def mt5_tensor_names(config):
    """mT5's tensor names: T5 v1.1's (one bias table per stack, in block 0; lm_head.weight)."""
    return t5.tensor_names(config, tied=False)


def mt5_normalize(config, tensors, notes):
    """t5.normalize for mT5: a missing lm_head.weight comes from shared.weight (transformers 5's mT5 does not
    scale a tied head)."""
    return t5.normalize(config, tensors, notes, tied=False)


def umt5_tensor_names(config):
    """UMT5's tensor names: mT5's with a relative_attention_bias in every block's self-attention."""
    return t5.tensor_names(config, tied=False, bias_per_layer=True)


def umt5_normalize(config, tensors, notes):
    """t5.normalize for UMT5: a missing lm_head.weight comes from shared.weight * d_model**-0.5, or unscaled when
    the config says the decoder output is not scaled (t5.ties_embeddings: transformers >= 5.24's
    scale_decoder_outputs false)."""
    scale = config.d_model ** -0.5 if t5.ties_embeddings(config) else 1.0
    return t5.normalize(config, tensors, notes, tied=False, tied_head_scale=scale)


# google/mt5-* and google/umt5-* on the hub (umt5's config.json has no model_type; transformers reads it from
# the architecture). The tiny ones are for tests.
_MT5 = dict(model_type="mt5", vocab_size=250112, d_kv=64, relative_attention_num_buckets=32,
            relative_attention_max_distance=128, dropout_rate=0.1, layer_norm_epsilon=1e-6, initializer_factor=1.0,
            feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0,
            eos_token_id=1)
_UMT5 = {**_MT5, "model_type": "umt5", "vocab_size": 256384}

MT5_PRESETS = {
    "mt5-small": {**_MT5, **t5.stack_shape(512, 1024, 8, 6)},
    "mt5-base": {**_MT5, **t5.stack_shape(768, 2048, 12, 12)},
    "mt5-tiny": {**_MT5, **t5.stack_shape(64, 128, 2, 4), "d_kv": 16, "vocab_size": 1024},
}
UMT5_PRESETS = {
    "umt5-small": {**_UMT5, **t5.stack_shape(512, 1024, 8, 6)},
    "umt5-base": {**_UMT5, **t5.stack_shape(768, 2048, 12, 12)},
    "umt5-tiny": {**_UMT5, **t5.stack_shape(64, 128, 2, 4), "d_kv": 16, "vocab_size": 1024},
}

MT5 = Family(model_type="mt5", name="mT5", model=MT5ForConditionalGeneration, tensor_names=mt5_tensor_names,
             normalize=mt5_normalize, architecture="MT5ForConditionalGeneration", presets=MT5_PRESETS,
             script="run_t5_mlm_flax.py", tie_word_embeddings=never_tied,
             no_splash="its relative position buckets add a bias to the scores")
UMT5 = Family(model_type="umt5", name="UMT5", model=UMT5ForConditionalGeneration, tensor_names=umt5_tensor_names,
              normalize=umt5_normalize, architecture="UMT5ForConditionalGeneration", presets=UMT5_PRESETS,
              script="run_t5_mlm_flax.py", tie_word_embeddings=never_tied,
              no_splash="its relative position buckets add a bias to the scores")
