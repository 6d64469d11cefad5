#!/usr/bin/env python
"""Time text -> token rows: flaxlm's one-pass rows.from_text against Hugging Face's two datasets.map passes.

    python bench/data_pipeline.py                      # ../shared/data/no/norec_dev.txt, seq 128 and 512
    python bench/data_pipeline.py --file corpus.txt --seq_lengths 128 --workers 1 2 --hf_workers 2

One byte-level BPE tokenizer (flaxlm.tokenization.trainers.train_bpe, --vocab_size) is trained on the file once,
saved to a temp dir and loaded as run_mlm_flax.py loads it (flaxlm.tokenization.loading.load_tokenizer). Then, per
sequence length:

  ours: flaxlm.data.text.load_raw_text + flaxlm.data.rows.from_text(rows.blocks, num_workers=N,
        overwrite_cache=True): one datasets.map that tokenizes a batch of 1000 texts and cuts it into int32 blocks
        (the remainder dropped);
  hf:   run_mlm_flax.py's way (transformers 4.x): datasets.map(tokenize_function, batched=True, num_proc=N,
        remove_columns=["text"]) with return_special_tokens_mask=True, then datasets.map(group_texts,
        batched=True, num_proc=N), group_texts concatenating every column of a batch of 1000 and cutting it
        into blocks (the remainder dropped), load_from_cache_file=False.

Both start from the same load_raw_text output (blank lines dropped), so with the same tokenizer and the same
worker count (hence the same batches of 1000 texts) the token rows must be identical; that is checked. Each
measurement runs in a fresh process with a fresh `datasets` cache dir: no cache hit, and no tokenizer whose
thread pool was already used before datasets forks its workers (the tokenizers library then turns its
parallelism off in the children). Only the tokenization + grouping is timed, not reading the file into
arrow (load_s, printed apart). Ends with one JSON line.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from itertools import chain

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DEFAULT_FILE = os.path.join(REPO, "..", "shared", "data", "no", "norec_dev.txt")


def load_text(path, cache_dir):
    """The file as load_raw_text gives it to run_mlm_flax.py: {"train": Dataset} of non-blank lines."""
    from flaxlm.config.options import TextSourceArgs
    from flaxlm.data.text import load_raw_text
    return load_raw_text(TextSourceArgs(train_file=[path], cache_dir=cache_dir), validation_split_percentage=0)


def hf_rows(train, tokenizer, seq_len, workers):
    """Hugging Face run_mlm_flax.py's grouped mode: tokenize every text, then concatenate and cut each batch."""
    def tokenize_function(examples):
        return tokenizer(examples["text"], return_special_tokens_mask=True)

    def group_texts(examples):
        joined = {k: list(chain(*examples[k])) for k in examples.keys()}
        total = len(joined["input_ids"]) // seq_len * seq_len  # the batch's remainder is dropped
        return {k: [t[i:i + seq_len] for i in range(0, total, seq_len)] for k, t in joined.items()}

    tokenized = train.map(tokenize_function, batched=True, num_proc=workers, remove_columns=["text"],
                          load_from_cache_file=False)
    return tokenized.map(group_texts, batched=True, num_proc=workers, load_from_cache_file=False)


def measure(impl, workers, seq_len, tokenizer_dir, path, rows_out):
    """One timing in this (fresh) process; saves the rows as .npy and returns the figures."""
    import datasets
    import numpy as np

    from flaxlm.data.rows import as_numpy_rows, blocks, from_text
    from flaxlm.tokenization.loading import load_tokenizer
    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(tokenizer_dir)
    with tempfile.TemporaryDirectory(prefix="bench-data-cache-") as cache:
        t0 = time.perf_counter()
        train = load_text(path, cache)["train"]
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        if impl == "ours":
            rows = from_text({"train": train}, blocks(tokenizer, seq_len), seq_len, num_workers=workers,
                             overwrite_cache=True)["train"]
        else:
            rows = hf_rows(train, tokenizer, seq_len, workers)
        seconds = time.perf_counter() - t0
        rows_NL = as_numpy_rows(rows)
    np.save(rows_out, rows_NL)
    return {"impl": impl, "workers": workers, "seq_len": seq_len, "seconds": round(seconds, 3),
            "load_s": round(load_s, 3), "texts": len(train), "rows": len(rows_NL),
            "tokens_per_s": round(rows_NL.size / seconds)}


def train_tokenizer(path, vocab_size, out_dir):
    from flaxlm.data.text import iter_texts
    from flaxlm.tokenization.trainers import save_tokenizer, train_bpe
    with tempfile.TemporaryDirectory(prefix="bench-data-cache-") as cache:
        train = load_text(path, cache)["train"]
        save_tokenizer(train_bpe(iter_texts(train), vocab_size=vocab_size, total=len(train)), out_dir)


