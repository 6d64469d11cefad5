"""Offline distillation's teacher: its k likeliest next tokens and their log-probabilities at every position of the
training rows, computed once (the teacher then let go) and kept on disk, so that training never holds the teacher.

    store = open_store(path, rows, k, temperature, teacher)       # None: not there (or unfinished) yet
    store = store or compute_store(path, rows, k, temperature, teacher, score)
    taught = TaughtRows(rows, store, k)       # rows_at(idx): the rows' fields + teacher_ids, teacher_logps [n, L-1, k]

A directory holds one store: manifest.json and, per shard of SHARD_ROWS rows, shard_NNNNN.ids.npy (the ids, the
smallest unsigned type that holds the vocabulary) and shard_NNNNN.logps.npy (float16: ~3 significant digits, far
below what distillation can tell apart; half the bytes of float32), both [rows, L - 1, k], position t's
distribution over token t + 1, likeliest first. It is reused by any run whose rows, teacher and temperature match
its fingerprint, with any k up to the stored one (another host, a resumed run, a rerun with other student options);
a store cut short (the run stopped) is finished by the next run, the shards it holds kept.
"""
import hashlib
import json
import os

import numpy as np
from tqdm.auto import tqdm

from flaxlm.data.rows import num_rows, take_rows
from flaxlm.errors import UserError

FORMAT = "flaxlm-teacher-top-k"
VERSION = 1
MANIFEST = "manifest.json"
SHARD_ROWS = 1024
ROW_FIELDS = ("input_ids", "segment_ids", "positions")  # what the teacher reads of a row


def rows_fingerprint(rows):
    """sha256 of the rows' tokens, segments and positions (what the teacher's distributions depend on)."""
    digest = hashlib.sha256()
    n = num_rows(rows)
    for start in range(0, n, SHARD_ROWS):
        chunk = take_rows(rows, np.arange(start, min(start + SHARD_ROWS, n)))
        for name in ROW_FIELDS:
            digest.update(np.ascontiguousarray(chunk[name], dtype=np.int32).tobytes())
    return digest.hexdigest()


def teacher_identity(path):
    """What names a teacher: its path and a hash of its config.json and of its weight files' names and sizes."""
    digest = hashlib.sha256(os.path.abspath(path).encode() if os.path.isdir(path) else path.encode())
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            if name == "config.json" or name.endswith((".safetensors", ".safetensors.index.json")):
                digest.update(f"{name}:{os.path.getsize(os.path.join(path, name))}".encode())
                if name == "config.json":
                    with open(os.path.join(path, name), "rb") as f:
                        digest.update(f.read())
    return digest.hexdigest()


def _shard_path(path, s, what):
    return os.path.join(path, f"shard_{s:05d}.{what}.npy")


def _expected(rows, k, temperature, teacher, vocab_size):
    length = take_rows(rows, np.arange(1))["input_ids"].shape[1]
    return {"format": FORMAT, "version": VERSION, "rows": num_rows(rows), "length": int(length), "k": int(k),
            "temperature": float(temperature), "teacher": teacher, "rows_fingerprint": rows_fingerprint(rows),
            "shard_rows": SHARD_ROWS, "vocab_size": int(vocab_size), "ids_dtype": _ids_dtype(vocab_size).str}


