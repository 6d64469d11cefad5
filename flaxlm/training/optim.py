"""Optimizers (--optim: AdamW, Adafactor, Muon, schedule-free AdamW) following a schedule of transformers'
(--lr_scheduler_type, flaxlm.training.schedules), with clipping and masked weight decay; eval_params, the parameters
a run evaluates and exports."""
import jax
import optax
from optax.contrib import ScheduleFreeState, schedule_free

from flaxlm.errors import UserError
from flaxlm.training.schedules import make_schedule, warmup_steps_of

OPTIMIZERS = ("adamw", "adafactor", "muon", "schedule_free_adamw")
# transformers' --optim names of AdamW, every one computing AdamW's update (fused, on other devices, in other
# precisions of the same math): they all run optax.adamw here
ADAMW_NAMES = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_torch_xla", "adamw_torch_npu_fused",
               "adamw_apex_fused", "adamw_anyprecision")


def optimizer_name(args):
    """--optim (transformers' names: its AdamW variants are adamw) with --adafactor (transformers' older flag) as
    adafactor; UserError for an optimizer flaxlm does not have."""
    name = getattr(args, "optim", "adamw") or "adamw"
    name = "adamw" if name in ADAMW_NAMES else name
    if args.adafactor:
        if name not in ("adamw", "adafactor"):
            raise UserError(f"--adafactor and --optim {name} name two optimizers; pass one (--optim adafactor is "
                            f"--adafactor)")
        return "adafactor"
    if name not in OPTIMIZERS:
        raise UserError(f"--optim {name} is not one of flaxlm's optimizers; pass {', '.join(OPTIMIZERS)} "
                        f"(transformers' {', '.join(ADAMW_NAMES)} run as adamw)")
    return name


def check_optimizer_options(args):
    """UserError for an unknown --optim or --lr_scheduler_type, or --lr_scheduler_kwargs the schedule does not take
    (before any work: the schedule's length is known only once the data is)."""
    optimizer_name(args)
    name, kwargs = getattr(args, "lr_scheduler_type", "linear") or "linear", getattr(args, "lr_scheduler_kwargs", None)
    make_schedule(name, args.learning_rate or 1.0, 0, 1 << 30, kwargs)


def run_schedule(args, total_steps):
    """The learning rate by optimizer step: --lr_scheduler_type (default linear, as the Flax examples) with
    --lr_scheduler_kwargs, warming up for --warmup_steps (or --warmup_ratio of total_steps)."""
    warmup = warmup_steps_of(args.warmup_steps, getattr(args, "warmup_ratio", 0.0), total_steps)
    return make_schedule(getattr(args, "lr_scheduler_type", "linear") or "linear", args.learning_rate, warmup,
                         total_steps, getattr(args, "lr_scheduler_kwargs", None))


def make_optimizer(args, total_steps, decay_mask, trainable=None, params=None, vocab_size=None, config=None):
    """The optax transformation for TrainingArgs; weight decay skips biases and LayerNorm (decay_mask). params,
    vocab_size and config (the model's): which parameters --optim muon trains with Muon (flaxlm.training.muon).

    Unlike Hugging Face's scripts, --weight_decay also applies with --adafactor (decoupled, scaled by
    the learning rate as in AdamW).

    With `trainable` (--train_only's tree of bools like the params) the first item is a
    flaxlm.training.freeze.Phases instead: the optimizer of the first --freeze_steps steps (only the trainable
    parameters; the whole run without --freeze_steps) and of the steps after them (every parameter).
    """
    name = optimizer_name(args)
    schedule = run_schedule(args, total_steps)

    def base(s):
        return _base_optimizer(name, args, s, decay_mask, params, vocab_size, config)
    if trainable is None:
        return _clipped(args, base(schedule)), schedule
    from flaxlm.training.freeze import make_phases
    switch = args.freeze_steps if args.freeze_steps and args.freeze_steps < total_steps else None
    return make_phases(base, lambda tx: _clipped(args, tx), schedule, trainable, switch), schedule


def _base_optimizer(name, args, schedule, decay_mask, params, vocab_size, config):
    """The optimizer `name` following `schedule` (a function of the optimizer's step count)."""
    if name == "adafactor":
        return optax.adafactor(learning_rate=schedule, weight_decay_rate=args.weight_decay or None,
                               weight_decay_mask=decay_mask)
    if name == "muon":
        if params is None:
            raise ValueError("--optim muon needs the params (which of them are matrices)")
        from flaxlm.training.muon import muon_optimizer
        return muon_optimizer(schedule, params, args, decay_mask, vocab_size, config)
    if name == "schedule_free_adamw":
        return schedule_free_adamw(schedule, args, decay_mask)
    return optax.adamw(schedule, b1=args.adam_beta1, b2=args.adam_beta2, eps=args.adam_epsilon,
                       weight_decay=args.weight_decay, mask=decay_mask)


def schedule_free_adamw(schedule, args, decay_mask):
    """Schedule-free AdamW (Defazio et al. 2024) as optax.contrib.schedule_free_adamw builds it, its weight decay on
    the decay mask: Adam's second moment without momentum, inside optax.contrib.schedule_free's averaging (b1:
    --adam_beta1). The params it trains are the point where gradients are taken; eval_params gives the average a run
    evaluates and exports."""
    base = optax.chain(optax.scale_by_rms(decay=args.adam_beta2, eps=args.adam_epsilon, eps_in_sqrt=False,
                                          bias_correction=True),
                       optax.add_decayed_weights(args.weight_decay, decay_mask),
                       optax.scale_by_learning_rate(schedule))
    return schedule_free(base, learning_rate=schedule, b1=args.adam_beta1)


def _is_schedule_free(node):
    return isinstance(node, ScheduleFreeState)


def eval_params(state):
    """The parameters a train state evaluates and exports: state["params"], or under schedule-free AdamW its
    averaged iterate x = (y - (1 - b1) z) / b1 (optax.contrib.schedule_free_eval_params), for each parameter its
    schedule-free state holds (--train_only's frozen ones: theirs as they are)."""
    found = [n for n in jax.tree.leaves(state["opt_state"], is_leaf=_is_schedule_free) if _is_schedule_free(n)]
    return _averaged(state["params"], found) if found else state["params"]


@jax.jit
def _averaged(params, schedule_free_states):
    x = params
    for s in schedule_free_states:
        x = jax.tree.map(lambda x_, y, z: x_ if isinstance(z, optax.MaskedNode) else (y - (1 - s.b1) * z) / s.b1,
                         x, params, s.z)
    return x


def _clipped(args, tx):
    """tx after clipping the gradient to --max_grad_norm (unless 0)."""
    if args.max_grad_norm and args.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), tx)
    return tx
