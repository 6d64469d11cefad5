"""Several text sources mixed by weight, for the pretraining scripts: files or hub datasets.

    --train_file books.txt news.txt 'web/*.jsonl' --train_file_weights 0.6 0.3 0.1
    --dataset_name oscar wikipedia --dataset_config_name unshuffled_deduplicated_no 20231101.no \
        --dataset_weights 0.7 0.3

    weights = mixture_weights(source, prep)        # checked before --output_dir is made; None without weights
    raw = load_text(source, weights, 5, seed)      # raw["train"]: a Mixture of each source's text
    data = rows.from_text(raw, make_rows, 512)     # data["train"]: a Mixture of each source's rows

Each --train_file entry (a file, or a glob pattern: its files together) or --dataset_name (with its
--dataset_config_name) is one source, read as a lone one is; its rows are made by the script's row function on
its own (a block never spans two sources), then drawn by weight (flaxlm.data.mixture; metrics.jsonl names each
source after its file or dataset: books_rows, books_epochs). Validation: --validation_file as without weights;
else each source's own (a dataset's validation split, or its hold-out of --validation_split_percentage, seeded as
a lone source's), concatenated, so every source is evaluated, in proportion to its size. --test_file or each
dataset's test split likewise. --max_train_samples keeps the first rows of each source. Without weights, several
files stay one source (load_raw_text). A stream cannot be mixed (its rows cannot be drawn at random):
mixture_weights says to prepare each source once and mix the prepared directories.
"""
import dataclasses
import glob
import os

import datasets

from flaxlm.data.mixture import Mixture, check_weights, unique_names
from flaxlm.data.text import COMPRESSIONS, datasets_named, load_raw_text, one_dataset
from flaxlm.errors import UserError


def mixture_weights(source, prep):
    """The weights of --train_file_weights or --dataset_weights (prep: PreparedDataArgs) once checked against the
    sources they weigh; None without weights. A UserError for no or one source, another count, bad weights, both
    flags, --streaming, or several datasets without weights."""
    if prep.train_file_weights is not None and prep.dataset_weights is not None:
        raise UserError("pass --train_file_weights with --train_file or --dataset_weights with --dataset_name, "
                        "not both")
    if prep.train_file_weights is not None:
        weights, flag, sources_flag, sources = (prep.train_file_weights, "--train_file_weights", "--train_file",
                                                source.train_file)
    elif prep.dataset_weights is not None:
        weights, flag, sources_flag, sources = (prep.dataset_weights, "--dataset_weights", "--dataset_name",
                                                datasets_named(source))
    else:
        if source.dataset_name:
            one_dataset(source)  # several datasets need --dataset_weights
        return None
    if not sources:
        raise UserError(f"{flag} weighs the sources of {sources_flag}, which is not given; pass them (with "
                        f"--prepared_data: --prepared_data_weights)")
    if len(sources) == 1:
        raise UserError(f"{flag} weighs several {sources_flag} sources but one is given; pass more or drop the "
                        f"weights")
    check_weights(weights, len(sources), flag, sources_flag)
    if source.streaming:
        raise UserError(f"{flag} cannot mix streams (their rows cannot be drawn at random); drop --streaming, or "
                        f"prepare each source once (prepare_data.py {sources_flag} A --output_dir prepared/A ...) "
                        f"and mix them with --prepared_data prepared/A prepared/B --prepared_data_weights")
    return weights


def load_text(source, weights, validation_split_percentage=5, seed=42, keep_linebreaks=False,
              include_test=False):
    """load_raw_text's {split: dataset}; with weights (mixture_weights'), "train" a Mixture of each source's text
    and "validation" (and "test") each source's concatenated, or those of --validation_file (--test_file)."""
    if weights is None:
        return load_raw_text(source, validation_split_percentage, seed, keep_linebreaks, include_test)
    sources = source.train_file or datasets_named(source)
    own_validation, own_test = not source.validation_file, not source.test_file
    parts = [load_raw_text(_one_source(source, one, first=i == 0),
                           validation_split_percentage if own_validation or i == 0 else 0, seed, keep_linebreaks,
                           include_test and (own_test or i == 0))
             for i, one in enumerate(sources)]
    raw = {"train": Mixture([p["train"] for p in parts], weights, source_names(source))}
    for split, own in (("validation", own_validation), ("test", own_test)):
        held = [p[split] for p in (parts if own else parts[:1]) if split in p]
        if held:
            raw[split] = datasets.concatenate_datasets(held)
    return raw


def _one_source(source, one, first):
    """The text options of one source (a file, or a dataset's (name, config)); the validation and test files go
    with the first source only."""
    if isinstance(one, str):
        source = dataclasses.replace(source, train_file=[one])
    else:
        source = dataclasses.replace(source, dataset_name=[one[0]], dataset_config_name=one[1:] if one[1] else None)
    return dataclasses.replace(source, validation_file=source.validation_file if first else None,
                               test_file=source.test_file if first else None)


def source_names(source):
    """Each source's name in metrics.jsonl: its file's name without extensions (a glob pattern: its folder's), or
    its dataset's (with its configuration)."""
    if not source.train_file:
        return unique_names([_dataset_label(name, config) for name, config in datasets_named(source)])
    names = []
    for path in source.train_file:
        base = os.path.basename(path)
        if glob.has_magic(base):
            base = os.path.basename(os.path.dirname(os.path.abspath(path)))
        for c in COMPRESSIONS:
            base = base.removesuffix(c)
        names.append(os.path.splitext(base)[0] if "." in base[1:] else base)
    return unique_names(names)


def _dataset_label(name, config):
    """oscar_unshuffled_deduplicated_no for the dataset oscar's configuration unshuffled_deduplicated_no."""
    base = os.path.basename(name.rstrip("/"))
    return base if config in (None, "default") else f"{base}_{config}"
