#!/usr/bin/env python
"""Issue 23's measurement: an English model adapted to Norwegian with each adapt_vocabulary.py method, against
one trained from scratch, end to end with the project's own scripts (each run as a subprocess, as a user runs it).

    python bench/adapt_vocabulary.py --work_dir /tmp/adapt-bench --json /tmp/adapt-bench/result.json
    python bench/adapt_vocabulary.py --family gpt2 --source_steps 300 --steps 150

1. an English byte-level BPE tokenizer (train_tokenizer.py --type bpe) and a source model (create_config.py
   --preset roberta-small / gpt2-small) pretrained for --source_steps steps (run_mlm_flax.py / run_clm_flax.py) on
   --en_files (wikitext-2 valid + tiny Shakespeare);
2. a Norwegian tokenizer of the same type and size on --no_train_file (NoReC dev);
3. adapt_vocabulary.py --method random / overlap / mean / focus (focus: --focus_train_file = --no_train_file), each
   continued for --steps steps on --no_train_file with --validation_file --no_eval_file (UD Bokmaal dev texts) and
   --eval_at_start, and a model of the same preset with the Norwegian tokenizer trained from scratch for the same
   steps: same seed, learning rate, batch and sequence length for all (eval rows of metrics.jsonl read back);
4. the fertility (tokens per whitespace word, no special tokens) of both tokenizers on --no_eval_file;
5. gpt2: bits per byte on --no_eval_file (evaluate_lm.py) of the English source and of each Norwegian model, which
   compare across tokenizers; with --suite the Norwegian suite's decoder tasks (evaluate_suite.py) for the scratch
   and the mean-adapted model, the English source's bits per byte as the baseline.

All adapted and scratch models share the Norwegian tokenizer, so their losses compare with each other (not with
the English model's). Prints one table and, with --json, writes it. Steps already done in --work_dir (a directory
with its finished output) are reused.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")
METHODS = ("random", "overlap", "mean", "focus")
FAMILIES = {"roberta": ("roberta-small", "run_mlm_flax.py"), "gpt2": ("gpt2-small", "run_clm_flax.py")}


def run(script, argv, log_path):
    """`python script argv` in the checkout, its output appended to log_path; stops the bench if it fails."""
    t0 = time.time()
    with open(log_path, "a") as log:
        log.write(f"$ python {script} {' '.join(argv)}\n")
        log.flush()
        p = subprocess.run([sys.executable, script, *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    dt = time.time() - t0
    print(f"  {script} {' '.join(argv[:6])} ... ({dt:.0f} s)", flush=True)
    if p.returncode != 0:
        sys.exit(f"{script} failed (exit {p.returncode}); see {log_path}")
    return dt


def median_step_ms(kinds, common, rounds, runs_dir, log_path):
    """{kind: median step ms}: each kind's (script, flags) run with the common flags into runs_dir/steps-KIND-ROUND, in
    turn `rounds` times (the machine is shared: side by side), the median over every logging window after each run's
    first; a finished run is reused."""
    windows = {kind: [] for kind in kinds}
    for r in range(rounds):
        for kind, (script, flags) in kinds.items():
            out = os.path.join(runs_dir, f"steps-{kind}-{r}")
            if not done(out):
                run(script, ["--output_dir", out, *common, *flags], log_path)
            with open(os.path.join(out, "metrics.jsonl")) as f:
                train = [x for x in map(json.loads, f) if x.get("split") == "train" and "step_ms" in x]
            windows[kind] += [x["step_ms"] for x in train[1:]]
    return {kind: statistics.median(v) for kind, v in windows.items()}


def done(out_dir, name="config.json"):
    return os.path.exists(os.path.join(out_dir, name))


def eval_losses(out_dir):
    """{step: eval loss} from OUTPUT_DIR/metrics.jsonl."""
    rows = {}
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for r in map(json.loads, f):
            if r.get("split") == "eval" and "loss" in r:
                rows[int(r["step"])] = float(r["loss"])
    return rows


def fertility(tokenizer_dir, text_file):
    """Tokens per whitespace-separated word of text_file's lines under the tokenizer (no special tokens)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)  # our own tokenizers only
    tok.model_max_length = 10 ** 9  # whole lines, no truncation warning
    with open(text_file, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    tokens = sum(len(ids) for ids in tok(lines, add_special_tokens=False)["input_ids"])
    words = sum(len(line.split()) for line in lines)
    return tokens / words


def bits_per_byte(model_dir, text_file, w, log):
    """evaluate_lm.py's bits per byte of the model on text_file (its defaults: the model's context, half as stride)."""
    out = os.path.join(w, f"bpb-{os.path.basename(model_dir)}.json")
    if not os.path.exists(out):
        run("evaluate_lm.py", ["--model_name_or_path", model_dir, "--validation_file", text_file, "--output_file",
                               out], log)
    with open(out) as f:
        return json.load(f)["bits_per_byte"]


def judge(model_dir, baseline_model, w, log):
    """The Norwegian suite's decoder rows for the model (evaluate_suite.py), baseline_model's bits per byte beside."""
    out = os.path.join(w, f"suite-{os.path.basename(model_dir)}")
    if not done(out, "results.json"):
        run("evaluate_suite.py", ["--model_name_or_path", model_dir, "--suite",
                                  os.path.join(REPO, "configs", "suites", "norwegian.yaml"), "--data_dir", DATA,
                                  "--output_dir", out, "--baseline_model", baseline_model, "--overwrite_output_dir"],
            log)
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)["results"]


