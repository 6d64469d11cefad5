"""Optimizers: AdamW or Adafactor with linear warmup then linear decay, clipping, masked weight decay."""
import optax


def linear_schedule(learning_rate, warmup_steps, total_steps):
    """0 -> learning_rate over warmup_steps, then linearly to 0 at total_steps (HF's Flax examples)."""
    warmup = optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1))
    decay = optax.linear_schedule(learning_rate, 0.0, max(total_steps - warmup_steps, 1))
    return optax.join_schedules([warmup, decay], [warmup_steps])


def make_optimizer(args, total_steps, decay_mask, trainable=None):
    """The optax transformation for TrainingArgs; weight decay skips biases and LayerNorm (decay_mask).

    Unlike Hugging Face's scripts, --weight_decay also applies with --adafactor (decoupled, scaled by
    the learning rate as in AdamW).

    With `trainable` (--train_only's tree of bools like the params) the first item is a
    flaxlm.training.freeze.Phases instead: the optimizer of the first --freeze_steps steps (only the trainable
    parameters; the whole run without --freeze_steps) and of the steps after them (every parameter).
    """
    schedule = linear_schedule(args.learning_rate, args.warmup_steps, total_steps)
    if trainable is None:
        return _clipped(args, _base_optimizer(args, schedule, decay_mask)), schedule
    from flaxlm.training.freeze import make_phases
    switch = args.freeze_steps if args.freeze_steps and args.freeze_steps < total_steps else None
    return make_phases(lambda s: _base_optimizer(args, s, decay_mask), lambda tx: _clipped(args, tx), schedule,
                       trainable, switch), schedule


def _base_optimizer(args, schedule, decay_mask):
    """AdamW or Adafactor following `schedule` (a function of the optimizer's step count)."""
    if args.adafactor:
        return optax.adafactor(learning_rate=schedule, weight_decay_rate=args.weight_decay or None,
                               weight_decay_mask=decay_mask)
    return optax.adamw(schedule, b1=args.adam_beta1, b2=args.adam_beta2, eps=args.adam_epsilon,
                       weight_decay=args.weight_decay, mask=decay_mask)


def _clipped(args, tx):
    """tx after clipping the gradient to --max_grad_norm (unless 0)."""
    if args.max_grad_norm and args.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), tx)
    return tx
