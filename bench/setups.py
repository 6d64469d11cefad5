"""What bench/run.py times: suites of model shapes per objective, their targets, their transformers configs.

Imports no JAX, so bench/torch_reference.py builds its PyTorch models from the very same configs.

cpu: the "small" shape of ../shared/bench/hf_reference.py (vocab 8192, hidden 256, 4 layers, 4 heads, FF 1024,
seq 128, batch 32, fp32) for every objective. tiny: a shape for tests (and llama-tiny for the llama task). gpu:
the issues' targets in bf16 -- roberta-base at seq 128, global batch 256; t5-v1_1-base at input 512 (target 114),
batch 128; GPT-2 124M at seq 1024, batch 32; and "llama", Llama 3.2 1B's shape (hidden 2048, 16 layers, 32 heads,
8 KV heads, FF 8192, vocab 128256, tied embeddings, rope theta 500000) at seq 4096, batch 16 (bench/run.py
halves it while it runs out of memory). T5 is span corruption with noise 0.15 and mean span 3 (seq is its input
length); masked LM masks 15%. A setup's "dropout" is "config" (the config's rates) or "0" (every rate 0, as
llm.c and nanoGPT pretrain); each suite says which it runs by default ("both": a row of each).
"""
from flaxlm.data.span_corruption import t5_lengths

OBJECTIVES = {"mlm": "masked LM (RoBERTa)", "t5": "span corruption (T5 v1.1)", "clm": "causal LM (GPT-2)",
              "llama": "causal LM (Llama)"}
REFERENCE_TASK = {"mlm": "roberta-mlm", "t5": "t5-span", "clm": "gpt2-clm", "llama": "llama-clm"}  # names in the
# references' JSON
NOISE_DENSITY, MEAN_SPAN = 0.15, 3.0
# Every dropout rate a config of these families may hold (none is an attention mask or a LoRA rate).
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate", "resid_pdrop", "embd_pdrop",
                  "attn_pdrop", "attention_dropout", "hidden_dropout", "dropout", "activation_dropout")

SMALL = dict(name="small", vocab=8192, hidden=256, layers=4, heads=4, ff=1024, seq=128, batch=32)
TINY = dict(name="tiny", vocab=512, hidden=32, layers=2, heads=2, ff=64, seq=32, batch=8)
TINY_LLAMA = dict(name="llama-tiny shape", vocab=512, hidden=32, layers=2, heads=4, kv_heads=2, ff=88, seq=32,
                  batch=8, extra=dict(rope_theta=500000.0, tie_word_embeddings=True, head_dim=8))
LLAMA_3_2_1B = dict(name="llama-3.2-1b shape", vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8, ff=8192,
                    seq=4096, batch=16, extra=dict(rope_theta=500000.0, tie_word_embeddings=True, head_dim=64))

# targets: mfu (at least), step_s (at most), ref_ratio (our tokens/s over the transformers reference's, at least),
# memory_gib (peak device memory, at most), tokens_per_s (at least), nanogpt_ratio (ours over nanoGPT's, at least),
# dropout0_ratio (this row's tokens/s over the same task's dropout-0 row's, at least). targets apply to every row;
# row_targets: {"0": ..., "config": ...} to the rows of one dropout only. reference: hf =
# ../shared/bench/hf_reference.py, torch = bench/torch_reference.py (+ bench/nanogpt_reference.py for clm).
# tasks: the suite's setups; default_tasks: what it runs without --tasks; dropout: its default --dropout.
SUITES = {
    "cpu": dict(dtype="float32", steps=10, cpu_chunk_tokens=1024, reference="hf", dropout="config",
                default_tasks=["mlm", "t5", "clm"], tasks={t: SMALL for t in ("mlm", "t5", "clm")}),
    "tiny": dict(dtype="float32", steps=2, cpu_chunk_tokens=1024, reference="hf", dropout="config",
                 default_tasks=["mlm", "t5", "clm"], tasks={**{t: TINY for t in ("mlm", "t5", "clm")},
                                                             "llama": TINY_LLAMA}),
    "gpu": dict(dtype="bfloat16", steps=20, cpu_chunk_tokens=0, reference="torch", dropout="both",
                default_tasks=["mlm", "t5", "clm", "llama"], tasks={
        "mlm": dict(name="roberta-base", vocab=50265, hidden=768, layers=12, heads=12, ff=3072, seq=128,
                    batch=256, extra=dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5),
                    targets=dict(mfu=0.45, ref_ratio=1.5, memory_gib=16)),
        "t5": dict(name="t5-v1_1-base", vocab=32128, hidden=768, layers=12, heads=12, ff=2048, seq=512,
                   batch=128, extra=dict(tie_word_embeddings=False),
                   targets=dict(step_s=0.19, ref_ratio=1.5)),
        "clm": dict(name="gpt2 124M", vocab=50257, hidden=768, layers=12, heads=12, ff=3072, seq=1024,
                    batch=32, targets=dict(ref_ratio=1.5),
                    row_targets={"0": dict(tokens_per_s=470_000, nanogpt_ratio=1.0),
                                 "config": dict(dropout0_ratio=0.8)}),
        "llama": {**LLAMA_3_2_1B, "targets": dict(mfu=0.45)},
    }),
}


