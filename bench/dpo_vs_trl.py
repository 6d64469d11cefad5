#!/usr/bin/env python
"""run_dpo.py against TRL's DPOTrainer (PyTorch) on the same small SFT'd checkpoint, pairs and hyperparameters; and
the train-step time of a DPO step against a run_clm_flax.py step of the same tokens.

    python bench/dpo_vs_trl.py --work_dir /tmp/sft-vs-trl          # after bench/sft_vs_trl.py in the same work dir

The checkpoint is bench/sft_vs_trl.py's full SFT export (a small GPT-2 taught NorQuAD's questions in ChatML); the
pairs are bench/norquad_chat.py's (a NorQuAD prompt, the gold answer chosen, a wrong span of the same passage
rejected): the first --train_pairs of the training articles, and --heldout_pairs of the held-out ones. sigmoid DPO,
beta 0.1, AdamW with linear decay, no warmup, clipping at 1.0, the same batch and max_length, dropout off (TRL
disables it; the start's config.json says 0 for ours), fp32. TRL holds a live reference model (a copy of the start);
ours computes the reference's log-probabilities once before training. The data order is each trainer's own.
Prints the loss and rewards/accuracies every --logging_steps side by side, and the held-out pairs' reward accuracy
and margin after training (both the mean over equal held-out batches, as TRL averages them). Then our median step
time of a DPO step (two rows, chosen and rejected, per pair) against run_clm_flax.py on as many rows of text: short
runs of each in turn --rounds times.
"""
import argparse
import json
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

from bench.adapt_vocabulary import median_step_ms, run  # noqa: E402


