"""Text in, fixed-length token rows out (shared by the masked-LM, T5 and causal-LM scripts).

    raw = load_raw_text(src)                       # {"train": Dataset, "validation": Dataset}, column "text"
    rows = tokenize_and_group(raw, tokenizer, 512)  # {"train": Dataset}, column "input_ids", int32 [N, 512]
    x = rows["train"][idx]["input_ids"]             # numpy int32 [len(idx), 512]

With line_by_line each non-blank line is one sequence (its own special tokens, truncated to the row length);
with pack_lines too, several sequences share a row, numbered by a second column "segment_ids" (flaxlm.data.packing).

Grouped mode packs text as Hugging Face's run_mlm_flax.py does: each text is tokenized with its
special tokens (`<s> ... </s>`), a batch of 1000 texts is concatenated and cut into blocks, and the
batch's remainder (< one block) is dropped. With --streaming the same rows come lazily from a
StreamingRows object instead of a cached Dataset.

Text files must be UTF-8: a line that is not is an error naming the file and the line (and the iconv command
that fixes it), raised when reading meets it (with --streaming that may be well into training). Nothing is
skipped silently: a corpus with bad bytes is usually in another encoding, and skipping would drop it all.
"""
import contextlib
import functools
import glob
import itertools
import json
import logging
import os
import sys

import datasets
import numpy as np
from datasets.fingerprint import Hasher

from flaxlm.errors import UserError, decode_utf8_line
from flaxlm.data.packing import fill_rows, greedy_pack, one_per_row

# extension -> (datasets builder, builder options); .gz/.bz2/.xz/.zst around any of them work too
BUILDERS = {
    ".txt": ("text", {}), ".text": ("text", {}),
    ".json": ("json", {}), ".jsonl": ("json", {}),
    ".csv": ("csv", {}), ".tsv": ("csv", {"sep": "\t"}),
    ".parquet": ("parquet", {}),
}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
GROUP_BATCH = 1000  # texts concatenated per block-cutting step (Hugging Face's default map batch)
_CACHE_VERSION = 1  # bump when the row-making code changes meaning, to invalidate old caches
_TEXT_FILES = []  # (flag, files) read by the last load_raw_text: where to look when text turns out not UTF-8


# ---------------------------------------------------------------------------------------------
# raw text


def load_raw_text(src, validation_split_percentage: int = 5, seed: int = 42, keep_linebreaks: bool = False,
                  include_test: bool = False) -> dict:
    """{"train": ds, "validation": ds} from --train_file/--validation_file or --dataset_name; with
    include_test also "test" from --test_file or the dataset's test split.

    Each split is a `datasets.Dataset` (IterableDataset with src.streaming) with one column "text";
    blank texts are dropped. Without a validation set, validation_split_percentage % of train is held
    out: a seeded random choice of examples (each split keeps the original order), or with streaming
    every k-th example, k = round(100 / percentage) (no seed: the stream's size is unknown).
    A percentage of 0 means no validation split. keep_linebreaks: each line of a .txt file keeps its
    line break (the causal-LM script's default, so that concatenated lines are the original text).
    """
    if src.dataset_name and src.train_file:
        raise UserError("pass either --dataset_name or --train_file, not both")
    if not (src.dataset_name or src.train_file):
        raise UserError("no training text: pass --train_file FILE (txt, json, jsonl, csv, parquet) "
                        "or --dataset_name NAME")
    if not 0 <= validation_split_percentage < 100:
        raise UserError(f"--validation_split_percentage must be between 0 and 99, "
                        f"not {validation_split_percentage}")
    with naming_bad_bytes(fresh=True):
        return _load_splits(src, validation_split_percentage, seed, keep_linebreaks, include_test)


def _load_splits(src, validation_split_percentage, seed, keep_linebreaks, include_test):
    """load_raw_text after its checks of the options."""
    if src.dataset_name:
        where = f"dataset {src.dataset_name}"
        splits = load_hub(src)
    else:
        where = f"--train_file {', '.join(src.train_file)}"
        splits = {"train": load_files(src.train_file, "--train_file", src, keep_linebreaks)}
    if src.validation_file:
        splits["validation"] = load_files(src.validation_file, "--validation_file", src, keep_linebreaks)
    test_file = getattr(src, "test_file", None)
    if include_test and test_file:
        splits["test"] = load_files(test_file, "--test_file", src, keep_linebreaks)

    raw = {"train": _text_only(splits["train"], src, where)}
    if "validation" in splits:
        val_where = (f"--validation_file {', '.join(src.validation_file)}" if src.validation_file
                     else f"dataset {src.dataset_name}")
        raw["validation"] = _text_only(splits["validation"], src, val_where)
    elif validation_split_percentage > 0:
        raw["train"], raw["validation"] = hold_out(raw["train"], validation_split_percentage, seed, where)
    if include_test:
        if "test" not in splits:
            raise UserError(f"--do_predict evaluates test text but {where} has none; pass --test_file FILE")
        raw["test"] = _text_only(splits["test"], src, f"--test_file {', '.join(test_file)}" if test_file else where)
    return raw


