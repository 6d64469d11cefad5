"""evaluate_lm.py: causal families' tiny presets scored as transformers scores their export (the loss by position
too), sliding windows against a token-by-token computation, figures that do not depend on the tokenizer, passkey
prompts and their check, and its one-line errors."""
import json
import math
import shutil

import numpy as np
import pytest

from flaxlm.errors import run_main
from flaxlm.models.registry import CAUSAL_LM_TYPES, FAMILIES
from flaxlm.tasks.text_likelihood import document_windows
from tpu_compile import tiny_preset

import evaluate_lm

# Two short documents and one longer than the context of 24 tokens the checks use.
TEXTS = ["The index is out of range.", "Raise an exception when the key is missing, and say which key it was.",
         "A long line: " + " ".join(f"word{i} and more of it," for i in range(12))]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("held-out") / "valid.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return str(path)


def hf_export(model_dir, where):
    """transformers' causal LM of model_dir's config.json, noisy random weights, saved with the tokenizer in where."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from generation_check import add_noise
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32)
    add_noise(hf.eval(), std=0.1)
    shutil.copytree(model_dir, where, dirs_exist_ok=True)
    hf.save_pretrained(where)
    return hf


def token_by_token(hf, seq, max_length, stride):
    """[(position, log p(seq[k] | seq[b:k]))] for k >= 1, one forward per token, b where the documented windows put
    it: 0 within the first max_length + 1 tokens, then the start of the window (moved by stride) that ends past k;
    position k - 1 - b, where that window's forward predicts seq[k]."""
    import torch
    out = []
    for k in range(1, len(seq)):
        b = 0
        if k > max_length:
            end = max_length + 1 + stride * math.ceil((k + 1 - (max_length + 1)) / stride)
            b = min(end, len(seq)) - (max_length + 1)
        with torch.no_grad():
            logits = hf(torch.tensor([seq[b:k]])).logits[0, -1].double()
        out.append((k - 1 - b, float(torch.log_softmax(logits, -1)[seq[k]])))
    return out


# One family of each way of placing tokens (learned positions, OPT's offset ones, RoPE, ALiBi), of windowed and
# soft-capped attention and of a mixture: evaluate_lm.py runs every family through the same model call, whose logits
# are each family's in tests/test_parity.py.
SCORED = ["gpt2", "opt", "llama", "bloom", "mistral", "gemma2", "qwen3_moe"]


def test_the_scored_families_are_causal():
    assert set(SCORED) <= set(CAUSAL_LM_TYPES)


@pytest.mark.parametrize("model_type", SCORED)
def test_scores_equal_transformers_on_the_export(model_type, model_dir_for, text_file, tmp_path, capsys):
    """Every family but GPT-2 (whose run keeps the plain scorer) also splits the loss by position, in buckets of 10 of
    the 24 positions (the last one cut short): each bucket as transformers scores its tokens."""
    from transformers import AutoTokenizer
    hf = hf_export(model_dir_for(tiny_preset(model_type)), tmp_path / "export")
    by_position = [] if model_type == "gpt2" else ["--loss_by_position", "10"]
    results = evaluate_lm.main(["--model_name_or_path", str(tmp_path / "export"), "--validation_file", text_file,
                                "--max_length", "24", "--stride", "10", "--per_device_eval_batch_size", "1",
                                *by_position])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == results

    tok = AutoTokenizer.from_pretrained(tmp_path / "export")
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    assert len(ids[2]) > 2 * 24  # the long line takes several windows
    scored = [x for d in ids for x in token_by_token(hf, [prefix] + d, 24, 10)]
    ll = sum(x for _, x in scored)
    n_bytes, tokens = sum(len(t.encode()) for t in TEXTS), sum(len(d) for d in ids)
    assert (results["tokens"], results["bytes"]) == (tokens, n_bytes)
    np.testing.assert_allclose(results["loss"], -ll / tokens, rtol=1e-4)
    np.testing.assert_allclose(results["bits_per_byte"], -ll / n_bytes / math.log(2), rtol=1e-4)
    if not by_position:
        assert "loss_by_position" not in results
        return
    buckets = results["loss_by_position"]
    assert [(b["from"], b["to"]) for b in buckets] == [(0, 10), (10, 20), (20, 24)]
    assert sum(b["tokens"] for b in buckets) == tokens  # every predicted token once, the windows' context in none
    np.testing.assert_allclose(sum(b["loss"] * b["tokens"] for b in buckets), results["loss"] * tokens, rtol=1e-6)
    for b in buckets:
        theirs = [x for position, x in scored if b["from"] <= position < b["to"]]
        assert b["tokens"] == len(theirs) > 0
        np.testing.assert_allclose(b["loss"], -sum(theirs) / len(theirs), rtol=1e-4)