def start_checkpoint(w):
    """bench/sft_vs_trl.py's full SFT export with dropout set to 0 (a copy)."""
    import shutil
    sft, start = os.path.join(w, "runs", "ours-full-0"), os.path.join(w, "dpo-start")
    if not os.path.exists(os.path.join(sft, "config.json")):
        raise SystemExit(f"{sft} is missing: run bench/sft_vs_trl.py --work_dir {w} first")
    if not os.path.exists(os.path.join(start, "config.json")):
        shutil.copytree(sft, start, ignore=shutil.ignore_patterns("checkpoints", "*.jsonl", "*.png", "README.md"))
        with open(os.path.join(start, "config.json")) as f:
            config = json.load(f)
        config.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        with open(os.path.join(start, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    return start


def pairs(a, w):
    out = {}
    for split, n in (("train", a.train_pairs), ("test", a.heldout_pairs)):
        path = os.path.join(w, f"dpo_{split}.jsonl")
        with open(os.path.join(w, "norquad-chat", f"dpo_{split}.jsonl"), encoding="utf-8") as f:
            records = [line for line in f][:n]
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(records)
        out[split] = path
    return out["train"], out["test"]


def ours(a, w, start, files, log):
    out = os.path.join(w, "runs", f"dpo-ours-{a.seed}")
    if not os.path.exists(os.path.join(out, "config.json")):
        run("run_dpo.py", ["--model_name_or_path", start, "--output_dir", out, "--train_file", files[0],
                           "--validation_file", files[1], "--max_length", str(a.max_length), "--beta", str(a.beta),
                           "--train_batch_size", str(a.batch), "--per_device_eval_batch_size", str(a.eval_batch),
                           "--learning_rate", str(a.learning_rate), "--num_train_epochs", "1", "--warmup_steps", "0",
                           "--weight_decay", "0", "--max_grad_norm", "1.0", "--logging_steps", str(a.logging_steps),
                           "--eval_steps", "100000", "--save_steps", "100000", "--do_eval", "--seed", str(a.seed),
                           "--dtype", "float32", "--report_to", "none", "--overwrite_output_dir"], log)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    train = [r for r in rows if r.get("split") == "train" and "loss" in r]
    final = [r for r in rows if r.get("split") == "eval"][-1]
    return {"train": [(r["step"], r["loss"], r["rewards/accuracies"]) for r in train],
            "heldout": {k: final[k] for k in ("loss", "rewards/accuracies", "rewards/margins")},
            "step_ms": statistics.median(r["step_ms"] for r in train[1:])}


def theirs(a, w, start, files):
    path = os.path.join(w, "runs", f"dpo-trl-{a.seed}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer
    data = load_dataset("json", data_files={"train": files[0], "test": files[1]})
    args = DPOConfig(output_dir=os.path.join(w, "trl-tmp"), report_to=[], use_cpu=True, bf16=False, seed=a.seed,
                     beta=a.beta, loss_type=["sigmoid"], max_length=a.max_length,
                     per_device_train_batch_size=a.batch, per_device_eval_batch_size=a.eval_batch,
                     learning_rate=a.learning_rate, num_train_epochs=1, lr_scheduler_type="linear", warmup_steps=0,
                     weight_decay=0.0, max_grad_norm=1.0, logging_steps=a.logging_steps, save_strategy="no",
                     eval_strategy="no", dataloader_num_workers=0)
    model = AutoModelForCausalLM.from_pretrained(start, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(start, trust_remote_code=False)
    trainer = DPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=data["train"],
                         eval_dataset=data["test"])
    trainer.train()
    train = [(h["step"], h["loss"], h["rewards/accuracies"]) for h in trainer.state.log_history if "loss" in h]
    final = trainer.evaluate()
    figures = {"train": train, "heldout": {"loss": final["eval_loss"],
                                           "rewards/accuracies": final["eval_rewards/accuracies"],
                                           "rewards/margins": final["eval_rewards/margins"]}}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(figures, f)
    return figures


def step_times(a, w, start, files, log):
    """{"dpo", "clm"}: median step ms of run_dpo.py (--batch pairs: 2 x batch rows of max_length) and of run_clm_flax.py
    on 2 x batch rows of max_length of text, each run for 4 logging windows, in turn --rounds times."""
    wiki = os.path.join(a.data_dir, "no", "nbailab_wiki_no_100k.txt")
    common = ["--model_name_or_path", start, "--max_steps", str(4 * a.logging_steps), "--logging_steps",
              str(a.logging_steps), "--save_steps", "100000", "--dtype", "float32", "--report_to", "none",
              "--overwrite_output_dir"]
    kinds = {"dpo": ("run_dpo.py", ["--train_file", files[0], "--validation_file", files[1], "--max_length",
                                    str(a.max_length), "--train_batch_size", str(a.batch)]),
             "dpo-clm": ("run_clm_flax.py", ["--train_file", wiki, "--block_size", str(a.max_length),
                                         "--train_batch_size", str(2 * a.batch)])}
    ms = median_step_ms(kinds, common, a.rounds, os.path.join(w, "runs"), log)
    return {"dpo": ms["dpo"], "clm": ms["dpo-clm"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/flaxlm-sft-vs-trl")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--train_pairs", type=int, default=800)
    p.add_argument("--heldout_pairs", type=int, default=360)
    p.add_argument("--max_length", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--eval_batch", type=int, default=40, help="divides --heldout_pairs: equal batches")
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--logging_steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2, help="step times: each kind of run this many times in turn")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    w = os.path.abspath(a.work_dir)
    log = os.path.join(w, "log.txt")
    start = start_checkpoint(w)
    files = pairs(a, w)
    o, t = ours(a, w, start, files, log), theirs(a, w, start, files)
    print(f"sigmoid DPO, beta {a.beta}, lr {a.learning_rate}, batch {a.batch} pairs, {a.train_pairs} pairs\n"
          f"| step | loss: run_dpo.py | TRL DPOTrainer | rewards/accuracies: run_dpo.py | TRL |\n|---|---|---|---|---|")
    theirs_at = {s: (loss, acc) for s, loss, acc in t["train"]}
    for step, loss, acc in o["train"]:
        tl, ta = theirs_at.get(step, (float("nan"), float("nan")))
        print(f"| {step} | {loss:.4f} | {tl:.4f} | {acc:.3f} | {ta:.3f} |")
    print(f"held-out pairs ({a.heldout_pairs}): " + ", ".join(
        f"{k} ours {o['heldout'][k]:.4f} TRL {t['heldout'][k]:.4f}" for k in o["heldout"]))
    ms = step_times(a, w, start, files, log)
    print(f"step time (ms, median over {a.rounds} rounds in turn, fp32): run_dpo.py {ms['dpo']:.1f} ({a.batch} pairs "
          f"of {a.max_length}), run_clm_flax.py {ms['clm']:.1f} ({2 * a.batch} rows of {a.max_length}): "
          f"{ms['dpo'] / ms['clm']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ours": o, "trl": t, "step_ms": ms}, f, indent=1)


if __name__ == "__main__":
    main()
