#!/usr/bin/env python
"""A tiny Llama's context extended 4x with YaRN on Norwegian text: held-out loss by position and passkey retrieval
before and after continued training at the longer length, beside plain RoPE extrapolated and continued the same
way. A table, never asserted.

    python bench/context_extension.py --work_dir /tmp/context_extension   # CPU (2 shared cores)

1. Norwegian Bokmal running text (../shared/data/no/ud_bokmaal_texts_train.txt to train on, ud_bokmaal_texts_dev.txt
   held out), a GPT-2 BPE and a Llama config of --layers x --width at --block positions, as
   bench/optimizer_learning.py makes them.
2. base: run_clm_flax.py from scratch, --steps steps of --batch rows of --block tokens.
3. Held-out long documents: consecutive lines of the held-out text joined (with their line breaks) until a document
   has --factor x --block - 1 tokens, cut there (WORK_DIR/data/long.jsonl): one window of the long context each.
4. Copies of the base with only config.json changed (transformers' format): yarn-untrained (rope_parameters
   {"rope_type": "yarn", "factor": F, "original_max_position_embeddings": BLOCK, "rope_theta": ...}) and
   extrapolated (plain RoPE, max_position_embeddings F x BLOCK).
5. Continued from the base for --long_steps steps of --long_batch rows of F x BLOCK tokens of the training text:
   yarn-continued (run_clm_flax.py --rope_scaling '{"rope_type": "yarn", "factor": F}') and, unless
   --no_plain_control, plain-continued (from the extrapolated copy, no --rope_scaling).
6. evaluate_lm.py on the long documents, disjoint windows (--stride = --max_length), --loss_by_position --bucket and
   --passkey_lengths (those within the window) x --passkey_depths: the base at --max_length BLOCK, the others at
   F x BLOCK.
Prints the loss by position and the passkey accuracy per length; writes them to WORK_DIR/results.json. Every run's
output goes to WORK_DIR/log.txt; finished runs and evaluations in --work_dir are reused (delete it to start over).
Measured (defaults, 2 shared CPU cores, 17 min): docs/long-context.md, "Measured: a tiny Llama extended 4x with YaRN".
"""
import argparse
import json
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

from bench.adapt_vocabulary import run  # noqa: E402  -- a script as a subprocess, its output to the log
from bench.distill_learning import bokmaal_texts, finished  # noqa: E402
from bench.optimizer_learning import tokenizer_and_config  # noqa: E402


def long_documents(held, tok, tokens, path):
    """Consecutive lines of `held` joined with line breaks until `tokens` tokens, cut there, one JSON record each
    (written once); the number of documents."""
    if not os.path.exists(path):
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(tok, model_max_length=10 ** 9, trust_remote_code=False)
        docs, lines = [], []
        with open(held, encoding="utf-8") as f:
            for line in filter(None, (x.rstrip("\n") for x in f)):
                lines.append(line)
                ids = tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"]
                if len(ids) >= tokens:
                    docs.append(tokenizer.decode(ids[:tokens]))
                    lines = []
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs)
    with open(path) as f:
        return sum(1 for _ in f)


def extended_copy(base, out, factor, yarn):
    """A copy of base whose config.json has max_position_embeddings x factor and, with yarn, YaRN's rope_parameters."""
    if not finished(out, "config.json"):
        shutil.copytree(base, out, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("config.json", "long_eval_*", "checkpoint*"))
        with open(os.path.join(base, "config.json")) as f:
            config = json.load(f)
        original = config["max_position_embeddings"]
        rope = dict(config.get("rope_parameters") or {"rope_type": "default",
                                                      "rope_theta": config.get("rope_theta", 10000.0)})
        if yarn:
            rope = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original,
                    "rope_theta": rope["rope_theta"]}
        config.update(rope_parameters=rope, max_position_embeddings=original * factor)
        config.pop("rope_scaling", None)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    return out


