"""prepare_data.py and --prepared_data: compact rows on disk equal to the rows the training scripts make from text,
their checks (tokenizer, length, damaged shards), an interrupted preparation resumed, and training from them."""
import json
import os

import numpy as np
import pytest

import prepare_data
import run_helpers
import run_mlm_flax
from run_helpers import assert_resume_matches, expect_user_error, read_metrics
from test_data import corpus as make_corpus
from flaxlm.config.options import DataArgs, TextSourceArgs
from flaxlm.data import preparing, rows
from flaxlm.data.mixture import MixedRows
from flaxlm.data.prepared import load_rows
from flaxlm.data.text import load_raw_text
from flaxlm.errors import UserError
from flaxlm.tokenization.loading import load_tokenizer

NO_TEXT = TextSourceArgs()


@pytest.fixture(scope="module")
def model_dir(model_dir_for):
    """A 400-token BPE tokenizer and a tiny RoBERTa config (test_run_mlm's)."""
    return model_dir_for("roberta-tiny", vocab_size=400)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """2,500 lines (three batches of texts) with a blank one, and a validation file."""
    d = tmp_path_factory.mktemp("text")
    (d / "train.txt").write_text("\n".join(make_corpus(2500)[:1200] + [""] + make_corpus(2500)[1200:]) + "\n")
    (d / "valid.txt").write_text("\n".join(make_corpus(300, seed=1)) + "\n")
    return {"train": str(d / "train.txt"), "validation": str(d / "valid.txt"), "cache": str(d / "cache")}


def prepare(model_dir, text, out, *flags, split_validation=False):
    files = ["--train_file", text["train"]] + ([] if split_validation else ["--validation_file", text["validation"]])
    prepare_data.main(["--tokenizer_name", model_dir, *files, "--output_dir", str(out), "--cache_dir", text["cache"],
                       *flags])


def rows_from_text(model_dir, text, make_rows_for, length, split_validation=False, keep_linebreaks=False):
    """{split: int32 rows} as the training script makes them from the same files."""
    source = TextSourceArgs(train_file=[text["train"]], cache_dir=text["cache"],
                            validation_file=None if split_validation else [text["validation"]])
    raw = load_raw_text(source, keep_linebreaks=keep_linebreaks)
    made = rows.from_text(raw, make_rows_for(load_tokenizer(model_dir)), length)
    return {split: rows.as_numpy_rows(ds) for split, ds in made.items()}


def load(model_dir, out, function="blocks", length=32, **kw):
    return load_rows(str(out), load_tokenizer(model_dir), function, length, source=NO_TEXT, data_args=DataArgs(),
                     **kw)


def all_rows(split_rows):
    return split_rows.rows_at(np.arange(len(split_rows)))


@pytest.mark.parametrize("objective,function,flags", [
    ("mlm", "blocks", ["--max_seq_length", "32"]),
    ("clm", "documents", ["--block_size", "32"]),
    ("mlm", "lines", ["--max_seq_length", "32", "--line_by_line"]),
])
def test_prepared_rows_are_the_rows_the_script_makes_from_text(objective, function, flags, model_dir, text,
                                                               tmp_path):
    """uint16 on disk, int32 back, equal to the script's rows; the held-out validation split too."""
    prepare(model_dir, text, tmp_path / "p", "--objective", objective, *flags, split_validation=True)
    makers = {"blocks": lambda t: rows.blocks(t, 32), "lines": lambda t: rows.lines(t, 32),
              "documents": lambda t: rows.documents(t, 32, eos=t.eos_token_id)}
    expected = rows_from_text(model_dir, text, makers[function], 32, split_validation=True,
                              keep_linebreaks=objective == "clm")
    got = load(model_dir, tmp_path / "p", function)
    assert set(got) == set(expected) == {"train", "validation"}
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["rows"]["dtype"] == "<u2" and manifest["rows"]["function"] == function
    for split, want in expected.items():
        have = all_rows(got[split])
        for column in (want if isinstance(want, dict) else {"input_ids": want}):
            w = want[column] if isinstance(want, dict) else want
            h = have[column] if isinstance(have, dict) else have
            assert h.dtype == np.int32 and np.array_equal(h, w), (split, column)
        shard = manifest["splits"][split][0]
        assert os.path.getsize(tmp_path / "p" / f"{shard['name']}.input_ids") == shard["rows"] * 32 * 2


