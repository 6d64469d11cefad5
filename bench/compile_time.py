#!/usr/bin/env python
"""Compile time of a training gradient with the layers in a loop against under jax.lax.scan (--scan_layers).

    python bench/compile_time.py                         # roberta-base and gpt2 shapes (12 layers each)
    python bench/compile_time.py --models gpt2 --remat_policy full --layers 48

For each model (create_config.py's preset, vocab as the preset's, --layers deep) it lowers and compiles
jax.value_and_grad of a loss over the model's training call (dropout on; RoBERTa: logits at 20 masked
positions per row), from abstract parameters (nothing is allocated or initialized), once per execution,
and prints the seconds each took and the compiled program's size. Nothing is run, so this measures the
compiler alone; the compilation cache is not used. Ends with one JSON line.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from flaxlm.config.options import REMAT_POLICIES  # noqa: E402
from flaxlm.models import Execution, abstract_model, merge_model  # noqa: E402
from flaxlm.models.presets import build_config  # noqa: E402

MASKED = 20  # masked positions per row (RoBERTa)


def loss_fn(graphdef, config):
    """loss(params, ids_BL, key): mean logsumexp of the logits, the model's training call with dropout."""
    def loss(params, ids_BL, key):
        model = merge_model(graphdef, params)
        if config.model_type in ("bert", "roberta"):
            positions_BP = jnp.broadcast_to(jnp.arange(MASKED, dtype=jnp.int32) * 3, (ids_BL.shape[0], MASKED))
            logits = model(ids_BL, masked_positions_BP=positions_BP, dropout_key=key)
        else:
            logits = model(ids_BL, dropout_key=key)
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1))
    return loss


def compile_seconds(config, execution, batch, seq, dtype):
    graphdef, params = abstract_model(config, dtype, execution=execution)
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    start = time.perf_counter()
    lowered = jax.jit(jax.value_and_grad(loss_fn(graphdef, config))).lower(params, ids, key)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    return {"lower_s": round(lowered_at - start, 2), "compile_s": round(done - lowered_at, 2),
            "hlo_chars": len(compiled.as_text() or "")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["roberta-base", "gpt2"], help="create_config.py presets")
    p.add_argument("--layers", type=int, help="layers of each model (default: the preset's)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--remat_policy", choices=REMAT_POLICIES, default="none", help="applied to both runs")
    a = p.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)  # time the compiler, not a cache hit
    results = {"device": jax.devices()[0].device_kind, "batch": a.batch, "seq": a.seq, "dtype": a.dtype,
               "remat_policy": a.remat_policy}
    for name in a.models:
        config = build_config(name)
        if a.layers:
            config.num_hidden_layers = a.layers  # gpt2's n_layer too (transformers' attribute_map)
        for scan in (False, True):
            r = compile_seconds(config, Execution(scan=scan, remat=a.remat_policy), a.batch, a.seq, a.dtype)
            label = "scan" if scan else "loop"
            results[f"{name} {label}"] = r
            print(f"{name} ({config.num_hidden_layers} layers) {label}: lower {r['lower_s']} s, compile "
                  f"{r['compile_s']} s, {r['hlo_chars']:,} HLO chars", flush=True)
        loop, scan = results[f"{name} loop"], results[f"{name} scan"]
        print(f"{name}: scan compiles {loop['compile_s'] / scan['compile_s']:.1f}x faster", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
