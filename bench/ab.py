#!/usr/bin/env python
"""Interleaved A/B timing of the small-config MLM train step for several copies of the package.

    python bench/ab.py flaxlm /tmp/base:flaxlm_base --rounds 5 --steps 4

Each argument is [PATH:]PACKAGE (a copy of flaxlm importable under another name). All variants are
compiled first, then timed in alternation (several steps per round); medians per variant are printed.
"""
import argparse
import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from transformers import RobertaConfig  # noqa: E402

C = dict(vocab=8192, hidden=256, layers=4, heads=4, ff=1024, seq=128, batch=32)


def build(spec):
    path, _, pkg = spec.rpartition(":")
    if path:
        sys.path.insert(0, path)
    mlm = importlib.import_module(pkg + ".mlm")
    masking = importlib.import_module(pkg + ".mlm_masking")
    models = importlib.import_module(pkg + ".models")
    train_loop = importlib.import_module(pkg + ".train_loop")
    config = RobertaConfig(vocab_size=C["vocab"], hidden_size=C["hidden"], num_hidden_layers=C["layers"],
                           num_attention_heads=C["heads"], intermediate_size=C["ff"],
                           max_position_embeddings=C["seq"] + 2)
    graphdef, params = models.split_model(models.create_model(config, seed=0))
    masker = masking.MLMMasker(seq_len=C["seq"], vocab_size=C["vocab"], mask_token_id=4, pad_token_id=1,
                               special_token_ids=[0, 1, 2, 3, 4], mlm_probability=0.15)
    obj = mlm.mlm_objective(graphdef, config, masker, C["seq"])
    tx = optax.adamw(1e-4, weight_decay=0.01)
    state = {"step": np.int32(0), "params": params, "opt_state": tx.init(params)}
    step = jax.jit(train_loop.make_train_step(obj.loss_sums, tx, 1), donate_argnums=0)
    ids = np.random.default_rng(0).integers(5, C["vocab"], size=(C["batch"], C["seq"])).astype(np.int32)
    batch = jax.device_put(obj.collate(ids, np.random.default_rng(0)))
    key = jax.random.PRNGKey(0)
    holder = {"state": state}

    def run(i):
        holder["state"], m = step(holder["state"], batch, jax.random.fold_in(key, i))
        return m
    for i in range(2):
        m = jax.block_until_ready(run(i))
    print(f"{spec}: loss after warm-up {float(m['loss']):.5f}", flush=True)
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("variants", nargs="+")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    runs = {v: build(v) for v in a.variants}
    times = {v: [] for v in a.variants}
    for r in range(a.rounds):
        for v in (a.variants if r % 2 == 0 else a.variants[::-1]):
            for i in range(a.steps):
                t = time.perf_counter()
                jax.block_until_ready(runs[v](100 + i))
                times[v].append(time.perf_counter() - t)
    for v in a.variants:
        t = np.array(times[v]) * 1000
        print(f"{v:30s} median {np.median(t):7.1f} ms  min {t.min():7.1f}  p25 {np.percentile(t, 25):7.1f}  "
              f"({C['batch'] * C['seq'] / np.median(t) * 1000:,.0f} tok/s)")


if __name__ == "__main__":
    main()