def t5_target_length(inputs_length):
    """The span-corrupted target length for an input of inputs_length tokens (114 for 512)."""
    return t5_lengths(inputs_length, NOISE_DENSITY, MEAN_SPAN)[1]


def row_targets(c):
    """The targets of setup c's row: the setup's for every row, then those of its dropout ("0" or "config")."""
    return {**c.get("targets", {}), **c.get("row_targets", {}).get(c.get("dropout", "config"), {})}


def dropout_rates(config):
    """{field: rate} of every dropout rate config holds (DROPOUT_FIELDS)."""
    return {k: getattr(config, k) for k in DROPOUT_FIELDS if isinstance(getattr(config, k, None), float)}


def without_dropout(config):
    """config with every dropout rate set to 0 (in place; returned)."""
    for k in dropout_rates(config):
        setattr(config, k, 0.0)
    return config


def hf_config(task, c):
    """The transformers config of setup `c` for objective `task`, its dropout rates 0 when c["dropout"] is "0"."""
    config = _hf_config(task, c)
    return without_dropout(config) if c.get("dropout") == "0" else config


def _hf_config(task, c):
    import transformers as tr
    if task == "mlm":
        kw = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                  num_attention_heads=c["heads"], intermediate_size=c["ff"], max_position_embeddings=c["seq"] + 2)
        cls = tr.RobertaConfig
    elif task == "t5":
        kw = dict(vocab_size=c["vocab"], d_model=c["hidden"], d_kv=c["hidden"] // c["heads"], d_ff=c["ff"],
                  num_layers=c["layers"], num_heads=c["heads"], feed_forward_proj="gated-gelu",
                  decoder_start_token_id=0)
        cls = tr.T5Config
    elif task == "llama":
        kw = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                  num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"], intermediate_size=c["ff"],
                  max_position_embeddings=c["seq"], bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = tr.LlamaConfig
    else:
        kw = dict(vocab_size=c["vocab"], n_embd=c["hidden"], n_layer=c["layers"], n_head=c["heads"],
                  n_inner=c["ff"], n_positions=c["seq"], bos_token_id=c["vocab"] - 1, eos_token_id=c["vocab"] - 1)
        cls = tr.GPT2Config
    return cls(**{**kw, **c.get("extra", {})})


def describe(c):
    """'roberta-base: vocab 50265, hidden 768, 12 layers, 12 heads, FF 3072, seq 128, batch 256'."""
    kv = f", {c['kv_heads']} KV heads" if c.get("kv_heads") else ""
    return (f"{c['name']}: vocab {c['vocab']}, hidden {c['hidden']}, {c['layers']} layers, {c['heads']} heads{kv}, "
            f"FF {c['ff']}, seq {c['seq']}, batch {c['batch']}")


def describe_dropout(c, rates):
    """'dropout 0 (every rate; as llm.c and nanoGPT pretrain)' or "dropout 0.1 (the config's)" for setup c."""
    if c.get("dropout") == "0":
        return "dropout 0 (every rate; as llm.c and nanoGPT pretrain)"
    shown = sorted(set(rates.values()))
    return f"dropout {'/'.join(f'{r:g}' for r in shown) or 'none'} (the config's)"
