"""Token rows: text made into fixed-length rows of token ids, and those rows handed to the training loop.

A row is int32 [L] token ids; a split's rows are int32 [N, L], or for packed lines a dict of two such arrays
{"input_ids", "segment_ids"} (flaxlm.data.packing). A row function turns a batch of texts into rows; the
scripts pass one of the defaults here, and a copy of a script may pass its own:

    make_rows = rows.blocks(tokenizer, 512)           # texts -> int32 [n, 512]
    data = rows.from_text(raw, make_rows, 512)        # {"train": Dataset, ...}: column "input_ids", [N, 512]
    train_rows, eval_rows, test_rows, total_steps = rows.run_rows(data, args, global_batch)

The defaults: blocks (Hugging Face's run_mlm_flax.py: each text tokenized with its special tokens, a batch of
GROUP_BATCH texts concatenated and cut into blocks, the batch's remainder dropped), documents (the causal-LM
mode: each document ends in EOS) and lines (one row per line, or lines packed into rows). from_text caches the
rows with `datasets`, keyed by the text and the row function's code (flaxlm.data.fingerprint): an edit to the
function, or to a helper it calls, makes the rows anew. With --streaming the rows come lazily (StreamedRows).

The loop asks for the rows of each step: ShuffledRows gives epochs over fixed rows in a seeded order (the rows
of any step are known without reading the steps before it), StreamedRows the rows of a stream in order (a
resumed run starts at the stream position its checkpoint saved); both hand each process only its slice of the
global batch.
"""
import contextlib
import copy
import functools
import itertools
import sys

import datasets
import numpy as np
from datasets.fingerprint import Hasher

from flaxlm.data.fingerprint import fingerprint
from flaxlm.data.packing import fill_rows, greedy_pack, one_per_row
from flaxlm.data.text import iter_texts
from flaxlm.errors import UserError

GROUP_BATCH = 1000  # texts per call of a row function (Hugging Face's default map batch)
MATERIALIZE_BYTES = 2 << 30  # training rows up to this size are held in memory as one numpy array
STREAM_EVAL_ROWS = 10_000  # validation rows taken from a stream when --max_eval_samples is not set
ENCODE_CHARS = 1 << 21  # characters of a batch's texts tokenized at a time by blocks and documents (their ids
# then kept as int32, 4 bytes a token, not as Python lists at ~36 bytes a token plus the tokenizer's encodings)


# ---------------------------------------------------------------------------------------------
# row functions: a batch of texts -> rows


def blocks(tokenizer, length):
    """texts -> int32 [n, length]: each text tokenized with its special tokens (`<s> ... </s>`), the batch's
    ids concatenated and cut into blocks; the remainder (< one block) is dropped."""
    return functools.partial(_blocks, tokenizer=tokenizer, length=length)


def documents(tokenizer, length, eos):
    """texts -> int32 [n, length], the causal-LM way: a text that does not end in a line break is a whole
    document, tokenized with the tokenizer's special tokens and ending in the id `eos`; lines that keep their
    line breaks (--keep_linebreaks) run on as one text, as in the file, without special tokens. Then cut into
    blocks as `blocks` does."""
    return functools.partial(_documents, tokenizer=tokenizer, length=length, eos=eos)


def lines(tokenizer, length, pack=True):
    """texts -> one row per non-blank line, truncated to `length` and right-padded with the pad id:
    int32 [n, length]; with pack, those lines packed greedily in order into rows (flaxlm.data.packing: the last
    row of a batch may be short), as {"input_ids", "segment_ids"} [n, length] each, segment ids numbering the
    lines of a row 1, 2, ... (0 = padding)."""
    if tokenizer.pad_token_id is None:
        raise UserError("the tokenizer has no pad token, which --line_by_line needs; add one or drop --line_by_line")
    return functools.partial(_lines, tokenizer=tokenizer, length=length, pack=pack)


