"""flaxlm.data.rows caches token rows by the row function's code (flaxlm.data.fingerprint): an unchanged function
reuses the cache, an edit to a copied script's row function, to a helper it calls or to a constant it reads makes
the rows anew, and so do another tokenizer or row length; the key is the same in another process."""
import functools
import glob
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from run_helpers import read_metrics
from test_data import corpus, tokenizer  # noqa: F401  (tokenizer: a module fixture)
from flaxlm.config.options import TextSourceArgs
from flaxlm.data import rows
from flaxlm.data.fingerprint import fingerprint
from flaxlm.data.text import load_raw_text
from flaxlm.errors import UserError
from flaxlm.tokenization.trainers import train_bpe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The row function of a copied pretraining script, as its user writes it: a helper, a constant and a set it reads.
COPIED = '''"""My corpus's rows."""
import numpy as np

BLOCK_START = 0  # where in a batch's ids the first block starts
DROP = {"", " ", "-", "--", "---"}  # texts that are no text


def cut(ids, length):
    """The token lists concatenated and cut into blocks of `length`, the remainder dropped."""
    flat = np.fromiter((t for x in ids for t in x), np.int32)[BLOCK_START:]
    n = len(flat) // length
    return flat[: n * length].reshape(n, length)


def make_rows(texts, tokenizer, length):
    print("making rows")
    texts = [t for t in texts if t not in DROP]
    return cut(tokenizer(texts)["input_ids"], length)
'''


@pytest.fixture
def raw(tmp_path):
    """300 lines of text (one batch of texts), cached by `datasets` under tmp_path."""
    path = tmp_path / "a.txt"
    path.write_text("".join(t + "\n" for t in corpus(300, seed=1)), encoding="utf-8")
    return load_raw_text(TextSourceArgs(train_file=[str(path)], cache_dir=str(tmp_path / "cache")), 0)


def load(tmp_path, source, name="copied_rows"):
    """The module of `source`, written to tmp_path/name.py and run afresh (no bytecode cache), as a rerun of an
    edited script would."""
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def rows_of(raw, module, tokenizer, length=16):
    """(rows as numpy, their cache file) of the train split made by module.make_rows."""
    make_rows = functools.partial(module.make_rows, tokenizer=tokenizer, length=length)
    train = rows.from_text(raw, make_rows, length)["train"]
    [cache_file] = [f["filename"] for f in train.cache_files]
    return rows.as_numpy_rows(train), cache_file


def test_an_unchanged_row_function_reuses_the_cache(tmp_path, raw, tokenizer, capsys):
    first, first_file = rows_of(raw, load(tmp_path, COPIED), tokenizer)
    assert capsys.readouterr().out.count("making rows") == 1  # one batch of texts
    mtime = os.stat(first_file).st_mtime_ns
    again, again_file = rows_of(raw, load(tmp_path, COPIED), tokenizer)  # the same code, run again
    assert "making rows" not in capsys.readouterr().out  # not called: the rows come from the cache
    assert again_file == first_file and os.stat(first_file).st_mtime_ns == mtime
    np.testing.assert_array_equal(again, first)


def test_editing_a_copied_row_function_makes_the_rows_anew(tmp_path, raw, tokenizer, capsys):
    first, first_file = rows_of(raw, load(tmp_path, COPIED), tokenizer)
    edited = COPIED.replace('return cut(tokenizer(texts)["input_ids"], length)',
                            'return cut(tokenizer(texts)["input_ids"], length)[::2]')  # every other block
    assert edited != COPIED
    capsys.readouterr()
    fewer, fewer_file = rows_of(raw, load(tmp_path, edited), tokenizer)
    assert "making rows" in capsys.readouterr().out and fewer_file != first_file
    np.testing.assert_array_equal(fewer, first[::2])
    back, back_file = rows_of(raw, load(tmp_path, COPIED), tokenizer)  # the edit undone: the first cache again
    assert "making rows" not in capsys.readouterr().out and back_file == first_file