def iter_texts(ds, batch_size: int = 1000):
    """Lists of strings from a raw text split (Dataset or IterableDataset), e.g. to train a tokenizer."""
    with naming_bad_bytes():  # a stream reads its files only now
        for batch in ds.iter(batch_size=batch_size):
            yield batch["text"]


@contextlib.contextmanager
def naming_bad_bytes(fresh=False):
    """Turn a UnicodeDecodeError met while reading text into a UserError naming the file and line (of the files
    load_files read since the last fresh=True: a new set of inputs starts fresh)."""
    if fresh:
        _TEXT_FILES.clear()
    try:
        yield
    except UnicodeDecodeError as e:
        raise _not_utf8_error(e) from None


def _not_utf8_error(reason):
    """A UserError naming the first line that is not UTF-8 in the text files being read (they are read again
    to find it, only after reading failed), or naming the failure itself when no such line turns up."""
    import fsspec
    for flag, files in _TEXT_FILES:
        for f in files:
            if _extension(f) == ".parquet":
                continue
            try:
                with fsspec.open(f, "rb", compression="infer") as fh:
                    for n, raw in enumerate(fh, 1):
                        decode_utf8_line(raw, f"{flag} {f}", n)
            except UserError as e:
                return e
            except Exception:  # unreadable for another reason (a damaged archive): reported as it is
                continue
    return UserError(f"the text is not UTF-8 ({_first_line(reason)}); convert the files to UTF-8 "
                     f"(e.g. iconv -f latin1 -t utf-8)")


def _is_decode_error(e):
    while e is not None:
        if isinstance(e, UnicodeDecodeError) or "utf8" in str(e).lower().replace("-", ""):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def _quiet_datasets_log():
    """`datasets` logs a file it fails to read at ERROR level before raising; our one-line error says it."""
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _file_list(files, flag):
    """Expand glob patterns (handy in yaml recipes); each must match something."""
    out = []
    for f in files:
        if glob.has_magic(f):
            matches = sorted(glob.glob(f))
            if not matches:
                raise UserError(f"{flag} {f} matches no files; check the pattern")
            out.extend(matches)
        else:
            out.append(f)
    return out


def _extension(path):
    name = path.lower()
    for c in COMPRESSIONS:
        if name.endswith(c):
            name = name[: -len(c)]
    return os.path.splitext(name)[1]


def load_files(files, flag, src, keep_linebreaks=False):
    """The files given with `flag` as one split (Dataset, or IterableDataset with --streaming), read by the
    datasets builder of their extension; remembered so that text that is not UTF-8 is named by file and line."""
    files = _file_list(files, flag)
    for f in files:
        if not os.path.exists(f):
            raise UserError(f"{flag} {f} does not exist; check the path")
        if os.path.isdir(f):
            raise UserError(f"{flag} {f} is a directory; pass the files in it, e.g. {flag} {f.rstrip('/')}/*.txt")
        if os.path.getsize(f) == 0:
            raise UserError(f"{flag} {f} is empty; pass a file that holds text")
        if _extension(f) not in BUILDERS:
            raise UserError(f"{flag} {f} has an unknown extension '{_extension(f)}'; "
                            f"use one of {', '.join(BUILDERS)}")
    exts = sorted({_extension(f) for f in files})
    if len(exts) > 1:
        raise UserError(f"{flag} mixes file types ({', '.join(exts)}); pass files of one type per split")
    builder, options = BUILDERS[exts[0]]
    if builder == "text" and keep_linebreaks:
        options = {**options, "keep_linebreaks": True}
    _TEXT_FILES.append((flag, files))
    try:
        with _quiet_datasets_log():
            return datasets.load_dataset(builder, data_files=files, split="train", cache_dir=src.cache_dir,
                                         streaming=src.streaming, **options)
    except Exception as e:  # a parse error in the user's file
        if _is_decode_error(e):
            raise _not_utf8_error(e) from None
        raise UserError(f"could not read {flag} {', '.join(files)} as {exts[0][1:]} ({_first_line(_root(e))}); "
                        f"fix the file or its extension") from None


