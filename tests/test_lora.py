"""LoRA (flaxlm.models.lora): for every decoder family's tiny preset, our adapter (random non-zero A and B) exported in
PEFT's format and loaded by peft on the transformers base gives our logits (fp32); the merged export equals the
adapter on its base; an adapter loads back here; a target the family does not have is one line. Trainable tokens
(rows of the embeddings and an untied head, a grown vocabulary's too) as peft's trainable_token_indices; --merge_lora
as peft's merge_and_unload of the base's own checkpoint, in its dtype; a LoRA SFT run training the rows of the
chat template's new markers."""
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


def with_random_adapter(base, rank=4, alpha=8.0, targets=None, tokens=(), grow=0, parameters=()):
    """(config, model, lora, modules): the base with adapters (on its expert parameters too: PEFT's
    target_parameters) whose A and B are both random (B is zero at the start of training, which would test nothing);
    with tokens (ids), their rows trainable and moved at random, after the
    vocabulary grew by `grow` rows (as a chat template's markers grow it)."""
    import jax
    from flax import nnx
    from flaxlm.models import load_pretrained
    from flaxlm.models.lora import LoraConfig, add_lora, grow_vocabulary
    config, model = load_pretrained(str(base))
    if grow:
        grow_vocabulary(model, config, config.vocab_size + grow)
    lora = LoraConfig(rank=rank, alpha=alpha, targets=targets, trainable_tokens=tuple(tokens),
                      parameters=tuple(parameters))
    modules = add_lora(model, config, lora, seed=1)
    key = jax.random.PRNGKey(7)
    layers = [n for _, n in nnx.iter_graph(model) if getattr(n, "lora_b", None) is not None]
    for i, node in enumerate(layers):
        node.lora_b[...] = 0.05 * jax.random.normal(jax.random.fold_in(key, i), node.lora_b.shape)
    rows = [n for _, n in nnx.iter_graph(model) if getattr(n, "token_delta", None) is not None]
    for i, node in enumerate(rows):
        node.token_delta[...] = 0.3 * jax.random.normal(jax.random.fold_in(key, 100 + i), node.token_delta.shape)
    return config, model, lora, modules


def peft_on(base, adapter, vocab_size=None, dtype=None):
    """peft's model of the adapter directory on the transformers base, its vocabulary first resized to vocab_size
    (default: the adapter's tokenizer's) when longer: the recipe of docs/post-training.md."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf = AutoModelForCausalLM.from_pretrained(base, **({"dtype": dtype} if dtype else {}))
    size = vocab_size or len(AutoTokenizer.from_pretrained(adapter))
    if size > hf.config.vocab_size:
        hf.resize_token_embeddings(size)
    return PeftModel.from_pretrained(hf, adapter).eval()


def torch_logits(model, ids):
    import torch
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


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


# The merge against peft's merge_and_unload: float32 sums W + alpha / r * A B taken in another order differ in the last
# bits (measured 0 on these presets), 1e-5 of the logits; a bfloat16 base's merged weights each round that float32 sum
# once, as peft's, so within one bfloat16 step (2^-7 of the value; measured 0).
MERGE_ATOL, BF16_STEP = 1e-5, 2.0 ** -7


@pytest.mark.parametrize("family, dtype", [("llama", "float32"), ("gpt2", "float32"), ("llama", "bfloat16")])
def test_trainable_tokens_load_in_peft_and_the_merge_is_peft_s(family, dtype, exported, tmp_path):
    """Trained rows of a token of the base and of two past its vocabulary (as a chat template's markers: the
    embeddings and llama's untied head; gpt2's head is tied): peft loads the adapter (trainable_token_indices) on the
    base resized as transformers resizes it and gives our logits; save_merged re-reads the base's checkpoint and
    equals peft's merge_and_unload in the base's dtype (config.json's too), every other row of the tables the
    base's bit for bit; the adapter loads back here, the vocabulary grown."""
    import json
    import shutil
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM
    from flaxlm.models import load_config, load_pretrained, split_model
    from flaxlm.models.lora import load_adapter, save_adapter, save_merged
    base = exported(family)
    if dtype == "bfloat16":
        base = tmp_path / "base"
        shutil.copytree(exported(family), base)
        AutoModelForCausalLM.from_pretrained(exported(family)).to(torch.bfloat16).save_pretrained(base)
    V = load_config(str(base)).vocab_size
    tokens = (7, V, V + 1)
    config, model, lora, modules = with_random_adapter(base, tokens=tokens, grow=2)
    params = split_model(model)[1]
    save_adapter(tmp_path / "adapter", config, params, lora, modules, base=str(base))
    indices = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["trainable_token_indices"]
    assert indices == ({"embed_tokens": list(tokens), "lm_head": list(tokens)} if family == "llama" else list(tokens))
    ids = np.array([[5, 7, V, 9, V + 1, 11, V - 1, 7, 12]])
    ours = np.asarray(model(jnp.asarray(ids)))
    theirs = torch_logits(peft_on(base, tmp_path / "adapter", V + 2, dtype=torch.float32), ids)
    np.testing.assert_allclose(ours, theirs, atol=ATOL_SHARE * np.abs(theirs).max(), rtol=0)

    save_merged(str(tmp_path / "merged"), config, params, lora, modules, base=str(base))
    flat = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    peft_merged = peft_on(base, tmp_path / "adapter", V + 2).merge_and_unload().eval()  # in the base's dtype
    assert flat.dtype == peft_merged.dtype == getattr(torch, dtype)
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] == dtype
    if dtype == "float32":
        np.testing.assert_allclose(torch_logits(flat, ids), torch_logits(peft_merged, ids), atol=MERGE_ATOL, rtol=0)
    theirs_state = peft_merged.state_dict()
    for name, x in flat.state_dict().items():
        np.testing.assert_allclose(x.float().numpy(), theirs_state[name].float().numpy(), atol=MERGE_ATOL,
                                   rtol=BF16_STEP if dtype == "bfloat16" else 0, err_msg=name)
    original = AutoModelForCausalLM.from_pretrained(base)
    others = np.setdiff1d(np.arange(V), tokens)
    for mine, theirs_table in ((flat.get_input_embeddings(), original.get_input_embeddings()),
                               (flat.get_output_embeddings(), original.get_output_embeddings())):
        assert torch.equal(mine.weight[others], theirs_table.weight[others])

    again_config, again = load_pretrained(str(base))
    load_adapter(again, again_config, str(tmp_path / "adapter"))
    assert again_config.vocab_size == V + 2
    np.testing.assert_allclose(np.asarray(again(jnp.asarray(ids))), ours, atol=1e-6 * np.abs(ours).max(), rtol=0)


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
    """The run's optimizer with LoRA (--train_only the adapters) and two trainable tokens: optimizer state for the
    adapters and the tokens' rows alone, and an update leaves every base weight bit-identical (the token embeddings
    and the head included: their trained rows are token_delta) while the rows move."""
    import jax
    import optax
    from flaxlm.config.options import TrainingArgs
    from flaxlm.models import split_model
    from flaxlm.models.lora import TRAINABLE, is_adapter
    from flaxlm.training.freeze import as_phases, flat_params
    from flaxlm.training.pipeline import run_optimizer
    _, model, _, _ = with_random_adapter(exported("llama"), tokens=(3, 9))
    assert {"embed/token_delta", "lm_head/token_delta"} <= set(flat_params(split_model(model)[1]))
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


