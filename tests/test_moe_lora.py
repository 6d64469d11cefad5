"""LoRA on a mixture of experts (flaxlm.models.expert_lora): each tiny MoE family with random adapters on its
attention and on its experts' 3-D parameters (PEFT's target_parameters) gives the logits peft gives on the
transformers model with our adapter file, which peft loads key for key; the merge equals peft's merge_and_unload;
the adapter loads back here. A run_sft.py LoRA run on a Qwen3-MoE's attention and experts exports such an adapter.
Tolerances: test_lora's (float32 against float32 in torch; measured at most 1.9e-6 of logits up to 3.5, 5e-7 of
the largest; merged weights within 3e-8)."""
import numpy as np
import pytest

from flaxlm.errors import UserError
from test_lora import ATOL_SHARE, MERGE_ATOL, exported, peft_on, torch_logits, with_random_adapter  # noqa: F401

BOTH = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


@pytest.mark.parametrize("family, targets, parameters", [
    ("qwen3_moe", None, BOTH), ("qwen3_moe", ["q_proj"], ["down_proj"]),
    *((family, None, BOTH) for family in ("mixtral", "qwen2_moe", "olmoe"))],
    ids=["qwen3_moe", "qwen3_moe-q_proj+down_proj", "mixtral", "qwen2_moe", "olmoe"])
def test_peft_loads_our_expert_adapter_and_gives_our_logits(family, targets, parameters, exported, tmp_path):
    """Attention and both expert parameters (PEFT nests their wrappers: gate_up_proj's tensors under base_layer) of
    every MoE family, or q_proj and one, by PEFT's short name. Strict: peft's state dict of the loaded adapter has
    exactly our file's tensors, bit for bit."""
    import json
    import jax.numpy as jnp
    import torch
    from peft.utils import get_peft_model_state_dict
    from safetensors.numpy import load_file
    from flax import nnx
    from transformers import AutoModelForCausalLM
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.models.expert_lora import ExpertLora
    from flaxlm.models.lora import load_adapter, save_adapter, save_merged
    base = exported(family)
    config, model, lora, modules = with_random_adapter(base, targets=targets, parameters=parameters)
    params = split_model(model)[1]
    save_adapter(tmp_path / "adapter", config, params, lora, modules, base=str(base))
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["target_parameters"] == parameters
    ids = np.random.default_rng(0).integers(5, config.vocab_size, (2, 12))
    ours = np.asarray(model(jnp.asarray(ids)))
    peft = peft_on(base, tmp_path / "adapter", config.vocab_size)
    theirs = torch_logits(peft, ids)
    np.testing.assert_allclose(ours, theirs, atol=ATOL_SHARE * np.abs(theirs).max(), rtol=0)
    stored = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    loaded = {k: v.numpy() for k, v in get_peft_model_state_dict(peft).items()}
    assert sorted(loaded) == sorted(stored) and any(".mlp.experts." in k for k in stored)
    for name, x in stored.items():
        np.testing.assert_array_equal(loaded[name], x, err_msg=name)
    for node in [n for _, n in nnx.iter_graph(model) if isinstance(n, ExpertLora)]:
        node.lora_b[...] = jnp.zeros_like(node.lora_b[...])  # the experts' adapters alone move the logits far more
    assert np.abs(np.asarray(model(jnp.asarray(ids))) - theirs).max() > 100 * ATOL_SHARE * np.abs(theirs).max()

    save_merged(str(tmp_path / "merged"), config, params, lora, modules, base=str(base))
    flat = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    peft_merged = peft_on(base, tmp_path / "adapter", config.vocab_size).merge_and_unload().eval()
    theirs_state = peft_merged.state_dict()
    assert sorted(flat.state_dict()) == sorted(theirs_state)
    for name, x in flat.state_dict().items():
        np.testing.assert_allclose(x.numpy(), theirs_state[name].numpy(), atol=MERGE_ATOL, rtol=0, err_msg=name)
    np.testing.assert_allclose(torch_logits(flat, ids), torch_logits(peft_merged, ids), atol=MERGE_ATOL, rtol=0)
    original = AutoModelForCausalLM.from_pretrained(base).state_dict()
    down = [name for name in original if name.endswith("experts.down_proj")]
    assert down and not any(torch.equal(theirs_state[name], original[name]) for name in down)

    _, again = load_pretrained(str(base))
    back, back_modules = load_adapter(again, config, str(tmp_path / "adapter"))
    assert back.parameters == tuple(parameters) and [m.key for m in back_modules] == [m.key for m in modules]
    np.testing.assert_array_equal(np.asarray(again(jnp.asarray(ids))), ours)


def test_expert_targets_are_checked(exported):
    from flaxlm.models import load_config
    from flaxlm.models.lora import LoraConfig, add_lora, target_parameters
    config = load_config(str(exported("qwen3_moe")))
    with pytest.raises(UserError, match="gate_proj is no expert parameter of this qwen3_moe model; use some of "
                                        "mlp.experts.down_proj, mlp.experts.gate_up_proj"):
        target_parameters(config, ["gate_proj"])
    with pytest.raises(UserError, match="this llama model has no expert parameters"):
        target_parameters(load_config(str(exported("llama"))), BOTH)
    with pytest.raises(UserError, match="--lora_dropout 0.1 cannot apply to expert parameters"):
        add_lora(None, config, LoraConfig(rank=2, dropout=0.1, parameters=tuple(BOTH)))


def test_a_lora_sft_run_on_attention_and_experts_loads_in_peft(exported, tmp_path):
    """run_sft.py --lora_target_parameters on a float32 Qwen3-MoE: the adapters of the experts learn (they move off
    zero), and peft on the base gives our logits with the export."""
    import json
    import jax.numpy as jnp
    from safetensors.numpy import load_file
    import run_sft
    from flaxlm.models import load_pretrained
    from flaxlm.models.lora import load_adapter
    base = exported("qwen3_moe")
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}: 2+{i}?", "completion": f" A: {2 + i}."}) + "\n"
                            for i in range(16)))
    out = tmp_path / "run"
    run_sft.main(["--output_dir", str(out), "--model_name_or_path", str(base), "--train_file", str(data),
                  "--max_length", "32", "--train_batch_size", "8", "--max_steps", "3", "--learning_rate", "1e-2",
                  "--do_eval", "false", "--report_to", "none", "--lora_rank", "4", "--lora_alpha", "16",
                  "--param_dtype", "float32", "--lora_target_parameters", *BOTH])
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert (adapter["target_modules"], adapter["target_parameters"]) == (["k_proj", "o_proj", "q_proj", "v_proj"],
                                                                         BOTH)
    stored = load_file(out / "adapter_model.safetensors")
    assert np.abs(stored["base_model.model.model.layers.1.mlp.experts.lora_B.weight"]).max() > 1e-3
    config, ours = load_pretrained(str(base))
    load_adapter(ours, config, str(out))
    ids = np.random.default_rng(1).integers(5, config.vocab_size, (2, 10))
    theirs = torch_logits(peft_on(base, out), ids)
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids))), theirs, atol=ATOL_SHARE * np.abs(theirs).max(),
                               rtol=0)
