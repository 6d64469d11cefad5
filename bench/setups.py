"""What bench/run.py times: suites of model shapes per objective, their targets, their transformers configs.

Imports no JAX, so bench/torch_reference.py builds its PyTorch models from the very same configs.

cpu: the "small" shape of ../shared/bench/hf_reference.py (vocab 8192, hidden 256, 4 layers, 4 heads, FF 1024,
seq 128, batch 32, fp32) for every objective. tiny: a shape for tests. gpu: the issue's targets in bf16 --
roberta-base at seq 128, global batch 256; t5-v1_1-base at input 512 (target 114), batch 128; GPT-2 124M at
seq 1024, batch 32. T5 is span corruption with noise 0.15 and mean span 3 (seq is its input length); masked
LM masks 15%; every model trains with its config's dropout.
"""
from flaxlm.data.span_corruption import t5_lengths

OBJECTIVES = {"mlm": "masked LM (RoBERTa)", "t5": "span corruption (T5 v1.1)", "clm": "causal LM (GPT-2)"}
REFERENCE_TASK = {"mlm": "roberta-mlm", "t5": "t5-span", "clm": "gpt2-clm"}  # names in the references' JSON
NOISE_DENSITY, MEAN_SPAN = 0.15, 3.0

SMALL = dict(name="small", vocab=8192, hidden=256, layers=4, heads=4, ff=1024, seq=128, batch=32)
TINY = dict(name="tiny", vocab=512, hidden=32, layers=2, heads=2, ff=64, seq=32, batch=8)

# targets: mfu (at least), step_s (at most), ref_ratio (our tokens/s over the torch reference's, at least),
# memory_gib (peak device memory, at most). reference: hf = ../shared/bench/hf_reference.py, torch =
# bench/torch_reference.py
SUITES = {
    "cpu": dict(dtype="float32", steps=10, cpu_chunk_tokens=1024, reference="hf", tasks={t: SMALL for t in OBJECTIVES}),
    "tiny": dict(dtype="float32", steps=2, cpu_chunk_tokens=1024, reference="hf", tasks={t: TINY for t in OBJECTIVES}),
    "gpu": dict(dtype="bfloat16", steps=20, cpu_chunk_tokens=0, reference="torch", tasks={
        "mlm": dict(name="roberta-base", vocab=50265, hidden=768, layers=12, heads=12, ff=3072, seq=128,
                    batch=256, extra=dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5),
                    targets=dict(mfu=0.50, ref_ratio=1.5, memory_gib=16)),
        "t5": dict(name="t5-v1_1-base", vocab=32128, hidden=768, layers=12, heads=12, ff=2048, seq=512,
                   batch=128, extra=dict(tie_word_embeddings=False),
                   targets=dict(step_s=0.19, mfu=0.40, ref_ratio=1.5)),
        "clm": dict(name="gpt2 124M", vocab=50257, hidden=768, layers=12, heads=12, ff=3072, seq=1024,
                    batch=32, targets=dict(mfu=0.50, ref_ratio=1.5)),
    }),
}


def t5_target_length(inputs_length):
    """The span-corrupted target length for an input of inputs_length tokens (114 for 512)."""
    return t5_lengths(inputs_length, NOISE_DENSITY, MEAN_SPAN)[1]


def hf_config(task, c):
    """The transformers config of setup `c` for objective `task`."""
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
    else:
        kw = dict(vocab_size=c["vocab"], n_embd=c["hidden"], n_layer=c["layers"], n_head=c["heads"],
                  n_inner=c["ff"], n_positions=c["seq"], bos_token_id=c["vocab"] - 1, eos_token_id=c["vocab"] - 1)
        cls = tr.GPT2Config
    return cls(**{**kw, **c.get("extra", {})})


def describe(c):
    """'roberta-base: vocab 50265, hidden 768, 12 layers, 12 heads, FF 3072, seq 128, batch 256'."""
    return (f"{c['name']}: vocab {c['vocab']}, hidden {c['hidden']}, {c['layers']} layers, {c['heads']} heads, "
            f"FF {c['ff']}, seq {c['seq']}, batch {c['batch']}")