def evaluate(model, docs, length, a, log):
    """evaluate_lm.py's figures of model on the long documents at --max_length `length` (model/long_eval.json)."""
    out = os.path.join(model, f"long_eval_{length}.json")
    if not os.path.exists(out):
        passkeys = [str(n) for n in a.passkey_lengths if n <= length]
        run("evaluate_lm.py", ["--model_name_or_path", model, "--validation_file", docs, "--max_length", str(length),
                               "--stride", str(length), "--loss_by_position", str(a.bucket), "--output_file", out,
                               "--per_device_eval_batch_size", "16", *(["--passkey_lengths", *passkeys,
                               "--passkey_depths", str(a.passkey_depths)] if passkeys else [])], log)
    with open(out) as f:
        return json.load(f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/context_extension")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--vocab_size", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--block", type=int, default=128, help="the base's positions and training rows")
    p.add_argument("--factor", type=int, default=4, help="how many times longer the extended context is")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--long_batch", type=int, default=4, help="rows of factor x block tokens a continued step")
    p.add_argument("--long_steps", type=int, default=150)
    p.add_argument("--long_learning_rate", type=float, default=1e-3)
    p.add_argument("--no_plain_control", action="store_true", help="skip plain RoPE continued at the long length")
    p.add_argument("--bucket", type=int, default=64, help="positions a loss-by-position bucket")
    p.add_argument("--passkey_lengths", type=int, nargs="+", default=[192, 256, 384, 512],
                   help="those up to a model's window; the prompt alone takes ~155 tokens of the 4,096-token BPE")
    p.add_argument("--passkey_depths", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0, w = time.time(), os.path.abspath(a.work_dir)
    train, held = bokmaal_texts(w, a.data_dir)
    log = os.path.join(w, "log.txt")
    tok, cfg = tokenizer_and_config(w, train, a, log)
    long = a.factor * a.block
    docs = os.path.join(w, "data", "long.jsonl")
    n_docs = long_documents(held, tok, long - 1, docs)  # + the BOS evaluate_lm puts first: one window each

    def clm(out, steps, batch, block, rate, start):
        if not finished(out):
            run("run_clm_flax.py", [*start, "--tokenizer_name", tok, "--output_dir", out, "--overwrite_output_dir",
                                    "--train_file", train, "--validation_file", held, "--block_size", str(block),
                                    "--train_batch_size", str(batch), "--max_steps", str(steps), "--learning_rate",
                                    str(rate), "--warmup_steps", str(max(steps // 20, 1)), "--eval_steps",
                                    str(steps), "--logging_steps", str(max(steps // 10, 1)), "--save_steps", "1000000",
                                    "--seed", str(a.seed), "--dtype", "float32", "--report_to", "none"], log)
        return out

    base = clm(os.path.join(w, "base"), a.steps, a.batch, a.block, a.learning_rate, ["--config_name", cfg])
    yarn0 = extended_copy(base, os.path.join(w, "yarn-untrained"), a.factor, yarn=True)
    plain0 = extended_copy(base, os.path.join(w, "extrapolated"), a.factor, yarn=False)
    yarn = json.dumps({"rope_type": "yarn", "factor": a.factor})
    rows = {f"base@{a.block}": (base, a.block), f"base+yarn untrained@{long}": (yarn0, long),
            f"base extrapolated@{long}": (plain0, long),
            f"yarn-continued@{long}": (clm(os.path.join(w, "yarn-continued"), a.long_steps, a.long_batch, long,
                                           a.long_learning_rate, ["--model_name_or_path", base, "--rope_scaling",
                                                                  yarn]), long)}
    if not a.no_plain_control:
        rows[f"plain-continued@{long}"] = (clm(os.path.join(w, "plain-continued"), a.long_steps, a.long_batch, long,
                                               a.long_learning_rate, ["--model_name_or_path", plain0]), long)
    results = {name: evaluate(model, docs, length, a, log) for name, (model, length) in rows.items()}

    buckets = [(b["from"], b["to"]) for b in results[f"yarn-continued@{long}"]["loss_by_position"]]
    print(f"\n{a.layers}x{a.width} Llama; base: {a.steps} steps of {a.batch} x {a.block} tokens; continued: "
          f"{a.long_steps} steps of {a.long_batch} x {long} tokens ({a.long_steps * a.long_batch * long:,}); "
          f"{n_docs} held-out documents of {long - 1} tokens (+ BOS), disjoint windows")
    print("\nheld-out loss by position (nats per token):")
    print("| model | all | " + " | ".join(f"{s}-{e}" for s, e in buckets) + " |")
    print("|---" * (len(buckets) + 2) + "|")
    for name, r in results.items():
        by = {(b["from"], b["to"]): b["loss"] for b in r["loss_by_position"]}
        print(f"| {name} | {r['loss']:.3f} | " + " | ".join("" if by.get(k) is None else f"{by[k]:.3f}"
                                                           for k in buckets) + " |")
    print(f"\npasskey accuracy ({a.passkey_depths} depths each):")
    print("| model | " + " | ".join(str(n) for n in a.passkey_lengths) + " |")
    print("|---" * (len(a.passkey_lengths) + 1) + "|")
    for name, r in results.items():
        acc = {k["length"]: k["accuracy"] for k in r.get("passkey", [])}
        print(f"| {name} | " + " | ".join("-" if n not in acc else f"{acc[n]:.1f}" for n in a.passkey_lengths) + " |")
    with open(os.path.join(w, "results.json"), "w") as f:
        json.dump({"args": vars(a), "documents": n_docs, "results": results}, f, indent=1)
    print(f"\n{time.time() - t0:.0f} s; {os.path.join(w, 'results.json')}")


if __name__ == "__main__":
    main()
