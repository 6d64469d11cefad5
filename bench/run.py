#!/usr/bin/env python
"""Time flaxlm's real train step per objective (masked LM, T5 span corruption, causal LM): one table each.

    python bench/run.py                                        # cpu suite: the "small" shape, fp32
    python bench/run.py --reference /tmp/hfref/bin/python      # + ../shared/bench/hf_reference.py, ratios
    python bench/run.py --suite gpu                            # the issues' bf16 targets: every task at dropout 0 and
                                                               # at its config's, vs transformers (torch.compile) and,
                                                               # for GPT-2, nanoGPT's model (torch.compile)
    python bench/run.py --suite gpu --no-torch_compile         # the transformers side eager
    python bench/run.py --suite gpu --tasks clm --dropout 0 --profile /tmp/prof   # + where a step's time goes
    python bench/run.py --suite gpu --tasks llama --batch 8    # Llama 3.2 1B's shape at seq 4096, 8 rows
    python bench/run.py --suite tiny --tasks clm --profile /tmp/prof --reference none   # the profile table on CPU
    python bench/run.py --suite gpu --memory_only --tasks mlm  # compile only: roberta-base batch 256 memory
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/run.py --suite gpu --memory_only --tasks mlm
                                                               # the same per device of 8 (a TPUv3-8: 32 rows each)
    python bench/run.py --tasks t5 --steps 20 --json /tmp/bench.json
    python bench/run.py --rows mixture --reference none        # host share reading a 3-source prepared mixture
    python bench/run.py --tasks clm --rounds 3                 # ours and the reference 3 times in turn: medians
    python bench/run.py --scan_layers --remat_policy dots_saveable   # speed switches (flaxlm.models execution)
    XLA_FLAGS=--xla_force_host_platform_device_count=32 python bench/run.py --suite gpu --memory_only --tasks clm \
        --preset mistral-7b --seq 2048 --sharding fsdp --scan_layers --remat_policy full   # a memory plan
    python bench/run.py --suite gpu --compile_for v5e-32 --tasks clm --preset mistral-7b --sharding fsdp \
        --scan_layers --remat_policy full     # the same plan from the TPU compiler (libtpu), per device of a v5e-32

Suites and targets: bench/setups.py. Per objective and config it reports the step time (median over the
timed steps, run as the training loop runs them: each step dispatched before the previous one is read, so
the host's work overlaps the device's), tokens/s (batch x input length), MFU (the objective's analytic
FLOPs / the device peak of flaxlm.training.flops.device_peak_flops, its source shown), peak device memory
(memory_stats()["peak_bytes_in_use"] where the device has it, else the compiled step's memory_analysis():
arguments + outputs + temporaries - aliased, the compiler's estimate) and the host's time per step (random
rows -> objective.collate -> reshape -> meshlib.to_device_batch; with --rows prepared / mixture the rows are
first read from memory-mapped uint16 shards by the loop's own ShuffledRows / MixedRows), in ms and as a share of
the step.
--memory_only compiles from abstract inputs (jax.ShapeDtypeStruct) and runs nothing; --compile_for SLICE does that
for every device of a TPU slice with the TPU compiler (flaxlm.planning.tpu_slices; needs libtpu), whose figures are
what the TPU will hold (a step too big for HBM is the compiler's error, reported as such). The CPU compiler's
estimate is above an accelerator's: XLA:CPU keeps float32 copies of bfloat16 activations, and without
--scan_layers its figure does not shrink with --remat_policy (its schedule keeps every layer's residuals
live); with both it does: roberta-base, batch 256 on one device, fp32, --scan_layers --remat_policy full:
1.39 GiB of state + 6.08 GiB of temporaries (loop, no remat, extrapolated from batch 32/64: ~32 GiB).
The step is the training loop's (flaxlm.training.train_step: BatchLayout, initial_state, compile_train_step),
with AdamW.

References, in the same command (--reference PYTHON; default: the cpu suite uses /tmp/hfref/bin/python
when it exists, the gpu suite this interpreter, tiny none): cpu runs ../shared/bench/hf_reference.py
(transformers<5 Flax and PyTorch, fp32; its T5 target is 26 tokens where ours is 29), gpu runs
bench/torch_reference.py (transformers PyTorch, bf16 autocast; under torch.compile unless --no-torch_compile)
on the same configs and, for the GPT-2 task, bench/nanogpt_reference.py (nanoGPT's GPT-2 under torch.compile,
flash attention; --compare picks). Ratios are our tokens/s over theirs. The gpu suite runs each row in its own
process (so peak memory is that row's, and the torch side has the whole device). --json PATH writes every
figure (after each row, so a run cut short keeps what it measured).

Dropout (--dropout; the gpu suite: both): each task at dropout 0 ("<task>-dropout0" in the JSON: every rate 0,
as llm.c and nanoGPT pretrain) and at its config's rates ("<task>"); one row where the config's are all 0.
--reference_dropout 0 runs the references beside the dropout-0 rows only (a shorter session).
Out of memory: with --halve_on_oom (the default) a row that runs out of device memory runs again at half the
batch, in a fresh process, until it fits ("batch_halved_from" in the JSON); on a GPU the row also reports
"largest_batch_estimate", the batch that the compiled step's memory analysis (state + temporaries per row)
says fills the device. --profile DIR traces --profile_steps steps after the timed ones with jax.profiler and
prints where a step's time goes (bench/profile_step.py: attention, matmuls, LM head and loss, optimizer,
elementwise, the host), also into the JSON.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from bench.row_sources import ROWS, row_source  # noqa: E402
from bench.setups import (MEAN_SPAN, NOISE_DENSITY, OBJECTIVES, REFERENCE_TASK, SUITES, describe,  # noqa: E402
                          describe_dropout, dropout_rates, hf_config, row_targets, without_dropout)
from flaxlm.training import mesh as meshlib  # noqa: E402
from flaxlm.config.options import ATTENTION_IMPLEMENTATIONS, REMAT_POLICIES  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402
from flaxlm.models import count_params, create_model, split_model  # noqa: E402
from flaxlm.models.layer_stack import Execution  # noqa: E402
from flaxlm.models.presets import build_config  # noqa: E402
from flaxlm.platform import building_for  # noqa: E402
from flaxlm.planning.compile_for import DoesNotFit, compile_timed  # noqa: E402
from flaxlm.training.train_step import BatchLayout, compile_train_step, initial_state  # noqa: E402

HF_REFERENCE = os.path.join(ROOT, "..", "shared", "bench", "hf_reference.py")
TORCH_REFERENCE = os.path.join(ROOT, "bench", "torch_reference.py")
NANOGPT_REFERENCE = os.path.join(ROOT, "bench", "nanogpt_reference.py")
COMPARE = ("transformers", "nanogpt")  # the gpu suite's references: bench/torch_reference.py, nanogpt_reference.py
HF_REFERENCE_PYTHON = "/tmp/hfref/bin/python"  # the environment hf_reference.py's docstring sets up
GIB = 2 ** 30


def layer_execution(a):
    """How the model's layers run, from --scan_layers, --remat_policy and --attention_implementation."""
    return Execution(scan=a.scan_layers, remat=a.remat_policy, attention=a.attention_implementation)


