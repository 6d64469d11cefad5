"""run_t5_mlm_flax.py end to end on a tiny T5: export into transformers with the same loss, exact eval,
and the bad input the span-corruption pipeline can meet."""
import os

import jax
import numpy as np
import pytest

import run_helpers
import run_mlm_flax
import run_t5_mlm_flax
from run_helpers import assert_resume_matches, expect_user_error, read_metrics, with_vocab_size
from flaxlm.training import mesh as meshlib
from flaxlm import models
from flaxlm.models import create_model, hf_io, load_config, load_pretrained, split_model
from flaxlm.data.span_corruption import SpanCorruptor
from flaxlm.objectives.span_lm import span_objective
from flaxlm.training.evaluation import evaluate


@pytest.fixture(scope="module")
def model_dir(model_dir_for):
    """A Unigram tokenizer with 100 sentinels and a tiny T5 v1.1 config, written by our own scripts."""
    return model_dir_for("t5-v1_1-tiny", "unigram")


def run_args(model_dir, corpus, out, *extra, model_type="t5", model_flag="--config_name"):
    return run_helpers.run_args(model_dir, corpus, out, "--model_type", model_type, "--max_seq_length", "32",
                                "--learning_rate", "5e-3", "--adafactor", "--weight_decay", "0.001", *extra,
                                model_flag=model_flag)


def test_end_to_end_export_has_our_loss_in_transformers(model_dir, corpus, tmp_path):
    out = tmp_path / "run"
    run_t5_mlm_flax.main(run_args(model_dir, corpus, out, "--max_steps", "6", "--eval_steps", "3",
                                  "--save_steps", "3", "--save_total_limit", "1"))
    train_rows, eval_rows = read_metrics(out), read_metrics(out, "eval")
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6] and [r["step"] for r in eval_rows] == [3, 6]
    assert all(np.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 for r in train_rows[1:])
    assert os.listdir(out / "checkpoints") == ["6"]

    import torch
    from transformers import AutoTokenizer, T5ForConditionalGeneration
    tok = AutoTokenizer.from_pretrained(out)
    hf = T5ForConditionalGeneration.from_pretrained(out).eval()
    config, ours = load_pretrained(str(out))
    corruptor = SpanCorruptor.from_tokenizer(tok, 32, 0.15, 3.0, decoder_start_token_id=config.decoder_start_token_id)
    text = open(corpus["validation"], encoding="utf-8").read()[:4000]
    ids = np.asarray(tok(text)["input_ids"][: 4 * corruptor.raw_length], np.int32).reshape(4, -1)
    batch = corruptor(ids, np.random.default_rng(0))
    graphdef, params = split_model(ours)
    objective = span_objective(graphdef, config, corruptor)
    sums = objective.loss_sums(params, batch, None)
    our_loss = float(sums["loss_sum"] / sums["weight_sum"])
    with torch.no_grad():
        labels = torch.tensor(np.where(batch["label_weights"] > 0, batch["labels"], -100), dtype=torch.long)
        theirs = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                    attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long), labels=labels).loss
    assert our_loss == pytest.approx(float(theirs), abs=1e-4)