@pytest.mark.parametrize("edit", [("[BLOCK_START:]", "[BLOCK_START + 1:]"),  # the helper's code
                                  ("BLOCK_START = 0", "BLOCK_START = 1")])  # a constant the helper reads
def test_editing_a_helper_or_a_constant_it_reads_makes_the_rows_anew(tmp_path, raw, tokenizer, capsys, edit):
    first, first_file = rows_of(raw, load(tmp_path, COPIED), tokenizer)
    capsys.readouterr()
    shifted, shifted_file = rows_of(raw, load(tmp_path, COPIED.replace(*edit)), tokenizer)
    assert "making rows" in capsys.readouterr().out and shifted_file != first_file
    np.testing.assert_array_equal(shifted[:-1].ravel(), first.ravel()[1:len(shifted[:-1].ravel()) + 1])


def test_another_tokenizer_or_length_makes_the_rows_anew(tmp_path, raw, tokenizer):
    other = train_bpe(corpus(300), vocab_size=300, model_max_length=64)
    module = load(tmp_path, COPIED)
    files = {rows_of(raw, module, tok, length)[1] for tok, length in [(tokenizer, 16), (other, 16), (tokenizer, 8)]}
    assert len(files) == 3
    keys = {fingerprint(make) for make in [rows.blocks(tokenizer, 16), rows.blocks(other, 16),
                                           rows.blocks(tokenizer, 8), rows.lines(tokenizer, 16),
                                           rows.lines(tokenizer, 16, pack=False), rows.documents(tokenizer, 16, 3)]}
    assert len(keys) == 6
    tokenizer(["sol"], truncation=True, max_length=4)  # the call state of a tokenizer is not its identity
    assert fingerprint(rows.blocks(tokenizer, 16)) in keys


def test_closure_values_and_bound_arguments_count():
    def factory(n):
        def make(texts):
            return [t[:n] for t in texts]
        return make
    assert fingerprint(factory(3)) == fingerprint(factory(3)) != fingerprint(factory(4))
    assert fingerprint(functools.partial(factory(3), 1)) != fingerprint(functools.partial(factory(3), 2))


