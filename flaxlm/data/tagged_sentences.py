"""Token-classification data: sentences of words, each word with a tag, from CoNLL-U files (flaxlm.data.conllu),
JSON lines ({"tokens": [...], "tags": [...]}, column names set by --tokens_column / --tags_column) or a `datasets`
dataset with such columns (--dataset_name), split into train / validation (/ test), and the tag names the classifier
predicts.

    splits = load_sentences(source, args, validation_split_percentage=10, seed=42)   # {split: Sentences}
    names = tag_names(splits, existing=None)                                           # the classifier's labels

Every sentence is kept in file order, so row i of a split is its sentence i (held-out validation sentences keep
their order in the file too).
"""
import dataclasses
import json
import os

import numpy as np

from flaxlm.data.conllu import read_conllu
from flaxlm.errors import UserError

CONLLU_SUFFIXES = (".conllu", ".conll")
JSON_SUFFIXES = (".jsonl", ".json")


@dataclasses.dataclass
class Sentences:
    where: str  # the flag and files they came from, for messages
    words: list  # [[word, ...], ...]
    tags: list | None  # [[tag, ...], ...]; None: an unlabeled test split


def load_sentences(source, args, validation_split_percentage, seed, include_test=False, max_train_samples=None,
                   max_eval_samples=None, need_validation=True):
    """{"train", "validation"[, "test"]: Sentences} from --train_file / --validation_file / --test_file (CoNLL-U or
    JSON lines; args: TokenClassificationArgs), or from the splits of --dataset_name (words in --tokens_column, tags
    in --tags_column). Without validation sentences, validation_split_percentage % of the training sentences are
    held out (seeded); with a percentage of 0 and need_validation False (--do_eval false) there is no "validation".
    The test split may be unlabeled."""
    if source.dataset_name and source.train_file:
        raise UserError("pass either --dataset_name or --train_file, not both")
    if not (source.dataset_name or source.train_file):
        raise UserError("no training sentences: pass --train_file FILE (CoNLL-U .conllu, or JSON lines .jsonl with "
                        "tokens and tags) or --dataset_name NAME (a column of words, one of tags)")
    hub = hub_sentences(source, args) if source.dataset_name else {}
    out = {"train": hub.get("train") or _read(source.train_file, "--train_file", args, labeled=True)}
    if source.validation_file:
        out["validation"] = _read(source.validation_file, "--validation_file", args, labeled=True)
    elif "validation" in hub:
        out["validation"] = hub["validation"]
    elif validation_split_percentage:
        out["train"], out["validation"] = hold_out(out["train"], validation_split_percentage, seed)
    elif need_validation:
        raise UserError(f"no validation sentences: pass --validation_file FILE, or a --validation_split_percentage "
                        f"above 0 to hold some of {out['train'].where} out")
    if include_test:
        if not (source.test_file or "test" in hub):
            raise UserError("--do_predict predicts the test sentences but there are none; pass --test_file FILE")
        out["test"] = _read(source.test_file, "--test_file", args, labeled=False) if source.test_file else hub["test"]
    limits = {"train": max_train_samples, "validation": max_eval_samples, "test": max_eval_samples}
    return {split: _first(s, limits[split]) for split, s in out.items()}


def hub_sentences(source, args):
    """{split: Sentences} of --dataset_name: each row's words in --tokens_column, its tags in --tags_column (a
    sequence of class ids: their ClassLabel names, as transformers' run_ner.py reads a hub dataset's tags)."""
    from flaxlm.data import text
    name = text.one_dataset(source)[0]
    out = {}
    for split, ds in text.load_hub(source).items():
        where = f"dataset {name} ({split})"
        for flag, column, what in (("--tokens_column", args.tokens_column, "words"),
                                   ("--tags_column", args.tags_column, "tags")):
            if column not in ds.column_names:
                raise UserError(f"{where} has no column '{column}' (columns: {', '.join(ds.column_names)}); pass "
                                f"{flag} with the column that holds each sentence's {what}")
        names = getattr(getattr(ds.features[args.tags_column], "feature", None), "names", None)  # ClassLabel's
        words, tags = ds[args.tokens_column], ds[args.tags_column]
        for i, (ws, ts) in enumerate(zip(words, tags)):
            if not (isinstance(ws, list) and ws and isinstance(ts, list) and len(ts) == len(ws)):
                raise UserError(f"row {i} of {where} has no list of words in '{args.tokens_column}' with one tag per "
                                f"word in '{args.tags_column}'; pass the columns that hold them")
        tags = [[names[t] if names and t >= 0 else str(t) for t in ts] for ts in tags]
        out[split] = Sentences(where, [[str(w) for w in ws] for ws in words], tags)
    return out