def load_hub(src):
    """{split: dataset} of --dataset_name / --dataset_config_name through `datasets`."""
    try:
        splits = datasets.load_dataset(src.dataset_name, src.dataset_config_name, cache_dir=src.cache_dir,
                                       streaming=src.streaming)
    except Exception as e:  # offline, unknown name, missing config, ...
        raise UserError(f"could not load dataset {src.dataset_name} ({_first_line(e)}); "
                        f"check the name and your network, or pass --train_file") from None
    if "train" not in splits:
        raise UserError(f"dataset {src.dataset_name} has no 'train' split (it has {', '.join(splits)}); "
                        f"pass --train_file instead")
    return {k: splits[k] for k in ("train", "validation", "test") if k in splits}


def _first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _root(e):
    """The error under datasets' generic 'An error occurred while generating the dataset'."""
    while isinstance(e, datasets.exceptions.DatasetGenerationError) and (e.__cause__ or e.__context__):
        e = e.__cause__ or e.__context__
    return e


def column_types(ds, where):
    """{column: is_string} from the features, or from the first example when a stream has none."""
    if ds.features is not None:
        return {name: isinstance(f, datasets.Value) and f.dtype in ("string", "large_string")
                for name, f in ds.features.items()}
    first = next(iter(ds.take(1)), None)
    if first is None:
        raise UserError(f"{where} holds no examples; pass a source with text")
    return {name: isinstance(v, str) for name, v in first.items()}


def _text_only(ds, src, where):
    """Keep the text column only, named "text", without blank texts."""
    types = column_types(ds, where)
    listing = ", ".join(types) or "none"
    if src.text_column:
        column = src.text_column
        if column not in types:
            raise UserError(f"--text_column {column} is not a column of {where} (columns: {listing}); "
                            f"pass --text_column with one of them")
        if not types[column]:
            raise UserError(f"--text_column {column} of {where} does not hold strings; pass a text column")
    elif types.get("text"):
        column = "text"
    else:
        strings = [c for c, is_str in types.items() if is_str]
        if len(strings) != 1:
            raise UserError(f"cannot tell which column of {where} holds the text (columns: {listing}); "
                            f"pass --text_column")
        column = strings[0]
    ds = ds.select_columns([column])
    if column != "text":
        ds = ds.rename_column(column, "text")
    ds = ds.filter(_has_text, batched=True, **({} if src.streaming else {"desc": "Dropping blank texts"}))
    if src.streaming:
        if next(iter(ds.take(1)), None) is None:
            raise UserError(f"{where} holds no text (every line is blank); pass a source with text")
    elif len(ds) == 0:
        raise UserError(f"{where} holds no text (every line is blank); pass a source with text")
    return ds


def _has_text(batch):
    return [bool(t and t.strip()) for t in batch["text"]]


def hold_out(ds, percentage, seed, where):
    """(train, validation): seeded random examples in order, or every k-th one of a stream."""
    if isinstance(ds, datasets.IterableDataset):
        k = max(2, round(100 / percentage))
        return (ds.filter(lambda _, i: i % k != 0, with_indices=True),
                ds.filter(lambda _, i: i % k == 0, with_indices=True))
    n = len(ds)
    if n < 2:
        raise UserError(f"{where} has too little text to hold out a validation split; "
                        f"pass --validation_file or --validation_split_percentage 0")
    is_val = np.zeros(n, bool)
    n_val = min(n - 1, max(1, round(n * percentage / 100)))
    is_val[np.random.default_rng(seed).choice(n, n_val, replace=False)] = True
    return ds.select(np.flatnonzero(~is_val)), ds.select(np.flatnonzero(is_val))


# ---------------------------------------------------------------------------------------------
# token rows


