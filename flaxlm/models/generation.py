"""Text generation with the decoder-only models (flaxlm.models.CAUSAL_LM_TYPES) and their key/value cache.

    out = generate(model, [[5, 6, 7], [8, 9]], max_new_tokens=20, eos_token_id=2)              # greedy
    out = generate((graphdef, params), prompts, 20, temperature=0.8, top_k=50, top_p=0.95, seed=1)
    out.tokens                     # per prompt: the new token ids, up to and including EOS
    out.prefill_seconds, out.decode_tokens_per_second, out.compile_seconds

The prompts are left-padded into one batch [B, P] (P bucketed to a multiple of 64, so prompts of similar
lengths share compiled code); one prefill call fills a cache of P + max_new_tokens slots and picks the first
new token, then a jax.lax.while_loop adds one token per step until max_new_tokens or until every row has
produced EOS. A row that has finished emits pad_token_id, fed to the model masked out. Positions count only
the real tokens (cumsum of the mask - 1), as transformers' generate does. Both steps are compiled ahead of
time once per (batch, bucketed prompt length, max_new_tokens, greedy or sampling), so timings exclude
compilation. temperature == 0 is greedy (argmax); otherwise logits / temperature, then top-k, then top-p
(nucleus) filtering, then a draw with a jax PRNG key from seed (the same seed gives the same tokens).
"""
import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import merge_model, split_model

BUCKET = 64  # prompt lengths are padded up to a multiple of this (never past the model's positions)


@dataclasses.dataclass
class Generation:
    tokens: list  # per prompt, the new token ids (up to and including EOS)
    compile_seconds: float  # 0 when both steps were compiled by an earlier call
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int  # model calls of the decode loop: each adds one token to every row
    batch: int

    @property
    def decode_tokens_per_second(self):
        """Tokens the decode loop produced (every row, each step) per second."""
        return self.batch * self.decode_steps / self.decode_seconds if self.decode_steps else float("nan")


def check_fits(prompt_length, max_new_tokens, max_positions):
    """UserError when the longest prompt plus the new tokens would not fit the model's positions."""
    if max_positions is not None and prompt_length + max_new_tokens > max_positions:
        fixes = [f"shorten the prompt to at most {max_positions - max_new_tokens} tokens"] \
            if max_new_tokens < max_positions else []
        fixes += [f"lower max_new_tokens to at most {max_positions - prompt_length}"] \
            if prompt_length < max_positions else []
        fix = " or ".join(fixes) or "shorten the prompt and lower max_new_tokens"
        raise UserError(f"prompt of {prompt_length} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                        f"{max_positions} positions; {fix}")


def bucket_length(prompt_length, max_new_tokens, max_positions):
    """The padded prompt length: a multiple of BUCKET, at least prompt_length, with room for the new tokens."""
    padded = BUCKET * math.ceil(prompt_length / BUCKET)
    if max_positions is not None:
        padded = min(padded, max_positions - max_new_tokens)
    return max(padded, prompt_length)


def left_pad(prompts, length, pad_token_id):
    """(ids_BP, mask_BP) int32 numpy arrays: each prompt right-aligned in `length` slots."""
    ids_BP = np.full((len(prompts), length), pad_token_id, np.int32)
    mask_BP = np.zeros((len(prompts), length), np.int32)
    for b, prompt in enumerate(prompts):
        ids_BP[b, length - len(prompt):] = prompt
        mask_BP[b, length - len(prompt):] = 1
    return ids_BP, mask_BP


def filter_logits(logits_BV, top_k, top_p):
    """Logits outside the top_k largest (0: no limit) or outside the nucleus -> -inf. The nucleus is the
    most likely tokens whose probabilities (after top-k) sum to top_p: a token is kept while the mass of
    the tokens before it is below top_p, so the most likely one always is."""
    V = logits_BV.shape[-1]
    sorted_BV = jnp.flip(jnp.sort(logits_BV, axis=-1), axis=-1)
    keep_BV = jnp.arange(V)[None, :] < jnp.where(top_k > 0, top_k, V)
    probs_BV = jax.nn.softmax(jnp.where(keep_BV, sorted_BV, -jnp.inf), axis=-1)
    keep_BV &= jnp.cumsum(probs_BV, axis=-1) - probs_BV < top_p
    least_B1 = jnp.min(jnp.where(keep_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits_BV >= least_B1, logits_BV, -jnp.inf)


def next_token(logits_BV, key, sampling, do_sample):
    """The next token of each row [B]: argmax, or a draw from the filtered, temperature-scaled logits. sampling holds
    top_k and top_p only when they filter (sampling_options): sorting the vocabulary every step is no free no-op."""
    if not do_sample:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    logits_BV = logits_BV / sampling["temperature"]
    if "top_k" in sampling:
        logits_BV = filter_logits(logits_BV, sampling["top_k"], sampling["top_p"])
    return jax.random.categorical(key, logits_BV, axis=-1).astype(jnp.int32)


def sampling_options(temperature, top_k, top_p):
    """The sampling dict of the compiled steps: the temperature (1 when greedy), and top_k / top_p only when one of
    them filters (top_k > 0 or top_p < 1), so that plain sampling compiles without the per-step sort."""
    options = {"temperature": np.float32(temperature or 1.0)}
    if top_k > 0 or top_p < 1:
        options.update(top_k=np.int32(top_k), top_p=np.float32(top_p))
    return options


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("cache_length", "do_sample"))
def _prefill(graphdef, params, ids_BP, mask_BP, key, sampling, *, cache_length, do_sample):
    """(first new token [B], cache after the prompt)."""
    model = merge_model(graphdef, params)
    positions_BP = jnp.maximum(jnp.cumsum(mask_BP, axis=-1) - 1, 0)
    cache = model.init_cache(ids_BP.shape[0], cache_length)
    logits_BPV, cache = model(ids_BP, mask_BP, positions_BP, cache=cache)
    return next_token(logits_BPV[:, -1], jax.random.fold_in(key, 0), sampling, do_sample), cache


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("max_new_tokens", "do_sample"))
def _decode(graphdef, params, cache, first_B, lengths_B, key, sampling, eos_pad, *, max_new_tokens, do_sample):
    """(new tokens [B, max_new_tokens], pad after each row's EOS; number of model calls made)."""
    model = merge_model(graphdef, params)
    eos, pad = eos_pad[0], eos_pad[1]
    B = first_B.shape[0]
    out_BN = jnp.full((B, max_new_tokens), pad, jnp.int32).at[:, 0].set(first_B)

    def unfinished(state):
        step, _, done_B, _, _ = state
        return (step < max_new_tokens) & ~jnp.all(done_B)

    def step_fn(state):
        step, token_B, done_B, out_BN, cache = state
        positions_B1 = (lengths_B + step - 1)[:, None]
        logits_B1V, cache = model(token_B[:, None], (~done_B)[:, None].astype(jnp.int32), positions_B1,
                                  cache=cache)
        token_B = next_token(logits_B1V[:, 0], jax.random.fold_in(key, step), sampling, do_sample)
        token_B = jnp.where(done_B, pad, token_B)
        out_BN = jax.lax.dynamic_update_slice_in_dim(out_BN, token_B[:, None], step, axis=1)
        return step + 1, token_B, done_B | (token_B == eos), out_BN, cache

    state = (jnp.int32(1), first_B, first_B == eos, out_BN, cache)
    step, _, _, out_BN, _ = jax.lax.while_loop(unfinished, step_fn, state)
    return out_BN, step - 1