def _ids_dtype(vocab_size):
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def open_store(path, rows, k, temperature, teacher, vocab_size):
    """The finished store in `path` for these rows, this teacher (teacher_identity) and temperature with at least k
    tokens per position: {"manifest", "ids", "logps"} (lists of memory-mapped shards); None where `path` holds none
    or an unfinished one of them. A store of other rows, another teacher or temperature, or a smaller k is a
    UserError: pass another directory, or the options it was made with."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.exists(manifest_path):
        return None
    try:
        with open(manifest_path) as f:
            found = json.load(f)
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:  # ValueError: json's decoding errors, UnicodeDecodeError
        raise damaged(path, manifest_path, f"is not a store's manifest ({e})") from None
    want = _expected(rows, k, temperature, teacher, vocab_size)
    differ = [name for name in ("format", "version", "rows", "length", "temperature", "teacher", "rows_fingerprint",
                                "vocab_size")
              if found.get(name) != want[name]]
    if found.get("k", 0) < k:
        differ.append(f"k ({found.get('k')} stored, {k} asked)")
    if differ:
        raise UserError(f"--teacher_logits {path} holds the top-k of other {', '.join(differ)}; pass an empty "
                        f"directory (or none: OUTPUT_DIR/teacher_logits), or the options it was computed with")
    return _mapped(path, found) if found.get("complete") else None


def _mapped(path, manifest):
    """open_store's view of the finished store `manifest` describes: its shards memory-mapped, each checked."""
    shards = range(-(-manifest["rows"] // manifest["shard_rows"]))
    return {"manifest": manifest, "ids": [_open_shard(path, manifest, s, "ids") for s in shards],
            "logps": [_open_shard(path, manifest, s, "logps") for s in shards]}


def _shard_layout(manifest, s, what):
    """(shape, dtype) the manifest gives shard s's `what` ("ids" or "logps")."""
    rows = min(manifest["shard_rows"], manifest["rows"] - s * manifest["shard_rows"])
    dtype = np.dtype(manifest["ids_dtype"]) if what == "ids" else np.dtype(np.float16)
    return (rows, manifest["length"] - 1, manifest["k"]), dtype


def _open_shard(path, manifest, s, what):
    """Shard s's `what`, memory-mapped: UserError (damaged) when it is missing, cut short, not a .npy file, or of
    another shape or type than the manifest says (a shard of another store)."""
    file = _shard_path(path, s, what)
    shape, dtype = _shard_layout(manifest, s, what)
    try:
        array = np.load(file, mmap_mode="r")
    except FileNotFoundError:
        raise damaged(path, file, "is missing") from None
    except (OSError, ValueError) as e:  # numpy: "mmap length is greater than file size", not a .npy header
        raise damaged(path, file, f"cannot be read ({str(e).strip() or type(e).__name__})") from None
    if array.shape != shape or array.dtype != dtype:
        raise damaged(path, file, f"holds {array.dtype} {list(array.shape)} where the manifest says {dtype} "
                                  f"{list(shape)}")
    return array


def damaged(path, file, what):
    """The UserError of a store whose file `file` is damaged; nothing in it is touched."""
    return UserError(f"the teacher store {path} is damaged: {file} {what}; delete {path} (or pass another "
                     f"--teacher_logits) to compute it again")


def compute_store(path, rows, k, temperature, teacher, vocab_size, score, is_main=True):
    """Compute the store of `rows` into `path` (the shards already there from an interrupted run of the same
    fingerprint kept), shard by shard: score(rows dict) -> (ids [n, L - 1, k], logps [n, L - 1, k]) on all devices
    (every process calls it; process 0 writes). Returns open_store's view of it."""
    manifest = _expected(rows, k, temperature, teacher, vocab_size)
    n = manifest["rows"]
    shards = range(-(-n // SHARD_ROWS))
    # an earlier run of these rows wrote these (every process sees the same directory): each whole, or refused
    done = {s for s in shards if all(os.path.exists(_shard_path(path, s, what)) for what in ("ids", "logps"))}
    for s in done:
        _open_shard(path, manifest, s, "ids"), _open_shard(path, manifest, s, "logps")
    if is_main:
        os.makedirs(path, exist_ok=True)
        _write_json(os.path.join(path, MANIFEST), {**manifest, "complete": False})
    for s in tqdm(shards, desc="teacher top-k", unit="shard"):
        if s in done:
            continue
        chunk = take_rows(rows, np.arange(s * SHARD_ROWS, min((s + 1) * SHARD_ROWS, n)))
        ids, logps = score({name: chunk[name] for name in ROW_FIELDS})
        if is_main:
            _write_npy(_shard_path(path, s, "logps"), logps.astype(np.float16))
            _write_npy(_shard_path(path, s, "ids"), ids.astype(manifest["ids_dtype"]))
    manifest["complete"] = True
    if is_main:
        _write_json(os.path.join(path, MANIFEST), manifest)
    return _mapped(path, manifest)  # (the rows hashed once: their fingerprint is in `manifest`)


def store_bytes(path):
    """The bytes the store's shards take on disk."""
    return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path) if name.endswith(".npy"))


class TaughtRows:
    """Training rows with the teacher's top k of each: rows_at(idx) -> the rows' fields plus teacher_ids (int32) and
    teacher_logps (float32), [n, L - 1, k] (the first k of the stored ones). Reads only the shards idx falls in."""

    def __init__(self, rows, store, k):
        self.rows, self.store, self.k = rows, store, k
        self.shard_rows = store["manifest"]["shard_rows"]

    def __len__(self):
        return num_rows(self.rows)

    def rows_at(self, idx):
        idx = np.asarray(idx)
        out = dict(take_rows(self.rows, idx))
        shard, within = np.divmod(idx, self.shard_rows)
        out["teacher_ids"] = np.stack([self.store["ids"][s][i, :, :self.k] for s, i in zip(shard, within)]
                                      ).astype(np.int32)
        out["teacher_logps"] = np.stack([self.store["logps"][s][i, :, :self.k] for s, i in zip(shard, within)]
                                        ).astype(np.float32)
        return out


def _write_npy(path, array):
    tmp = path + ".tmp.npy"
    np.save(tmp, array)
    os.replace(tmp, path)


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)