def test_streamed_text_gives_the_rows_of_a_streaming_run(model_dir, text, tmp_path):
    """--streaming: no copy of the text in the datasets cache; the rows (held-out ones too) of StreamedRows."""
    prepare(model_dir, text, tmp_path / "p", "--max_seq_length", "32", "--streaming", "--shard_size_mb", "0.05",
            split_validation=True)
    source = TextSourceArgs(train_file=[text["train"]], streaming=True)
    made = rows.from_text(load_raw_text(source), rows.blocks(load_tokenizer(model_dir), 32), 32)
    got = load(model_dir, tmp_path / "p")
    assert len(got["train"].shards) > 1
    for split in ("train", "validation"):
        assert np.array_equal(all_rows(got[split]), np.stack(list(made[split])))


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_two_workers_give_the_rows_of_the_script_on_each_workers_text(kind, model_dir, text, tmp_path):
    """.txt files: each job reads its own byte range (cut at a line start; no copy of the text in the datasets
    cache), and its rows are the script's rows of that piece of text. Other files (jsonl) go through datasets: the
    rows of the script with two workers."""
    files = {split: text[split] for split in ("train", "validation")}
    if kind == "jsonl":
        for split, path in files.items():
            files[split] = str(tmp_path / f"{split}.jsonl")
            with open(path, encoding="utf-8") as f, open(files[split], "w", encoding="utf-8") as out:
                out.writelines(json.dumps({"text": line.rstrip("\n")}) + "\n" for line in f)
    cache = tmp_path / "cache"
    prepare_data.main(["--tokenizer_name", model_dir, "--train_file", files["train"], "--validation_file",
                       files["validation"], "--output_dir", str(tmp_path / "p"), "--cache_dir", str(cache),
                       "--max_seq_length", "32", "--preprocessing_num_workers", "2"])
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert len(manifest["splits"]["train"]) == 2 and manifest["text"]["read"] == {"txt": "byte ranges",
                                                                                  "jsonl": "datasets"}[kind]
    got = load(model_dir, tmp_path / "p")
    tokenizer = load_tokenizer(model_dir)
    for split in ("train", "validation"):
        if kind == "jsonl":
            source = TextSourceArgs(train_file=[files["train"]], validation_file=[files["validation"]],
                                    cache_dir=text["cache"])
            want = rows.as_numpy_rows(rows.from_text(load_raw_text(source), rows.blocks(tokenizer, 32), 32,
                                                     num_workers=2)[split])
        else:
            data = open(files[split], "rb").read()
            pieces = [data[a:b] for a, b in manifest["jobs"][split]]
            assert len(pieces) == 2 and b"".join(pieces) == data and pieces[0].endswith(b"\n")
            want = []
            for i, piece in enumerate(pieces):
                (tmp_path / f"{split}{i}.txt").write_bytes(piece)
                source = TextSourceArgs(train_file=[str(tmp_path / f"{split}{i}.txt")], cache_dir=text["cache"])
                raw = load_raw_text(source, validation_split_percentage=0)
                want.append(rows.as_numpy_rows(rows.from_text(raw, rows.blocks(tokenizer, 32), 32)["train"]))
            want = np.concatenate(want)
        assert np.array_equal(all_rows(got[split]), want), split
    assert cache.exists() == (kind == "jsonl")  # byte ranges: the text never copied


@pytest.mark.parametrize("keep_linebreaks", [False, True])
@pytest.mark.parametrize("held_out", [0, 10])
def test_byte_ranges_read_the_texts_load_raw_text_reads(keep_linebreaks, held_out, tmp_path, monkeypatch):
    """Two files cut into 1, 3 and 7 ranges, read in blocks of 97 bytes: the splits' texts (held-out ones too) are
    load_raw_text's, with CRLF and lone CR line ends, Unicode spaces and separators, blank lines, and a last line
    without a line break; bytes that are not UTF-8 are named by file and line."""
    from flaxlm.data import text_ranges
    rng = np.random.default_rng(0)
    words = ["hei", "på", "deg", "\u3000", "\x0c", "a\u2028b", "c\x85d", "  ", "\t", "æøå", "x\ry", "z\r\nw", ""]
    paths = []
    for name, n, end in (("a.txt", 3000, "\n"), ("b.txt", 2000, "")):
        lines = ["".join(rng.choice(words, rng.integers(0, 6))) for _ in range(n)]
        (tmp_path / name).write_bytes(("\n".join(lines) + end).encode("utf-8"))
        paths.append(str(tmp_path / name))
    monkeypatch.setattr(text_ranges, "BLOCK", 97)
    source = TextSourceArgs(train_file=paths, cache_dir=str(tmp_path / "cache"))
    want = load_raw_text(source, held_out, 7, keep_linebreaks=keep_linebreaks)
    splits = text_ranges.file_splits(source, held_out, 7, keep_linebreaks=keep_linebreaks)
    assert set(splits) == set(want)
    for k in (1, 3, 7):
        plan = preparing.plan_jobs(splits, k)
        assert len(plan["train"]) == k
        out = tmp_path / f"out{k}"
        out.mkdir()
        preparing.count_lines_held_out(str(out), splits, plan, preparing.share(plan, 0, 1))
        counted = preparing.with_lines_counted(str(out), splits, plan)
        for split, ds in want.items():
            got = [t for j, span in enumerate(plan[split]) for texts in counted[split].texts(span, j) for t in texts]
            assert got == ds["text"], (k, split)
    (tmp_path / "bad.txt").write_bytes(("en\n" * 50 + "to\ntre \xe6\n").encode("utf-8") + b"fire \xe6\n")
    bad = text_ranges.file_splits(TextSourceArgs(train_file=[str(tmp_path / "bad.txt")]), 0)
    with pytest.raises(UserError, match=r"--train_file .*bad.txt line 53 is not UTF-8 text \(byte 0xe6"):
        list(bad["train"].texts((0, os.path.getsize(tmp_path / "bad.txt")), 0))


