"""--train_only / --freeze_steps: continued pretraining that first trains some parameters (the embeddings of a new
vocabulary, adapt_vocabulary.py), then everything.

Which parameters: 'embeddings' is every parameter with a vocabulary-sized first or last dimension (the token
embeddings embed/embedding, embeddings/word/embedding, shared/embedding; the LM head lm_head/kernel; the MLM
head's bias mlm_head/bias), whatever the family; any other pattern is a regular expression searched in the
parameters' '/'-joined paths (layers/0/attn/q_proj/kernel). A pattern that matches nothing is a UserError.

The run has two phases, each with its own optimizer and compiled step (Phases). In the first (steps 1..N) it is

    chain(clip, partition({"train": the optimizer, "frozen": set_to_zero()}, labels))

and the step stops the gradient at the frozen parameters: no gradient is computed for them, they get a zero
update (their values stay bit-identical) and no optimizer state (set_to_zero keeps none). At step N+1 the loop
switches (Phases.switch) to

    chain(clip, partition({"train": the optimizer, "frozen": the optimizer, its schedule shifted by N}, labels))

keeping the trained group's state and starting the frozen group's afresh (zero Adam moments, its own count at 0
for the bias correction) while its learning rate continues the run's schedule. A checkpoint holds the state of
the phase it was written in (steps <= N: the first); a resume reads it back as such (Phases.like_state), so a run
resumed before or after the switch equals an uninterrupted one. Without --freeze_steps (or with N >= the run's
steps) the first phase is the whole run.
"""
import dataclasses
import re

import jax
import optax

from flaxlm.errors import UserError

EMBEDDINGS = "embeddings"
TRAIN, FROZEN = "train", "frozen"  # the optimizer's partition labels


def check_options(args):
    """UserError (one line, before anything is written) for --freeze_steps without --train_only, or a --train_only
    pattern that is not a regular expression."""
    if args.freeze_steps and not args.train_only:
        raise UserError(f"--freeze_steps {args.freeze_steps} trains only the --train_only parameters for that many "
                        f"steps; pass --train_only embeddings (or parameter path patterns) with it")
    for pattern in args.train_only or ():
        if pattern != EMBEDDINGS:
            try:
                re.compile(pattern)
            except re.error as e:
                raise UserError(f"--train_only {pattern!r} is not a regular expression ({e}); patterns are "
                                f"searched in parameter paths such as embed/embedding or lm_head/kernel") from None