def test_windows_predict_every_token_once_with_the_stride_as_context():
    seq = list(range(100, 150))  # a prefix and 49 tokens
    windows = document_windows(seq[1:], seq[0], max_length=16, stride=5)
    predicted = [k for tokens, first in windows for k in range(seq.index(tokens[0]) + first,
                                                                seq.index(tokens[0]) + len(tokens))]
    assert predicted == list(range(1, 50))
    assert all(len(tokens) <= 17 and first >= 17 - 5 for tokens, first in windows[1:])
    assert windows[-1][0][-1] == 149 and len(windows[-1][0]) == 17  # the last one ends with the document, full
    assert document_windows([], 7, 16, 5) == [] and document_windows([3, 4], 7, 16, 5) == [([7, 3, 4], 1)]


@pytest.fixture(scope="module")
def random_gpt2(model_dir_for, tmp_path_factory):
    """gpt2-tiny (256 positions) with random weights beside our BPE tokenizer of 300 tokens."""
    from flaxlm.models import create_model, load_config, split_model
    from flaxlm.models.pretrained import save_pretrained
    model = tmp_path_factory.mktemp("random-gpt2") / "model"
    shutil.copytree(model_dir_for("gpt2-tiny"), model)
    config = load_config(str(model))
    save_pretrained(str(model), config, split_model(create_model(config, seed=0))[1])
    return str(model)


