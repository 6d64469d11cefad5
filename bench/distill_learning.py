#!/usr/bin/env python
"""Does distillation teach a small student more than its own next-token loss does, on the same tokens? A teacher
pretrained here, then one 2-layer student config trained from the same init three ways on the same rows, steps,
batch and learning-rate schedule, each scored by evaluate_lm.py on the same held-out text. A table, never asserted.

    python bench/distill_learning.py --work_dir /tmp/distill_learning      # CPU (2 shared cores), ~22 min
    python bench/distill_learning.py --alphas 0.5 1:bucket --student_width 64    # more offline students, narrower

1. Norwegian Bokmål running text: the first --train_lines lines of ../shared/data/no/ud_bokmaal_texts_train.txt to
   train on, the first --heldout_lines of ud_bokmaal_texts_dev.txt held out (a paragraph a line).
2. A GPT-2 BPE of --vocab_size tokens (train_tokenizer.py) on the training text; a GPT-2 teacher (--teacher_layers x
   --teacher_width) and student (--student_layers x --student_width) config of it (create_config.py, dropout 0,
   --block positions).
3. The teacher: run_clm_flax.py, --teacher_steps steps; and (unless --no_plain_reference) the student config
   trained as the plain student below but for as many steps: the teacher must beat it clearly to teach anything.
4. The student, from --config_name with --seed (the same init each time), --steps steps of --batch rows of --block
   tokens, AdamW at --learning_rate, --warmup_steps then linear decay, fp32:
     plain       run_clm_flax.py --block_size BLOCK: the next-token loss;
     offline-A   run_distill.py --mode offline --max_length BLOCK --top_k K --alpha A [--tail TAIL] for each
                 --alphas A[:TAIL] (one teacher top-k store, computed by the first such run and reused by the others:
                 its time counts in that run's script time). Alpha 1 needs --tail bucket: the renormalized top-k KL
                 does not see the student's mass outside the k tokens, so alone it leaves that mass where the init
                 put it (the first run below: a held-out loss near log(vocab));
     gkd         run_distill.py --mode gkd: the first BLOCK/2 tokens of a row prompt, --max_new_tokens BLOCK/2,
                 --lmbda, --beta (TRL's GKD on text rows: it is taught only the rows' second halves, or the student's
                 own completions of them).
   run_clm_flax.py's rows are the .txt file's lines run on with their line breaks (its default --keep_linebreaks)
   in blocks (flaxlm.data.rows.documents), run_distill.py's text rows the same: the bench checks the row count and
   the rows' fingerprint of the offline store against run_clm_flax.py's rows, the tokens each run's log counts, and
   that plain and offline students start from one held-out loss (--eval_at_start).
5. evaluate_lm.py on the held-out text (every document after its EOS, windows of --block, stride half) for the
   teacher and each student: loss per token and bits per byte.
Prints the table: model, parameters, steps, tokens trained on, held-out loss, bits per byte, the training loop's
wall time (metrics.jsonl's run seconds) and the whole script's (start-up, data, the teacher's top-k, export).
Every run's output goes to WORK_DIR/log.txt; finished runs in --work_dir are reused (delete it to start over).

Measured (2 shared CPU cores; held-out loss / bits per byte of evaluate_lm.py; students 2x128, 300 steps):
    teacher 300 steps 6.426 / 2.633: plain 6.447 / 2.642, offline alpha 0.5 6.125 / 2.510, alpha 1 (renormalize)
      8.135 / 3.333, gkd 6.600 / 2.704;
    teacher 900 steps 5.864 / 2.403 (a 2x128 plain student trained 900 steps: 5.896 / 2.416): offline alpha 0.5
      5.936 / 2.432, alpha 1 (bucket) 6.844 / 2.804, gkd 6.642 / 2.722;
    the same teacher, students 2x64: plain 6.488, 900 steps 5.803 (better than the teacher), offline alpha 0.5
      6.153, gkd 6.667.
At equal tokens, offline distillation at alpha 0.5 beats the plain student by 0.3-0.5 nats (nearly the plain
student's figure at three times the steps); alpha 1 and GKD on text rows do worse than the plain student. The 4x256
teacher is no better than a 2-layer student trained as long at this scale (both far from converged).
"""
import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

