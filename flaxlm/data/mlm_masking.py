"""BERT masking for masked-LM pretraining: vectorized numpy, deterministic under a seed.

Rules (those of BERT's create_pretraining_data.py, applied per row):
- maskable positions are those holding neither a special token nor padding; n = their count. Packed
  rows (several sequences per row, flaxlm.data.packing) are masked as one row: the special tokens that frame
  each sequence and the padding (segment 0) are never chosen, and each token's chance stays the same.
- exactly k = round(mlm_probability * n) of them are chosen (at least 1 when n > 0), uniformly at
  random without replacement.
- each chosen position, independently: 80% becomes the mask token, 10% a random token drawn
  uniformly from the non-special vocabulary, 10% keeps its token. It is predicted in all three cases.

Since k <= P = max(1, ceil(mlm_probability * seq_len)) for every row, each row has a static number P of
prediction slots and the LM head runs on P positions per row instead of all L. Slots hold the chosen
positions in ascending order, then empty slots (position 0, label 0, weight 0).

How: every position gets a random uint32 key: bit 31 set for non-maskable positions (so they sort
last), random bits above and the position itself in the low bits (keys are unique, and the position
can be read back). One fast value sort per row puts a random order of the maskable positions first;
the first k are chosen. Ties in the random bits (probability 2**-(31 - log2 L) per pair, e.g. 2**-22
at L=512) go to the lower position, a negligible bias.
"""
import math

import numpy as np

from flaxlm.errors import UserError

_BITGEN_64 = (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64)  # 64 random bits a draw


