"""Seq2seq data (translation, summarization): source and target texts from files or a `datasets` name, and the
token rows the training loop takes.

    pairs = load_pairs(source, "nn", "nb", 5, seed=42)                     # {split: Pairs}
    rows = token_rows(pairs, tokenizer, "translate: ", 128, 128)          # {split: dict of numpy arrays}

Files are read as flaxlm.data.text reads them (json/jsonl, csv, tsv, parquet); every example is kept, in file
order, so row i is example i of its split. Without a validation file, --validation_split_percentage % of the
training file is held out (seeded).
"""
import dataclasses

import numpy as np

from flaxlm.data.sentence_data import ROUND_WIDTH, read_splits
from flaxlm.errors import UserError


@dataclasses.dataclass
class Pairs:
    where: str  # the flag and files (or dataset) they came from, for messages
    sources: list
    targets: list


def load_pairs(source, source_column, target_column, validation_split_percentage, seed, max_train_samples=None,
               max_eval_samples=None, need_validation=True):
    """{"train", "validation": Pairs}; source: TextSourceArgs (the files or dataset). No "validation" without a
    validation set, a percentage of 0 and need_validation (--do_eval false: sentence_data.read_splits)."""
    splits, where = read_splits(source, validation_split_percentage, seed, False, max_train_samples,
                                max_eval_samples, "seq2seq fine-tuning", need_validation)
    return {split: Pairs(where[split], texts(ds, source_column, "--source_column", where[split]),
                         texts(ds, target_column, "--target_column", where[split])) for split, ds in splits.items()}


def texts(ds, column, flag, where):
    """The column's texts; a missing column, or an example without text in it, is a UserError."""
    if column not in ds.column_names:
        raise UserError(f"{where} has no column '{column}' (columns: {', '.join(ds.column_names)}); pass {flag} "
                        f"with the column that holds the text")
    values = ds[column]
    for i, v in enumerate(values):
        if not isinstance(v, str) or not v.strip():
            raise UserError(f"example {i} of {where} has no text in column '{column}' (found {v!r}); fill it in or "
                            f"drop the example")
    return list(values)


def padded(ids, width, pad_id):
    """(ids [N, W] int32 padded with pad_id, mask [N, W] int32)."""
    n = len(ids)
    real_NW = np.arange(width) < np.fromiter(map(len, ids), np.int64, n)[:, None]
    out = np.full((n, width), pad_id, np.int32)
    out[real_NW] = np.concatenate([np.asarray(x, np.int32) for x in ids]) if n else []
    return out, real_NW.astype(np.int32)


def token_rows(pairs, tokenizer, prefix, max_source_length, max_target_length):
    """{split: {"input_ids", "attention_mask": int32 [N, L], "labels", "label_mask": int32 [N, T],
    "index": int32 [N]}}: the prefixed sources and the targets (each ending in the tokenizer's EOS) truncated to
    their maximum lengths, L and T the longest over all splits rounded up to ROUND_WIDTH."""
    if tokenizer.pad_token_id is None:
        raise UserError("the tokenizer has no pad token, which seq2seq fine-tuning needs; use a T5 tokenizer")
    encoded = {split: (tokenizer([prefix + s for s in p.sources], truncation=True,
                                 max_length=max_source_length)["input_ids"],
                       tokenizer(p.targets, truncation=True, max_length=max_target_length)["input_ids"])
               for split, p in pairs.items()}

    def width(i, limit):
        longest = max(len(x) for ids in encoded.values() for x in ids[i])
        return min(limit, -(-longest // ROUND_WIDTH) * ROUND_WIDTH)

    L, T = width(0, max_source_length), width(1, max_target_length)
    out = {}
    for split, (source_ids, target_ids) in encoded.items():
        input_ids, attention_mask = padded(source_ids, L, tokenizer.pad_token_id)
        labels, label_mask = padded(target_ids, T, tokenizer.pad_token_id)
        out[split] = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
                      "label_mask": label_mask, "index": np.arange(len(source_ids), dtype=np.int32)}
    return out
