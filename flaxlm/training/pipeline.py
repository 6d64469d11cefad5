"""The steps of the scripts' pipeline (their docstrings' "Pipeline: options -> output directory -> tokenizer and
model -> data -> training -> export") that every training script shares: start_run, load_model, resolve_seq_len,
batch_sizes, train_and_evaluate (training, evaluation, or an evaluation job) and export."""
import os

from flaxlm.errors import UserError


def start_run(args, model_args):
    """What every training script does first: join the other hosts of a multi-host run, check --report_to's
    trackers are installed and --output_dir (flaxlm.training.output_dir), turn on the compilation cache and, with
    --push_to_hub, check the hub access.
    With --compile_for none of that (no host joined, nothing written): the script then compiles for the TPU slice
    (flaxlm.planning.compile_for.compile_target)."""
    from flaxlm.training import mesh as meshlib
    from flaxlm.training.compile_cache import enable_compilation_cache
    from flaxlm.training.output_dir import check_hub_access, prepare_output_dir
    from flaxlm.training import freeze
    from flaxlm.training.optim import check_optimizer_options
    _SAID.clear()  # say_attention's lines: once per run
    freeze.check_options(args)
    check_optimizer_options(args)  # --optim, --lr_scheduler_type and its kwargs: one line now, not after the data
    if args.compile_for:  # config.json is all it reads of a checkpoint
        return None  # the steps are traced for the slice in flaxlm.planning.compile_for.compile_steps
    from flaxlm.reporting.trackers import resolve_report_to
    args.report_to = resolve_report_to(args.report_to)  # a tracker not installed: one line, before any work
    check_local_checkpoint(model_args.model_name_or_path)
    if args.resume_from_checkpoint:  # no checkpoint to resume from: one line before anything is made
        from flaxlm.training.checkpoint import resolve_resume
        resolve_resume(args.resume_from_checkpoint, args.output_dir)
    meshlib.maybe_initialize_distributed(args)
    prepare_output_dir(args)
    enable_compilation_cache(args.compilation_cache_dir)
    if args.push_to_hub:
        check_hub_access(args.hub_token or model_args.token)
    return None


def check_local_checkpoint(path):
    """UserError, before --output_dir is made, when a local checkpoint's index names a shard that is not there."""
    import os
    from flaxlm.models import hf_io
    if path and os.path.isdir(os.path.expanduser(path)):
        hf_io.checkpoint_files(os.path.expanduser(path))


# What to pass when neither --model_name_or_path nor --config_name is given: pretraining, or a fine-tuning task.
NO_MODEL_HINTS = {
    None: "--config_name DIR (write one with create_config.py) to train from scratch, --model_type TYPE for its "
          "default config, or --model_name_or_path DIR to continue a Hugging Face checkpoint",
    "sequence_classification": "--model_name_or_path DIR (a pretrained BERT/RoBERTa, e.g. the export of "
                               "run_mlm_flax.py), or --config_name DIR to train one from scratch",
    "question_answering": "--model_name_or_path DIR (e.g. a run_mlm_flax.py output directory)",
    "token_classification": "--model_name_or_path DIR (a pretrained encoder, e.g. the export of run_mlm_flax.py), "
                            "or --config_name DIR to train one from scratch",
}


ROUTER_OPTIONS = ("output_router_logits", "router_aux_loss_coef", "router_z_loss_coef")


def with_router_options(model_args, config):
    """config with the router's loss settings the flags give (ROUTER_OPTIONS; unset: config.json's), which the
    export's config.json keeps; UserError when one is given for a model without experts."""
    given = {name: getattr(model_args, name, None) for name in ROUTER_OPTIONS}
    given = {name: value for name, value in given.items() if value is not None}
    if given and not getattr(config, "num_experts", 0):
        raise UserError(f"--{next(iter(given))} is a mixture-of-experts setting, and this {config.model_type} model "
                        f"has no experts; drop it")
    for name, value in given.items():
        setattr(config, name, value)
    return config


