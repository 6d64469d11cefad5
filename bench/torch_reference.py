#!/usr/bin/env python
"""transformers' PyTorch models trained on a setup of bench/setups.py: the other side of bench/run.py --suite gpu.

    python bench/torch_reference.py --suite gpu --task mlm               # RobertaForMaskedLM, bf16 autocast
    python bench/torch_reference.py --suite gpu --task t5 --compile      # T5ForConditionalGeneration, torch.compile
    python bench/torch_reference.py --suite gpu --task clm --steps 30    # GPT2LMHeadModel
    python bench/torch_reference.py --suite gpu --task llama --compile --batch 8 --dropout 0   # LlamaForCausalLM
    python bench/torch_reference.py --suite tiny --task mlm --device cpu --dtype float32   # a quick check

The model is built from the same transformers config as ours (bench/setups.hf_config; --dropout 0: every rate
0), in train mode, with AdamW (fused on CUDA; lr 1e-4, weight decay 0.01), the forward and loss under
torch.autocast(bfloat16) when --dtype bfloat16, random token ids: masked LM labels at 15% of the positions,
T5 targets of the span-corrupted length (114 for input 512), causal LM labels = inputs; transformers' default
attention (torch's scaled_dot_product_attention). Tokens counted per step: batch x input length, as
bench/run.py counts ours. Times --steps steps after three warm-up steps (torch.compile compiles in them), the
median; out of device memory, it halves the batch and tries again (--no-halve_on_oom: it reports the error).
Prints one line per measurement and a final JSON object {"hf-torch[-compile] <task>": tokens/s or "error: ..."},
as ../shared/bench/hf_reference.py does; without torch or without CUDA that entry is the error and the exit
code is still 0.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench.setups import REFERENCE_TASK, SUITES, hf_config, t5_target_length  # noqa: E402

MODEL_CLASS = {"mlm": "RobertaForMaskedLM", "t5": "T5ForConditionalGeneration", "clm": "GPT2LMHeadModel",
               "llama": "LlamaForCausalLM"}


def inputs(task, c, device):
    """The model's keyword arguments for one step: random ids and the task's labels (torch tensors)."""
    import torch
    rng = np.random.default_rng(0)
    ids_BL = rng.integers(5, c["vocab"] - 100, size=(c["batch"], c["seq"]))
    if task == "mlm":
        labels = np.where(rng.random(ids_BL.shape) < 0.15, ids_BL, -100)
    elif task == "t5":
        labels = rng.integers(5, c["vocab"] - 100, size=(c["batch"], t5_target_length(c["seq"])))
    else:
        labels = ids_BL
    return {"input_ids": torch.tensor(ids_BL, device=device), "labels": torch.tensor(labels, device=device)}


def time_steps(a, c):
    """(median step seconds, peak memory bytes or None) of a.steps train steps."""
    import torch
    import transformers as tr
    if a.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available to torch")
    torch.manual_seed(0)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()  # a try at a larger batch may have run out of memory before
    model = getattr(tr, MODEL_CLASS[a.task])(hf_config(a.task, c)).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=device.type == "cuda")
    forward = torch.compile(model) if a.compile else model
    kw = inputs(a.task, c, device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
            loss = forward(**kw).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return median_step(step, device, a.steps)


def median_step(step, device, steps):
    """(median seconds of `steps` calls of step() after 3 warm-up calls, peak CUDA bytes or None): each call
    waited for on a GPU."""
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        step()
    sync()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return float(np.median(times)), peak


def reference_args(description, argv=None):
    """The command line this script and bench/nanogpt_reference.py share, and the setup it names (the suite's,
    with --batch, --seq and --dropout applied)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), default="gpu")
    p.add_argument("--task", choices=sorted(REFERENCE_TASK), required=True)
    p.add_argument("--steps", type=int, default=20, help="timed steps after three warm-up steps")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16",
                   help="bfloat16: forward and loss under torch.autocast(bfloat16); parameters stay float32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--device", default="cuda", help="torch device (cuda; cpu for a quick check)")
    p.add_argument("--batch", type=int, help="rows per step (default: the suite's)")
    p.add_argument("--seq", type=int, help="tokens per row (default: the suite's)")
    p.add_argument("--dropout", choices=["config", "0"], default="config", help="the config's rates, or all 0")
    p.add_argument("--halve_on_oom", action=argparse.BooleanOptionalAction, default=True,
                   help="out of device memory: halve the batch and try again")
    a = p.parse_args(argv)
    c = {**SUITES[a.suite]["tasks"][a.task], "dropout": a.dropout}
    c.update({k: v for k, v in (("batch", a.batch), ("seq", a.seq)) if v})
    return a, c


def report(name, a, c, time_steps):
    """Run time_steps(a, c) -> (median step s, peak bytes or None), halving c's batch while it runs out of
    device memory (a.halve_on_oom); print a line and, last, the JSON {name: tokens/s or "error: ..."}."""
    import gc
    while True:
        try:
            step_s, peak = time_steps(a, c)
        except Exception as e:  # a reference that cannot run is a result too (no torch, no CUDA, out of memory)
            if "out of memory" in str(e).lower() and a.halve_on_oom and c["batch"] % 2 == 0:
                print(f"{name}: out of memory at batch {c['batch']}; trying {c['batch'] // 2}", flush=True)
                c = {**c, "batch": c["batch"] // 2}
                gc.collect()
                _empty_cache()
                continue
            result = f"error: {type(e).__name__}: {str(e)[:200]}"
            print(f"{name}: {result}", flush=True)
        else:
            result = round(c["batch"] * c["seq"] / step_s)
            memory = f", peak memory {peak / 2 ** 30:.2f} GiB" if peak else ""
            print(f"{name}: {result:,} tokens/s (median step {1000 * step_s:.1f} ms over {a.steps}, batch "
                  f"{c['batch']}, {a.dtype}{', torch.compile' if a.compile else ''}{memory})", flush=True)
        break
    print(json.dumps({name: result}))


def _empty_cache():
    try:
        import torch
        torch.cuda.empty_cache()
    except Exception:  # no torch or no CUDA: nothing held
        pass


def main():
    a, c = reference_args(__doc__)
    report(f"hf-torch{'-compile' if a.compile else ''} {REFERENCE_TASK[a.task]}", a, c, time_steps)


if __name__ == "__main__":
    main()
