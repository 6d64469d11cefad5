"""Whole-word masking (run_mlm_flax.py --whole_word_mask): BERT masking whose chosen positions are whole words.

Words. Which tokens start a word is a property of the vocabulary (flaxlm.tokenization.word_boundaries):
starts_word_V[t] (the token opens a word: no `##` in WordPiece, a leading space in byte-level BPE, a leading `▁`
in SentencePiece) and ends_word_V[t] (the token after it opens a word: a byte-level BPE token ending in a line
break or tab). A maskable position (not a special token nor padding) starts a word when its token starts one,
the token before it ends one, or it follows a non-maskable position, the start of the row or the end of a
packed sequence (a new segment id); every maskable position belongs to the word of the last start at or
before it. A word is masked whole or not at all; special tokens and padding never are.

Choice (systematic sampling of words in a random order): the row's words are put in a uniformly random order
and laid end to end on a circle of n points (n = the row's maskable positions); a window of length p * n
(p = mlm_probability) starts at a uniformly random point of the circle, and the words whose first token lies
inside it are masked. Given the order, a word's first token is a fixed point of the circle and the window's
start is uniform, so every word is masked with probability exactly p whatever its length: every token is
masked with probability p and the expected number of masked tokens is p * n (not p times the number of words;
long words neither raise nor lower it, unlike a budget of tokens filled word by word, which skips the long
words that no longer fit). The masked words follow one another on the circle: one run that covers the window
give or take a word, so a row's count stays within a word's length of p * n. One sort lays the circle out
(each position's key carries its word's random bits, so a word's positions stay together, in order) and a
binary search over the points where words begin finds the run.

Slots. The LM head predicts the masked tokens at P = ceil(p * L) + WORD_SLACK slots per row (at most L), in
ascending position order, then empty slots (position 0, label 0, weight 0); each predicted token is, as in
token masking (flaxlm.data.mlm_masking), 80% the mask token, 10% a random token, 10% unchanged. The words
inside the window hold at most p * n <= ceil(p * L) tokens, so only a last word reaching more than WORD_SLACK
tokens past the window's end (a long identifier or URL) can give a row more masked tokens than slots: the
run's tokens past the P-th are still masked, always with the mask token, but not predicted. The masked-token
rate stays p; the predicted rate falls short of it only in such rows. At p = 0.15 with 8k-token BPE and
Unigram vocabularies on English and Norwegian Wikipedia text both are 0.150 at L = 128 and 512; on Python's
documentation with a 1k-token Unigram vocabulary, whose identifiers run to 20+ pieces, 0.142 (L = 128) and
0.146 (L = 512) are predicted (bench/whole_word_masking.py). It costs about twice token masking's CPU time.
"""
import math

import numpy as np

from flaxlm.data.mlm_masking import MLMMasker

WORD_SLACK = 8  # prediction slots beyond ceil(p * L): room for the last chosen word's tokens past the window