def trl_router_loss(model_args, config):
    """config with the load-balancing loss on or off as TRL's SFT, DPO and GRPO trainers decide it for a mixture of
    experts: on whenever router_aux_loss_coef is not 0 (so by default), unless --output_router_logits says."""
    if getattr(config, "num_experts", 0) and getattr(model_args, "output_router_logits", None) is None:
        config.output_router_logits = bool(config.router_aux_loss_coef)
    return config


def load_model(model_args, seed, script=None, task=None, tokenizer=None, mesh=None, sharding="data", abstract=False,
               **labels):
    """(config, model) a script trains: continued from --model_name_or_path, or new from --config_name, or (when
    pretraining, given the tokenizer) new from --model_type's default config sized to the tokenizer, with
    --config_overrides, as Hugging Face's scripts built it.

    Pretraining (task None): the family's pretraining model; the config's model_type must be one of the families
    `script` pretrains (Family.script). Fine-tuning (task "sequence_classification" or "question_answering"): the
    encoder with that task's head (fresh unless the checkpoint has one; flaxlm.models.load_for_task), on a family
    that has the head; labels: the classifier's id2label / num_labels / problem_type (task_config).

    The parameters are --param_dtype. Given the mesh, a pretrained model's tensors are read straight into the
    train state's sharding (`sharding`: data or fsdp), a sharded checkpoint shard by shard. abstract (--compile_for):
    the model's shapes only (jax.ShapeDtypeStruct parameters), no weights read or initialized. A mixture of
    experts' router losses as --output_router_logits, --router_aux_loss_coef and --router_z_loss_coef say."""
    config, model = _load_model(model_args, seed, script, task, tokenizer, mesh, sharding, abstract, **labels)
    return with_router_options(model_args, config), model


def _load_model(model_args, seed, script, task, tokenizer, mesh, sharding, abstract, **labels):
    from flaxlm.models import create_model, load_config, load_for_task, load_pretrained, model_class, task_config
    from flaxlm.models.hf_io import has_weights, resolve_dir
    from flaxlm.platform import splash_compiles
    check_model_type_known(model_args.model_type, script, task)
    path = model_args.model_name_or_path or model_args.config_name
    if model_args.config_overrides and (path or not model_args.model_type):
        raise UserError("--config_overrides changes the default config of --model_type and needs it, without "
                        "--config_name or --model_name_or_path; edit config.json instead (create_config.py --set)")
    if not path and not (task is None and model_args.model_type and tokenizer is not None):
        raise UserError(f"no model given; pass {NO_MODEL_HINTS[task]}")
    config = load_config(path) if path else default_config(model_args, tokenizer)
    extend = context_extension(model_args)  # --rope_scaling: the config's RoPE extended (None: as it is)
    if extend:
        from flaxlm.reporting.run_log import say
        before, config = config.max_position_embeddings, extend(config)
        say(f"RoPE extended by --rope_scaling: {before} positions -> {config.max_position_embeddings} "
            f"(max_position_embeddings of the export)")
    if task is None:
        check_script_trains(script, config, f"{path} holds a {config.model_type} model" if path
                            else f"--model_type is {config.model_type}")
    else:
        model_class(config, task)  # UserError unless the family has the task's head
    check_model_type(model_args, config)
    check_vocab_padding(model_args, config)
    execution = model_execution(model_args)
    say_attention(config, execution.attention, tpu=abstract or splash_compiles(),  # abstract: --compile_for, a TPU
                  scan=execution.scan)
    param_dtype = getattr(model_args, "param_dtype", None) or "float32"
    if not model_args.model_name_or_path or abstract:  # new, from --config_name or --model_type (or shapes only)
        if task is not None:
            config = task_config(config, task, **labels)
        if abstract:
            from flax import nnx
            model = nnx.eval_shape(lambda: create_model(config, dtype=model_args.dtype, task=task, execution=execution))
        else:
            model = create_model(config, dtype=model_args.dtype, seed=seed, task=task, execution=execution)
        return config, with_param_dtype(model, param_dtype)
    if task is None:
        shardings = None
        if mesh is not None:
            from flaxlm.training.sharding import state_shardings
            shardings = lambda abstract: state_shardings(abstract, mesh, sharding)  # noqa: E731
        return load_pretrained(path, dtype=model_args.dtype, execution=execution, shardings=shardings,
                               param_dtype=param_dtype, edit_config=extend)
    if not has_weights(resolve_dir(path)):  # fine-tuning starts from trained weights; --config_name starts fresh
        raise UserError(f"no model weights (model.safetensors) in {path}; pass a pretrained model directory, or "
                        f"--config_name {path} to train from scratch")
    return load_for_task(path, task, dtype=model_args.dtype, seed=seed, execution=execution, param_dtype=param_dtype,
                         edit_config=extend, **labels)


