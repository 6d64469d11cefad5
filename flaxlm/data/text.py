"""Raw text for the pretraining scripts: files or a hub dataset in, {split: dataset} with one column "text" out.

    raw = load_raw_text(src)   # {"train": Dataset, "validation": Dataset}, one column "text"

With --streaming the splits are IterableDatasets. Turning the text into token rows is flaxlm.data.rows's.

Text files must be UTF-8: a line that is not is an error naming the file and the line (and the iconv command
that fixes it), raised when reading meets it (with --streaming that may be well into training). Nothing is
skipped silently: a corpus with bad bytes is usually in another encoding, and skipping would drop it all.
"""
import contextlib
import functools
import glob
import logging
import os

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flaxlm.errors import UserError, decode_utf8_line

# extension -> (datasets builder, builder options); .gz/.bz2/.xz/.zst around any of them work too
BUILDERS = {
    ".txt": ("text", {}), ".text": ("text", {}),
    ".json": ("json", {}), ".jsonl": ("json", {}),
    ".csv": ("csv", {}), ".tsv": ("csv", {"sep": "\t"}),
    ".parquet": ("parquet", {}),
}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
ARROW_BATCH = dict(batch_size=1 << 16, writer_batch_size=1 << 16)  # see _arrow_batches
_TEXT_FILES = []  # (flag, files) read by the last load_raw_text: where to look when text turns out not UTF-8


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
    check_text_options(src, validation_split_percentage)
    with naming_bad_bytes(fresh=True):
        return _load_splits(src, validation_split_percentage, seed, keep_linebreaks, include_test)


def check_text_options(src, validation_split_percentage):
    """A UserError for options that name no text, or two sources, or an impossible validation percentage."""
    if src.dataset_name and src.train_file:
        raise UserError("pass either --dataset_name or --train_file, not both")
    if not (src.dataset_name or src.train_file):
        raise UserError("no training text: pass --train_file FILE (txt, json, jsonl, csv, parquet) "
                        "or --dataset_name NAME")
    if not 0 <= validation_split_percentage < 100:
        raise UserError(f"--validation_split_percentage must be between 0 and 99, "
                        f"not {validation_split_percentage}")


def _load_splits(src, validation_split_percentage, seed, keep_linebreaks, include_test):
    """load_raw_text after its checks of the options."""
    if src.dataset_name:
        where = f"dataset {one_dataset(src)[0]}"
        splits = load_hub(src)
    else:
        where = f"--train_file {', '.join(src.train_file)}"
        splits = {"train": load_files(src.train_file, "--train_file", src, keep_linebreaks)}
    if src.validation_file:
        splits["validation"] = load_files(src.validation_file, "--validation_file", src, keep_linebreaks)
    test_file = getattr(src, "test_file", None)
    if include_test and test_file:
        splits["test"] = load_files(test_file, "--test_file", src, keep_linebreaks)

    if "validation" in splits:
        val_where = (f"--validation_file {', '.join(src.validation_file)}" if src.validation_file
                     else where)
        raw = {"train": _text_only(splits["train"], src, where),
               "validation": _text_only(splits["validation"], src, val_where)}
    elif validation_split_percentage > 0:
        raw = dict(zip(("train", "validation"),
                       _text_only(splits["train"], src, where, split_off=(validation_split_percentage, seed))))
    else:
        raw = {"train": _text_only(splits["train"], src, where)}
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


def file_list(files, flag):
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
    files, ext = checked_files(files, flag)
    builder, options = BUILDERS[ext]
    if builder == "text" and keep_linebreaks:
        options = {**options, "keep_linebreaks": True}
    _TEXT_FILES.append((flag, files))
    try:
        with _quiet_datasets_log():
            return datasets.load_dataset(builder, data_files=files, split="train", cache_dir=src.cache_dir,
                                         streaming=src.streaming, **options, **_arrow_batches(src))
    except Exception as e:  # a parse error in the user's file
        if _is_decode_error(e):
            raise _not_utf8_error(e) from None
        raise UserError(f"could not read {flag} {', '.join(files)} as {ext[1:]} ({_first_line(_root(e))}); "
                        f"fix the file or its extension") from None


def checked_files(files, flag):
    """(files, extension): the files given with `flag` (glob patterns expanded), each an existing non-empty file of
    a type BUILDERS reads, all of one type; a UserError naming the first that is not."""
    files = file_list(files, flag)
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
    return files, exts[0]


def _arrow_batches(src):
    """Record batches of up to 2^16 texts in the arrow copy of the text (datasets writes 1,000): every process that
    opens the copy holds ~1 KB per record batch (of the copy and of a filter's index), which for a corpus of short
    lines at the default is ~35 MB per GB of text in each process: memory that would grow with the corpus."""
    return {} if src.streaming else {"writer_batch_size": ARROW_BATCH["writer_batch_size"]}