class MLMMasker:
    """Masks batches of token ids [B, L]; see the module docstring for the rules."""

    def __init__(self, *, seq_len, vocab_size, mask_token_id, pad_token_id, special_token_ids=(),
                 mlm_probability=0.15):
        if not 0.0 < mlm_probability < 1.0:
            raise UserError(f"mlm_probability must be between 0 and 1 (exclusive), got {mlm_probability}")
        if mask_token_id is None:
            raise UserError("masked-LM training needs a mask token, but the tokenizer has none; "
                            "train one with train_tokenizer.py or pick a masked-LM tokenizer")
        if not 0 <= mask_token_id < vocab_size:
            raise UserError(f"mask token id {mask_token_id} is outside the vocabulary of {vocab_size} tokens")
        if not 1 <= seq_len < 2**20:
            raise ValueError(f"seq_len must be in [1, 2**20), got {seq_len}")
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.mask_token_id = int(mask_token_id)
        self.pad_token_id = None if pad_token_id is None else int(pad_token_id)
        self.mlm_probability = float(mlm_probability)
        self.num_predictions = max(1, math.ceil(mlm_probability * seq_len))  # P

        specials = {int(i) for i in special_token_ids} | {self.mask_token_id}
        if self.pad_token_id is not None:
            specials.add(self.pad_token_id)
        table_size = max(vocab_size, max(specials) + 1)
        self._maskable_V = np.ones(table_size, dtype=bool)
        self._maskable_V[list(specials)] = False
        self._random_tokens = np.flatnonzero(self._maskable_V[:vocab_size]).astype(np.int32)
        if self._random_tokens.size == 0:
            raise UserError("the vocabulary has only special tokens; nothing to predict")

        self._pos_bits = max(1, (seq_len - 1).bit_length())
        self._pos_mask = np.uint32((1 << self._pos_bits) - 1)
        self._pos_L = np.arange(seq_len, dtype=np.uint32)

    @classmethod
    def from_tokenizer(cls, tokenizer, seq_len, mlm_probability=0.15, **masker_args):
        """A masker for a Hugging Face tokenizer (masker_args: a subclass's own); UserError when it has no mask
        token."""
        if tokenizer.mask_token_id is None:
            where = getattr(tokenizer, "name_or_path", "") or "(in memory)"
            raise UserError(f"tokenizer at {where} has no mask token; train it with train_tokenizer.py "
                            f"or pick a masked-LM tokenizer")
        return cls(seq_len=seq_len, vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                   pad_token_id=tokenizer.pad_token_id, special_token_ids=tokenizer.all_special_ids,
                   mlm_probability=mlm_probability, **masker_args)

    def _random_u32(self, rng, shape):
        """Uniform uint32 bits, drawn as raw 64-bit words (the cheapest draw numpy offers)."""
        if not isinstance(rng.bit_generator, _BITGEN_64):
            return rng.integers(0, 2**32, shape, dtype=np.uint32)
        n = math.prod(shape)
        return rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n].reshape(shape)

    def __call__(self, rows, rng):
        """Mask rows with rng (np.random.Generator); returns a dict of arrays. rows: token ids [B, L]
        (L == seq_len), or packed rows {"input_ids": [B, L], "segment_ids": [B, L]}, whose segment ids then
        come along in the batch (the encoder keeps each sequence to itself) and mark the padding."""
        segment_ids_BL = None
        if isinstance(rows, dict):
            rows, segment_ids_BL = rows["input_ids"], np.asarray(rows["segment_ids"], dtype=np.int32)
        ids_BL = np.asarray(rows, dtype=np.int32)
        if ids_BL.ndim != 2 or ids_BL.shape[1] != self.seq_len:
            raise ValueError(f"expected token ids of shape [batch, {self.seq_len}], got {ids_BL.shape}")
        maskable_BL = np.take(self._maskable_V, ids_BL)
        if segment_ids_BL is not None:
            maskable_BL &= segment_ids_BL > 0
        pos_BP, real_BP, unpredicted = self._choose(ids_BL, maskable_BL, segment_ids_BL, rng)
        return self._corrupt(ids_BL, segment_ids_BL, pos_BP, real_BP, unpredicted, rng)

    def _choose(self, ids_BL, maskable_BL, segment_ids_BL, rng):
        """The chosen positions [B, P], ascending in the first k slots of each row (0 after them), which slots are
        real [B, P], and the positions masked without a slot ((rows, positions), or None: here there are none):
        k = round(mlm_probability * n) uniformly drawn maskable positions."""
        L, P = self.seq_len, self.num_predictions
        n_B = maskable_BL.sum(axis=1, dtype=np.int32)
        k_B = np.where(n_B > 0, np.maximum(1, np.rint(self.mlm_probability * n_B)), 0).astype(np.int32)
        cand_BP = self._shuffle(maskable_BL, rng)[:, :P]
        real_BP = np.arange(P, dtype=np.int32) < k_B[:, None]
        pos_BP = np.sort(np.where(real_BP, cand_BP, L), axis=1)
        return np.where(real_BP, pos_BP, 0).astype(np.int32), real_BP, None

    def _shuffle(self, candidate_BL, rng, group_BL=None):
        """Each row's positions [B, L] int32: its candidate positions in a uniformly random order, then the
        others (in ascending order). group_BL [B, L] (optional): each position's group, numbered in [0, L] within
        its row; a group's positions then share their random bits and stay together, in ascending order."""
        key_BL = self._random_u32(rng, candidate_BL.shape)
        if group_BL is not None:
            rows_B1 = np.arange(0, key_BL.size, key_BL.shape[1], dtype=group_BL.dtype)[:, None]
            key_BL = np.take(key_BL.ravel(), group_BL + rows_B1, mode="wrap")  # group L of the last row: row 0's
        key_BL >>= np.uint32(1)  # bit 31 clear
        key_BL &= ~self._pos_mask
        key_BL |= self._pos_L
        key_BL |= np.left_shift(~candidate_BL, 31, dtype=np.uint32)
        key_BL.sort(axis=1)
        key_BL &= self._pos_mask
        return key_BL.view(np.int32)

    def _corrupt(self, ids_BL, segment_ids_BL, pos_BP, real_BP, unpredicted, rng):
        """The batch: at each real slot's position, 80% the mask token, 10% a random non-special token, 10%
        unchanged, and the mask token at the unpredicted positions; the labels and weights of the slots; the
        attention mask (and the segment ids of packed rows)."""
        B, P = pos_BP.shape
        labels_BP = np.where(real_BP, np.take_along_axis(ids_BL, pos_BP, axis=1), 0).astype(np.int32)
        u_BP = rng.random((B, P), dtype=np.float32)
        random_BP = self._random_tokens[rng.integers(0, self._random_tokens.size, (B, P), dtype=np.int32)]
        new_BP = np.where(u_BP < 0.8, np.int32(self.mask_token_id), np.where(u_BP < 0.9, random_BP, labels_BP))

        input_ids_BL = ids_BL.copy()
        rows_BP = np.broadcast_to(np.arange(B)[:, None], (B, P))
        input_ids_BL[rows_BP[real_BP], pos_BP[real_BP]] = new_BP[real_BP]
        if unpredicted is not None:
            input_ids_BL[unpredicted] = self.mask_token_id

        if segment_ids_BL is not None:
            attention_mask_BL = (segment_ids_BL > 0).astype(np.int32)
        elif self.pad_token_id is None:
            attention_mask_BL = np.ones(ids_BL.shape, dtype=np.int32)
        else:
            attention_mask_BL = (ids_BL != self.pad_token_id).astype(np.int32)
        batch = {
            "input_ids": input_ids_BL,
            "attention_mask": attention_mask_BL,
            "masked_positions": pos_BP,
            "masked_labels": labels_BP,
            "masked_weights": real_BP.astype(np.float32),
        }
        if segment_ids_BL is not None:
            batch["segment_ids"] = segment_ids_BL
        return batch
