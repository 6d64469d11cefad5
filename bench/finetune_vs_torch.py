#!/usr/bin/env python
"""Issue 46's measurement: each fine-tuning script against a transformers PyTorch loop, the same small checkpoint,
the same rows, the same hyperparameters, over several seeds; the dev metric's mean and spread side by side.

    python bench/finetune_vs_torch.py --work_dir /tmp/ft-bench --json /tmp/ft-bench/result.json
    python bench/finetune_vs_torch.py --tasks norne ud_upos --seeds 0 1 2 [--heads own]

1. Checkpoints, made once in --work_dir with the project's scripts: a byte-level BPE tokenizer (8192) and a RoBERTa
   (roberta-small with 2 layers: width 128; positions for 512 tokens) pretrained by run_mlm_flax.py for
   --pretrain_steps steps on NoReC as configs/norec_mlm.yaml does (rows of 64, 30% masked); a Unigram tokenizer and a
   T5 v1.1 (2+2 layers, width 128) pretrained by run_t5_mlm_flax.py likewise (rows of 128).
2. Data, split once (seed 0) where ../shared/data has no dev file: UD Bokmål dev 90/10 (POS), NorQuAD's training
   split by article 90/10, the Nynorsk-Bokmål pairs 90/10; NorNE's first 4000 training sentences and its dev file;
   NoReC sentence sentiment's train and dev files; SST-2's first 10000 training sentences and GLUE dev.
3. Each encoder task and seed, one start (--heads shared, the default): the checkpoint with the task's new head
   drawn once, by transformers from torch.manual_seed(seed) (bench/torch_finetune.initial_checkpoint), which both
   sides then fine-tune, as they train on the same batches: what the seed draws apart is then the dropout masks
   alone. (A new head is drawn alike on both sides, normal(initializer_range) and zero biases:
   tests/test_finetune_parity.py; but its draw moves these tiny models' dev figure by points: NorNE, dropout off,
   transformers from our seed-0..2 heads 34.60, 33.11, 33.09 and from its own 38.68, 35.96, 36.63.) --heads own:
   each side draws its own head from the seed, as a user's two runs would. T5 has no new head: its start is the
   checkpoint.
4. Each task and seed, ours: the script as a user runs it (a subprocess), its last eval row of metrics.jsonl.
   Theirs, in this process: the same script's options parsed by its own parser and its own data functions (the same
   rows), transformers' PyTorch model of the same start, the loss the model computes from its labels, torch AdamW
   with the same betas, epsilon and weight decay (none on biases and norms), transformers' linear schedule with the
   same warmup and steps, the gradient clipped to the same norm, the same batches in the same order
   (flaxlm.data.rows.ShuffledRows: epochs of whole batches), dropout as the config says, fp32; scored by the
   script's own metric code.

Prints a table (metric in points: fractions x 100) and, with --json, writes it with every run's figure: ours holds
when its mean is at least transformers' mean minus the larger of the two spreads (standard deviations over the
seeds) or one point. A run already finished in --work_dir is read back, not redone.
"""
import argparse
import json
import os
import random
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

import numpy as np  # noqa: E402

from bench.adapt_vocabulary import run  # noqa: E402  -- a script as a subprocess, logged; the bench stops if it fails

COMMON = ["--warmup_steps", "0", "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--do_train", "--do_eval",
          "--logging_steps", "100", "--eval_steps", "100000", "--save_steps", "100000", "--save_total_limit", "1",
          "--per_device_eval_batch_size", "64", "--report_to", "none", "--overwrite_output_dir"]
ENCODER, T5 = "encoder", "t5"
# name: (script, checkpoint, metric, its scale to points, the script's flags; paths under --work_dir's data/)
TASKS = {
    "norec_sentence": ("run_classification.py", ENCODER, "macro_f1", 100, [
        "--train_file", "{data}/no/norec_sentence_binary_train.json",
        "--validation_file", "{data}/no/norec_sentence_binary_dev.json", "--sentence1_column", "text",
        "--label_column", "label", "--metric", "macro_f1", "--max_seq_length", "128", "--train_batch_size", "32",
        "--learning_rate", "2e-4", "--num_train_epochs", "3"]),
    "sst2": ("run_classification.py", ENCODER, "accuracy", 100, [
        "--train_file", "{data}/glue/sst2_alps_train.tsv", "--validation_file", "{data}/glue/sst2_glue_dev.tsv",
        "--max_train_samples", "10000", "--sentence1_column", "sentence", "--label_column", "label",
        "--max_seq_length", "128", "--train_batch_size", "32", "--learning_rate", "2e-4", "--num_train_epochs", "2"]),
    "ud_upos": ("run_token_classification.py", ENCODER, "accuracy", 100, [
        "--train_file", "{work}/ud_train.conllu", "--validation_file", "{work}/ud_dev.conllu", "--tag_column", "upos",
        "--max_seq_length", "128", "--train_batch_size", "8", "--learning_rate", "5e-4", "--num_train_epochs", "3"]),
    "norne": ("run_token_classification.py", ENCODER, "f1", 100, [
        "--train_file", "{data}/no/norne_nob_train.conllu", "--validation_file", "{data}/no/norne_nob_dev.conllu",
        "--tag_column", "misc:name", "--max_train_samples", "4000", "--max_seq_length", "128",
        "--train_batch_size", "8", "--learning_rate", "5e-4", "--num_train_epochs", "3"]),
    "norquad": ("run_qa.py", ENCODER, "f1", 1, [
        "--train_file", "{work}/norquad_train.json", "--validation_file", "{work}/norquad_dev.json",
        "--max_seq_length", "256", "--doc_stride", "128", "--train_batch_size", "16", "--learning_rate", "5e-4",
        "--num_train_epochs", "1"]),
    "nn_nb": ("run_seq2seq.py", T5, "chrf", 1, [
        "--train_file", "{work}/nn_nb_train.jsonl", "--validation_file", "{work}/nn_nb_dev.jsonl",
        "--source_column", "nn", "--target_column", "nb", "--source_prefix", "nynorsk til bokmål: ",
        "--max_source_length", "128", "--max_target_length", "128", "--train_batch_size", "16",
        "--learning_rate", "1e-3", "--num_train_epochs", "5"]),
}