from bench.adapt_vocabulary import run  # noqa: E402  -- a script as a subprocess, its output to the log


def cut(src, dst, lines):
    """The first `lines` lines of src (all for 0) written to dst, once."""
    if not os.path.exists(dst):
        with open(src, encoding="utf-8") as f, open(dst + ".part", "w", encoding="utf-8") as out:
            for i, line in enumerate(f):
                if lines and i >= lines:
                    break
                out.write(line)
        os.replace(dst + ".part", dst)
    return dst


def bokmaal_texts(work_dir, data_dir, train_lines=0, heldout_lines=0):
    """(training file, held-out file) in WORK_DIR/data: the first lines of the UD Bokmal running text's train and dev
    splits (0: all), written once."""
    os.makedirs(os.path.join(work_dir, "data"), exist_ok=True)
    no = os.path.join(data_dir, "no")
    return (cut(os.path.join(no, "ud_bokmaal_texts_train.txt"), os.path.join(work_dir, "data", "train.txt"),
                train_lines),
            cut(os.path.join(no, "ud_bokmaal_texts_dev.txt"), os.path.join(work_dir, "data", "heldout.txt"),
                heldout_lines))


def finished(out_dir, name="model.safetensors"):
    return os.path.exists(os.path.join(out_dir, name))


def timed(script, argv, out_dir, log):
    """Run script into out_dir unless finished there; its wall seconds (kept in out_dir/wall_seconds.json)."""
    path = os.path.join(out_dir, "wall_seconds.json")
    if not finished(out_dir):
        seconds = run(script, argv, log)
        with open(path, "w") as f:
            json.dump(seconds, f)
    with open(path) as f:
        return json.load(f)


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def run_figures(out_dir):
    """{"loop_s": the training loop's seconds, "tokens": tokens trained on, "eval0": the held-out loss at step 0
    (--eval_at_start) or None}."""
    rows = metrics(out_dir)
    train = [r for r in rows if r.get("split") == "train" and "tokens" in r]
    evals = [r for r in rows if r.get("split") == "eval" and r.get("step") == 0]
    return {"loop_s": next(r["seconds"] for r in rows if r.get("split") == "run"),
            "tokens": train[-1]["tokens"] if train else None, "eval0": evals[0]["loss"] if evals else None}


def heldout(model_dir, path, block, log):
    """evaluate_lm.py's figures of model_dir on the held-out file (written to model_dir/heldout.json once)."""
    out = os.path.join(model_dir, "heldout.json")
    if not os.path.exists(out):
        run("evaluate_lm.py", ["--model_name_or_path", model_dir, "--validation_file", path, "--max_length",
                               str(block), "--per_device_eval_batch_size", "64", "--output_file", out], log)
    with open(out) as f:
        return json.load(f)


