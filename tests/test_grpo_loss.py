"""GRPO's loss (flaxlm/objectives/grpo.py) is TRL's: on one fixed batch of completions (advantages of both signs,
rows that end early and one truncated row masked whole; sampling log-probabilities off the policy's so that ratios
clip on both sides; a reference off them too) scored by a tiny Qwen2 (fp32, dropout off), our loss, its gradients
and the logged kl, entropy and clip_ratio/* equal GRPOTrainer._compute_loss's for every --loss_type, both
importance-sampling levels, with and without beta; and with a LoRA adapter and the reference scored live (the
adapters off), as TRL trains a peft LoRA model; and for a tiny Qwen3-MoE, with TRL's load-balancing loss (aux_loss)."""
import numpy as np
import pytest

from generation_check import add_noise

B, P, C = 6, 4, 6  # completions, prompt length (every prompt: no padding), --max_completion_length
KEPT = [6, 3, 5, 0, 6, 2]  # each completion's tokens up to and with its EOS; 0: a truncated one, masked whole
ADVANTAGES = [1.0, -0.5, 0.8, 0.3, -1.2, 0.6]
# old - new log-probability of each row, plus noise per token: row 0's ratio ~1.5 (A > 0: clipped high), row 1's ~0.67
# (A < 0: clipped low), the others inside the clip range, so that both sides clip also at the sequence level
OLD_SHIFT = [-0.4, 0.4, 0.05, 0.0, -0.1, 0.1]
TEMPERATURE, EPSILON, EPSILON_HIGH, BETA = 0.7, 0.2, 0.28, 0.1
METRICS = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
# Measured over every case (AVX2 and SSE4_2 alike): ours and TRL's, both float32, each within 5e-7 of TRL's loss
# computed in float64 (its log-probabilities from transformers' float64 logits), in the loss, every gradient (the
# largest |gradient| 0.87) and every figure; 1e-5 leaves 20x. What this catches is >= 5e-5: TRL's default bf16
# autocast was 7e-5 off in the loss; the KL without TRL's default bias correction 5e-4; a wrong normalizer more.
TOL = 1e-5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Qwen2 saved by transformers: random weights plus noise (logits far from uniform), dropout off."""
    import torch
    import transformers
    config = transformers.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False, attention_dropout=0.0)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("grpo-qwen2")
    add_noise(transformers.Qwen2ForCausalLM(config), 0.1).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """A tiny Qwen3-MoE saved by transformers, built as the Qwen2 one, its load-balancing loss weighing 0.5 (so that
    it shows)."""
    import torch
    import transformers
    config = transformers.Qwen3MoeConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=16, router_aux_loss_coef=0.5, max_position_embeddings=64,
                                         tie_word_embeddings=False, attention_dropout=0.0)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("grpo-qwen3-moe")
    add_noise(transformers.Qwen3MoeForCausalLM(config), 0.1).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def rollout(checkpoint):
    return scored_rollout(checkpoint)


def scored_rollout(checkpoint):
    """The batch as numpy arrays: prompts, completions right-padded with 0, their masks, advantages, and the
    sampling policy's and the reference's log-probabilities: the model's own (logits / temperature) moved by
    OLD_SHIFT and noise, and by other noise."""
    import torch
    import transformers
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 96, (B, P))
    completion_mask = (np.arange(C) < np.array(KEPT)[:, None]).astype(np.int64)
    completion = np.where(completion_mask | (np.array(KEPT)[:, None] == 0), rng.integers(3, 96, (B, C)), 0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        logits = hf(torch.tensor(np.concatenate([prompt, completion], 1))).logits[:, P - 1:-1] / TEMPERATURE
    logps = torch.gather(torch.log_softmax(logits, -1), -1, torch.tensor(completion)[..., None])[..., 0].numpy()
    old = logps + np.array(OLD_SHIFT)[:, None] + 0.3 * rng.standard_normal((B, C))
    ref = logps + 0.3 * rng.standard_normal((B, C))
    return {"prompt_ids": prompt, "completion_ids": completion, "completion_mask": completion_mask,
            "advantages": np.array(ADVANTAGES, np.float32), "old": old.astype(np.float32),
            "ref": ref.astype(np.float32)}


def trl_trainer(checkpoint, tmp_path, peft_config=None, **grpo):
    import transformers
    from datasets import Dataset
    from tokenizers import Tokenizer, models as tokenizer_models
    from trl import GRPOConfig, GRPOTrainer
    tokenizer = transformers.PreTrainedTokenizerFast(  # the trainer wants one; _compute_loss reads no text
        tokenizer_object=Tokenizer(tokenizer_models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>")),
        pad_token="<pad>", unk_token="<unk>", eos_token="<pad>")
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,  # default: bf16
                      epsilon=EPSILON, epsilon_high=EPSILON_HIGH, temperature=TEMPERATURE, max_completion_length=C,
                      per_device_train_batch_size=B, num_generations=B, **grpo)
    trainer = GRPOTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(checkpoint),
                          reward_funcs=lambda completions, **kwargs: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * B}), processing_class=tokenizer,
                          peft_config=peft_config)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, which this skips
    trainer.model.train()  # _compute_loss logs under "train" in train mode (no dropout here to change anything)
    return trainer


def trl_inputs(rollout):
    """_compute_loss's inputs, as TRL's _generate_and_score_completions hands them over."""
    import torch
    inputs = {k: torch.tensor(rollout[k]) for k in ("prompt_ids", "completion_ids", "completion_mask", "advantages")}
    return {**inputs, "prompt_mask": torch.ones_like(inputs["prompt_ids"]),
            "old_per_token_logps": torch.tensor(rollout["old"]), "ref_per_token_logps": torch.tensor(rollout["ref"]),
            "num_items_in_batch": inputs["completion_mask"].sum().float()}


def trl_step(trainer, inputs):
    """(loss, {parameter name: gradient}, {figure: logged value}) of TRL's _compute_loss."""
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {k: p.grad.numpy() for k, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.item(), grads, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def our_step(graphdef, config, params, rollout, live_reference=False, **grpo):
    """(loss, gradients (our tree), {figure: value}) of our objective: loss_sum / weight_sum as the train step."""
    import jax
    import jax.numpy as jnp
    from flaxlm.objectives.grpo import grpo_objective
    objective = grpo_objective(graphdef, config, params, prompt_length=P, completion_length=C, pad_id=0,
                               epsilon=EPSILON, epsilon_high=EPSILON_HIGH, temperature=TEMPERATURE,
                               live_reference=live_reference, **grpo)
    ids = np.concatenate([rollout["prompt_ids"], rollout["completion_ids"]], 1).astype(np.int32)
    # No prompt padding: TRL's training forward numbers positions 0..L-1 and ours counts only the real tokens;
    # the two agree where every prompt is whole (the completions' right padding is after every scored token).
    mask = np.concatenate([np.ones((B, P), np.int32), rollout["completion_mask"].astype(np.int32)], 1)
    rows = {"input_ids": ids, "attention_mask": mask, "completion_mask": rollout["completion_mask"].astype(np.float32),
            "advantages": rollout["advantages"], "old_logps": rollout["old"]}
    if not live_reference:
        rows["ref_logps"] = rollout["ref"]
    batch = objective.collate(rows)

    def loss(p):
        sums = objective.loss_sums(p, batch, None)
        n = sums["weight_sum"]
        return sums["loss_sum"] / n, {k.removesuffix("_sum"): v / n for k, v in sums.items()
                                      if k not in ("loss_sum", "weight_sum")}
    (value, figures), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(jax.tree.map(jnp.asarray, params))
    return float(value), grads, {k: float(v) for k, v in figures.items()}


@pytest.fixture(scope="module")
def ours(checkpoint):
    from flaxlm.models import load_pretrained, split_model
    config, model = load_pretrained(checkpoint)
    graphdef, params = split_model(model)
    return graphdef, config, params


def assert_figures_match(figures, logged, beta):
    for name in METRICS + (("kl",) if beta else ()):
        assert figures[name] == pytest.approx(logged[name], rel=TOL, abs=TOL), name
    assert sorted(figures) == sorted(METRICS + (("kl",) if beta else ()))


# beta with TRL's default use_bias_correction_kl (the KL times the ratio), and without it
@pytest.mark.parametrize("beta, corrected", [(0.0, True), (BETA, True), (BETA, False)],
                         ids=["no-kl", "kl", "kl-uncorrected"])
@pytest.mark.parametrize("level", ["token", "sequence"])  # TRL warns (does not refuse) sequence with bnpo/dr_grpo/dapo
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_loss_gradients_and_figures_are_trls(checkpoint, rollout, ours, loss_type, level, beta, corrected, tmp_path):
    from flaxlm.models import to_hf_state_dict
    graphdef, config, params = ours
    grpo = dict(loss_type=loss_type, beta=beta, importance_sampling_level=level)
    trainer = trl_trainer(checkpoint, tmp_path, use_bias_correction_kl=corrected, **grpo)
    theirs, their_grads, logged = trl_step(trainer, trl_inputs(rollout))
    loss, grads, figures = our_step(graphdef, config, params, rollout, bias_correction_kl=corrected, **grpo)
    assert loss == pytest.approx(theirs, rel=TOL, abs=TOL)
    grads = to_hf_state_dict(config, grads)
    assert sorted(grads) == sorted(their_grads)
    for name, g in grads.items():
        np.testing.assert_allclose(g, their_grads[name], rtol=0, atol=TOL, err_msg=name)
    assert max(np.abs(g).max() for g in their_grads.values()) > 100 * TOL  # a gradient worth comparing
    assert_figures_match(figures, logged, beta)
    assert 0 < logged["clip_ratio/low_mean"] and 0 < logged["clip_ratio/high_mean"]  # both sides clip
    assert logged["clip_ratio/region_mean"] < 1  # and some tokens do not: their gradient flows


def test_a_lora_policy_against_its_base_scored_live_is_trls_peft_model(checkpoint, rollout, tmp_path):
    """LoRA with live_reference: our adapters (A and B random, so the policy is not its base) and TRL's peft model
    of them built from a peft_config (TRL's reference: the model with its adapters disabled) give the same loss,
    adapter gradients and figures; TRL's reference log-probabilities are scored as its trainer scores them."""
    import torch
    from peft import LoraConfig
    from trl.trainer.utils import use_adapter
    from flaxlm.models import split_model
    from flaxlm.models.lora import adapter_tensors
    from test_lora import with_random_adapter
    config, model, lora, modules = with_random_adapter(checkpoint)
    graphdef, params = split_model(model)
    grpo = dict(loss_type="dapo", beta=BETA, importance_sampling_level="token")
    targets = sorted({m.hf.rsplit(".", 1)[-1] for m in modules})
    trainer = trl_trainer(checkpoint, tmp_path, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0,
                                                           target_modules=targets), **grpo)
    peft_params = dict(trainer.model.named_parameters())
    adapters = {k.replace(".weight", ".default.weight"): v for k, v in adapter_tensors(params, modules).items()}
    with torch.no_grad():
        for name, x in adapters.items():
            peft_params[name].copy_(torch.tensor(x))
    inputs = trl_inputs(rollout)
    with torch.no_grad(), use_adapter(trainer.model, adapter_name=None):  # as _generate_and_score_completions
        ref, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), C)
    theirs, their_grads, logged = trl_step(trainer, {**inputs, "ref_per_token_logps": ref})
    loss, grads, figures = our_step(graphdef, config, params, rollout, live_reference=True, **grpo)
    assert loss == pytest.approx(theirs, rel=TOL, abs=TOL)
    grads = {k.replace(".weight", ".default.weight"): v for k, v in adapter_tensors(grads, modules).items()}
    assert sorted(grads) == sorted(their_grads)
    for name, g in grads.items():
        np.testing.assert_allclose(g, their_grads[name], rtol=0, atol=TOL, err_msg=name)
    assert max(np.abs(g).max() for g in their_grads.values()) > 100 * TOL
    assert_figures_match(figures, logged, BETA)
    assert logged["kl"] > 1e-3  # the adapters moved the policy off its base


