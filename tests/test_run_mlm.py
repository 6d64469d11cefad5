"""run_mlm_flax.py end to end on a tiny model: export, devices, resume, accumulation, bad input."""
import json
import os

import jax
import numpy as np
import optax
import pytest

import run_mlm_flax
import run_helpers
from run_helpers import (assert_devices_match, assert_resume_matches, expect_user_error, read_metrics, run_script,
                         with_vocab_size)
from flaxlm.training import mesh as meshlib
from flaxlm.objectives.mlm import mlm_objective
from flaxlm.data.mlm_masking import MLMMasker
from flaxlm.models import create_model, split_model
from flaxlm.models.hf_io import load_config
from flaxlm.training.evaluation import evaluate
from flaxlm.training.train_step import make_train_step


@pytest.fixture(scope="module")
def model_dir(model_dir_for):
    """A 400-token BPE tokenizer and a tiny RoBERTa config written by our own scripts."""
    return model_dir_for("roberta-tiny", vocab_size=400)


def run_args(model_dir, corpus, out, *extra):
    return run_helpers.run_args(model_dir, corpus, out, "--max_seq_length", "32", "--learning_rate", "3e-3", *extra)


def test_end_to_end_export_loads_in_transformers(model_dir, corpus, tmp_path):
    out = tmp_path / "run"
    run_mlm_flax.main(run_args(model_dir, corpus, out, "--max_steps", "6", "--eval_steps", "3", "--save_steps", "3",
                               "--save_total_limit", "1"))
    train_rows, eval_rows = read_metrics(out), read_metrics(out, "eval")
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in eval_rows] == [3, 6]
    assert all(np.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 for r in train_rows[1:])
    for r in train_rows[1:]:  # the host's data work per step, and its share of the step's wall time
        assert r["data_ms"] >= 0 and 0 <= r["data_share"] <= 1
        assert r["data_share"] == pytest.approx(r["data_ms"] / r["step_ms"], abs=1e-5)
    assert os.listdir(out / "checkpoints") == ["6"]  # save_total_limit 1
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(out / "tensorboard"))

    # An evaluation job over the saved checkpoints (--eval_checkpoints): the final checkpoint's eval loss equals
    # the training run's, each checkpoint is evaluated once even when the job runs again, the export is untouched.
    exported = os.path.getmtime(out / "model.safetensors")
    for _ in range(2):
        run_mlm_flax.main(run_args(model_dir, corpus, out, "--max_steps", "6", "--eval_checkpoints", "all"))
    with open(out / "eval_metrics.jsonl") as f:
        job_rows = [json.loads(line) for line in f]
    assert [r["step"] for r in job_rows] == [6]
    assert job_rows[0]["loss"] == pytest.approx(eval_rows[-1]["loss"], rel=1e-5)
    assert os.path.getmtime(out / "model.safetensors") == exported
    assert read_metrics(out, "eval") == eval_rows  # the training run's log is not touched

    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline
    tok = AutoTokenizer.from_pretrained(out)
    hf = AutoModelForMaskedLM.from_pretrained(out)
    guesses = pipeline("fill-mask", model=hf, tokenizer=tok, device="cpu")(f"The {tok.mask_token} statement.")
    assert len(guesses) == 5
    # the export computes what we computed: the exported eval loss equals ours for the same batch
    config = load_config(str(out))
    from flaxlm.models import load_pretrained
    _, ours = load_pretrained(str(out))
    ids = np.asarray(tok(["The for statement is used to iterate."], padding="max_length", max_length=16)["input_ids"])
    with torch.no_grad():
        theirs = hf(torch.tensor(ids)).logits.numpy()
    assert np.abs(np.asarray(ours(ids, (ids != config.pad_token_id).astype(np.int32))) - theirs).max() < 1e-4


def tiny_setup(model_dir, seq_len=32, dropout=True):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    config = load_config(model_dir)
    if not dropout:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    graphdef, params = split_model(create_model(config, seed=0))
    masker = MLMMasker.from_tokenizer(tok, seq_len, 0.15)
    rows = np.random.default_rng(0).integers(5, len(tok), size=(64, seq_len)).astype(np.int32)
    return tok, config, params, mlm_objective(graphdef, config, masker, seq_len), rows


def test_8_devices_give_the_losses_of_1_device(model_dir, tmp_path):
    tok, config, params, objective, rows = tiny_setup(model_dir)
    assert_devices_match(objective, params, rows, tmp_path)


def test_resume_gives_the_losses_of_an_uninterrupted_run(model_dir, corpus, tmp_path, monkeypatch):
    def args_for(out, *extra):
        return run_args(model_dir, corpus, out, "--max_steps", "20", "--save_steps", "10", "--do_eval", "false",
                        *extra)
    assert_resume_matches(run_mlm_flax.main, args_for, monkeypatch, tmp_path, steps=20, crash_step=10)