def datasets_named(src):
    """[(name, config)] of --dataset_name and --dataset_config_name (one config per name, or none); a name given as
    a string (options built in code) is one dataset."""
    names, configs = ([x] if isinstance(x, str) else list(x or [])
                      for x in (src.dataset_name, src.dataset_config_name))
    if configs and len(configs) != len(names):
        raise UserError(f"--dataset_config_name gives {len(configs)} configurations for {len(names)} datasets; give "
                        f"one per --dataset_name, in the same order ('default' for a dataset without any)")
    return list(zip(names, configs or [None] * len(names)))


def one_dataset(src):
    """(name, config) of the one dataset that --dataset_name names; a UserError when it names several."""
    named = datasets_named(src)
    if len(named) > 1:
        raise UserError(f"--dataset_name names {len(named)} datasets but this reads one; mix several with "
                        f"--dataset_weights (run_mlm_flax.py, run_clm_flax.py, run_t5_mlm_flax.py), or pass one")
    return named[0]


SPLIT_ALIASES = {"val": "validation", "dev": "validation"}  # EuroEval's datasets name their validation split val


def hub_split(name, config, split, cache_dir=None):
    """The name dataset `name` gives `split`, by load_hub's rule: asked for "validation", a dataset whose split is
    named val or dev has it read (it is looked up only when the dataset has no split of that very name). Returns
    `split` itself when the dataset's split names cannot be listed (offline, unknown name: loading it says why)."""
    aliases = [alias for alias, canonical in SPLIT_ALIASES.items() if canonical == split]
    if not aliases:
        return split
    try:
        names = datasets.get_dataset_split_names(name, config, cache_dir=cache_dir)
    except Exception:  # noqa: BLE001 (the load that follows names the problem)
        return split
    return split if split in names else next((a for a in aliases if a in names), split)


def load_hub(src):
    """{split: dataset} of --dataset_name / --dataset_config_name (one dataset) through `datasets`: a hub name, a
    folder laid out as a hub dataset (its data files, its README's configs), or a folder `save_to_disk` wrote
    (FOLDER/CONFIG when --dataset_config_name names a subfolder). A split named val or dev is the validation split."""
    name, config = one_dataset(src)
    try:
        saved = _saved_to_disk(name, config)
        if saved:
            splits = datasets.load_from_disk(saved)
            splits = {"train": splits} if isinstance(splits, datasets.Dataset) else dict(splits)
            if src.streaming:
                splits = {k: v.to_iterable_dataset() for k, v in splits.items()}
        else:
            splits = datasets.load_dataset(name, config, cache_dir=src.cache_dir, streaming=src.streaming,
                                          **_arrow_batches(src))
    except Exception as e:  # offline, unknown name, missing config, ...
        raise UserError(f"could not load dataset {name} ({_first_line(e)}); "
                        f"check the name and your network, or pass --train_file") from None
    splits = {(k if k in ("train", "validation", "test") or SPLIT_ALIASES.get(k) in splits else
               SPLIT_ALIASES.get(k, k)): v for k, v in splits.items()}
    if "train" not in splits:
        raise UserError(f"dataset {name} has no 'train' split (it has {', '.join(splits)}); "
                        f"pass --train_file instead")
    return {k: splits[k] for k in ("train", "validation", "test") if k in splits}