def can_pack(raw):
    """Whether lines can be packed into rows: not when a split streams (packing needs a cached dataset; a stream
    gets one row per line, which this says)."""
    if any(isinstance(ds, datasets.IterableDataset) for ds in raw.values()):
        print("note: --streaming makes one row per line (packing lines into rows needs a cached dataset: drop "
              "--streaming to pack them)", flush=True)
        return False
    return True


def _blocks(texts, tokenizer, length):
    return _cut([_flat(_encode(tokenizer, part)) for part in _parts(texts)], length)


def _documents(texts, tokenizer, length, eos):
    return _cut([_flat(_encode_documents(tokenizer, part, eos)) for part in _parts(texts)], length)


def _lines(texts, tokenizer, length, pack):
    line_ids = _encode(tokenizer, [line for t in texts for line in t.splitlines() if line.strip()],
                       truncation=True, max_length=length)
    lengths_S = np.fromiter(map(len, line_ids), np.int64, len(line_ids))
    row_S, start_S = greedy_pack(lengths_S, length) if pack else one_per_row(len(line_ids))
    ids_NL, segment_ids_NL = fill_rows(line_ids, row_S, start_S, length, tokenizer.pad_token_id)
    return {"input_ids": ids_NL, "segment_ids": segment_ids_NL} if pack else ids_NL


def _parts(texts):
    """The texts in consecutive lists of at most ENCODE_CHARS characters (a longer text alone): a batch of long
    documents (a book is ~500k characters, GROUP_BATCH of them 500 MB) is tokenized a part at a time, so memory
    holds the batch's text and its ids as int32, not the ids of every document as Python ints at once. Each text is
    tokenized alone either way, so the rows are the same."""
    part, size = [], 0
    for t in texts:
        if part and size + len(t) > ENCODE_CHARS:
            yield part
            part, size = [], 0
        part.append(t)
        size += len(t)
    if part:
        yield part


def _flat(ids):
    """int32 [sum of lengths]: the token lists `ids` concatenated."""
    return np.fromiter(itertools.chain.from_iterable(ids), np.int32, sum(map(len, ids)))


def _cut(flats, length):
    """int32 [n, length]: the int32 token arrays `flats` concatenated and cut into blocks, the remainder dropped."""
    flat = flats[0] if len(flats) == 1 else np.concatenate(flats or [np.zeros(0, np.int32)])
    n = len(flat) // length
    return flat[: n * length].reshape(n, length)


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
    line_ids = iter(_encode(tokenizer, [t for t, r in zip(texts, runs_on) if r], add_special_tokens=False))
    doc_ids = iter(_encode(tokenizer, [t for t, r in zip(texts, runs_on) if not r]))
    out = []
    for r in runs_on:
        x = next(line_ids) if r else next(doc_ids)
        out.append(x if r or (x and x[-1] == eos) else x + [eos])
    return out


# ---------------------------------------------------------------------------------------------
# text -> rows of each split


def from_text(raw: dict, make_rows, length: int, *, num_workers=None, overwrite_cache=False,
              max_train_samples=None, max_eval_samples=None) -> dict:
    """{split: rows} of load_raw_text's splits: make_rows (texts -> int32 [n, length], or a dict of such arrays)
    called on each batch of GROUP_BATCH texts; with num_workers, each worker's contiguous shard of the texts
    starts its batches afresh. A Dataset's rows come back cached by `datasets`, keyed by the text's fingerprint,
    the fingerprint of make_rows (its code, the helpers it calls and the values it holds, a tokenizer by its
    tokenizer.json: flaxlm.data.fingerprint) and GROUP_BATCH; overwrite_cache makes them anew. They are in numpy
    format: ds[idx]["input_ids"] is int32 [len(idx), length]. An IterableDataset gives StreamedRows; a Mixture of
    texts (flaxlm.data.text_mixture) the Mixture of their rows. max_train_samples / max_eval_samples keep the first
    rows of the train (of each mixed source) / validation and test splits."""
    limits = {"train": max_train_samples, "validation": max_eval_samples, "test": max_eval_samples}
    job = functools.partial(rows_of_batch, make_rows=make_rows, length=length)
    key = fingerprint(job) if any(not isinstance(ds, datasets.IterableDataset) for ds in raw.values()) else None
    out = {}
    for split, ds in raw.items():
        rows_of = functools.partial(_split_rows, split=split, limit=limits.get(split), job=job, key=key,
                                    num_workers=num_workers, overwrite_cache=overwrite_cache)
        mixed = hasattr(ds, "map_sources")  # a mixture of texts: the mixture of each source's rows
        out[split] = ds.map_sources(rows_of) if mixed else rows_of(ds)
    return out