def flat_params(params, prefix=""):
    """{'/'-joined path: leaf} of a nested dict of parameters, in order."""
    out = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out.update(flat_params(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def is_embedding(path, shape, vocab_size):
    """Whether the parameter at `path` is vocabulary-shaped: vocab_size is its first or last dimension (position
    tables are left out even when as long as the vocabulary)."""
    return (vocab_size is not None and len(shape) in (1, 2) and vocab_size in (shape[0], shape[-1])
            and "position" not in path)


def trainable_mask(params, patterns, vocab_size):
    """A tree like params of bools: True for the parameters --train_only names (the module docstring). UserError,
    naming the paths' form, when a pattern matches no parameter."""
    flat = flat_params(params)
    chosen = set()
    for pattern in patterns:
        if pattern == EMBEDDINGS:
            hits = {p for p, x in flat.items() if is_embedding(p, x.shape, vocab_size)}
            if not hits:
                raise UserError(f"--train_only embeddings: no parameter has the vocabulary's size ({vocab_size}) as "
                                f"its first or last dimension; name them by path instead, e.g. "
                                f"{_examples(list(flat))}")
        else:
            hits = {p for p in flat if re.search(pattern, p)}
            if not hits:
                raise UserError(f"--train_only {pattern} matches no parameter; patterns are regular expressions "
                                f"searched in the '/'-joined parameter paths, which here look like "
                                f"{_examples(list(flat))} ('embeddings': the vocabulary-sized ones)")
        chosen |= hits

    def walk(tree, prefix=""):
        return {k: walk(v, f"{prefix}{k}/") if isinstance(v, dict) else f"{prefix}{k}" in chosen
                for k, v in tree.items()}
    return walk(params)


def _examples(paths, n=4):
    """A few of `paths`: the first ones and one of the first layer's, comma-separated."""
    layer = [p for p in paths if re.search(r"(^|/)0/", p)][:1]
    picked = list(dict.fromkeys(paths[:2] + layer + paths[-1:]))[:n]
    return ", ".join(picked)


def describe(params, trainable, freeze_steps, total_steps):
    """'training only 2 of 37 parameter arrays (66.6K of 182K numbers: embed/embedding, lm_head/kernel) for the
    first 10 steps, then everything'."""
    flat, mask = flat_params(params), flat_params(trainable)
    names = [p for p in flat if mask[p]]
    numbers = sum(flat[p].size for p in names)
    total = sum(x.size for x in flat.values())
    shown = ", ".join(names[:6]) + (f", ... ({len(names) - 6} more)" if len(names) > 6 else "")
    when = (f"for the first {freeze_steps} step{'s' if freeze_steps > 1 else ''}, then everything"
            if freeze_steps and freeze_steps < total_steps else "for the whole run")
    return (f"training only {len(names)} of {len(flat)} parameter arrays ({_human(numbers)} of {_human(total)} "
            f"numbers: {shown}) {when}")


def _human(n):
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


@dataclasses.dataclass(frozen=True)
class Phase:
    tx: optax.GradientTransformation
    trainable: object = None  # tree of bools: the parameters the step differentiates (None: all)


class Phases:
    """The optimizer of each stretch of a run: `first` for steps 1..switch_step, `then` after them (no switch:
    `first` throughout). Step numbers here are 0-based step indices, as the loop's; a checkpoint after `done`
    steps holds the state of the phase of step done - 1."""

    def __init__(self, first, then=None, switch_step=None):
        self.phases = [first] + ([then] if then is not None else [])
        self.switch_step = switch_step if then is not None else None

    def __getitem__(self, i):
        return self.phases[i]

    def index_at(self, step):
        """The phase of 0-based step `step`."""
        return 0 if self.switch_step is None or step < self.switch_step else 1

    def index_after(self, done):
        """The phase whose state a checkpoint after `done` steps holds."""
        return self.index_at(max(done - 1, 0))

    def like_state(self, state, mesh, sharding):
        """What a checkpoint restores into: `state` (the first phase's), or for a checkpoint past the switch a
        function of its step giving the second phase's abstract state (flaxlm.training.checkpoint takes either)."""
        if self.switch_step is None:
            return state

        def like(done):
            if self.index_after(done) == 0:
                return state
            from flaxlm.training.train_step import abstract_state
            return abstract_state(state["params"], self[1].tx, mesh, sharding)[0]
        return like

    def largest_state(self, state, mesh, sharding):
        """The last phase's train state (abstract): the one checkpoints grow to."""
        if len(self.phases) == 1:
            return state
        from flaxlm.training.train_step import abstract_state
        return abstract_state(state["params"], self[-1].tx, mesh, sharding)[0]

    def switch(self, state, mesh, sharding):
        """(the second phase's state from the first's, its shardings): the trained group's optimizer state kept,
        the newly trained group's fresh (zero moments); the step, params and schedule go on."""
        from flaxlm.training.train_step import abstract_state
        _, shardings = abstract_state(state["params"], self[1].tx, mesh, sharding)
        then = self[1].tx

        def to_second(s):
            return {**s, "opt_state": _carry_trained(s["opt_state"], then.init(s["params"]))}
        return jax.jit(to_second, out_shardings=shardings, donate_argnums=0)(state), shardings


def as_phases(tx):
    """A Phases for tx: itself, or one phase of a plain optax transformation (a usual run)."""
    return tx if isinstance(tx, Phases) else Phases(Phase(tx))


def make_phases(base, clip, schedule, trainable, switch_step):
    """The Phases of a --train_only run: base(schedule) -> the optimizer, clip(tx) -> tx after clipping, schedule
    the run's learning rate by step, trainable the tree of bools, switch_step the steps of the first phase (None:
    the whole run)."""
    labels = jax.tree.map(lambda t: TRAIN if t else FROZEN, trainable)
    first = Phase(clip(optax.partition({TRAIN: base(schedule), FROZEN: optax.set_to_zero()}, labels)), trainable)
    if switch_step is None:
        return Phases(first)
    shifted = base(lambda count: schedule(count + switch_step))  # the frozen group's count starts at the switch
    return Phases(first, Phase(clip(optax.partition({TRAIN: base(schedule), FROZEN: shifted}, labels))), switch_step)


def _carry_trained(old, fresh):
    """The second phase's optimizer state `fresh` with the trained group's state taken from the first's `old`
    (the chain's states are a tuple; the clipping's is empty)."""
    if isinstance(fresh, optax.transforms.PartitionState):
        return fresh._replace(inner_states={**fresh.inner_states, TRAIN: old.inner_states[TRAIN]})
    if type(fresh) is tuple:
        return tuple(_carry_trained(o, f) for o, f in zip(old, fresh))
    return old