def context_extension(model_args):
    """--rope_scaling's edit of a config (flaxlm.models.rope.with_rope_scaling), checked when called; None without
    the option."""
    if not getattr(model_args, "rope_scaling", None):
        return None
    import json
    try:
        scaling = json.loads(model_args.rope_scaling)
    except json.JSONDecodeError as e:
        raise UserError(f"--rope_scaling is not JSON ({e.msg}); give an object, e.g. "
                        f"'{{\"rope_type\": \"yarn\", \"factor\": 4.0}}'") from None

    from flaxlm.models.rope import with_rope_scaling
    return lambda config: with_rope_scaling(config, scaling)


def attach_lora(lora_args, model_args, args, config, model, seed, tokens=()):
    """(model, lora): with --lora_rank or --lora_adapter, the model with LoRA adapters on its frozen base
    (flaxlm.models.lora; the base in bfloat16 unless --param_dtype says) and lora = (LoraConfig, modules), the run
    training only them (--train_only: no gradient, update nor optimizer state for the base) and the embedding (and
    untied head) rows of its trainable tokens: `tokens` (the ids the run added to the vocabulary), those of
    --lora_trainable_tokens and a continued adapter's; else (model, None). Call it once the vocabulary is final."""
    if lora_args.merge_dtype and not (lora_args.merge_lora and (lora_args.lora_rank or lora_args.lora_adapter)):
        raise UserError(f"--merge_dtype {lora_args.merge_dtype} is the dtype of --merge_lora's export; pass it with "
                        f"--lora_rank and --merge_lora, or drop it")
    if not (lora_args.lora_rank or lora_args.lora_adapter):
        if lora_args.lora_trainable_tokens:
            raise UserError("--lora_trainable_tokens trains rows beside LoRA adapters; pass --lora_rank too (without "
                            "LoRA, --train_only embeddings trains the whole tables)")
        return model, None
    from flaxlm.models import lora as loralib
    from flaxlm.reporting.run_log import say
    if args.train_only:
        raise UserError("--train_only chooses what trains, and with LoRA the adapters do; drop one of them")
    if not model_args.param_dtype:  # said so in the card and in --compile_for's table
        model, model_args.param_dtype = with_param_dtype(model, "bfloat16"), "bfloat16"
    tokens = sorted({int(i) for i in tokens} | set(lora_args.lora_trainable_tokens or ()))
    if lora_args.lora_adapter:
        lora, modules = loralib.load_adapter(model, config, lora_args.lora_adapter, tokens)
    else:
        targets = lora_args.lora_target_modules
        if targets and len(targets) == 1 and not targets[0].isidentifier():
            targets = targets[0]  # a regular expression of whole module names
        lora = loralib.LoraConfig(rank=lora_args.lora_rank, alpha=lora_args.lora_alpha,
                                  dropout=lora_args.lora_dropout, targets=tuple(targets) if isinstance(
                                      targets, list) else targets, trainable_tokens=tuple(tokens),
                                  parameters=tuple(lora_args.lora_target_parameters or ()))
        modules = loralib.add_lora(model, config, lora, seed)
    if lora.trainable_tokens:
        sites = " and ".join(s.hf for s in loralib.token_sites(config))
        say(f"LoRA trains the rows of {len(lora.trainable_tokens)} token(s) in {sites} too (ids "
            f"{', '.join(map(str, lora.trainable_tokens[:8]))}{', ...' if len(lora.trainable_tokens) > 8 else ''}); "
            f"every other row stays the base's")
    args.train_only = [loralib.TRAINABLE]
    return model, (lora, modules)


