"""Learning-rate schedules by transformers' names (--lr_scheduler_type, --lr_scheduler_kwargs), each the rate
transformers' get_scheduler gives at every optimizer step:

    schedule = make_schedule("cosine", learning_rate=3e-4, warmup_steps=100, total_steps=10_000, kwargs={})
    schedule(step)  # the rate of the optimizer's update number `step` (0 for the first), float32

Every schedule but `constant` warms up linearly from 0 over warmup_steps (transformers' own warmups; WSD's may
also be cosine or 1-sqrt). optax builds those it has (linear, cosine, polynomial, constant); the others follow
transformers' formulas (transformers/optimization.py) in jnp. A schedule is a function of the optimizer's step
count, which the checkpoint holds: a resumed run continues the same rates. Warmup-stable-decay keeps the peak
rate until num_decay_steps before the end: a run continued with a larger --max_steps stays at the peak, and one
branched from a stable-phase checkpoint with --max_steps STEP+N and num_decay_steps N cools down from there
(docs/pretraining.md#warmup-stable-decay)."""
import json
import math

import jax.numpy as jnp
import optax

from flaxlm.errors import UserError

# name: the --lr_scheduler_kwargs it takes (transformers' keyword arguments of that schedule)
SCHEDULES = {
    "linear": (),
    "cosine": ("num_cycles",),
    "cosine_with_restarts": ("num_cycles",),
    "polynomial": ("lr_end", "power"),
    "constant": (),
    "constant_with_warmup": (),
    "inverse_sqrt": ("timescale",),
    "cosine_with_min_lr": ("num_cycles", "min_lr", "min_lr_rate"),
    "cosine_warmup_with_min_lr": ("num_cycles", "min_lr", "min_lr_rate", "warmup_lr_rate"),
    "warmup_stable_decay": ("num_decay_steps", "num_stable_steps", "warmup_type", "decay_type", "min_lr_ratio",
                            "num_cycles"),
}
OWN_WARMUP = {"constant", "cosine_warmup_with_min_lr", "warmup_stable_decay"}  # none, or not transformers' usual one
NOT_A_FUNCTION_OF_THE_STEP = {"reduce_lr_on_plateau", "greedy"}  # transformers' schedules driven by a metric
WSD_SHAPES = ("linear", "cosine", "1-sqrt")


def parse_kwargs(text):
    """--lr_scheduler_kwargs: a JSON object (transformers' format), or None / "" for none."""
    if text in (None, "", {}):
        return {}
    if isinstance(text, dict):
        return text
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"--lr_scheduler_kwargs {text!r} is not JSON ({e.msg}); give an object, e.g. "
                        f"'{{\"num_cycles\": 0.5}}'") from None
    if not isinstance(kwargs, dict):
        raise UserError(f"--lr_scheduler_kwargs {text!r} is not a JSON object; give one, e.g. "
                        f"'{{\"num_cycles\": 0.5}}'")
    return kwargs


def warmup_steps_of(warmup_steps, warmup_ratio, total_steps):
    """transformers' TrainingArguments.get_warmup_steps: --warmup_steps when at least 1 (a float below 1 is a
    ratio, as transformers 5 reads it), else ceil(total_steps * --warmup_ratio) (transformers 4's flag)."""
    if warmup_steps and warmup_steps >= 1:
        return int(warmup_steps)
    return math.ceil(total_steps * (warmup_steps or warmup_ratio or 0.0))


def make_schedule(name, learning_rate, warmup_steps, total_steps, kwargs=None):
    """The optax schedule (count -> rate) of transformers' `name` at peak learning_rate; UserError for an unknown
    name or keyword, or values transformers refuses."""
    kwargs = parse_kwargs(kwargs)
    if name in NOT_A_FUNCTION_OF_THE_STEP:
        raise UserError(f"--lr_scheduler_type {name} follows an evaluation metric, which flaxlm's schedules (a "
                        f"function of the step, so that a resumed run is exact) cannot; use cosine or "
                        f"warmup_stable_decay")
    if name not in SCHEDULES:
        raise UserError(f"--lr_scheduler_type {name} is not one of transformers' schedules; pass one of "
                        f"{', '.join(SCHEDULES)}")
    unknown = sorted(set(kwargs) - set(SCHEDULES[name]))
    if unknown:
        takes = ", ".join(SCHEDULES[name]) or "none"
        raise UserError(f"--lr_scheduler_kwargs: {name} takes no {', '.join(unknown)} (it takes: {takes})")
    lr, w, T = float(learning_rate), int(warmup_steps), int(total_steps)
    after = _AFTER_WARMUP[name](lr, w, T, **kwargs)
    if name in OWN_WARMUP:
        return after  # a function of the step itself
    warmup = optax.linear_schedule(0.0, lr, max(w, 1))  # transformers: step / max(1, warmup)
    return optax.join_schedules([warmup, after], [w])  # after(steps since the warmup)


def _linear(lr, w, T):
    return optax.linear_schedule(lr, 0.0, max(T - w, 1))


def _cosine(lr, w, T, num_cycles=0.5):
    if num_cycles == 0.5:
        return optax.cosine_decay_schedule(lr, max(T - w, 1))
    return _scaled(lr, lambda s: jnp.maximum(0.0, _half_cosine(_progress(s, T - w), num_cycles)))


def _cosine_with_restarts(lr, w, T, num_cycles=1):
    def factor(s):
        p = _progress(s, T - w)
        return jnp.where(p >= 1.0, 0.0, jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(jnp.pi * ((num_cycles * p) % 1.0)))))
    return _scaled(lr, factor)


