"""Sentence-prediction data: examples (one sentence or a pair, and a label) from files or a `datasets` name, their
labels as ids, and the token rows the training loop takes.

    examples = load_examples(source, task, 5, seed=42, include_test=False)   # {split: Examples}
    names = label_names(examples["train"])                                   # sorted class names (classification)
    rows = token_rows(examples, tokenizer, 128, config, names)               # {split: dict of numpy arrays}

Files are read as flaxlm.data.text reads them (tsv, csv, json: a list of records or one per line, jsonl, parquet;
UTF-8 errors name the file and line). Every example is kept, in file order, so row i is example i of its split.
"""
import dataclasses

import datasets
import numpy as np

from flaxlm.data import text as data
from flaxlm.errors import UserError

ROUND_WIDTH = 8  # rows are as wide as the longest example, rounded up to this (at most max_seq_length)


@dataclasses.dataclass
class Examples:
    where: str  # the flag and files (or dataset) they came from, for messages
    text1: list
    text2: list | None  # the second sentences of a pair task
    labels: list | None  # raw label values as read; None for an unlabeled test split


def load_examples(source, task, validation_split_percentage, seed, include_test=False, max_train_samples=None,
                  max_eval_samples=None, need_validation=True):
    """{"train", "validation"[, "test"]: Examples}. task: a sentence_prediction.Task (its columns). Without a
    validation set, validation_split_percentage % of train is held out (seeded); with a percentage of 0 and
    need_validation False (--do_eval false) there is no "validation". The test split may be unlabeled (no label
    column, or every label -1 as in GLUE's test files)."""
    splits, where = read_splits(source, validation_split_percentage, seed, include_test, max_train_samples,
                                max_eval_samples, "sentence prediction", need_validation)
    return {split: _examples(ds, task, where[split], labeled=split != "test") for split, ds in splits.items()}


def read_splits(source, validation_split_percentage, seed, include_test, max_train_samples, max_eval_samples, what,
                need_validation=True, record_column=None):
    """({"train", "validation"[, "test"]: Dataset}, {split: where they came from}) of a fine-tuning task (`what`,
    for messages) whose examples are held in memory: the files or dataset of `source` (TextSourceArgs), a seeded
    validation_split_percentage % of train held out when there is no validation set, each split cut to its
    maximum number of examples. Without a validation set and with a percentage of 0: no "validation" when
    need_validation is False (a run with --do_eval false), else a UserError. record_column: a column added, each
    example's number (from 1) among the records of where it was read (the held-out ones: of the training files)."""
    if source.streaming:
        raise UserError(f"--streaming is not supported for {what} (the examples are held in memory); "
                        "drop --streaming")
    if source.dataset_name and source.train_file:
        raise UserError("pass either --dataset_name or --train_file, not both")
    if not (source.dataset_name or source.train_file):
        raise UserError("no training examples: pass --train_file FILE (tsv, csv, json, jsonl, parquet) or "
                        "--dataset_name NAME")
    with data.naming_bad_bytes(fresh=True):
        splits, where = _read_splits(source, include_test)
        if record_column:
            splits = {split: ds.add_column(record_column, list(range(1, len(ds) + 1))) for split, ds in splits.items()}
        if "validation" not in splits and (validation_split_percentage or need_validation):
            if not validation_split_percentage:
                raise UserError(f"no validation examples: pass --validation_file FILE, or a "
                                f"--validation_split_percentage above 0 to hold some of {where['train']} out")
            splits["train"], splits["validation"] = data.hold_out(splits["train"], validation_split_percentage,
                                                                   seed, where["train"])
            where["validation"] = where["train"] if record_column else \
                f"the held-out {validation_split_percentage}% of {where['train']}"
    limits = {"train": max_train_samples, "validation": max_eval_samples, "test": max_eval_samples}
    return {split: ds if limits[split] is None else ds.select(range(min(limits[split], len(ds))))
            for split, ds in splits.items()}, where


