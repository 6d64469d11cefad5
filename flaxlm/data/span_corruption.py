"""T5 span corruption for encoder-decoder pretraining: vectorized numpy, deterministic under a seed.

Rules (those of `random_spans_noise_mask` in the T5 paper's code, t5.data.preprocessors), for a raw
chunk of R corpus tokens, with d = noise density (--mlm_probability) and m = --mean_noise_span_length:
- N = round(R * d) noise tokens, clipped to [1, R - 1]; the other M = R - N tokens are kept.
- S = round(N / m) noise spans, clipped to [1, min(N, M)]. T5 and Hugging Face clip only below, which
  breaks when S > M (e.g. m = 1 with d > 0.5); with the upper clip every d in (0, 1) and m >= 1 works.
- the N noise tokens are cut into S spans of random positive lengths, every composition equally likely
  (S - 1 distinct cuts among the N - 1 gaps), the M kept tokens into S spans likewise, independently.
  The chunk is kept span 0, noise span 0, kept span 1, noise span 1, ...: it starts with kept tokens
  and ends with noise (T5's default, without its optional random roll).
- input: the chunk with noise span k replaced by its sentinel `first_sentinel_id - k` (<extra_id_k>;
  in Hugging Face T5 tokenizers <extra_id_0> is the last id; ByT5 reuses the last 100 byte ids instead,
  byte 0xFF - k, id 258 - k, and its spans are longer: a mean of 20 bytes), then EOS: M + S + 1 tokens,
  then padding.
- target (labels): sentinel 0, noise span 0, sentinel 1, noise span 1, ..., EOS: N + S + 1 tokens.
Rounding is Python's round (half to even, as tf.round in T5). Token values are never used as markers,
so any id (0 included) in the text survives; text ids should lie below the sentinels.

All rows of one raw length share N, M and S, so every output has a static shape and the batch is
drawn at once: per row, the S - 1 cuts of each partition are the smallest of random 64-bit keys (one
sort per row, the gap's index in the low bits so keys are unique), the 2S span starts give the noise
mask by a cumulative sum, and the input and target are the kept resp. noise tokens (plus one slot per
span for its sentinel) gathered by boolean masks that select the same count in every row.
"""
import math

import numpy as np

from flaxlm.errors import UserError

_MAX_RAW_LENGTH = 2**24
MEAN_NOISE_SPAN_LENGTH = 3.0  # T5's
BYTE_MEAN_NOISE_SPAN_LENGTH = 20.0  # ByT5's: bytes carry less than subwords
BYTE_SENTINELS = 100  # ByT5's sentinels: the last 100 byte ids, from byte 0xFF down
_BITGEN_64 = (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64)  # 64 random bits a draw


def span_counts(raw_length, noise_density, mean_noise_span_length):
    """(num_noise_tokens, num_spans) for a raw chunk of raw_length >= 2 tokens (rules above)."""
    num_noise = min(max(round(raw_length * noise_density), 1), raw_length - 1)
    num_spans = min(max(round(num_noise / mean_noise_span_length), 1), num_noise, raw_length - num_noise)
    return num_noise, num_spans


def corrupted_lengths(raw_length, noise_density, mean_noise_span_length):
    """(input length, target length), both with EOS and without padding, for a raw chunk."""
    num_noise, num_spans = span_counts(raw_length, noise_density, mean_noise_span_length)
    return raw_length - num_noise + num_spans + 1, num_noise + num_spans + 1


def check_span_args(noise_density, mean_noise_span_length):
    if not 0.0 < noise_density < 1.0:
        raise UserError(f"--mlm_probability (the share of tokens corrupted) must be between 0 and 1 "
                        f"(exclusive), got {noise_density}")
    if not (mean_noise_span_length >= 1.0 and math.isfinite(mean_noise_span_length)):
        raise UserError(f"--mean_noise_span_length must be a number >= 1, got {mean_noise_span_length}")


