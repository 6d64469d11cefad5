"""Prepared rows: token rows made once by prepare_data.py, read by any later run with --prepared_data DIR.

    data = prepared.load_rows([DIR], tokenizer, "blocks", 512, source=src, data_args=data_args)
    rows_NL = data["train"].rows_at(idx)     # int32 [len(idx), 512], read from disk; data["validation"] alike

DIR holds:
  manifest.json                   what made the rows (tokenizer, row function and length, options, source files
                                  with sizes and mtimes) and every shard of every split, in order
  <split>-<job>-<part>.<column>   raw rows [n, L] of the smallest unsigned type that holds the vocabulary
                                  (uint16 up to 65,536 tokens, else uint32), little-endian, no header
  <split>-<job>-<part>.json       a finished shard (written after its data): rows, CRC-32 of each column,
                                  the text it covers
  lines-train-<job>.json          .txt files with a held-out validation split: the lines of each job's range
                                  (which lines are held out depends on every line's index)

The columns are input_ids, and for packed lines (--line_by_line) segment_ids too. Rows are memory-mapped
(np.memmap) and only the rows of a batch are read, converted to int32 on the way (rows_at). Opening checks that
the rows were made with this run's tokenizer, row function and length, and that every shard has its size and
checksum: a mismatch or a damaged shard is a UserError naming it, before any training.
"""
import functools
import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from flaxlm.data.fingerprint import fingerprint
from flaxlm.data.mixture import Mixture, unique_names
from flaxlm.errors import UserError

FORMAT = "flaxlm prepared rows"
VERSION = 1
MANIFEST = "manifest.json"
CHECK_CHUNK = 64 << 20  # bytes read at a time for a checksum
CHECK_THREADS = min(16, os.cpu_count() or 1)  # shard files checksummed at once (zlib.crc32 releases the GIL)


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
    return checksum_problem(directory, shard, columns) if verify else None


def checksum_problem(directory, shard, columns):
    """Which of a shard's files does not match its recorded CRC-32 (damaged), or None: every byte read."""
    for column in columns:
        path = os.path.join(directory, f"{shard['name']}.{column}")
        if shard_checksum(path) != shard["crc32"][column]:
            return f"{path} does not match its checksum (damaged)"
    return None


