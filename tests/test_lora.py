"""LoRA (flaxlm.models.lora): for every decoder family's tiny preset, our adapter (random non-zero A and B) exported in
PEFT's format and loaded by peft on the transformers base gives our logits (fp32); the merged export equals the
adapter on its base; an adapter loads back here; a target the family does not have is one line."""
import numpy as np
import pytest

from flaxlm.errors import UserError
from flaxlm.models.registry import CAUSAL_LM_TYPES
from test_evaluate_lm import hf_export
from tpu_compile import tiny_preset

# |our logits - peft's| over the largest |logit|: float32 against float32 in another framework (the families'
# parity tests hold 1e-4 without adapters); an adapter adds two thin matmuls per layer.
ATOL_SHARE = 1e-4


@pytest.fixture(scope="module")
def exported(model_dir_for, tmp_path_factory):
    made = {}

    def export(family):
        if family not in made:
            made[family] = tmp_path_factory.mktemp(f"{family}-lora-base")
            hf_export(model_dir_for(tiny_preset(family), model_max_length=128), made[family])
        return made[family]
    return export


def with_random_adapter(base, rank=4, alpha=8.0, targets=None):
    """(config, model, lora, modules): the base with adapters whose A and B are both random (B is zero at the start
    of training, which would test nothing)."""
    import jax
    from flax import nnx
    from flaxlm.models import load_pretrained
    from flaxlm.models.lora import LoraConfig, add_lora
    config, model = load_pretrained(str(base))
    lora = LoraConfig(rank=rank, alpha=alpha, targets=targets)
    modules = add_lora(model, config, lora, seed=1)
    key = jax.random.PRNGKey(7)
    layers = [n for _, n in nnx.iter_graph(model) if getattr(n, "lora_b", None) is not None]
    for i, node in enumerate(layers):
        node.lora_b[...] = 0.05 * jax.random.normal(jax.random.fold_in(key, i), node.lora_b.shape)
    return config, model, lora, modules


@pytest.mark.parametrize("family", CAUSAL_LM_TYPES)
def test_peft_loads_our_adapter_and_gives_our_logits(family, exported, tmp_path):
    import jax.numpy as jnp
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from flaxlm.models import split_model
    from flaxlm.models.lora import merged, save_adapter
    from flaxlm.models import save_pretrained
    base = exported(family)
    config, model, lora, modules = with_random_adapter(base)
    params = split_model(model)[1]
    save_adapter(tmp_path / "adapter", config, params, lora, modules, base=str(base))
    ids = np.random.default_rng(0).integers(5, config.vocab_size, (2, 12))
    ours = np.asarray(model(jnp.asarray(ids)))
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs = peft(torch.tensor(ids)).logits.numpy()
    scale = np.abs(theirs).max()
    np.testing.assert_allclose(ours, theirs, atol=ATOL_SHARE * scale, rtol=0)
    save_pretrained(str(tmp_path / "merged"), config, merged(params, modules, lora))
    with torch.no_grad():
        flat = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(flat, theirs, atol=ATOL_SHARE * scale, rtol=0)


def test_an_adapter_loads_back_here(exported, tmp_path):
    import jax.numpy as jnp
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.models.lora import load_adapter, save_adapter
    base = exported("llama")
    config, model, lora, modules = with_random_adapter(base, targets=["q_proj", "down_proj"])
    save_adapter(tmp_path / "adapter", config, split_model(model)[1], lora, modules, base=str(base))
    _, again = load_pretrained(str(base))
    back, back_modules = load_adapter(again, config, str(tmp_path / "adapter"))
    assert (back.rank, back.alpha, set(back.targets)) == (lora.rank, lora.alpha, set(lora.targets))
    assert [m.hf for m in back_modules] == [m.hf for m in modules]
    ids = jnp.asarray(np.arange(3, 15)[None])
    np.testing.assert_array_equal(np.asarray(again(ids)), np.asarray(model(ids)))


def test_a_target_the_family_lacks_is_one_line(exported):
    from flaxlm.models import load_config
    from flaxlm.models.lora import target_modules
    config = load_config(str(exported("gpt2")))
    with pytest.raises(UserError, match="q_proj is not a linear module of this gpt2 model; use some of c_attn, "
                                        "c_fc, c_proj"):
        target_modules(config, ["q_proj"])
    assert [m.hf for m in target_modules(config, r"transformer\.h\.0\.attn\..*")] == ["transformer.h.0.attn.c_attn",
                                                                                     "transformer.h.0.attn.c_proj"]