def test_gradient_accumulation_equals_the_full_batch(model_dir):
    tok, config, params, objective, rows = tiny_setup(model_dir, dropout=False)
    tx = optax.sgd(0.1)
    batch = objective.collate(rows[:8], np.random.default_rng(0))
    key = jax.random.PRNGKey(0)
    state = {"step": 0, "params": params, "opt_state": tx.init(params)}
    full, m_full = jax.jit(make_train_step(objective.loss_sums, tx, 1))(state, batch, key)
    micro = {k: v.reshape(2, 4, *v.shape[1:]) for k, v in batch.items()}
    acc, m_acc = jax.jit(make_train_step(objective.loss_sums, tx, 2))(state, micro, key)
    assert float(m_acc["loss"]) == pytest.approx(float(m_full["loss"]), rel=1e-5)
    for a, b in zip(jax.tree.leaves(full["params"]), jax.tree.leaves(acc["params"])):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_eval_covers_every_row_and_ignores_padding(model_dir):
    tok, config, params, objective, rows = tiny_setup(model_dir)
    mesh = meshlib.make_mesh()
    repl = meshlib.replicated(mesh)
    eval_step = jax.jit(lambda p, b: objective.loss_sums(p, b, None))
    params = jax.device_put(params, repl)
    rows = rows[:21]  # 21 rows over batches of 8: the last batch is padded with 3 empty rows
    result = evaluate(eval_step, params, objective, rows, 8, mesh, seed=0)
    maskable = (~np.isin(rows, tok.all_special_ids)).sum(1)
    assert result["target_tokens"] == int(np.maximum(1, np.round(0.15 * maskable)).sum())
    one_batch = evaluate(eval_step, params, objective, rows, 24, mesh, seed=0)
    assert one_batch["target_tokens"] == result["target_tokens"]


# Bad input: one clear line, exit code 2, nothing destroyed.

