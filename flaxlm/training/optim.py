"""Optimizers: AdamW or Adafactor with linear warmup then linear decay, clipping, masked weight decay."""
import optax


def linear_schedule(learning_rate, warmup_steps, total_steps):
    """0 -> learning_rate over warmup_steps, then linearly to 0 at total_steps (HF's Flax examples)."""
    warmup = optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1))
    decay = optax.linear_schedule(learning_rate, 0.0, max(total_steps - warmup_steps, 1))
    return optax.join_schedules([warmup, decay], [warmup_steps])


def make_optimizer(args, total_steps, decay_mask):
    """The optax transformation for TrainingArgs; weight decay skips biases and LayerNorm (decay_mask).

    Unlike Hugging Face's scripts, --weight_decay also applies with --adafactor (decoupled, scaled by
    the learning rate as in AdamW).
    """
    schedule = linear_schedule(args.learning_rate, args.warmup_steps, total_steps)
    if args.adafactor:
        opt = optax.adafactor(learning_rate=schedule, weight_decay_rate=args.weight_decay or None,
                              weight_decay_mask=decay_mask)
    else:
        opt = optax.adamw(schedule, b1=args.adam_beta1, b2=args.adam_beta2, eps=args.adam_epsilon,
                          weight_decay=args.weight_decay, mask=decay_mask)
    if args.max_grad_norm and args.max_grad_norm > 0:
        opt = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), opt)
    return opt, schedule
