"""Sequences of different lengths laid into rows of a fixed length L (--line_by_line, packed by default).

    row_S, start_S = greedy_pack(lengths_S, L)   # the row of each sequence and where in it the sequence starts
    ids_NL, segment_ids_NL = fill_rows(seqs, row_S, start_S, L, pad_id)

Greedy in order: the next sequence goes into the current row if it fits, else it starts a new row. So the
sequences keep their order (row by row, left to right), no row holds more than L tokens, and the result is
the same on every run. Segment ids number the sequences of a row 1, 2, 3, ...; 0 marks padding. The encoder
lets each token attend only within its segment and restarts positions at each one (flaxlm.models.bert), so a
sequence in a packed row gets the result it would get alone in a padded row.

What it saves: on NoReC's dev text (132,518 non-blank lines, 3.06M tokens with a 32k byte-level BPE trained
on it), rows of 128 tokens fall from 132,518 (one per line, 82.0% padding) to 27,098 (11.9% padding): the
same tokens in 4.9x fewer rows, so about 4.9x less compute per epoch.
"""
import itertools

import numpy as np


def one_per_row(n):
    """(row_S, start_S) of n sequences each alone at the start of its own row (the unpacked layout)."""
    return np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)


def greedy_pack(lengths_S, max_len):
    """(row_S, start_S): the row each sequence goes to and its first column there, filling rows greedily in
    order. Every length must be at most max_len (lines are truncated to it before packing)."""
    lengths_S = np.asarray(lengths_S, dtype=np.int64)
    if lengths_S.size and lengths_S.max() > max_len:
        raise ValueError(f"a sequence of {lengths_S.max()} tokens does not fit rows of {max_len}")
    row_S = np.empty_like(lengths_S)
    start_S = np.empty_like(lengths_S)
    row, used = 0, 0
    for s, n in enumerate(lengths_S.tolist()):  # sequential by nature: where one row ends depends on the last
        if used + n > max_len:
            row, used = row + 1, 0
        row_S[s], start_S[s] = row, used
        used += n
    return row_S, start_S


def fill_rows(seqs, row_S, start_S, max_len, pad_id):
    """(ids_NL, segment_ids_NL), int32 [N, L] each: the token lists `seqs` written where row_S / start_S place
    them (rows in ascending order, as greedy_pack and one_per_row give them), pad_id and segment 0 elsewhere."""
    lengths_S = np.fromiter(map(len, seqs), np.int64, len(seqs))
    n_rows = int(row_S[-1]) + 1 if len(seqs) else 0
    ids_NL = np.full((n_rows, max_len), pad_id, dtype=np.int32)
    segment_ids_NL = np.zeros((n_rows, max_len), dtype=np.int32)
    if not len(seqs):
        return ids_NL, segment_ids_NL
    seq_T = np.repeat(np.arange(len(seqs)), lengths_S)  # the sequence of each token
    offset_T = np.arange(len(seq_T)) - np.repeat(np.cumsum(lengths_S) - lengths_S, lengths_S)
    row_T, col_T = row_S[seq_T], start_S[seq_T] + offset_T
    ids_NL[row_T, col_T] = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, len(seq_T))
    segment_S = np.arange(len(seqs)) - np.searchsorted(row_S, row_S) + 1  # 1 + index among its row's sequences
    segment_ids_NL[row_T, col_T] = segment_S[seq_T]
    return ids_NL, segment_ids_NL