def test_a_lora_sft_run_trains_only_the_adapters_and_peft_loads_its_export(exported, tmp_path):
    """run_sft.py --lora_rank on a transformers GPT-2: the export is a PEFT adapter (adapter_config.json with the
    rank, alpha and targets; a card of library_name peft) that peft puts on the base and that gives our logits."""
    import json
    import jax.numpy as jnp
    import torch
    from huggingface_hub import ModelCard
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    import run_sft
    from flaxlm.models import load_pretrained
    from flaxlm.models.lora import load_adapter
    from run_helpers import read_metrics
    base = exported("gpt2")
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}: 2+{i}?", "completion": f" A: {2 + i}."}) + "\n"
                            for i in range(32)))
    out = tmp_path / "run"
    run_sft.main(["--output_dir", str(out), "--model_name_or_path", str(base), "--train_file", str(data),
                  "--validation_split_percentage", "25", "--max_length", "32", "--train_batch_size", "8",
                  "--max_steps", "8", "--learning_rate", "1e-2", "--logging_steps", "4", "--eval_steps", "8",
                  "--eval_at_start", "--report_to", "none", "--lora_rank", "4", "--lora_alpha", "16",
                  "--lora_target_modules", "c_attn", "c_fc", "--param_dtype", "float32"])
    evals = read_metrics(out, "eval")
    assert evals[-1]["loss"] < evals[0]["loss"]
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], adapter["target_modules"]) == (4, 16.0, ["c_attn", "c_fc"])
    assert not (out / "model.safetensors").exists() and ModelCard.load(out / "README.md").data.library_name == "peft"
    config, ours = load_pretrained(str(base))
    load_adapter(ours, config, str(out))
    ids = np.random.default_rng(1).integers(5, config.vocab_size, (2, 10))
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out).eval()
    with torch.no_grad():
        theirs = peft(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids))), theirs, atol=ATOL_SHARE * np.abs(theirs).max(),
                               rtol=0)
    assert not np.allclose(theirs, AutoModelForCausalLM.from_pretrained(base).eval()(torch.tensor(ids)).logits
                           .detach().numpy(), atol=1e-3)  # the adapters learned something


def test_only_the_adapters_train_and_hold_optimizer_state(exported):
    """The run's optimizer with LoRA (--train_only the adapters): optimizer state for the adapters alone, and an
    update leaves every base weight bit-identical."""
    import jax
    import optax
    from flaxlm.config.options import TrainingArgs
    from flaxlm.models import split_model
    from flaxlm.models.lora import TRAINABLE, is_adapter
    from flaxlm.training.freeze import as_phases, flat_params
    from flaxlm.training.pipeline import run_optimizer
    _, model, _, _ = with_random_adapter(exported("llama"))
    params = split_model(model)[1]
    args = TrainingArgs(output_dir="unused", train_only=[TRAINABLE], learning_rate=1e-2, weight_decay=0.1)
    phases, _ = run_optimizer(args, params, 10)
    tx = as_phases(phases)[0].tx  # the one phase: only --train_only's parameters train
    state = tx.init(params)
    sized = [x for x in jax.tree.leaves(state) if hasattr(x, "shape") and x.size > 1]
    adapters = [x for path, x in flat_params(params).items() if is_adapter(path.split("/"))]
    assert sorted(x.size for x in sized) == sorted(2 * [x.size for x in adapters])  # Adam's two moments each
    grads = jax.tree.map(lambda x: jax.numpy.ones_like(x), params)
    updates, _ = tx.update(grads, state, params)
    after = optax.apply_updates(params, updates)
    for path, x in flat_params(after).items():
        before = flat_params(params)[path]
        if is_adapter(path.split("/")):
            assert not np.array_equal(np.asarray(x), np.asarray(before))
        else:
            assert np.array_equal(np.asarray(x), np.asarray(before)), path


def test_generate_and_evaluate_lm_take_a_base_and_an_adapter(exported, tmp_path, capsys):
    """generate.py --adapter gives peft's greedy tokens; evaluate_lm.py --adapter scores the text as the adapter on
    its base (its loss differs from the base alone)."""
    import json
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import evaluate_lm
    import generate
    from flaxlm.models import split_model
    from flaxlm.models.lora import save_adapter
    base = exported("llama")
    config, model, lora, modules = with_random_adapter(base)
    save_adapter(tmp_path / "adapter", config, split_model(model)[1], lora, modules, base=str(base))
    tok = AutoTokenizer.from_pretrained(base)
    prompt = "The index is out of range"
    ids = generate.encode(tok, prompt)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs = peft.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
    generate.main(["--model_name_or_path", str(base), "--adapter", str(tmp_path / "adapter"), "--prompt", prompt,
                   "--max_new_tokens", "6"])
    assert repr(tok.decode(theirs, skip_special_tokens=True)) in capsys.readouterr().out
    text = tmp_path / "text.txt"
    text.write_text("def main(args):\n    return args.value + 1\n" * 3)
    losses = []
    for extra in ([], ["--adapter", str(tmp_path / "adapter")]):
        out = tmp_path / f"eval{len(extra)}.json"
        evaluate_lm.main(["--model_name_or_path", str(base), "--validation_file", str(text), "--output_file",
                          str(out), *extra])
        losses.append(json.loads(out.read_text())["loss"])
    assert losses[0] != losses[1]