def tokenize_and_group(raw: dict, tokenizer, max_seq_length: int, *, line_by_line=False, pack_lines=False,
                       document_eos=None, num_workers=None, overwrite_cache=False, max_train_samples=None,
                       max_eval_samples=None) -> dict:
    """{split: rows}: every row exactly max_seq_length int32 token ids.

    Grouped (default): texts tokenized with special tokens, concatenated per batch of 1000 texts,
    cut into blocks; each batch's remainder is dropped (as Hugging Face does; with num_workers the
    batches start afresh at each worker's shard). line_by_line: one row per non-blank line,
    truncated and right-padded with the pad id; with pack_lines, those lines packed greedily in order
    into rows (flaxlm.data.packing: the last row of each batch of 1000 texts may be short), and a column
    "segment_ids" numbers the lines of each row 1, 2, ... (0 = padding). Datasets come back cached by
    `datasets` (keyed by the text's fingerprint, the tokenizer and the settings; overwrite_cache redoes
    it) and in numpy format: ds[idx]["input_ids"] is int32 [len(idx), L]. IterableDatasets give
    StreamingRows (which do not pack lines: one row per line). max_*_samples keep the first rows.

    document_eos (the causal-LM mode): a text that does not end in a line break is a whole document,
    tokenized with the tokenizer's special tokens and ending in the id document_eos; lines that keep
    their line breaks (--keep_linebreaks) run on as one text, as in the file, without special tokens.
    """
    if line_by_line and tokenizer.pad_token_id is None:
        raise UserError("the tokenizer has no pad token, which --line_by_line needs; add one or drop --line_by_line")
    pack_lines = bool(line_by_line and pack_lines)
    if pack_lines and any(isinstance(ds, datasets.IterableDataset) for ds in raw.values()):
        pack_lines = False
        print("note: --streaming makes one row per line (packing lines into rows needs a cached dataset: drop "
              "--streaming to pack them)", flush=True)
    make = functools.partial(_make_rows, tokenizer=tokenizer, max_seq_length=max_seq_length,
                             line_by_line=line_by_line, document_eos=document_eos, pack_lines=pack_lines)
    limits = {"train": max_train_samples, "validation": max_eval_samples, "test": max_eval_samples}
    out = {}
    for split, ds in raw.items():
        if isinstance(ds, datasets.IterableDataset):
            rows = StreamingRows(ds, make, max_seq_length, max_rows=limits.get(split))
            empty = next(iter(rows), None) is None
        else:
            rows = _map_rows(ds, make, tokenizer, max_seq_length, (line_by_line, document_eos, pack_lines),
                             num_workers, overwrite_cache)
            if limits.get(split) is not None:
                rows = rows.select(range(min(limits[split], len(rows))))
            empty = len(rows) == 0
        if empty:
            raise UserError(f"the {split} text yields no full block of {max_seq_length} tokens; "
                            f"lower --max_seq_length or add text")
        out[split] = rows
    return out


def as_numpy_rows(ds):
    """All rows of a tokenized Dataset as one int32 [N, L] array, or for packed lines a dict of two:
    {"input_ids": [N, L], "segment_ids": [N, L]} (the training loop takes either)."""
    columns = ds.with_format("numpy", dtype=np.int32)[:]
    if "segment_ids" in ds.column_names:
        return {k: np.asarray(columns[k], dtype=np.int32) for k in ("input_ids", "segment_ids")}
    return np.asarray(columns["input_ids"], dtype=np.int32)


def iter_rows(rows, skip: int = 0):
    """Rows (int32 [L] arrays) from tokenized data, starting after `skip` rows (for a resumed run)."""
    if isinstance(rows, StreamingRows):
        yield from rows.iter_rows(skip)
        return
    for start in range(skip, len(rows), GROUP_BATCH):
        yield from rows[start:start + GROUP_BATCH]["input_ids"]


def _encode(tokenizer, texts, add_special_tokens=True, **kw):
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=add_special_tokens, return_attention_mask=False,
                     return_token_type_ids=False, verbose=False, **kw)["input_ids"]


def _encode_documents(tokenizer, texts, eos):
    """Token ids of each text: a line that keeps its line break runs on (no special tokens); any other text is
    a whole document, framed as the tokenizer frames a text (GPT-2: nothing, OPT: </s> first, Llama: <s>
    first, our BPE: <s> ... </s>; the way generate.py encodes a prompt) and ending in eos."""
    runs_on = [t.endswith(("\n", "\r")) for t in texts]
    lines = iter(_encode(tokenizer, [t for t, r in zip(texts, runs_on) if r], add_special_tokens=False))
    docs = iter(_encode(tokenizer, [t for t, r in zip(texts, runs_on) if not r]))
    out = []
    for r in runs_on:
        x = next(lines) if r else next(docs)
        out.append(x if r or (x and x[-1] == eos) else x + [eos])
    return out