def setup_config(task, c):
    """The transformers config of setup c: its preset's or bench/setups.hf_config's, every dropout rate 0 when
    c["dropout"] is "0"."""
    if c.get("preset"):
        config = build_config(c["preset"])
        return without_dropout(config) if c.get("dropout") == "0" else config
    return hf_config(task, c)


def row_key(task, dropout):
    """The row's name in the JSON: the task at its config's dropout, "<task>-dropout0" at dropout 0."""
    return task if dropout == "config" else f"{task}-dropout0"


def row_dropouts(a, task, c):
    """The dropout settings task runs at: --dropout's, both ("0" first) collapsing to one row when the
    config's rates are all 0 already."""
    if a.dropout != "both":
        return [a.dropout]
    return ["0", "config"] if any(dropout_rates(setup_config(task, c)).values()) else ["config"]


def is_out_of_memory(e):
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def build_objective(task, c, dtype, execution, abstract, head_chunk_rows=None):
    """(params, Objective, raw row length) of the training objective for setup c; abstract: parameters as
    jax.ShapeDtypeStruct, nothing allocated."""
    from flax import nnx
    config = setup_config(task, c)

    def model():
        return create_model(config, dtype=dtype, seed=0, execution=execution)
    graphdef, params = split_model(nnx.eval_shape(model) if abstract else model())
    if task == "mlm":
        from flaxlm.objectives.mlm import mlm_objective
        from flaxlm.data.mlm_masking import MLMMasker
        masker = MLMMasker(seq_len=c["seq"], vocab_size=c["vocab"], mask_token_id=4, pad_token_id=1,
                           special_token_ids=[0, 1, 2, 3, 4], mlm_probability=0.15)
        return params, mlm_objective(graphdef, config, masker, c["seq"], head_chunk_rows), c["seq"]
    if task == "t5":
        from flaxlm.data.span_corruption import SpanCorruptor
        from flaxlm.objectives.span_lm import span_objective
        corruptor = SpanCorruptor(inputs_length=c["seq"], noise_density=NOISE_DENSITY,
                                  mean_noise_span_length=MEAN_SPAN, eos_token_id=1, pad_token_id=0,
                                  first_sentinel_id=c["vocab"] - 1)
        return params, span_objective(graphdef, config, corruptor, head_chunk_rows), corruptor.raw_length
    from flaxlm.objectives.clm import clm_objective
    return params, clm_objective(graphdef, config, params, c["seq"], pad_id=0, head_chunk_rows=head_chunk_rows), c["seq"]


