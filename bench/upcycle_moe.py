#!/usr/bin/env python
"""Issue 59's upcycling measurement: a small dense Qwen3 pretrained on Norwegian, upcycled into a Qwen3-MoE
(upcycle_moe.py), then the dense model and the mixture continued for the same steps on the same tokens, end to end
with the project's own scripts (each run as a subprocess, as a user runs it).

    python bench/upcycle_moe.py --work_dir /tmp/upcycle-bench --json /tmp/upcycle-bench/result.json
    python bench/upcycle_moe.py --pretrain_steps 600 --steps 300 --num_experts 16 --num_experts_per_tok 4

1. a byte-level BPE tokenizer (train_tokenizer.py) on --tokenizer_file (UD Bokmaal texts);
2. a dense model of Qwen3-0.6B's shape scaled down (create_config.py --preset qwen3-0.6b: tied head, q/k norms,
   head_dim twice width / heads, MLP 3 x width, half as many key-value heads; here --width, --layers)
   pretrained --pretrain_steps steps on --train_file (NoReC) with run_clm_flax.py;
3. upcycle_moe.py: every MLP copied into --num_experts experts, --num_experts_per_tok per token;
4. the dense model and the mixture each continued --steps steps (run_clm_flax.py --model_name_or_path, a fresh
   optimizer for both, same seed: the same batches in the same order, same learning rate and schedule), the loss
   of every step logged and the eval loss on --eval_file (UD Bokmaal dev texts) at step 0 and at the end.

At step 0 the two compute the same function: their eval losses and their first batch's training loss agree (to
float32 rounding). Prints the step-0 losses, the training-loss curves side by side (means over --window steps) and
the final eval losses; with --json writes them. Steps already done in --work_dir are reused.

On XLA:CPU the experts' grouped matmuls (jax.lax.ragged_dot) are slow: a step of the mixture takes ~2 s at the
default --batch_size against ~0.25 s for the dense model; the defaults ran in 10 minutes on the shared 2-core
development CPU.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.adapt_vocabulary import done, eval_losses, run  # noqa: E402  -- scripts as subprocesses, logged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


def train_losses(out_dir):
    """{step: training loss} from OUTPUT_DIR/metrics.jsonl (with --logging_steps 1, each step's batch)."""
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {int(r["step"]): float(r["loss"]) for r in map(json.loads, f)
                if r.get("split") == "train" and "loss" in r}


def shape_overrides(a):
    """Qwen3-0.6B's proportions (width 1024, 16 heads of 128, 8 key-value heads, MLP 3072) at --width, --layers."""
    heads = max(4, a.width // 64)
    return [f"hidden_size={a.width}", f"num_hidden_layers={a.layers}", f"num_attention_heads={heads}",
            f"num_key_value_heads={heads // 2}", f"head_dim={2 * a.width // heads}",
            f"intermediate_size={3 * a.width}", f"max_position_embeddings={max(512, a.seq_len)}",
            f"max_window_layers={a.layers}"]


def train_args(a, out, steps, lr, warmup, seed, batch_size):
    return ["--output_dir", out, "--train_file", a.train_file, "--validation_file", a.eval_file,
            "--max_seq_length", str(a.seq_len), "--train_batch_size", str(batch_size),
            "--eval_batch_size", str(a.batch_size), "--max_eval_samples", str(a.max_eval_samples),
            "--max_steps", str(steps), "--learning_rate", str(lr), "--warmup_steps", str(warmup),
            "--weight_decay", "0.01", "--seed", str(seed), "--eval_steps", str(steps), "--save_steps", str(steps),
            "--save_total_limit", "1", "--cache_dir", os.path.join(a.work_dir, "cache"), "--overwrite_output_dir"]


def side_by_side(dense, moe, steps, window):
    """[(first step, last step, dense mean loss, moe mean loss)] over windows of `window` steps."""
    rows = []
    for start in range(1, steps + 1, window):
        span = [s for s in range(start, min(start + window, steps + 1)) if s in dense and s in moe]
        if span:
            rows.append((span[0], span[-1], sum(dense[s] for s in span) / len(span),
                         sum(moe[s] for s in span) / len(span)))
    return rows


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/flaxlm-upcycle-bench")
    p.add_argument("--json", default=None, help="write the figures here as JSON")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab_size", type=int, default=4000)
    p.add_argument("--pretrain_steps", type=int, default=200, help="dense pretraining steps before upcycling")
    p.add_argument("--steps", type=int, default=80, help="steps each of the dense and the upcycled model continue")
    p.add_argument("--num_experts", type=int, default=8)
    p.add_argument("--num_experts_per_tok", type=int, default=2)
    p.add_argument("--pretrain_batch_size", type=int, default=16)
    p.add_argument("--batch_size", type=int, default=8, help="of both continued runs (XLA:CPU runs the experts' "
                                                             "grouped matmuls slowly: ~1.8 s a layer at 2048 tokens)")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--max_eval_samples", type=int, default=64, help="eval rows (of --seq_len tokens)")
    p.add_argument("--pretrain_lr", type=float, default=2e-3)
    p.add_argument("--lr", type=float, default=5e-4, help="learning rate of both continued runs")
    p.add_argument("--warmup_steps", type=int, default=10, help="of the continued runs")
    p.add_argument("--window", type=int, default=10, help="steps per row of the loss table")
    p.add_argument("--seed", type=int, default=0, help="the pretraining's; the continued runs use seed + 1")
    p.add_argument("--tokenizer_file", default=os.path.join(DATA, "no", "ud_bokmaal_texts_train.txt"))
    p.add_argument("--train_file", default=os.path.join(DATA, "no", "norec_dev.txt"))
    p.add_argument("--eval_file", default=os.path.join(DATA, "no", "ud_bokmaal_texts_dev.txt"))
    a = p.parse_args(argv)
    a.work_dir = os.path.abspath(a.work_dir)
    return a


def prepare(a, log):
    """Steps 1-3: (dense pretrained model dir, upcycled model dir), each made once."""
    w = a.work_dir
    dense_init = os.path.join(w, "qwen3-init")
    if not done(dense_init, "tokenizer.json"):
        run("train_tokenizer.py", ["--type", "bpe", "--vocab_size", str(a.vocab_size), "--train_file",
                                   a.tokenizer_file, "--output_dir", dense_init, "--overwrite_output_dir"], log)
    if not done(dense_init):
        run("create_config.py", ["--preset", "qwen3-0.6b", "--output_dir", dense_init, "--set",
                                 *shape_overrides(a)], log)
    dense = os.path.join(w, "qwen3-pretrained")
    if not done(dense):
        run("run_clm_flax.py", ["--config_name", dense_init, "--tokenizer_name", dense_init, "--logging_steps", "50",
                                *train_args(a, dense, a.pretrain_steps, a.pretrain_lr, a.pretrain_steps // 10,
                                            a.seed, a.pretrain_batch_size)], log)
    moe = os.path.join(w, f"qwen3-moe-{a.num_experts}x{a.num_experts_per_tok}-init")
    if not done(moe):
        run("upcycle_moe.py", ["--model_name_or_path", dense, "--output_dir", moe, "--num_experts",
                               str(a.num_experts), "--num_experts_per_tok", str(a.num_experts_per_tok),
                               "--seed", str(a.seed)], log)
    return dense, moe


def main(argv=None):
    a = parse(argv)
    os.makedirs(a.work_dir, exist_ok=True)
    log = os.path.join(a.work_dir, "log.txt")
    print(f"work dir {a.work_dir} (script output in {log})", flush=True)
    t_start, seconds, results = time.time(), {}, {}
    dense, moe = prepare(a, log)
    for name, start in (("dense", dense), ("moe", moe)):
        out = os.path.join(a.work_dir, f"continued-{name}")
        if not done(out, "metrics.jsonl") or a.steps not in eval_losses(out):
            flags = train_args(a, out, a.steps, a.lr, a.warmup_steps, a.seed + 1, a.batch_size)
            seconds[name] = run("run_clm_flax.py", ["--model_name_or_path", start, "--logging_steps", "1",
                                                    "--eval_at_start", *flags], log)
        results[name] = {"eval": eval_losses(out), "train": train_losses(out)}
    d, m = results["dense"], results["moe"]
    table = side_by_side(d["train"], m["train"], a.steps, a.window)
    figures = {"width": a.width, "layers": a.layers, "vocab_size": a.vocab_size, "pretrain_steps": a.pretrain_steps,
               "steps": a.steps, "num_experts": a.num_experts, "num_experts_per_tok": a.num_experts_per_tok,
               "pretrain_batch_size": a.pretrain_batch_size, "batch_size": a.batch_size, "seq_len": a.seq_len,
               "lr": a.lr,
               "eval_step0": {"dense": d["eval"].get(0), "moe": m["eval"].get(0)},
               "train_step1": {"dense": d["train"].get(1), "moe": m["train"].get(1)},
               f"eval_step{a.steps}": {"dense": d["eval"].get(a.steps), "moe": m["eval"].get(a.steps)},
               "train_windows": table, "run_seconds": {k: round(v, 1) for k, v in seconds.items()},
               "total_seconds": round(time.time() - t_start, 1)}
    print(f"\nqwen3 width {a.width} x {a.layers} layers, pretrained {a.pretrain_steps} steps of "
          f"{a.pretrain_batch_size} x {a.seq_len} tokens; upcycled to "
          f"{a.num_experts} experts, {a.num_experts_per_tok} per token; both continued {a.steps} steps "
          f"(batch {a.batch_size} x {a.seq_len}, lr {a.lr}, same batches)")
    print(f"step 0: eval loss dense {d['eval'].get(0):.6f} moe {m['eval'].get(0):.6f}; first batch's training loss "
          f"dense {d['train'].get(1):.6f} moe {m['train'].get(1):.6f}")
    print(f"{'steps':>9s} {'dense':>8s} {'moe':>8s} {'moe-dense':>10s}")
    for first, last, dl, ml in table:
        print(f"{f'{first}-{last}':>9s} {dl:8.4f} {ml:8.4f} {ml - dl:+10.4f}")
    print(f"eval loss after {a.steps} steps: dense {d['eval'].get(a.steps):.4f} moe {m['eval'].get(a.steps):.4f}")
    print(f"continued runs: {figures['run_seconds']} s; total {figures['total_seconds']:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=2)
        print(f"wrote {a.json}")
    return figures


if __name__ == "__main__":
    main()
