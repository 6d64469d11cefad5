"""evaluate_lm.py: causal families' tiny presets scored as transformers scores their export, sliding windows against
a token-by-token computation, figures that do not depend on the tokenizer, and its one-line errors."""
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
    """Sum of log p(seq[k] | seq[b:k]) for k >= 1, one forward per token, b where the documented windows put it:
    0 within the first max_length + 1 tokens, then the start of the window (moved by stride) that ends past k."""
    import torch
    total = 0.0
    for k in range(1, len(seq)):
        b = 0
        if k > max_length:
            end = max_length + 1 + stride * math.ceil((k + 1 - (max_length + 1)) / stride)
            b = min(end, len(seq)) - (max_length + 1)
        with torch.no_grad():
            logits = hf(torch.tensor([seq[b:k]])).logits[0, -1].double()
        total += float(torch.log_softmax(logits, -1)[seq[k]])
    return total


# One family of each way of placing tokens (learned positions, OPT's offset ones, RoPE, ALiBi), of windowed and
# soft-capped attention and of a mixture: evaluate_lm.py runs every family through the same model call, whose logits
# are each family's in tests/test_parity.py.
SCORED = ["gpt2", "opt", "llama", "bloom", "mistral", "gemma2", "qwen3_moe"]


def test_the_scored_families_are_causal():
    assert set(SCORED) <= set(CAUSAL_LM_TYPES)


@pytest.mark.parametrize("model_type", SCORED)
def test_scores_equal_transformers_on_the_export(model_type, model_dir_for, text_file, tmp_path, capsys):
    from transformers import AutoTokenizer
    hf = hf_export(model_dir_for(tiny_preset(model_type)), tmp_path / "export")
    results = evaluate_lm.main(["--model_name_or_path", str(tmp_path / "export"), "--validation_file", text_file,
                                "--max_length", "24", "--stride", "10", "--per_device_eval_batch_size", "1"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == results

    tok = AutoTokenizer.from_pretrained(tmp_path / "export")
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    assert len(ids[2]) > 2 * 24  # the long line takes several windows
    ll = sum(token_by_token(hf, [prefix] + d, 24, 10) for d in ids)
    n_bytes, tokens = sum(len(t.encode()) for t in TEXTS), sum(len(d) for d in ids)
    assert (results["tokens"], results["bytes"]) == (tokens, n_bytes)
    np.testing.assert_allclose(results["loss"], -ll / tokens, rtol=1e-4)
    np.testing.assert_allclose(results["bits_per_byte"], -ll / n_bytes / math.log(2), rtol=1e-4)


def test_windows_predict_every_token_once_with_the_stride_as_context():
    seq = list(range(100, 150))  # a prefix and 49 tokens
    windows = document_windows(seq[1:], seq[0], max_length=16, stride=5)
    predicted = [k for tokens, first in windows for k in range(seq.index(tokens[0]) + first,
                                                                seq.index(tokens[0]) + len(tokens))]
    assert predicted == list(range(1, 50))
    assert all(len(tokens) <= 17 and first >= 17 - 5 for tokens, first in windows[1:])
    assert windows[-1][0][-1] == 149 and len(windows[-1][0]) == 17  # the last one ends with the document, full
    assert document_windows([], 7, 16, 5) == [] and document_windows([3, 4], 7, 16, 5) == [([7, 3, 4], 1)]


def test_a_hub_dataset_s_dev_split_is_its_validation_split(model_dir_for, text_file, tmp_path):
    """--dataset_split validation of a dataset whose held-out split is named dev (as a treebank's is) reads it, as
    every other script's hub loading does; the same texts score as they do from --validation_file."""
    from flaxlm.models import create_model, load_config, split_model
    from flaxlm.models.pretrained import save_pretrained
    model = tmp_path / "model"
    shutil.copytree(model_dir_for("gpt2-tiny"), model)
    config = load_config(str(model))
    save_pretrained(str(model), config, split_model(create_model(config, seed=0))[1])
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


@pytest.mark.parametrize("case", ["encoder", "stride", "max_length", "no_text", "missing_file"])
def test_bad_input_is_one_line(case, model_dir_for, text_file, capsys):
    model = model_dir_for("roberta-tiny") if case == "encoder" else model_dir_for("gpt2-tiny")
    source = {"no_text": [], "missing_file": ["--validation_file", "nowhere.txt"]}.get(
        case, ["--validation_file", text_file])
    argv = ["--model_name_or_path", model, *source, "--max_length", "32"]
    argv += {"stride": ["--stride", "33"], "max_length": ["--max_length", "100000"]}.get(case, [])
    with pytest.raises(SystemExit) as e:
        run_main(lambda: evaluate_lm.main(argv))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert {"encoder": "roberta model, which does not predict text left to right", "stride": "--stride 33 is larger",
            "max_length": "--max_length 100000 is more than", "no_text": "--validation_file FILE or as --dataset_name",
            "missing_file": "nowhere.txt does not exist"}[case] in err