def compile_step(task, c, a):
    """The train step for setup c, compiled from abstract inputs as the training loop runs it: a namespace
    with compiled, compile_s, params, objective, chunks, mesh, tx, data (the batch sharding), key and
    host_batch(i) (what the loop does on the host for step i)."""
    from flaxlm.training.sharding import state_shardings
    params, objective, row_len = build_objective(task, c, a.dtype, layer_execution(a), a.memory_only,
                                                 a.lm_head_chunk_rows)
    mesh = meshlib.make_mesh(a.target.devices if a.target else None)
    if c["batch"] % mesh.size:
        raise UserError(f"batch {c['batch']} does not divide over {mesh.size} devices; run on fewer devices")
    layout = BatchLayout.plan(c["batch"], 1, mesh, objective.tokens_per_example, a.cpu_chunk_tokens)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    if a.param_dtype != "float32":
        params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, a.param_dtype), params)
    state_shapes = jax.eval_shape(lambda p: initial_state(p, tx, mesh, a.sharding)[0], params)
    shardings = state_shardings(state_shapes, mesh, a.sharding)
    step = compile_train_step(objective.loss_sums, tx, layout, shardings, donate=not a.no_donate)
    ids = np.random.default_rng(0).integers(5, c["vocab"] - 100, size=(c["batch"], row_len)).astype(np.int32)
    rows_dir = tempfile.TemporaryDirectory(prefix="bench-rows-")  # kept alive by the namespace returned
    rows = row_source(a.rows, c["vocab"], row_len, c["batch"], rows_dir.name)

    def host_batch(i):
        rows_BL = ids if rows is None else rows.batch_rows(i, slice(None))
        return layout.pieces(objective.collate(rows_BL, np.random.default_rng(i)))

    key = jax.random.PRNGKey(0)
    t = time.perf_counter()
    batch_shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in host_batch(0).items()}
    lowered = step.lower(state_shapes, batch_shapes, key)
    compiled = compile_timed(lowered)[0] if a.target else lowered.compile()
    return SimpleNamespace(compiled=compiled, compile_s=round(time.perf_counter() - t, 2), params=params,
                           objective=objective, chunks=layout.chunks, mesh=mesh, tx=tx, data=layout.sharding, key=key,
                           host_batch=host_batch, rows_dir=rows_dir,
                           state_bytes=per_device_state_bytes(state_shapes, shardings))


def per_device_state_bytes(state_shapes, shardings):
    """{"params", "optimizer"}: the bytes one device holds of the train state's parameters and optimizer state."""
    def held(tree, tree_shardings):
        return int(sum(np.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
                       for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(tree_shardings))))
    return {"params": held(state_shapes["params"], shardings["params"]),
            "optimizer": held(state_shapes["opt_state"], shardings["opt_state"])}


