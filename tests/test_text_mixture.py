"""--train_file a b c --train_file_weights (and --dataset_name a b --dataset_weights): each file (dataset) a source
of its own rows, drawn by weight (the sampling itself: test_mixture.py), each source's hold-out validated, a run
resumed exactly, each source counted in metrics.jsonl; bad weights refused before --output_dir is made."""
import types

import numpy as np
import pytest

import run_clm_flax
import run_mlm_flax
import run_t5_mlm_flax
from run_helpers import assert_resume_matches, expect_user_error, mixture_counts, read_metrics
from test_data import corpus, src, write
from flaxlm.data import rows
from flaxlm.data.mixture import MixedRows
from flaxlm.data.text_mixture import load_text, source_names
from flaxlm.errors import UserError
from flaxlm.tokenization.trainers import train_bpe

WORDS = (("sol", "regn", "vind", "snø"), ("hav", "fjell", "skog", "elv"), ("hund", "katt", "fugl", "fisk"))
WEIGHTS = (0.6, 0.3, 0.1)


def source_files(tmp_path, n_lines=(120, 60, 200)):
    """Three text files, each of lines of its own words (so a row tells its file)."""
    rng = np.random.default_rng(0)
    return [write(tmp_path / name, [" ".join(rng.choice(words, 6)) for _ in range(n)])
            for name, words, n in zip(("books.txt", "news.txt", "web.txt"), WORDS, n_lines)]


def test_a_3_file_mixture_draws_each_files_rows_by_weight_and_holds_out_each_file(tmp_path):
    tokenizer = train_bpe(corpus(300), vocab_size=400, model_max_length=64)
    files = source_files(tmp_path)
    raw = load_text(src(tmp_path, train_file=files), WEIGHTS, validation_split_percentage=10, seed=1)
    held_out = raw["validation"]["text"][:]
    assert len(held_out) == 12 + 6 + 20  # each file's 10 %, in file order
    assert [next(i for i in range(3) if set(t.split()) <= set(WORDS[i])) for t in held_out] == \
        [0] * 12 + [1] * 6 + [2] * 20

    data = rows.from_text(raw, rows.blocks(tokenizer, 16), 16)
    ids = [set(tokenizer(" ".join(words))["input_ids"]) - set(tokenizer.all_special_ids) for words in WORDS]
    assert not ids[0] & ids[1] and not ids[1] & ids[2] and not ids[0] & ids[2]  # a row tells its file
    args = types.SimpleNamespace(seed=3, max_steps=100)
    mixed = rows.run_rows(data, args, global_batch=64)[0]

    def file_of_each_row(train_rows):
        drawn = np.concatenate([train_rows.batch_rows(s, slice(None)) for s in range(100)])
        return np.array([next(i for i in range(3) if set(row) & ids[i]) for row in drawn])

    got = file_of_each_row(mixed)
    share = np.bincount(got, minlength=3) / len(got)
    sigma = np.sqrt(np.array(WEIGHTS) * (1 - np.array(WEIGHTS)) / len(got))
    assert np.all(np.abs(share - WEIGHTS) < 4 * sigma), share
    assert np.array_equal(got, file_of_each_row(rows.run_rows(data, args, global_batch=64)[0]))  # same seed
    fields = mixed.log_fields(100)
    assert [fields[f"{name}_rows"] for name in ("books", "news", "web")] == list(np.bincount(got, minlength=3))
    assert fields["web_tokens"] == 16 * fields["web_rows"] and fields["books_epochs"] > 1
    cut = rows.from_text(raw, rows.blocks(tokenizer, 16), 16, max_train_samples=5)  # the first rows of each source
    assert [len(s) for s in cut["train"].sources] == [5, 5, 5]
    kept = load_text(src(tmp_path, train_file=files), WEIGHTS, validation_split_percentage=0, keep_linebreaks=True)
    assert all(ds["text"][0].endswith("\n") for ds in kept["train"].sources)  # run_clm_flax's lines run on


def test_source_names_come_from_the_files_or_datasets(tmp_path):
    names = lambda **kw: source_names(src(tmp_path, **kw))  # noqa: E731
    assert names(train_file=["a/books.txt", "b/news.jsonl.gz", "web/*.txt"]) == ["books", "news", "web"]
    assert names(train_file=["x/books.txt", "y/books.txt"]) == ["books_1", "books_2"]
    assert names(dataset_name=["oscar", "org/wiki"], dataset_config_name=["no", "default"]) == ["oscar_no", "wiki"]


def dataset_folders(tmp_path, lines=20):
    """Two local dataset folders (read as hub datasets are, no network): nb with a validation split, nn without."""
    folders = []
    for name, words, has_validation in (("nb", WORDS[0], True), ("nn", WORDS[1], False)):
        folder = tmp_path / name
        folder.mkdir()
        write(folder / "train.txt", [" ".join(words)] * lines)
        if has_validation:
            write(folder / "validation.txt", ["valideringstekst"])
        folders.append(str(folder))
    return folders


