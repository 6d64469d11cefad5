#!/usr/bin/env python
"""Muon and warmup-stable-decay against AdamW on the same tokens: a small Llama pretrained on Norwegian text for a
fixed budget of steps and rows, five ways, each at its best learning rate from a small sweep; the held-out loss
curves side by side and the steps each way takes to reach AdamW-cosine's final held-out loss. A table, never
asserted.

    python bench/optimizer_learning.py --work_dir /tmp/optimizer_learning   # CPU (2 shared cores)

1. Norwegian Bokmal running text: ../shared/data/no/ud_bokmaal_texts_train.txt to train on, ud_bokmaal_texts_dev.txt
   held out; a GPT-2 BPE of --vocab_size tokens (train_tokenizer.py) on the training text.
2. A Llama config (create_config.py --preset llama-tiny, --layers x --width, --block positions).
3. run_clm_flax.py from the same init (--seed), --steps steps of --batch rows of --block tokens, fp32, a held-out
   evaluation every --steps/--evals steps (and at step 0), --warmup_steps of warmup, for each way and each rate of
   its sweep (--adamw_rates, --muon_rates):
     adamw-linear   --optim adamw --lr_scheduler_type linear (the Flax examples' recipe, flaxlm's default)
     adamw-cosine   --optim adamw --lr_scheduler_type cosine
     adamw-wsd      --optim adamw --lr_scheduler_type warmup_stable_decay, the last --cooldown of the steps decaying
     muon-cosine    --optim muon --lr_scheduler_type cosine
     muon-wsd       --optim muon --lr_scheduler_type warmup_stable_decay
   Muon's update is scaled to AdamW's RMS (flaxlm.training.muon), so both sweep the same kind of rate.
4. Per way, the rate with the lowest final held-out loss; its curve; the first step (linearly between evaluations)
   where it reaches adamw-cosine's final loss, and that step over adamw-cosine's.
Every run's output goes to WORK_DIR/log.txt; finished runs in --work_dir are reused (delete it to start over).
"""
import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

from bench.adapt_vocabulary import run  # noqa: E402  -- a script as a subprocess, its output to the log
from bench.distill_learning import bokmaal_texts, finished, metrics  # noqa: E402

WAYS = {"adamw-linear": ("adamw", "linear"), "adamw-cosine": ("adamw", "cosine"),
        "adamw-wsd": ("adamw", "warmup_stable_decay"), "muon-cosine": ("muon", "cosine"),
        "muon-wsd": ("muon", "warmup_stable_decay")}


def heldout_curve(out_dir):
    """[(step, held-out loss)] of a run, step 0 first."""
    return [(r["step"], r["loss"]) for r in metrics(out_dir) if r.get("split") == "eval"]


