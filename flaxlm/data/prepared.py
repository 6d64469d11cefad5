"""Prepared rows: token rows made once by prepare_data.py, read by any later run with --prepared_data DIR.

    data = prepared.load_rows(DIR, tokenizer, "blocks", 512)   # {"train": PreparedRows, "validation": ...}
    rows_NL = data["train"].take(idx)                           # int32 [len(idx), 512], read from disk

DIR holds:
  manifest.json                   what made the rows (tokenizer, row function and length, options, source files
                                  with sizes and mtimes) and every shard of every split, in order
  <split>-<job>-<part>.<column>   raw rows [n, L] of the smallest unsigned type that holds the vocabulary
                                  (uint16 up to 65,536 tokens, else uint32), little-endian, no header
  <split>-<job>-<part>.json       a finished shard (written after its data): rows, CRC-32 of each column,
                                  the text it covers

The columns are input_ids, and for packed lines (--line_by_line) segment_ids too. Rows are memory-mapped
(np.memmap) and only the rows of a batch are read, converted to int32 on the way (take). Opening checks that
the rows were made with this run's tokenizer, row function and length, and that every shard has its size and
checksum: a mismatch or a damaged shard is a UserError naming it, before any training.
"""
import json
import os
import zlib

import numpy as np

from flaxlm.data.fingerprint import fingerprint
from flaxlm.errors import UserError

FORMAT = "flaxlm prepared rows"
VERSION = 1
MANIFEST = "manifest.json"
CHECK_CHUNK = 64 << 20  # bytes read at a time for a checksum


def row_dtype(vocab_size):
    """The smallest unsigned integer type that holds every id of a vocabulary of vocab_size tokens."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def tokenizer_identity(tokenizer, name):
    """What a manifest records of the tokenizer: a hash of its tokenizer.json and special tokens (the rows'
    cache key, flaxlm.data.fingerprint), its size, special ids and the name it was loaded by."""
    special = {k: getattr(tokenizer, f"{k}_token_id", None) for k in ("pad", "eos", "bos", "unk", "mask", "cls", "sep")}
    return {"name": name, "hash": fingerprint(tokenizer)[:16], "vocab_size": len(tokenizer),
            "special_ids": {k: v for k, v in special.items() if v is not None}}


def shard_checksum(path):
    """CRC-32 of a file, read in chunks."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHECK_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def shard_problem(directory, shard, length, dtype, columns, verify=True):
    """Why a shard's files do not hold what its record says (missing, another size, another checksum), or None."""
    for column in columns:
        path = os.path.join(directory, f"{shard['name']}.{column}")
        if not os.path.isfile(path):
            return f"{path} is missing"
        want = shard["rows"] * length * dtype.itemsize
        if os.path.getsize(path) != want:
            return f"{path} has {os.path.getsize(path)} bytes, not the {want} of its {shard['rows']} rows (truncated?)"
        if verify and shard_checksum(path) != shard["crc32"][column]:
            return f"{path} does not match its checksum (damaged)"
    return None


