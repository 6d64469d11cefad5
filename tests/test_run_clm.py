"""run_clm_flax.py end to end: pretraining a tiny GPT-2 from our own tokenizer and config, fine-tuning tiny
Hugging Face checkpoints that transformers wrote (GPT-2, OPT-350m's layout, Llama, Gemma 2, two mixtures) and
reloading the export in transformers, documents and line breaks in the data, exact eval, devices, resume,
and the bad input the causal-LM pipeline can meet."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from huggingface_hub import ModelCard

import run_clm_flax
import run_helpers
import run_mlm_flax
from generation_check import add_noise
from run_helpers import assert_devices_match, assert_resume_matches, expect_user_error, read_metrics, with_vocab_size
from flaxlm.training import mesh as meshlib
from flaxlm.objectives.clm import clm_objective
from flaxlm.data.rows import documents, from_text
from flaxlm.data.text import load_raw_text
from flaxlm.models import apply_model, create_model, load_config, load_pretrained, split_model
from flaxlm.training.evaluation import evaluate


@pytest.fixture(scope="module")
def tokenizer_dir(model_dir_for):
    """Our BPE tokenizer, trained by train_tokenizer.py."""
    return model_dir_for(None)


@pytest.fixture(scope="module")
def model_dir(model_dir_for):
    """Our BPE tokenizer and a tiny GPT-2 config, written by our own scripts."""
    return model_dir_for("gpt2-tiny")


def run_args(model_dir, corpus, out, *extra, model_flag="--config_name"):
    return run_helpers.run_args(model_dir, corpus, out, "--block_size", "32", "--learning_rate", "3e-3", *extra,
                                model_flag=model_flag)


def hf_loss(hf, ids):
    with torch.no_grad():
        return float(hf(torch.tensor(ids, dtype=torch.long), labels=torch.tensor(ids, dtype=torch.long)).loss)


def our_loss(model_path, ids):
    config, model = load_pretrained(model_path)
    graphdef, params = split_model(model)
    objective = clm_objective(graphdef, config, params, ids.shape[1], pad_id=0)
    sums = objective.loss_sums(params, objective.collate(ids), None)
    return float(sums["loss_sum"] / sums["weight_sum"])


def test_pretrain_export_loads_in_transformers_with_our_loss(model_dir, corpus, tmp_path):
    out = tmp_path / "run"
    run_clm_flax.main(run_args(model_dir, corpus, out, "--max_steps", "6", "--eval_steps", "3", "--save_steps", "3",
                               "--save_total_limit", "1", "--eval_at_start", "--do_predict",
                               "--test_file", corpus["validation"]))
    train_rows, eval_rows = read_metrics(out), read_metrics(out, "eval")
    (test,) = read_metrics(out, "test")  # --do_predict: the test split once, after training (same text here)
    assert test["step"] == 6 and test["loss"] == pytest.approx(eval_rows[-1]["loss"], rel=1e-6)
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6] and [r["step"] for r in eval_rows] == [0, 3, 6]
    assert all(np.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 for r in train_rows[1:])
    assert eval_rows[-1]["loss"] < eval_rows[0]["loss"]
    assert eval_rows[-1]["perplexity"] == pytest.approx(np.exp(eval_rows[-1]["loss"]), rel=1e-5)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = np.asarray(tok(open(corpus["validation"]).read()[:3000])["input_ids"][:64], np.int64).reshape(2, 32)
    assert our_loss(str(out), ids) == pytest.approx(hf_loss(hf, ids), abs=1e-4)


# Presets of the families whose layers differ most (soft-capping and alternating windows, ALiBi, local attention, a
# mixture with a shared expert). Every family runs run_clm_flax.py end to end in test_fine_tune_a_hugging_face_
# checkpoint or below; each model module's tiny preset compiles its train step in tests/test_compile_for_families.py and
# round-trips in tests/test_create_config.py; every family's export loads in transformers in tests/test_parity.py.
@pytest.mark.parametrize("preset", ["gemma2-tiny", "bloom-tiny", "gpt_neo-tiny", "qwen2-moe-tiny"])
def test_a_family_pretrains_from_its_tiny_preset(preset, model_dir_for, corpus, tmp_path):
    """create_config.py's tiny preset, sized to our tokenizer: run_clm_flax.py trains it from scratch (the loss
    falls), exports, and transformers' class of the family computes our loss on the export."""
    out = tmp_path / "run"
    run_clm_flax.main(run_args(model_dir_for(preset), corpus, out, "--max_steps", "4", "--eval_steps", "4",
                               "--eval_at_start", "--save_steps", "4", "--learning_rate", "1e-2"))
    evals = read_metrics(out, "eval")
    assert evals[-1]["loss"] < evals[0]["loss"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == json.loads((out / "config.json").read_text())["architectures"][0]
    ids = np.random.default_rng(0).integers(3, 300, (2, 32))
    assert our_loss(str(out), ids) == pytest.approx(hf_loss(hf, ids), abs=1e-4)


# A tiny transformers model for fine-tuning: (class, config fields), vocabulary 320. One of each way a causal
# checkpoint is laid out and trained: a fused q/k/v with a tied head (GPT-2), OPT-350m's projected embeddings after the
# norms, an untied head (Llama), soft-capped logits through the fused loss (Gemma 2), a mixture's experts in Mixtral's
# block_sparse_moe and one expert a tensor as Qwen's. Every family's checkpoints both ways and its logits are
# tests/test_parity.py's; each model module's pretraining script compiling its train step,
# test_compile_for_families.py's.
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
FINE_TUNE = {
    "gpt2": (transformers.GPT2LMHeadModel, dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "opt-350m-shaped": (transformers.OPTForCausalLM, dict(TINY, ffn_dim=48, do_layer_norm_before=False,
                                                          word_embed_proj_dim=16, pad_token_id=1, bos_token_id=0,
                                                          eos_token_id=2)),
    "llama": (transformers.LlamaForCausalLM, dict(TINY, num_key_value_heads=2, intermediate_size=48,
                                                  tie_word_embeddings=False)),
    # head_dim 8, a window of 8 shorter than the rows of 32 (and the 24 compared); soft-caps small enough to matter,
    # the final one through the fused loss
    "gemma2": (transformers.Gemma2ForCausalLM, dict(TINY, num_key_value_heads=2, head_dim=8, intermediate_size=48,
                                                    sliding_window=8, query_pre_attn_scalar=8,
                                                    attn_logit_softcapping=10.0, final_logit_softcapping=5.0)),
    # Mistral's with 4 experts of width 16, 2 per token; the checkpoint in the hub's layout (block_sparse_moe, w1-w3)
    "mixtral": (transformers.MixtralForCausalLM, dict(TINY, num_key_value_heads=2, intermediate_size=16,
                                                      sliding_window=8, num_local_experts=4, num_experts_per_tok=2)),
    # 4 experts of width 16, 2 per token; the checkpoint holds them per expert, as the hub's
    "qwen3_moe": (transformers.Qwen3MoeForCausalLM, dict(TINY, num_key_value_heads=2, head_dim=12, num_experts=4,
                                                         num_experts_per_tok=2, moe_intermediate_size=16)),
}


def hf_checkpoint(family, vocab_size, seed=0):
    """A tiny transformers model of the family with random weights (noise on every tensor)."""
    cls, fields = FINE_TUNE[family]
    torch.manual_seed(seed)
    return add_noise(cls(cls.config_class(vocab_size=vocab_size, **fields)), 0.05, seed).eval()


@pytest.mark.parametrize("family", list(FINE_TUNE))
def test_fine_tune_a_hugging_face_checkpoint(family, tokenizer_dir, corpus, tmp_path):
    """transformers writes a checkpoint; run_clm_flax fine-tunes it and exports; transformers reloads the export
    and computes our logits."""
    start = tmp_path / "start"
    shutil.copytree(tokenizer_dir, start)
    hf = hf_checkpoint(family, vocab_size=320)
    hf.save_pretrained(start)
    out = tmp_path / "run"
    run_clm_flax.main(run_args(str(start), corpus, out, "--max_steps", "4", "--do_eval", "false",
                               "--save_steps", "4", "--learning_rate", "1e-3", model_flag="--model_name_or_path"))
    tuned = type(hf).from_pretrained(out).eval()
    before = dict(hf.named_parameters())
    assert any(not torch.equal(p, before[n]) for n, p in tuned.named_parameters())  # it trained
    ids = np.random.default_rng(0).integers(3, 300, (2, 24))
    config, ours = load_pretrained(str(out))
    with torch.no_grad():
        ref = tuned(torch.tensor(ids)).logits.numpy()
    err = np.abs(np.asarray(ours(jnp.asarray(ids))) - ref).max()
    assert err < 1e-4, err
    assert json.loads((out / "config.json").read_text())["architectures"] == [type(hf).__name__]
    card = ModelCard.load(out / "README.md")  # the model card names what was continued (a folder: in its text)
    assert card.data.base_model is None and f"the local model `{start}`" in card.text
    assert card.data.pipeline_tag == "text-generation"


def test_documents_and_line_breaks(tokenizer_dir, tmp_path):
    """A text that does not end in a line break is a document, framed by the tokenizer's special tokens (ours:
    <s> ... </s>) and ending in EOS. Lines that keep their breaks run on as the file's text, without special
    tokens; --keep_linebreaks false makes every line a document."""
    from types import SimpleNamespace
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tok.eos_token_id
    (tmp_path / "t.txt").write_text("one two\nthree four\n\nfive six")
    (tmp_path / "d.jsonl").write_text('{"text": "one two"}\n{"text": "three four"}\n')
    src = SimpleNamespace(dataset_name=None, dataset_config_name=None, validation_file=None, text_column=None,
                          streaming=False, cache_dir=None)

    def flat(file, keep):
        raw = load_raw_text(SimpleNamespace(**vars(src), train_file=[str(tmp_path / file)]), 0,
                            keep_linebreaks=keep)
        return from_text(raw, documents(tok, 1, eos), 1)["train"][:]["input_ids"].ravel().tolist()

    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    bos = tok.bos_token_id
    doc = lambda s: [bos] + enc(s) + [eos]  # noqa: E731
    assert tok("five six")["input_ids"] == doc("five six")  # the RoBERTa-style framing of our BPE tokenizer
    assert flat("t.txt", True) == enc("one two\n") + enc("three four\n") + doc("five six")
    assert flat("t.txt", False) == doc("one two") + doc("three four") + doc("five six")
    assert flat("d.jsonl", True) == doc("one two") + doc("three four")


def tiny_objective(model_dir, block=32):
    config = load_config(model_dir)
    graphdef, params = split_model(create_model(config, seed=0))
    return config, params, clm_objective(graphdef, config, params, block, pad_id=2)


def test_eval_is_exact_over_every_real_row(model_dir):
    config, params, objective = tiny_objective(model_dir)
    mesh = meshlib.make_mesh()
    rows = np.random.default_rng(0).integers(3, 300, size=(21, 32)).astype(np.int32)
    eval_step = jax.jit(lambda p, b: objective.loss_sums(p, b, None))
    result = evaluate(eval_step, jax.device_put(params, meshlib.replicated(mesh)), objective, rows, 8, mesh, 0)
    assert result["target_tokens"] == 21 * 31  # 5 real rows in the last batch of 8; the 3 padding rows count nothing
    graphdef = split_model(create_model(config, seed=0))[0]
    logp = jax.nn.log_softmax(apply_model(graphdef, params, jnp.asarray(rows))[:, :-1], axis=-1)
    direct = -float(jnp.take_along_axis(logp, jnp.asarray(rows[:, 1:])[..., None], axis=-1).mean())
    assert result["loss"] == pytest.approx(direct, rel=1e-5)


def test_8_devices_give_the_losses_of_1_device(model_dir, tmp_path):
    _, params, objective = tiny_objective(model_dir)
    rows = np.random.default_rng(0).integers(3, 300, size=(64, 32)).astype(np.int32)
    assert_devices_match(objective, params, rows, tmp_path)


def test_resume_gives_the_losses_of_an_uninterrupted_run(model_dir, corpus, tmp_path, monkeypatch):
    def args_for(out, *extra):
        return run_args(model_dir, corpus, out, "--max_steps", "6", "--save_steps", "3", "--do_eval", "false", *extra)
    assert_resume_matches(run_clm_flax.main, args_for, monkeypatch, tmp_path, steps=6, crash_step=3)


# Bad input: one clear line, exit code 2, nothing destroyed.

def test_block_size_larger_than_the_model(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    args[args.index("--block_size") + 1] = "300"
    expect_user_error(run_clm_flax.main, args, "--block_size 300 is larger than the model's 256 positions")
    assert not os.path.exists(tmp_path / "o" / "metrics.jsonl")


def test_wrong_or_unsupported_architecture(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    expect_user_error(run_mlm_flax.main, [a for a in args if a not in ("--block_size", "32")], "run_clm_flax.py")
    other = tmp_path / "mamba"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "mamba", "vocab_size": 320}))
    args[args.index("--config_name") + 1] = str(other)
    expect_user_error(run_clm_flax.main, args, r"holds a mamba model but run_clm_flax.py trains gpt2, opt, llama")
    expect_user_error(run_clm_flax.main, run_args(model_dir, corpus, tmp_path / "o", "--line_by_line"), "line_by_line")
    expect_user_error(run_clm_flax.main, run_args(model_dir, corpus, tmp_path / "o", "--do_predict"),
                      "--do_predict evaluates test text but --train_file .* has none")


def test_tokenizer_bigger_than_config(model_dir, corpus, tmp_path):
    args = run_args(model_dir, corpus, tmp_path / "o", "--max_steps", "1")
    args[args.index("--config_name") + 1] = with_vocab_size(model_dir, tmp_path)
    expect_user_error(run_clm_flax.main, args, "vocab_size")


def test_index_naming_a_missing_shard_writes_nothing(tokenizer_dir, corpus, tmp_path):
    start = tmp_path / "start"
    shutil.copytree(tokenizer_dir, start)
    hf_checkpoint("llama", vocab_size=320).save_pretrained(start, max_shard_size="40KB")
    index = json.loads((start / "model.safetensors.index.json").read_text())
    os.remove(start / sorted(set(index["weight_map"].values()))[0])
    out = tmp_path / "run"
    expect_user_error(run_clm_flax.main, run_args(str(start), corpus, out, "--max_steps", "2",
                                                  model_flag="--model_name_or_path"),
                      "shard .* listed in model.safetensors.index.json is missing; download the whole model again")
    assert not out.exists()  # checked before the output directory is made


def test_bfloat16_params_with_fsdp_continue_a_bfloat16_checkpoint(tokenizer_dir, corpus, tmp_path):
    """--param_dtype bfloat16 --sharding fsdp from a sharded bfloat16 checkpoint: the params train in bfloat16
    (the first step changes them), the export is bfloat16 and transformers computes our logits from it."""
    start = tmp_path / "start"
    shutil.copytree(tokenizer_dir, start)
    hf = hf_checkpoint("llama", vocab_size=320).to(torch.bfloat16)
    hf.save_pretrained(start, max_shard_size="40KB")
    out = tmp_path / "run"
    run_clm_flax.main(run_args(str(start), corpus, out, "--max_steps", "2", "--do_eval", "false", "--save_steps", "2",
                               "--learning_rate", "1e-2", "--sharding", "fsdp", "--param_dtype", "bfloat16",
                               model_flag="--model_name_or_path"))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    tuned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert tuned.dtype == torch.bfloat16
    assert any(not torch.equal(p, q) for p, q in zip(tuned.parameters(), hf.parameters()))
    config, ours = load_pretrained(str(out))
    ids = np.random.default_rng(0).integers(3, 300, (2, 24))
    with torch.no_grad():
        ref = tuned.float()(torch.tensor(ids)).logits.numpy()
    assert np.abs(np.asarray(ours(jnp.asarray(ids))) - ref).max() < 1e-4


def test_continue_mistral_recipe_on_a_tiny_mistral(tokenizer_dir, corpus, tmp_path):
    """configs/continue-mistral-7b.yaml end to end (bf16 compute, fsdp, remat, scan, its learning rate and
    warmup, evaluation from the start) on a tiny Mistral that transformers wrote in bfloat16 shards, with only
    the sizes made tiny: it trains, evaluates the held-out text, and the export loads in transformers."""
    start = tmp_path / "start"
    shutil.copytree(tokenizer_dir, start)
    config = transformers.MistralConfig(vocab_size=320, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                        sliding_window=16)
    torch.manual_seed(0)
    add_noise(transformers.MistralForCausalLM(config), 0.05).to(torch.bfloat16).save_pretrained(
        start, max_shard_size="40KB")
    out = tmp_path / "run"
    recipe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                          "continue-mistral-7b.yaml")
    run_clm_flax.main(["--config_file", recipe, "--output_dir", str(out), "--model_name_or_path", str(start),
                       "--train_file", corpus["train"], "--validation_file", corpus["validation"],
                       "--block_size", "32", "--gradient_accumulation_steps", "2", "--max_steps", "4",
                       "--warmup_steps", "2", "--eval_steps", "2", "--save_steps", "4", "--logging_steps", "1"])
    evals = read_metrics(out, "eval")
    assert [r["step"] for r in evals] == [0, 2, 4] and all(np.isfinite(r["loss"]) for r in evals)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf) is transformers.MistralForCausalLM
    _, ours = load_pretrained(str(out))
    ids = np.random.default_rng(0).integers(3, 300, (2, 24))
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    assert np.abs(np.asarray(ours(jnp.asarray(ids))) - ref).max() < 1e-4
