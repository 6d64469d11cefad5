"""What the decoder-only (causal LM) families share: their call with and without the key/value cache, the cache
itself and the LM head. Every causal-LM model has the same interface:

    logits_BLV = model(ids_BL, mask_BL=None, positions_BL=None, dropout_key=key)   # causal, training / eval
    cache = model.init_cache(batch, length)                                        # for generation
    logits_BTV, cache = model(ids_BT, mask_BT, positions_BT, cache=cache)          # T new tokens at cache index
    h_BLD = model(ids_BL, dropout_key=key, hidden=True); head = model.head()       # for a fused head + loss
"""
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.models import context_parallel, kv_cache
from flaxlm.models.layers import LMHead, fold_key, lora_dropout_key, with_token_rows
from flaxlm.models.vocab_padding import padded_rows

LORA_KEYS = 7919  # the adapters' dropout keys: the dropout key folded with this, then the layer's index


class CausalLM(nnx.Module):
    """A family's causal-LM model builds on this. Its __init__ sets embed (the token nnx.Embed), layers,
    execution, dtype, tied (and lm_head, a bias-free dense, when untied), kv_heads and head_dim (the cache's
    shape); it defines embed_input and may redefine call_layer and head_input. Its vocabulary tables hold
    vocab_rows(config, execution) rows (padded past config.vocab_size with --pad_vocab_multiple)."""
    vocab_size = None  # the true vocabulary when the tables are padded past it (the head cuts to it); None: not padded

    def vocab_rows(self, config, execution):
        """The rows of the vocabulary tables in memory: config.vocab_size rounded up to a multiple of
        execution.vocab_multiple (flaxlm.models.vocab_padding); sets vocab_size."""
        rows = padded_rows(config.vocab_size, execution.vocab_multiple if execution else 1)
        self.vocab_size = config.vocab_size if rows != config.vocab_size else None
        return rows

    def set_vocab_size(self, size):
        """The true vocabulary once the tables (grown: an added token, an adapter's rows) hold `size` tokens."""
        rows = self.embed.embedding.get_value().shape[0]
        self.vocab_size = size if size != rows else None

    def embed_input(self, input_ids_BL, positions_BL, dropout_key):
        """The first layer's input [B, L, D] in the compute dtype."""
        raise NotImplementedError

    def call_layer(self, i, layer, x_BLD, attention_mask_BL, positions_BL, dropout_key, *cached):
        """Layer i on x: (x, kv) (cached: the layer's kv, the cache index and visible_BTS, or nothing). By
        default the layer takes (x, mask, dropout key folded with i + 1, *cached): key 0 is the embeddings'."""
        return layer(x_BLD, attention_mask_BL, fold_key(dropout_key, i + 1), *cached)

    def head_input(self, x_BLD):
        """The rows the LM head multiplies, from the last layer's output: the final norm."""
        return self.final_norm(x_BLD)

    def init_cache(self, batch, length):
        return kv_cache.init_cache(len(self.layers), batch, length, self.kv_heads, self.head_dim, self.dtype)

    def __call__(self, input_ids_BL, attention_mask_BL=None, positions_BL=None, *, dropout_key=None, cache=None,
                 hidden=False):
        """Logits [B, L, V] (float32), or with hidden=True the rows [B, L, D] that the head multiplies (see
        head()); with a cache, (that, the updated cache)."""
        if positions_BL is None:
            positions_BL = kv_cache.default_positions(input_ids_BL, cache)
        x_BLD = self.embed_input(input_ids_BL, positions_BL, dropout_key)
        C = context_parallel.context_size() if cache is None else 1
        if C > 1:  # the layers hold the sequence split over the 'context' axis, in the load-balanced order
            context_parallel.check_length(x_BLD.shape[1], C)
            order = context_parallel.balanced_order(x_BLD.shape[1], C)
            x_BLD = context_parallel.split_over_context(x_BLD[:, order])
            positions_BL = jnp.broadcast_to(positions_BL, input_ids_BL.shape)[:, order]
        else:
            order = None

        def layer_call(i, layer, x, *cached):
            with lora_dropout_key(fold_key(dropout_key, LORA_KEYS, i)):  # the layer's adapters' (flaxlm.models.lora)
                return self.call_layer(i, layer, x, attention_mask_BL, positions_BL, dropout_key, *cached)
        with context_parallel.sequence_order(order):
            x_BLD, cache = kv_cache.run_layers(self.layers, x_BLD, attention_mask_BL, cache, layer_call,
                                               self.execution)
        if order is not None:  # back in the sequence's order, still split: the head and the loss per position
            x_BLD = context_parallel.split_over_context(x_BLD[:, np.argsort(order)])
        h_BLD = self.head_input(x_BLD)
        out = h_BLD if hidden else self.head().logits(h_BLD)
        return out if cache is None else (out, cache)

    def head(self):
        """The LM head: the token embeddings (tied) or lm_head's kernel, with their trained token rows (LoRA's)."""
        weight = (with_token_rows(self.embed, self.embed.embedding[...]) if self.tied
                  else with_token_rows(self.lm_head, self.lm_head.kernel[...], axis=1))
        return LMHead(weight, self.tied, self.dtype, softcap=getattr(self, "logit_softcap", None),
                      vocab_size=self.vocab_size)