def test_eval_counts_every_target_of_every_real_row(model_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    config = load_config(model_dir)
    corruptor = SpanCorruptor.from_tokenizer(tok, 32, 0.15, 3.0, decoder_start_token_id=0)
    graphdef, params = split_model(create_model(config, seed=0))
    objective = span_objective(graphdef, config, corruptor)
    mesh = meshlib.make_mesh()
    params = jax.device_put(params, meshlib.replicated(mesh))
    eval_step = jax.jit(lambda p, b: objective.loss_sums(p, b, None))
    rows = np.random.default_rng(0).integers(3, len(tok) - 100, size=(21, corruptor.raw_length)).astype(np.int32)
    result = evaluate(eval_step, params, objective, rows, 8, mesh, seed=0)  # last batch: 5 real rows, 3 padding
    assert result["target_tokens"] == 21 * corruptor.targets_length
    assert evaluate(eval_step, params, objective, rows, 24, mesh, seed=0)["target_tokens"] == result["target_tokens"]


def test_resume_gives_the_losses_of_an_uninterrupted_run(model_dir, corpus, tmp_path, monkeypatch):
    def args_for(out, *extra):
        return run_args(model_dir, corpus, out, "--max_steps", "6", "--save_steps", "3", "--do_eval", "false", *extra)
    assert_resume_matches(run_t5_mlm_flax.main, args_for, monkeypatch, tmp_path, steps=6, crash_step=3)


# Bad input: one clear line, exit code 2, nothing destroyed.

def test_tokenizer_without_sentinels(model_dir, corpus, tmp_path, model_dir_for):
    bpe = model_dir_for(None, "bpe")
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    args[args.index("--tokenizer_name") + 1] = bpe
    expect_user_error(run_t5_mlm_flax.main, args, "extra_id|sentinel")


@pytest.mark.parametrize("flag,value,match", [("--mlm_probability", "1.0", "mlm_probability"),
                                              ("--mlm_probability", "0", "mlm_probability"),
                                              ("--mean_noise_span_length", "0.5", "mean_noise_span_length"),
                                              ("--max_seq_length", "2", "max_seq_length")])
def test_corruption_settings_out_of_range(model_dir, corpus, tmp_path, flag, value, match):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    expect_user_error(run_t5_mlm_flax.main, args, match)
    assert not os.path.exists(tmp_path / "o" / "metrics.jsonl")


def test_config_vocab_smaller_than_tokenizer(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    args[args.index("--config_name") + 1] = with_vocab_size(model_dir, tmp_path)
    expect_user_error(run_t5_mlm_flax.main, args, "vocab_size")


def test_wrong_script_for_the_model_and_line_by_line(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    expect_user_error(run_t5_mlm_flax.main, args + ["--line_by_line"], "line_by_line")
    mlm_args = [a for a in args if a not in ("--adafactor", "t5", "--model_type")]
    expect_user_error(run_mlm_flax.main, mlm_args, "run_t5_mlm_flax.py")


# The other families run_t5_mlm_flax.py trains: mT5, UMT5, and ByT5 (T5 v1.1 on bytes).

@pytest.mark.parametrize("preset,tokenizer", [("mt5-tiny", "unigram"), ("umt5-tiny", "unigram"),
                                              ("byt5-tiny", "byte")])
def test_continues_a_transformers_checkpoint_and_exports(preset, tokenizer, model_dir_for, corpus, tmp_path):
    """A tiny random model transformers wrote (beside our tokenizer) trains two steps with --model_name_or_path;
    transformers reloads the export and computes our logits."""
    import shutil
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    from parity import as_untied
    start = tmp_path / "start"
    shutil.copytree(model_dir_for(preset, tokenizer), start)
    config = load_config(str(start))
    torch.manual_seed(0)
    AutoModelForSeq2SeqLM.from_config(config).save_pretrained(start)
    out = tmp_path / "run"
    run_t5_mlm_flax.main(run_args(str(start), corpus, out, "--max_steps", "2", "--do_eval", "false",
                                  model_type=config.model_type, model_flag="--model_name_or_path"))
    assert [r["step"] for r in read_metrics(out)] == [1, 2]

    tok = AutoTokenizer.from_pretrained(out)
    hf = as_untied(AutoModelForSeq2SeqLM.from_pretrained(out)).eval()
    assert type(hf).__name__ == models.family_of(config).architecture
    _, ours = load_pretrained(str(out))
    text = open(corpus["validation"], encoding="utf-8").read()[:2000]
    ids = np.asarray(tok(text)["input_ids"][:64], np.int64).reshape(2, 32)
    mask = np.ones_like(ids)
    mask[1, 20:] = 0
    dec = ids[:, :9].copy()
    dec[:, 0] = config.decoder_start_token_id
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 decoder_input_ids=torch.tensor(dec)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(ids, mask, dec)), ref, atol=1e-4, rtol=0)
    trained = split_model(ours)[1]["shared"]["embedding"]
    assert not np.allclose(trained, hf_io.read_safetensors(str(start))["shared.weight"])  # it trained