def with_param_dtype(model, param_dtype):
    """The model with its parameters in param_dtype (a new model's are float32)."""
    if param_dtype == "float32":
        return model
    import jax
    from flaxlm.models import merge_model, split_model
    graphdef, params = split_model(model)

    def cast(x):  # an abstract model's parameters (--compile_for) are shapes
        return jax.ShapeDtypeStruct(x.shape, param_dtype) if isinstance(x, jax.ShapeDtypeStruct) else x.astype(param_dtype)
    return merge_model(graphdef, jax.tree.map(cast, params))


def default_config(model_args, tokenizer):
    """--model_type's default transformers config (CONFIG_MAPPING[model_type]() of Hugging Face's scripts), its
    vocab_size and special ids the tokenizer's, changed by --config_overrides ("key=value,key=value")."""
    from flaxlm.models.presets import config_for
    overrides = [item for item in (model_args.config_overrides or "").split(",") if item.strip()]
    config = config_for(model_args.model_type, {}, tokenizer, overrides, "comes from --model_type")
    print(f"a new {model_args.model_type} model of transformers' default config"
          f"{' with ' + model_args.config_overrides if overrides else ''}, sized to the tokenizer")
    return config


def check_model_type_known(model_type, script, task):
    """UserError when --model_type names no family here, naming those the script trains (a task: those with its
    head)."""
    from flaxlm.models.registry import FAMILIES
    if model_type is None or model_type in FAMILIES:
        return
    able = [t for t, f in FAMILIES.items() if (f.script == script if task is None else task in f.heads)]
    doing = f"{script} trains" if task is None else f"{task.replace('_', ' ')} works on"
    raise UserError(f"--model_type {model_type} has no Flax model here; {doing} {', '.join(able)}")


def check_script_trains(script, config, source):
    """UserError unless config's model_type is one of the families `script` pretrains, naming the right one;
    source: where the model comes from ("runs/x holds a t5 model")."""
    from flaxlm.models.registry import FAMILIES
    model_types = [model_type for model_type, family in FAMILIES.items() if family.script == script]
    if config.model_type not in model_types:
        other = FAMILIES[config.model_type].script if config.model_type in FAMILIES else None
        hint = f"use {other}" if other else f"use a {' or '.join(model_types)} config"
        raise UserError(f"{source} but {script} trains {', '.join(model_types)}; {hint}")


ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop")  # config.json's names


def say_attention(config, attention, tpu=False, scan=False):
    """One line, once per run, when the attention kernel asked for cannot compute the model in full: splash
    (--attention_implementation splash, or auto on a TPU: `tpu`, also --compile_for's) meeting a family whose
    attention adds a bias to the scores (XLA attention throughout) or attention dropout (XLA while training), or
    cudnn meeting attention dropout under --scan_layers (`scan`: XLA while training; flaxlm.models.cudnn_dropout)."""
    from flaxlm.models import family_of
    family = family_of(config)
    key, rate = next(((k, getattr(config, k)) for k in ATTENTION_DROPOUT if getattr(config, k, None)), (None, 0))
    turn_off = (f"{key}=0 (create_config.py --set {key}=0, --config_overrides {key}=0 with --model_type, or in "
                f"config.json)")
    if attention == "cudnn" and rate and scan:
        _say_once(f"--attention_implementation cudnn: {family.name} drops out attention probabilities ({key}={rate} "
                  f"in config.json), which cuDNN's kernel cannot under --scan_layers (its masks would not match "
                  f"between the forward pass and the backward's reversed layers): XLA attention with [B, N, T, S] "
                  f"float32 scores while training; drop --scan_layers, or train without it: {turn_off}")
    if not (attention == "splash" or (attention == "auto" and tpu)):
        return
    head = "--attention_implementation splash" if attention == "splash" else "TPU attention (auto)"
    if family.no_splash:
        if attention == "splash":
            _say_once(f"{head}: {family.name} attends with XLA ({family.no_splash}, which the splash kernel cannot "
                      f"take)")
        return
    if rate:
        _say_once(f"{head}: {family.name} drops out attention probabilities ({key}={rate} in config.json), which "
                  f"the splash kernel cannot: XLA attention with [B, N, T, S] float32 scores while training (splash "
                  f"in evaluation); recent recipes train without it: {turn_off}")