def hold_out(sentences, percentage, seed):
    """(train, validation): percentage % of the sentences (at least one, seeded choice) held out, order kept."""
    n = len(sentences.words)
    k = max(1, n * percentage // 100)
    if k >= n:
        raise UserError(f"--validation_split_percentage {percentage} leaves no training sentences of the {n} in "
                        f"{sentences.where}; pass a smaller percentage or --validation_file")
    held = np.zeros(n, bool)
    held[np.random.default_rng(seed).choice(n, k, replace=False)] = True
    return (_subset(sentences, ~held, sentences.where),
            _subset(sentences, held, f"the held-out {percentage}% of {sentences.where}"))


def _subset(sentences, keep, where):
    return Sentences(where, [w for w, k in zip(sentences.words, keep) if k],
                     [t for t, k in zip(sentences.tags, keep) if k])


def _first(sentences, limit):
    if limit is None:
        return sentences
    return Sentences(sentences.where, sentences.words[:limit], None if sentences.tags is None else
                     sentences.tags[:limit])


def _read(files, flag, args, labeled):
    words, tags = [], []
    for path in files:
        if not os.path.isfile(path):
            raise UserError(f"{flag} {path} does not exist; pass an existing file")
        if path.endswith(CONLLU_SUFFIXES):
            pairs = read_conllu(path, args.tag_column, labeled)
        elif path.endswith(JSON_SUFFIXES):
            pairs = read_json_lines(path, args.tokens_column, args.tags_column, labeled)
        else:
            raise UserError(f"{flag} {path}: unknown format; token classification reads CoNLL-U ("
                            f"{', '.join(CONLLU_SUFFIXES)}) and JSON lines ({', '.join(JSON_SUFFIXES)})")
        words += [w for w, _ in pairs]
        tags += [t for _, t in pairs]
    unlabeled = [t is None for t in tags]
    if any(unlabeled) and not all(unlabeled):
        raise UserError(f"{flag} {', '.join(files)}: some files have tags and some not; pass files alike")
    return Sentences(f"{flag} {', '.join(files)}", words, None if all(unlabeled) else tags)


def read_json_lines(path, tokens_column, tags_column, labeled=True):
    """[(words, tags)] of a JSON-lines file (one object per line, words in tokens_column, tags in tags_column;
    tags None for an unlabeled file read with labeled=False)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}, line {number}: not a JSON object ({e.msg}); one object per line") from None
            words = record.get(tokens_column) if isinstance(record, dict) else None
            if not (isinstance(words, list) and words and all(isinstance(w, str) for w in words)):
                raise UserError(f"{path}, line {number}: no list of words in '{tokens_column}'; pass "
                                f"--tokens_column with the key that holds them")
            tags = record.get(tags_column)
            if tags is None and not labeled:
                out.append((words, None))
                continue
            if not (isinstance(tags, list) and len(tags) == len(words)):
                raise UserError(f"{path}, line {number}: '{tags_column}' is not a list of one tag per word; pass "
                                f"--tags_column with the key that holds them, or fix the line")
            out.append((words, [str(t) for t in tags]))
    if not out:
        raise UserError(f"{path} holds no sentences; pass a file with one JSON object per line")
    return out


def tag_names(splits, existing=None):
    """The classifier's labels: the training tags sorted, then tags only the other splits have (sorted; the model
    cannot learn them, but they are scored); a checkpoint's id2label order when it names exactly these."""
    train = sorted({t for tags in splits["train"].tags for t in tags})
    if len(train) < 2:
        raise UserError(f"the training sentences of {splits['train'].where} have only one tag ({', '.join(train)}); "
                        f"token classification needs at least two")
    others = {t for s in splits.values() if s.tags for tags in s.tags for t in tags}
    names = train + sorted(others - set(train))
    if existing and sorted(existing.values()) == sorted(names):
        names = [existing[i] for i in sorted(existing)]
    return names
