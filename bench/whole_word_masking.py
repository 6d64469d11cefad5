#!/usr/bin/env python
"""Time whole-word masking (flaxlm.data.whole_word_masking) against token masking (flaxlm.data.mlm_masking) on
the same rows, and print the masked and predicted token rates. Times are the process's CPU time (on a shared
machine, wall time counts the other processes too).

    taskset -c 0 python bench/whole_word_masking.py                     # the demo corpus, BPE, L = 512
    python bench/whole_word_masking.py --train_file text.txt --tokenizer unigram --seq_len 128

A tokenizer of --vocab_size trained on --train_file (default: the demo corpus), the text cut into blocks of
--seq_len as run_mlm_flax.py cuts it, the Generator a training run uses (PCG64). Per masker: the median over
--rounds rounds of --calls calls on a batch of --batch_size rows. Ends with one JSON line.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from flaxlm.data import rows  # noqa: E402
from flaxlm.data.demo_corpus import write_demo_corpus  # noqa: E402
from flaxlm.data.mlm_masking import MLMMasker  # noqa: E402
from flaxlm.data.whole_word_masking import WholeWordMasker  # noqa: E402
from flaxlm.tokenization.trainers import get_trainer  # noqa: E402
from flaxlm.tokenization.word_boundaries import word_boundaries  # noqa: E402


def examples_per_s(masker, ids_NL, batch_size, rounds, calls, rng):
    """Rows masked per CPU second: the median over rounds of calls of masker on consecutive batches of ids_NL."""
    ids_NL = np.resize(ids_NL, (max(len(ids_NL), batch_size * calls), ids_NL.shape[1]))  # rows repeated
    batches = [ids_NL[i * batch_size:(i + 1) * batch_size] for i in range(calls)]
    masker(batches[0], rng)  # warm up
    per_round = []
    for _ in range(rounds):
        t0 = time.process_time()
        for b in batches:
            masker(b, rng)
        per_round.append(len(batches) * batch_size / (time.process_time() - t0))
    return float(np.median(per_round))


def rates(masker, ids_NL, rng):
    """(masked, predicted) tokens per maskable token over ids_NL."""
    out = masker(ids_NL, rng)
    maskable = np.take(masker._maskable_V, ids_NL).sum()
    predicted = out["masked_weights"].sum()
    changed_BL = out["input_ids"] != ids_NL
    in_slot_BL = np.zeros(ids_NL.shape, bool)
    real_BP = out["masked_weights"] > 0
    in_slot_BL[np.nonzero(real_BP)[0], out["masked_positions"][real_BP]] = True
    return float((predicted + (changed_BL & ~in_slot_BL).sum()) / maskable), float(predicted / maskable)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train_file", default=None, help="text to tokenize (default: the demo corpus)")
    p.add_argument("--tokenizer", default="bpe", choices=["bpe", "wordpiece", "unigram"])
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--mlm_probability", type=float, default=0.15)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=10)
    a = p.parse_args()

    path = a.train_file or write_demo_corpus(tempfile.mkdtemp())["train"]
    with open(path, encoding="utf-8") as f:
        texts = [line for line in f.read().splitlines() if line.strip()]
    tokenizer = get_trainer(a.tokenizer)(iter(texts), vocab_size=a.vocab_size)
    if tokenizer.mask_token_id is None:  # a T5-style Unigram tokenizer
        tokenizer.add_special_tokens({"mask_token": "<mask>"})
    ids_NL = rows.blocks(tokenizer, a.seq_len)(texts)
    starts_word_V, ends_word_V = word_boundaries(tokenizer)
    maskers = {"token": MLMMasker.from_tokenizer(tokenizer, a.seq_len, a.mlm_probability),
               "whole_word": WholeWordMasker.from_tokenizer(tokenizer, a.seq_len, a.mlm_probability,
                                                            starts_word_V=starts_word_V, ends_word_V=ends_word_V)}
    print(f"{a.tokenizer} {len(tokenizer)} tokens, {len(ids_NL)} rows of {a.seq_len}; pinned to cpus "
          f"{sorted(os.sched_getaffinity(0))}")
    result = {"task": "whole_word_masking", "tokenizer": a.tokenizer, "vocab_size": len(tokenizer),
              "seq_len": a.seq_len, "batch_size": a.batch_size}
    for name, masker in maskers.items():
        rng = np.random.default_rng(0)
        speed = examples_per_s(masker, ids_NL, a.batch_size, a.rounds, a.calls, rng)
        masked, predicted = rates(masker, ids_NL, rng)
        print(f"{name:10s}: {speed:,.0f} examples per CPU second; slots {masker.num_predictions}, masked {masked:.4f}, "
              f"predicted {predicted:.4f} of the maskable tokens")
        result[name] = {"examples_per_s": round(speed), "slots": masker.num_predictions,
                        "masked_rate": round(masked, 5), "predicted_rate": round(predicted, 5)}
    result["slowdown"] = round(result["token"]["examples_per_s"] / result["whole_word"]["examples_per_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