_SAID = set()  # say_attention's lines already printed in this run (run_electra_flax.py loads two models)


def _say_once(line):
    if line not in _SAID:
        _SAID.add(line)
        print(line, flush=True)


def model_execution(model_args):
    """How the model's layers run, from --scan_layers, --remat_policy and --attention_implementation."""
    from flaxlm.models.layer_stack import Execution
    return Execution(scan=model_args.scan_layers, remat=model_args.remat_policy,
                     attention=model_args.attention_implementation,
                     vocab_multiple=getattr(model_args, "pad_vocab_multiple", 1))


def check_vocab_padding(model_args, config):
    """UserError when --pad_vocab_multiple meets a model that is not a causal LM (only their tables are padded)."""
    from flaxlm.models.registry import CAUSAL_LM_TYPES
    multiple = getattr(model_args, "pad_vocab_multiple", 1)
    if multiple > 1 and config.model_type not in CAUSAL_LM_TYPES:
        raise UserError(f"--pad_vocab_multiple {multiple} pads a causal LM's vocabulary (run_clm_flax.py, run_sft.py, "
                        f"run_dpo.py), not a {config.model_type} model's; drop it")


def vocab_rows(vocab_size, model_args):
    """The rows the model's vocabulary tables hold in memory: vocab_size padded by --pad_vocab_multiple (what
    --train_only embeddings looks for); None stays None."""
    from flaxlm.models.vocab_padding import padded_rows
    return None if vocab_size is None else padded_rows(vocab_size, getattr(model_args, "pad_vocab_multiple", 1))


def check_model_type(model_args, config):
    """UserError when --model_type names another family than the model's config.json."""
    if model_args.model_type and model_args.model_type != config.model_type:
        raise UserError(f"--model_type {model_args.model_type} does not match the config's model_type "
                        f"{config.model_type}; drop --model_type or use a {model_args.model_type} model")


def resolve_seq_len(requested, tokenizer, config):
    """--max_seq_length of an encoder's rows (run_mlm_flax, run_classification, run_qa): at most the longest input
    the model's positions allow (its family's max_length); by default also at most the tokenizer's and 512."""
    from flaxlm.models import family_of
    limit = family_of(config).max_length(config)
    if requested is None:
        return min(tokenizer.model_max_length, limit, 512)
    if requested > limit:
        raise UserError(f"--max_seq_length {requested} is larger than the model allows ({limit} positions "
                        f"from max_position_embeddings={config.max_position_embeddings}); use at most {limit}")
    if requested < 4:
        raise UserError(f"--max_seq_length {requested} is too short; use at least 4")
    return requested


def batch_sizes(args, mesh):
    """(micro batch, eval batch, global batch): global row counts that divide over the mesh's devices."""
    from flaxlm.training import mesh as meshlib
    micro = meshlib.global_batch_size(args.per_device_train_batch_size, args.train_batch_size, mesh,
                                      "--train_batch_size")
    evals = meshlib.global_batch_size(args.per_device_eval_batch_size, args.eval_batch_size, mesh,
                                      "--eval_batch_size")
    return micro, evals, micro * args.gradient_accumulation_steps