def _split_rows(ds, split, limit, job, key, num_workers, overwrite_cache):
    """The rows of one split's text (from_text), at most `limit`."""
    length = job.keywords["length"]
    if isinstance(ds, datasets.IterableDataset):
        rows = StreamedRows(ds, job.keywords["make_rows"], length, max_rows=limit)
        empty = next(iter(rows), None) is None
    else:
        rows = _cached_rows(ds, job, Hasher.hash([ds._fingerprint, key, GROUP_BATCH]), num_workers, overwrite_cache)
        if limit is not None:
            rows = rows.select(range(min(limit, len(rows))))
        empty = len(rows) == 0
    if empty:
        raise UserError(f"the {split} text yields no full block of {length} tokens; "
                        f"lower --max_seq_length or add text")
    return rows


def _cached_rows(ds, job, cache_key, num_workers, overwrite_cache):
    make_rows = job.keywords["make_rows"]
    name = getattr(getattr(make_rows, "func", make_rows), "__name__", "a row function").strip("_")
    with spawned_workers(num_workers):
        rows = ds.map(job, batched=True, batch_size=GROUP_BATCH, remove_columns=ds.column_names,
                      num_proc=num_workers, load_from_cache_file=not overwrite_cache, new_fingerprint=cache_key,
                      desc=f"Tokenizing into rows of {job.keywords['length']} ({name})")
    return rows.with_format("numpy", dtype=np.int32)


def rows_of_batch(batch, make_rows, length):
    """The columns datasets.map writes for one batch of texts: {"input_ids"} or the row function's dict."""
    made = make_rows(batch["text"])
    return {name: _checked(x, length) for name, x in (made.items() if isinstance(made, dict)
                                                       else [("input_ids", made)])}


def _checked(rows, length):
    """rows as int32 [n, length]; a UserError when a row function gives another shape."""
    rows = np.asarray(rows)
    if rows.size == 0:
        return np.zeros((0, length), np.int32)
    if rows.ndim != 2 or rows.shape[1] != length or not np.issubdtype(rows.dtype, np.integer):
        raise UserError(f"the row function gave {rows.dtype} rows of shape {list(rows.shape)}; it must give token "
                        f"ids [n, {length}] (a batch of texts in, rows of {length} tokens out)")
    return rows.astype(np.int32, copy=False)


@contextlib.contextmanager
def spawned_workers(num_workers):
    """Once JAX is running (the scripts have it by then), datasets.map(num_proc=N) starts its N worker
    processes with 'spawn' (fresh interpreters) inside this block instead of fork: forking a process with
    JAX's threads can deadlock, and JAX warns of it on every fork. A spawned worker takes a few seconds
    longer to start, and gets the row function pickled. Before JAX has started, workers are forked as usual."""
    if not num_workers or num_workers < 2 or not jax_started():
        yield
        return
    import multiprocess  # datasets' multiprocessing (dill-based)
    before = multiprocess.get_start_method(allow_none=True)
    multiprocess.set_start_method("spawn", force=True)
    try:
        yield
    finally:
        multiprocess.set_start_method(before, force=True)