def _make_rows(texts, tokenizer, max_seq_length, line_by_line, document_eos=None, pack_lines=False):
    """int32 [n, L] rows from one batch of texts; packed lines give {"input_ids", "segment_ids"}, [n, L] each."""
    if line_by_line:
        lines = [line for t in texts for line in t.splitlines() if line.strip()]
        ids = _encode(tokenizer, lines, truncation=True, max_length=max_seq_length)
        lengths_S = np.fromiter(map(len, ids), np.int64, len(ids))
        row_S, start_S = greedy_pack(lengths_S, max_seq_length) if pack_lines else one_per_row(len(ids))
        rows, segment_ids = fill_rows(ids, row_S, start_S, max_seq_length, tokenizer.pad_token_id)
        return {"input_ids": rows, "segment_ids": segment_ids} if pack_lines else rows
    ids = _encode(tokenizer, texts) if document_eos is None else _encode_documents(tokenizer, texts, document_eos)
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, sum(map(len, ids)))
    n = len(flat) // max_seq_length
    return flat[: n * max_seq_length].reshape(n, max_seq_length)


def _rows_batch(batch, make):
    rows = make(batch["text"])
    return rows if isinstance(rows, dict) else {"input_ids": rows}


def _tokenizer_hash(tokenizer):
    """Stable identity of a tokenizer (its tokenizer.json without the call-time truncation/padding state)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return Hasher.hash(tokenizer)
    spec = json.loads(backend.to_str())
    spec["truncation"] = spec["padding"] = None
    return Hasher.hash(json.dumps(spec, sort_keys=True))


def _map_rows(ds, make, tokenizer, max_seq_length, mode, num_workers, overwrite_cache):
    line_by_line, document_eos, pack_lines = mode
    fingerprint = Hasher.hash([ds._fingerprint, _tokenizer_hash(tokenizer), max_seq_length, line_by_line,
                               document_eos, pack_lines, GROUP_BATCH, _CACHE_VERSION])
    row = datasets.List(datasets.Value("int32"), length=max_seq_length)
    features = datasets.Features({"input_ids": row, **({"segment_ids": row} if pack_lines else {})})
    mode = "packed lines" if pack_lines else "one row per line" if line_by_line else "blocks"
    with spawned_workers(num_workers):
        rows = ds.map(_rows_batch, fn_kwargs={"make": make}, batched=True, batch_size=GROUP_BATCH,
                      remove_columns=ds.column_names, features=features, num_proc=num_workers,
                      load_from_cache_file=not overwrite_cache, new_fingerprint=fingerprint,
                      desc=f"Tokenizing into {mode} of {max_seq_length}")
    return rows.with_format("numpy", dtype=np.int32)


@contextlib.contextmanager
def spawned_workers(num_workers):
    """Once JAX is running (the scripts have it by then), datasets.map(num_proc=N) starts its N worker
    processes with 'spawn' (fresh interpreters) inside this block instead of fork: forking a process with
    JAX's threads can deadlock, and JAX warns of it on every fork. A spawned worker takes a few seconds
    longer to start. Before JAX has started, workers are forked as usual."""
    if not num_workers or num_workers < 2 or not _jax_started():
        yield
        return
    import multiprocess  # datasets' multiprocessing (dill-based)
    before = multiprocess.get_start_method(allow_none=True)
    multiprocess.set_start_method("spawn", force=True)
    try:
        yield
    finally:
        multiprocess.set_start_method(before, force=True)


def _jax_started():
    """True once JAX has created its backends (and its threads); True as well where JAX cannot tell."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True


class StreamingRows:
    """Fixed-length rows made lazily from a streaming text dataset, in the grouped/line mode of `make`.

    Host memory stays flat: one batch of GROUP_BATCH texts and its rows are held at a time
    (`peak_buffered_tokens` records the most row tokens held at once; a block's cut-off remainder
    adds less than one row). Iterating again restarts the stream.
    A resumed run passes the rows it already used: iter_rows(skip=n) re-reads and re-tokenizes the
    text before that point but yields nothing from it, so the rows that follow are the same.
    """

    def __init__(self, ds, make, max_seq_length, max_rows=None):
        self.ds, self.make, self.max_seq_length, self.max_rows = ds, make, max_seq_length, max_rows
        self.peak_buffered_tokens = 0

    def __iter__(self):
        return self.iter_rows()

    def iter_rows(self, skip: int = 0):
        seen = 0  # rows made so far, skipped or not
        for texts in iter_texts(self.ds, GROUP_BATCH):
            if self.max_rows is not None and seen >= self.max_rows:
                return
            rows = self.make(texts)
            self.peak_buffered_tokens = max(self.peak_buffered_tokens, rows.size)
            end = len(rows) if self.max_rows is None else min(len(rows), self.max_rows - seen)
            yield from rows[max(0, skip - seen):end]
            seen += len(rows)