def _polynomial(lr, w, T, lr_end=1e-7, power=1.0):
    if not lr > lr_end:
        raise UserError(f"--lr_scheduler_kwargs lr_end {lr_end} must be below --learning_rate {lr} (polynomial)")
    return optax.polynomial_schedule(lr, lr_end, power, max(T - w, 1))  # lr_end past T, as transformers


def _constant(lr, w, T):
    return optax.constant_schedule(lr)


def _inverse_sqrt(lr, w, T, timescale=None):
    timescale = timescale or w or 10_000
    return _scaled(lr, lambda s: 1.0 / jnp.sqrt((s + timescale) / timescale))  # transformers' (step + shift)


def _min_lr_rate(lr, min_lr, min_lr_rate, name):
    if min_lr is not None and min_lr_rate is not None:
        raise UserError(f"--lr_scheduler_kwargs: {name} takes min_lr or min_lr_rate, not both")
    if min_lr is None and min_lr_rate is None:
        raise UserError(f"--lr_scheduler_kwargs: {name} needs min_lr or min_lr_rate, e.g. '{{\"min_lr_rate\": 0.1}}'")
    return min_lr / lr if min_lr is not None else min_lr_rate


def _cosine_with_min_lr(lr, w, T, num_cycles=0.5, min_lr=None, min_lr_rate=None):
    rate = _min_lr_rate(lr, min_lr, min_lr_rate, "cosine_with_min_lr")
    return _scaled(lr, lambda s: jnp.maximum(0.0, _half_cosine(_progress(s, T - w), num_cycles) * (1 - rate) + rate))


def _cosine_warmup_with_min_lr(lr, w, T, num_cycles=0.5, min_lr=None, min_lr_rate=None, warmup_lr_rate=None):
    """Its own warmup, as transformers': (step + 1) / warmup, or from warmup_lr_rate; the decay one step ahead."""
    rate = _min_lr_rate(lr, min_lr, min_lr_rate, "cosine_warmup_with_min_lr")

    def factor(count):
        c = jnp.asarray(count, jnp.float32)
        if warmup_lr_rate is None:
            warming = (c + 1.0) / max(1.0, w)
        else:
            warming = warmup_lr_rate + (1.0 - warmup_lr_rate) * c / max(1, w - 1)
        p = (c - w + 1.0) / max(1.0, T - w)
        decaying = jnp.maximum(0.0, _half_cosine(p, num_cycles) * (1 - rate) + rate)
        return jnp.where(c < w, warming, decaying)
    return lambda count: lr * factor(count)


def _warmup_stable_decay(lr, w, T, num_decay_steps=None, num_stable_steps=None, warmup_type="linear",
                         decay_type="cosine", min_lr_ratio=0.0, num_cycles=0.5):
    """transformers' get_wsd_schedule: its own warmup (from min_lr_ratio, of warmup_type), the peak for
    num_stable_steps (default: up to num_decay_steps before --max_steps), then the decay to min_lr_ratio."""
    if num_decay_steps is None:
        raise UserError("--lr_scheduler_kwargs: warmup_stable_decay needs num_decay_steps (the cooldown), e.g. "
                        "'{\"num_decay_steps\": 2000}' for the last 2000 steps")
    for what, shape in (("warmup_type", warmup_type), ("decay_type", decay_type)):
        if shape not in WSD_SHAPES:
            raise UserError(f"--lr_scheduler_kwargs {what} {shape!r} is none of {', '.join(WSD_SHAPES)}")
    stable = T - w - num_decay_steps if num_stable_steps is None else num_stable_steps
    if stable < 0:
        raise UserError(f"--lr_scheduler_kwargs num_decay_steps {num_decay_steps} leaves no room in --max_steps {T} "
                        f"after {w} warmup steps; lower it or raise --max_steps")

    def shaped(kind, p):
        if kind == "linear":
            return p
        if kind == "cosine":
            return 0.5 * (1.0 - jnp.cos(jnp.pi * p))
        return 1.0 - jnp.sqrt(1.0 - p)

    def factor(count):
        c = jnp.asarray(count, jnp.float32)
        warming = shaped(warmup_type, jnp.clip(c / max(1, w), 0.0, 1.0))
        p = (c - w - stable) / max(1, num_decay_steps)
        decay = {"linear": 1.0 - p, "cosine": _half_cosine(p, num_cycles),
                 "1-sqrt": 1.0 - jnp.sqrt(jnp.clip(p, 0.0, 1.0))}[decay_type]
        floor = min_lr_ratio
        return jnp.where(c < w, jnp.maximum(0.0, warming * (1.0 - floor) + floor),
                         jnp.where(c < w + stable, 1.0,
                                   jnp.where(c < w + stable + num_decay_steps,
                                             jnp.maximum(0.0, decay * (1.0 - floor) + floor), floor)))
    return lambda count: lr * factor(count)


def _progress(steps_after_warmup, span):
    return steps_after_warmup / max(1, span)


def _half_cosine(p, num_cycles):
    return 0.5 * (1.0 + jnp.cos(jnp.pi * num_cycles * 2.0 * p))


def _scaled(lr, factor):
    """A schedule after the warmup (optax.join_schedules hands it the steps since), lr times factor."""
    return lambda count: lr * factor(jnp.asarray(count, jnp.float32))


_AFTER_WARMUP = {"linear": _linear, "cosine": _cosine, "cosine_with_restarts": _cosine_with_restarts,
                 "polynomial": _polynomial, "constant": _constant, "constant_with_warmup": _constant,
                 "inverse_sqrt": _inverse_sqrt, "cosine_with_min_lr": _cosine_with_min_lr,
                 "cosine_warmup_with_min_lr": _cosine_warmup_with_min_lr,
                 "warmup_stable_decay": _warmup_stable_decay}