def jax_started():
    """True once JAX has created its backends or joined a multi-host run (and started their threads); True as well
    where JAX cannot tell."""
    if "jax" not in sys.modules:
        return False
    try:
        import jax
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized() or jax.distributed.is_initialized())
    except (ImportError, AttributeError):
        return True


class StreamedRows:
    """Rows made lazily from a streaming text dataset (--streaming) by a row function, read in order.

    Host memory stays flat: one batch of GROUP_BATCH texts and its rows are held at a time
    (`peak_buffered_tokens` records the most row tokens held at once; a block's cut-off remainder
    adds less than one row). Iterating gives one pass; iterating again restarts the stream.
    rows(skip=n) re-reads and re-tokenizes the text before row n but yields nothing from it.
    For the training loop, batched(global_batch) reads epochs over the stream in global batches, asked for in
    step order; a stream cannot be entered in the middle of a batch, so every process reads the global batch and
    keeps its slice. position_after(step) is where the stream stands after a step's rows (the checkpoint keeps
    it), and resume_at(step, position) starts there: the texts before the position's batch of texts are skipped
    by `datasets` (IterableDataset.load_state_dict: whole files, then whole Arrow tables) without being
    tokenized, that batch is tokenized again and the rows already taken from it are dropped.
    """
    steps_per_epoch = None  # unknown: a stream has no known length

    def __init__(self, ds, make_rows, length, max_rows=None, global_batch=None):
        self.ds, self.make_rows, self.length, self.max_rows = ds, make_rows, length, max_rows
        self.global_batch = global_batch
        self.peak_buffered_tokens = 0
        self._epochs, self._next_step = None, None
        self._position, self._resume = None, None  # after the rows served so far; (step, position) to start at

    def __iter__(self):
        return self.rows()

    def rows(self, skip: int = 0):
        """Rows (int32 [L]) of one pass over the stream, starting after `skip` rows."""
        return (row for row, _ in self._pass(skip=skip))

    def _pass(self, start=None, skip=0):
        """(row, position after it) of one pass over the stream, from the position `start` (None: the beginning),
        then after `skip` rows. A position within a pass: {"texts": texts before the current batch of texts,
        "rows": rows of the pass up to here, "taken": of those, the ones from the current batch, "stream":
        datasets' state_dict before that batch (None at the beginning)}."""
        ds, before, texts, seen, taken = self.ds, None, 0, 0, 0
        if start is not None and start["stream"] is not None:
            ds = copy.deepcopy(self.ds)  # a loaded state holds for every later pass of the dataset (and its parts)
            ds.load_state_dict(start["stream"])
            before, texts = start["stream"], start["texts"]
        if start is not None:
            seen, taken = start["rows"] - start["taken"], start["taken"]
        for batch in iter_texts(ds, GROUP_BATCH):
            if self.max_rows is not None and seen >= self.max_rows:
                return
            made = rows_of_batch({"text": batch}, self.make_rows, self.length)
            if len(made) > 1:
                raise UserError("rows of several columns (packed lines) need a cached dataset; drop --streaming")
            rows = made["input_ids"]
            self.peak_buffered_tokens = max(self.peak_buffered_tokens, rows.size)
            end = len(rows) if self.max_rows is None else min(len(rows), self.max_rows - seen)
            for i in range(max(taken, skip - seen), end):
                yield rows[i], {"texts": texts, "rows": seen + i + 1, "taken": i + 1, "stream": before}
            seen, texts, taken = seen + len(rows), texts + len(batch), 0
            before = ds.state_dict()  # the stream after this batch of texts, before the next

    def batched(self, global_batch):
        """These rows for the training loop, in global batches of global_batch rows."""
        return StreamedRows(self.ds, self.make_rows, self.length, self.max_rows, global_batch)

    def epoch_of(self, step):
        return 0

    def resume_at(self, step, position):
        """Start the rows of `step` at `position` (position_after(step) of an earlier run)."""
        self._resume = (step, position)

    def position_after(self, step):
        """Where the stream stands after the rows of the steps before `step` (the last ones served): a small
        JSON-able dict, {"pass": passes over the stream before this one, **_pass's position}."""
        return self._position if self._next_step == step else None

    def batch_rows(self, step, local):
        """The rows (this process's slice `local` of the global batch) for 0-based `step`."""
        if self._next_step != step:
            at = self._resume[1] if self._resume and self._resume[0] == step else None
            self._epochs = self._rows_from(at, skip=0 if at else step * self.global_batch)
        rows = [next(self._epochs) for _ in range(self.global_batch)]
        self._next_step = step + 1
        return np.stack(rows)[local].astype(np.int32)

    def _rows_from(self, position=None, skip=0):
        """Rows from `position` on, then after `skip` rows (re-reading and re-tokenizing the text before them),
        running over the stream again each time it ends; self._position follows the rows given."""
        passes = position["pass"] if position else 0
        while True:
            got = False
            for row, at in self._pass(position, skip):
                got = True
                self._position = {"pass": passes, **at}
                yield row
            if not got and position is None and skip == 0:
                raise UserError("the training stream yields no rows; check --train_file / --dataset_name")
            position, skip, passes = None, 0, passes + 1


