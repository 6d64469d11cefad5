"""flaxlm.data.text: loading text in every format and clear errors; flaxlm.data.rows: fixed-length token rows."""
import dataclasses
import json
import os

import datasets
import numpy as np
import pytest

from flaxlm.config.options import TextSourceArgs
from flaxlm.data import rows as rows_module
from flaxlm.data import text as text_module
from flaxlm.data.rows import GROUP_BATCH, as_numpy_rows, blocks, from_text, iter_rows, lines
from flaxlm.data.text import iter_texts, load_raw_text
from flaxlm.errors import UserError
from flaxlm.tokenization.trainers import train_bpe

TEXTS = ["Det var en gang en konge.", "Han hadde tre døtre, og de var vakre.", "Slutt på eventyret!"]
WORDS = ("sol regn vind snø hav fjell skog elv by land bok hus vei natt dag lys mørke stein tre gress "
         "fugl fisk hund katt").split()


def corpus(n, seed=0):
    """n generated Norwegian-ish lines of 3..30 words."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(3, 30))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(corpus(300), vocab_size=400, model_max_length=64)


def src(tmp_path, **kw):
    return TextSourceArgs(cache_dir=str(tmp_path / "cache"), **kw)


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def touch(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def write_format(tmp_path, ext, rows):
    """rows: list of dicts; written as a file of the given extension."""
    path = tmp_path / f"data.{ext}"
    if ext == "txt":
        write(path, [r["text"] for r in rows])
    elif ext == "json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif ext == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif ext in ("csv", "tsv", "parquet"):
        ds = datasets.Dataset.from_list(rows)
        ds.to_parquet(str(path)) if ext == "parquet" else ds.to_csv(str(path), index=False,
                                                                    sep="\t" if ext == "tsv" else ",")
    return str(path)


# ---- loading ------------------------------------------------------------------------------------

@pytest.mark.parametrize("ext", ["txt", "json", "jsonl", "csv", "tsv", "parquet"])
def test_each_format_loads_one_text_column(tmp_path, ext):
    path = write_format(tmp_path, ext, [{"text": t} for t in TEXTS])
    raw = load_raw_text(src(tmp_path, train_file=[path]), validation_split_percentage=0)
    assert list(raw) == ["train"]
    assert raw["train"].column_names == ["text"]
    assert raw["train"]["text"][:] == TEXTS


def test_text_column_detection_and_flag(tmp_path):
    rows = [{"id": i, "body": t, "label": i % 2} for i, t in enumerate(TEXTS)]
    path = write_format(tmp_path, "jsonl", rows)
    raw = load_raw_text(src(tmp_path, train_file=[path]), validation_split_percentage=0)
    assert raw["train"]["text"][:] == TEXTS  # the only string column

    two = write_format(tmp_path, "csv", [{"title": "t", "body": t} for t in TEXTS])
    with pytest.raises(UserError, match=r"columns: title, body.*--text_column"):
        load_raw_text(src(tmp_path, train_file=[two]), validation_split_percentage=0)
    raw = load_raw_text(src(tmp_path, train_file=[two], text_column="body"), validation_split_percentage=0)
    assert raw["train"]["text"][:] == TEXTS
    with pytest.raises(UserError, match="--text_column nope is not a column"):
        load_raw_text(src(tmp_path, train_file=[two], text_column="nope"), validation_split_percentage=0)


def test_blank_lines_dropped(tmp_path):
    path = write(tmp_path / "a.txt", ["", TEXTS[0], "   ", "\t", TEXTS[1]])
    raw = load_raw_text(src(tmp_path, train_file=[path]), validation_split_percentage=0)
    assert raw["train"]["text"][:] == TEXTS[:2]


def test_multiple_train_files_and_glob(tmp_path):
    a, b = write(tmp_path / "a.txt", TEXTS[:2]), write(tmp_path / "b.txt", TEXTS[2:])
    raw = load_raw_text(src(tmp_path, train_file=[a, b]), validation_split_percentage=0)
    assert raw["train"]["text"][:] == TEXTS
    raw = load_raw_text(src(tmp_path, train_file=[str(tmp_path / "*.txt")]), validation_split_percentage=0)
    assert raw["train"]["text"][:] == TEXTS


@pytest.mark.parametrize("make, pattern", [
    (lambda d: str(d / "missing.txt"), "does not exist"),
    (lambda d: str(d), "is a directory"),
    (lambda d: touch(d / "e.txt", ""), "is empty"),
    (lambda d: touch(d / "b.txt", "\n  \n\n"), "holds no text"),
    (lambda d: touch(d / "x.docx", "hi"), "unknown extension '.docx'"),
    (lambda d: touch(d / "bad.json", "{not json"), "could not read"),
])
def test_bad_input_is_a_one_line_user_error(tmp_path, make, pattern):
    with pytest.raises(UserError, match=pattern) as e:
        load_raw_text(src(tmp_path, train_file=[make(tmp_path)]), validation_split_percentage=0)
    assert "\n" not in str(e.value) and "--train_file" in str(e.value)


def test_source_errors(tmp_path):
    a, b = write(tmp_path / "a.txt", TEXTS), write_format(tmp_path, "jsonl", [{"text": t} for t in TEXTS])
    with pytest.raises(UserError, match="mixes file types"):
        load_raw_text(src(tmp_path, train_file=[a, b]))
    with pytest.raises(UserError, match="pass --train_file"):
        load_raw_text(src(tmp_path))
    with pytest.raises(UserError, match="could not load dataset no-such-dataset-xyz .*--train_file"):
        load_raw_text(src(tmp_path, dataset_name="no-such-dataset-xyz"))


def test_dataset_name_may_be_a_local_folder(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    write(folder / "train.txt", TEXTS)
    write(folder / "validation.txt", ["valideringstekst"])
    raw = load_raw_text(src(tmp_path, dataset_name=str(folder)))
    assert raw["train"]["text"][:] == TEXTS and raw["validation"]["text"][:] == ["valideringstekst"]


def test_dataset_name_may_be_a_folder_save_to_disk_wrote(tmp_path):
    """A DatasetDict saved with save_to_disk (FOLDER/CONFIG for --dataset_config_name) loads as the hub's would; its
    split named val (EuroEval's name) is the validation split."""
    import datasets
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": TEXTS}),
                          "val": datasets.Dataset.from_dict({"text": ["valideringstekst"]})}).save_to_disk(
        str(tmp_path / "saved" / "nb"))
    for name, config in ((tmp_path / "saved" / "nb", None), (tmp_path / "saved", "nb")):
        raw = load_raw_text(src(tmp_path, dataset_name=str(name), dataset_config_name=config))
        assert raw["train"]["text"][:] == TEXTS and raw["validation"]["text"][:] == ["valideringstekst"]