class WholeWordMasker(MLMMasker):
    """Masks batches of token ids [B, L] by whole words; see the module docstring for the rules. starts_word_V
    and ends_word_V: bool [vocab], from flaxlm.tokenization.word_boundaries.word_boundaries(tokenizer)."""

    def __init__(self, *, starts_word_V, ends_word_V, **masker_args):
        super().__init__(**masker_args)
        table_size = self._maskable_V.size
        starts_V = _table(starts_word_V, table_size, fill=True)
        breaks_V = _table(ends_word_V, table_size, fill=False) | ~self._maskable_V  # the next token starts anew
        self._word_bits_V = starts_V.astype(np.uint8) | (breaks_V.astype(np.uint8) << 1)
        self.num_predictions = min(self.seq_len, math.ceil(self.mlm_probability * self.seq_len) + WORD_SLACK)

    def word_starts(self, ids_BL, segment_ids_BL=None):
        """Which positions start a word [B, L] bool (never a special token nor padding)."""
        maskable_BL = np.take(self._maskable_V, ids_BL)
        if segment_ids_BL is not None:
            maskable_BL &= segment_ids_BL > 0
        return self._word_starts(ids_BL, maskable_BL, segment_ids_BL)

    def _word_starts(self, ids_BL, maskable_BL, segment_ids_BL):
        bits_BL = np.take(self._word_bits_V, ids_BL)  # bit 0: starts a word; bit 1: the next token does
        bits_BL[:, 1:] |= bits_BL[:, :-1] >> 1
        bits_BL[:, 0] = 1
        starts_BL = (bits_BL & 1).view(bool) & maskable_BL
        if segment_ids_BL is not None:  # a new segment, or a token after padding
            starts_BL[:, 1:] |= maskable_BL[:, 1:] & ((segment_ids_BL[:, 1:] != segment_ids_BL[:, :-1])
                                                      | ~maskable_BL[:, :-1])
        return starts_BL

    def _choose(self, ids_BL, maskable_BL, segment_ids_BL, rng):
        """The predicted positions [B, P], ascending in the first slots of each row (0 after them), which slots
        are real [B, P], and the masked positions without a slot ((rows, positions), or None): the chosen words'."""
        B, L = ids_BL.shape
        row_B1 = np.arange(0, B * L, L, dtype=np.int32)[:, None]  # where each row begins in a flat [B * L]
        n_B1 = maskable_BL.sum(axis=1, dtype=np.int32)[:, None]
        starts_BL = self._word_starts(ids_BL, maskable_BL, segment_ids_BL)

        # The circle: the maskable positions, each word's together, the words in a random order (one sort: a
        # word's positions share its random bits). Point j of the circle is position layout_BL[:, j].
        word_BL = np.cumsum(starts_BL, axis=1, dtype=np.int32)  # each position's word, numbered from 1
        layout_BL = self._shuffle(maskable_BL, rng, group_BL=word_BL)
        opens_BL = np.take(starts_BL, layout_BL + row_B1)  # a word begins at point j

        begin_B1, count_B1 = self._window(opens_BL, n_B1[:, 0], rng)
        return self._slots(layout_BL, row_B1, begin_B1, count_B1, n_B1)

    def _window(self, opens_BL, n_B, rng):
        """The run of chosen points of each row's circle: where it begins and how many points it holds, [B, 1]
        each. The window [t, t + p * n) holds the points c, ..., c + k - 1 (mod n); the words that begin there
        are chosen. They follow one another: the run goes from the first word beginning at or after c to the
        first beginning at or after c + k (all n points when no word begins outside the window)."""
        B, L = opens_BL.shape
        t_B = rng.random(B) * n_B
        c_B = np.ceil(t_B)
        k_B = (np.ceil(t_B + self.mlm_probability * n_B) - c_B).astype(np.int32)
        c_B = np.where(c_B < n_B, c_B, 0).astype(np.int32)
        openings = np.flatnonzero(opens_BL)  # flat indices, ascending
        row_B = np.arange(0, B * L, L)

        def opening_from(s_B):
            """How far round the circle from c the first word begins at a distance of s or more (n: none)."""
            x_B = c_B + s_B
            wraps_B = x_B >= n_B
            x_B = np.where(wraps_B, x_B - n_B, x_B)
            i_B = np.minimum(np.searchsorted(openings, row_B + x_B), max(openings.size - 1, 0))
            at_B = np.where(openings.size > 0, openings[i_B] - row_B, L)  # the first point >= x where one begins
            at_B = np.where(at_B >= x_B, at_B, L)  # (in a later row: none in this one)
            ahead_B = np.where(at_B < n_B, at_B - c_B, n_B - c_B)  # none before the end: point 0 (or c itself)
            return np.where(wraps_B, np.where(at_B < c_B, at_B + n_B - c_B, n_B), ahead_B)

        first_B, after_B = opening_from(0), opening_from(k_B)
        count_B = np.where(first_B < k_B, np.where(after_B < n_B, after_B, n_B + first_B) - first_B, 0)
        return ((c_B + first_B) % np.maximum(n_B, 1))[:, None], count_B[:, None]

    def _slots(self, layout_BL, row_B1, begin_B1, count_B1, n_B1):
        """Slots for the run of count points from point begin of each row's circle (as _choose returns them)."""
        L, P = layout_BL.shape[1], self.num_predictions
        j_L = np.arange(L, dtype=np.int32)
        n1_B1 = np.maximum(n_B1, 1)
        real_BP = j_L[:P] < count_B1
        run_BP = np.take(layout_BL, (begin_B1 + j_L[:P]) % n1_B1 + row_B1)
        pos_BP = np.sort(np.where(real_BP, run_BP, L), axis=1)
        pos_BP = np.where(real_BP, pos_BP, 0).astype(np.int32)
        over = np.flatnonzero(count_B1[:, 0] > P)
        if over.size == 0:
            return pos_BP, real_BP, None
        # Rows with more masked tokens than slots: the run's points past the P-th are masked, not predicted.
        run_OL = np.take(layout_BL, (begin_B1[over] + j_L) % n1_B1[over] + row_B1[over])
        past_OL = (j_L >= P) & (j_L < count_B1[over])
        return pos_BP, real_BP, (np.broadcast_to(over[:, None], past_OL.shape)[past_OL], run_OL[past_OL])


def _table(word_V, size, fill):
    """A bool table over token ids 0..size-1: word_V, with ids beyond it (special tokens added last) `fill`."""
    word_V = np.asarray(word_V, dtype=bool)[:size]
    table_V = np.full(size, fill, dtype=bool)
    table_V[:word_V.size] = word_V
    return table_V