class PreparedRows:
    """One split's rows in a prepared directory: len() rows of `length` tokens (the first `limit` only, for
    --max_train_samples / --max_eval_samples); take(idx) reads them as int32 [len(idx), length] (or {column: that}
    for packed lines), any order, from the shards' memory maps."""

    def __init__(self, directory, shards, length, dtype, columns, limit=None):
        self.directory, self.shards, self.length, self.columns = directory, shards, length, columns
        counts = np.array([s["rows"] for s in shards], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_rows = int(self.starts[-1]) if limit is None else min(limit, int(self.starts[-1]))
        self.maps = [{c: np.memmap(os.path.join(directory, f"{s['name']}.{c}"), dtype=dtype, mode="r",
                                   shape=(s["rows"], length)) for c in columns} if s["rows"] else None
                     for s in shards]

    def __len__(self):
        return self.num_rows

    def take(self, idx):
        """Rows idx (ints in [0, len)) as int32."""
        idx = np.asarray(idx, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_rows):
            raise IndexError(f"row index out of range for {self.num_rows} rows")
        shard_I = np.searchsorted(self.starts, idx, side="right") - 1
        out = {c: np.empty((len(idx), self.length), np.int32) for c in self.columns}
        for s in np.unique(shard_I):
            sel = shard_I == s
            for c in self.columns:
                out[c][sel] = self.maps[s][c][idx[sel] - self.starts[s]]
        return out if len(self.columns) > 1 else out["input_ids"]


def read_manifest(directory):
    """DIR's manifest (a UserError when DIR holds no finished preparation)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        hint = (" (its preparation did not finish: run prepare_data.py again with the same options to complete it)"
                if os.path.isdir(directory) else "")
        raise UserError(f"--prepared_data {directory} holds no {MANIFEST}{hint}; pass a directory prepare_data.py made")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not readable JSON ({e}); prepare the data again") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise UserError(f"{path} is not a manifest of {FORMAT} version {VERSION}; prepare the data again "
                        f"with this prepare_data.py")
    return manifest


def check_made_for(manifest, directory, tokenizer, function, length):
    """UserError unless the rows were made by `function` (blocks, documents, lines) in rows of `length` with this
    tokenizer; the message names what the directory has and what this run has."""
    made = manifest["rows"]
    theirs, ours = manifest["tokenizer"], tokenizer_identity(tokenizer, None)
    if (theirs["hash"], theirs["vocab_size"]) != (ours["hash"], ours["vocab_size"]):
        raise UserError(f"--prepared_data {directory} was made with another tokenizer ({theirs['name']}: "
                        f"{theirs['vocab_size']} tokens, hash {theirs['hash']}) than this run's ({ours['vocab_size']} "
                        f"tokens, hash {ours['hash']}); pass the tokenizer it was made with, or prepare the data "
                        f"again with this one")
    if made["length"] != length:
        raise UserError(f"--prepared_data {directory} holds rows of {made['length']} tokens but this run makes rows "
                        f"of {length}; pass the length it was made with (--max_seq_length / --block_size) or "
                        f"prepare the data again")
    if made["function"] != function:
        raise UserError(f"--prepared_data {directory} holds rows made by '{made['function']}' but this run makes "
                        f"'{function}' rows; prepare the data with this script's --objective (and --line_by_line "
                        f"as this run has it)")


def load_rows(directory, tokenizer, function, length, *, source, data_args, include_test=False, verify=True):
    """{split: PreparedRows} of a prepared directory after check_made_for and every shard's check (sizes, and
    with verify the checksums: about a second per GB); --max_train_samples / --max_eval_samples (data_args) keep
    the first rows of a split. source: the run's text options, which must name no text besides."""
    if source.train_file or source.dataset_name or source.validation_file or source.test_file:
        raise UserError("pass either --prepared_data or text (--train_file, --validation_file, --test_file, "
                        "--dataset_name), not both: the prepared directory holds every split")
    max_train_samples, max_eval_samples = data_args.max_train_samples, data_args.max_eval_samples
    manifest = read_manifest(directory)
    check_made_for(manifest, directory, tokenizer, function, length)
    dtype, columns = np.dtype(manifest["rows"]["dtype"]), manifest["rows"]["columns"]
    limits = {"train": max_train_samples, "validation": max_eval_samples, "test": max_eval_samples}
    out = {}
    for split, shards in manifest["splits"].items():
        for shard in shards:
            problem = shard_problem(directory, shard, length, dtype, columns, verify)
            if problem:
                raise UserError(f"the prepared shard {problem}; prepare the data again (prepare_data.py with the "
                                f"same options remakes what is damaged)")
        out[split] = PreparedRows(directory, shards, length, dtype, columns, limits.get(split))
        if len(out[split]) == 0:
            raise UserError(f"--prepared_data {directory} has no {split} rows of {length} tokens; prepare more text")
    if "train" not in out:
        raise UserError(f"--prepared_data {directory} has no train split; prepare it with --train_file")
    if include_test and "test" not in out:
        raise UserError(f"--do_predict evaluates test rows but --prepared_data {directory} has none; prepare it "
                        f"with --test_file")
    if not include_test:
        out.pop("test", None)
    return out