def bench_task(task, c, a):
    """Compile the train step for setup c (from abstract inputs) and, unless --memory_only, time a.steps steps
    after two warm-up steps. Returns the figures as a dict."""
    from flaxlm.training.flops import mesh_peak_flops
    if a.target:  # traced as for a TPU, compiled by libtpu; a step too big for its HBM is the compiler's error
        try:
            with building_for("tpu", a.target.generation.kind):
                built = compile_step(task, c, a)
        except DoesNotFit as e:
            return {"error": f"does not fit {a.target.name}: the TPU compiler says \"{e}\""}
    else:
        built = compile_step(task, c, a)
    compiled, params, objective, chunks, mesh, tx, data, key, host_batch = (
        built.compiled, built.params, built.objective, built.chunks, built.mesh, built.tx, built.data, built.key,
        built.host_batch)
    mem = compiled.memory_analysis()
    parts = {} if mem is None else {"arguments": mem.argument_size_in_bytes, "outputs": mem.output_size_in_bytes,
                                     "temp": mem.temp_size_in_bytes, "aliased": mem.alias_size_in_bytes}
    estimate = parts["arguments"] + parts["outputs"] + parts["temp"] - parts["aliased"] if parts else None
    rates = dropout_rates(setup_config(task, c))
    r = {"config": c["name"], "task": task, "dropout": c.get("dropout", "config"), "dropout_rates": rates,
         "dropout_label": describe_dropout(c, rates),
         "dtype": a.dtype, "device": mesh.devices.flat[0].device_kind, "devices": mesh.size,
         "sharding": a.sharding, "param_dtype": a.param_dtype, "rows": a.rows,
         "state_bytes_per_device": built.state_bytes,
         "params": count_params(params), "batch": c["batch"], "tokens_per_example": objective.tokens_per_example,
         "chunks": chunks, "compile_s": built.compile_s, "memory_estimate_bytes": estimate,
         "memory_estimate_parts": parts, "memory_bytes": estimate,
         "memory_source": "compiler's estimate (memory_analysis: args + outputs + temp - aliased)"}
    if a.target:
        r.update(memory_source="the TPU compiler's memory_analysis (args + outputs + temp - aliased)",
                 hbm_bytes=a.target.hbm_bytes, slice=a.target.name)
    print(f"{task}: compiled in {r['compile_s']} s" + ("" if a.memory_only else f"; timing {a.steps} steps"),
          flush=True)
    if task == "t5":
        r["target_length"] = objective.collate.targets_length
    if a.memory_only:
        return r

    state, _ = initial_state(params, tx, mesh, "data")
    host_s = []

    def one(i):
        nonlocal state
        t = time.perf_counter()
        batch = meshlib.to_device_batch(host_batch(i), data)
        host_s.append(time.perf_counter() - t)
        state, metrics = compiled(state, batch, jax.random.fold_in(key, i))
        return metrics

    for i in range(2):  # warm up
        jax.block_until_ready(one(i))
    host_s.clear()
    done, previous = [time.perf_counter()], None
    for i in range(2, 2 + a.steps):  # as the loop: step i is dispatched before step i-1 is read
        if a.sync_every_step and previous is not None:  # the switch: wait for each step before the next batch
            jax.block_until_ready(previous)
        metrics = one(i)
        if previous is not None:
            jax.block_until_ready(previous)
            done.append(time.perf_counter())
        previous = metrics
    jax.block_until_ready(previous)
    done.append(time.perf_counter())
    step_s = float(np.median(np.diff(done)))
    peak, peak_source = mesh_peak_flops(mesh, a.dtype, a.peak_flops)
    flops = objective.flops_per_example * c["batch"]
    measured = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
    if all(measured):
        r.update(memory_bytes=max(measured), memory_source="device memory_stats()['peak_bytes_in_use']")
    host_ms = 1000 * float(np.mean(host_s))
    r.update(step_ms=round(1000 * step_s, 2), step_ms_mean=round(1000 * (done[-1] - done[0]) / a.steps, 2),
             tokens_per_s=round(c["batch"] * objective.tokens_per_example / step_s, 1),
             mfu=round(flops / step_s / peak, 4) if peak else None, peak_flops=peak, peak_source=peak_source,
             flops_per_step=flops, host_ms=round(host_ms, 3), host_pct=round(100 * host_ms / 1000 / step_s, 2),
             loss=float(jax.device_get(previous["loss"])), steps=a.steps)
    limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
    if limit and parts and parts["temp"]:  # temporaries grow with the batch; the state does not
        fixed = parts["arguments"] + parts["outputs"] - parts["aliased"]
        r["largest_batch_estimate"] = int((limit - fixed) // (parts["temp"] / c["batch"]))
    if a.profile:
        r["profile"] = profile_steps(os.path.join(a.profile, row_key(task, r["dropout"])), compiled, one,
                                     range(2 + a.steps, 2 + a.steps + a.profile_steps))
    return r


def profile_steps(directory, compiled, one, steps):
    """bench/profile_step.breakdown of the given steps (one(i) dispatches step i) traced into directory, as they
    were timed: each dispatched before the previous one is read; {"error"} where the trace cannot be read."""
    from bench.profile_step import Trace, breakdown
    with Trace(directory) as t:
        for i in steps:
            metrics = one(i)
        jax.block_until_ready(metrics)
    try:  # the timing before stands whatever the trace holds
        return breakdown(t.xplane_path(), compiled.as_text(), len(steps), t.wall_s)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def bench_row(task, c, a):
    """bench_task, with running out of device memory as a result: {"error", "oom": True}."""
    try:
        return bench_task(task, c, a)
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        return {"error": f"out of memory at batch {c['batch']}: {str(e).strip().splitlines()[0][:300]}",
                "oom": True, "batch": c["batch"]}


def bench_in_own_process(task, c, argv):
    """bench_row for setup c in a fresh process (this script with --worker): its peak memory is this row's
    alone, and the device is free again for the reference when it exits."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--tasks", task, "--dropout",
                               c["dropout"], "--batch", str(c["batch"]), "--worker", path])
        if proc.returncode != 0:
            return {"error": f"the benchmark process for {task} exited with {proc.returncode} (output above)"}
        with open(path) as f:
            return json.load(f)[row_key(task, c["dropout"])]


def measure_once(task, c, a, argv):
    """One round of ours for setup c; with --halve_on_oom, again at half the batch while the row runs out of
    device memory (in a fresh process each time, where rows have their own). Returns (figures, the setup run)."""
    halved_from = []
    while True:
        r = bench_in_own_process(task, c, argv) if a.process_per_task and not a.worker else bench_row(task, c, a)
        if not (r.get("oom") and a.halve_on_oom and not a.worker and c["batch"] % 2 == 0):
            break
        print(f"{task}: out of memory at batch {c['batch']}; trying {c['batch'] // 2}", flush=True)
        halved_from.append(c["batch"])
        c = {**c, "batch": c["batch"] // 2}
    if halved_from:
        r["batch_halved_from"] = halved_from
    return r, c


def reference_python(a):
    if a.reference != "auto":
        return None if a.reference == "none" else a.reference
    if a.suite == "gpu":
        return sys.executable
    return HF_REFERENCE_PYTHON if a.suite == "cpu" and os.path.exists(HF_REFERENCE_PYTHON) else None


def run_reference(python, task, c, a):
    """{name: tokens/s or 'error: ...'} from the suite's reference scripts run with `python`: the torch suite's
    (--compare: transformers; nanoGPT for the GPT-2 task) at setup c's batch, length and dropout; else
    ../shared/bench/hf_reference.py."""
    if SUITES[a.suite]["reference"] == "torch":
        if c.get("preset"):
            return {}
        common = ["--suite", a.suite, "--task", task, "--steps", str(a.steps), "--dtype", a.dtype, "--batch",
                  str(c["batch"]), "--seq", str(c["seq"]), "--dropout", c["dropout"]]
        common += ["--compile"] if a.torch_compile else []
        scripts = [s for name, s in (("transformers", TORCH_REFERENCE), ("nanogpt", NANOGPT_REFERENCE))
                   if name in a.compare and (name == "transformers" or task == "clm")]
        out = {}
        for script in scripts:
            out.update(run_reference_command([python, script, *common]))
        return out
    if not os.path.exists(HF_REFERENCE):
        return {"hf_reference.py": f"error: {os.path.normpath(HF_REFERENCE)} not found"}
    cmd = [python, HF_REFERENCE, "--task", REFERENCE_TASK[task], "--steps", str(a.steps)]
    for flag, k in (("--batch", "batch"), ("--seq", "seq"), ("--vocab", "vocab"), ("--hidden", "hidden"),
                    ("--layers", "layers"), ("--heads", "heads"), ("--ff", "ff")):
        cmd += [flag, str(c[k])]
    return run_reference_command(cmd)


def run_reference_command(cmd):
    """{name: tokens/s or 'error: ...'}: the last line of cmd's output, its JSON."""
    print(f"reference: {' '.join(cmd)}", flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    print("\n".join(lines[:-1]), flush=True)
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {os.path.basename(cmd[1]): f"error: exit {out.returncode}: {out.stderr.strip()[-300:]}"}


def measure_rounds(task, c, a, argv, python):
    """Our figures for setup c and, with a reference interpreter, the reference's and the ratios: --rounds
    times, ours then the reference's in turn, so that both sides see the same spells of a noisy machine.
    With several rounds, tokens/s (ours and each reference's) are the medians over the rounds, the ratios
    are those of the medians, MFU is the median step's against the highest peak measured, and r["rounds"]
    keeps every round's figures."""
    rounds = []
    for i in range(a.rounds):
        if a.rounds > 1:
            print(f"{task}: round {i + 1} of {a.rounds}", flush=True)
        r, c = measure_once(task, c, a, argv)
        if "error" in r:
            return r
        if python:
            r["reference"] = run_reference(python, task, c, a)
        rounds.append(r)
    r = dict(rounds[-1])
    if a.rounds > 1:
        r["rounds"] = [{"tokens_per_s": x["tokens_per_s"], "step_ms": x["step_ms"], "reference": x.get("reference", {})}
                       for x in rounds]
        r["tokens_per_s"] = float(np.median([x["tokens_per_s"] for x in rounds]))
        r["step_ms"] = float(np.median([x["step_ms"] for x in rounds]))
        if r["peak_flops"]:  # a measured CPU peak is the best matmul rate seen: a busy moment only lowers it
            r["peak_flops"] = max(x["peak_flops"] for x in rounds)
            r["mfu"] = round(r["flops_per_step"] / (r["step_ms"] / 1000) / r["peak_flops"], 4)
        if python:
            r["reference"] = {}
            for k in rounds[0]["reference"]:
                values = [x["reference"].get(k, "error: missing") for x in rounds]
                errors = [v for v in values if not isinstance(v, (int, float))]
                r["reference"][k] = errors[0] if errors else float(np.median(values))
    if python:
        r["ratios"] = {k: round(r["tokens_per_s"] / v, 3) for k, v in r["reference"].items()
                       if isinstance(v, (int, float)) and v > 0}
    return r


def check_targets(r, targets, dropout0=None):
    """{name: {target, measured, met}} for the row's targets (met None when not measured); dropout0: the same
    task's dropout-0 row, for dropout0_ratio."""
    torch_ratio = next((v for k, v in r.get("ratios", {}).items() if k.startswith("hf-torch")), None)
    nanogpt_ratio = next((v for k, v in r.get("ratios", {}).items() if k.startswith("nanogpt")), None)
    theirs = (dropout0 or {}).get("tokens_per_s")
    measured = {"mfu": r.get("mfu"), "step_s": r["step_ms"] / 1000 if "step_ms" in r else None,
                "ref_ratio": torch_ratio, "nanogpt_ratio": nanogpt_ratio, "tokens_per_s": r.get("tokens_per_s"),
                "dropout0_ratio": round(r["tokens_per_s"] / theirs, 3) if theirs and "tokens_per_s" in r else None,
                "memory_gib": r["memory_bytes"] / GIB if r.get("memory_bytes") else None}
    at_most = ("step_s", "memory_gib")
    return {k: {"target": v, "measured": measured[k],
                "met": None if measured[k] is None else (measured[k] <= v if k in at_most else measured[k] >= v)}
            for k, v in targets.items()}


def print_table(task, c, r):
    def target(name, fmt):
        t = r.get("targets", {}).get(name)
        if not t:
            return ""
        sign = "<=" if name in ("step_s", "memory_gib") else ">="
        return f"target {sign} {fmt(t['target'])}: " + {True: "met", False: "MISSED", None: "not measured"}[t["met"]]

    label = "causal LM" if c.get("preset") else OBJECTIVES[task]
    head = f"{label} | {describe({**c, 'batch': r.get('batch', c['batch'])})}" + (
        f", target {r['target_length']}" if "target_length" in r else "")
    dropout = f" | {r['dropout_label']}" if "dropout_label" in r else ""
    print(f"\n== {head}{dropout} | {r.get('dtype')} | {r.get('device')} x{r.get('devices')} ==")
    if "error" in r:
        print(f"  {r['error']}")
        return
    rows = [("parameters", f"{r['params']:,}", f"compiled in {r['compile_s']} s, {r['chunks']} chunk(s) per device")]
    if "step_ms" in r:
        peak = f"{r['peak_flops']:.3g} FLOP/s" if r["peak_flops"] else "no peak"
        rows += [("step time", f"{r['step_ms']:.1f} ms", target("step_s", lambda v: f"{1000 * v:.0f} ms")),
                 ("tokens/s", f"{r['tokens_per_s']:,.0f}", target("tokens_per_s", lambda v: f"{v:,.0f}")),
                 ("MFU", f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a",
                  target("mfu", lambda v: f"{100 * v:.0f}%")),
                 ("  peak", peak, r["peak_source"]),
                 ("host time/step", f"{r['host_ms']:.2f} ms", f"{r['host_pct']:.1f}% of the step ("
                                                              + ("" if r["rows"] == "memory" else
                                                                 f"reading {r['rows']} rows, ")
                                                              + "collation and transfer)")]
    if "dropout0_ratio" in r.get("targets", {}):
        t = r["targets"]["dropout0_ratio"]
        rows.append(("vs dropout 0", f"{t['measured']:.3f}x" if t["measured"] else "n/a",
                     "this row's tokens/s over the dropout-0 row's  " + target("dropout0_ratio", lambda v: f"{v}x")))
    if "batch_halved_from" in r:
        rows.append(("batch", f"{r['batch']}", f"out of memory at {', '.join(map(str, r['batch_halved_from']))}"))
    if "largest_batch_estimate" in r:
        rows.append(("largest batch (est.)", f"{r['largest_batch_estimate']}",
                     "device memory over (state + temporaries per row), from the compiler's memory analysis"))
    rows.append(("memory", f"{r['memory_bytes'] / GIB:.3f} GiB" if r["memory_bytes"] else "n/a",
                 f"{r['memory_source']}  {target('memory_gib', lambda v: f'{v} GiB')}".strip()))
    if r.get("hbm_bytes"):
        rows.append((f"HBM per device", f"{r['hbm_bytes'] / GIB:.2f} GiB",
                     f"{r['slice']}: headroom {(r['hbm_bytes'] - r['memory_bytes']) / GIB:.2f} GiB"))
    if "memory_analysis" in r["memory_source"]:
        rows.append(("  estimate parts", "", ", ".join(f"{k} {v / GIB:.3f}" for k, v in
                                                     r["memory_estimate_parts"].items()) + " GiB"))
    held = r["state_bytes_per_device"]
    rows.append(("per device", f"{held['params'] / GIB:.3f} GiB", f"parameters ({r['param_dtype']}, --sharding "
                                                                  f"{r['sharding']}); optimizer state "
                                                                  f"{held['optimizer'] / GIB:.3f} GiB; activations "
                                                                  f"and temporaries "
                                                                  f"{r['memory_estimate_parts'].get('temp', 0) / GIB:.3f}"
                                                                  f" GiB (compiler)"))
    if "rounds" in r:
        rows.append(("rounds", f"{len(r['rounds'])}", "tokens/s and ratios: medians over the rounds"))
        for i, x in enumerate(r["rounds"]):
            refs = ", ".join(f"{k} {v:,.0f}" for k, v in x["reference"].items() if isinstance(v, (int, float)))
            rows.append((f"  round {i + 1}", f"{x['tokens_per_s']:,.0f}", refs))
    for name, value in r.get("reference", {}).items():
        ratio = r["ratios"].get(name)
        shown = f"{value:,.0f} tokens/s" if isinstance(value, (int, float)) else str(value)[:100]
        note = f"ours {ratio:.2f}x" if ratio else ""
        if ratio and name.startswith("hf-torch"):
            note += "  " + target("ref_ratio", lambda v: f"{v}x")
        if ratio and name.startswith("nanogpt"):
            note += "  " + target("nanogpt_ratio", lambda v: f"{v}x")
        rows.append((name, shown, note))
    for name, value, note in rows:
        print(f"  {name:<24} {value:>18}   {note}".rstrip())
    if "profile" in r:
        from bench.profile_step import format_breakdown
        print(f"  profile: {r['profile']['error']}" if "error" in r["profile"] else format_breakdown(r["profile"]))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), default="cpu")
    p.add_argument("--tasks", nargs="+", choices=list(OBJECTIVES),
                   help="the suite's tasks to run (default: the suite's default_tasks; llama: gpu and tiny)")
    p.add_argument("--dropout", choices=["config", "0", "both"],
                   help="the config's dropout rates, all 0, or a row of each (default: the suite's: gpu both)")
    p.add_argument("--steps", type=int, help="timed steps after two warm-up steps (default: the suite's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute dtype (default: the suite's)")
    p.add_argument("--cpu_chunk_tokens", type=int,
                   help="on CPU, run each device's batch through the model in chunks of at least this many "
                        "tokens, as training does (0: off; default: the suite's)")
    p.add_argument("--peak_flops", type=float, help="device peak FLOP/s for MFU (default: flaxlm.training.flops)")
    p.add_argument("--reference", default="auto", metavar="PYTHON",
                   help="interpreter for the suite's reference script, run in this command; 'none' to skip")
    p.add_argument("--torch_compile", action=argparse.BooleanOptionalAction,
                   help="gpu suite: torch.compile the transformers reference (default: on for the gpu suite)")
    p.add_argument("--compare", nargs="+", choices=COMPARE, default=list(COMPARE),
                   help="gpu suite: the references run beside ours (nanogpt: the GPT-2 task only)")
    p.add_argument("--reference_dropout", choices=["0", "config", "both"], default="both",
                   help="the rows the references run beside: the dropout-0 ones, the config-dropout ones, or all")
    p.add_argument("--profile", metavar="DIR",
                   help="after timing, trace --profile_steps steps into DIR/<row> and print where the time goes")
    p.add_argument("--profile_steps", type=int, default=3, help="steps traced with --profile")
    p.add_argument("--halve_on_oom", action=argparse.BooleanOptionalAction, default=True,
                   help="run a row that runs out of device memory again at half the batch")
    p.add_argument("--memory_only", action="store_true",
                   help="only compile each step from abstract inputs and report the compiler's memory estimate")
    p.add_argument("--compile_for", metavar="SLICE",
                   help="--memory_only for a TPU slice (v5e-8, v4-32, ...): compiled by the TPU compiler for every "
                        "device of the slice, on this host (needs libtpu)")
    p.add_argument("--process_per_task", action=argparse.BooleanOptionalAction,
                   help="run each objective in its own process (default: on for the gpu suite)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure ours and the reference this many times in turn; report the medians")
    p.add_argument("--json", metavar="PATH", help="write every result here")
    p.add_argument("--scan_layers", action="store_true", help="run identical layers under jax.lax.scan")
    p.add_argument("--remat_policy", choices=REMAT_POLICIES, default="none", help="jax.checkpoint policy per layer")
    p.add_argument("--attention_implementation", choices=ATTENTION_IMPLEMENTATIONS, default="auto",
                   help="jax.nn.dot_product_attention implementation (cudnn: NVIDIA GPUs, bf16/fp16)")
    p.add_argument("--lm_head_chunk_rows", type=int,
                   help="rows per device whose LM-head logits are computed at a time (default: flaxlm.objectives.lm_loss's; 0: all)")
    p.add_argument("--no_donate", action="store_true", help="do not donate the train state's buffers to the step")
    p.add_argument("--sync_every_step", action="store_true",
                   help="wait for each step before preparing the next batch (turns off the host/device overlap)")
    p.add_argument("--preset", help="clm: a create_config.py preset (mistral-7b, gemma-2-9b, ...) instead of the "
                                    "suite's GPT-2 shape")
    p.add_argument("--seq", type=int, help="tokens per row (default: the suite's; 2048 with --preset)")
    p.add_argument("--batch", type=int, help="global batch in rows (default: the suite's; one row per device with "
                                             "--preset)")
    p.add_argument("--sharding", choices=["data", "fsdp"], default="data", help="where the train state lives")
    p.add_argument("--param_dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--rows", choices=ROWS, default="memory",
                   help="where the host reads each step's rows: one array in memory, a prepared directory's "
                        "memory-mapped shard, or a 3-source mixture of them (bench/row_sources.py)")
    p.add_argument("--worker", metavar="PATH", help=argparse.SUPPRESS)  # bench_in_own_process's child
    a = p.parse_args(argv)
    a.target = None
    if a.compile_for:
        from flaxlm.planning.tpu_slices import tpu_slice
        a.target, a.memory_only = tpu_slice(a.compile_for), True
    suite = SUITES[a.suite]
    if a.tasks and set(a.tasks) - set(suite["tasks"]):
        raise UserError(f"--tasks {' '.join(sorted(set(a.tasks) - set(suite['tasks'])))}: not in the {a.suite} "
                        f"suite, whose tasks are {', '.join(suite['tasks'])}")
    tasks_given, a.tasks = a.tasks, a.tasks or suite["default_tasks"]
    if a.preset:
        if tasks_given != ["clm"]:
            raise UserError("--preset names a causal LM; add --tasks clm")
        config = build_config(a.preset)
        suite = SUITES[a.suite] = {**suite, "tasks": {**suite["tasks"], "clm": dict(
            name=a.preset, preset=a.preset, vocab=config.vocab_size, hidden=config.hidden_size,
            layers=config.num_hidden_layers, heads=config.num_attention_heads, ff=config.intermediate_size,
            seq=a.seq or 2048, batch=a.batch or (a.target.num_devices if a.target else jax.device_count()))}}
    elif a.seq or a.batch:
        for task in a.tasks:
            suite["tasks"][task] = {**suite["tasks"][task], **({"seq": a.seq} if a.seq else {}),
                                    **({"batch": a.batch} if a.batch else {})}
    a.dropout = a.dropout or suite["dropout"]
    a.torch_compile = a.suite == "gpu" if a.torch_compile is None else a.torch_compile
    a.steps = suite["steps"] if a.steps is None else a.steps
    a.dtype = a.dtype or suite["dtype"]
    a.cpu_chunk_tokens = suite["cpu_chunk_tokens"] if a.cpu_chunk_tokens is None else a.cpu_chunk_tokens
    if a.worker:
        a.rounds = 1  # the parent runs the rounds
    if a.process_per_task is None:
        a.process_per_task = a.suite == "gpu" and not a.memory_only
    if a.steps < 1:
        raise UserError(f"--steps {a.steps}: time at least 1 step")
    if a.profile and a.memory_only:
        raise UserError("--profile traces steps that --memory_only does not run; drop one of them")
    if a.rounds < 1 or (a.rounds > 1 and a.memory_only):
        raise UserError(f"--rounds {a.rounds}: use at least 1 (and 1 with --memory_only, which times nothing)")
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    suite = SUITES[a.suite]
    python = None if a.worker or a.memory_only else reference_python(a)
    out = {"suite": a.suite, "dtype": a.dtype, "memory_only": a.memory_only, "reference_python": python,
           "dropout": a.dropout, "torch_compile": a.torch_compile if python else None,
           "compare": a.compare if python and suite["reference"] == "torch" else None,
           "reference_dropout": a.reference_dropout if python else None,
           "execution": {"scan": a.scan_layers, "remat": a.remat_policy, "attention": a.attention_implementation,
                         "lm_head_chunk_rows": a.lm_head_chunk_rows, "donate": not a.no_donate,
                         "overlap": not a.sync_every_step},
           "tasks": {}}
    for task in a.tasks:
        for dropout in row_dropouts(a, task, suite["tasks"][task]):
            c = {**suite["tasks"][task], "dropout": dropout}
            r = measure_rounds(task, c, a, argv, python if a.reference_dropout in ("both", dropout) else None)
            r["targets"] = ({} if "error" in r else
                            check_targets(r, row_targets(c), out["tasks"].get(row_key(task, "0"))))
            out["tasks"][row_key(task, dropout)] = r
            if not a.worker:
                print_table(task, c, r)
                sys.stdout.flush()
                if a.json:  # after each row: a run cut short keeps what it measured
                    with open(a.json, "w") as f:
                        json.dump(out, f, indent=1)
    if a.worker:
        with open(a.worker, "w") as f:
            json.dump(out["tasks"], f)
    elif a.json:
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    run_main(main)