def test_validation_split(tmp_path):
    lines = [f"linje {i}" for i in range(200)]
    s = src(tmp_path, train_file=[write(tmp_path / "a.txt", lines)])
    raw = load_raw_text(s, validation_split_percentage=10, seed=1)
    train, val = raw["train"]["text"][:], raw["validation"]["text"][:]
    assert len(val) == 20 and sorted(train + val) == sorted(lines)
    assert train == [t for t in lines if t in set(train)]  # each split keeps the file's order
    assert load_raw_text(s, validation_split_percentage=10, seed=1)["validation"]["text"][:] == val
    assert load_raw_text(s, validation_split_percentage=10, seed=2)["validation"]["text"][:] != val

    given = load_raw_text(dataclasses.replace(s, validation_file=[write(tmp_path / "v.txt", ["v"])]))
    assert given["validation"]["text"][:] == ["v"] and len(given["train"]) == 200

    stream = load_raw_text(dataclasses.replace(s, streaming=True), validation_split_percentage=10)
    assert isinstance(stream["train"], datasets.IterableDataset)
    assert [x["text"] for x in stream["validation"]] == lines[::10]  # every 10th
    assert len(list(stream["train"])) == 180



def test_validation_split_is_drawn_chunk_by_chunk(tmp_path, monkeypatch):
    """Held-out lines are drawn within chunks (bounded memory for any corpus), each chunk holding its proportional
    share; blank lines dropped from both splits in the same pass."""
    monkeypatch.setattr(text_module, "HOLD_OUT_CHUNK", 16)
    full = [f"linje {i}" for i in range(200)]
    val = set(load_raw_text(src(tmp_path, train_file=[write(tmp_path / "f.txt", full)]),
                            validation_split_percentage=10, seed=3)["validation"]["text"][:])
    for start in range(0, 200, 16):  # 20 of 200 drawn: each chunk exactly its proportional share
        assert sum(t in val for t in full[start:start + 16]) == min(200, start + 16) * 20 // 200 - start * 20 // 200

    lines = [f"linje {i}" if i % 9 else "  " for i in range(200)]
    s = src(tmp_path, train_file=[write(tmp_path / "a.txt", lines)])
    raw = load_raw_text(s, validation_split_percentage=10, seed=3)
    train, val = raw["train"]["text"][:], raw["validation"]["text"][:]
    texts = [t for t in lines if t.strip()]
    assert sorted(train + val) == sorted(texts) and train == [t for t in texts if t in set(train)]
    held = [i for i, t in enumerate(lines) if t in set(val)]
    for start in range(0, 200, 16):  # 20 of 200 lines drawn: each chunk its share, less the blank ones drawn
        share = min(200, start + 16) * 20 // 200 - start * 20 // 200
        assert sum(start <= i < start + 16 for i in held) <= share
    assert len(val) >= 20 - sum(1 for i in range(0, 200, 9))
    assert load_raw_text(s, validation_split_percentage=10, seed=3)["validation"]["text"][:] == val
    with pytest.raises(UserError, match="every line is blank"):
        load_raw_text(src(tmp_path, train_file=[write(tmp_path / "b.txt", ["", " "] * 5)]),
                      validation_split_percentage=10)
    with pytest.raises(UserError, match="too little text to hold out"):
        load_raw_text(src(tmp_path, train_file=[write(tmp_path / "c.txt", ["ord", ""])]),
                      validation_split_percentage=10)


