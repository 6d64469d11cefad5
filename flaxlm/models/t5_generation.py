"""Generation with the T5-style encoder-decoders (t5, mt5, umt5; flaxlm.models.t5): greedy and beam search,
traceable (jit them, or call them inside a jitted step), with a key/value cache for the decoder.

    opts = GenerationOptions(max_length=64, num_beams=4, length_penalty=0.6, decoder_start_token_id=0,
                             eos_token_id=1, pad_token_id=0)
    tokens_BN = generate(model, input_ids_BL, attention_mask_BL, opts)   # [B, max_length - 1], pad after EOS
    tokens_BN = generate_jit(graphdef, params, input_ids_BL, attention_mask_BL, opts)

The encoder runs once; every decoder layer's cross-attention keys and values are projected once from its output;
each step feeds one token per row through the decoder, writing its self-attention keys and values into a cache of
max_length - 1 slots (a query at slot t sees slots <= t, with the relative-position bias of the offsets to them).
max_length counts the decoder start token, as transformers' generate does: at most max_length - 1 new tokens.

Beam search is transformers' (generation/utils.py _beam_search, default early_stopping=False, one sequence
returned per input): each step keeps the 2K best continuations of the K running beams; those ending in EOS (or
reaching max_length) among the first K enter the finished set scored sum(logprob) / new_length**length_penalty,
the best K others keep running; it stops when no running beam can still beat the worst finished one (the same
heuristic), or at max_length.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp

from flaxlm.models import merge_model
from flaxlm.models.t5 import gather_bias, relative_buckets

NEG = -1.0e9  # transformers' score of an impossible beam


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    max_length: int  # decoder length counting the start token: at most max_length - 1 new tokens
    decoder_start_token_id: int
    eos_token_id: int
    pad_token_id: int
    num_beams: int = 1  # 1: greedy
    length_penalty: float = 1.0
    early_stopping: bool = False

    @property
    def new_tokens(self):
        return self.max_length - 1


def start_decoding(model, input_ids_BL, attention_mask_BL, copies):
    """(cross_kv, enc_mask_B11S) for decoding `copies` rows per input (the beams): the encoder output repeated,
    every decoder layer's cross-attention keys and values projected from it once."""
    enc_BLD = model.encode(input_ids_BL, attention_mask_BL)
    enc_BLD = jnp.repeat(enc_BLD, copies, axis=0)
    mask_BL = jnp.repeat(attention_mask_BL, copies, axis=0)
    return model.decoder.cross_keys_values(enc_BLD), mask_BL[:, None, None, :].astype(bool)


def init_cache(model, batch, length):
    """Per decoder layer, self-attention keys and values [B, length, N * H] (zero) in the compute dtype."""
    attn = model.decoder.layers[0].attn
    shape = (batch, length, attn.num_heads * attn.head_dim)
    return [(jnp.zeros(shape, model.dtype), jnp.zeros(shape, model.dtype)) for _ in model.decoder.layers]


def decode_step(model, token_B, t, cache, cross_kv, enc_mask_B11S):
    """(float32 logits [B, V] of the next token, cache): token_B is the decoder input at position t (traced)."""
    stack = model.decoder
    S = cache[0][0].shape[1]
    buckets_1S = jax.lax.dynamic_slice_in_dim(
        jnp.asarray(relative_buckets(S, S, False, stack.num_buckets, stack.max_distance)), t, 1, axis=0)
    visible_B11S = jnp.broadcast_to(jnp.arange(S) <= t, (token_B.shape[0], 1, 1, S))
    x_B1D = model.shared(token_B[:, None]).astype(model.dtype)
    new_cache = []
    for i, layer in enumerate(stack.layers):
        table = layer.relative_attention_bias if stack.bias_per_layer else stack.relative_attention_bias
        h_BD = layer.attn_norm(x_B1D)[:, 0]  # the block norms it again: one row, cheap
        k_BSI, v_BSI = (jax.lax.dynamic_update_slice_in_dim(c, p(h_BD)[:, None].astype(c.dtype), t, axis=1)
                        for c, p in zip(cache[i], (layer.attn.k, layer.attn.v)))
        x_B1D = layer(x_B1D, gather_bias(table, buckets_1S), visible_B11S, None, None, enc_mask_B11S, cross_kv[i],
                      self_kv=(k_BSI, v_BSI))
        new_cache.append((k_BSI, v_BSI))
    h_B1D = stack.final_norm(x_B1D)
    if model.tied:
        h_B1D = h_B1D * jnp.asarray(model.d_model ** -0.5, model.dtype)
    return model.head().logits(h_B1D)[:, 0], new_cache


