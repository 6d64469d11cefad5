#!/usr/bin/env python
"""Time flaxlm's train step on the "small" config of ../shared/bench/hf_reference.py.

    python bench/train_step.py --task mlm --config small
    python bench/train_step.py --task t5 --config small --reference /tmp/hfref/bin/python
    python bench/train_step.py --task clm --config small --reference /tmp/hfref/bin/python

Same setup as the reference: vocab 8192, hidden 256, 4 layers, 4 heads, FF 1024, seq 128, batch 32,
fp32, AdamW, random token ids; tokens counted as batch * seq (T5: input tokens). mlm: RoBERTa, 15%
masking. t5: T5 v1.1 (gated GELU), 4+4 layers, span corruption with noise 0.15 and mean span 3, so
input 128 and target 29 (the reference feeds a target of 26, a little less work than ours). clm: GPT-2
(gelu_new, tied head, dropout 0.1 as the reference's), next-token loss over every position. The step
is the real one from flaxlm.train_loop (masking / span corruption on the host included). With --reference PYTHON, hf_reference.py runs
in the same command (that interpreter needs transformers<5, torch, jax, flax: see its docstring) and
the ratios are printed. Ends with one JSON line.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from flaxlm import mesh as meshlib  # noqa: E402
from flaxlm.clm import clm_objective  # noqa: E402
from flaxlm.flops import device_peak_flops  # noqa: E402
from flaxlm.mlm import mlm_objective  # noqa: E402
from flaxlm.mlm_masking import MLMMasker  # noqa: E402
from flaxlm.models import create_model, split_model  # noqa: E402
from flaxlm.span_corruption import SpanCorruptor  # noqa: E402
from flaxlm.span_lm import span_objective  # noqa: E402
from flaxlm.train_loop import cpu_chunks, make_train_step  # noqa: E402

CONFIGS = {
    "small": dict(vocab=8192, hidden=256, layers=4, heads=4, ff=1024, seq=128, batch=32),
    "tiny": dict(vocab=1024, hidden=64, layers=2, heads=2, ff=256, seq=64, batch=8),
}
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench", "hf_reference.py")


def mlm_setup(c, dtype):
    from transformers import RobertaConfig
    config = RobertaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                           num_attention_heads=c["heads"], intermediate_size=c["ff"],
                           max_position_embeddings=c["seq"] + 2)
    graphdef, params = split_model(create_model(config, dtype=dtype, seed=0))
    masker = MLMMasker(seq_len=c["seq"], vocab_size=c["vocab"], mask_token_id=4, pad_token_id=1,
                       special_token_ids=[0, 1, 2, 3, 4], mlm_probability=0.15)
    return params, mlm_objective(graphdef, config, masker, c["seq"]), c["seq"]


def t5_setup(c, dtype):
    from transformers import T5Config
    config = T5Config(vocab_size=c["vocab"], d_model=c["hidden"], d_kv=c["hidden"] // c["heads"], d_ff=c["ff"],
                      num_layers=c["layers"], num_heads=c["heads"], feed_forward_proj="gated-gelu",
                      decoder_start_token_id=0)
    graphdef, params = split_model(create_model(config, dtype=dtype, seed=0))
    corruptor = SpanCorruptor(inputs_length=c["seq"], noise_density=0.15, mean_noise_span_length=3.0,
                              eos_token_id=1, pad_token_id=0, first_sentinel_id=c["vocab"] - 1)
    return params, span_objective(graphdef, config, corruptor), corruptor.raw_length


def clm_setup(c, dtype):
    from transformers import GPT2Config
    config = GPT2Config(vocab_size=c["vocab"], n_embd=c["hidden"], n_layer=c["layers"], n_head=c["heads"],
                        n_inner=c["ff"], n_positions=c["seq"])
    graphdef, params = split_model(create_model(config, dtype=dtype, seed=0))
    return params, clm_objective(graphdef, config, params, c["seq"], pad_id=0), c["seq"]


SETUPS = {"mlm": mlm_setup, "t5": t5_setup, "clm": clm_setup}


def time_steps(c, task, dtype, steps):
    params, objective, row_len = SETUPS[task](c, dtype)
    mesh = meshlib.make_mesh()
    repl, data = meshlib.replicated(mesh), meshlib.batch_sharding(mesh)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    state = jax.device_put({"step": np.int32(0), "params": params, "opt_state": tx.init(params)}, repl)
    # as the training loop does: on CPU each device's batch goes through the model in chunks of >= 1024 tokens
    chunks = cpu_chunks(c["batch"] // mesh.size, objective.tokens_per_example, 1024)
    if chunks > 1:
        data = meshlib.batch_sharding(mesh, leading_axes=1)
    step = jax.jit(make_train_step(objective.loss_sums, tx, chunks), in_shardings=(repl, data, repl),
                   out_shardings=(repl, repl), donate_argnums=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, c["vocab"] - 100, size=(c["batch"], row_len)).astype(np.int32)
    key = jax.random.PRNGKey(0)

    def one(i):
        nonlocal state
        batch = objective.collate(ids, np.random.default_rng(i))
        if chunks > 1:
            batch = {k: v.reshape(chunks, -1, *v.shape[1:]) for k, v in batch.items()}
        batch = meshlib.to_device_batch(batch, data)
        state, metrics = step(state, batch, jax.random.fold_in(key, i))
        return metrics

    jax.block_until_ready(one(0)); jax.block_until_ready(one(1))  # compile, warm up
    times = []
    for i in range(steps):
        t = time.perf_counter()
        jax.block_until_ready(one(i + 2))
        times.append(time.perf_counter() - t)
    step_s = float(np.median(times))
    tokens = c["batch"] * c["seq"]
    peak, source = device_peak_flops(dtype)
    flops = objective.flops_per_example * c["batch"]
    return {"tokens_per_s": round(tokens / step_s), "step_ms": round(1000 * step_s, 2),
            "mfu": round(flops / step_s / peak, 4) if peak else None, "peak_flops": peak, "peak_source": source}


def run_reference(python, task, c, steps):
    ref_task = {"mlm": "roberta-mlm", "t5": "t5-span", "clm": "gpt2-clm"}[task]
    cmd = [python, REFERENCE, "--task", ref_task, "--steps", str(steps), "--batch", str(c["batch"]),
           "--seq", str(c["seq"]), "--vocab", str(c["vocab"]), "--hidden", str(c["hidden"]),
           "--layers", str(c["layers"]), "--heads", str(c["heads"]), "--ff", str(c["ff"])]
    out = subprocess.run(cmd, capture_output=True, text=True)
    print(out.stdout.strip(), flush=True)
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return {}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=sorted(SETUPS), default="mlm")
    p.add_argument("--config", choices=sorted(CONFIGS), default="small")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--steps", type=int, default=10, help="timed steps after two warm-up steps")
    p.add_argument("--reference", metavar="PYTHON", help="interpreter to run hf_reference.py with, in this run")
    p.add_argument("--rounds", type=int, default=1, help="alternate ours and the reference this many times")
    a = p.parse_args()
    c = CONFIGS[a.config]
    result = {"task": a.task, "config": a.config, "dtype": a.dtype, "device": jax.devices()[0].device_kind,
              "devices": jax.device_count()}
    ours, refs = [], []
    for _ in range(a.rounds):
        ours.append(time_steps(c, a.task, a.dtype, a.steps))
        print(f"flaxlm {a.task}: {ours[-1]['tokens_per_s']:,} tokens/s, step {ours[-1]['step_ms']} ms, "
              f"MFU {ours[-1]['mfu']}", flush=True)
        if a.reference:
            refs.append(run_reference(a.reference, a.task, c, a.steps))
    best = max(ours, key=lambda r: r["tokens_per_s"])
    result.update(best)
    if refs:
        for name in sorted(refs[0]):
            vals = [r.get(name) for r in refs if isinstance(r.get(name), (int, float))]
            if vals:
                ref = max(vals)
                result[f"ratio_vs {name}"] = round(best["tokens_per_s"] / ref, 3)
                result[f"ref {name}"] = ref
                print(f"ratio vs {name}: {best['tokens_per_s'] / ref:.2f}x ({ref:,} tokens/s)", flush=True)
            else:
                result[f"ref {name}"] = refs[0][name]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