def test_a_moe_policy_adds_trls_load_balancing_loss(moe_checkpoint, tmp_path):
    """A Qwen3-MoE policy: TRL adds router_aux_loss_coef times the load-balancing loss of the policy's forward (its
    attention mask: prompt and completion tokens) and logs it as aux_loss; ours, with the loss on as run_grpo.py
    turns it on (trl_router_loss), gives the same loss, every gradient (the routers' too) and aux_loss."""
    from types import SimpleNamespace
    from flaxlm.models import load_pretrained, split_model, to_hf_state_dict
    from flaxlm.models.moe import split_experts
    from flaxlm.training.pipeline import trl_router_loss
    rollout = scored_rollout(moe_checkpoint)
    config, model = load_pretrained(moe_checkpoint)
    config = trl_router_loss(SimpleNamespace(output_router_logits=None), config)
    graphdef, params = split_model(model)
    grpo = dict(loss_type="dapo", beta=0.0, importance_sampling_level="token")
    theirs, their_grads, logged = trl_step(trl_trainer(moe_checkpoint, tmp_path, **grpo), trl_inputs(rollout))
    loss, grads, figures = our_step(graphdef, config, params, rollout, **grpo)
    assert loss == pytest.approx(theirs, rel=TOL, abs=TOL)
    grads = to_hf_state_dict(config, grads)  # the experts per expert, as save_pretrained writes them
    their_grads = split_experts(their_grads)  # transformers' fused gate_up_proj and down_proj, so too
    assert sorted(grads) == sorted(their_grads)
    for name, g in grads.items():
        np.testing.assert_allclose(g, their_grads[name], rtol=0, atol=TOL, err_msg=name)
    assert max(np.abs(their_grads[n]).max() for n in their_grads if n.endswith("mlp.gate.weight")) > 100 * TOL
    assert figures["aux_loss"] == pytest.approx(logged["aux_loss"], rel=TOL, abs=TOL)
    assert 0.5 * logged["aux_loss"] > 1e-2  # the term weighs in the loss compared
    assert_figures_match({k: v for k, v in figures.items() if k in METRICS}, logged, 0.0)
