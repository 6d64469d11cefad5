"""The opening the training scripts share, after start_run and compile_target: the tokenizer, then (once the data
that shapes the model is read) the model the run trains, on the devices that train it, and the batch sizes.

    start_run(args, model_args)
    target = compile_target(args)                 # the --compile_for slice, or None for a run that trains
    tokenizer = load_run_tokenizer(model_args)
    tokenizer, config, graphdef, params, lora, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_clm_flax.py", lora_args=lora_args, read_sharded=True)
"""
import math

from flaxlm.errors import UserError


def load_run_tokenizer(model_args, path=None):
    """The tokenizer of --tokenizer_name, else of `path` (a fine-tuning script's --model_name_or_path or
    --config_name), else of --model_name_or_path (flaxlm.tokenization.loading.load_tokenizer: --token,
    --trust_remote_code)."""
    from flaxlm.tokenization.loading import load_tokenizer
    return load_tokenizer(model_args.tokenizer_name or path or model_args.model_name_or_path, model_args.token,
                          trust_remote_code=model_args.trust_remote_code)


def expert_groups(args, model_args, num_devices):
    """The 'expert' axis of the mesh: --expert_parallel_size, or with --sharding expert the largest number up to 8
    that divides both the device count and the model's num_experts (its config.json); 1 without --sharding expert.
    Why at most 8 by default: a group's devices each hold all of the group's routed token copies
    (flaxlm.models.moe.expert_parallel), G times its own, and 8 devices are one host's (its fastest links)."""
    size = getattr(args, "expert_parallel_size", None)
    if getattr(args, "sharding", "data") != "expert":
        if size:
            raise UserError(f"--expert_parallel_size {size} sizes the experts' axis of --sharding expert; pass "
                            f"--sharding expert too, or drop it")
        return 1
    if size:
        return size
    path = model_args.model_name_or_path or model_args.config_name
    if not path:
        raise UserError("--sharding expert for a new model of --model_type needs --expert_parallel_size N")
    from flaxlm.models import load_config
    return math.gcd(num_devices, getattr(load_config(path), "num_experts", 0) or 1, 8)


def check_context_parallel(context, model, config, task, target):
    """A UserError unless --context_parallel_size `context` can split this model's sequences here: a causal LM
    without attention biases, each group of devices on one host (its rows are that host's) unless only compiled."""
    import jax
    from flaxlm.models.decoder import CausalLM
    if not isinstance(model, CausalLM):
        raise UserError(f"--context_parallel_size splits a causal LM's sequences, and this is a {config.model_type} "
                        f"{'model' if task is None else task + ' model'}; drop it")
    if config.model_type == "bloom":  # ALiBi: a bias on the scores, which the split attention does not take
        raise UserError("--context_parallel_size does not take BLOOM's ALiBi attention biases; drop it")
    if target is None and jax.local_device_count() % context:
        raise UserError(f"--context_parallel_size {context} is more than (or does not divide) this host's "
                        f"{jax.local_device_count()} devices; a group of devices sharing a row must be one host's")


def load_model_and_mesh(args, model_args, target, tokenizer, *, script=None, task=None, lora_args=None,
                        chat_markers=(), add_tokens=None, read_sharded=False, **labels):
    """What a script trains, and on what, in the order a run needs them:
    1. the mesh of the devices (target, compile_target's: the --compile_for slice's, else this run's), with
       --sharding expert an 'expert' axis of expert_groups devices;
    2. the model (flaxlm.training.pipeline.load_model: pretraining `script`'s families, or the head of a fine-tuning
       `task` with its **labels; --compile_for: shapes only; read_sharded: a checkpoint's tensors read straight into
       --sharding's layout on the mesh, as the decoder scripts read theirs);
    3. chat_markers (the chat template's turn markers the tokenizer lacks: missing_markers) added to the vocabulary
       by add_tokens, each new row the mean of its pieces' rows (flaxlm.adaptation.added_tokens.add_special_tokens,
       handed in by the script: training does not import adaptation, its sibling);
    4. with lora_args (LoraArgs: --lora_rank, --lora_adapter) LoRA adapters on the frozen base, the markers' rows
       trained beside them (attach_lora);
    5. the tokenizer checked against the final vocabulary, and the batch sizes over the mesh (batch_sizes).

    Returns (tokenizer, config, graphdef, params, lora, mesh, (micro_batch, eval_batch, global_batch)): the tokenizer
    with the markers added (else the one given), the model split into its graph and parameters, and lora as
    attach_lora gives it (None without LoRA)."""
    from flaxlm.models import merge_model, split_model
    from flaxlm.reporting.run_log import say
    from flaxlm.tokenization.loading import check_fits
    from flaxlm.training import mesh as meshlib
    from flaxlm.training.pipeline import attach_lora, batch_sizes, load_model
    import jax
    devices = target.devices if target else jax.devices()
    context = getattr(args, "context_parallel_size", 1) or 1
    if context > 1 and args.sharding == "expert":
        raise UserError("--context_parallel_size with --sharding expert is not supported (the experts' exchange "
                        "runs over the batch axes); use --sharding fsdp for a long-context mixture of experts")
    mesh = meshlib.make_mesh(devices, expert=expert_groups(args, model_args, len(devices)), context=context)
    config, model = load_model(model_args, seed=args.seed, script=script, task=task, tokenizer=tokenizer,
                               mesh=mesh if read_sharded else None, sharding=args.sharding,
                               abstract=target is not None, **labels)
    if context > 1:
        check_context_parallel(context, model, config, task, target)
    if args.sharding == "expert" and not getattr(config, "num_experts", 0):
        raise UserError(f"--sharding expert splits a mixture of experts' experts, and this {config.model_type} model "
                        f"has none; use --sharding fsdp")
    if chat_markers:
        graphdef, params = split_model(model)
        tokenizer, config, params = add_tokens(tokenizer, config, params, chat_markers,
                                               multiple=model.execution.vocab_multiple)
        model = merge_model(graphdef, params)
        model.set_vocab_size(config.vocab_size)  # (tables padded in memory: the rows the head keeps)
        say(f"added the chat template's {', '.join(chat_markers)} to the vocabulary ({config.vocab_size} rows), each "
            f"row the mean of its pieces' rows")
    lora = None
    if lora_args is not None:  # an adapter's trainable tokens may grow the vocabulary to its tokenizer's
        model, lora = attach_lora(lora_args, model_args, args, config, model, args.seed,
                                  tokens=tokenizer.convert_tokens_to_ids(list(chat_markers)))
    check_fits(tokenizer, config)
    graphdef, params = split_model(model)
    return tokenizer, config, graphdef, params, lora, mesh, batch_sizes(args, mesh)
