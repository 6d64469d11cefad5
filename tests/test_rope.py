"""Every RoPE type transformers knows (flaxlm.models.rope), against transformers' logits past the context the model
was trained at.

The tiny models say they were trained at 8 positions (original_max_position_embeddings 8; dynamic: max_position_
embeddings 8); the causal batch's rows reach position 19 and the encoder's 11, so each type's scaling is in play.
Llama runs every type (its layers are those of Mistral, Mixtral, Qwen2, Qwen3 and their mixtures of experts, whose
model classes build their RoPE as Llama's); Gemma, Gemma 2, Gemma 3 (per layer type) and ModernBERT (per layer
type) one type each; test_every_rope_family_reads_the_type checks the wiring of all of them without compiling.
"""
import dataclasses
import json
import shutil
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxlm import models
from flaxlm.models.rope import Rope, rope_of
from generation_check import assert_greedy_matches_transformers
from parity import assert_close_at_real, batch, hf_logits, jitted, jnp_args, load_ours, random_hf
from test_parity import CASE, CASES

ORIGINAL = 8
# RoPE settings of each type; head width 8 (R = 4 frequencies) unless a case says otherwise
TYPES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    # DeepSeek's settings: attention_factor from mscale / mscale_all_dim, the ramp's bounds not truncated
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                    "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16, "truncate": False},
    # no factor: max_position_embeddings / original (64 / 8) sets attention_factor
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0],
                 "original_max_position_embeddings": ORIGINAL},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
}
THETA = {"rope_theta": 10000.0}


def with_rope(case, kind, layer_type=None):
    """The case with RoPE type `kind` (on the layers of `layer_type` only, for families with a RoPE per kind of
    layer); dynamic's threshold is max_position_embeddings, so the case then says 8."""
    params = {**THETA, **TYPES[kind]}
    fields = dict(case.fields, rope_parameters=params)
    if layer_type is not None:
        fields["rope_parameters"] = {**case.config().rope_parameters, layer_type: params}
    if kind == "dynamic":
        fields["max_position_embeddings"] = ORIGINAL
    return dataclasses.replace(case, name=f"{case.name}-{kind}", fields=fields)


LLAMA = CASE["llama-gqa-untied"]
# (the case, the RoPE type, the layer type it applies to: None for all)
RUNS = [*((LLAMA, kind, None) for kind in TYPES),
        (CASE["gemma-gqa-tied"], "longrope", None),
        (CASE["gemma2-softcap-window4-untied"], "dynamic", None),
        (CASE["gemma3_text-local-local-global"], "yarn", "full_attention"),
        (CASE["modernbert-global3-window4"], "yarn", "full_attention")]


@pytest.mark.parametrize("base,kind,layer_type", RUNS, ids=[f"{c}-{k}" for c, k, _ in RUNS])
def test_logits_past_the_original_context_are_transformers(base, kind, layer_type, tmp_path):
    """transformers' model with the type, saved and loaded here: our logits at every real position are its; and
    the type changed them (transformers' logits differ from the same weights under the case's own RoPE)."""
    case = with_rope(base, kind, layer_type)
    hf = random_hf(case)
    hf.save_pretrained(tmp_path)
    _, model = load_ours(case, tmp_path)
    b = batch(case)
    ref = hf_logits(hf, b.hf)
    assert_close_at_real(jitted(*models.split_model(model))(*jnp_args(b)), ref, b.real_BL, case.tol)
    plain = base.hf_class(base.config()).eval()
    plain.load_state_dict(hf.state_dict())
    assert np.abs(hf_logits(plain, b.hf) - ref)[b.real_BL].max() > 100 * case.tol


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_greedy_generation_across_the_switch_picks_transformers_tokens(kind, tmp_path):
    """dynamic and longrope change with the longest position of each forward: prompts of 7 and 3 tokens, 6 new
    ones, so the KV-cache decode crosses position 8 (transformers recomputes per forward; so do we)."""
    hf = random_hf(with_rope(LLAMA, kind), seed=3, std=0.3)
    hf.save_pretrained(tmp_path)
    assert_greedy_matches_transformers(hf, tmp_path, [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]], 6)


ROPE_FAMILIES = sorted({c.model_type: c for c in CASES if c.model_type in {
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "olmoe", "gemma", "gemma2",
    "gemma3_text", "modernbert"}}.items())


@pytest.mark.parametrize("case", [c for _, c in ROPE_FAMILIES], ids=lambda c: c.model_type)
def test_every_rope_family_reads_the_type(case):
    """Each RoPE family's model (built abstractly, nothing compiled) rotates its global layers by the YaRN Rope of
    its config, and holds no other kind of RoPE object."""
    nested = isinstance(case.config().rope_parameters.get("full_attention"), dict)
    config = with_rope(case, "yarn", "full_attention" if nested else None).config()
    model = nnx.eval_shape(lambda: models.create_model(config))
    H = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params = config.rope_parameters["full_attention"] if nested else config.rope_parameters
    yarn = rope_of(SimpleNamespace(rope_parameters=params, max_position_embeddings=config.max_position_embeddings), H)
    assert yarn.attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)
    used = rope_in_use(model)
    assert yarn in used and all(isinstance(r, Rope) for r in used)


def rope_in_use(model):
    """Every Rope a model holds: the model's own (Llama's, ModernBERT's pair) or each layer's attention's."""
    found = [getattr(model, "rope", None), *getattr(model, "ropes", ())]
    found += [getattr(layer.attn, "rotation", None) for layer in getattr(model, "layers", [])]
    return [r for r in found if r is not None]


def test_config_json_round_trip_keeps_the_type(tmp_path):
    """An old config.json's rope_scaling (type yarn) reads as transformers 5 reads it, and the config we write
    reads back in transformers with the same RoPE (its rotary embedding's frequencies and attention scaling)."""
    config = LLAMA.config(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    config.save_pretrained(tmp_path)
    ours = models.load_config(tmp_path)
    rope = models.create_model(ours).rope
    hf_rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(
        transformers.AutoConfig.from_pretrained(tmp_path))
    np.testing.assert_allclose(np.float32(rope.inv_freq), hf_rotary.inv_freq.numpy(), rtol=2e-7, atol=0)
    assert rope.attention_factor == pytest.approx(hf_rotary.attention_scaling, rel=1e-12)


def test_a_run_extends_a_checkpoint_s_context_and_transformers_reads_the_export(model_dir_for, corpus, tmp_path):
    """run_clm_flax.py --rope_scaling yarn x2 on transformers' Llama of 64 positions trains at --block_size 128
    (refused without it), and exports a config.json with which transformers computes our logits at 128 positions."""
    import run_clm_flax
    from run_helpers import run_args
    from test_run_clm import hf_checkpoint
    start, out = tmp_path / "start", tmp_path / "run"
    shutil.copytree(model_dir_for(None), start)
    hf_checkpoint("llama", vocab_size=320).save_pretrained(start)
    run_clm_flax.main(run_args(str(start), corpus, out, "--rope_scaling", '{"rope_type": "yarn", "factor": 2}',
                               "--block_size", "128", "--max_steps", "2", "--do_eval", "false", "--save_steps", "2",
                               model_flag="--model_name_or_path"))
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 128
    assert config["rope_parameters"] == {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
                                         "rope_theta": 10000.0}
    ids = np.random.default_rng(0).integers(3, 300, (2, 128))
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(out).eval()(torch.tensor(ids)).logits.numpy()
    _, ours = models.load_pretrained(str(out))
    assert np.abs(np.asarray(ours(jnp.asarray(ids))) - ref).max() < 1e-4