@pytest.mark.parametrize("percentage", [0, 10])
def test_arrow_text_is_held_in_few_record_batches(tmp_path, percentage):
    """The arrow copy of the text and the index a filter makes hold up to 2^16 texts per record batch (datasets'
    default 1,000 costs every process ~1 KB per batch: memory growing with the corpus)."""
    lines = [f"linje {i}" if i % 7 else ["", " \t", "\u00a0\u3000 "][i // 7 % 3] for i in range(5000)]
    raw = load_raw_text(src(tmp_path, train_file=[write(tmp_path / "a.txt", lines)]),
                        validation_split_percentage=percentage)
    for ds in raw.values():
        assert ds.data.table.column(0).num_chunks == 1
        assert ds._indices is not None and ds._indices.table.column(0).num_chunks == 1
    assert sorted(sum((ds["text"][:] for ds in raw.values()), [])) == sorted(t for t in lines if t.strip())


def test_iter_texts(tmp_path):
    raw = load_raw_text(src(tmp_path, train_file=[write(tmp_path / "a.txt", corpus(25))]),
                        validation_split_percentage=0)
    batches = list(iter_texts(raw["train"], batch_size=10))
    assert [len(b) for b in batches] == [10, 10, 5] and sum(batches, []) == raw["train"]["text"][:]


# ---- token rows ---------------------------------------------------------------------------------

def expected_blocks(tokenizer, texts, length):
    """Hugging Face's group_texts: per batch of texts, concatenate ids (with specials), cut, drop rest."""
    out = []
    for i in range(0, len(texts), GROUP_BATCH):
        flat = sum(tokenizer(texts[i:i + GROUP_BATCH])["input_ids"], [])
        out += [flat[j:j + length] for j in range(0, len(flat) - length + 1, length)]
    return np.array(out, np.int32).reshape(-1, length)


def test_grouped_rows_are_the_concatenated_tokenization(tmp_path, tokenizer):
    texts = corpus(1500)  # two batches: the remainder is dropped per batch
    raw = load_raw_text(src(tmp_path, train_file=[write(tmp_path / "a.txt", texts)]), validation_split_percentage=0)
    out = from_text(raw, blocks(tokenizer, 32), 32)
    rows = as_numpy_rows(out["train"])
    assert rows.dtype == np.int32 and rows.shape[1] == 32
    np.testing.assert_array_equal(rows, expected_blocks(tokenizer, texts, 32))
    assert rows[0, 0] == tokenizer.bos_token_id and tokenizer.eos_token_id in rows[0]
    picked = out["train"][np.array([3, 0])]["input_ids"]
    assert picked.dtype == np.int32 and picked.shape == (2, 32)
    np.testing.assert_array_equal(picked, rows[[3, 0]])


def test_workers_once_jax_runs_are_spawned_and_give_the_same_rows(tmp_path, tokenizer):
    """--preprocessing_num_workers 2 after JAX has started (as in the scripts): the same rows as one process,
    and no fork of the JAX process (which JAX warns may deadlock)."""
    import warnings
    import jax
    import multiprocess
    jax.devices()  # JAX's backend and threads running, as the scripts have them before tokenizing
    texts = corpus(2500)
    raw = load_raw_text(src(tmp_path, train_file=[write(tmp_path / "a.txt", texts)]), validation_split_percentage=0)
    method = multiprocess.get_start_method(allow_none=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*fork.*")
        rows = as_numpy_rows(from_text(raw, blocks(tokenizer, 32), 32, num_workers=2, overwrite_cache=True)["train"])
    halves = [expected_blocks(tokenizer, texts[:1250], 32), expected_blocks(tokenizer, texts[1250:], 32)]
    np.testing.assert_array_equal(rows, np.concatenate(halves))  # each worker groups its contiguous half
    assert multiprocess.get_start_method(allow_none=True) == method  # the start method is restored


def test_max_samples_and_skip(tmp_path, tokenizer):
    raw = load_raw_text(src(tmp_path, train_file=[write(tmp_path / "a.txt", corpus(300))]),
                        validation_split_percentage=10)
    out = from_text(raw, blocks(tokenizer, 16), 16, max_train_samples=7, max_eval_samples=3)
    assert len(out["train"]) == 7 and len(out["validation"]) == 3
    np.testing.assert_array_equal(np.stack(list(iter_rows(out["train"], skip=5))), as_numpy_rows(out["train"])[5:])


def test_line_by_line_pads_and_truncates(tmp_path, tokenizer):
    texts = ["sol regn", " ".join(WORDS * 3), "vind"]
    raw = load_raw_text(src(tmp_path, train_file=[write(tmp_path / "a.txt", texts)]), validation_split_percentage=0)
    rows = as_numpy_rows(from_text(raw, lines(tokenizer, 12, pack=False), 12)["train"])
    assert rows.shape == (3, 12)
    ids = tokenizer(texts[0])["input_ids"]
    np.testing.assert_array_equal(rows[0], ids + [tokenizer.pad_token_id] * (12 - len(ids)))
    assert rows[1, 0] == tokenizer.bos_token_id and rows[1, -1] == tokenizer.eos_token_id  # truncated, ends </s>
    assert tokenizer.pad_token_id not in rows[1]


def test_too_little_text_is_a_user_error(tmp_path, tokenizer):
    raw = load_raw_text(src(tmp_path, train_file=[write(tmp_path / "a.txt", TEXTS)]), validation_split_percentage=0)
    with pytest.raises(UserError, match="no full block of 512 tokens; lower --max_seq_length"):
        from_text(raw, blocks(tokenizer, 512), 512)


def test_cache_is_reused_and_overwrite_redoes_it(tmp_path, tokenizer):
    s = src(tmp_path, train_file=[write(tmp_path / "a.txt", corpus(400))])
    first = from_text(load_raw_text(s, validation_split_percentage=0), blocks(tokenizer, 16), 16)["train"]
    files = [f["filename"] for f in first.cache_files]
    assert files and all(os.path.isfile(f) for f in files)
    mtimes = [os.stat(f).st_mtime_ns for f in files]
    tokenizer(["sol"], truncation=True, max_length=4)  # changes the tokenizer's call state, not its identity
    again = from_text(load_raw_text(s, validation_split_percentage=0), blocks(tokenizer, 16), 16)["train"]
    assert again._fingerprint == first._fingerprint
    assert [f["filename"] for f in again.cache_files] == files
    assert [os.stat(f).st_mtime_ns for f in files] == mtimes  # read back, not rewritten
    redone = from_text(load_raw_text(s, validation_split_percentage=0), blocks(tokenizer, 16), 16,
                       overwrite_cache=True)["train"]
    assert [os.stat(f["filename"]).st_mtime_ns for f in redone.cache_files] != mtimes
    np.testing.assert_array_equal(as_numpy_rows(redone), as_numpy_rows(first))
    other = from_text(load_raw_text(s, validation_split_percentage=0), blocks(tokenizer, 8), 8)["train"]
    assert other._fingerprint != first._fingerprint


@pytest.mark.parametrize("line_by_line", [False, True])
def test_streaming_gives_the_same_rows(tmp_path, tokenizer, line_by_line):
    s = src(tmp_path, train_file=[write(tmp_path / "a.txt", corpus(2500))])
    make_rows = lines(tokenizer, 24, pack=False) if line_by_line else blocks(tokenizer, 24)
    eager = as_numpy_rows(from_text(load_raw_text(s, 0), make_rows, 24)["train"])
    lazy = from_text(load_raw_text(dataclasses.replace(s, streaming=True), 0), make_rows, 24)["train"]
    np.testing.assert_array_equal(np.stack(list(lazy)), eager)
    np.testing.assert_array_equal(np.stack(list(iter_rows(lazy, skip=1234))), eager[1234:])  # resume
    capped = from_text(load_raw_text(dataclasses.replace(s, streaming=True), 0), make_rows, 24,
                       max_train_samples=1500)["train"]
    np.testing.assert_array_equal(np.stack(list(capped)), eager[:1500])


def test_streaming_buffer_stays_bounded(tmp_path, tokenizer):
    """Rows held at once cover one batch of texts, however long the corpus is."""
    peaks, totals = [], []
    for n in (2 * GROUP_BATCH, 10 * GROUP_BATCH):
        s = src(tmp_path, train_file=[write(tmp_path / f"{n}.txt", corpus(n))], streaming=True)
        rows = from_text(load_raw_text(s, 0), blocks(tokenizer, 32), 32)["train"]
        totals.append(32 * sum(1 for _ in rows))
        peaks.append(rows.peak_buffered_tokens)
    assert totals[1] > 8 * peaks[1]  # the stream is far larger than what was ever held
    longest = 2 + 2 * 30  # <s> </s> around at most 30 words (at most 2 tokens each here)
    assert max(peaks) <= GROUP_BATCH * longest
    assert peaks[1] < 1.2 * peaks[0]


def test_shared_text_blocks(shared_data, tmp_path, tokenizer):
    path = str(shared_data / "no" / "ud_bokmaal_texts_dev.txt")
    raw = load_raw_text(src(tmp_path, train_file=[path]), validation_split_percentage=5)
    out = from_text(raw, blocks(tokenizer, 64), 64)
    assert set(out) == {"train", "validation"}
    texts = raw["train"]["text"][:]
    np.testing.assert_array_equal(as_numpy_rows(out["train"]), expected_blocks(tokenizer, texts, 64))


def test_streaming_resumes_at_its_position_without_tokenizing_the_text_before(tmp_path, tokenizer, monkeypatch):
    """A stream started at a saved position (across passes over it, with a held-out split) gives the rows the
    uninterrupted stream gave, and tokenizes only the texts from the position's batch of texts on."""
    monkeypatch.setattr(rows_module, "GROUP_BATCH", 40)
    s = src(tmp_path, train_file=[write(tmp_path / f"{i}.txt", corpus(120, seed=i)) for i in range(3)],
            streaming=True)
    tokenized = []

    def stream():
        def counted(texts):
            tokenized.append(len(texts))
            return blocks(tokenizer, 24)(texts)
        return from_text(load_raw_text(s, 10), counted, 24)["train"].batched(7)

    texts_per_pass = sum(len(b) for b in iter_texts(load_raw_text(s, 10)["train"]))
    straight, want, at = stream(), [], {}
    tokenized.clear()
    for step in range(40):
        want.append(straight.batch_rows(step, slice(None)))
        at[step + 1] = json.loads(json.dumps(straight.position_after(step + 1)))  # as the checkpoint keeps it
    read_straight = sum(tokenized)
    assert at[40]["pass"] >= 1
    for step in (3, 17, *(t for t in range(2, 40) if at[t]["pass"] > at[t - 1]["pass"]), 39):
        resumed = stream()
        tokenized.clear()
        resumed.resume_at(step, at[step])
        np.testing.assert_array_equal(np.stack([resumed.batch_rows(t, slice(None)) for t in range(step, 40)]),
                                      np.stack(want[step:]))
        assert sum(tokenized) == read_straight - at[step]["pass"] * texts_per_pass - at[step]["texts"]
    old_checkpoint = stream()  # no position saved: the text before the step is read and tokenized again
    np.testing.assert_array_equal(old_checkpoint.batch_rows(17, slice(None)), want[17])