def t5_lengths(inputs_length, noise_density, mean_noise_span_length):
    """(raw_length, targets_length): the longest raw chunk whose corrupted input (with EOS) fits
    inputs_length (--max_seq_length), and the length of its target (with EOS).

    The input length M + S + 1 never falls as the chunk grows and rises by 0, 1 or 2 per extra token
    (2 when the token is kept and adds a span because S is clipped to M). So the input fills
    inputs_length exactly except where the rule jumps over it: then every input ends in one pad token
    (e.g. inputs_length 8 with density 0.5 and mean span 1: a 7-token chunk gives 7 input tokens, an
    8-token chunk 9).
    The smallest input is 3 tokens (one kept token, one sentinel, EOS), so inputs_length >= 3.
    With a density near 1 the chunk and target grow large (density 0.99, span 1, input 512: 25,600).
    """
    check_span_args(noise_density, mean_noise_span_length)
    if inputs_length < 3:
        raise UserError(f"--max_seq_length {inputs_length} leaves no room for span corruption: the input "
                        f"needs at least one text token, a sentinel and EOS; use --max_seq_length >= 3")

    def fits(raw):
        return corrupted_lengths(raw, noise_density, mean_noise_span_length)[0] <= inputs_length

    lo, hi = 2, inputs_length + 1  # fits(lo) holds; find hi that does not
    while fits(hi):
        lo, hi = hi, 2 * hi
        if hi > _MAX_RAW_LENGTH:
            raise UserError(f"--mlm_probability {noise_density} is so close to 1 that an input of "
                            f"{inputs_length} tokens needs a raw chunk of more than {_MAX_RAW_LENGTH} tokens; "
                            f"lower it")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, corrupted_lengths(lo, noise_density, mean_noise_span_length)[1]


def _random_u64(rng, shape):
    """Uniform uint64 bits, drawn as raw words where the bit generator gives 64 bits a draw."""
    if isinstance(rng.bit_generator, _BITGEN_64):
        return rng.bit_generator.random_raw(shape)
    return rng.integers(0, np.iinfo(np.uint64).max, shape, dtype=np.uint64, endpoint=True)


def _span_bounds(rng, B, n, S):
    """Random partitions of n items into S positive parts, one per row: bounds [B, S + 1] from 0 to n,
    strictly increasing (part k is [bounds[k], bounds[k+1]))."""
    bounds_BS = np.empty((B, S + 1), dtype=np.int64)
    bounds_BS[:, 0], bounds_BS[:, S] = 0, n
    if S > 1:  # S - 1 distinct cuts among the gaps 1 .. n - 1: the smallest of unique random keys
        pos_bits = max(1, (n - 2).bit_length())
        low = np.uint64((1 << pos_bits) - 1)
        keys_BG = _random_u64(rng, (B, n - 1))
        keys_BG &= ~low
        keys_BG |= np.arange(n - 1, dtype=np.uint64)
        keys_BG.sort(axis=1)
        cuts_BC = (keys_BG[:, :S - 1] & low).astype(np.int64) + 1
        cuts_BC.sort(axis=1)
        bounds_BS[:, 1:S] = cuts_BC
    return bounds_BS


def is_byte_tokenizer(tokenizer):
    """Whether `tokenizer` is ByT5's (UTF-8 bytes; train_tokenizer.py --type byte writes one)."""
    from transformers import ByT5Tokenizer
    return isinstance(tokenizer, ByT5Tokenizer)


def _sentinels(tokenizer, num_spans, byte):
    """(id of sentinel 0, how many sentinels follow at descending ids, up to num_spans); (None, 0) without any.
    ByT5's are the ids of bytes 0xFF, 0xFE, ... (its <extra_id_*> tokens, at ascending ids, are unused)."""
    if byte:
        return tokenizer.convert_tokens_to_ids(chr(0xFF)), min(num_spans, BYTE_SENTINELS)
    vocab = tokenizer.get_vocab()
    first = vocab.get("<extra_id_0>")
    if first is None:
        return None, 0
    have = 0
    while vocab.get(f"<extra_id_{have}>", -1) == first - have and have < num_spans:
        have += 1
    return first, have


def byte_sentinels_in(ids, tokenizer):
    """Token ids of a text written with <extra_id_k> (ByT5Tokenizer's id 259 + k) as ByT5 was trained: byte
    0xFF - k (id 258 - k) in its place; other tokenizers' ids unchanged. fill_spans.py's prompts."""
    if not is_byte_tokenizer(tokenizer):
        return list(ids)
    extra0, sentinel0 = tokenizer.convert_tokens_to_ids("<extra_id_0>"), tokenizer.convert_tokens_to_ids(chr(0xFF))
    return [sentinel0 - (i - extra0) if extra0 <= i < extra0 + BYTE_SENTINELS else i for i in ids]


