"""upcycle_moe.py: a dense model's MoE sibling computes what the dense model computes (transformers' MoE model
against transformers' dense one, ours against both, the loss at step 0), every expert is the dense MLP, the router
is new. Bad input: tests/test_bad_input_fuzz.py."""
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from huggingface_hub import ModelCard
from safetensors.numpy import load_file

import upcycle_moe
from flaxlm import models
from flaxlm.objectives.clm import clm_objective
from flaxlm.tokenization.loading import load_tokenizer
from generation_check import add_noise
from parity import as_untied, hf_tied
from test_parity import CASE

# (dense case of tests/test_parity.py, config overrides): a Qwen3 with an untied head and head_dim 12 (not
# hidden_size / heads), the same tied; a Mistral with a window of 4 (shorter than the rows) -> Mixtral
DENSE = {"qwen3-untied": ("qwen3-head_dim12-untied", {}),
         "qwen3-tied": ("qwen3-head_dim12-untied", {"tie_word_embeddings": True}),
         "mistral-window4": ("mistral-window4-untied", {})}
MOE = {"qwen3": "Qwen3MoeForCausalLM", "mistral": "MixtralForCausalLM"}
E, K = 4, 2
# In float64 on both sides the upcycled model differs from the dense one only by its routing weights, renormalized
# in float32 (transformers' router): they sum to 1 within a few float32 ulps (~1e-7), so logits of |x| ~ 2.5 agree
# within ~3e-7 (measured 2.3e-7). Ours computes in float32: against the float64 dense logits, float32 rounding
# through 2 layers of width 32 (measured 1.3e-6). Both bounds ~10x what was measured.
F64_ATOL, F32_ATOL = 2e-6, 1e-5


@pytest.fixture(scope="module")
def dense_for(model_dir_for, tmp_path_factory):
    """dense_for(name): (a directory with a random dense transformers model of DENSE[name] and a BPE tokenizer,
    the model in float64, eval mode)."""
    made = {}

    def dense(name):
        if name not in made:
            case_name, overrides = DENSE[name]
            case, d = CASE[case_name], str(tmp_path_factory.mktemp(f"dense-{name}"))
            shutil.copytree(model_dir_for(None, "bpe", 300), d, dirs_exist_ok=True)
            torch.manual_seed(0)
            hf = case.hf_class(case.config(vocab_size=len(load_tokenizer(d)), attention_dropout=0.0, **overrides))
            hf = add_noise(as_untied(hf), case.std, 0).eval()  # noise on every tensor: norms and all
            assert hf_tied(hf) == overrides.get("tie_word_embeddings", case.tied)
            hf.save_pretrained(d)
            made[name] = d, hf.double()
        return made[name]

    return dense


def upcycle(src, out, *extra):
    upcycle_moe.main(["--model_name_or_path", src, "--output_dir", str(out), "--num_experts", str(E),
                      "--num_experts_per_tok", str(K), *extra])


def hf_logits(model, ids_BL):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids_BL)).logits.numpy()


def flaxlm_logits_and_loss(path, ids_BL):
    """Our model's logits and its causal-LM loss (the training scripts' objective) on ids_BL."""
    config, model = models.load_pretrained(path)
    graphdef, params = models.split_model(model)
    logits = models.apply_model(graphdef, params, jnp.asarray(ids_BL))
    objective = clm_objective(graphdef, config, params, ids_BL.shape[1], config.eos_token_id)
    sums = objective.loss_sums(params, objective.collate(ids_BL), None)
    return np.asarray(logits), float(sums["loss_sum"] / sums["weight_sum"])


@pytest.mark.parametrize("name", list(DENSE))
def test_upcycled_model_computes_the_dense_model(dense_for, tmp_path, name):
    src, dense_hf = dense_for(name)
    out = tmp_path / "moe"
    upcycle(src, out)
    ids_BL = np.random.default_rng(0).integers(3, dense_hf.config.vocab_size, (2, 12))
    moe_hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, experts_implementation="eager")  # eager: torch's grouped_mm has no float64
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(moe_hf).__name__ == MOE[dense_hf.config.model_type]
    assert hf_tied(moe_hf) == hf_tied(dense_hf)
    dense_BLV = hf_logits(dense_hf, ids_BL)
    assert np.abs(dense_BLV).max() > 1  # logits large enough for the tolerances to mean something
    np.testing.assert_allclose(hf_logits(moe_hf.double().eval(), ids_BL), dense_BLV, atol=F64_ATOL, rtol=0)
    ours_BLV, ours_loss = flaxlm_logits_and_loss(str(out), ids_BL)
    np.testing.assert_allclose(ours_BLV, dense_BLV, atol=F32_ATOL, rtol=0)
    _, dense_loss = flaxlm_logits_and_loss(src, ids_BL)  # step 0: the same loss as the dense model's
    with torch.no_grad():
        hf_loss = dense_hf(input_ids=torch.tensor(ids_BL), labels=torch.tensor(ids_BL)).loss.item()
    assert ours_loss == pytest.approx(dense_loss, abs=1e-6) and ours_loss == pytest.approx(hf_loss, abs=1e-5)


def test_experts_are_the_dense_mlp_and_the_router_is_new(dense_for, tmp_path):
    src, dense_hf = dense_for("qwen3-untied")
    upcycle(src, tmp_path / "a", "--router_init_std", "0.5", "--seed", "3")
    upcycle(src, tmp_path / "b", "--seed", "4")
    a, b, dense = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors"), \
        {k: v.numpy().astype(np.float32) for k, v in dense_hf.state_dict().items()}  # float64 of float32: exact
    for i in range(dense_hf.config.num_hidden_layers):
        for e in range(E):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                np.testing.assert_array_equal(a[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"],
                                              dense[f"model.layers.{i}.mlp.{proj}.weight"])
        router_ED = a[f"model.layers.{i}.mlp.gate.weight"]
        assert router_ED.shape == (E, dense_hf.config.hidden_size) and 0.4 < router_ED.std() < 0.6
        assert np.abs(b[f"model.layers.{i}.mlp.gate.weight"]).std() < 0.05  # initializer_range 0.02 by default
    shared = [k for k in dense if ".mlp." not in k]
    assert shared and all(np.array_equal(a[k], dense[k]) for k in shared if k in a)
    assert {k for k in a if ".mlp." not in k} == {k for k in shared if k in a}
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"],
            config["decoder_sparse_step"], config["mlp_only_layers"], config["norm_topk_prob"]) == \
        (E, K, dense_hf.config.intermediate_size, 1, [], True)
    for f in ("tokenizer.json", "tokenizer_config.json"):  # the tokenizer byte for byte
        assert (tmp_path / "a" / f).read_bytes() == open(os.path.join(src, f), "rb").read()
    card = ModelCard.load(tmp_path / "a" / "README.md")
    assert f"upcycled ({E} experts, {K} per token, each a copy of the dense qwen3 model's MLP) from the local " \
           f"model `{src}`" in card.text
