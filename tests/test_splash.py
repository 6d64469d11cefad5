"""The Pallas splash kernel (flaxlm.models.splash) in interpret mode on this CPU against XLA attention, in float32:
outputs and gradients for every mask the families use, over 8 devices; and a family of each kind of attention it
computes, compiled for a TPU v5e-8 with it (libtpu's compiler), its train step calling the kernel."""
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from flaxlm.models.layers import Segments, attention
from flaxlm.models.registry import FAMILIES
from flaxlm.models.splash import where_not
from flaxlm.training import mesh as meshlib
from tpu_compile import compile_for_v5e_8, needs_libtpu, tiny_preset

B, T, N, K, H = 2, 256, 4, 2, 32  # two blocks of 128 a row: blocks the mask hides are skipped
DOCS = [0, 90, 200]  # where the documents of a packed row start


def inputs(seed=0, kv_heads=K):
    q, k, v = jax.random.normal(jax.random.key(seed), (3, B, T, N, H), jnp.float32)
    return q, k[:, :, :kv_heads], v[:, :, :kv_heads]


def padding_mask():
    mask = np.ones((B, T), bool)
    mask[1, 150:] = False  # row 1: 150 real tokens, then padding
    return jnp.asarray(mask)


def document_segments():
    ids = np.zeros((B, T), np.int32)
    for start in DOCS[1:]:
        ids[:, start:] += 1
    ids[1] = 0  # row 1: one document
    return Segments(jnp.asarray(ids))


# name: (the mask argument, attention()'s keyword arguments); K < N throughout: grouped-query attention
CASES = {
    "causal": (None, dict(causal=True)),
    "bidirectional with padding": (padding_mask, dict()),
    "sliding window": (None, dict(causal=True, window=100)),
    "bidirectional window with padding (ModernBERT's local layers)": (padding_mask, dict(window=65)),
    "packed documents": (document_segments, dict(causal=True)),
    "packed documents, sliding window": (document_segments, dict(causal=True, window=64)),
    "soft-capped (Gemma 2)": (None, dict(causal=True, window=128, softcap=5.0, scale=0.3)),
}


def through(implementation, mask, kw, real_BT11):
    def loss(q, k, v):
        out = attention(q, k, v, mask, implementation=implementation, **kw) * real_BT11
        return (out * jnp.cos(jnp.arange(out.size).reshape(out.shape))).sum(), out  # every real output weighs in
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize("case", list(CASES))
def test_splash_equals_xla_attention(case):
    """A padding query's output is never used (XLA lets it see the real keys, splash the other padding): the
    loss weighs the real queries' outputs only, as a model's loss does."""
    make_mask, kw = CASES[case]
    mask = make_mask() if make_mask else None
    real_BT11 = (padding_mask() if make_mask is padding_mask else jnp.ones((B, T), bool))[:, :, None, None]
    q, k, v = inputs()
    (_, out), grads = through("splash", mask, kw, real_BT11)(q, k, v)
    (_, want), want_grads = through("xla", mask, kw, real_BT11)(q, k, v)
    np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
    for got, expected in zip(grads, want_grads):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_splash_runs_per_device_over_the_mesh():
    """Under jit over 8 devices (the context mesh that the train step sets) the kernel runs on each device's rows."""
    mesh = meshlib.make_mesh()
    assert mesh.size == 8
    q, k, v = (jnp.concatenate([x] * 4) for x in inputs())  # 8 rows
    rows = NamedSharding(mesh, P("data"))
    step = meshlib.on_mesh(jax.jit(lambda q, k, v: attention(q, k, v, causal=True, implementation="splash"),
                                   in_shardings=rows, out_shardings=rows), mesh)
    np.testing.assert_allclose(step(q, k, v), attention(q, k, v, causal=True, implementation="xla"), atol=1e-5)


def test_what_splash_cannot_take_goes_to_xla():
    assert where_not(T, T) == ""
    assert "bias" in where_not(T, T, bias=jnp.zeros((1, N, T, T)))
    assert "dropout" in where_not(T, T, dropout=True)
    assert "per-query mask" in where_not(T, T, mask_ndim=3)
    assert "blocks of 128" in where_not(96, 96)
    q, k, v = inputs()  # rows of 96: XLA's result, whatever is asked for
    short = [x[:, :96] for x in (q, k, v)]
    np.testing.assert_array_equal(attention(*short, causal=True, implementation="splash"),
                                  attention(*short, causal=True, implementation="xla"))


@pytest.mark.parametrize("preset, line", [
    ("t5-v1_1-tiny", "T5 attends with XLA (its relative position buckets add a bias to the scores"),
    ("bloom-tiny", "BLOOM attends with XLA (its ALiBi adds a bias"),
    ("deberta-v3-tiny", "DeBERTa-v2 attends with XLA (its disentangled relative positions"),
    ("roberta-tiny", "RoBERTa drops out attention probabilities (attention_probs_dropout_prob=0.1 in config.json), "
                     "which the splash kernel cannot: XLA attention with [B, N, T, S] float32 scores while training "
                     "(splash in evaluation); recent recipes train without it: attention_probs_dropout_prob=0 "
                     "(create_config.py --set attention_probs_dropout_prob=0"),
    ("llama-tiny", None)])
def test_splash_asked_for_a_model_it_cannot_compute_says_so_in_one_line(preset, line, capsys, monkeypatch):
    from flaxlm.models.presets import build_config
    from flaxlm.training import pipeline
    from flaxlm.training.pipeline import say_attention
    monkeypatch.setattr(pipeline, "_SAID", set())  # a line printed earlier in this process is not printed again
    say_attention(build_config(preset), "splash")
    printed = capsys.readouterr().out
    assert (line in printed and printed.count("\n") == 1) if line else printed == ""


SPLASH = [t for t, f in FAMILIES.items() if not f.no_splash]
# one family for each kind of attention the kernel computes: causal with grouped queries (Llama), a sliding window
# (Mistral), soft-capping and alternating windows (Gemma 2), bidirectional with padding, global and local windows
# (ModernBERT: its global layers attend as BERT's), attention beside a mixture's experts (Qwen3-MoE). That every family hands its attention
# implementation to each attention call is tests/test_layer_stack.py's check, on CPU, for all of them; that each
# model module compiles for a TPU slice, tests/test_compile_for_families.py's.
# Llama's layers compile with the kernel as Mistral's (its module, with a window) and, split over devices, in
# tests/test_context_parallel.py
KINDS = ["mistral", "gemma2", "modernbert", "qwen3_moe"]
NO_DROPOUT = {"attention_probs_dropout_prob": 0.0, "attention_dropout": 0.0, "attn_pdrop": 0.0}


def test_each_kind_is_a_family_splash_takes():
    assert set(KINDS) <= set(SPLASH)


@needs_libtpu
@pytest.mark.parametrize("model_type", KINDS)
def test_with_splash_attention_the_tpu_program_calls_the_kernel(model_type, model_dir_for, corpus, tmp_path):
    """Rows of 128 (one block), attention dropout off (splash cannot drop out probabilities): the compiled train step
    calls the Pallas kernel, forward and backward."""
    model_dir = tmp_path / "model"
    shutil.copytree(model_dir_for(tiny_preset(model_type)), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update({k: v for k, v in NO_DROPOUT.items() if k in config})
    (model_dir / "config.json").write_text(json.dumps(config))
    r = compile_for_v5e_8(model_type, str(model_dir), corpus, "splash", 128, "--do_eval", "false")
    assert r["kernels"] >= 3