def byte_sentinels_out(ids, tokenizer):
    """The inverse for a target ByT5 generated: its sentinels, byte 0xFF - k in order k = 0, 1, ..., back to
    <extra_id_k> (the same ids taken in any other place are text bytes); other tokenizers' ids unchanged."""
    if not is_byte_tokenizer(tokenizer):
        return list(ids)
    extra0, sentinel0 = tokenizer.convert_tokens_to_ids("<extra_id_0>"), tokenizer.convert_tokens_to_ids(chr(0xFF))
    out, k = [], 0
    for i in ids:
        if i == sentinel0 - k and k < BYTE_SENTINELS:
            i, k = extra0 + k, k + 1
        out.append(i)
    return out


class SpanCorruptor:
    """Corrupts batches of raw chunks [B, raw_length] into T5 inputs and targets (module docstring).

    Fields: raw_length, inputs_length, targets_length, num_noise, num_spans, noise_density,
    mean_noise_span_length, eos_token_id, pad_token_id, decoder_start_token_id, first_sentinel_id.
    raw_length defaults to t5_lengths(inputs_length, ...); a shorter one may be given.
    """

    def __init__(self, *, inputs_length, noise_density, mean_noise_span_length, eos_token_id, pad_token_id,
                 first_sentinel_id, decoder_start_token_id=None, raw_length=None):
        best_raw, _ = t5_lengths(inputs_length, noise_density, mean_noise_span_length)
        raw_length = best_raw if raw_length is None else int(raw_length)
        if not 2 <= raw_length <= best_raw:
            raise ValueError(f"raw_length must be in [2, {best_raw}] for inputs_length {inputs_length}, "
                             f"got {raw_length}")
        self.raw_length, self.inputs_length = raw_length, int(inputs_length)
        self.noise_density, self.mean_noise_span_length = float(noise_density), float(mean_noise_span_length)
        self.num_noise, self.num_spans = span_counts(raw_length, noise_density, mean_noise_span_length)
        self.num_kept = raw_length - self.num_noise
        self.targets_length = self.num_noise + self.num_spans + 1
        self.eos_token_id, self.pad_token_id = int(eos_token_id), int(pad_token_id)
        start = self.pad_token_id if decoder_start_token_id is None else decoder_start_token_id
        self.decoder_start_token_id = int(start)
        self.first_sentinel_id = int(first_sentinel_id)
        sentinels = range(self.first_sentinel_id - self.num_spans + 1, self.first_sentinel_id + 1)
        if sentinels.start < 0:
            raise UserError(f"{self.num_spans} spans per chunk need sentinel ids down to {sentinels.start}; "
                            f"the first sentinel id is {first_sentinel_id}")
        if self.eos_token_id in sentinels or self.pad_token_id in sentinels:
            raise UserError(f"the EOS ({eos_token_id}) or pad ({pad_token_id}) id is among the sentinel ids "
                            f"{sentinels.start}..{sentinels.stop - 1}")
        self._sentinels_S = (self.first_sentinel_id - np.arange(self.num_spans)).astype(np.int32)

    @classmethod
    def from_tokenizer(cls, tokenizer, inputs_length, noise_density, mean_noise_span_length=None,
                       decoder_start_token_id=None):
        """A corruptor for a Hugging Face tokenizer with sentinels <extra_id_0>, <extra_id_1>, ... at
        descending ids (T5: <extra_id_k> = len(tokenizer) - 1 - k), an EOS and a pad token; or for ByT5's
        byte tokenizer, with ByT5's sentinels (the last byte ids). mean_noise_span_length None: 3, or 20 for
        a byte tokenizer."""
        byte = is_byte_tokenizer(tokenizer)
        if mean_noise_span_length is None:
            mean_noise_span_length = BYTE_MEAN_NOISE_SPAN_LENGTH if byte else MEAN_NOISE_SPAN_LENGTH
        raw_length, _ = t5_lengths(inputs_length, noise_density, mean_noise_span_length)
        num_spans = span_counts(raw_length, noise_density, mean_noise_span_length)[1]
        where = getattr(tokenizer, "name_or_path", "") or "(in memory)"
        fix = ("train one with train_tokenizer.py --type unigram (it adds 100 <extra_id_*> sentinels) "
               "or add extra_ids to the tokenizer")
        first, have = _sentinels(tokenizer, num_spans, byte)
        if first is None:
            raise UserError(f"tokenizer at {where} has no sentinel tokens (<extra_id_0>, ...) for T5 span "
                            f"corruption; {fix}")
        if have < num_spans:
            kind = "sentinels (ByT5's)" if byte else "sentinel tokens (<extra_id_0>.. at descending ids)"
            raise UserError(f"tokenizer at {where} has {have} {kind}, "
                            f"but --max_seq_length {inputs_length} with --mlm_probability {noise_density} and "
                            f"--mean_noise_span_length {mean_noise_span_length} makes {num_spans} spans per "
                            f"chunk; {'' if byte else fix + ', or '}use a shorter --max_seq_length or longer spans")
        for name in ("eos", "pad"):
            if getattr(tokenizer, f"{name}_token_id") is None:
                raise UserError(f"tokenizer at {where} has no {name} token, which T5 span corruption needs; {fix}")
        return cls(inputs_length=inputs_length, noise_density=noise_density,
                   mean_noise_span_length=mean_noise_span_length, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id, first_sentinel_id=first,
                   decoder_start_token_id=decoder_start_token_id)

    def noise_mask(self, B, rng):
        """(noise_BR bool [B, raw_length], kept_bounds_BS, noise_bounds_BS) for B random rows."""
        S, R = self.num_spans, self.raw_length
        kept_BS = _span_bounds(rng, B, self.num_kept, S)
        noise_BS = _span_bounds(rng, B, self.num_noise, S)
        # kept span k starts at kept_k + noise_k, noise span k at kept_{k+1} + noise_k (raw positions)
        starts_BK = np.concatenate([kept_BS[:, :S] + noise_BS[:, :S], kept_BS[:, 1:] + noise_BS[:, :S]], axis=1)
        starts_BK += np.arange(B, dtype=np.int64)[:, None] * R
        marks_BR = np.zeros((B, R), dtype=np.int8)
        marks_BR.reshape(-1)[starts_BK.reshape(-1)] = 1
        segment_BR = np.cumsum(marks_BR, axis=1, dtype=np.int32)  # 1 + index of the span; odd = kept
        return (segment_BR & 1) == 0, kept_BS, noise_BS

    def __call__(self, rows_BR, rng):
        """Corrupt rows_BR [B, raw_length] with rng (np.random.Generator); returns a dict of arrays."""
        ids_BR = np.asarray(rows_BR)
        if ids_BR.ndim != 2 or ids_BR.shape[1] != self.raw_length:
            raise ValueError(f"expected token ids of shape [batch, {self.raw_length}], got {ids_BR.shape}")
        ids_BR = ids_BR.astype(np.int32, copy=False)
        B, S = ids_BR.shape[0], self.num_spans
        I, T = self.num_kept + S, self.num_noise + S  # input / target tokens before EOS
        noise_BR, kept_BS, noise_BS = self.noise_mask(B, rng)
        first_noise_BR = np.zeros_like(noise_BR)  # the first token of each noise span
        first_noise_BR[:, 1:] = noise_BR[:, 1:] & ~noise_BR[:, :-1]
        before_noise_BR = np.zeros_like(noise_BR)  # the last kept token of each kept span
        before_noise_BR[:, :-1] = first_noise_BR[:, 1:]
        rows_B1 = np.arange(B)[:, None]
        span_S = np.arange(S)

        # Input: kept tokens plus the first token of each noise span, which then becomes its sentinel.
        input_ids = np.full((B, self.inputs_length), self.pad_token_id, dtype=np.int32)
        input_ids[:, :I] = ids_BR[~noise_BR | first_noise_BR].reshape(B, I)
        input_ids[rows_B1, kept_BS[:, 1:] + span_S] = self._sentinels_S  # sentinel k after kept span k
        input_ids[:, I] = self.eos_token_id

        # Target: the last kept token before each noise span (a slot for its sentinel) plus noise tokens.
        labels = np.empty((B, self.targets_length), dtype=np.int32)
        labels[:, :T] = ids_BR[noise_BR | before_noise_BR].reshape(B, T)
        labels[rows_B1, noise_BS[:, :S] + span_S] = self._sentinels_S  # sentinel k before noise span k
        labels[:, T] = self.eos_token_id

        decoder_input_ids = np.empty_like(labels)
        decoder_input_ids[:, 0] = self.decoder_start_token_id
        decoder_input_ids[:, 1:] = labels[:, :-1]
        attention_mask = np.zeros((B, self.inputs_length), dtype=np.int32)
        attention_mask[:, :I + 1] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": np.ones((B, self.targets_length), dtype=np.int32),
            "label_weights": np.ones((B, self.targets_length), dtype=np.float32),
        }