def test_the_fingerprint_is_the_same_in_another_process_and_place(tmp_path, tokenizer):
    """No id(), address or set order in the key: another process (another PYTHONHASHSEED), and the copied
    function in another file with lines added above it, give the same fingerprint."""
    tok_dir = str(tmp_path / "tok")
    tokenizer.save_pretrained(tok_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    load(elsewhere, '"""Moved, with a longer docstring and lines above."""\n\n\n' + COPIED.split('\n', 1)[1],
         name="moved_rows")
    code = (f"import functools, json, sys, types\n"
            f"from transformers import AutoTokenizer\n"
            f"from flaxlm.data import rows\n"
            f"from flaxlm.data.fingerprint import fingerprint\n"
            f"tok = AutoTokenizer.from_pretrained({tok_dir!r})\n"
            f"module = types.ModuleType('moved_rows')\n"
            f"path = {str(elsewhere / 'moved_rows.py')!r}\n"
            f"exec(compile(open(path).read(), path, 'exec'), module.__dict__)\n"
            f"print(json.dumps([fingerprint(rows.lines(tok, 16)),\n"
            f"                  fingerprint(functools.partial(module.make_rows, tokenizer=tok, length=16))]))\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    there = json.loads(done.stdout.strip().splitlines()[-1])

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir)
    module = load(tmp_path, COPIED)
    assert there == [fingerprint(rows.lines(tok, 16)),
                     fingerprint(functools.partial(module.make_rows, tokenizer=tok, length=16))]


def test_a_row_function_of_the_wrong_shape_is_a_user_error(raw, tokenizer):
    with pytest.raises(UserError, match=r"gave int32 rows of shape \[\d+, 8\]; it must give token ids \[n, 16\]"):
        rows.from_text(raw, rows.blocks(tokenizer, 8), 16)


def test_an_edited_copy_of_a_script_tokenizes_anew(tiny_gpt2_dir, corpus, tmp_path, monkeypatch):
    """run_clm_flax.py copied, with its own row function: a rerun reuses the cached rows; after an edit to the
    function (every other block) the run tokenizes again and evaluates half the validation rows."""
    script = open(os.path.join(ROOT, "run_clm_flax.py"), encoding="utf-8").read()
    own = ('from flaxlm.errors import UserError, run_main  # noqa: E402\n'
           'from flaxlm.data import rows as token_rows  # noqa: E402\n\n\n'
           'def my_rows(texts, tokenizer, length, eos):\n'
           '    return token_rows.documents(tokenizer, length, eos)(texts)\n')
    default = "make_rows = rows.documents(tokenizer, block_size, eos=tokenizer.eos_token_id)"
    assert default in script and "from flaxlm.errors import UserError, run_main  # noqa: E402\n" in script
    copied = script.replace("from flaxlm.errors import UserError, run_main  # noqa: E402\n", own).replace(
        default, "make_rows = functools.partial(my_rows, tokenizer=tokenizer, length=block_size, "
                 "eos=tokenizer.eos_token_id)").replace("import os\n", "import functools\nimport os\n", 1)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts its folder first
    cache = tmp_path / "cache"

    def run(source, out):
        load(tmp_path, source, name="my_run_clm").main([
            "--output_dir", str(tmp_path / out), "--config_name", tiny_gpt2_dir, "--tokenizer_name", tiny_gpt2_dir,
            "--train_file", corpus["train"], "--validation_file", corpus["validation"], "--cache_dir", str(cache),
            "--block_size", "32", "--per_device_train_batch_size", "1", "--max_steps", "1"])
        [result] = read_metrics(tmp_path / out, "eval")
        return result["target_tokens"], set(glob.glob(str(cache / "**" / "cache-*.arrow"), recursive=True))

    tokens, files = run(copied, "first")
    assert run(copied, "again") == (tokens, files)  # the same code: the cached rows, no new cache file
    edited = copied.replace("eos)(texts)\n", "eos)(texts)[::2]\n")
    fewer, more_files = run(edited, "edited")
    assert len(more_files - files) == 2  # train and validation rows made anew
    assert 0 < fewer < 0.6 * tokens


class _CountingTokenizer:
    """A tokenizer that records how many characters each call is given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def __call__(self, texts, **kw):
        self.calls.append([len(t) for t in texts])
        return self.tokenizer(texts, **kw)


def test_long_documents_are_tokenized_a_part_at_a_time_into_the_same_rows(tokenizer, monkeypatch):
    """A batch of long documents (books) is tokenized ENCODE_CHARS characters at a time, a longer document alone,
    its ids kept as int32: the rows are those of the whole batch's ids concatenated and cut, a document longer than
    a row running on into the next rows and the next document after it, only the batch's last partial row dropped."""
    docs = [" ".join(corpus(n, seed=n)) for n in (40, 400, 3, 150)]  # ~4k, ~40k, ~300, ~15k characters
    eos = tokenizer.eos_token_id
    ids = [x if x[-1] == eos else x + [eos] for x in tokenizer(docs)["input_ids"]]
    flat = [t for x in ids for t in x]
    assert len(ids[1]) > 3 * 256
    whole = rows.documents(tokenizer, 256, eos)(docs)  # the default: one part of this batch
    np.testing.assert_array_equal(whole, np.reshape(flat[:len(flat) // 256 * 256], (-1, 256)))
    monkeypatch.setattr(rows, "ENCODE_CHARS", 5000)
    counting = _CountingTokenizer(tokenizer)
    np.testing.assert_array_equal(rows.documents(counting, 256, eos)(docs), whole)
    assert counting.calls == [[len(docs[0])], [len(docs[1])], [len(docs[2])], [len(docs[3])]]
    lines = corpus(200)
    counting.calls = []
    np.testing.assert_array_equal(rows.blocks(counting, 16)(lines), rows.blocks(tokenizer, 16)(lines))
    assert len(counting.calls) > 1 and all(sum(c) <= 5000 for c in counting.calls)
