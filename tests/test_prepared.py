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
    """--streaming: no copy of the text in the datasets cache; the rows (held-out ones too) of StreamedRows. With 2
    workers each job tokenizes every other batch of texts: the same rows, job 0's batches first."""
    prepare(model_dir, text, tmp_path / "p", "--max_seq_length", "32", "--streaming", "--shard_size_mb", "0.05",
            split_validation=True)
    prepare(model_dir, text, tmp_path / "p2", "--max_seq_length", "32", "--streaming", "--preprocessing_num_workers",
            "2", split_validation=True)
    source = TextSourceArgs(train_file=[text["train"]], streaming=True)
    made = rows.from_text(load_raw_text(source), rows.blocks(load_tokenizer(model_dir), 32), 32)
    got, two = load(model_dir, tmp_path / "p"), load(model_dir, tmp_path / "p2")
    assert len(got["train"].shards) > 1
    jobs = json.loads((tmp_path / "p2" / "manifest.json").read_text())["splits"]["train"]
    assert [s["end_text"] for s in jobs] == [1000 + 375, 1000]  # 2,375 train texts: batches 0 and 2, batch 1
    for split in ("train", "validation"):
        want = np.stack(list(made[split]))
        assert np.array_equal(all_rows(got[split]), want)
        assert np.array_equal(*(a[np.lexsort(a.T[::-1])] for a in (all_rows(two[split]), want)))