def train_and_evaluate(args, model_args, params, objective, train_rows, eval_rows, total_steps, mesh, micro_batch,
                       eval_batch, test_rows=None, config=None):
    """The optimizer (weight decay off for biases and norms; with --train_only, first only those parameters:
    flaxlm.training.freeze), the run log (with loss.png drawn at its end) and the training loop over `objective`
    (honouring --do_train / --do_eval / --do_predict); returns the final params. With --eval_checkpoints it evaluates
    the saved checkpoints instead (flaxlm.training.eval_job) and returns None. config: the model's (its vocabulary,
    for --train_only embeddings and --optim muon, and its family's fused tensors, for muon)."""
    from flaxlm.reporting.run_log import RunLog
    from flaxlm.training.loop import train
    vocab_size = vocab_rows(getattr(config, "vocab_size", None), model_args)
    tx, schedule = run_optimizer(args, params, total_steps, vocab_size, config)
    if args.eval_checkpoints:  # an evaluation job: no training, no export
        from flaxlm.training.eval_job import evaluate_checkpoints
        evaluate_checkpoints(args, params, objective, tx, eval_rows, mesh, eval_batch, total_steps)
        return None
    import time
    log = RunLog(args.output_dir, fresh=not args.resume_from_checkpoint, loss_plot="loss.png",
                 trackers=run_trackers(args))
    try:
        start = time.perf_counter()
        params = train(args=args, params=params, objective=objective, tx=tx, schedule=schedule,
                       train_rows=train_rows, eval_rows=eval_rows if args.do_eval else None, mesh=mesh,
                       total_steps=total_steps if args.do_train else 0, micro_batch=micro_batch,
                       eval_batch=eval_batch, log=log, dtype=model_args.dtype,
                       test_rows=test_rows if args.do_predict else None)
        log.write(total_steps if args.do_train else 0, "run", {"seconds": time.perf_counter() - start,
                                                                "devices": mesh.size})  # for the model card
        return params
    finally:
        log.close()


def run_trackers(args):
    """--report_to's trackers for this run (process 0 only; flaxlm.reporting.trackers), its options as their config."""
    from flaxlm.config.cli import parsed_options
    from flaxlm.training import mesh as meshlib
    from flaxlm.reporting.trackers import open_trackers, resolve_report_to
    if not meshlib.is_main_process():
        return []
    return open_trackers(resolve_report_to(args.report_to), args.output_dir, args.run_name, parsed_options(),
                         resuming=bool(args.resume_from_checkpoint))


def run_optimizer(args, params, total_steps, vocab_size=None, config=None):
    """(tx, schedule): the run's optimizer (--optim; weight decay off for biases and norms) or, with --train_only,
    first only those parameters (flaxlm.training.freeze.Phases). vocab_size (the padded rows) and config: the
    model's, for --train_only embeddings and --optim muon (flaxlm.training.muon)."""
    import jax
    from flaxlm.models import decay_mask
    from flaxlm.training import freeze
    from flaxlm.training.optim import make_optimizer
    from flaxlm.reporting.run_log import say
    trainable = freeze.trainable_mask(params, args.train_only, vocab_size) if args.train_only else None
    if trainable is not None and all(jax.tree.leaves(trainable)):
        say(f"--train_only {' '.join(args.train_only)} names every parameter: everything trains")
        trainable = None
    elif trainable is not None:
        say(freeze.describe(params, trainable, args.freeze_steps, total_steps))
    from flaxlm.training.optim import optimizer_name
    optim = optimizer_name(args)
    if optim == "muon":
        from flaxlm.training.muon import describe
        say(describe(params, vocab_size, config))
    elif optim == "schedule_free_adamw":
        schedule = getattr(args, "lr_scheduler_type", "linear") or "linear"
        say("--optim schedule_free_adamw: evaluation and the export use its averaged parameters"
            + ("" if schedule.startswith("constant") else f"; it is meant for a constant rate after warmup (--lr_"
               f"scheduler_type constant_with_warmup), the rate follows {schedule} as asked"))
    return make_optimizer(args, total_steps, decay_mask(params), trainable, params=params, vocab_size=vocab_size,
                          config=config)