def _read_splits(source, include_test):
    """({split: Dataset with every column}, {split: where}) from the files or the dataset name."""
    where = {}
    if source.dataset_name:
        splits = {split: class_names(ds) for split, ds in data.load_hub(source).items()}
        where = {s: f"dataset {data.one_dataset(source)[0]} ({s})" for s in splits}
    else:
        splits = {"train": data.load_files(source.train_file, "--train_file", source)}
    for split, flag in (("validation", "validation_file"), ("test", "test_file")):
        files = getattr(source, flag)
        if files and (split != "test" or include_test):
            splits[split] = data.load_files(files, f"--{flag}", source)
        if files:
            where[split] = f"--{flag} {', '.join(files)}"
    if source.train_file:
        where["train"] = f"--train_file {', '.join(source.train_file)}"
    if include_test and "test" not in splits:
        raise UserError("--do_predict predicts the test examples but there are none; pass --test_file FILE")
    if not include_test:
        splits.pop("test", None)
    for split, ds in splits.items():
        if len(ds) == 0:
            raise UserError(f"{where[split]} holds no examples; pass a file with examples")
    return splits, where


def class_names(ds):
    """The dataset with each ClassLabel column's ids as their class names (-1, no label: None), as transformers'
    example scripts name a hub dataset's classes; a dataset without one as it is."""
    named = {c: f for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}
    if not named:
        return ds
    features = datasets.Features({c: datasets.Value("string") if c in named else f for c, f in ds.features.items()})
    return ds.map(_names_of_ids, batched=True, features=features, fn_kwargs={"named": named},
                  desc="class names")


def _names_of_ids(batch, named):
    return {c: [f.int2str(int(v)) if v is not None and v >= 0 else None for v in batch[c]] for c, f in named.items()}


def _examples(ds, task, where, labeled):
    columns = ", ".join(ds.column_names)
    first = task.sentence1_column or _default_text_column(ds, task, where)
    for flag, column in (("--sentence1_column", first), ("--sentence2_column", task.sentence2_column)):
        if column is not None and column not in ds.column_names:
            pair = (f"; {task.name} is a sentence-pair task: each example needs columns {first} and "
                    f"{task.sentence2_column}" if task.sentence2_column else "")
            raise UserError(f"{where} has no column '{column}' (columns: {columns}){pair}; pass {flag} with the "
                            f"column that holds the text, or fix the file")
    text1 = _texts(ds[first], first, where)
    text2 = _texts(ds[task.sentence2_column], task.sentence2_column, where) if task.sentence2_column else None
    labels = ds[task.label_column] if task.label_column in ds.column_names else None
    if labels is None and labeled:
        raise UserError(f"{where} has no label column '{task.label_column}' (columns: {columns}); pass "
                        f"--label_column with the column that holds the labels")
    if labels is not None and not labeled and all(v is None or v == -1 for v in labels):
        labels = None  # GLUE's test files mark their hidden labels -1
    return Examples(where, text1, text2, labels)


def _default_text_column(ds, task, where):
    """'sentence', else 'text', else the only string column besides the label and second sentence."""
    for name in ("sentence", "text"):
        if name in ds.column_names:
            return name
    types = data.column_types(ds, where)
    strings = [c for c, is_str in types.items() if is_str and c not in (task.label_column, task.sentence2_column)]
    if len(strings) != 1:
        raise UserError(f"cannot tell which column of {where} holds the sentence (columns: "
                        f"{', '.join(ds.column_names)}); pass --sentence1_column")
    return strings[0]


def _texts(values, column, where):
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise UserError(f"example {i} of {where} has no text in column '{column}' (found {v!r}); fill it in or "
                            f"drop the example")
    return list(values)


# ---------------------------------------------------------------------------------------------
# labels


