"""--compile_for SLICE: a run's train and eval steps compiled for a TPU slice on any host, and whether they fit.

    start_run(args, model_args)               # with --compile_for: nothing written, no host joined
    target = compile_target(args)             # the Slice (flaxlm.planning.tpu_slices)
    config, model = load_model(..., abstract=True)          # shapes only: no weights read
    mesh = meshlib.make_mesh(target.devices)
    check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch,
              token_rows(seq_len, tokenizer))

The steps are the training loop's own (flaxlm.training.train_step, flaxlm.training.evaluation), traced as for a TPU
(flaxlm.platform.building_for) and compiled by libtpu for every device of the slice. What one device holds comes from
the TPU compiler: memory_analysis() of each compiled step (arguments, outputs, temporaries, code) and, for the
parameters and optimizer state, their shardings. The eval step runs beside the train state (params and optimizer
state stay in HBM during an evaluation), so its total counts the optimizer state too. A step that does not fit is
one line with what would help, exit 2; a step the compiler refuses for its size likewise.
"""
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from flaxlm.errors import UserError
from flaxlm.platform import building_for

GIB = 2 ** 30


def compile_target(args):
    """The TPU slice --compile_for names (flaxlm.planning.tpu_slices.Slice), or None for a run that trains. UserError
    for an unknown name or without libtpu."""
    from flaxlm.planning.tpu_slices import tpu_slice
    return tpu_slice(args.compile_for) if args.compile_for else None


def token_rows(row_length, tokenizer, n=8):
    """Placeholder rows [n, row_length] of the tokenizer's ids for a pretraining objective's collate (only their
    shape matters), above the usual special tokens."""
    vocab = len(tokenizer)
    return np.random.default_rng(0).integers(min(8, vocab - 1), vocab, (n, row_length)).astype(np.int32)


def batch_shapes(objective, sample_rows, rows, sharding, pieces=None):
    """The device batch of `rows` rows (collated from sample_rows, repeated) as jax.ShapeDtypeStructs on `sharding`;
    pieces: the layout's reshape for accumulation."""
    from flaxlm.data.rows import num_rows, take_rows
    batch = objective.collate(take_rows(sample_rows, np.arange(rows) % num_rows(sample_rows)),
                              np.random.default_rng(0))
    batch = pieces(batch) if pieces else batch
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in batch.items()}


def held_bytes(shapes):
    """Bytes one device holds of a pytree of jax.ShapeDtypeStructs with shardings."""
    return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(shapes)))


def step_bytes(compiled):
    """{part: bytes per device} of a compiled step from the compiler: arguments, outputs (those not written over
    the arguments), temporaries and code."""
    m = compiled.memory_analysis()
    return {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes - m.alias_size_in_bytes,
            "temporaries": m.temp_size_in_bytes, "code": m.generated_code_size_in_bytes}


def compiled_flops(compiled):
    """FLOPs per device of a compiled step (the compiler's cost analysis), or None."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return (cost or {}).get("flops")


def kernels(compiled):
    """How many Pallas / Mosaic TPU kernels (splash attention's forward and backward; libtpu's grouped matmul of an
    MoE's jax.lax.ragged_dot, with its metadata kernel) a compiled program calls."""
    return compiled.as_text().count('custom_call_target="tpu_custom_call"')


class DoesNotFit(Exception):
    """The TPU compiler refused a step for its size: its message's first line."""


def compile_timed(lowered):
    """(compiled, seconds); DoesNotFit when the compiler runs out of HBM."""
    t = time.perf_counter()
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" in str(e) or "Ran out of memory" in str(e):
            raise DoesNotFit(str(e).strip().splitlines()[0]) from None
        raise
    return compiled, time.perf_counter() - t


def compile_steps(target, args, params, objective, mesh, micro_batch, eval_batch, sample_rows, vocab_size=None,
                  sampling=None):
    """Compile the run's train step (the last optimizer phase's: the largest state) and eval step for the slice (with
    sampling = (sampler, prompt_length): GRPO's sampling of a global batch of completions instead of the eval step);
    returns the figures per device as a dict."""
    from flaxlm.training.evaluation import eval_steps_for
    from flaxlm.training.freeze import as_phases
    from flaxlm.training.pipeline import run_optimizer
    from flaxlm.training.train_step import BatchLayout, abstract_state, compile_train_step
    from flaxlm.training import mesh as meshlib
    with building_for("tpu", target.generation.kind):
        phase = as_phases(run_optimizer(args, params, max(args.max_steps, 1), vocab_size)[0])[-1]
        state, shardings = abstract_state(params, phase.tx, mesh, args.sharding)
        layout = BatchLayout.plan(micro_batch, args.gradient_accumulation_steps, mesh, objective.tokens_per_example,
                                  args.cpu_chunk_tokens)
        train_batch = batch_shapes(objective, sample_rows, layout.global_batch, layout.sharding, layout.pieces)
        key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=meshlib.replicated(mesh))
        step = compile_train_step(objective.loss_sums, phase.tx, layout, shardings, trainable=phase.trainable,
                                  frozen=objective.frozen)
        train, train_s = compile_timed(step.lower(state, train_batch, key, *objective.frozen_args()))
        if sampling:
            evaluate, eval_s, eval_inputs = compile_sampling(*sampling, state["params"], layout.global_batch, mesh)
        elif not args.do_eval:  # the run never evaluates (--do_eval false): the train step is all it compiles
            evaluate, eval_s, eval_inputs = None, 0.0, None
        else:
            eval_step = eval_steps_for(objective, mesh, shardings["params"])[0]
            eval_inputs = batch_shapes(objective, sample_rows, eval_batch, meshlib.batch_sharding(mesh))
            evaluate, eval_s = compile_timed(eval_step.lower(state["params"], eval_inputs))
    return {"layout": layout.describe(), "params": held_bytes(state["params"]),
            "optimizer": held_bytes(state["opt_state"]), "train": step_bytes(train),
            "train_batch": held_bytes(train_batch), "compiled_flops": compiled_flops(train), "kernels": kernels(train),
            "counted_flops": objective.flops_per_example * layout.global_batch / mesh.size,
            "compile_s": (train_s, eval_s),
            # the second step (eval, or GRPO's generation); None each for a run that does not evaluate
            **({"eval": None, "eval_batch": None, "second": None} if evaluate is None else
               {"eval": step_bytes(evaluate), "eval_batch": held_bytes(eval_inputs),
                "second": "generation" if sampling else "eval"}),
            **({"frozen": held_bytes(objective.frozen)} if objective.frozen is not None else {})}


