#!/usr/bin/env python
"""Time the T5 span-corruption collator (flaxlm.data.span_corruption.SpanCorruptor) on the host.

    taskset -c 0 python bench/span_collator.py            # one core, as the target is stated
    python bench/span_collator.py --inputs_length 512 --noise_density 0.15 --mean_noise_span_length 3

Random token ids below T5's sentinels, a fresh batch of raw chunks per call, the Generator a training
run uses (PCG64). Per batch size: the median over --rounds rounds of --calls calls. The target is at
least 20,000 examples/s at input length 512 (raw chunk 568) on one core. Ends with one JSON line
(examples_per_s: the best batch size's median).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from flaxlm.data.span_corruption import SpanCorruptor  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs_length", type=int, default=512)
    p.add_argument("--noise_density", type=float, default=0.15)
    p.add_argument("--mean_noise_span_length", type=float, default=3.0)
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20)
    a = p.parse_args()

    c = SpanCorruptor(inputs_length=a.inputs_length, noise_density=a.noise_density,
                      mean_noise_span_length=a.mean_noise_span_length, eos_token_id=1, pad_token_id=0,
                      first_sentinel_id=32099)
    print(f"inputs_length {c.inputs_length}, raw chunk {c.raw_length}, target {c.targets_length}, "
          f"{c.num_noise} noise tokens in {c.num_spans} spans; pinned to cpus {sorted(os.sched_getaffinity(0))}")
    rng = np.random.default_rng(0)
    rates = {}
    for B in a.batch_sizes:
        batches = [rng.integers(0, 32000, (B, c.raw_length), dtype=np.int32) for _ in range(a.calls)]
        c(batches[0], rng)  # warm up
        per_round = []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            for rows_BR in batches:
                c(rows_BR, rng)
            per_round.append(B * a.calls / (time.perf_counter() - t0))
        rates[B] = float(np.median(per_round))
        print(f"batch {B:4d}: {rates[B]:,.0f} examples/s (median of {a.rounds} rounds; "
              f"best {max(per_round):,.0f}, worst {min(per_round):,.0f})")
    best = max(rates, key=rates.get)
    print(json.dumps({"task": "t5_collator", "inputs_length": c.inputs_length, "raw_length": c.raw_length,
                      "targets_length": c.targets_length, "batch_size": best,
                      "examples_per_s": round(rates[best]),
                      "examples_per_s_by_batch": {str(B): round(r) for B, r in rates.items()}}))


if __name__ == "__main__":
    main()
