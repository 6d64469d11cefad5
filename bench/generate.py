#!/usr/bin/env python
"""Time greedy decoding (flaxlm.models.generation) against transformers' PyTorch generate, same weights and prompts.

    python bench/generate.py                       # the "small" GPT-2 shape, prompts of 50 and 500 tokens
    python bench/generate.py --batch 8 --new_tokens 128 --prompt_lengths 50 500 900
    taskset -c 0 python bench/generate.py          # both sides on one core

The "small" shape of bench/train_step.py as a GPT-2: vocab 8192, hidden 256, 4 layers, 4 heads, FF 1024,
n_positions 1024, random weights, fp32. For each prompt length P it generates new_tokens tokens after a
prompt of P random ids and reports the decode speed, i.e. tokens per second at positions P .. P + new_tokens,
so P 50 against P 500 shows whether the per-token cost stays flat (the cache: no recomputation of the prefix).
Ours: flaxlm.models.generation's decode-loop time (compiled beforehand, prefill excluded). transformers: the time of
generate(max_new_tokens=new_tokens) less that of generate(max_new_tokens=1) (the prefill and setup), over the
new_tokens - 1 tokens in between; the best of --repeats
(the machine may be shared). EOS is off on both sides. Ends with one JSON line.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from flaxlm.models.generation import generate  # noqa: E402
from flaxlm.models import load_pretrained  # noqa: E402

SMALL = dict(vocab_size=8192, n_embd=256, n_layer=4, n_head=4, n_inner=1024, n_positions=1024)


def hf_model_and_ours(tmp):
    """The same random GPT-2 twice: transformers' (torch, eval mode) and ours, loaded from its save_pretrained."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf_model = GPT2LMHeadModel(GPT2Config(**SMALL, bos_token_id=1, eos_token_id=2)).eval()
    hf_model.generation_config.eos_token_id = None  # never stop early: every run makes all new tokens
    hf_model.save_pretrained(tmp)
    return hf_model, load_pretrained(tmp)[1]


def ours(model, prompts, new_tokens, repeats):
    """(decode tokens/s, prefill seconds, the tokens) of flaxlm.models.generation, the best of the repeats."""
    runs = [generate(model, prompts, new_tokens) for _ in range(repeats + 1)][1:]  # the first one compiles
    return (float(np.max([r.decode_tokens_per_second for r in runs])),
            float(np.min([r.prefill_seconds for r in runs])), runs[0].tokens)


def transformers_generate(hf_model, prompts, new_tokens):
    ids = torch.tensor(prompts)
    with torch.no_grad():
        start = time.perf_counter()
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
        return time.perf_counter() - start, out[:, ids.shape[1]:].tolist()


def theirs(hf_model, prompts, new_tokens, repeats):
    """(decode tokens/s, prefill seconds, the tokens) of transformers' generate."""
    transformers_generate(hf_model, prompts, new_tokens)  # warm up
    full = [transformers_generate(hf_model, prompts, new_tokens) for _ in range(repeats)]
    first = [transformers_generate(hf_model, prompts, 1)[0] for _ in range(repeats)]
    decode_s = float(np.min([t for t, _ in full])) - float(np.min(first))
    return len(prompts) * (new_tokens - 1) / decode_s, float(np.min(first)), full[0][1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt_lengths", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--torch_threads", type=int, default=1,
                        help="torch's intra-op threads: one is fastest for matmuls this small (more spin-wait "
                             "badly on a busy machine: 40x slower here); use taskset to pin both sides")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); GPT-2 {SMALL}; batch {args.batch}, {args.new_tokens} new tokens",
          flush=True)
    rng = np.random.default_rng(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        hf_model, model = hf_model_and_ours(tmp)
        for length in args.prompt_lengths:
            prompts = rng.integers(3, SMALL["vocab_size"], (args.batch, length)).tolist()
            our_tps, our_prefill, our_tokens = ours(model, prompts, args.new_tokens, args.repeats)
            hf_tps, hf_prefill, hf_tokens = theirs(hf_model, prompts, args.new_tokens, args.repeats)
            row = {"prompt_length": length, "ours_tokens_per_s": round(our_tps, 1),
                   "transformers_tokens_per_s": round(hf_tps, 1), "speedup": round(our_tps / hf_tps, 2),
                   "ours_prefill_ms": round(1000 * our_prefill, 2),
                   "transformers_prefill_ms": round(1000 * hf_prefill, 2),
                   "same_tokens": our_tokens == hf_tokens}
            print(f"prompt {length:4d}: ours {our_tps:9.1f} tokens/s ({1000 * args.batch / our_tps:.3f} ms/step), "
                  f"transformers {hf_tps:8.1f} tokens/s ({1000 * args.batch / hf_tps:.3f} ms/step): "
                  f"x{our_tps / hf_tps:.1f}; prefill {1000 * our_prefill:.1f} ms vs {1000 * hf_prefill:.1f} ms; "
                  f"same greedy tokens: {row['same_tokens']}", flush=True)
            results.append(row)
    print(json.dumps({"bench": "generate", "model": "gpt2-small-shape", "batch": args.batch,
                      "new_tokens": args.new_tokens, "device": jax.devices()[0].platform,
                      "torch_threads": args.torch_threads, "results": results}))


if __name__ == "__main__":
    main()