def _saved_to_disk(name, config):
    """The folder of a dataset `save_to_disk` wrote that --dataset_name (/ its config subfolder) names, else None."""
    for path in ([os.path.join(name, config)] if config else []) + [name]:
        if any(os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json")):
            return path
    return None


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
        return feature_types(ds.features)
    first = next(iter(ds.take(1)), None)
    if first is None:
        raise UserError(f"{where} holds no examples; pass a source with text")
    return {name: isinstance(v, str) for name, v in first.items()}


def feature_types(features):
    """{column: is_string} of datasets Features."""
    return {name: isinstance(f, datasets.Value) and f.dtype in ("string", "large_string")
            for name, f in features.items()}


def text_column(types, src, where):
    """The column that holds the text, of columns {name: is_string}: --text_column, else "text", else the one
    string column; a UserError when there is none or several."""
    listing = ", ".join(types) or "none"
    if src.text_column:
        if src.text_column not in types:
            raise UserError(f"--text_column {src.text_column} is not a column of {where} (columns: {listing}); "
                            f"pass --text_column with one of them")
        if not types[src.text_column]:
            raise UserError(f"--text_column {src.text_column} of {where} does not hold strings; pass a text column")
        return src.text_column
    if types.get("text"):
        return "text"
    strings = [c for c, is_str in types.items() if is_str]
    if len(strings) != 1:
        raise UserError(f"cannot tell which column of {where} holds the text (columns: {listing}); "
                        f"pass --text_column")
    return strings[0]


def _text_only(ds, src, where, split_off=None):
    """Keep the text column only, named "text", without blank texts; with split_off=(percentage, seed) the
    (train, validation) split of it that hold_out() makes, filtered in the same passes (a dataset filtered
    once reads every later row through an index: three times slower)."""
    column = text_column(column_types(ds, where), src, where)
    ds = ds.select_columns([column])
    if column != "text":
        ds = ds.rename_column(column, "text")
    if split_off and not src.streaming:
        return hold_out(ds, *split_off, where, drop_blank=True)
    if src.streaming:
        ds = ds.filter(_has_text, batched=True)
        if next(iter(ds.take(1)), None) is None:
            raise _all_blank(where)
    else:
        ds = ds.with_format("arrow").filter(_text_mask, batched=True, input_columns=["text"], **ARROW_BATCH,
                                            desc="Dropping blank texts").with_format(None)
        if len(ds) == 0:
            raise _all_blank(where)
    return hold_out(ds, *split_off, where) if split_off else ds


def _all_blank(where):
    return UserError(f"{where} holds no text (every line is blank); pass a source with text")


def _has_text(batch):
    return [bool(t and t.strip()) for t in batch["text"]]


def _text_mask(texts):
    """_has_text of an arrow array of texts, without making Python strings (arrow's whitespace is str.isspace's);
    a UnicodeDecodeError (naming_bad_bytes names the line) where a reader let bytes that are not UTF-8 through."""
    try:
        texts.validate(full=True)
    except pa.ArrowInvalid as e:
        raise UnicodeDecodeError("utf-8", b"", 0, 1, str(e)) from None
    blank = pc.or_kleene(pc.equal(pc.utf8_length(texts), 0), pc.utf8_is_space(texts))
    return pc.invert(pc.fill_null(blank, True)).to_numpy(zero_copy_only=False)


HOLD_OUT_CHUNK = 1 << 20  # examples whose held-out ones are drawn together: the memory hold_out needs


def hold_out(ds, percentage, seed, where, drop_blank=False):
    """(train, validation): seeded random examples in order, or every k-th one of a stream; with drop_blank,
    both without blank texts (held-out examples drawn among all, then blank ones dropped from both).

    round(n * percentage / 100) of the n examples are held out, spread evenly over chunks of HOLD_OUT_CHUNK
    examples and drawn at random within each, so memory stays bounded however many examples the corpus
    holds (an index over all of them costs ~70 bytes per line: gigabytes for a corpus of short lines).
    """
    if isinstance(ds, datasets.IterableDataset):
        k = max(2, round(100 / percentage))
        return tuple(ds.filter(functools.partial(_kth, k=k, held=held), with_indices=True) for held in (False, True))
    n = len(ds)
    n_val = held_out_count(n, percentage, where)
    drawn = dict(n=n, n_val=n_val, seed=seed, chunk=HOLD_OUT_CHUNK, drop_blank=drop_blank)
    options = dict(with_indices=True, batched=True, **ARROW_BATCH, input_columns=["text"] if drop_blank else [])
    train, validation = (ds.with_format("arrow").filter(functools.partial(_in_split, **drawn, held=held), **options,
                                                        desc=f"Holding out validation text ({name})").with_format(None)
                         for held, name in ((False, "train"), (True, "validation")))
    if drop_blank and len(train) + len(validation) == 0:
        raise _all_blank(where)
    if len(train) == 0 or len(validation) == 0:
        raise _too_little(where)
    return train, validation


def _kth(_, i, k, held):
    """Whether example i of a stream is in the held-out split (held) or the other: every k-th one is held out."""
    return (i % k == 0) == held


def held_out_count(n, percentage, where):
    """How many of n examples hold_out holds out: round(n * percentage / 100), at least 1 and at most n - 1."""
    if n < 2:
        raise _too_little(where)
    return min(n - 1, max(1, round(n * percentage / 100)))


def _too_little(where):
    return UserError(f"{where} has too little text to hold out a validation split; "
                     f"pass --validation_file or --validation_split_percentage 0")


def _in_split(*texts_and_indices, n, n_val, seed, chunk, held, drop_blank):
    """Whether each of these (consecutive) examples is in the split: held out (held) or kept for training,
    and with drop_blank not blank."""
    indices = texts_and_indices[-1]
    mask = held_out_mask(indices[0], indices[-1] - indices[0] + 1, n, n_val, seed, chunk)
    mask = mask if held else ~mask
    if drop_blank:
        mask &= _text_mask(texts_and_indices[0])
    return mask


def held_out_mask(first, count, n, n_val, seed, chunk=HOLD_OUT_CHUNK):
    """Whether hold_out holds out each of the consecutive examples [first, first + count) of n, n_val held out."""
    if count == 0:
        return np.zeros(0, bool)
    chunks = range(first // chunk, (first + count - 1) // chunk + 1)
    masks = [_held_out_in_chunk(c, chunk, n, n_val, seed) for c in chunks]
    return np.concatenate(masks)[first % chunk:][:count]


@functools.lru_cache(maxsize=4)
def _held_out_in_chunk(index, size, n, n_val, seed):
    """The held-out mask of chunk `index` (`size` examples): its proportional share of the n_val examples
    (the shares sum to n_val exactly), drawn from a generator seeded by (seed, index)."""
    start, end = index * size, min(n, (index + 1) * size)
    count = end * n_val // n - start * n_val // n
    mask = np.zeros(end - start, bool)
    mask[np.random.default_rng([seed, index]).choice(end - start, count, replace=False)] = True
    return mask