def export(args, model_args, config, params, tokenizer, load_with, how=None, lora=None, merge_lora=False,
           merge_dtype=None):
    """Write the model (config.json + model.safetensors), tokenizer and model card (README.md) in Hugging Face
    format to --output_dir, from process 0, then upload them with --push_to_hub (nothing for an evaluation job).
    how: what the card says was done (default: from load_with and --model_name_or_path). lora (attach_lora's): the
    PEFT adapter instead of the model, or with merge_lora the model with the adapters multiplied into the base's own
    checkpoint, in merge_dtype (default: the base's; flaxlm.models.lora.save_merged)."""
    from flaxlm.training import mesh as meshlib
    from flaxlm.models import save_pretrained
    from flaxlm.models import lora as loralib
    from flaxlm.training.output_dir import push_to_hub
    if not meshlib.is_main_process() or args.eval_checkpoints:
        return
    out = args.output_dir
    if lora and not merge_lora:
        loralib.save_adapter(out, config, params, *lora, base=model_args.model_name_or_path)
        tokenizer.save_pretrained(out)
        grown = " resized to the tokenizer's length" if lora[0].trainable_tokens else ""
        print(f"exported the LoRA adapter (rank {lora[0].rank}, {len(lora[1])} layers) and tokenizer to {out} (load "
              f"with peft.PeftModel.from_pretrained on {model_args.model_name_or_path}{grown})", flush=True)
    elif lora and model_args.model_name_or_path:
        dtype = loralib.save_merged(out, config, params, *lora, base=model_args.model_name_or_path, dtype=merge_dtype)
        tokenizer.save_pretrained(out)
        print(f"exported the base with the LoRA adapter multiplied in ({dtype}) and tokenizer to {out} (load with "
              f"{load_with}.from_pretrained)", flush=True)
    else:  # (LoRA on a model made here, no checkpoint to read the base from: the run's copy, merged)
        save_pretrained(out, config, loralib.merged(params, lora[1], lora[0], config) if lora else params)
        tokenizer.save_pretrained(out)
        print(f"exported the model and tokenizer to {out} (load with {load_with}.from_pretrained)", flush=True)
    repo_id = (args.hub_model_id or os.path.basename(os.path.abspath(out))) if args.push_to_hub else None
    if lora and not merge_lora:
        names = ", ".join(sorted({m.label for m in lora[1]}))
        how = (f"{how or 'fine-tuned'}: a LoRA adapter (rank {lora[0].rank}, alpha {lora[0].alpha:g}, on {names} of "
               f"{len(lora[1])} layers)")
    write_card(args, model_args, config, params, tokenizer, load_with, repo_id or out, how,
               library_name="peft" if lora and not merge_lora else "transformers")
    if args.push_to_hub:
        push_to_hub(out, repo_id, args.hub_token or model_args.token)


PRETRAINING = ("CausalLM", "MaskedLM", "ForPreTraining", "ConditionalGeneration")  # the pretraining scripts' load_with


def write_card(args, model_args, config, params, tokenizer, load_with, repo, how=None, library_name="transformers"):
    """The export's model card (flaxlm.reporting.model_card): pretrained from scratch, continued from
    --model_name_or_path, or fine-tuned from it (or `how`); repo: where it loads from (the hub id pushed to, or the
    folder)."""
    from flaxlm.config.cli import parsed_options, parsed_prog
    from flaxlm.models import abstract_model, count_params
    from flaxlm.models.convert import task_of
    from flaxlm.models.vocab_padding import padding_count
    from flaxlm.reporting.model_card import write_model_card
    base = model_args.model_name_or_path
    if how is None:
        how = ("pretrained from scratch" if not base else "continued pretraining" if load_with.endswith(PRETRAINING)
               else "fine-tuned")
    # the exported model's count: --pad_vocab_multiple's rows are not in it
    n_params = count_params(params) - padding_count(params, abstract_model(config, task=task_of(config, params))[1])
    write_model_card(args.output_dir, config=config, tokenizer=tokenizer, auto_class=load_with, script=parsed_prog(),
                     options=parsed_options(), n_params=n_params, base_model=base, how=how, repo=repo,
                     library_name=library_name)