def test_missing_and_empty_data_files(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    missing = [a if a != corpus["train"] else str(tmp_path / "nope.txt") for a in args]
    expect_user_error(run_mlm_flax.main, missing, "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    expect_user_error(run_mlm_flax.main, [a if a != corpus["train"] else str(empty) for a in args], "empty")


def test_no_text_column(model_dir, corpus, tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps({"id": i, "body": "x" * 50, "other": "y"}) for i in range(10)))
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    expect_user_error(run_mlm_flax.main, [a if a != corpus["train"] else str(f) for a in args], "text_column")


def test_seq_len_larger_than_the_model(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    args[args.index("--max_seq_length") + 1] = "4096"
    expect_user_error(run_mlm_flax.main, args, "max_seq_length 4096")


def test_tokenizer_bigger_than_config_and_tokenizer_without_mask(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    args[args.index("--config_name") + 1] = with_vocab_size(model_dir, tmp_path)
    expect_user_error(run_mlm_flax.main, args, "vocab_size")

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate("the a of is to".split())}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    nomask = tmp_path / "nomask"
    PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", unk_token="<unk>").save_pretrained(nomask)
    args = run_args(model_dir, corpus, tmp_path / "o2", "--max_steps", "1")
    args[args.index("--tokenizer_name") + 1] = str(nomask)
    expect_user_error(run_mlm_flax.main, args, "mask token")


def test_model_type_without_a_flax_family_or_of_another_script(model_dir, corpus, tmp_path):
    """--model_type (Hugging Face's way to train a new model of that type's default config) names the supported
    model types when it has no family here, the right script for another family's; --config_overrides changes
    only that default config."""
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    i = args.index("--config_name")
    alone = args[:i] + args[i + 2:]
    expect_user_error(run_mlm_flax.main, alone + ["--model_type", "albert"],
                      r"^--model_type albert has no Flax model here; run_mlm_flax.py trains bert, roberta, ")
    expect_user_error(run_mlm_flax.main, alone + ["--model_type", "gpt2"],
                      r"^--model_type is gpt2 but run_mlm_flax.py trains .*; use run_clm_flax.py$")
    expect_user_error(run_mlm_flax.main, args + ["--config_overrides", "hidden_size=32"],
                      "--config_overrides changes the default config of --model_type")
    expect_user_error(run_mlm_flax.main, alone + ["--model_type", "roberta", "--config_overrides", "hidden_sise=32"],
                      "unknown config key 'hidden_sise' for roberta; did you mean hidden_size")


def test_batch_that_does_not_divide_over_devices(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--train_batch_size", "12")
    expect_user_error(run_mlm_flax.main, args, "divide")


def test_hub_without_network_fails_before_training(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--push_to_hub")
    expect_user_error(run_mlm_flax.main, args, "push_to_hub")
    args = run_args(model_dir, corpus, tmp_path / "o2", "--max_steps", "1")
    i = args.index("--train_file")
    del args[i:i + 2]
    expect_user_error(run_mlm_flax.main, args + ["--dataset_name", "no_such_user/no_such_dataset"],
                      "no_such_dataset")
    assert not os.path.exists(tmp_path / "o2" / "metrics.jsonl")


def test_non_empty_output_dir_is_refused_and_overwrite_keeps_foreign_files(model_dir, corpus, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = run_args(model_dir, corpus, out, "--max_steps", "2", "--do_eval", "false")
    proc = run_script("run_mlm_flax.py", argv)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "overwrite_output_dir" in proc.stderr
    assert "Traceback" not in proc.stderr
    run_mlm_flax.main(argv + ["--overwrite_output_dir"])
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "model.safetensors").exists()


def test_unknown_flag_and_bad_yaml_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_mlm_flax:\n  learning_rat: 3\n")
    for argv in (["--output_dir", str(tmp_path / "o"), "--learning_rat", "3"],
                 ["--output_dir", str(tmp_path / "o"), "--config_file", str(bad)]):
        proc = run_script("run_mlm_flax.py", argv)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "learning_rat" in proc.stderr


def test_streaming_run_trains_and_resumes_in_step_order(model_dir, corpus, tmp_path, monkeypatch):
    from flaxlm.data import rows
    monkeypatch.setattr(rows, "GROUP_BATCH", 2)  # several batches of texts before the checkpoint
    train_lines = set(open(corpus["train"], encoding="utf-8").read().splitlines())
    tokenized = []  # the training texts each run tokenizes
    make_rows = rows.rows_of_batch
    monkeypatch.setattr(rows, "rows_of_batch", lambda batch, *a, **kw: (
        tokenized.extend(t for t in batch["text"] if t in train_lines), make_rows(batch, *a, **kw))[1])
    common = ("--streaming", "--max_steps", "4", "--save_steps", "2", "--eval_steps", "4", "--max_eval_samples", "8")
    run_mlm_flax.main(run_args(model_dir, corpus, tmp_path / "s", *common))
    straight = read_metrics(tmp_path / "s")
    assert [r["step"] for r in straight] == [1, 2, 3, 4] and len(read_metrics(tmp_path / "s", "eval")) == 1
    # resume from step 2 in a copy of the run: the stream starts at the position the checkpoint saved
    import shutil
    shutil.copytree(tmp_path / "s", tmp_path / "r")
    shutil.rmtree(tmp_path / "r" / "checkpoints" / "4")
    with open(tmp_path / "r" / "checkpoints" / "2" / "meta" / "metadata") as f:
        at = json.load(f)["stream_position"]
    assert at["pass"] == 0 and at["texts"] >= 2 * rows.GROUP_BATCH
    read_straight, tokenized[:] = len(tokenized), []
    run_mlm_flax.main(run_args(model_dir, corpus, tmp_path / "r", *common, "--resume_from_checkpoint", "latest"))
    resumed = [r for r in read_metrics(tmp_path / "r") if r["step"] > 2][-2:]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight[2:]], rel=1e-6)
    # the texts before the position's batch are not tokenized again (the first batch is, once: the emptiness check)
    assert len(tokenized) == read_straight - at["texts"]


def test_continue_a_hugging_face_checkpoint_with_adafactor_in_bf16(model_dir, corpus, tmp_path):
    """A checkpoint saved by transformers (PyTorch) continues pretraining here and exports back."""
    import shutil
    import torch
    from transformers import AutoModelForMaskedLM, RobertaForMaskedLM
    hf_dir = tmp_path / "hf"
    torch.manual_seed(0)
    RobertaForMaskedLM(load_config(model_dir)).save_pretrained(hf_dir)
    for f in os.listdir(model_dir):
        if f.startswith("tokenizer"):
            shutil.copy(os.path.join(model_dir, f), hf_dir)
    out = tmp_path / "run"
    args = run_args(model_dir, corpus, out, "--max_steps", "3", "--adafactor", "--weight_decay", "0.01",
                    "--dtype", "bfloat16", "--eval_steps", "3")
    i = args.index("--config_name")
    args[i:i + 4] = ["--model_name_or_path", str(hf_dir)]
    run_mlm_flax.main(args)
    assert all(np.isfinite(r["loss"]) for r in read_metrics(out))
    before = AutoModelForMaskedLM.from_pretrained(hf_dir).state_dict()
    after = AutoModelForMaskedLM.from_pretrained(out).state_dict()
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # trained