def test_an_interrupted_preparation_continues_to_the_same_rows(model_dir, text, tmp_path, monkeypatch):
    """Shards of one batch of texts each; a crash after the first: the rerun keeps it and makes the rest; a
    damaged shard is made again."""
    flags = ("--max_seq_length", "32", "--shard_size_mb", "0.01")
    prepare(model_dir, text, tmp_path / "straight", *flags)
    finish, finished = preparing._ShardWriter.finish, []

    def crash_after_one(self, last):
        if finished:
            raise KeyboardInterrupt
        finish(self, last)
        finished.append(self.name)

    monkeypatch.setattr(preparing._ShardWriter, "finish", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        prepare(model_dir, text, tmp_path / "resumed", *flags)
    monkeypatch.setattr(preparing._ShardWriter, "finish", finish)
    first = tmp_path / "resumed" / f"{finished[0]}.input_ids"
    kept = first.stat().st_mtime_ns
    with pytest.raises(UserError, match="did not finish"):
        load(model_dir, tmp_path / "resumed")
    prepare(model_dir, text, tmp_path / "resumed", *flags)
    assert first.stat().st_mtime_ns == kept  # not made again
    straight, resumed = load(model_dir, tmp_path / "straight"), load(model_dir, tmp_path / "resumed")
    assert len(straight["train"].shards) == 3
    for split in straight:
        assert np.array_equal(all_rows(resumed[split]), all_rows(straight[split]))
    data = bytearray(first.read_bytes())
    data[5] ^= 1
    first.write_bytes(bytes(data))
    with pytest.raises(UserError, match=f"{finished[0]}.input_ids does not match its checksum"):
        load(model_dir, tmp_path / "resumed")
    prepare(model_dir, text, tmp_path / "resumed", *flags)  # makes the damaged shard again
    assert np.array_equal(all_rows(load(model_dir, tmp_path / "resumed")["train"]), all_rows(straight["train"]))


def test_other_settings_foreign_files_and_truncated_shards_are_refused(model_dir, text, tmp_path):
    out = tmp_path / "p"
    prepare(model_dir, text, out, "--max_seq_length", "32")
    with pytest.raises(UserError, match=r"other settings \(they differ in rows:"):
        prepare(model_dir, text, out, "--max_seq_length", "16")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not empty and holds no preparation"):
        prepare(model_dir, text, tmp_path / "mine", "--max_seq_length", "32")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(UserError, match=r"rows of 32 tokens but this run makes rows of 16"):
        load(model_dir, out, length=16)
    with pytest.raises(UserError, match=r"made by 'blocks' but this run makes 'documents'"):
        load(model_dir, out, function="documents")
    shard = out / "train-000-00000.input_ids"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(UserError, match=r"train-000-00000.input_ids has \d+ bytes, not the \d+ of its"):
        load(model_dir, out, verify=False)


def test_a_run_refuses_rows_of_another_tokenizer(model_dir, model_dir_for, text, tmp_path):
    """Checked before any training (a UserError: one line, exit 2); the message names both tokenizers."""
    other = model_dir_for(None, vocab_size=304)  # a tokenizer only (tiny_gpt2_dir's)
    prepare(other, text, tmp_path / "p", "--max_seq_length", "32")
    argv = ["--prepared_data", str(tmp_path / "p"), "--config_name", model_dir, "--tokenizer_name", model_dir,
            "--output_dir", str(tmp_path / "run"), "--max_seq_length", "32", "--max_steps", "1"]
    expect_user_error(run_mlm_flax.main, argv, r"another tokenizer \(.*304 tokens.*\) than this run's \(400 tokens")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_training_from_prepared_rows_equals_training_from_text_and_resumes(model_dir, corpus, tmp_path, monkeypatch):
    """The same losses and eval loss as the run from text; a crashed run resumed sees the rows of the straight one."""
    prepare(model_dir, {**corpus, "cache": str(tmp_path / "cache")}, tmp_path / "p", "--max_seq_length", "32")
    common = ("--max_seq_length", "32", "--learning_rate", "3e-3", "--max_steps", "2", "--save_steps", "1",
              "--eval_steps", "2")
    run_mlm_flax.main(run_helpers.run_args(model_dir, corpus, tmp_path / "text", *common))

    def prepared_args(out, *extra):
        args = run_helpers.run_args(model_dir, corpus, out, *common, *extra)
        i = args.index("--train_file")
        return args[:i] + ["--prepared_data", str(tmp_path / "p")] + args[i + 4:]

    assert_resume_matches(run_mlm_flax.main, prepared_args, monkeypatch, tmp_path, steps=2, crash_step=1)
    from_text, from_prepared = read_metrics(tmp_path / "text"), read_metrics(tmp_path / "straight")
    assert [r["loss"] for r in from_prepared] == pytest.approx([r["loss"] for r in from_text], rel=1e-6)
    assert read_metrics(tmp_path / "straight", "eval")[-1]["loss"] == pytest.approx(
        read_metrics(tmp_path / "text", "eval")[-1]["loss"], rel=1e-6)
    expect_user_error(run_mlm_flax.main, prepared_args(tmp_path / "both", "--train_file", corpus["train"]),
                      "either --prepared_data or text")


def test_a_mixture_of_prepared_directories_trains_resumes_and_logs_each_source(model_dir, corpus, text, tmp_path,
                                                                               monkeypatch):
    """Two directories mixed 3:1; a crashed run resumed sees the rows of the straight one; metrics.jsonl's "data"
    rows count each source's rows; bad weights are refused."""
    prepare(model_dir, {**corpus, "cache": text["cache"]}, tmp_path / "demo", "--max_seq_length", "32")
    prepare(model_dir, text, tmp_path / "made_up", "--max_seq_length", "32")

    def args_for(out, *extra):
        return ["--output_dir", str(out), "--config_name", model_dir, "--tokenizer_name", model_dir,
                "--per_device_train_batch_size", "1", "--max_seq_length", "32", "--max_steps", "2",
                "--logging_steps", "1", "--save_steps", "1", "--eval_steps", "2", "--max_eval_samples", "16",
                "--prepared_data", str(tmp_path / "demo"), str(tmp_path / "made_up"), *extra]

    expect_user_error(run_mlm_flax.main, args_for(tmp_path / "bad", "--prepared_data_weights", "1", "-1"),
                      "weight -1.0")
    expect_user_error(run_mlm_flax.main, args_for(tmp_path / "bad", "--prepared_data_weights", "1"),
                      "1 weights for 2 sources")
    assert_resume_matches(run_mlm_flax.main, lambda out, *extra: args_for(out, "--prepared_data_weights", "3", "1",
                                                                          *extra),
                          monkeypatch, tmp_path, steps=2, crash_step=1, rows_class=MixedRows)
    counts = run_helpers.mixture_counts(tmp_path, steps=2)
    assert counts["demo_rows"] + counts["made_up_rows"] == 2 * 8  # two global batches of 8 rows
    assert counts["demo_tokens"] == 32 * counts["demo_rows"] and counts["made_up_epochs"] > 0
    assert [r["step"] for r in read_metrics(tmp_path / "straight", "eval")] == [2]


@pytest.mark.parametrize("script,objective,preset,tokenizer,length_flag", [
    ("run_clm_flax", "clm", "gpt2-tiny", "bpe", "--block_size"),
    ("run_t5_mlm_flax", "t5", "t5-v1_1-tiny", "unigram", "--max_seq_length"),
])
def test_the_clm_and_t5_scripts_check_their_row_length(script, objective, preset, tokenizer, length_flag,
                                                       model_dir_for, text, tmp_path):
    """prepare_data.py makes each objective's rows (T5: chunks of the corruption's raw length, longer than the
    input); the script with another length refuses them before training."""
    import importlib
    model = model_dir_for(preset, tokenizer)
    prepare(model, text, tmp_path / "p", "--objective", objective, length_flag, "32")
    made = json.loads((tmp_path / "p" / "manifest.json").read_text())["rows"]
    assert made["function"] == ("documents" if objective == "clm" else "blocks")
    assert (made["length"] > 32) == (objective == "t5")
    argv = ["--prepared_data", str(tmp_path / "p"), "--config_name", model, "--tokenizer_name", model,
            "--output_dir", str(tmp_path / "run"), length_flag, "16", "--max_steps", "1"]
    expect_user_error(importlib.import_module(script).main, argv,
                      rf"rows of {made['length']} tokens but this run makes rows of \d+")
    if objective == "clm":  # documents joined with their line breaks or without: the run's choice is checked too
        expect_user_error(importlib.import_module(script).main, [*argv[:-4], length_flag, "32", "--max_steps", "1",
                                                                 "--keep_linebreaks", "False"],
                          r"made with --keep_linebreaks True but this run has --keep_linebreaks False")
