#!/usr/bin/env python
"""How fast a GRPO run samples its completions, against transformers' generate on the same checkpoint, and what share
of a GRPO step generation takes.

    python bench/grpo_generation.py                          # 8 prompts x 8 completions of 128 tokens, prompts of 64
    python bench/grpo_generation.py --prompts 4 --new_tokens 64 --steps 3

The checkpoint: bench/generate.py's "small" GPT-2 shape (hidden 256, 4 layers, 4 heads, FF 1024, random weights,
fp32) with a byte-level BPE tokenizer trained here on the demo corpus (its vocabulary the model's), saved by
transformers. The prompts: the corpus's first lines, cut to --prompt_length tokens. One round: every prompt
--generations times, sampled at temperature 1 (TRL's default) for --new_tokens tokens, EOS off on both sides so every
completion has them all.

  ours          flaxlm.rl.sampling.Sampler, what run_grpo.py samples a round with (prefill + the decode loop, compiled
                beforehand), the best of --repeats rounds
  transformers  model.generate(do_sample=True, num_return_sequences=generations), what TRL's GRPOTrainer calls
                without vLLM, the best of --repeats
  GRPO step     run_grpo.py on the same checkpoint and prompts (the length reward; one device), --steps steps: the
                step time and generation_share from its metrics.jsonl (steps after the first, which compiles)

Completion tokens a second = completions x new_tokens / the round's seconds. Ends with one JSON line.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import numpy as np  # noqa: E402

SMALL = dict(n_embd=256, n_layer=4, n_head=4, n_inner=1024, n_positions=1024)


def checkpoint(where):
    """A random GPT-2 of the small shape and its tokenizer, saved in `where`; returns (the torch model, prompt texts)."""
    import torch
    import train_tokenizer
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel
    from flaxlm.data.demo_corpus import write_demo_corpus
    corpus = write_demo_corpus(os.path.join(where, "corpus"))["train"]
    train_tokenizer.main(["--type", "gpt2", "--train_file", corpus, "--vocab_size", "8192", "--output_dir", where])
    tok = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**SMALL, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                       eos_token_id=tok.eos_token_id, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0)).eval()
    model.save_pretrained(where)
    with open(corpus, encoding="utf-8") as f:
        lines = [line.strip() for line in f if len(line.split()) > 30]
    return model, tok, lines


def ours(where, prompt_ids, generations, new_tokens, repeats):
    """Completion tokens a second of flaxlm's sampler (the best round after the compiling one)."""
    import jax
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.models.generation import left_pad
    from flaxlm.rl.sampling import Sampler
    from flaxlm.training.mesh import make_mesh, replicated
    mesh = make_mesh()
    graphdef, params = split_model(load_pretrained(where)[1])
    params = jax.device_put(params, replicated(mesh))
    ids, mask = left_pad([p for p in prompt_ids for _ in range(generations)], len(prompt_ids[0]), 0)
    sampler = Sampler(graphdef, mesh, max_new_tokens=new_tokens, eos_id=None, pad_id=0, temperature=1.0)
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        out = sampler(params, ids, mask, jax.random.key(r))
        times.append(time.perf_counter() - start)
    assert out.shape == (len(ids), new_tokens)
    return len(ids) * new_tokens / min(times[1:])


def transformers_generate(model, prompt_ids, generations, new_tokens, repeats):
    """Completion tokens a second of transformers' sampling generate (the best of the repeats)."""
    import torch
    ids = torch.tensor(prompt_ids)
    times = []
    with torch.no_grad():
        for r in range(repeats):
            torch.manual_seed(r)
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, num_return_sequences=generations, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, pad_token_id=0)
            times.append(time.perf_counter() - start)
    assert out.shape == (len(prompt_ids) * generations, ids.shape[1] + new_tokens)
    return len(prompt_ids) * generations * new_tokens / min(times)


def grpo_steps(where, texts, a):
    """(median step ms, mean generation share) of run_grpo.py's steps after the first."""
    import run_grpo
    data = os.path.join(where, "prompts.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": t}) + "\n" for t in texts)
    out = os.path.join(where, "grpo")
    run_grpo.main(["--output_dir", out, "--model_name_or_path", where, "--train_file", data,
                   "--validation_split_percentage", "0", "--do_eval", "false", "--reward_funcs", "length",
                   "--soft_punish_cache", str(a.new_tokens // 4), "--num_generations", str(a.generations),
                   "--max_prompt_length", str(a.prompt_length), "--max_completion_length", str(a.new_tokens),
                   "--per_device_train_batch_size", str(a.prompts * a.generations), "--max_steps", str(a.steps),
                   "--logging_steps", "1", "--learning_rate", "1e-5", "--report_to", "none", "--save_steps", "1000"])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8")]
    timed = [r for r in rows if r.get("split") == "train" and "step_ms" in r]
    return float(np.median([r["step_ms"] for r in timed])), float(np.mean([r["generation_share"] for r in timed]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--prompt_length", type=int, default=64)
    p.add_argument("--new_tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args()
    where = tempfile.mkdtemp(prefix="grpo-generation-")
    model, tok, lines = checkpoint(where)
    texts, prompt_ids = [], []
    for line in lines:
        ids = tok(line)["input_ids"]
        if len(ids) >= a.prompt_length:
            texts.append(tok.decode(ids[:a.prompt_length]))
            prompt_ids.append(ids[:a.prompt_length])
    batch = prompt_ids[:a.prompts]
    print(f"{len(batch)} prompts of {a.prompt_length} tokens x {a.generations} completions of {a.new_tokens} tokens, "
          f"vocabulary {len(tok)}", flush=True)
    figures = {"ours_tokens_per_s": ours(where, batch, a.generations, a.new_tokens, a.repeats),
               "transformers_tokens_per_s": transformers_generate(model, batch, a.generations, a.new_tokens,
                                                                  a.repeats)}
    figures["ratio"] = figures["ours_tokens_per_s"] / figures["transformers_tokens_per_s"]
    print(f"completion tokens/s: ours {figures['ours_tokens_per_s']:.0f}, transformers generate "
          f"{figures['transformers_tokens_per_s']:.0f} ({figures['ratio']:.2f}x)", flush=True)
    # the run re-tokenizes the texts: prompts of about prompt_length tokens (a decoded cut may re-encode a little longer)
    step_ms, share = grpo_steps(where, texts[:max(a.prompts * 4, 16)], a)
    figures.update(grpo_step_ms=step_ms, generation_share=share)
    print(f"GRPO step: {step_ms:.0f} ms, generation {share:.0%} of it, training and scoring the rest", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