def greedy(model, input_ids_BL, attention_mask_BL, opts):
    """[B, max_length - 1] tokens: the argmax each step, pad after a row's EOS (transformers' greedy search)."""
    B, N = input_ids_BL.shape[0], opts.new_tokens
    cross_kv, enc_mask = start_decoding(model, input_ids_BL, attention_mask_BL, 1)

    def running(state):
        t, _, done_B, _, _ = state
        return (t < N) & ~jnp.all(done_B)

    def step(state):
        t, token_B, done_B, out_BN, cache = state
        logits_BV, cache = decode_step(model, token_B, t, cache, cross_kv, enc_mask)
        token_B = jnp.where(done_B, opts.pad_token_id, jnp.argmax(logits_BV, axis=-1).astype(jnp.int32))
        out_BN = jax.lax.dynamic_update_slice_in_dim(out_BN, token_B[:, None], t, axis=1)
        return t + 1, token_B, done_B | (token_B == opts.eos_token_id), out_BN, cache

    state = (jnp.int32(0), jnp.full((B,), opts.decoder_start_token_id, jnp.int32), jnp.zeros((B,), bool),
             jnp.full((B, N), opts.pad_token_id, jnp.int32), init_cache(model, B, N))
    return jax.lax.while_loop(running, step, state)[3]


def _take(x_BK, index_BJ):
    """x's beams [B, K, ...] at index [B, J] -> [B, J, ...]."""
    return jnp.take_along_axis(x_BK, index_BJ.reshape(index_BJ.shape + (1,) * (x_BK.ndim - 2)), axis=1)


