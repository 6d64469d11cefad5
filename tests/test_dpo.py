"""DPO (run_dpo.py): on a fixed batch of a tiny checkpoint (fp32), the loss and TRL's logged rewards equal TRL's
DPOTrainer computation for sigmoid, ipo and hinge; the reference computed once equals a live transformers reference
model; the log-probabilities count only answer tokens; a resumed run reuses the reference and continues the same
curve; bad pairs are one line."""
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import run_dpo
from run_helpers import read_metrics
from flaxlm.data.preferences import encode_pair, pair, pair_rows
from flaxlm.errors import UserError

PAIRS = [{"prompt": f"Hva er {a}+{b}?", "chosen": f" Svaret er {a + b}.", "rejected": f" Det er {a * b + 1}."}
         for a, b in ((1, 2), (3, 4), (2, 7), (5, 5), (8, 1), (6, 3))]


@pytest.fixture(scope="module")
def checkpoints(tiny_gpt2_dir, tmp_path_factory):
    """(policy, reference): two tiny GPT-2s of different random weights, dropout off, saved by transformers with our
    tokenizer."""
    import torch
    import transformers
    out = []
    for seed in (0, 1):
        d = tmp_path_factory.mktemp(f"dpo-model-{seed}")
        shutil.copytree(tiny_gpt2_dir, d, dirs_exist_ok=True)
        config = transformers.AutoConfig.from_pretrained(d, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        torch.manual_seed(seed)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(d)
        out.append(str(d))
    return out


@pytest.fixture(scope="module")
def moe_checkpoints(tiny_gpt2_dir, tmp_path_factory):
    """(policy, reference): two tiny Qwen3-MoEs of different random weights with our tokenizer, the load-balancing
    loss weighing 0.5 (so that it shows)."""
    import torch
    import transformers
    out = []
    for seed in (0, 1):
        d = tmp_path_factory.mktemp(f"dpo-moe-{seed}")
        shutil.copytree(tiny_gpt2_dir, d, dirs_exist_ok=True)
        tok = transformers.AutoTokenizer.from_pretrained(d)
        config = transformers.Qwen3MoeConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                                             num_experts_per_tok=2, moe_intermediate_size=16, router_aux_loss_coef=0.5,
                                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                             pad_token_id=tok.pad_token_id)
        torch.manual_seed(seed)
        transformers.Qwen3MoeForCausalLM(config).save_pretrained(d)
        out.append(str(d))
    return out


def ours(policy, reference, loss_type, max_length=48):
    """(mean loss, {figure: mean}) of our objective over PAIRS, the reference computed once from `reference`."""
    import jax
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.objectives.dpo import dpo_objective, reference_logps
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.training.mesh import make_mesh
    from flaxlm.training.pipeline import trl_router_loss
    from flaxlm.training.sharding import state_shardings
    tok = load_tokenizer(policy)
    rows = pair_rows([encode_pair(tok, None, pair(p, "pair")) for p in PAIRS], max_length, tok.eos_token_id)
    mesh = make_mesh()
    ref_graphdef, ref_params = split_model(load_pretrained(
        reference, shardings=lambda abstract: state_shardings(abstract, mesh, "data"))[1])
    rows.update(reference_logps(ref_graphdef, ref_params, rows, 8, mesh, tok.eos_token_id))
    config, model = load_pretrained(policy)
    config = trl_router_loss(SimpleNamespace(output_router_logits=None), config)
    graphdef, params = split_model(model)
    objective = dpo_objective(graphdef, config, params, max_length, tok.eos_token_id, loss_type, beta=0.1)
    sums = jax.jit(objective.loss_sums)(params, objective.collate(rows), None)
    n = float(sums["weight_sum"])
    return float(sums["loss_sum"]) / n, {k.removesuffix("_sum"): float(v) / n for k, v in sums.items()
                                         if k not in ("loss_sum", "weight_sum")}, rows


@pytest.mark.parametrize("loss_type, family", [("sigmoid", "gpt2"), ("ipo", "gpt2"), ("hinge", "gpt2"),
                                               ("sigmoid", "qwen3_moe")])