def test_hub_datasets_mix_with_their_own_validation_splits(tmp_path):
    """nb's validation split and nn's held-out 10 % are the validation text."""
    folders = dataset_folders(tmp_path)
    raw = load_text(src(tmp_path, dataset_name=folders), [0.5, 0.5], validation_split_percentage=10)
    assert raw["train"].names == ["nb", "nn"] and [len(ds) for ds in raw["train"].sources] == [20, 18]
    assert raw["validation"]["text"][:] == ["valideringstekst"] + [" ".join(WORDS[1])] * 2
    with pytest.raises(UserError, match="names 2 datasets but this reads one; mix several with --dataset_weights"):
        load_text(src(tmp_path, dataset_name=folders), None)
    with pytest.raises(UserError, match="1 configurations for 2 datasets"):
        load_text(src(tmp_path, dataset_name=folders, dataset_config_name=["default"]), [1, 1])


@pytest.fixture(scope="module")
def model_dir(model_dir_for):
    return model_dir_for("roberta-tiny", vocab_size=400)


def test_a_text_mixture_run_resumes_exactly_and_logs_each_source(model_dir, corpus, tmp_path, monkeypatch):
    """Two files mixed 3:1 (held-out validation from each): a crashed run resumed sees the rows of the straight one;
    metrics.jsonl's "data" rows count each file's rows and tokens."""
    files = source_files(tmp_path)[:1] + [corpus["train"]]

    def args_for(out, *extra):
        return ["--output_dir", str(out), "--config_name", model_dir, "--tokenizer_name", model_dir,
                "--per_device_train_batch_size", "1", "--max_seq_length", "32", "--max_steps", "2",
                "--logging_steps", "1", "--save_steps", "1", "--eval_steps", "2", "--max_eval_samples", "16",
                "--validation_split_percentage", "10", "--train_file", *files, "--train_file_weights", "3", "1",
                "--cache_dir", str(tmp_path / "cache"), *extra]

    assert_resume_matches(run_mlm_flax.main, args_for, monkeypatch, tmp_path, steps=2, crash_step=1,
                          rows_class=MixedRows)
    counts = mixture_counts(tmp_path, steps=2)
    assert counts["books_rows"] + counts["train_small_rows"] == 2 * 8  # two global batches of 8 rows
    assert counts["books_tokens"] == 32 * counts["books_rows"] and counts["train_small_epochs"] > 0


@pytest.mark.parametrize("extra, match", [
    (("--train_file_weights", "1"), "1 weights for 2 sources"),
    (("--train_file_weights", "1", "-1"), "weight -1.0"),
    (("--train_file_weights", "1", "inf"), "inf is not a finite number"),
    (("--train_file_weights", "0", "0"), "all zero"),
    (("--train_file_weights", "1", "1", "--streaming"), "cannot mix streams.*--prepared_data_weights"),
    (("--dataset_weights", "1", "1"), "--dataset_weights weighs the sources of --dataset_name, which is not given"),
    (("--train_file_weights", "1", "1", "--dataset_weights", "1", "1"), "not both"),
])
@pytest.mark.parametrize("main", [run_mlm_flax.main, run_clm_flax.main, run_t5_mlm_flax.main])
def test_bad_weights_are_refused_before_the_output_dir_is_made(main, extra, match, tmp_path):
    a, b = source_files(tmp_path, (5, 5, 5))[:2]
    out = tmp_path / "run"
    expect_user_error(main, ["--output_dir", str(out), "--train_file", a, b, *extra], match)
    assert not out.exists()


def test_weights_need_several_sources(tmp_path):
    a = source_files(tmp_path, (5, 5, 5))[0]
    out = tmp_path / "run"
    expect_user_error(run_mlm_flax.main, ["--output_dir", str(out), "--train_file", a, "--train_file_weights", "1"],
                      "several --train_file sources but one is given")
    expect_user_error(run_mlm_flax.main, ["--output_dir", str(out), "--dataset_name", "x", "--dataset_weights", "1"],
                      "several --dataset_name sources but one is given")
    expect_user_error(run_mlm_flax.main, ["--output_dir", str(out), "--dataset_name", "x", "y"],
                      "names 2 datasets but this reads one; mix several with --dataset_weights")
    expect_user_error(run_mlm_flax.main, ["--output_dir", str(out), "--prepared_data", a,
                                          "--train_file_weights", "1"],
                      "--train_file, which is not given.*--prepared_data_weights")
    assert not out.exists()


def test_run_clm_trains_on_a_mixture_of_datasets(tiny_gpt2_dir, tmp_path):
    """run_clm_flax.py with two datasets 1:1: both drawn from, each counted in metrics.jsonl under its name."""
    out = tmp_path / "run"
    run_clm_flax.main(["--output_dir", str(out), "--config_name", tiny_gpt2_dir, "--tokenizer_name", tiny_gpt2_dir,
                       "--dataset_name", *dataset_folders(tmp_path, lines=200), "--dataset_weights", "1", "1",
                       "--block_size", "16", "--per_device_train_batch_size", "2", "--max_steps", "1",
                       "--do_eval", "false", "--cache_dir", str(tmp_path / "cache")])
    counts = read_metrics(out, "data")[-1]
    assert counts["nb_rows"] + counts["nn_rows"] == 16 and counts["nb_rows"] > 0 and counts["nn_rows"] > 0