def run_one(impl, workers, seq_len, tokenizer_dir, path, rows_out):
    """measure() in a fresh Python process."""
    cmd = [sys.executable, os.path.abspath(__file__), "--file", path, "--measure", impl, str(workers),
           str(seq_len), tokenizer_dir, rows_out]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"measurement {impl} workers={workers} seq={seq_len} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(a_NL, b_NL):
    """None when identical, else a short description of the difference."""
    import numpy as np
    if a_NL.shape != b_NL.shape:
        return f"{len(a_NL)} vs {len(b_NL)} rows"
    differ = np.flatnonzero((a_NL != b_NL).any(axis=1))
    return None if len(differ) == 0 else f"{len(differ)} of {len(a_NL)} rows differ, the first is row {differ[0]}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", default=DEFAULT_FILE, help="a .txt corpus")
    p.add_argument("--seq_lengths", type=int, nargs="+", default=[128, 512])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="ours: --preprocessing_num_workers")
    p.add_argument("--hf_workers", type=int, default=2, help="Hugging Face's way: num_proc of both maps")
    p.add_argument("--vocab_size", type=int, default=8192)
    p.add_argument("--tokenizer_dir", help="use this tokenizer instead of training one")
    p.add_argument("--measure", nargs=5, help=argparse.SUPPRESS)  # impl workers seq_len tokenizer_dir rows_out
    a = p.parse_args()
    if not os.path.isfile(a.file):
        sys.exit(f"no corpus at {a.file}: pass --file PATH (a .txt file), or put the shared data folder "
                 f"next to the repository (../shared/data/no/norec_dev.txt)")
    if a.measure:
        impl, workers, seq_len, tokenizer_dir, rows_out = a.measure
        print(json.dumps(measure(impl, int(workers), int(seq_len), tokenizer_dir, a.file, rows_out)))
        return

    import numpy as np
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        tokenizer_dir = a.tokenizer_dir
        if not tokenizer_dir:
            tokenizer_dir = os.path.join(tmp, "tokenizer")
            t0 = time.perf_counter()
            train_tokenizer(a.file, a.vocab_size, tokenizer_dir)
            print(f"trained a {a.vocab_size}-token byte-level BPE on {a.file} in {time.perf_counter() - t0:.1f} s")
        print(f"{os.path.getsize(a.file) / 1e6:.1f} MB of text; cpus {sorted(os.sched_getaffinity(0))}; "
              f"each measurement in a fresh process with a fresh datasets cache")
        results, ratios, identical = [], {}, {}
        for L in a.seq_lengths:
            runs = [("ours", w) for w in a.workers] + [("hf", a.hf_workers)]
            rows = {}
            for impl, w in runs:
                rows[impl, w] = os.path.join(tmp, f"{impl}-{w}-{L}.npy")
                r = run_one(impl, w, L, tokenizer_dir, a.file, rows[impl, w])
                results.append(r)
                name = f"{'flaxlm rows.from_text' if impl == 'ours' else 'HF map + group_texts'}, {w} proc"
                print(f"seq {L:4d}  {name:<32} {r['seconds']:7.2f} s  {r['rows']:7d} rows  "
                      f"{r['tokens_per_s']:>10,} tokens/s   (load_raw_text {r['load_s']:.2f} s, {r['texts']} texts)")
            by = {(r["impl"], r["workers"]): r for r in results if r["seq_len"] == L}
            hf = by["hf", a.hf_workers]
            same = by.get(("ours", a.hf_workers))
            if same is None:
                print(f"  no run of ours with {a.hf_workers} workers to compare the rows with (--workers)")
                continue
            ratios[L] = round(hf["seconds"] / same["seconds"], 2)
            diff = compare(np.load(rows["ours", a.hf_workers]), np.load(rows["hf", a.hf_workers]))
            identical[L] = diff is None
            print(f"  HF's way takes {ratios[L]:.2f}x as long as ours with {a.hf_workers} processes; token rows "
                  + ("identical" if diff is None else f"NOT identical: {diff}"))
            if diff is not None:
                print("  (they should be: same tokenizer, same texts and the same batches of 1000 texts per "
                      "worker shard; a batch with fewer tokens than one row, which Hugging Face keeps as one "
                      "short row in transformers 4.x, is dropped by both here)")
            for w in a.workers:
                if w != a.hf_workers:
                    d = compare(np.load(rows["ours", w]), np.load(rows["ours", a.hf_workers]))
                    print(f"  ours with {w} vs {a.hf_workers} processes: "
                          + ("identical rows" if d is None else
                             f"{d}: each worker's shard starts its batches of 1000 texts afresh, so the "
                             f"blocks after a shard boundary are cut elsewhere (expected)"))
    print(json.dumps({"task": "data_pipeline", "file": os.path.basename(a.file), "vocab_size": a.vocab_size,
                      "hf_over_ours_seconds": {str(k): v for k, v in ratios.items()},
                      "identical_rows": {str(k): v for k, v in identical.items()}, "results": results}))


if __name__ == "__main__":
    main()