def as_jsonl(lines, end="\n"):
    """JSON Lines bytes of texts as the json builder meets them: objects with more keys, some without the text or
    with null, blank lines between, whitespace after, escaped and raw Unicode."""
    out = []
    for i, line in enumerate(lines):
        obj = {"n": i} if i % 17 == 16 else {"text": None if i % 19 == 18 else line, "n": i}
        out.append(json.dumps(obj, ensure_ascii=i % 2 == 0) + (" \r" if i % 5 == 4 else ""))
        if i % 23 == 22:
            out.append(" \t")
    return ("\n".join(out) + end).encode("utf-8")


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet", "csv"])
def test_two_workers_give_the_rows_of_the_script_on_each_workers_text(kind, model_dir, text, tmp_path):
    """.txt, JSON Lines and parquet files: each job reads its own range (of bytes cut at a line start, of parquet
    rows; no copy of the text in the datasets cache), and its rows are the script's rows of that piece of text.
    Other files (csv) go through datasets: the rows of the script with two workers."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet as pq
    files, tables = {split: text[split] for split in ("train", "validation")}, {}
    if kind != "txt":
        for split, path in files.items():
            files[split] = str(tmp_path / f"{split}.{kind}")
            lines = open(path, encoding="utf-8").read().splitlines()
            tables[split] = pa.table({"n": range(len(lines)), "text": lines})
            if kind == "jsonl":
                (tmp_path / f"{split}.jsonl").write_bytes(as_jsonl(lines))
            elif kind == "csv":
                pa.csv.write_csv(tables[split], files[split])
            else:
                pq.write_table(tables[split], files[split], row_group_size=500)
    cache = tmp_path / "cache"
    prepare_data.main(["--tokenizer_name", model_dir, "--train_file", files["train"], "--validation_file",
                       files["validation"], "--output_dir", str(tmp_path / "p"), "--cache_dir", str(cache),
                       "--max_seq_length", "32", "--preprocessing_num_workers", "2"])
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert len(manifest["splits"]["train"]) == 2
    assert manifest["text"]["read"] == {"csv": "datasets", "parquet": "row ranges"}.get(kind, "byte ranges")
    got = load(model_dir, tmp_path / "p")
    tokenizer = load_tokenizer(model_dir)
    for split in ("train", "validation"):
        if kind == "csv":
            source = TextSourceArgs(train_file=[files["train"]], validation_file=[files["validation"]],
                                    cache_dir=text["cache"])
            want = rows.as_numpy_rows(rows.from_text(load_raw_text(source), rows.blocks(tokenizer, 32), 32,
                                                     num_workers=2)[split])
        else:
            want = []
            if kind == "parquet":
                ranges = manifest["jobs"][split]
                assert len(ranges) == 2 and ranges[0][0] == 0 and ranges[0][1] == ranges[1][0]
                for i, (a, b) in enumerate(ranges):
                    pq.write_table(tables[split].slice(a, b - a), tmp_path / f"{split}{i}.{kind}")
            else:
                data = open(files[split], "rb").read()
                pieces = [data[a:b] for a, b in manifest["jobs"][split]]
                assert len(pieces) == 2 and b"".join(pieces) == data and pieces[0].endswith(b"\n")
                for i, piece in enumerate(pieces):
                    (tmp_path / f"{split}{i}.{kind}").write_bytes(piece)
            for i in range(2):
                source = TextSourceArgs(train_file=[str(tmp_path / f"{split}{i}.{kind}")], cache_dir=text["cache"])
                raw = load_raw_text(source, validation_split_percentage=0)
                want.append(rows.as_numpy_rows(rows.from_text(raw, rows.blocks(tokenizer, 32), 32)["train"]))
            want = np.concatenate(want)
        assert np.array_equal(all_rows(got[split]), want), split
    assert cache.exists() == (kind == "csv")  # ranges: the text never copied


@pytest.mark.parametrize("kind,keep_linebreaks", [("txt", False), ("txt", True), ("jsonl", False),
                                                   ("parquet", False)])
@pytest.mark.parametrize("held_out", [0, 10])
def test_ranges_read_the_texts_load_raw_text_reads(kind, keep_linebreaks, held_out, tmp_path, monkeypatch):
    """Two files cut into 1, 3 and 7 ranges, read in blocks of 97 bytes (parquet: batches of 64 rows in groups of
    300): the splits' texts (held-out ones too) are load_raw_text's, with CRLF and lone CR line ends, Unicode spaces
    and separators, blank lines, and a last line without a line break (JSON Lines: objects without the text or with
    null, blank lines, escapes; parquet: nulls); bytes that are not UTF-8, and lines that are not objects with a
    string text, are named by file and line."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from flaxlm.data import text_ranges
    rng = np.random.default_rng(0)
    words = ["hei", "på", "deg", "\u3000", "\x0c", "a\u2028b", "c\x85d", "  ", "\t", "æøå", "x\ry", "z\r\nw", ""]
    paths = []
    for name, n, end in (("a", 3000, "\n"), ("b", 2000, "")):
        lines = ["".join(rng.choice(words, rng.integers(0, 6))) for _ in range(n)]
        if kind == "jsonl":
            lines[0] = lines[0] or "first"  # a file is JSON Lines when its first object holds a text
        path = tmp_path / f"{name}.{kind}"
        if kind == "parquet":
            texts = [None if i % 19 == 18 else line for i, line in enumerate(lines)]
            pq.write_table(pa.table({"id": range(n), "text": texts}), path, row_group_size=300)
        else:
            path.write_bytes(as_jsonl(lines, end) if kind == "jsonl" else ("\n".join(lines) + end).encode("utf-8"))
        paths.append(str(path))
    monkeypatch.setattr(text_ranges, "BLOCK", 97)
    monkeypatch.setattr(text_ranges, "PARQUET_BATCH", 64)
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
    if kind == "parquet":  # a text column chosen as load_raw_text chooses it; files of other columns: datasets reads
        plan = preparing.plan_jobs(splits, 4)
        said = preparing.describe_share(plan, preparing.share(plan, 1, 2), splits)
        assert said.endswith(f"it reads {len(splits) * 2500:,} of the {len(splits) * 5000:,} rows of text"), said
        two = tmp_path / "two.parquet"
        pq.write_table(pa.table({"title": ["a"], "body": ["b"]}), two)
        with pytest.raises(UserError, match=r"cannot tell which column of --train_file .*two.parquet holds the text "
                                            r"\(columns: title, body\); pass --text_column"):
            text_ranges.file_splits(TextSourceArgs(train_file=[str(two)]), 0)
        assert text_ranges.file_splits(TextSourceArgs(train_file=[str(two)], text_column="body"), 0)["train"].column \
            == "body"
        assert text_ranges.file_splits(TextSourceArgs(train_file=[str(two), paths[0]]), 0) is None
        return
    if kind == "txt":
        bad = ("en\n" * 50 + "to\ntre \xe6\n").encode() + b"fire \xe6\n"
        problem = r"line 53 is not UTF-8 text \(byte 0xe6"
    else:
        bad = ('{"text": "en"}\n' * 50 + '{"text": "to"}\n{"text": 3}\n').encode()
        problem = r"line 52 is not a JSON object with a string under \"text\" \('\{\"text\": 3\}'\)"
    (tmp_path / f"bad.{kind}").write_bytes(bad)
    bad = text_ranges.file_splits(TextSourceArgs(train_file=[str(tmp_path / f"bad.{kind}")]), 0)
    with pytest.raises(UserError, match=rf"--train_file .*bad.{kind} {problem}"):
        list(bad["train"].texts((0, os.path.getsize(tmp_path / f"bad.{kind}")), 0))
    if kind == "jsonl":  # not JSON Lines with a text in its first object: datasets reads it (and names the columns)
        for first in ('[{"text": "a"}]', '{"body": "a"}', '{"text": 1}', '{\n "text": "a"}', '\ufeff{"text": "a"}'):
            (tmp_path / "other.json").write_text(first + "\n", encoding="utf-8")
            assert text_ranges.file_splits(TextSourceArgs(train_file=[str(tmp_path / "other.json")]), 0) is None
        assert text_ranges.file_splits(TextSourceArgs(train_file=[str(tmp_path / "other.json")], text_column="b"),
                                       0) is None


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
    last = tmp_path / "resumed" / f"{straight['train'].shards[-1][1]['name']}.input_ids"
    for damaged in (last, first):  # checked at once in threads; the first in order is named
        data = bytearray(damaged.read_bytes())
        data[5] ^= 1
        damaged.write_bytes(bytes(data))
    with pytest.raises(UserError, match=f"{finished[0]}.input_ids does not match its checksum"):
        load(model_dir, tmp_path / "resumed")
    prepare(model_dir, text, tmp_path / "resumed", *flags)  # makes the damaged shard again
    assert np.array_equal(all_rows(load(model_dir, tmp_path / "resumed")["train"]), all_rows(straight["train"]))


def test_other_settings_foreign_files_and_truncated_shards_are_refused(model_dir, text, tmp_path):
    out = tmp_path / "p"
    prepare(model_dir, text, out, "--max_seq_length", "32")
    with pytest.raises(UserError, match=r"other settings \(rows: length 32 -> 16\); pass a new --output_dir"):
        prepare(model_dir, text, out, "--max_seq_length", "16")
    held_out = tmp_path / "held_out"  # a validation file added to a preparation that held one out: that is said
    prepare(model_dir, text, held_out, "--max_seq_length", "32", split_validation=True)
    with pytest.raises(UserError, match=r"other settings \(sources: --validation_file \S*valid.txt added\)"):
        prepare(model_dir, text, held_out, "--max_seq_length", "32")
    with pytest.raises(UserError, match=r"jobs: \{'train': 1, 'validation': 1\} -> \{'train': 2, 'validation': 2\}"):
        prepare(model_dir, text, out, "--max_seq_length", "32", "--preprocessing_num_workers", "2")
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