def compile_sampling(sampler, prompt_length, params, rows, mesh):
    """(compiled, seconds, prompt batch shapes): the sampler's prefill and decode loop for `rows` prompts of
    prompt_length tokens, the params as the train state places them."""
    from flaxlm.training import mesh as meshlib
    sharding = meshlib.batch_sharding(mesh)
    ids = jax.ShapeDtypeStruct((rows, prompt_length), jnp.int32, sharding=sharding)
    key = jax.eval_shape(lambda: jax.random.key(0))
    lowered = meshlib.on_mesh(jax.jit(sampler.sample_fn, out_shardings=sharding), mesh).lower(
        params, ids, ids, jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=meshlib.replicated(mesh)))
    compiled, seconds = compile_timed(lowered)
    return compiled, seconds, {"ids": ids, "mask": ids}


def totals(r):
    """(train step, eval step) bytes per device: everything the compiler places for the step (its arguments hold
    the train state and the batch); the eval step's plus the optimizer state (and a live teacher) it runs beside
    (0 for a run that does not evaluate)."""
    train = sum(r["train"].values())
    if not r["eval"]:
        return train, 0
    return train, sum(r["eval"].values()) + r["optimizer"] + r.get("frozen", 0)


def report(target, r, what):
    """The table printed for one compiled run (`what`: the run in a line: model, batch, sharding, dtype); a run that
    does not evaluate (r["second"] None) has the train step's column alone."""
    gib = lambda b: f"{b / GIB:.3f}" if b == 0 or b >= GIB / 1000 else "<0.001"  # noqa: E731
    train, evaluate = totals(r)
    hbm = target.hbm_bytes
    frozen = r.get("frozen", 0)  # a live teacher's params (run_distill.py --mode gkd), held beside both steps
    others = r["train"]["arguments"] - r["params"] - r["optimizer"] - r["train_batch"] - frozen
    rows = [("parameters", r["params"], r["params"]),
            *([("teacher parameters", frozen, frozen)] if frozen else []),
            ("optimizer state", r["optimizer"], r["optimizer"]),  # the eval step runs beside it
            ("batch", r["train_batch"], r["eval_batch"]),
            ("temporaries", r["train"]["temporaries"], r["eval"] and r["eval"]["temporaries"]),
            ("code", r["train"]["code"], r["eval"] and r["eval"]["code"]),
            ("other in and out", others + r["train"]["outputs"],
             r["eval"] and r["eval"]["arguments"] - r["params"] - r["eval_batch"] + r["eval"]["outputs"]),
            ("total", train, evaluate),
            ("headroom", hbm - train, hbm - evaluate)]
    second = r["second"]
    gen = target.generation
    lines = [f"--compile_for {target.name}: {gen.kind}, topology {target.topology}, {target.num_devices} "
             f"device{'s' if target.num_devices > 1 else ''} on {target.hosts} host{'s' if target.hosts > 1 else ''}, "
             f"{gen.hbm_gib} GiB of HBM per device",
             what, f"  {'per device (GiB)':<22}{'train step':>14}"
                   + (f"{'generation' if second == 'generation' else 'eval step':>14}" if second else "")]
    lines += [f"  {name:<22}{gib(a):>14}" + (f"{gib(b):>14}" if second else "") for name, a, b in rows]
    compiled, counted = r["compiled_flops"], r["counted_flops"]
    lines.append(f"  FLOPs per device and step: {compiled:.4g} in the compiled program, {counted:.4g} counted by "
                 f"flaxlm.training.flops" if compiled else f"  FLOPs per device and step: {counted:.4g} (counted)")
    lines.append(f"  Pallas kernel calls in the train step: {r['kernels']} (splash attention; an MoE's grouped "
                 f"matmuls)")
    lines.append(f"  compiled in {r['compile_s'][0]:.1f} s (train step) + {r['compile_s'][1]:.1f} s ({second} step)"
                 if second else f"  compiled in {r['compile_s'][0]:.1f} s (train step; no eval step: --do_eval false)")
    return "\n".join(lines)