def make_checkpoints(a, w, log):
    """{ENCODER: dir, T5: dir}: the pretrained checkpoints (made once)."""
    norec = os.path.join(a.data_dir, "no", "norec_dev.txt")
    pretrain = ["--train_file", norec, "--validation_split_percentage", "1", "--max_eval_samples", "256",
                "--max_steps", str(a.pretrain_steps), "--learning_rate", "3e-3",
                "--warmup_steps", str(a.pretrain_steps // 10), "--weight_decay", "0.01", "--adam_beta2", "0.98",
                "--logging_steps", "50", "--eval_steps", str(a.pretrain_steps), "--save_steps", str(a.pretrain_steps),
                "--report_to", "none", "--overwrite_output_dir"]
    made = {}
    for kind, tokenizer, preset, shape, script, extra in (  # the encoder as configs/norec_mlm.yaml pretrains it
            (ENCODER, "bpe", "roberta-small", ["num_hidden_layers=2", "max_position_embeddings=514"],
             "run_mlm_flax.py", ["--max_seq_length", "64", "--train_batch_size", "128", "--mlm_probability", "0.3"]),
            (T5, "unigram", "t5-v1_1-tiny", ["d_model=128", "d_ff=512", "num_heads=4", "d_kv=32"],
             "run_t5_mlm_flax.py", ["--max_seq_length", "128", "--train_batch_size", "64"])):
        tok, out = os.path.join(w, f"{kind}-tokenizer"), os.path.join(w, f"{kind}-pretrained")
        if not os.path.exists(os.path.join(tok, "config.json")):
            run("train_tokenizer.py", ["--type", tokenizer, "--train_file", norec, "--vocab_size", "8192",
                                       "--model_max_length", "512", "--output_dir", tok, "--overwrite_output_dir"], log)
            run("create_config.py", ["--preset", preset, "--set", *shape, "--output_dir", tok], log)
        if not os.path.exists(os.path.join(out, "model.safetensors")):
            run(script, ["--config_name", tok, "--tokenizer_name", tok, "--output_dir", out, *pretrain, *extra], log)
        made[kind] = out
    return made


def split_files(a, w):
    """The fixed held-out splits the tasks read from --work_dir (made once, seed 0)."""
    rng = random.Random(0)
    ud = os.path.join(w, "ud_train.conllu")
    if not os.path.exists(ud):
        with open(os.path.join(a.data_dir, "no", "ud_bokmaal_dev.conllu"), encoding="utf-8") as f:
            blocks = [b.strip("\n") + "\n\n" for b in f.read().split("\n\n") if b.strip()]
        rng.shuffle(blocks)
        cut = len(blocks) // 10
        for name, part in (("ud_dev.conllu", blocks[:cut]), ("ud_train.conllu", blocks[cut:])):
            with open(os.path.join(w, name), "w", encoding="utf-8") as f:
                f.writelines(part)
    squad = os.path.join(w, "norquad_train.json")
    if not os.path.exists(squad):
        with open(os.path.join(a.data_dir, "no", "norquad_train.json"), encoding="utf-8") as f:
            data = json.load(f)
        articles = list(data["data"])
        rng.shuffle(articles)
        cut = len(articles) // 10
        for name, part in (("norquad_dev.json", articles[:cut]), ("norquad_train.json", articles[cut:])):
            with open(os.path.join(w, name), "w", encoding="utf-8") as f:
                json.dump({**data, "data": part}, f, ensure_ascii=False)
    pairs = os.path.join(w, "nn_nb_train.jsonl")
    if not os.path.exists(pairs):
        with open(os.path.join(a.data_dir, "no", "nn_nb_dev.jsonl"), encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        rng.shuffle(lines)
        cut = len(lines) // 10
        for name, part in (("nn_nb_dev.jsonl", lines[:cut]), ("nn_nb_train.jsonl", lines[cut:])):
            with open(os.path.join(w, name), "w", encoding="utf-8") as f:
                f.writelines(part)


def task_flags(name, a, w, checkpoint, seed):
    script, _, _, _, flags = TASKS[name]
    return [f.format(data=a.data_dir, work=w) for f in flags] + COMMON + [
        "--model_name_or_path", checkpoint, "--seed", str(seed)]


def start(name, a, w, checkpoint, seed):
    """The weights both sides fine-tune for the task and seed: with --heads shared an encoder task's checkpoint with
    the new head transformers draws from the seed (made once in --work_dir), else the checkpoint."""
    script, kind, _, _, _ = TASKS[name]
    if a.heads == "own" or kind != ENCODER:
        return checkpoint
    out = os.path.join(w, "starts", f"{name}-{seed}")
    if not os.path.exists(os.path.join(out, "config.json")):
        from bench.torch_finetune import initial_checkpoint
        initial_checkpoint(script, task_flags(name, a, w, checkpoint, seed), checkpoint, out)
    return out


def run_name(name, a, side, seed):
    """A run's name in --work_dir/runs: an encoder task's runs from a shared start apart (T5 starts from the
    checkpoint either way)."""
    shared = a.heads == "shared" and TASKS[name][1] == ENCODER
    return f"{name}-shared-{side}-{seed}" if shared else f"{name}-{side}-{seed}"


def ours(name, a, w, checkpoint, seed, log):
    """Our script's last dev figure for the task and seed (in the task's metric)."""
    script, _, metric, _, _ = TASKS[name]
    out = os.path.join(w, "runs", run_name(name, a, "ours", seed))
    if not os.path.exists(os.path.join(out, "config.json")):
        run(script, ["--output_dir", out, *task_flags(name, a, w, checkpoint, seed)], log)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if r.get("split") == "eval"]
    return float(evals[-1][metric])


def theirs(name, a, w, checkpoint, seed):
    """The transformers PyTorch loop's dev figure for the task and seed (in the task's metric), cached in --work_dir."""
    path = os.path.join(w, "runs", run_name(name, a, "torch", seed) + ".json")
    if not os.path.exists(path):
        from bench.torch_finetune import finetune
        t0 = time.time()
        script, _, metric, _, _ = TASKS[name]
        figures = finetune(script, task_flags(name, a, w, checkpoint, seed), checkpoint)
        print(f"  torch {name} seed {seed}: {metric} {figures[metric]:.4f} ({time.time() - t0:.0f} s)", flush=True)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(figures, f)
    with open(path) as f:
        return float(json.load(f)[TASKS[name][2]])


def summary(values, scale):
    v = np.asarray(values) * scale
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--work_dir", default="/tmp/flaxlm-finetune-bench")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--pretrain_steps", type=int, default=1200)
    p.add_argument("--heads", choices=("shared", "own"), default="shared",
                   help="shared: both sides fine-tune the same start (the new head drawn once per seed); own: each "
                        "side draws its own head")
    p.add_argument("--json", default=None, help="write the table here as JSON")
    a = p.parse_args(argv)
    w = os.path.abspath(a.work_dir)
    os.makedirs(w, exist_ok=True)
    log = os.path.join(w, "log.txt")
    print(f"work dir {w} (script output in {log})", flush=True)
    checkpoints = make_checkpoints(a, w, log)
    split_files(a, w)
    rows = []
    for name in a.tasks:
        script, kind, metric, scale, _ = TASKS[name]
        figures = {"ours": [], "transformers": []}
        for seed in a.seeds:
            begin = start(name, a, w, checkpoints[kind], seed)
            figures["ours"].append(ours(name, a, w, begin, seed, log))
            figures["transformers"].append(theirs(name, a, w, begin, seed))
        (om, osd), (tm, tsd) = summary(figures["ours"], scale), summary(figures["transformers"], scale)
        holds = om >= tm - max(osd, tsd, 1.0)
        rows.append({"task": name, "script": script, "heads": a.heads, "metric": metric, "ours_mean": om,
                     "ours_std": osd, "transformers_mean": tm, "transformers_std": tsd, "holds": holds,
                     "runs": figures})
    print(f"\nheads: {a.heads}\n| script | task | dev metric (points) | ours (mean ± std, {len(a.seeds)} seeds) "
          f"| transformers PyTorch | ours - transformers | ours ≥ transformers - max(spreads, 1) |\n"
          f"|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['script']} | {r['task']} | {r['metric']} | {r['ours_mean']:.2f} ± {r['ours_std']:.2f} | "
              f"{r['transformers_mean']:.2f} ± {r['transformers_std']:.2f} | "
              f"{r['ours_mean'] - r['transformers_mean']:+.2f} | {'yes' if r['holds'] else 'NO'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