# ---------------------------------------------------------------------------------------------
# rows -> the training loop


def as_numpy_rows(ds):
    """All rows of a tokenized Dataset as one int32 [N, L] array, or for packed lines a dict of two:
    {"input_ids": [N, L], "segment_ids": [N, L]} (the training loop takes either)."""
    columns = ds.with_format("numpy", dtype=np.int32)[:]
    if "segment_ids" in ds.column_names:
        return {k: np.asarray(columns[k], dtype=np.int32) for k in ("input_ids", "segment_ids")}
    return np.asarray(columns["input_ids"], dtype=np.int32)


def iter_rows(rows, skip: int = 0):
    """Rows (int32 [L] arrays) of a tokenized split (Dataset or StreamedRows) in order, after `skip` rows."""
    if isinstance(rows, StreamedRows):
        yield from rows.rows(skip)
        return
    for start in range(skip, len(rows), GROUP_BATCH):
        yield from rows[start:start + GROUP_BATCH]["input_ids"]


def take_rows(rows, idx):
    """rows[idx] for a numpy array, a dict of equal-length numpy arrays (one entry per example field, as
    fine-tuning uses), a `datasets.Dataset` with an input_ids column or rows read from disk on demand (anything
    with rows_at(idx): flaxlm.data.prepared.PreparedRows, --prepared_data)."""
    if isinstance(rows, np.ndarray):
        return rows[idx]
    if hasattr(rows, "rows_at"):
        return rows.rows_at(idx)
    if isinstance(rows, dict):
        return {k: v[idx] for k, v in rows.items()}
    if "segment_ids" in rows.column_names:  # packed lines (flaxlm.data.packing): both columns
        got = rows[idx]
        return {k: np.asarray(got[k], dtype=np.int32) for k in ("input_ids", "segment_ids")}
    return np.asarray(rows[idx]["input_ids"], dtype=np.int32)


def num_rows(rows):
    """How many examples `rows` holds (any of take_rows' kinds)."""
    return len(next(iter(rows.values()))) if isinstance(rows, dict) else len(rows)


class ShuffledRows:
    """Epochs over fixed rows (any of take_rows' kinds), each in a seeded random order."""

    def __init__(self, rows, global_batch, seed):
        self.rows, self.global_batch, self.seed = rows, global_batch, seed
        self.num_rows = num_rows(rows)
        self.steps_per_epoch = self.num_rows // global_batch
        if self.steps_per_epoch == 0:
            raise UserError(f"the training data has {self.num_rows} examples, fewer than one global batch "
                            f"of {global_batch}; add data or lower the batch size")
        self._epoch, self._perm = None, None

    def epoch_of(self, step):
        return step // self.steps_per_epoch

    def batch_rows(self, step, local):
        """The rows (this process's slice `local` of the global batch) for 0-based `step`."""
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
        idx = self._perm[i * self.global_batch:(i + 1) * self.global_batch][local]
        return take_rows(self.rows, idx)