def test_a_hub_dataset_s_dev_split_is_its_validation_split(random_gpt2, text_file, tmp_path):
    """--dataset_split validation of a dataset whose held-out split is named dev (as a treebank's is) reads it, as
    every other script's hub loading does; the same texts score as they do from --validation_file."""
    model = random_gpt2
    hub = tmp_path / "treebank"
    hub.mkdir()
    (hub / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
                                   "    path: train.jsonl\n  - split: dev\n    path: dev.jsonl\n---\n")
    (hub / "train.jsonl").write_text(json.dumps({"text": "not held out"}) + "\n")
    (hub / "dev.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    flags = ["--model_name_or_path", str(model), "--max_length", "64"]
    from_hub = evaluate_lm.main([*flags, "--dataset_name", str(hub), "--dataset_split", "validation"])
    assert from_hub == evaluate_lm.main([*flags, "--validation_file", text_file])


def test_the_byte_count_is_the_texts_whatever_the_tokenizer(model_dir_for, text_file, tmp_path):
    from flaxlm.models import create_model, load_config, split_model
    from flaxlm.models.pretrained import save_pretrained
    figures = []
    for kind in ("bpe", "unigram"):
        d = tmp_path / kind
        shutil.copytree(model_dir_for("gpt2-tiny", kind), d)
        config = load_config(str(d))
        save_pretrained(str(d), config, split_model(create_model(config, seed=0))[1])
        figures.append(evaluate_lm.main(["--model_name_or_path", str(d), "--validation_file", text_file,
                                         "--max_length", "64"]))
    bpe, unigram = figures
    assert bpe["tokens"] != unigram["tokens"]
    assert bpe["bytes"] == unigram["bytes"] == sum(len(t.encode()) for t in TEXTS)
    assert bpe["words"] == unigram["words"] and bpe["characters"] == unigram["characters"]
    for f in figures:  # the same log-likelihood over tokens, over bytes
        np.testing.assert_allclose(f["bits_per_byte"] * f["bytes"] * math.log(2), f["loss"] * f["tokens"], rtol=1e-9)


@pytest.mark.parametrize("case", ["encoder", "stride", "max_length", "no_text", "missing_file", "passkey_long",
                                  "passkey_past_positions", "passkey_short", "by_position_without_text"])
def test_bad_input_is_one_line(case, model_dir_for, text_file, capsys):
    model = model_dir_for("roberta-tiny") if case == "encoder" else model_dir_for("gpt2-tiny")
    source = {"no_text": [], "missing_file": ["--validation_file", "nowhere.txt"],
              "by_position_without_text": []}.get(case, ["--validation_file", text_file])
    argv = ["--model_name_or_path", model, *source, "--max_length", "32"]
    argv += {"stride": ["--stride", "33"], "max_length": ["--max_length", "100000"],
             "passkey_long": ["--passkey_lengths", "16", "64"], "passkey_past_positions": ["--passkey_lengths", "512"],
             "passkey_short": ["--passkey_lengths", "32"],
             "by_position_without_text": ["--loss_by_position", "8", "--passkey_lengths", "32"]}.get(case, [])
    with pytest.raises(SystemExit) as e:
        run_main(lambda: evaluate_lm.main(argv))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert {"encoder": "roberta model, which does not predict text left to right", "stride": "--stride 33 is larger",
            "max_length": "--max_length 100000 is more than", "no_text": "--validation_file FILE or as --dataset_name",
            "missing_file": "nowhere.txt does not exist",
            "passkey_long": "--passkey_lengths 64 is more than the 32 tokens of context evaluated (--max_length); pass "
                            "--max_length 64",
            "passkey_past_positions": "the model has 256 positions: use lengths up to 256",
            "passkey_short": "--passkey_lengths 32 leaves no room for the filler",
            "by_position_without_text": "--loss_by_position splits the loss on held-out text"}[case] in err


def copying_scorer(reach):
    """A stand-in for lm.scorer, greedy only: the model that predicts after a context the token that followed the
    last earlier occurrence of its last 8 tokens (an induction head), reading only its last `reach` tokens."""
    def scorer(requests):
        greedy = []
        for ids, first in requests:
            hits = []
            for k in range(first, len(ids)):
                c = ids[max(0, k - reach):k]
                copied = next((c[i + 8] for i in range(len(c) - 9, -1, -1) if c[i:i + 8] == c[-8:]), None)
                hits.append(copied == ids[k])
            greedy.append(all(hits))
        return np.zeros(len(requests)), np.array(greedy)
    return scorer


def test_a_passkey_prompt_hides_the_key_where_it_says_and_a_copying_model_retrieves_it(model_dir_for):
    from flaxlm.tasks import passkey
    from flaxlm.tasks.lm_scoring import CausalLM
    model = model_dir_for("gpt2-tiny")
    lm = CausalLM(model, model, model)  # its tokenizer and prefix: no weights, the scorer a stand-in
    lm.max_length = 1024  # the stand-in has no positions to run out of
    unit = len(lm.encode(" " + passkey.FILLER))
    for length, depth in [(400, 0.0), (700, 0.25), (700, 0.5), (700, 1.0)]:
        key = passkey.key_for(length, 1)
        (ids, first), before, units = passkey.passkey_request(lm, length, depth, key)
        assert ids[0] == lm.prefix and length - unit < len(ids) - 1 <= length  # as many filler units as fit
        prompt = lm.tokenizer.decode(ids[1:first], clean_up_tokenization_spaces=False)
        assert prompt.startswith(passkey.TASK) and prompt.endswith(passkey.QUESTION)
        assert lm.tokenizer.decode(ids[first:]) == f" {key}" and len(key) == 5
        head, tail = prompt.split(passkey.KEY.format(key=key))
        assert (head.count(passkey.FILLER), tail.count(passkey.FILLER)) == (before, units - before)
        assert units >= 3 and abs(before - depth * units) <= 0.5
    assert passkey.key_for(700, 1) == key != passkey.key_for(700, 2)  # seeded: the same prompts on every run

    lm.scorer = copying_scorer(reach=10 ** 6)
    rows = passkey.passkey_retrieval(lm, [400, 700], depths=3)
    assert [(r["length"], r["accuracy"], [t["depth"] for t in r["trials"]]) for r in rows] == [
        (400, 1.0, [0.0, 0.5, 1.0]), (700, 1.0, [0.0, 0.5, 1.0])]
    lm.scorer = copying_scorer(reach=150)  # the key within its reach only right before the question
    (row,) = passkey.passkey_retrieval(lm, [700], depths=3)
    assert [t["retrieved"] for t in row["trials"]] == [False, False, True] and row["accuracy"] == pytest.approx(1 / 3)


def test_passkey_alone_on_a_random_decoder(random_gpt2, tmp_path, capsys):
    """--passkey_lengths without held-out text: a figure per length in [0, 1] and each trial, in the JSON line and
    results.json (no documents' file)."""
    out = tmp_path / "out"
    results = evaluate_lm.main(["--model_name_or_path", random_gpt2, "--passkey_lengths", "256",
                                "--passkey_depths", "2", "--output_dir", str(out)])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == results
    assert json.loads((out / "results.json").read_text()) == results and not (out / evaluate_lm.DOCUMENTS).exists()
    assert "loss" not in results and results["max_length"] == 256
    (row,) = results["passkey"]
    assert row["length"] == 256 and [t["depth"] for t in row["trials"]] == [0.0, 1.0]
    assert all(200 < t["tokens"] <= 256 and isinstance(t["retrieved"], bool) for t in row["trials"])
    assert 0 <= row["accuracy"] == sum(t["retrieved"] for t in row["trials"]) / 2 <= 1