def remedies(target, args, model_args):
    """What would shrink a step's memory, among what the run does not do yet."""
    out = []
    if args.sharding == "data" and target.num_devices > 1:
        out.append("--sharding fsdp")
    if model_args.remat_policy == "none":
        out.append("--remat_policy full (or dots_saveable)")
    if not model_args.scan_layers:
        out.append("--scan_layers")
    per_device = args.per_device_train_batch_size
    if args.train_batch_size:
        per_device = args.train_batch_size // target.num_devices
    if per_device > 1:
        out.append(f"--per_device_train_batch_size {per_device // 2} --gradient_accumulation_steps "
                   f"{2 * args.gradient_accumulation_steps} (the same global batch)")
    bigger = [n for n in target.generation.grids if n > int(target.name.rsplit("-", 1)[1])]
    if bigger:
        out.append(f"a bigger slice ({target.name.rsplit('-', 1)[0]}-{bigger[0]})")
    return out


def describe_run(args, model_args, params, objective, layout):
    """'124.6M parameters; global batch 256 (8 devices x 32 x 1 accumulation), 128 tokens a row; --dtype bfloat16,
    --param_dtype float32, --sharding data, --remat_policy none'."""
    from flaxlm.models import count_params
    return (f"{count_params(params) / 1e6:.1f}M parameters; {layout}, {objective.tokens_per_example} tokens a row; "
            f"--dtype {model_args.dtype}, --param_dtype {model_args.param_dtype or 'float32'}, "
            f"--sharding {args.sharding}, "
            f"--remat_policy {model_args.remat_policy}{', --scan_layers' if model_args.scan_layers else ''}")


def check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch, sample_rows,
              vocab_size=None, sampler=None, prompt_length=None):
    """Compile, print the table and return when both steps fit the slice's HBM; UserError (exit 2) when not. sampler
    (GRPO's flaxlm.rl.sampling.Sampler): its sampling of a global batch of completions after prompts of prompt_length
    tokens is compiled in place of the eval step (the table's second column)."""
    from flaxlm.training.pipeline import vocab_rows
    if model_args.attention_implementation == "splash":
        from flaxlm.models.layer_stack import check_splash_compiles
        check_splash_compiles(target.generation.kind, target.name)
    help_ = "; ".join(remedies(target, args, model_args)) or "a bigger slice"
    print(f"compiling for {target.name} ({target.topology}, {target.num_devices} "
          f"device{'s' if target.num_devices > 1 else ''}) ...", flush=True)
    try:
        r = compile_steps(target, args, params, objective, mesh, micro_batch, eval_batch, sample_rows,
                          vocab_rows(vocab_size, model_args),  # --train_only embeddings: the tables' rows
                          sampling=(sampler, prompt_length) if sampler else None)
    except DoesNotFit as e:
        raise UserError(f"the run does not fit {target.name}: the TPU compiler says \"{e}\"{over_by(str(e))}; "
                        f"try {help_}") from None
    print(report(target, r, describe_run(args, model_args, params, objective, r["layout"])), flush=True)
    train, evaluate = totals(r)
    worst = max(train, evaluate)
    if worst > target.hbm_bytes:
        step = "train" if train >= evaluate else r["second"]
        raise UserError(f"the run does not fit {target.name}: its {step} step needs {worst / GIB:.2f} GiB per device, "
                        f"{(worst - target.hbm_bytes) / GIB:.2f} GiB more than the {target.generation.hbm_gib} GiB of "
                        f"HBM; try {help_}")
    print(f"fits {target.name}: {worst / GIB:.2f} of {target.generation.hbm_gib} GiB per device at most "
          f"({(target.hbm_bytes - worst) / GIB:.2f} GiB free)", flush=True)
    return r


def over_by(message):
    """' (by X GiB)' from the compiler's 'required ... (64.00G) exceeds available HBM (15.75G)', or ''."""
    sizes = re.findall(r"\((\d+(?:\.\d+)?)([KMGT])\)", message)
    if len(sizes) < 2:
        return ""
    scale = {"K": 2 ** -20, "M": 2 ** -10, "G": 1, "T": 2 ** 10}
    need, have = (float(v) * scale[u] for v, u in sizes[:2])
    return f" (over by {need - have:.2f} GiB)"
