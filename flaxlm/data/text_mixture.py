"""Several text sources mixed by weight, for the pretraining scripts:

    --train_file books.txt news.txt 'web/*.jsonl' --train_file_weights 0.6 0.3 0.1

    check_options(source, weights)                 # before --output_dir is made
    raw = load_text(source, weights, 5, seed)      # raw["train"]: a Mixture of each source's text
    data = rows.from_text(raw, make_rows, 512)     # data["train"]: a Mixture of each source's rows

Each --train_file entry (a file, or a glob pattern: its files together) is one source, read as one file is
without weights; its rows are made by the script's row function on its own (a block never spans two sources),
then drawn by weight (flaxlm.data.mixture; metrics.jsonl names each source after its file: books_rows,
books_epochs). Validation: --validation_file as without weights; else each source's own hold-out of
--validation_split_percentage (seeded as one file's), concatenated, so every source is evaluated in proportion
to its size. --max_train_samples keeps the first rows of each source. Without weights, several files stay one
source (load_raw_text). A stream cannot be mixed (its rows cannot be drawn at random): check_options says to
prepare each source once and mix the prepared directories.
"""
import dataclasses
import glob
import os

import datasets

from flaxlm.data.mixture import Mixture, check_weights, unique_names
from flaxlm.data.text import COMPRESSIONS, load_raw_text
from flaxlm.errors import UserError


def check_options(source, weights):
    """UserError for --train_file_weights that cannot weigh --train_file (no or one file, another count, bad
    weights, --streaming, --dataset_name); nothing without weights."""
    if weights is None:
        return
    if not source.train_file:
        raise UserError("--train_file_weights weighs the files of --train_file, which is not given; pass the "
                        "files (with --prepared_data: --prepared_data_weights)")
    if len(source.train_file) == 1:
        raise UserError("--train_file_weights weighs several --train_file sources but one is given; pass more "
                        "files or drop the weights")
    check_weights(weights, len(source.train_file))
    if source.streaming:
        raise UserError("--train_file_weights cannot mix streams (their rows cannot be drawn at random); drop "
                        "--streaming, or prepare each file once (prepare_data.py --train_file A --output_dir "
                        "prepared/A ...) and mix them with --prepared_data prepared/A prepared/B "
                        "--prepared_data_weights")


def load_text(source, weights, validation_split_percentage=5, seed=42, keep_linebreaks=False,
              include_test=False):
    """load_raw_text's {split: dataset}; with weights, "train" a Mixture of each source's text and "validation"
    their hold-outs concatenated (module docstring)."""
    check_options(source, weights)
    if weights is None:
        return load_raw_text(source, validation_split_percentage, seed, keep_linebreaks, include_test)
    parts = [load_raw_text(_one_source(source, f, first=i == 0),
                           0 if source.validation_file and i > 0 else validation_split_percentage, seed,
                           keep_linebreaks, include_test and i == 0)
             for i, f in enumerate(source.train_file)]
    raw = {"train": Mixture([p["train"] for p in parts], weights, source_names(source.train_file))}
    held_out = [p["validation"] for p in parts if "validation" in p]
    if held_out:
        raw["validation"] = datasets.concatenate_datasets(held_out)
    if include_test:
        raw["test"] = parts[0]["test"]
    return raw


def _one_source(source, train_file, first):
    """The text options of one source: its file; the validation and test files go with the first source only."""
    return dataclasses.replace(source, train_file=[train_file], validation_file=source.validation_file if first
                               else None, test_file=source.test_file if first else None)


def source_names(paths):
    """Each source's name in metrics.jsonl: its file's name without extensions (a glob pattern: its folder's)."""
    names = []
    for path in paths:
        base = os.path.basename(path)
        if glob.has_magic(base):
            base = os.path.basename(os.path.dirname(os.path.abspath(path)))
        for c in COMPRESSIONS:
            base = base.removesuffix(c)
        names.append(os.path.splitext(base)[0] if "." in base[1:] else base)
    return unique_names(names)