def train_args(a, out, train_files, valid_file, steps, lr, warmup):
    return ["--output_dir", out, "--train_file", *train_files, "--validation_file", valid_file,
            "--max_seq_length", str(a.seq_len), "--train_batch_size", str(a.batch_size),
            "--eval_batch_size", str(a.eval_batch_size), "--max_eval_samples", str(a.max_eval_samples),
            "--max_steps", str(steps), "--learning_rate", str(lr), "--warmup_steps", str(warmup),
            "--weight_decay", "0.01", "--seed", str(a.seed), "--logging_steps", str(max(1, steps // 5)),
            "--eval_steps", str(steps), "--save_steps", str(steps), "--save_total_limit", "1",
            "--cache_dir", os.path.join(a.work_dir, "cache"), "--overwrite_output_dir"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="roberta")
    p.add_argument("--source_steps", type=int, default=1000, help="English pretraining steps of the source model")
    p.add_argument("--steps", type=int, default=300, help="Norwegian steps of each adapted / scratch model")
    p.add_argument("--work_dir", default="/tmp/flaxlm-adapt-bench")
    p.add_argument("--json", default=None, help="write the table here as JSON")
    p.add_argument("--suite", action="store_true", help="gpt2: also the Norwegian suite's decoder tasks for the "
                                                       "scratch and the mean-adapted model (evaluate_suite.py)")
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--eval_batch_size", type=int, default=32)
    p.add_argument("--max_eval_samples", type=int, default=256, help="eval rows (of --seq_len tokens)")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--source_lr", type=float, default=1e-3)
    p.add_argument("--lr", type=float, default=5e-4, help="learning rate of every Norwegian run")
    p.add_argument("--warmup_steps", type=int, default=30, help="of the Norwegian runs (the source: 10%% of its steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--en_files", nargs="+", default=[os.path.join(DATA, "en", "wikitext2_tokens_valid.txt"),
                                                     os.path.join(DATA, "en", "tinyshakespeare_input.txt")])
    p.add_argument("--no_train_file", default=os.path.join(DATA, "no", "norec_dev.txt"))
    p.add_argument("--no_eval_file", default=os.path.join(DATA, "no", "ud_bokmaal_texts_dev.txt"))
    a = p.parse_args(argv)

    preset, trainer = FAMILIES[a.family]
    w = os.path.abspath(a.work_dir)
    os.makedirs(w, exist_ok=True)
    log = os.path.join(w, "log.txt")
    print(f"work dir {w} (script output in {log})", flush=True)
    t_start = time.time()
    times = {}

    # 1. English tokenizer and source model
    en_model = os.path.join(w, f"{a.family}-en")
    if not done(en_model, "tokenizer.json"):
        run("train_tokenizer.py", ["--type", "bpe", "--vocab_size", str(a.vocab_size), "--train_file", *a.en_files,
                                   "--output_dir", en_model, "--overwrite_output_dir"], log)
    if not done(en_model):
        run("create_config.py", ["--preset", preset, "--output_dir", en_model], log)
    en_run = os.path.join(w, f"{a.family}-en-run")
    if not done(en_run):
        # the English eval text: the last of --en_files (only a sanity check of the source model)
        times["source"] = run(trainer, ["--config_name", en_model, "--tokenizer_name", en_model,
                                        *train_args(a, en_run, a.en_files, a.en_files[-1], a.source_steps,
                                                    a.source_lr, a.source_steps // 10)], log)
    source_eval = eval_losses(en_run)

    # 2. Norwegian tokenizer; the scratch model's config of the same preset
    no_tok = os.path.join(w, "tok-no")
    if not done(no_tok, "tokenizer.json"):
        run("train_tokenizer.py", ["--type", "bpe", "--vocab_size", str(a.vocab_size), "--train_file",
                                   a.no_train_file, "--output_dir", no_tok, "--overwrite_output_dir"], log)
    scratch_model = os.path.join(w, f"{a.family}-no-scratch-init")
    if not done(scratch_model):
        os.makedirs(scratch_model, exist_ok=True)
        run("create_config.py", ["--preset", preset, "--output_dir", scratch_model, "--tokenizer_name", no_tok], log)

    # 3. adapted models, each continued; the scratch model
    results = []
    for method in (*METHODS, "scratch"):
        out = os.path.join(w, f"{a.family}-no-{method}")
        if method == "scratch":
            start = ["--config_name", scratch_model, "--tokenizer_name", no_tok]
        else:
            init = out + "-init"
            if not done(init):
                extra = ["--focus_train_file", a.no_train_file] if method == "focus" else []
                run("adapt_vocabulary.py", ["--model_name_or_path", en_run, "--tokenizer_name", no_tok,
                                            "--method", method, "--output_dir", init, "--seed", str(a.seed),
                                            *extra], log)
            start = ["--model_name_or_path", init]
        if not done(out, "metrics.jsonl") or a.steps not in eval_losses(out):
            times[method] = run(trainer, [*start, *train_args(a, out, [a.no_train_file], a.no_eval_file, a.steps,
                                                                a.lr, a.warmup_steps), "--eval_at_start"], log)
        losses = eval_losses(out)
        results.append({"method": method, "eval_loss_step0": losses.get(0),
                        f"eval_loss_step{a.steps}": losses.get(a.steps)})

    # 4. fertility on the Norwegian eval text
    fert = {"en_tokenizer": fertility(en_model, a.no_eval_file), "no_tokenizer": fertility(no_tok, a.no_eval_file)}

    # 5. a decoder's figures that compare across tokenizers: bits per byte on the Norwegian eval text (evaluate_lm.py)
    # of the English source as it is and of each Norwegian model; with --suite, the Norwegian suite's decoder tasks
    # for the scratch and the mean-adapted model, the English source as the bits-per-byte baseline
    bpb, suite_rows = {}, {}
    if a.family == "gpt2":
        runs = {"source (English)": en_run, **{m: os.path.join(w, f"{a.family}-no-{m}") for m in (*METHODS, "scratch")}}
        bpb = {name: bits_per_byte(path, a.no_eval_file, w, log) for name, path in runs.items()}
        if a.suite:
            suite_rows = {m: judge(runs[m], en_run, w, log) for m in ("scratch", "mean")}

    table = {"family": a.family, "preset": preset, "source_steps": a.source_steps, "steps": a.steps,
             "vocab_size": a.vocab_size, "batch_size": a.batch_size, "seq_len": a.seq_len, "lr": a.lr,
             "source_lr": a.source_lr, "seed": a.seed, "max_eval_samples": a.max_eval_samples,
             "source_eval_loss": {str(k): v for k, v in sorted(source_eval.items())},
             "results": results, "fertility_on_eval_text": fert, "bits_per_byte_on_eval_text": bpb,
             "suite": suite_rows,
             "run_seconds": {k: round(v, 1) for k, v in times.items()},
             "total_seconds": round(time.time() - t_start, 1)}
    print(f"\n{a.family} ({preset}): source {a.source_steps} English steps, {a.steps} Norwegian steps, "
          f"batch {a.batch_size} x {a.seq_len}, lr {a.lr}, Norwegian BPE {a.vocab_size}")
    print(f"source model English eval loss: {source_eval}")
    print(f"{'method':10s} {'eval loss @0':>13s} {'eval loss @' + str(a.steps):>14s}")
    for r in results:
        l0, lk = r["eval_loss_step0"], r[f"eval_loss_step{a.steps}"]
        print(f"{r['method']:10s} {l0 if l0 is None else f'{l0:.3f}':>13} {lk if lk is None else f'{lk:.3f}':>14}")
    print(f"fertility on {os.path.basename(a.no_eval_file)} (tokens per word): English tokenizer "
          f"{fert['en_tokenizer']:.3f}, Norwegian tokenizer {fert['no_tokenizer']:.3f}")
    for name, value in bpb.items():
        print(f"bits per byte on {os.path.basename(a.no_eval_file)}: {name:16s} {value:.4f}")
    for name, rows in suite_rows.items():
        for r in rows:
            print(f"suite {name:8s} {r['task']:26s} {r['metric']:13s} " + (
                f"{r['score']:.2f} [{r['low']:.2f}, {r['high']:.2f}] baseline {r['baseline']} ({r['baseline_name']}) "
                f"{r['seconds']} s" if "score" in r else f"failed: {r.get('error')}"))
    print(f"total {table['total_seconds']:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=2)
        print(f"wrote {a.json}")
    return table


if __name__ == "__main__":
    main()
