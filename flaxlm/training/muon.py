"""--optim muon: optax.contrib.muon for the hidden matrices, AdamW for the rest, as Moonlight and MaxText split them.

    tx = muon_optimizer(schedule, params, args, decay_mask, vocab_size, config)

Muon orthogonalizes each matrix's momentum (Newton-Schulz); that is what a matrix that maps one hidden vector to
another is for. Embeddings, the LM head (anything with a vocabulary-sized side), position tables and every vector
(norms, biases) train with AdamW (--adam_beta1/2, --adam_epsilon, --weight_decay on the decay mask). Which matrix is
one matrix: a kernel [in, out] is one; the leading axis of a 3-D tensor (a mixture's experts [E, out, in]) counts
matrices, each orthogonalized alone; a fused tensor (GPT-2's qkv [D, 3D], a mixture's gate_up_proj [E, 2I, D]) is
cut into its parts by its family's `matrices` (flaxlm.models.family), so q, k and v are each their own, as
Moonlight and MaxText do. The update is scaled to AdamW's RMS (Moonlight's 0.2 * sqrt(max(fan_in, fan_out)):
optax's consistent_rms), so an AdamW learning rate and weight decay carry over. One momentum buffer per matrix
instead of AdamW's two."""
import math

import jax
import optax
from optax.contrib import MuonDimensionNumbers, muon

from flaxlm.models.lora import LORA_LEAVES

MOONLIGHT_RMS = 0.2  # Moonlight's (Liu et al. 2025) match of AdamW's update RMS
MOMENTUM = 0.95  # Muon's and Moonlight's
ONE_MATRIX = MuonDimensionNumbers(reduction_axis=0, output_axis=1)
STACKED = MuonDimensionNumbers(reduction_axis=1, output_axis=2)  # [count, a, b]: count matrices


def matrix_plan(params, vocab_size=None, config=None):
    """{parameter path (a tuple of keys): None (AdamW) or (the shape it is viewed in, MuonDimensionNumbers of that
    view)} for every parameter."""
    fused = {}
    if config is not None:
        from flaxlm.models import family_of
        matrices = family_of(config).matrices
        fused = matrices(config) if matrices else {}
    plan = {}
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        plan[keys] = _plan_one(keys, tuple(x.shape), vocab_size, fused)
    return plan


def _plan_one(keys, shape, vocab_size, fused):
    if len(shape) < 2 or "embedding" in keys or (vocab_size is not None and vocab_size in shape):
        return None
    if keys[-1] in LORA_LEAVES:  # a LoRA adapter's low-rank factor is not the matrix it adapts: AdamW
        return None
    for suffix, view in fused.items():
        if keys[-len(suffix):] == suffix:
            return view(shape)
    if len(shape) == 2:
        return shape, ONE_MATRIX
    if len(shape) == 3:
        return shape, STACKED
    return None


def describe(params, vocab_size=None, config=None):
    """One line: how many parameters Muon trains and how many AdamW, and the optimizer state saved (or, for LoRA's
    adapters, that they train with AdamW)."""
    plan = matrix_plan(params, vocab_size, config)
    sizes = {keys: math.prod(x.shape) for keys, x in _flat(params).items()}
    muon_n = sum(sizes[k] for k, v in plan.items() if v is not None)
    adam_n = sum(sizes[k] for k, v in plan.items() if v is None)
    if any(keys[-1] in LORA_LEAVES for keys in plan) and not muon_n:
        return ("--optim muon with LoRA: the adapters' low-rank factors are not the hidden matrices Muon "
                "orthogonalizes, so they train with AdamW, as --optim adamw")
    share = 100 * muon_n / max(muon_n + adam_n, 1)
    return (f"--optim muon: Muon for the hidden matrices ({muon_n:,} parameters, {share:.0f} %), AdamW for the "
            f"embeddings, head, norms and biases ({adam_n:,}); one momentum buffer instead of AdamW's two saves "
            f"{4 * muon_n / 2**20:,.1f} MiB of float32 optimizer state")


def muon_optimizer(schedule, params, args, decay_mask, vocab_size=None, config=None):
    """The optax transformation: the plan's matrices through optax.contrib.muon (momentum 0.95, Nesterov,
    5 Newton-Schulz steps, consistent RMS 0.2, --weight_decay decoupled as AdamW's), the rest through optax.adamw;
    both follow `schedule`."""
    plan = matrix_plan(params, vocab_size, config)
    views = {keys: view for keys, view in plan.items() if view is not None}
    labels = lambda tree: _map_with_keys(lambda keys, x: "muon" if keys in views else "adamw", tree)  # noqa: E731
    # (a function of the tree it is given: inside --train_only's partition the frozen leaves arrive masked)
    dims = lambda viewed: _map_with_keys(lambda keys, x: views[keys][1], viewed)  # noqa: E731
    matrices = _in_views(views, muon(schedule, beta=MOMENTUM, weight_decay=args.weight_decay,
                                     muon_weight_dimension_numbers=dims, consistent_rms=MOONLIGHT_RMS))
    rest = optax.adamw(schedule, b1=args.adam_beta1, b2=args.adam_beta2, eps=args.adam_epsilon,
                       weight_decay=args.weight_decay, mask=decay_mask)
    return optax.partition({"muon": matrices, "adamw": rest}, labels)


def _in_views(views, inner):
    """inner, run on every leaf reshaped to its planned view (its MuonDimensionNumbers then refer to the view);
    updates back in the leaves' own shapes. Leaves of the other partition arrive masked (optax.partition) and are
    left as they are."""
    def to_views(tree):
        return _map_with_keys(lambda keys, x: x.reshape(views[keys][0]), tree)

    def init(params):
        return inner.init(to_views(params))

    def update(updates, state, params=None):
        shapes = _flat(updates)
        new, state = inner.update(to_views(updates), state, None if params is None else to_views(params))
        return _map_with_keys(lambda keys, u: u.reshape(shapes[keys].shape), new), state
    return optax.GradientTransformation(init, update)


def _map_with_keys(fn, tree):
    return jax.tree_util.tree_map_with_path(lambda path, x: fn(tuple(str(getattr(k, "key", k)) for k in path), x),
                                            tree)


def _flat(params):
    return {tuple(str(getattr(k, "key", k)) for k in path): x
            for path, x in jax.tree_util.tree_leaves_with_path(params)}
