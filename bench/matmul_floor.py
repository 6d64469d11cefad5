#!/usr/bin/env python
"""How far the train step is above its own matmuls: every matmul of the compiled step timed alone.

    python bench/matmul_floor.py --tasks clm --rounds 6     # bench/run.py's flags (suite, steps, ...) work

Compiles the step as bench/run.py does, lists the matmuls of its compiled program with how often one step
runs each (bench/hlo_dots.py), and times each distinct one alone (same shapes, dimension numbers and types,
random row-major inputs). Then, round by round, it times a few steps and the matmuls' sum in turn, so that
both see the same spell of a noisy machine. The sum is the step's floor with these matmul kernels: the
step cannot run faster unless its matmuls do. Reports the step, the floor, their ratio (the median over
the rounds) and the floor's parts: FLOPs and GFLOP/s per matmul, the batched ones (attention) apart.
With several devices the matmuls are one device's program (each device runs its own copy).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench.hlo_dots import dots_per_run  # noqa: E402
from bench.run import compile_step, parse_args  # noqa: E402
from bench.setups import OBJECTIVES, SUITES, describe  # noqa: E402
from flaxlm.training import mesh as meshlib  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402
from flaxlm.training.train_step import initial_state  # noqa: E402

DTYPES = {"f32": np.float32, "bf16": jax.numpy.bfloat16, "f16": np.float16, "f64": np.float64}


def median_s(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def timed_dots(dots, seed=0):
    """For each Dot: a no-argument function that runs it alone on fixed random inputs (compiled, warmed up)."""
    rng = np.random.default_rng(seed)
    runs = []
    for d in dots:
        if d.dtype not in DTYPES or d.out_dtype not in DTYPES:
            raise UserError(f"matmul of {d.dtype} x {d.dtype} -> {d.out_dtype}: not timed here; use float32 or "
                            f"bfloat16")
        lhs, rhs = (jax.device_put(rng.standard_normal(s).astype(DTYPES[d.dtype])) for s in (d.lhs, d.rhs))
        fn = jax.jit(lambda a, b, d=d: jax.lax.dot_general(a, b, d.dimension_numbers,
                                                           preferred_element_type=DTYPES[d.out_dtype]))
        jax.block_until_ready(fn(lhs, rhs))
        runs.append(lambda fn=fn, lhs=lhs, rhs=rhs: fn(lhs, rhs))
    return runs


def floor_s(dots, runs, repeats=5):
    """(the matmuls' time per step, each alone: sum of count x median, and the same per dot)."""
    each = [d.count * median_s(run, repeats) for d, run in zip(dots, runs)]
    return sum(each), each


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    rounds, steps = a.rounds, max(1, min(a.steps, 4))
    for task in a.tasks:
        c = SUITES[a.suite]["tasks"][task]
        built = compile_step(task, c, a)
        dots, unknown = dots_per_run(built.compiled.as_text())
        if unknown:
            print(f"note: {len(unknown)} loop(s) without a known trip count, counted once: {', '.join(unknown)}")
        runs = timed_dots(dots)
        state, _ = initial_state(built.params, built.tx, built.mesh, "data")
        batch = meshlib.to_device_batch(built.host_batch(0), built.data)

        def step():
            nonlocal state
            state, metrics = built.compiled(state, batch, built.key)
            return metrics
        for _ in range(2):
            jax.block_until_ready(step())
        print(f"\n== {OBJECTIVES[task]} | {describe(c)} | {a.dtype} | {jax.devices()[0].platform} x{built.mesh.size} ==")
        ratios, per_dot = [], np.zeros(len(dots))
        for r in range(rounds):
            step_s = median_s(step, steps)
            total, each = floor_s(dots, runs)
            per_dot += np.array(each) / rounds
            ratios.append(step_s / total)
            print(f"  round {r + 1}: step {1000 * step_s:8.1f} ms   matmuls alone {1000 * total:8.1f} ms   "
                  f"step / matmuls {step_s / total:.3f}", flush=True)
        flops = sum(d.flops * d.count for d in dots)
        print(f"  step / matmuls alone: {np.median(ratios):.3f} (median over {rounds} round(s))")
        print(f"  {len(dots)} distinct matmuls, {sum(d.count for d in dots)} per step, {flops / 1e9:.2f} GFLOP; "
              f"alone {1000 * per_dot.sum():.1f} ms ({flops / per_dot.sum() / 1e9:.0f} GFLOP/s)")
        batched = [i for i, d in enumerate(dots) if d.dimension_numbers[1][0]]
        if batched:
            bf = sum(dots[i].flops * dots[i].count for i in batched)
            bt = per_dot[batched].sum()
            print(f"    batched (attention): {bf / 1e9:.2f} GFLOP in {1000 * bt:.1f} ms ({bf / bt / 1e9:.0f} GFLOP/s)")
        print(f"  {'per step':>8}  {'GFLOP':>7}  {'ms alone':>8}  {'GFLOP/s':>7}  lhs x rhs, dimension numbers")
        for d, t in zip(dots, per_dot):
            print(f"  {d.count:8d}  {d.flops * d.count / 1e9:7.2f}  {1000 * t:8.2f}  {d.flops * d.count / t / 1e9:7.0f}"
                  f"  {list(d.lhs)} x {list(d.rhs)}, {d.dimension_numbers}")


if __name__ == "__main__":
    run_main(main)