def beam_search(model, input_ids_BL, attention_mask_BL, opts):
    """[B, max_length - 1] tokens of each input's best finished hypothesis (pad after its EOS), as transformers'
    beam search with num_return_sequences 1 picks it."""
    B, K, N, lp = input_ids_BL.shape[0], opts.num_beams, opts.new_tokens, opts.length_penalty
    cross_kv, enc_mask = start_decoding(model, input_ids_BL, attention_mask_BL, K)
    top_K = jnp.arange(2 * K) < K  # only the first K continuations may finish

    def running(state):
        t, unsat_B, _, _, _, finished_BK, _, _, hits_all = state
        open_beam = ~(jnp.all(finished_BK) & opts.early_stopping)
        return (t < N) & jnp.any(unsat_B) & open_beam & ~hits_all

    def step(state):
        t, unsat_B, seq_BKN, score_BK, fin_seq_BKN, finished_BK, fin_score_BK, cache, _ = state
        last_M = jax.lax.dynamic_index_in_dim(seq_BKN.reshape(B * K, N), t - 1, axis=1, keepdims=False)
        last_M = jnp.where(t == 0, opts.decoder_start_token_id, last_M)
        logits_MV, cache = decode_step(model, last_M, t, cache, cross_kv, enc_mask)
        V = logits_MV.shape[-1]
        logp_BKV = jax.nn.log_softmax(logits_MV.astype(jnp.float32)).reshape(B, K, V) + score_BK[:, :, None]
        cand_lp_BJ, cand_BJ = jax.lax.top_k(logp_BKV.reshape(B, K * V), 2 * K)  # J = 2K continuations
        origin_BJ, token_BJ = cand_BJ // V, (cand_BJ % V).astype(jnp.int32)
        cand_seq_BJN = _take(seq_BKN, origin_BJ)
        cand_seq_BJN = jax.lax.dynamic_update_slice_in_dim(cand_seq_BJN, token_BJ[:, :, None], t, axis=2)
        hits_BJ = (token_BJ == opts.eos_token_id) | (t + 2 >= opts.max_length)

        # the K best continuations that go on running
        run_lp_BJ = cand_lp_BJ + hits_BJ.astype(jnp.float32) * NEG
        _, keep_BK = jax.lax.top_k(run_lp_BJ, K)
        seq_BKN, score_BK = _take(cand_seq_BJN, keep_BK), _take(run_lp_BJ, keep_BK)
        beam_M = (_take(origin_BJ, keep_BK) + jnp.arange(B)[:, None] * K).reshape(-1)
        cache = [(k[beam_M], v[beam_M]) for k, v in cache]

        # the finished set: the old one and the continuations that just finished, best K
        just_BJ = hits_BJ & top_K[None]
        fin_lp_BJ = cand_lp_BJ / ((t + 1).astype(jnp.float32) ** lp)
        full_B1 = jnp.all(finished_BK, axis=-1, keepdims=True) & opts.early_stopping
        fin_lp_BJ = fin_lp_BJ + full_B1 * NEG + (~unsat_B)[:, None] * NEG + (~just_BJ) * NEG
        merged_lp = jnp.concatenate([fin_score_BK, fin_lp_BJ], axis=1)
        _, best_BK = jax.lax.top_k(merged_lp, K)
        fin_score_BK = _take(merged_lp, best_BK)
        fin_seq_BKN = _take(jnp.concatenate([fin_seq_BKN, cand_seq_BJN], axis=1), best_BK)
        finished_BK = _take(jnp.concatenate([finished_BK, just_BJ], axis=1), best_BK)

        # can a running beam still beat the worst finished one? (transformers' heuristic, new length t + 1)
        best_B = score_BK[:, 0] / ((t + 1).astype(jnp.float32) ** lp)
        worst_BK = jnp.where(finished_BK, jnp.min(fin_score_BK, axis=1, keepdims=True), NEG)
        unsat_B = unsat_B & jnp.any(best_B[:, None] > worst_BK, axis=-1)
        return (t + 1, unsat_B, seq_BKN, score_BK, fin_seq_BKN, finished_BK, fin_score_BK, cache,
                jnp.all(hits_BJ))

    pad_BKN = jnp.full((B, K, N), opts.pad_token_id, jnp.int32)
    score_BK = jnp.where(jnp.arange(K) == 0, 0.0, NEG)[None].repeat(B, axis=0)
    state = (jnp.int32(0), jnp.ones((B,), bool), pad_BKN, score_BK, pad_BKN, jnp.zeros((B, K), bool),
             jnp.full((B, K), NEG), init_cache(model, B * K, N), jnp.bool_(False))
    tokens_BN = jax.lax.while_loop(running, step, state)[4][:, 0]
    return pad_after_eos(tokens_BN, opts)


def pad_after_eos(tokens_BN, opts):
    """Tokens after each row's first EOS -> pad."""
    eos_BN = tokens_BN == opts.eos_token_id
    after_BN = jnp.cumsum(eos_BN, axis=1) - eos_BN > 0
    return jnp.where(after_BN, opts.pad_token_id, tokens_BN)


def generate(model, input_ids_BL, attention_mask_BL, opts):
    """[B, max_length - 1] new tokens per input (pad after EOS): greedy for num_beams 1, else beam search."""
    search = greedy if opts.num_beams == 1 else beam_search
    return search(model, jnp.asarray(input_ids_BL), jnp.asarray(attention_mask_BL), opts)


@functools.partial(jax.jit, static_argnums=(0, 4))
def generate_jit(graphdef, params, input_ids_BL, attention_mask_BL, opts):
    """generate() compiled once per (graphdef, shapes, options)."""
    return generate(merge_model(graphdef, params), input_ids_BL, attention_mask_BL, opts)