_EXECUTABLES = {}  # (function, graphdef, static options, argument shapes) -> compiled executable


def _compiled(fn, graphdef, static, *args):
    """fn compiled ahead of time for these arguments' shapes and the static options (dict), once."""
    leaves, tree = jax.tree.flatten(args)
    key = (fn, graphdef, tuple(sorted(static.items())), tree, tuple((x.shape, x.dtype) for x in leaves))
    if key not in _EXECUTABLES:
        _EXECUTABLES[key] = fn.lower(graphdef, *args, **static).compile()
    return _EXECUTABLES[key]


def _check_options(prompts, max_new_tokens, temperature, top_k, top_p):
    if not prompts:
        raise UserError("no prompts given; pass at least one prompt")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise UserError(f"prompt {i + 1} is empty (no tokens); give every prompt some text")
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be at least 1, not {max_new_tokens}")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise UserError(f"bad sampling options (temperature {temperature}, top_k {top_k}, top_p {top_p}); "
                        f"use temperature >= 0 (0: greedy), top_k >= 0 (0: no limit), 0 < top_p <= 1")


def generate(model_or_graphdef_params, prompts, max_new_tokens, *, eos_token_id=None, pad_token_id=0,
             temperature=0.0, top_k=0, top_p=1.0, seed=0):
    """New tokens for each prompt (a list of token ids; lengths may differ) and the timings: a Generation."""
    _check_options(prompts, max_new_tokens, temperature, top_k, top_p)
    if isinstance(model_or_graphdef_params, nnx.Module):
        graphdef, params = split_model(model_or_graphdef_params)
    else:
        graphdef, params = model_or_graphdef_params
    max_positions = getattr(merge_model(graphdef, params), "max_positions", None)
    longest = max(len(p) for p in prompts)
    check_fits(longest, max_new_tokens, max_positions)
    ids_BP, mask_BP = left_pad(prompts, bucket_length(longest, max_new_tokens, max_positions), pad_token_id)
    lengths_B = mask_BP.sum(axis=1).astype(np.int32)
    do_sample = temperature > 0
    sampling = sampling_options(temperature, top_k, top_p)
    key = jax.random.key(seed)
    eos_pad = np.array([-1 if eos_token_id is None else eos_token_id, pad_token_id], np.int32)

    static = {"do_sample": do_sample}
    prefill, compile_seconds = _timed(_compiled, _prefill, graphdef,
                                      {**static, "cache_length": ids_BP.shape[1] + max_new_tokens},
                                      params, ids_BP, mask_BP, key, sampling)
    (first_B, cache), prefill_seconds = _timed(prefill, params, ids_BP, mask_BP, key, sampling)
    args = (params, cache, first_B, lengths_B, key, sampling, eos_pad)
    decode, seconds = _timed(_compiled, _decode, graphdef, {**static, "max_new_tokens": max_new_tokens}, *args)
    (out_BN, steps), decode_seconds = _timed(decode, *args)
    return Generation(_until_eos(np.asarray(out_BN), eos_token_id), compile_seconds + seconds, prefill_seconds,
                      decode_seconds, int(steps), len(prompts))


def _timed(fn, *args):
    """(fn(*args) once its arrays are ready, seconds taken)."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def _until_eos(out_BN, eos_token_id):
    tokens = []
    for row in out_BN.tolist():
        if eos_token_id is not None and eos_token_id in row:
            row = row[:row.index(eos_token_id) + 1]
        tokens.append(row)
    return tokens
