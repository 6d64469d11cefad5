#!/usr/bin/env python
"""Preparing a large corpus once: prepare_data.py against Hugging Face's datasets.map + group_texts (issue 25).

    python bench/prepared_data.py --corpus_mb 200                      # a quick look
    python bench/prepared_data.py --corpus_mb 5000 --workers 1 2       # the issue's measurement (~5 GB)
    python bench/prepared_data.py --corpus_mb 1000 5000 --workers 1    # peak memory at two corpus sizes
    python bench/prepared_data.py --corpus_mb 5000 --workers 2 --impls ours   # prepare_data.py alone

The corpus is built here (never committed) from the shared Norwegian and English text (../shared/data: NoReC,
UD Bokmål, Wikipedia; Shakespeare, WikiText-2): their non-blank lines shuffled with a seed and repeated until the
file has --corpus_mb MB. One byte-level BPE tokenizer (--vocab_size) is trained on the shared text once. Then for
each size and worker count, each in a fresh process with a fresh `datasets` cache (nothing reused):

  ours: prepare_data.py --objective mlm --max_seq_length L --preprocessing_num_workers N (each worker reading
        its byte range of the .txt: no arrow copy of the text);
  hf:   load_dataset("text") + datasets.map(tokenize) + datasets.map(group_texts), num_proc N
        (bench/data_pipeline.py's hf_rows: Hugging Face's run_mlm_flax.py);

reporting seconds, MB/s of text, tokens/s, the peak memory of the whole process tree (sampled every 0.5 s from
/proc/*/smaps_rollup: the PSS summed over the process and its workers, and its anonymous part, which leaves out
the file pages of memory-mapped files) and the cache's bytes per token (ours: the prepared
directory, and apart whatever it left in the datasets cache (0 for .txt files); hf: every file
`datasets` wrote, that copy included, as a user's cache holds it). Last, the time from
the prepared directory to the first batch of rows (prepared.load_rows with its checksums + ShuffledRows' first
global batch of 256), the data side of "time to first step". Ends with one JSON line.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
SHARED = os.path.join(REPO, "..", "shared", "data")
SOURCES = ["no/norec_dev.txt", "no/ud_bokmaal_texts_train.txt", "no/nbailab_wiki_no_100k.txt",
           "en/tinyshakespeare_input.txt", "en/wikitext2_tokens_valid.txt"]


def build_corpus(path, megabytes, seed=0):
    """A .txt of about `megabytes` MB: the shared files' non-blank lines, shuffled and repeated (each repeat in
    another order)."""
    lines = []
    for name in SOURCES:
        with open(os.path.join(SHARED, name), encoding="utf-8") as f:
            lines += [line for line in f if line.strip()]
    rng, target, written = random.Random(seed), megabytes * 1e6, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            rng.shuffle(lines)
            for line in lines:
                out.write(line)
                written += len(line.encode("utf-8"))
                if written >= target:
                    break


def tree_memory(pid):
    """(PSS, anonymous PSS) bytes of a process and all its descendants, from /proc/*/smaps_rollup. PSS counts a page
    shared by k processes (a forked worker's copy of its parent) as 1/k in each, so the sum is the tree's real
    footprint; the anonymous part leaves out file pages (the memory-mapped arrow text and rows), which the kernel can
    drop and read again."""
    children, mem = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/smaps_rollup") as f:
                fields = dict(line.split(":", 1) for line in f.read().splitlines()[1:])
            mem[int(entry)] = tuple(int(fields[k].split()[0]) * 1024 for k in ("Pss", "Pss_Anon"))
        except (OSError, ValueError, IndexError, KeyError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, anon, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        total, anon = total + mem.get(p, (0, 0))[0], anon + mem.get(p, (0, 0))[1]
        todo += children.get(p, [])
    return total, anon


def run_measured(cmd, env=None):
    """(seconds, peak tree PSS bytes, peak tree anonymous PSS bytes, stdout) of a command run to its end."""
    t0, peak, peak_anon = time.perf_counter(), 0, 0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    done = threading.Event()

    def sample():
        nonlocal peak, peak_anon
        while not done.is_set():
            total, anon = tree_memory(proc.pid)
            peak, peak_anon = max(peak, total), max(peak_anon, anon)
            time.sleep(0.5)  # reading smaps_rollup walks page tables: costly for big maps

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[:3])} ... failed:\n{err[-3000:]}")
    return time.perf_counter() - t0, peak, peak_anon, out


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def hf_measure(path, tokenizer_dir, seq_len, workers, cache):
    """In a fresh process: Hugging Face's way from the file to grouped rows; prints the row tokens."""
    import datasets
    from bench.data_pipeline import hf_rows
    from flaxlm.tokenization.loading import load_tokenizer
    datasets.disable_progress_bars()
    train = datasets.load_dataset("text", data_files=[path], split="train", cache_dir=cache)
    train = train.filter(lambda b: [bool(t.strip()) for t in b["text"]], batched=True)
    grouped = hf_rows(train, load_tokenizer(tokenizer_dir), seq_len, workers)
    print(json.dumps({"tokens": len(grouped) * seq_len}))


def first_batch_seconds(prepared_dir, tokenizer_dir, seq_len):
    """Seconds from a prepared directory to the first global batch of 256 rows (checksums included)."""
    from flaxlm.config.options import DataArgs, TextSourceArgs
    from flaxlm.data.prepared import load_rows
    from flaxlm.data.rows import ShuffledRows
    from flaxlm.tokenization.loading import load_tokenizer
    tokenizer = load_tokenizer(tokenizer_dir)
    t0 = time.perf_counter()
    data = load_rows(prepared_dir, tokenizer, "blocks", seq_len, source=TextSourceArgs(), data_args=DataArgs())
    ShuffledRows(data["train"], 256, seed=0).batch_rows(0, slice(None))
    return time.perf_counter() - t0


def measure_size(megabytes, a, tokenizer_dir, tmp):
    corpus = os.path.join(tmp, f"corpus-{megabytes}mb.txt")
    build_corpus(corpus, megabytes)
    text_mb = os.path.getsize(corpus) / 1e6
    results = []
    for impl in a.impls:
        for w in a.workers:
            cache, out = os.path.join(tmp, f"cache-{impl}-{w}"), os.path.join(tmp, f"prepared-{megabytes}mb-{w}")
            if impl == "ours":
                cmd = [sys.executable, os.path.join(REPO, "prepare_data.py"), "--tokenizer_name", tokenizer_dir,
                       "--train_file", corpus, "--validation_split_percentage", "0", "--max_seq_length",
                       str(a.seq_len), "--output_dir", out, "--cache_dir", cache, "--preprocessing_num_workers", str(w)]
            else:
                cmd = [sys.executable, os.path.abspath(__file__), "--hf_measure", corpus, tokenizer_dir,
                       str(a.seq_len), str(w), cache]
            seconds, peak, peak_anon, stdout = run_measured(cmd)
            if impl == "ours":
                manifest = json.load(open(os.path.join(out, "manifest.json")))
                tokens = sum(s["rows"] for s in manifest["splits"]["train"]) * a.seq_len
                cache_bytes = dir_bytes(out)
            else:
                tokens = json.loads(stdout.strip().splitlines()[-1])["tokens"]
                cache_bytes = dir_bytes(cache)
            r = {"impl": impl, "corpus_mb": round(text_mb), "workers": w, "seconds": round(seconds, 1),
                 "text_mb_per_s": round(text_mb / seconds, 2), "tokens_per_s": round(tokens / seconds),
                 "peak_pss_mb": round(peak / 1e6),
                 "peak_anon_mb": round(peak_anon / 1e6), "cache_bytes_per_token": round(cache_bytes / tokens, 2)}
            if impl == "ours":  # + a copy of the text in the datasets cache (none: .txt files are read by range)
                r["text_cache_bytes_per_token"] = round(dir_bytes(cache) / tokens, 2)
                r["first_batch_s"] = round(first_batch_seconds(out, tokenizer_dir, a.seq_len), 2)
            print(json.dumps(r), flush=True)
            results.append(r)
            subprocess.run(["rm", "-rf", cache, out])
    os.remove(corpus)
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus_mb", type=int, nargs="+", default=[200], help="corpus sizes to build and prepare")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--impls", nargs="+", choices=["ours", "hf"], default=["ours", "hf"],
                   help="which ways to measure (hf at 5 GB needs hours and ~25 GB of cache on 2 cores)")
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--vocab_size", type=int, default=32000)
    p.add_argument("--tmp_dir", help="where the corpus, caches and prepared rows go (default: the system's)")
    p.add_argument("--hf_measure", nargs=5, help=argparse.SUPPRESS)  # path tokenizer_dir seq_len workers cache
    a = p.parse_args()
    if a.hf_measure:
        path, tokenizer_dir, seq_len, workers, cache = a.hf_measure
        hf_measure(path, tokenizer_dir, int(seq_len), int(workers), cache)
        return
    if not os.path.isdir(SHARED):
        sys.exit(f"no shared data at {SHARED}: put the shared data folder next to the repository")
    from bench.data_pipeline import train_tokenizer
    with tempfile.TemporaryDirectory(prefix="bench-prepared-", dir=a.tmp_dir) as tmp:
        tokenizer_dir, sample = os.path.join(tmp, "tokenizer"), os.path.join(tmp, "sample.txt")
        build_corpus(sample, 20)
        train_tokenizer(sample, a.vocab_size, tokenizer_dir)
        results = [r for mb in a.corpus_mb for r in measure_size(mb, a, tokenizer_dir, tmp)]
    print(json.dumps({"task": "prepared_data", "seq_len": a.seq_len, "vocab_size": a.vocab_size,
                      "results": results}))


if __name__ == "__main__":
    main()
