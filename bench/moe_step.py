"""What a mixture-of-experts train step costs on this machine, against the two steps it sits between: a dense
model with the same active parameters (Qwen3 whose MLP is as wide as the k routed experts together) and the same
MoE computing every expert on every token (flaxlm.models.moe.dense_swiglu, the unrouted outputs weighted 0).

    python bench/moe_step.py                      # 4 layers of width 256, 8 experts of width 256, 2 per token
    python bench/moe_step.py --experts 32 --top_k 4

Each step is jax.value_and_grad of run_clm_flax.py's objective (flaxlm.objectives.clm) on the same batch, jitted;
the three run in turn for --rounds rounds (the machine is shared: side by side) and the median of each is printed
with its ratio to the dense step. The MoE's count of FLOPs is its active experts' (flaxlm.training.flops).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from flaxlm import models  # noqa: E402
from flaxlm.models import moe  # noqa: E402
from flaxlm.objectives.clm import clm_objective  # noqa: E402


def configs(args):
    """(moe config, dense config): Qwen3-MoE and Qwen3 of the same attention; the dense MLP k experts wide."""
    import transformers
    shape = dict(vocab_size=args.vocab, hidden_size=args.width, num_hidden_layers=args.layers,
                 num_attention_heads=args.width // 64, num_key_value_heads=max(1, args.width // 128), head_dim=64,
                 max_position_embeddings=args.length, tie_word_embeddings=False)
    moe_config = transformers.Qwen3MoeConfig(**shape, num_experts=args.experts, num_experts_per_tok=args.top_k,
                                             moe_intermediate_size=args.expert_width, norm_topk_prob=True)
    dense_config = transformers.Qwen3Config(**shape, intermediate_size=args.top_k * args.expert_width)
    return moe_config, dense_config


def step_fn(config, batch_rows):
    """A jitted (params -> (loss sum, grads)) of config's model on batch_rows, and the params."""
    graphdef, params = models.split_model(models.create_model(config, seed=0))
    objective = clm_objective(graphdef, config, params, batch_rows.shape[1], 0)
    batch = objective.collate(batch_rows)
    grad = jax.jit(jax.value_and_grad(lambda p: objective.loss_sums(p, batch, None)["loss_sum"]))
    return grad, params


def timed(fn, params):
    start = time.perf_counter()
    jax.block_until_ready(fn(params))
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top_k", type=int, default=2)
    parser.add_argument("--expert_width", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per kind and round")
    args = parser.parse_args(argv)
    moe_config, dense_config = configs(args)
    rows = np.random.default_rng(0).integers(1, args.vocab, (args.batch, args.length)).astype(np.int32)
    kinds = {"dense, same active parameters": step_fn(dense_config, rows),
             "MoE, routed (ragged_dot)": step_fn(moe_config, rows)}
    for fn, params in kinds.values():
        jax.block_until_ready(fn(params))  # traced and compiled before any timing
    grouped = moe.grouped_swiglu
    moe.grouped_swiglu = moe.dense_swiglu  # while this one is traced: every expert on every token
    try:
        kinds["MoE, every expert on every token"] = step_fn(moe_config, rows)
        fn, params = kinds["MoE, every expert on every token"]
        jax.block_until_ready(fn(params))
    finally:
        moe.grouped_swiglu = grouped
    times = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind, (fn, params) in kinds.items():
            times[kind] += [timed(fn, params) for _ in range(args.steps)]
    dense_ms = statistics.median(times["dense, same active parameters"]) * 1e3
    print(f"{args.layers} layers of width {args.width}; {args.experts} experts of width {args.expert_width}, "
          f"{args.top_k} per token (dense MLP width {args.top_k * args.expert_width}); batch {args.batch} x "
          f"{args.length} tokens; {jax.devices()[0].device_kind}, median of {args.rounds * args.steps} steps")
    print("| step | ms | / dense |\n|---|---|---|")
    for kind, seconds in times.items():
        ms = statistics.median(seconds) * 1e3
        print(f"| {kind} | {ms:.1f} | {ms / dense_ms:.2f} |")


if __name__ == "__main__":
    main()