def eval_batches(rows, global_batch, local, pad_id):
    """Every row of the validation set once, in order, as (rows, real): this process's slice `local` of
    each global batch (only those rows are read) and a bool per row, False for the rows of pad_id that
    fill up the last batch (the loop gives those no weight, so every metric excludes them). Dict rows are
    filled up with zeros, their input_ids with pad_id."""
    n = num_rows(rows)
    if n == 0:
        return
    first = take_rows(rows, np.arange(1))
    for start in range(0, n, global_batch):
        idx = np.arange(start, start + global_batch)[local]
        real = idx < n
        got = take_rows(rows, idx[real]) if real.any() else None
        if isinstance(first, dict):
            chunk = {k: _filled(v, len(idx), pad_id if k == "input_ids" else 0) for k, v in first.items()}
            for k in chunk:
                if got is not None:
                    chunk[k][real] = got[k]
        else:
            chunk = _filled(first, len(idx), pad_id)
            if got is not None:
                chunk[real] = got
        yield chunk, real


def _filled(example, n, value):
    """n rows shaped and typed like example's rows, all `value`."""
    return np.full((n, *example.shape[1:]), value, dtype=example.dtype)


def run_rows(data, args, global_batch):
    """(train rows by step, validation rows or None, test rows or None, total steps) of a run from from_text's
    output: the training rows shuffled (held in memory up to MATERIALIZE_BYTES; a mixture's: each source's) or
    streamed, the held-out ones as numpy (held_out_rows); prepared rows (--prepared_data) stay on disk, read a batch
    at a time."""
    train = data["train"]
    if isinstance(train, StreamedRows):
        train_rows = train.batched(global_batch)
    elif hasattr(train, "rows_at"):  # prepared rows, read from disk a batch at a time
        train_rows = ShuffledRows(train, global_batch, args.seed)
    elif hasattr(train, "rows_by_step"):  # a mixture of sources (flaxlm.data.mixture)
        train_rows = train.map_sources(in_memory).rows_by_step(global_batch, args.seed)
    else:
        train_rows = ShuffledRows(in_memory(train), global_batch, args.seed)
    eval_rows = held_out_rows(data.get("validation"))
    return train_rows, eval_rows, held_out_rows(data.get("test")), total_train_steps(args, train_rows)


def in_memory(rows):
    """A tokenized Dataset's rows as numpy when they take at most MATERIALIZE_BYTES; other rows as they are."""
    if isinstance(rows, datasets.Dataset) and len(rows) * len(rows[0]["input_ids"]) * 4 <= MATERIALIZE_BYTES:
        return as_numpy_rows(rows)
    return rows


def held_out_rows(rows):
    """A validation or test split's rows as numpy (a stream's first STREAM_EVAL_ROWS; prepared rows as they are,
    read a batch at a time), or None for no split."""
    if rows is None or hasattr(rows, "rows_at"):
        return rows
    if isinstance(rows, StreamedRows):
        return np.stack(list(itertools.islice(rows, STREAM_EVAL_ROWS)))
    return as_numpy_rows(rows)


def total_train_steps(args, train_rows):
    """--max_steps, else --num_train_epochs epochs of the training rows (at least one step)."""
    if args.max_steps and args.max_steps > 0:
        return args.max_steps
    if isinstance(train_rows, StreamedRows):
        raise UserError("--streaming needs --max_steps (a stream has no known length)")
    return max(1, int(train_rows.steps_per_epoch * args.num_train_epochs))