def test_loss_and_rewards_are_trls(request, loss_type, family, tmp_path):
    """A mixture of experts: TRL's load-balancing loss (aux_loss, logged) added to the policy's."""
    import torch
    import transformers
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    policy, reference = request.getfixturevalue("checkpoints" if family == "gpt2" else "moe_checkpoints")
    tok = transformers.AutoTokenizer.from_pretrained(policy)
    trainer = DPOTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(policy),
                         ref_model=transformers.AutoModelForCausalLM.from_pretrained(reference),
                         processing_class=tok, train_dataset=Dataset.from_list(PAIRS),
                         args=DPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, beta=0.1,
                                        loss_type=[loss_type], per_device_train_batch_size=len(PAIRS), max_length=48))
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.eval()
    with torch.no_grad():
        theirs = float(trainer.compute_loss(trainer.model, batch))
    logged = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
    loss, figures, _ = ours(policy, reference, loss_type)
    assert loss == pytest.approx(theirs, rel=1e-4, abs=1e-6)
    for name, value in figures.items():
        if name in logged or family == "gpt2":
            assert value == pytest.approx(logged[name], rel=1e-4, abs=1e-5), name
    assert ("aux_loss" in logged) == (family != "gpt2")


def test_the_reference_computed_once_is_a_live_reference_model_and_counts_answer_tokens_only(checkpoints):
    """The reference's log-probabilities (our JAX model, once) equal transformers' reference model scoring the same
    rows live: the sum of log p over the tokens a hand-built mask marks as the answer's (this tokenizer writes <s>,
    the prompt, the answer, the eos appended to it as TRL does, and its own </s>)."""
    import torch
    import transformers
    policy, reference = checkpoints
    tok = transformers.AutoTokenizer.from_pretrained(policy)
    _, _, rows = ours(policy, reference, "sigmoid")
    hf = transformers.AutoModelForCausalLM.from_pretrained(reference).eval()
    for i, p in enumerate(PAIRS):
        for name in ("chosen", "rejected"):
            prompt_len = 1 + len(tok(p["prompt"], add_special_tokens=False)["input_ids"])  # <s> and the prompt
            full = tok(p["prompt"] + p[name] + tok.eos_token)["input_ids"]  # ... the answer, its </s> and </s>
            mask = [0] * prompt_len + [1] * (len(full) - prompt_len)
            assert rows[f"{name}_answer"][i, :len(full)].tolist() == mask and rows[f"{name}_ids"][i, :len(full)] \
                .tolist() == full
            with torch.no_grad():
                logp = torch.log_softmax(hf(torch.tensor([full])).logits[0, :-1], -1)
            live = sum(float(logp[t - 1, full[t]]) for t in range(len(full)) if mask[t])
            assert float(rows[f"ref_{name}"][i]) == pytest.approx(live, rel=1e-5, abs=1e-4)