def clm_rows(tokenizer_dir, train_file, heldout_file, block):
    """(number, fingerprint) of the training rows run_clm_flax.py makes of train_file (its own functions, the datasets
    cache it filled; the fingerprint is the offline store's: flaxlm.distillation.teacher_store.rows_fingerprint)."""
    from flaxlm.config.options import TextSourceArgs
    from flaxlm.data import rows, text_mixture
    from flaxlm.distillation.rows import TextRows
    from flaxlm.distillation.teacher_store import rows_fingerprint
    from flaxlm.tokenization.loading import load_tokenizer
    tokenizer = load_tokenizer(tokenizer_dir)
    source = TextSourceArgs(train_file=[train_file], validation_file=[heldout_file])
    raw = text_mixture.load_text(source, None, 5, 0, keep_linebreaks=True)  # run_clm_flax.py's default
    train = rows.in_memory(rows.from_text(raw, rows.documents(tokenizer, block, eos=tokenizer.eos_token_id),
                                          block)["train"])
    return len(train), rows_fingerprint(TextRows(train))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/distill_learning")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--train_lines", type=int, default=0, help="lines of the training text kept (0: all, 1.3 MB)")
    p.add_argument("--heldout_lines", type=int, default=0, help="lines of the held-out text kept (0: all, 200 kB)")
    p.add_argument("--vocab_size", type=int, default=4096)
    p.add_argument("--block", type=int, default=64, help="tokens a row (--block_size / --max_length)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--teacher_layers", type=int, default=4)
    p.add_argument("--teacher_width", type=int, default=256)
    p.add_argument("--teacher_steps", type=int, default=900)
    p.add_argument("--no_plain_reference", action="store_true",
                   help="leave out the plain student trained for --teacher_steps")
    p.add_argument("--student_layers", type=int, default=2)
    p.add_argument("--student_width", type=int, default=128)
    p.add_argument("--steps", type=int, default=300, help="every student's training steps")
    p.add_argument("--learning_rate", type=float, default=3e-3, help="the teacher's and every student's")
    p.add_argument("--warmup_steps", type=int, default=30)
    p.add_argument("--top_k", type=int, default=32)
    p.add_argument("--alphas", nargs="+", default=["0.5"],
                   help="an offline student per ALPHA[:TAIL] (TAIL: --tail, default renormalize)")
    p.add_argument("--lmbda", type=float, default=0.5)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--no_gkd", action="store_true", help="leave the GKD student out")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    w = os.path.abspath(a.work_dir)
    train, held = bokmaal_texts(w, a.data_dir, a.train_lines, a.heldout_lines)
    log = os.path.join(w, "log.txt")

    # Tokenizer and the two configs (dropout 0: the runs differ by their objective only).
    tok, teacher_cfg, student_cfg = (os.path.join(w, n) for n in ("tokenizer", "teacher_config", "student_config"))
    if not finished(tok, "tokenizer.json"):
        run("train_tokenizer.py", ["--type", "gpt2", "--train_file", train, "--vocab_size", str(a.vocab_size),
                                   "--model_max_length", str(a.block), "--output_dir", tok, "--overwrite_output_dir"],
            log)
    for cfg, layers, width in ((teacher_cfg, a.teacher_layers, a.teacher_width),
                               (student_cfg, a.student_layers, a.student_width)):
        if not finished(cfg, "config.json"):
            run("create_config.py", ["--preset", "gpt2", "--tokenizer_name", tok, "--set", f"n_layer={layers}",
                                     f"n_embd={width}", f"n_head={max(width // 64, 1)}", f"n_positions={a.block}",
                                     "resid_pdrop=0.0", "embd_pdrop=0.0", "attn_pdrop=0.0", "--output_dir", cfg], log)

    def training(steps):  # what every run shares: rows, batch, schedule, seed, precision
        return ["--tokenizer_name", tok, "--train_file", train, "--validation_file", held, "--train_batch_size",
                str(a.batch), "--max_steps", str(steps), "--learning_rate", str(a.learning_rate), "--warmup_steps",
                str(a.warmup_steps), "--logging_steps", str(max(steps // 10, 1)), "--eval_steps", str(steps),
                "--save_steps", "100000", "--seed", str(a.seed), "--dtype", "float32", "--report_to", "none",
                "--overwrite_output_dir"]

    runs = {}  # name -> (directory, script seconds)
    teacher = os.path.join(w, "teacher")
    runs["teacher"] = teacher, timed("run_clm_flax.py", ["--config_name", teacher_cfg, "--output_dir", teacher,
                                                         "--block_size", str(a.block), *training(a.teacher_steps)],
                                     teacher, log)
    student = ["--config_name", student_cfg, "--eval_at_start", *training(a.steps)]
    plain = os.path.join(w, "plain")
    runs["plain"] = plain, timed("run_clm_flax.py", ["--output_dir", plain, "--block_size", str(a.block), *student],
                                 plain, log)
    if not a.no_plain_reference and a.teacher_steps != a.steps:
        out = os.path.join(w, f"plain-{a.teacher_steps}")
        runs[f"plain, {a.teacher_steps} steps"] = out, timed("run_clm_flax.py", [
            "--config_name", student_cfg, "--output_dir", out, "--block_size", str(a.block),
            *training(a.teacher_steps)], out, log)
    store = os.path.join(w, "teacher_logits")
    for spec in a.alphas:
        alpha, _, tail = spec.partition(":")
        tail = tail or "renormalize"
        out = os.path.join(w, f"offline-{float(alpha):g}" + ("" if tail == "renormalize" else f"-{tail}"))
        runs[f"offline alpha {float(alpha):g}" + ("" if tail == "renormalize" else f" ({tail})")] = out, timed(
            "run_distill.py", ["--mode", "offline", "--teacher_model_name_or_path", teacher, "--output_dir", out,
                               "--max_length", str(a.block), "--top_k", str(a.top_k), "--alpha", alpha, "--tail",
                               tail, "--teacher_logits", store, *student], out, log)
    if not a.no_gkd:
        out = os.path.join(w, "gkd")
        runs["gkd"] = out, timed("run_distill.py", [
            "--mode", "gkd", "--teacher_model_name_or_path", teacher, "--output_dir", out, "--max_length",
            str(a.block), "--max_prompt_length", str(a.block // 2), "--max_new_tokens", str(a.block // 2),
            "--lmbda", str(a.lmbda), "--beta", str(a.beta), *student], out, log)

    # The checks that the students saw the same rows from the same init.
    figures = {name: run_figures(d) for name, (d, _) in runs.items()}
    manifest = os.path.join(store, "manifest.json")  # flaxlm.distillation.teacher_store's
    stored = json.load(open(manifest)) if os.path.exists(manifest) else {}
    n_rows, fingerprint = clm_rows(tok, train, held, a.block)
    print(f"training rows of {a.block} tokens: run_clm_flax.py {n_rows}, run_distill.py's offline store "
          f"{stored.get('rows')}; the same tokens: {stored.get('rows_fingerprint') == fingerprint}")
    for name, f in figures.items():
        print(f"  {name}: tokens trained on {f['tokens']}, held-out loss at step 0 {f['eval0']}"
              f"{' (of the rows second halves: what gkd is taught)' if name == 'gkd' else ''}")

    heldout_figures = {name: heldout(d, held, a.block, log) for name, (d, _) in runs.items()}
    print(f"\nNorwegian Bokmål (UD texts): {n_rows} training rows of {a.block} tokens, held-out "
          f"{heldout_figures['teacher']['tokens']} tokens / {heldout_figures['teacher']['bytes']} bytes; teacher "
          f"{a.teacher_layers}x{a.teacher_width}, students {a.student_layers}x{a.student_width}, batch {a.batch}, lr "
          f"{a.learning_rate:g} (warmup {a.warmup_steps}, linear decay), seed {a.seed}, vocab {a.vocab_size}\n")
    print("| model | params | steps | tokens | held-out loss | bits per byte | train loop s | script s |\n"
          "|---|---|---|---|---|---|---|---|")
    for name, (d, seconds) in runs.items():
        h, f = heldout_figures[name], figures[name]
        steps = a.teacher_steps if name == "teacher" or name.startswith("plain,") else a.steps
        print(f"| {name} | {params_of(d) / 1e6:.2f}M | {steps} | {f['tokens']} | {h['loss']:.4f} | "
              f"{h['bits_per_byte']:.4f} | {f['loop_s']:.0f} | {seconds:.0f} |")
    with open(os.path.join(w, "result.json"), "w") as f:
        json.dump({"args": vars(a), "rows": n_rows, "runs": {k: {"dir": d, "script_s": s, **figures[k],
                                                                  "heldout": heldout_figures[k]}
                                                              for k, (d, s) in runs.items()}}, f, indent=1)


def params_of(model_dir):
    """The parameters in model_dir's safetensors (a tied head counted once)."""
    import math

    from safetensors import safe_open
    with safe_open(os.path.join(model_dir, "model.safetensors"), "np") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


if __name__ == "__main__":
    main()
