"""Every family's tiny preset, trained by its pretraining script with --compile_for v5e-8 --sharding fsdp: the train
step compiles for the 8 chips of a TPU v5e slice on this CPU (libtpu's compiler) with XLA attention; what the script
reports is the compiled program's (with the splash kernel: tests/test_splash.py). --do_eval false: the eval step, a
forward pass of the same model, is compiled in tests/test_compile_for.py; here it added a sixth to the file's time
(2026-12-07)."""
import jax
import pytest

from flaxlm.models import abstract_model, load_config
from flaxlm.models.registry import FAMILIES
from tpu_compile import compile_for_v5e_8, needs_libtpu, tiny_preset, tokenizer_kind

MOE = ("qwen3_moe",)  # the mixture-of-experts family compiled here (flaxlm.models.moe)


# One family per model module: a family whose module is another's (RoBERTa, XLM-RoBERTa and CamemBERT are BERT's;
# mT5 is UMT5's file's T5 v1.1; Qwen2 and Qwen3 are Llama's with biases, a window or a norm, as Mistral's window is
# compiled here) or whose experts are another's (Mixtral, OLMoE and Qwen2-MoE: flaxlm.models.moe, compiled in
# Qwen3-MoE) compiles the ops of one kept here. Each of those nine took 8-17 s of a test worker (2026-12-07).
SAME_MODULE = ("roberta", "xlm-roberta", "camembert", "mt5", "qwen2", "qwen3", "mixtral", "olmoe", "qwen2_moe")
COMPILED = [t for t in FAMILIES if t not in SAME_MODULE]


@needs_libtpu
@pytest.mark.parametrize("model_type", COMPILED)
def test_tiny_preset_compiles_for_a_v5e_8_with_fsdp(model_type, model_dir_for, corpus, capsys):
    model_dir = model_dir_for(tiny_preset(model_type), tokenizer_kind(model_type))
    r = compile_for_v5e_8(model_type, model_dir, corpus, "xla", 32, "--do_eval", "false")
    out = capsys.readouterr().out
    assert "--compile_for v5e-8: TPU v5 lite, topology v5e:2x4, 8 devices on 1 host" in out
    assert "fits v5e-8" in out
    # The program is the whole step: its FLOPs per chip are those counted for a global batch of 16 over 8 chips, up
    # to what the count leaves out (norms, softmax, the optimizer) and the tiny widths' rounding. An MoE family's count
    # is its active experts' (flaxlm.training.flops), which the compiled grouped matmuls match (ragged_dot's cost is
    # the routed tokens', not every expert's), and leaves out the routing (router softmax, top-k, the sort and
    # scatter of the token copies): the program is 1.69x the count at qwen3-moe-tiny (8 experts, top 2; 2026-11-29).
    assert 0.7 < r["compiled_flops"] / r["counted_flops"] < (2.0 if model_type in MOE else 1.6)
    # fsdp: the embeddings (the only arrays of the tiny models big enough to split) lie in eighths over the chips.
    whole = sum(p.size * 4 for p in jax.tree.leaves(abstract_model(load_config(model_dir))[1]))
    assert r["params"] < whole
    assert r["train"]["arguments"] >= r["params"] + r["optimizer"] + r["train_batch"] and r["train"]["code"] > 0
    # XLA attention: no Pallas kernel; an MoE family's ragged_dot becomes libtpu's Mosaic grouped-matmul kernels
    assert r["kernels"] > 0 if model_type in MOE else r["kernels"] == 0