def test_a_live_reference_is_the_base_with_the_adapters_off(checkpoints):
    """--precompute_ref_log_probs false with LoRA: the reference scored in the step (the adapters off) gives the
    loss, rewards and gradients that the reference computed once from the base model gives."""
    import jax
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.models.lora import LoraConfig, add_lora
    from flaxlm.objectives.dpo import dpo_objective, reference_logps
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.training.mesh import make_mesh
    from flaxlm.training.sharding import state_shardings
    tok = load_tokenizer(checkpoints[0])
    rows = pair_rows([encode_pair(tok, None, pair(p, "pair")) for p in PAIRS], 48, tok.eos_token_id)
    mesh = make_mesh()
    base_graphdef, base_params = split_model(load_pretrained(
        checkpoints[0], shardings=lambda abstract: state_shardings(abstract, mesh, "data"))[1])
    rows.update(reference_logps(base_graphdef, base_params, rows, 8, mesh, tok.eos_token_id))
    config, model = load_pretrained(checkpoints[0])
    add_lora(model, config, LoraConfig(rank=4, alpha=8))
    graphdef, params = split_model(model)
    params = jax.tree_util.tree_map_with_path(  # trained adapters: the policy is not the reference
        lambda path, x: x + 0.05 if "lora_b" in jax.tree_util.keystr(path) else x, params)
    loss, grads, margins = {}, {}, {}
    for live in (False, True):
        objective = dpo_objective(graphdef, config, params, 48, tok.eos_token_id, live_reference=live)
        batch = objective.collate({k: v for k, v in rows.items() if not (live and k.startswith("ref_"))})
        loss[live], grads[live] = jax.jit(jax.value_and_grad(
            lambda p: objective.loss_sums(p, batch, None)["loss_sum"]))(params)
        margins[live] = float(jax.jit(objective.loss_sums)(params, batch, None)["rewards/margins_sum"])
    assert float(loss[True]) == pytest.approx(float(loss[False]), rel=1e-5)
    assert margins[True] == pytest.approx(margins[False], rel=1e-5) and abs(margins[False]) > 1e-3
    for a, b in zip(jax.tree.leaves(grads[True]), jax.tree.leaves(grads[False])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_lora_run_with_a_live_reference_trains_and_keeps_no_reference_file(checkpoints, tmp_path):
    out = tmp_path / "live"
    run_dpo.main(["--output_dir", str(out), "--model_name_or_path", checkpoints[0], "--train_file",
                  write_pairs(tmp_path / "p.jsonl"), "--validation_split_percentage", "25", "--max_length", "32",
                  "--train_batch_size", "8", "--max_steps", "2", "--logging_steps", "1", "--learning_rate", "1e-3",
                  "--report_to", "none", "--lora_rank", "4", "--precompute_ref_log_probs", "false"])
    first, second = read_metrics(out)[:2]
    assert first["rewards/margins"] == 0 and first["rewards/accuracies"] == 0  # step 1: the adapters start at zero
    assert second["rewards/margins"] != 0  # then the policy has moved from the reference (the base)
    assert not (out / run_dpo.REFERENCE_FILE).exists() and (out / "adapter_model.safetensors").exists()


def test_a_live_reference_needs_lora(checkpoints, tmp_path):
    with pytest.raises(UserError, match="needs LoRA"):
        run_dpo.main(["--output_dir", str(tmp_path / "x"), "--model_name_or_path", checkpoints[0], "--train_file",
                      write_pairs(tmp_path / "p.jsonl"), "--precompute_ref_log_probs", "false"])
    assert not (tmp_path / "x").exists()


def write_pairs(path, n=24):
    rng = np.random.default_rng(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            a, b = (int(x) for x in rng.integers(1, 9, 2))
            f.write(json.dumps({"prompt": f"Hva er {a}+{b}?", "chosen": f" Svaret er {a + b}.",
                                "rejected": f" Svaret er {a + b + 1}."}, ensure_ascii=False) + "\n")
    return str(path)


def test_a_resumed_run_reuses_the_reference_and_continues_the_same_curve(checkpoints, tmp_path, capsys):
    from flaxlm.data.rows import ShuffledRows
    data = write_pairs(tmp_path / "pairs.jsonl")

    def argv(out, *extra):
        return ["--output_dir", str(out), "--model_name_or_path", checkpoints[0], "--train_file", data,
                "--validation_split_percentage", "25", "--max_length", "32", "--train_batch_size", "8",
                "--max_steps", "4", "--save_steps", "2", "--learning_rate", "1e-3", "--logging_steps", "1",
                "--eval_steps", "4", "--report_to", "none", *extra]
    run_dpo.main(argv(tmp_path / "straight"))
    original = ShuffledRows.batch_rows

    def crash(self, step, local):
        if step == 2:
            raise RuntimeError("simulated crash")
        return original(self, step, local)
    try:
        ShuffledRows.batch_rows = crash
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_dpo.main(argv(tmp_path / "resumed"))
    finally:
        ShuffledRows.batch_rows = original
    capsys.readouterr()
    run_dpo.main(argv(tmp_path / "resumed", "--resume_from_checkpoint", "latest"))
    assert "computed by an earlier run of these pairs" in capsys.readouterr().out
    straight, resumed = (read_metrics(tmp_path / d) for d in ("straight", "resumed"))
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed):
        for key in ("loss", "rewards/margins", "rewards/accuracies"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
    assert read_metrics(tmp_path / "straight", "eval")[-1]["rewards/margins"] == pytest.approx(
        read_metrics(tmp_path / "resumed", "eval")[-1]["rewards/margins"], rel=1e-5, abs=1e-6)
    evaluated = read_metrics(tmp_path / "straight", "eval")[-1]
    assert evaluated["pairs"] == 6 and "target_tokens" not in evaluated  # what it counted: the 25% held out of 24


@pytest.mark.parametrize("record, message", [
    ({"prompt": "Q", "chosen": " A", "rejected": " A"}, "are the same, which teaches nothing"),
    ({"prompt": "Q", "chosen": " ", "rejected": " B"}, "empty chosen answer"),
    ({"prompt": "Q", "chosen": " A"}, "needs 'chosen' and 'rejected'"),
    ({"prompt": "Q", "chosen": [{"role": "assistant", "content": "A"}], "rejected": " B"}, "of one kind"),
    ({"chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
      "rejected": [{"role": "user", "content": "Q"}]}, "no rejected answer after the prompt"),
])
def test_bad_pairs_are_one_line(record, message):
    with pytest.raises(UserError, match=message):
        pair(record, "pair 2 of --train_file p.jsonl")


def test_a_prompt_that_fills_max_length_is_one_line():
    with pytest.raises(UserError, match="train pair 1: its prompt of 9 tokens fills --max_length 8"):
        pair_rows([([1, 2], [3], [4]), (list(range(9)), [3], [4])], 8, 0, where="train pair")
    rows = pair_rows([([1, 2], [3], [4]), (list(range(9)), [3], [4])], 8, 0, max_prompt_length=4)
    assert rows["chosen_ids"][1].tolist() == [5, 6, 7, 8, 3, 0, 0, 0]  # the prompt kept from its end


@pytest.mark.parametrize("flags", [[], ["--lora_rank", "4", "--precompute_ref_log_probs", "false"]],
                         ids=["precomputed", "lora-live-reference"])
def test_compile_for_a_slice_writes_nothing(checkpoints, tmp_path, capsys, flags):
    out = tmp_path / "run"
    r = run_dpo.main(["--output_dir", str(out), "--model_name_or_path", checkpoints[0], "--max_length", "64",
                      "--compile_for", "v5e-4", "--do_eval", "false", *flags])
    assert "fits v5e-4" in capsys.readouterr().out and r["params"] > 0 and not out.exists()


def test_the_norquad_preference_set_reads_as_pairs_and_conversations(shared_data, tmp_path):
    """bench/norquad_chat.py (docs/post-training.md's example data): NorQuAD's questions as TRL-format pairs and conversations
    that run_dpo.py and run_sft.py read without a bad-pair line, each pair's answers different, held out by article."""
    from bench.norquad_chat import main as build
    from flaxlm.config.options import TextSourceArgs
    from flaxlm.data.conversations import load_conversations
    from flaxlm.data.preferences import load_pairs
    build(["--output_dir", str(tmp_path), "--data_dir", str(shared_data)])
    files = {kind: TextSourceArgs(train_file=[str(tmp_path / f"{kind}_train.jsonl")],
                                  validation_file=[str(tmp_path / f"{kind}_test.jsonl")]) for kind in ("dpo", "sft")}
    pairs, conversations = load_pairs(files["dpo"], 0, 0), load_conversations(files["sft"], 0, 0)
    assert len(pairs["train"]) > 3000 and len(pairs["validation"]) > 300
    assert len(conversations["validation"]) >= len(pairs["validation"])
    for p in pairs["validation"]:
        assert p.chosen != p.rejected
    train_prompts = {json.dumps(p.prompt) for p in pairs["train"]}
    assert not any(json.dumps(p.prompt) in train_prompts for p in pairs["validation"])