def _label_key(value):
    """A class label as int (ids, 0/1, 1.0, true) or str (names), for sorting and naming."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def label_names(examples, existing=None):
    """The class names of the training labels: sorted (numbers numerically, names alphabetically), so the ids are
    stable. `existing`: a checkpoint's id2label; when it names exactly these classes, its order is kept."""
    keys = set()
    for i, v in enumerate(examples.labels):
        key = _label_key(v)
        if key is None:
            raise UserError(f"example {i} of {examples.where} has no usable label ({v!r}); give every training "
                            f"example a class name or id")
        keys.add(key)
    numeric = all(isinstance(k, int) for k in keys)
    names = [str(k) for k in sorted(keys, key=(lambda k: k) if numeric else str)]
    if len(names) < 2:
        raise UserError(f"the training labels of {examples.where} hold only one class ({', '.join(names)}); "
                        f"a classifier needs at least two (or pass --is_regression for numbers)")
    if existing and sorted(existing.values()) == sorted(names):
        names = [existing[i] for i in sorted(existing)]
    return names


def label_ids(examples, names):
    """int32 [N] class ids of the examples' labels; a label not among `names` (the training classes) is an error."""
    index = {name: i for i, name in enumerate(names)}
    out = np.empty(len(examples.labels), np.int32)
    for i, v in enumerate(examples.labels):
        key = _label_key(v)
        if key is None or str(key) not in index:
            raise UserError(f"label {v!r} of example {i} of {examples.where} is not one of the training labels "
                            f"({', '.join(names)}); fix the label or add training examples of that class")
        out[i] = index[str(key)]
    return out


def label_values(examples):
    """float32 [N] regression targets."""
    out = np.empty(len(examples.labels), np.float32)
    for i, v in enumerate(examples.labels):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            raise UserError(f"label {v!r} of example {i} of {examples.where} is not a number, which --is_regression "
                            f"needs; fix the label or drop --is_regression") from None
    if not np.isfinite(out).all():
        raise UserError(f"{examples.where} has a label that is not a finite number; fix it")
    return out


# ---------------------------------------------------------------------------------------------
# token rows


def token_rows(examples, tokenizer, max_seq_length, config, names):
    """{split: {"input_ids", "attention_mask", "token_type_ids": int32 [N, W], "labels": int32 or float32 [N]}},
    W the longest tokenized example over all splits rounded up to ROUND_WIDTH (at most max_seq_length): a pair
    is truncated longest-first and framed by the tokenizer's special tokens. names None: regression. An unlabeled
    test split has labels 0 (and is only predicted). Token types are zero for a model with one type (RoBERTa)."""
    if tokenizer.pad_token_id is None:
        raise UserError("the tokenizer has no pad token, which sentence prediction needs; use a tokenizer with one")
    encoded = {}
    for split, ex in examples.items():
        enc = tokenizer(ex.text1, ex.text2, truncation=True, max_length=max_seq_length, return_token_type_ids=True,
                        return_attention_mask=False, verbose=False)
        encoded[split] = (enc["input_ids"], enc["token_type_ids"])
    longest = max(len(ids) for ids, _ in encoded.values() for ids in ids)
    width = min(max_seq_length, -(-longest // ROUND_WIDTH) * ROUND_WIDTH)
    one_type = getattr(config, "type_vocab_size", 2) < 2
    out = {}
    for split, (ids, types) in encoded.items():
        n = len(ids)
        lengths = np.fromiter(map(len, ids), np.int64, n)
        real_NW = np.arange(width) < lengths[:, None]
        input_ids = np.full((n, width), tokenizer.pad_token_id, np.int32)
        input_ids[real_NW] = np.concatenate([np.asarray(x, np.int32) for x in ids]) if n else []
        token_types = np.zeros((n, width), np.int32)
        if not one_type:
            token_types[real_NW] = np.concatenate([np.asarray(x, np.int32) for x in types]) if n else []
        ex = examples[split]
        if ex.labels is None:
            labels = np.zeros(n, np.float32 if names is None else np.int32)
        else:
            labels = label_values(ex) if names is None else label_ids(ex, names)
        out[split] = {"input_ids": input_ids, "attention_mask": real_NW.astype(np.int32),
                      "token_type_ids": token_types, "labels": labels}
    return out

