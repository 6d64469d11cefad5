#!/usr/bin/env python
"""What run_distill.py --mode offline's store of the teacher's top k takes on disk, per million positions, at
k = 8, 32 and 128, for a vocabulary that fits uint16 ids and for one that needs uint32.

    python bench/distill_store_size.py --work_dir /tmp/distill-store
    python bench/distill_store_size.py --ks 8 32 --big_vocab 0      # uint16 only

Real stores: run_distill.py --mode offline --max_steps 1 (in this process) on the demo corpus in rows of
--max_length, with bench/distill_step.py's student and teacher (GPT-2 shapes, random weights, the BPE trained there)
and, for uint32 ids, the same pair with configs of --big_vocab entries (the tokenizer the same small one: the ids a
store can hold are the config's) on the first --big_vocab_rows rows. A store holds, for each of a row's length - 1
positions, k ids (uint16 up to 65,536 entries, else uint32) and k float16 log-probabilities (flaxlm.distillation.
teacher_store). Prints the bytes of the shards (teacher_store.store_bytes) / positions x 1e6 as MB per million
positions (a token taught = a position), with the seconds each store took (the teacher's forward pass compiled and
run, its top k written).
"""
import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.distill_step import (STUDENT, TEACHER, corpus_and_tokenizer, model_dir, store_positions,  # noqa: E402
                                timed_store)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/flaxlm-distill-store")
    p.add_argument("--max_length", type=int, default=256)
    p.add_argument("--ks", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--big_vocab", type=int, default=70000, help="the uint32 case's vocab_size (0: none)")
    p.add_argument("--big_vocab_rows", type=int, default=64,
                   help="the uint32 case's training rows (--max_train_samples: its head and top k over the big "
                        "vocabulary are slow on a CPU; the size per position is the same)")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    from flaxlm.distillation.teacher_store import store_bytes
    w = os.path.abspath(a.work_dir)
    os.makedirs(w, exist_ok=True)
    log = os.path.join(w, "log.txt")
    print(f"work dir {w} (script output in {log})", flush=True)
    train, tok = corpus_and_tokenizer(w, log)
    vocabs = {None: ("student", "teacher", [])}
    if a.big_vocab:
        vocabs[a.big_vocab] = (f"student-{a.big_vocab}", f"teacher-{a.big_vocab}",
                               ["--max_train_samples", str(a.big_vocab_rows)])
    figures = []
    for vocab, (student_name, teacher_name, rows_flags) in vocabs.items():
        student = model_dir(w, student_name, tok, STUDENT, a.max_length, vocab_size=vocab)
        teacher = model_dir(w, teacher_name, tok, TEACHER, a.max_length, vocab_size=vocab, weights=True)
        with open(os.path.join(teacher, "config.json")) as f:
            vocab_size = json.load(f)["vocab_size"]
        for k in a.ks:
            store = os.path.join(w, f"store-v{vocab_size}-k{k}")
            seconds_file = store + ".seconds.json"
            if not os.path.exists(seconds_file):
                seconds = timed_store(["--mode", "offline", "--output_dir", os.path.join(w, "runs", os.path.basename(
                    store)), "--config_name", student, "--tokenizer_name", student, "--teacher_model_name_or_path",
                    teacher, "--train_file", train, "--max_length", str(a.max_length), "--top_k", str(k),
                    "--teacher_logits", store, "--max_steps", "1", "--do_eval", "false", "--train_batch_size", "8",
                    "--dtype", "float32", "--report_to", "none", "--overwrite_output_dir", "--seed", "0",
                    *rows_flags], log)
                with open(seconds_file, "w") as f:
                    json.dump(seconds, f)
            with open(seconds_file) as f:
                seconds = json.load(f)
            with open(os.path.join(store, "manifest.json")) as f:
                ids_dtype = json.load(f)["ids_dtype"]
            rows, positions = store_positions(store)
            size = store_bytes(store)
            figures.append(dict(vocab_size=vocab_size, ids_dtype=ids_dtype, k=k, rows=rows, positions=positions,
                                bytes=size, mb_per_million=size / positions, seconds=seconds))
            print(f"  vocabulary {vocab_size}, k {k}: {size:,} bytes for {positions:,} positions", flush=True)
    print(f"\nrows of {a.max_length} tokens (positions: rows x {a.max_length - 1}); MB = 10^6 bytes of .npy shards")
    print("| vocabulary | ids | k | rows | positions | bytes on disk | MB per million positions "
          "| seconds to compute |\n|---|---|---|---|---|---|---|---|")
    for f in figures:
        print(f"| {f['vocab_size']:,} | {f['ids_dtype']} | {f['k']} | {f['rows']:,} | {f['positions']:,} | "
              f"{f['bytes']:,} | {f['mb_per_million']:.1f} | "
              f"{f['seconds']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
