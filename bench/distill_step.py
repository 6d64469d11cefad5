#!/usr/bin/env python
"""What a distillation step costs on this machine against a plain next-token step of the same student on the same
rows: its compiled steps side by side in one process, and the project's own scripts (each run as a subprocess, as a
user runs it).

    python bench/distill_step.py --work_dir /tmp/distill-step
    python bench/distill_step.py --rounds 0 --step_rounds 3 --max_new_tokens 64      # compiled steps only

The student: a GPT-2 of 2 layers, width 256 (4 heads, FF 1024); the teacher: a GPT-2 of 4 layers, width 512 (8 heads,
FF 2048), random weights (PyTorch's init, dropout 0, saved by transformers): its weights change what is learnt, not
what a step costs. Both have the vocabulary of a byte-level BPE trained here on the demo corpus (flaxlm.data.
demo_corpus), which is also the text; rows of --max_length tokens, --batch rows a step, fp32. Four kinds of step:

  plain         run_clm_flax.py --config_name student (next-token cross-entropy, every token)
  offline       run_distill.py --mode offline --top_k K: the student's step on the teacher's stored top k (the store
                computed once beforehand, in this process, and timed: the one-off cost, with the compile of the
                teacher's forward pass)
  gkd, lmbda 0  run_distill.py --mode gkd --lmbda 0: the teacher's forward pass inside each step, the data's rows
                (the first --max_prompt_length tokens prompt, the rest taught)
  gkd, lmbda 1  the same with --lmbda 1: each step first samples the student's own completions of --max_new_tokens
                (KV cache) and trains on them

Measured two ways, each interleaved (the machine is shared and its load swings several-fold within minutes):

1. compiled steps in this process, as bench/moe_step.py: jax.value_and_grad of each objective's loss on the same
   rows (no optimizer update), every kind --step_repeats times in turn for --step_rounds rounds; lmbda 1's step is
   the sampling (EOS off: every completion --max_new_tokens long) plus the gkd step on the sampled rows. The median
   of each, and its ratio to the plain step's.
2. the scripts themselves: each kind run --rounds times in turn, 4 logging windows a run; a run's step time the
   median of metrics.jsonl's step_ms (wall time per step: the optimizer, the host's data work and, lmbda 1, the
   sampling included) over its windows after the first (which compiles). A kind's ratio to the plain step is taken
   within each round and the median over rounds printed, with the lowest and highest.

The one-off store (offline): timed inside run_distill.py (teacher_store.compute_store). Runs already done in
--work_dir are reused.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.adapt_vocabulary import done, run  # noqa: E402  -- scripts as subprocesses, logged

STUDENT = dict(n_layer=2, n_embd=256, n_head=4, n_inner=1024)
TEACHER = dict(n_layer=4, n_embd=512, n_head=8, n_inner=2048)


def corpus_and_tokenizer(w, log):
    """(train file, tokenizer dir): the demo corpus and a byte-level BPE trained on it (once)."""
    from flaxlm.data.demo_corpus import write_demo_corpus
    train = write_demo_corpus(os.path.join(w, "corpus"))["train"]
    tok = os.path.join(w, "tokenizer")
    if not done(tok, "tokenizer.json"):
        run("train_tokenizer.py", ["--type", "gpt2", "--train_file", train, "--vocab_size", "8192",
                                   "--model_max_length", "4096", "--output_dir", tok], log)
    return train, tok


def model_dir(w, name, tok, shape, positions, vocab_size=None, weights=False):
    """A model directory: the tokenizer and a GPT-2 config of `shape` (vocab_size: the config's, default the
    tokenizer's); weights: random ones saved by transformers (what a teacher needs), dropout 0."""
    import shutil

    import transformers
    out = os.path.join(w, name)
    if done(out, "model.safetensors" if weights else "config.json"):
        return out
    shutil.copytree(tok, out, dirs_exist_ok=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    config = transformers.GPT2Config(**shape, vocab_size=vocab_size or len(tokenizer), n_positions=positions,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if weights:
        import torch
        torch.manual_seed(0)
        transformers.GPT2LMHeadModel(config).save_pretrained(out)
    else:
        config.save_pretrained(out)
    return out


def compiled_steps(a, student_dir, teacher_dir):
    """{kind: (params -> None)}: each kind's step, compiled beforehand, on the same rows (the corpus's first
    --batch blocks of --max_length tokens): jax.value_and_grad of the objective's loss (flaxlm.objectives: clm,
    offline on the teacher's top k computed once, gkd with the teacher's params as the step's input), as
    bench/moe_step.py times; gkd lmbda 1 first samples the student's completions of the rows' first
    --max_prompt_length tokens (flaxlm.rl.sampling.Sampler, what OnPolicyRows calls; EOS off, so every completion has
    --max_new_tokens) and lays them into rows (flaxlm.distillation.rows.completion_rows)."""
    import jax
    import numpy as np
    from transformers import AutoTokenizer

    from flaxlm import models
    from flaxlm.distillation.rows import TextRows, completion_rows
    from flaxlm.models.generation import left_pad
    from flaxlm.objectives.clm import clm_objective
    from flaxlm.objectives.distill import gkd_objective, logits_of, offline_objective
    from flaxlm.objectives.distill_losses import teacher_top_k
    from flaxlm.rl.sampling import Sampler
    from flaxlm.training.mesh import make_mesh, replicated
    mesh = make_mesh()
    tok = AutoTokenizer.from_pretrained(student_dir, trust_remote_code=False)
    tok.model_max_length = 10 ** 9  # the text whole, cut into blocks here: no truncation warning
    with open(a.train_file, encoding="utf-8") as f:
        ids = tok(f.read()[:200_000])["input_ids"]
    blocks = np.asarray(ids[:a.batch * a.max_length], np.int32).reshape(a.batch, a.max_length)
    pad = tok.eos_token_id
    config = models.load_config(student_dir)
    graphdef, params = models.split_model(models.create_model(config, seed=0))
    params = jax.device_put(params, replicated(mesh))
    teacher_config, teacher = models.load_pretrained(teacher_dir)
    teacher_graphdef, teacher_params = models.split_model(teacher)
    teacher_params = jax.device_put(teacher_params, replicated(mesh))
    L = a.max_length

    def grad_step(objective, batch, *frozen):
        fn = jax.jit(jax.value_and_grad(lambda p, b: objective.loss_sums(p, b, None, *frozen)["loss_sum"]))
        return lambda p: jax.block_until_ready(fn(p, batch))

    plain = clm_objective(graphdef, config, params, L, pad)
    rows = TextRows(blocks).materialized()
    top = jax.jit(lambda p, b: teacher_top_k(logits_of(teacher_graphdef, p, b), a.top_k))
    teacher_ids, teacher_logps = map(np.asarray, top(teacher_params, plain_rows_batch(rows)))
    offline = offline_objective(graphdef, config, params, L, pad, alpha=0.5, temperature=1.0, tail="renormalize")
    offline_batch = offline.collate({**rows, "teacher_ids": teacher_ids, "teacher_logps": teacher_logps})
    gkd = gkd_objective(graphdef, config, params, teacher_graphdef, teacher_config, teacher_params, L, pad, beta=0.5)
    gkd_rows = TextRows(blocks, a.max_prompt_length).materialized()
    gkd_step = jax.jit(jax.value_and_grad(lambda p, b, t: gkd.loss_sums(p, b, None, t)["loss_sum"]))
    sampler = Sampler(graphdef, mesh, max_new_tokens=a.max_new_tokens, eos_id=None, pad_id=pad, temperature=0.9)
    prompts = [list(r[:a.max_prompt_length]) for r in blocks]
    ids_NP, mask_NP = left_pad(prompts, a.max_prompt_length, pad)

    def on_policy(p):
        completions = sampler(p, ids_NP, mask_NP, jax.random.key(0))
        sampled, _, _ = completion_rows(prompts, completions, None, L, pad)
        jax.block_until_ready(gkd_step(p, gkd.collate(sampled), teacher_params))

    steps = {"plain": grad_step(plain, plain.collate(blocks)), "offline": grad_step(offline, offline_batch),
             "gkd0": lambda p: jax.block_until_ready(gkd_step(p, gkd.collate(gkd_rows), teacher_params)),
             "gkd1": on_policy}
    for step in steps.values():
        step(params)  # compiled before any timing
    return steps, params


def plain_rows_batch(rows):
    """The fields the teacher reads of rows (flaxlm.objectives.distill.logits_of)."""
    return {k: rows[k] for k in ("input_ids", "segment_ids", "positions")}


def interleaved(steps, params, rounds, repeats):
    """{kind: [seconds]}: each kind's step `repeats` times in turn, `rounds` rounds (side by side: the machine is
    shared)."""
    times = {kind: [] for kind in steps}
    for _ in range(rounds):
        for kind, step in steps.items():
            for _ in range(repeats):
                start = time.perf_counter()
                step(params)
                times[kind].append(time.perf_counter() - start)
    return times


def timed_store(argv, log_path):
    """Seconds run_distill.main(argv) (--mode offline) spends in teacher_store.compute_store (reading the rows, the
    teacher's forward pass compiled and run over them, the shards written); its output appended to log_path. The
    store must not be there yet."""
    import run_distill
    from flaxlm.distillation import teacher_store
    real, took = teacher_store.compute_store, {}

    def compute_store(*a, **k):
        start = time.perf_counter()
        out = real(*a, **k)
        took["seconds"] = time.perf_counter() - start
        return out

    teacher_store.compute_store = compute_store  # offline_rows imports it from the module at call time
    try:
        with open(log_path, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            log.write(f"$ python run_distill.py {' '.join(argv)}  (in the bench's process)\n")
            log.flush()
            run_distill.main(argv)
    finally:
        teacher_store.compute_store = real
    if "seconds" not in took:
        sys.exit(f"run_distill.py computed no store (one already there?); see {log_path}")
    return took["seconds"]


def step_ms_by_round(kinds, common, rounds, runs_dir, log_path):
    """{kind: [ms per round]}: each kind's (script, flags) run with the common flags into runs_dir/steps-KIND-ROUND,
    in turn `rounds` times; a run's figure the median step_ms of its logging windows after the first."""
    out = {kind: [] for kind in kinds}
    for r in range(rounds):
        for kind, (script, flags) in kinds.items():
            run_dir = os.path.join(runs_dir, f"steps-{kind}-{r}")
            if not done(run_dir):
                run(script, ["--output_dir", run_dir, *common, *flags], log_path)
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                train = [x for x in map(json.loads, f) if x.get("split") == "train" and "step_ms" in x]
            out[kind].append(statistics.median(x["step_ms"] for x in train[1:]))
    return out


def store_positions(path):
    """(rows, positions) a store holds: rows x (length - 1), position t's distribution over token t + 1."""
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    return m["rows"], m["rows"] * (m["length"] - 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/flaxlm-distill-step")
    p.add_argument("--max_length", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--top_k", type=int, default=32)
    p.add_argument("--max_prompt_length", type=int, default=128)
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--step_rounds", type=int, default=7, help="compiled steps: rounds of each kind in turn")
    p.add_argument("--step_repeats", type=int, default=3, help="compiled steps: timed steps per kind and round")
    p.add_argument("--logging_steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="script runs: each kind this many times in turn (0: none)")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    import jax
    w = os.path.abspath(a.work_dir)
    os.makedirs(w, exist_ok=True)
    log = os.path.join(w, "log.txt")
    print(f"work dir {w} (script output in {log})", flush=True)
    a.train_file, tok = corpus_and_tokenizer(w, log)
    student = model_dir(w, "student", tok, STUDENT, a.max_length)
    teacher = model_dir(w, "teacher", tok, TEACHER, a.max_length, weights=True)
    names = {"plain": "plain next-token step (run_clm_flax.py)",
             "offline": f"offline, top-{a.top_k} from the store (run_distill.py --mode offline)",
             "gkd0": "gkd, lmbda 0: teacher forward in the step (run_distill.py --mode gkd --lmbda 0)",
             "gkd1": f"gkd, lmbda 1: + sampling {a.max_new_tokens} new tokens a step (--lmbda 1)"}
    print(f"student GPT-2 {STUDENT}, teacher GPT-2 {TEACHER}, vocabulary {vocab_of(student)}; batch {a.batch} x "
          f"{a.max_length} tokens (gkd: prompts of {a.max_prompt_length}), fp32; {jax.devices()[0].device_kind}, "
          f"{os.cpu_count()} cores (shared)", flush=True)
    figures = {}

    # 1. The compiled steps, interleaved in this process.
    steps, params = compiled_steps(a, student, teacher)
    times = interleaved(steps, params, a.step_rounds, a.step_repeats)
    figures["compiled_ms"] = {kind: statistics.median(v) * 1e3 for kind, v in times.items()}
    ms = figures["compiled_ms"]
    print(f"\ncompiled steps (value_and_grad of the objective, no optimizer update), median of {a.step_rounds} "
          f"rounds x {a.step_repeats} steps in turn")
    print("| step | ms | / plain |\n|---|---|---|")
    for kind, name in names.items():
        print(f"| {name} | {ms[kind]:.1f} | {ms[kind] / ms['plain']:.2f} |", flush=True)
    del steps, params

    # 2. The one-off store, timed inside run_distill.py; 3. the scripts' own steps, from their metrics.jsonl.
    store = os.path.join(w, f"store-k{a.top_k}")
    data = ["--train_file", a.train_file, "--tokenizer_name", student, "--train_batch_size", str(a.batch),
            "--dtype", "float32", "--report_to", "none", "--overwrite_output_dir", "--seed", "0"]
    distill = ["--config_name", student, "--teacher_model_name_or_path", teacher, "--max_length", str(a.max_length)]
    offline = distill + ["--mode", "offline", "--top_k", str(a.top_k), "--teacher_logits", store]
    seconds_file = store + ".seconds.json"
    if not os.path.exists(seconds_file):
        seconds = timed_store(["--output_dir", os.path.join(w, "runs", "store"), *data, *offline, "--max_steps", "1",
                               "--do_eval", "false"], log)
        with open(seconds_file, "w") as f:
            json.dump(seconds, f)
    with open(seconds_file) as f:
        figures["store_s"] = json.load(f)
    rows, positions = store_positions(store)
    print(f"\none-off: the teacher's top-{a.top_k} of {rows} rows ({positions:,} positions) computed in "
          f"{figures['store_s']:.1f} s (compiling its forward pass included), "
          f"{figures['store_s'] / positions * 1e6:.0f} s per million positions", flush=True)
    if a.rounds:
        gkd = distill + ["--mode", "gkd", "--max_prompt_length", str(a.max_prompt_length),
                         "--max_new_tokens", str(a.max_new_tokens)]
        kinds = {"plain": ("run_clm_flax.py", ["--config_name", student, "--block_size", str(a.max_length)]),
                 "offline": ("run_distill.py", offline),
                 "gkd0": ("run_distill.py", gkd + ["--lmbda", "0"]),
                 "gkd1": ("run_distill.py", gkd + ["--lmbda", "1"])}
        common = [*data, "--max_steps", str(4 * a.logging_steps), "--logging_steps", str(a.logging_steps),
                  "--save_steps", "100000", "--do_eval", "false"]
        by_round = step_ms_by_round(kinds, common, a.rounds, os.path.join(w, "runs"), log)
        figures["script_ms_by_round"] = by_round
        ratios = {kind: [t / p for t, p in zip(v, by_round["plain"])] for kind, v in by_round.items()}
        print(f"\nthe scripts' step_ms (metrics.jsonl), {a.rounds} rounds in turn, windows of {a.logging_steps} "
              f"steps after each run's first")
        print("| step | ms (median of rounds) | / plain (median of rounds' ratios) | / plain, lowest-highest round |"
              "\n|---|---|---|---|")
        for kind, name in names.items():
            print(f"| {name} | {statistics.median(by_round[kind]):.1f} | {statistics.median(ratios[kind]):.2f} | "
                  f"{min(ratios[kind]):.2f}-{max(ratios[kind]):.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=1)


def vocab_of(model):
    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)["vocab_size"]


if __name__ == "__main__":
    main()