def test_a_lora_sft_run_trains_the_chat_template_s_new_rows(exported, tmp_path):
    """run_sft.py --lora_rank --chat_template chatml on a float32 Llama that lacks ChatML's markers (its base trained
    as a bfloat16 copy): the adapter carries the markers' rows as peft's trainable tokens (embeddings and the untied
    head), moved from where they started, and peft on the base resized to the exported tokenizer gives our logits.
    A run continuing it (--lora_adapter: the trained rows read back) with --merge_lora and nothing more learned
    exports a float32 model (config.json says so) that equals peft's merge_and_unload of the adapter."""
    import json
    import jax.numpy as jnp
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import run_sft
    from test_sft import conversations_file
    from flaxlm.adaptation.added_tokens import add_special_tokens
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.models.lora import load_adapter
    base = exported("llama")
    markers = ["<|im_start|>", "<|im_end|>"]
    common = ["--model_name_or_path", str(base), "--chat_template", "chatml", "--train_file",
              conversations_file(tmp_path / "conv.jsonl", n=16), "--validation_split_percentage", "25",
              "--max_length", "48", "--train_batch_size", "8", "--eval_steps", "100", "--report_to", "none"]
    run_sft.main(["--output_dir", str(tmp_path / "run"), *common, "--max_steps", "3", "--learning_rate", "1e-2",
                  "--lora_rank", "4", "--lora_alpha", "16", "--lora_target_modules", "q_proj", "down_proj"])
    tok = AutoTokenizer.from_pretrained(tmp_path / "run")
    ids = tok.convert_tokens_to_ids(markers)
    config, start = load_pretrained(str(base))
    assert min(ids) >= config.vocab_size  # new rows
    adapter = json.loads((tmp_path / "run" / "adapter_config.json").read_text())
    assert adapter["trainable_token_indices"] == {"embed_tokens": ids, "lm_head": ids}
    _, _, start_params = add_special_tokens(AutoTokenizer.from_pretrained(base), config, split_model(start)[1],
                                            markers)  # the rows the run started from (the mean of their pieces)
    stored = load_file(tmp_path / "run" / "adapter_model.safetensors")
    for name, start_rows in (("model.embed_tokens", start_params["embed"]["embedding"][ids]),
                             ("lm_head", start_params["lm_head"]["kernel"][:, ids].T)):
        moved = np.abs(stored[f"base_model.model.{name}.token_adapter.trainable_tokens_delta"] - start_rows)
        assert (moved.max(axis=1) > 1e-2).all(), name  # far more than the bfloat16 copy's rounding

    text = np.array([[ids[0], 40, 41, 42, ids[1], ids[0], 43, 44]])
    config, ours = load_pretrained(str(base))
    load_adapter(ours, config, str(tmp_path / "run"))
    theirs = torch_logits(peft_on(base, tmp_path / "run"), text)
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(text))), theirs, atol=ATOL_SHARE * np.abs(theirs).max(),
                               rtol=0)

    run_sft.main(["--output_dir", str(tmp_path / "merged"), *common, "--max_steps", "1", "--learning_rate", "0",
                  "--lora_adapter", str(tmp_path / "run"), "--merge_lora"])
    flat = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert flat.dtype == torch.float32 and json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] \
        == "float32"
    np.testing.assert_allclose(torch_logits(flat, text), torch_logits(peft_on(base, tmp_path / "run")
                                                                      .merge_and_unload().eval(), text),
                               atol=MERGE_ATOL, rtol=0)