def steps_to_reach(curve, target):
    """The first step at which the curve reaches `target` (linear between evaluations), or None."""
    for (s0, l0), (s1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return s1 if l0 == l1 else s0 + (s1 - s0) * (l0 - target) / (l0 - l1)
    return None


def tokenizer_and_config(w, train, a, log):
    """(WORK_DIR/tokenizer: a GPT-2 BPE of a.vocab_size tokens on train, WORK_DIR/config: a Llama of a.layers x a.width
    at a.block positions), each made once."""
    tok, cfg = os.path.join(w, "tokenizer"), os.path.join(w, "config")
    if not finished(tok, "tokenizer.json"):
        run("train_tokenizer.py", ["--type", "gpt2", "--train_file", train, "--vocab_size", str(a.vocab_size),
                                   "--model_max_length", str(a.block), "--output_dir", tok, "--overwrite_output_dir"],
            log)
    if not finished(cfg, "config.json"):
        heads = max(a.width // 32, 1)
        run("create_config.py", ["--preset", "llama-tiny", "--tokenizer_name", tok, "--set",
                                 f"num_hidden_layers={a.layers}", f"hidden_size={a.width}",
                                 f"num_attention_heads={heads}", f"num_key_value_heads={max(heads // 2, 1)}",
                                 f"intermediate_size={a.width * 11 // 4}", f"max_position_embeddings={a.block}",
                                 "--output_dir", cfg], log)
    return tok, cfg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/optimizer_learning")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--vocab_size", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--block", type=int, default=128, help="tokens a row")
    p.add_argument("--batch", type=int, default=16, help="rows a step")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--warmup_steps", type=int, default=30)
    p.add_argument("--cooldown", type=float, default=0.2, help="WSD: the share of the steps that decays")
    p.add_argument("--evals", type=int, default=12, help="held-out evaluations over the run")
    p.add_argument("--adamw_rates", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3, 1e-2])
    p.add_argument("--muon_rates", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    p.add_argument("--ways", nargs="+", default=list(WAYS), choices=list(WAYS))
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    w = os.path.abspath(a.work_dir)
    train, held = bokmaal_texts(w, a.data_dir)
    log = os.path.join(w, "log.txt")

    tok, cfg = tokenizer_and_config(w, train, a, log)

    cooldown = max(int(a.steps * a.cooldown), 1)
    curves = {}  # way -> {rate: curve}
    for way in a.ways:
        optim, schedule = WAYS[way]
        kwargs = ["--lr_scheduler_kwargs", json.dumps({"num_decay_steps": cooldown})] if "wsd" in way else []
        for rate in (a.muon_rates if optim == "muon" else a.adamw_rates):
            out = os.path.join(w, f"{way}-{rate:g}")
            if not finished(out):
                run("run_clm_flax.py", [
                    "--config_name", cfg, "--tokenizer_name", tok, "--output_dir", out, "--overwrite_output_dir",
                    "--train_file", train, "--validation_file", held, "--block_size", str(a.block),
                    "--train_batch_size", str(a.batch), "--max_steps", str(a.steps), "--learning_rate", str(rate),
                    "--warmup_steps", str(a.warmup_steps), "--optim", optim, "--lr_scheduler_type", schedule, *kwargs,
                    "--eval_steps", str(max(a.steps // a.evals, 1)), "--eval_at_start", "--logging_steps",
                    str(max(a.steps // a.evals, 1)), "--save_steps", "1000000", "--seed", str(a.seed),
                    "--dtype", "float32", "--report_to", "none"], log)
            curves.setdefault(way, {})[rate] = heldout_curve(out)

    best = {way: min(by_rate.items(), key=lambda kv: kv[1][-1][1]) for way, by_rate in curves.items()}
    target = best["adamw-cosine"][1][-1][1] if "adamw-cosine" in best else None
    print(f"\n{a.layers}x{a.width} Llama, {a.steps} steps of {a.batch} x {a.block} tokens "
          f"({a.steps * a.batch * a.block:,} tokens), warmup {a.warmup_steps}, WSD cooldown {cooldown} steps")
    print("| way | rates swept: final held-out loss | best rate | final held-out loss | steps to adamw-cosine's |")
    print("|---|---|---|---|---|")
    for way, (rate, curve) in best.items():
        sweep = ", ".join(f"{r:g}: {c[-1][1]:.4f}" for r, c in sorted(curves[way].items()))
        reach = None if target is None else steps_to_reach(curve, target)
        ratio = "" if reach is None or target is None else f" ({reach / a.steps:.2f}x)"
        print(f"| {way} | {sweep} | {rate:g} | {curve[-1][1]:.4f} | "
              f"{'not reached' if reach is None else f'{reach:.0f}'}{ratio} |")
    print("\nheld-out loss by step (each way at its best rate):")
    steps = [s for s, _ in next(iter(best.values()))[1]]
    print("| step | " + " | ".join(best) + " |")
    print("|---" * (len(best) + 1) + "|")
    for i, s in enumerate(steps):
        print(f"| {s} | " + " | ".join(f"{c[i][1]:.4f}" for _, c in best.values()) + " |")


if __name__ == "__main__":
    main()