class PreparedRows:
    """One split's rows in prepared directories: len() rows of `length` tokens (the first `limit` only, for
    --max_train_samples / --max_eval_samples); rows_at(idx) reads them as int32 [len(idx), length] (or {column: that}
    for packed lines), any order, from the shards' memory maps. shards: (directory, record) pairs, in order."""

    def __init__(self, shards, length, dtype, columns, limit=None):
        self.shards, self.length, self.columns = shards, length, columns
        counts = np.array([s["rows"] for _, s in shards], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_rows = int(self.starts[-1]) if limit is None else min(limit, int(self.starts[-1]))
        self.maps = [{c: np.memmap(os.path.join(d, f"{s['name']}.{c}"), dtype=dtype, mode="r",
                                   shape=(s["rows"], length)) for c in columns} if s["rows"] else None
                     for d, s in shards]

    def __len__(self):
        return self.num_rows

    def rows_at(self, idx):
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


def check_made_for(manifest, directory, tokenizer, function, length, keep_linebreaks=None):
    """UserError unless the rows were made by `function` (blocks, documents, lines) in rows of `length` with this
    tokenizer (and, when not None, with the causal-LM script's keep_linebreaks); the message names what the
    directory has and what this run has."""
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
    if keep_linebreaks is not None and made.get("keep_linebreaks", keep_linebreaks) != keep_linebreaks:
        raise UserError(f"--prepared_data {directory} holds documents made with --keep_linebreaks "
                        f"{made['keep_linebreaks']} but this run has --keep_linebreaks {keep_linebreaks}; pass "
                        f"--keep_linebreaks {made['keep_linebreaks']}, or prepare the data again")


def load_rows(directories, tokenizer, function, length, *, source, data_args, weights=None, include_test=False,
              verify=True, keep_linebreaks=None):
    """{split: rows} of prepared directories after check_made_for and every shard's check (sizes, and with verify
    the checksums: about a second per GB). One directory: PreparedRows of each split; several: their training
    rows mixed by `weights` (default: in proportion to their rows; flaxlm.data.mixture), their validation and test
    rows all evaluated. --max_train_samples / --max_eval_samples (data_args) keep the first rows of a split.
    source: the run's text options, which must name no text besides. keep_linebreaks: the causal-LM script's, checked
    against the manifest's."""
    if source.train_file or source.dataset_name or source.validation_file or source.test_file:
        raise UserError("pass either --prepared_data or text (--train_file, --validation_file, --test_file, "
                        "--dataset_name), not both: the prepared directory holds every split")
    directories = [directories] if isinstance(directories, str) else list(directories)
    if weights and len(directories) == 1:
        raise UserError("--prepared_data_weights weighs several --prepared_data directories; pass them, or drop it")
    splits = _checked_splits(directories, tokenizer, function, length, verify, keep_linebreaks)
    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
              "test": data_args.max_eval_samples}
    make = functools.partial(PreparedRows, length=length, dtype=splits.pop("dtype"), columns=splits.pop("columns"))
    out = {split: make(shards, limit=limits.get(split)) for split, shards in splits.items() if split != "train"}
    trains = [make([(d, s) for s in per_dir], limit=limits["train"]) for d, per_dir in splits["train"]]
    for (d, _), rows in zip(splits["train"], trains):
        if len(rows) == 0:
            raise UserError(f"--prepared_data {d} has no train rows of {length} tokens; prepare more text")
    names = unique_names([os.path.basename(os.path.normpath(d)) for d in directories])
    out["train"] = trains[0] if len(trains) == 1 else Mixture(
        trains, weights or [len(t) for t in trains], names, "--prepared_data_weights", "--prepared_data")
    if include_test and "test" not in out:
        raise UserError(f"--do_predict evaluates test rows but --prepared_data {' '.join(directories)} has none; "
                        f"prepare it with --test_file")
    if not include_test:
        out.pop("test", None)
    return out


def _checked_splits(directories, tokenizer, function, length, verify, keep_linebreaks):
    """{"train": [(dir, [records])], "validation"/"test": [(dir, record), ...] of all directories, "dtype",
    "columns"} once every directory and shard has passed its checks: first every shard's size, then (verify) every
    shard's checksum, several files at once; the first damaged shard in order is the one named."""
    out, shards_of_all = {"train": []}, []
    for d in directories:
        manifest = read_manifest(d)
        check_made_for(manifest, d, tokenizer, function, length, keep_linebreaks)
        kind = (np.dtype(manifest["rows"]["dtype"]), manifest["rows"]["columns"])
        if out.setdefault("dtype", kind[0]) != kind[0] or out.setdefault("columns", kind[1]) != kind[1]:
            raise UserError(f"--prepared_data {d} holds rows of another kind ({kind[1]}) than {directories[0]}; "
                            f"prepare them alike")
        if "train" not in manifest["splits"]:
            raise UserError(f"--prepared_data {d} has no train split; prepare it with --train_file")
        for split, shards in manifest["splits"].items():
            for shard in shards:
                _refuse_damaged(shard_problem(d, shard, length, kind[0], kind[1], verify=False))
            shards_of_all += [(d, shard) for shard in shards]
            if split == "train":
                out["train"].append((d, shards))
            else:
                out.setdefault(split, []).extend((d, s) for s in shards)
    if verify:  # every byte read: at tens of GB the one slow part of a start, so in threads
        pool = ThreadPoolExecutor(CHECK_THREADS)
        try:
            for problem in pool.map(lambda ds: checksum_problem(*ds, out["columns"]), shards_of_all):
                _refuse_damaged(problem)
        finally:
            pool.shutdown(cancel_futures=True)  # a damaged shard: the later ones left unread
    return out


def _refuse_damaged(problem):
    if problem:
        raise UserError(f"the prepared shard {problem}; prepare the data again (prepare_data.py with the same "
                        f"options remakes what is damaged)")
