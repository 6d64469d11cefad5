"""ELECTRA's objective (Clark et al. 2020, replaced-token detection): a small masked-LM generator fills the masked
slots with tokens sampled from its softmax, and the discriminator tells for every real token whether it was
replaced; the two are trained together, sharing one set of embeddings. The same objective trains DeBERTa-v3
(He et al. 2021): a deberta-v2 generator (as wide as the discriminator, half as deep) and discriminator.

    shared = check_pair(generator_config, discriminator_config)      # the embeddings the two share
    params = join_params(generator_params, discriminator_params, shared=shared)  # one pytree: the train state's
    objective = electra_objective(gen_graphdef, disc_graphdef, gen_config, disc_config, masker, seq_len)
    model_params(params, "discriminator")                              # one model's whole params (export)

loss = the generator's MLM loss (mean over the masked slots) + discriminator_weight x the discriminator's binary
loss (mean over the real tokens). A sampled token equal to the original counts as original. Sampling is
stop-gradient (the generator learns from its MLM loss only).

Shared embeddings (SHARED, per family): ELECTRA's word, position and token-type tables and their LayerNorm (each
model keeps its own embeddings projection to its hidden_size); DeBERTa-v3's word table (and absolute positions
when position_biased_input), as Microsoft's code shares them. They are one set of params under
params["embeddings"], used by both models.
With --embedding_sharing gdes (DeBERTa-v3's gradient-disentangled sharing) the set is the generator's and the
discriminator adds a delta of its own, its loss not reaching the set (join_params).

The loop divides every sum by the count of masked slots ("weight_sum"); the discriminator's sums are scaled by the
ratio of masked slots to real tokens of the rows collated together (a train step's rows on this host, however the
step cuts them into pieces; an evaluation batch), so that they come out as means per real token: exact for a train
step on one host; across hosts and evaluation batches, a mean of their means weighted by their masked slots.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from flaxlm.errors import UserError
from flaxlm.models import merge_model
from flaxlm.training.flops import electra_train_flops
from flaxlm.training.objective import Objective

EMBEDDINGS = ("word", "position", "token_type", "norm")  # ELECTRA's shared set; "project" is each model's own
# model_type -> (the embeddings the two models share, the config fields that must then agree, presets to suggest:
# a generator and a discriminator)
SHARED = {"electra": (EMBEDDINGS, ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size"),
                      ("electra-small-generator", "electra-small-discriminator")),
          "deberta-v2": (("word", "position"), ("vocab_size", "hidden_size", "position_biased_input",
                                                "max_position_embeddings"),
                         ("deberta-v3-small-generator", "deberta-v3-small"))}


def check_pair(generator, discriminator):
    """The names of the embeddings the two models share (SHARED); UserError unless the generator's config (of the
    discriminator's family, at most as wide) can share the discriminator's: the same vocabulary, widths,
    positions and token types."""
    kind = discriminator.model_type
    if kind not in SHARED or generator.model_type != kind:
        raise UserError(f"replaced-token-detection pretraining needs two configs of one family ({' or '.join(SHARED)})"
                        f", got a {generator.model_type} generator and a {discriminator.model_type} discriminator; "
                        f"write them with create_config.py --preset {' / '.join(SHARED['electra'][2])} (or "
                        f"{' / '.join(SHARED['deberta-v2'][2])})")
    shared, agree, presets = SHARED[kind]
    if generator.hidden_size > discriminator.hidden_size:
        raise UserError(f"the generator (hidden_size {generator.hidden_size}) is wider than the discriminator "
                        f"({discriminator.hidden_size}); the generator is smaller (ELECTRA's a quarter to a half as "
                        f"wide, DeBERTa-v3's half as deep): pick a smaller generator config, e.g. --preset "
                        f"{presets[0]}")
    for name in agree:
        if getattr(generator, name, None) != getattr(discriminator, name, None):
            raise UserError(f"the generator's {name} {getattr(generator, name, None)} differs from the "
                            f"discriminator's {getattr(discriminator, name, None)}, so they cannot share embeddings; "
                            f"make them equal in the generator's config.json")
    return shared


def _without_shared(params, shared):
    return {**params, "embeddings": {k: v for k, v in params["embeddings"].items() if k not in shared}}


def join_params(generator, discriminator, sharing="shared", new_discriminator=False, shared=EMBEDDINGS):
    """The train state's params: a shared set of embeddings (the names `shared` that the models have;
    check_pair's) and each model's other params.

    sharing "shared" (ELECTRA): the discriminator's embeddings are the set, trained by both losses. "gdes"
    (DeBERTa-v3's gradient-disentangled sharing): the generator's are the set, trained by its loss only; the
    discriminator's are stop_gradient(set) + its own delta ("embeddings_delta"), its embeddings minus the
    generator's: zero when the discriminator is new (new_discriminator), as the paper starts it."""
    names = [k for k in shared if k in discriminator["embeddings"]]
    disc_own, gen_own = _without_shared(discriminator, names), _without_shared(generator, names)
    if sharing == "shared":
        return {"embeddings": {k: discriminator["embeddings"][k] for k in names},
                "generator": gen_own, "discriminator": disc_own}
    shared = {k: generator["embeddings"][k] for k in names}
    def delta_of(d, g):
        return jnp.zeros_like(g) if new_discriminator else d - g
    abstract = isinstance(jax.tree.leaves(shared)[0], jax.ShapeDtypeStruct)  # --compile_for: shapes only
    delta = jax.tree.map(lambda d, g: jax.eval_shape(delta_of, d, g) if abstract else delta_of(d, g),
                         {k: discriminator["embeddings"][k] for k in names}, shared)
    return {"embeddings": shared, "generator": gen_own,
            "discriminator": {**disc_own, "embeddings_delta": delta}}


def model_params(params, name):
    """The whole params of model `name` ("generator" or "discriminator"): its own and the shared embeddings (with
    gdes sharing, the discriminator's are stop_gradient(shared) + its delta)."""
    own, shared = dict(params[name]), params["embeddings"]
    delta = own.pop("embeddings_delta", None)
    if delta is not None:
        shared = jax.tree.map(lambda s, d: jax.lax.stop_gradient(s) + d, shared, delta)
    return {**own, "embeddings": {**own["embeddings"], **shared}}


def _put(ids_BL, positions_BP, values_BP, weights_BP):
    """ids_BL with values_BP written at the masked slots (empty slots, weight 0, write nothing)."""
    B, L = ids_BL.shape
    pos_BP = jnp.where(weights_BP > 0, positions_BP, L)  # out of range: dropped
    return ids_BL.at[jnp.arange(B)[:, None], pos_BP].set(values_BP.astype(ids_BL.dtype), mode="drop")


def electra_sums(gen_logits_BPV, sample_BP, corrupted_BL, disc_logits_BL, batch, real_BL, discriminator_weight):
    """The loss sums of one batch piece from the generator's logits at the masked slots, its samples there, the
    rows they corrupt and the discriminator's logits on those; real_BL: the tokens the discriminator is judged on."""
    labels_BP, w_BP = batch["masked_labels"], batch["masked_weights"]
    xent_BP = optax.softmax_cross_entropy_with_integer_labels(gen_logits_BPV, labels_BP)
    label_logit_BP = jnp.take_along_axis(gen_logits_BPV, labels_BP[..., None], axis=-1)[..., 0]
    gen_correct_BP = label_logit_BP >= gen_logits_BPV.max(-1)  # an exact tie counts, as in lm_loss
    original_BL = _put(batch["input_ids"], batch["masked_positions"], labels_BP, w_BP)
    replaced_BL = corrupted_BL != original_BL
    bce_BL = optax.sigmoid_binary_cross_entropy(disc_logits_BL, replaced_BL.astype(jnp.float32))
    disc_correct_BL = (disc_logits_BL > 0) == replaced_BL
    n_masked, real_BL = w_BP.sum(), real_BL.astype(jnp.float32)
    per_real_B1 = batch["masked_per_real"][:, None]  # sums per real token, counted per masked slot (collate)
    sums = {"generator_loss_sum": (xent_BP * w_BP).sum(),
            "generator_accuracy_sum": (gen_correct_BP * w_BP).sum(),
            "discriminator_loss_sum": (bce_BL * real_BL * per_real_B1).sum(),
            "discriminator_accuracy_sum": (disc_correct_BL * real_BL * per_real_B1).sum(),
            "replaced_sum": ((sample_BP != labels_BP) * w_BP).sum(),
            "weight_sum": n_masked}
    sums["loss_sum"] = sums["generator_loss_sum"] + discriminator_weight * sums["discriminator_loss_sum"]
    return sums


def electra_objective(gen_graphdef, disc_graphdef, gen_config, disc_config, masker, seq_len,
                      discriminator_weight=50.0, temperature=1.0):
    """Objective for run_electra_flax: one step trains the generator and the discriminator on params
    join_params made. Evaluation (dropout_key None) samples with a fixed key."""
    def loss_sums(params, batch, dropout_key):
        key = jax.random.PRNGKey(0) if dropout_key is None else dropout_key
        gen_key, sample_key, disc_key = (jax.random.fold_in(key, i) for i in range(3))
        if dropout_key is None:
            gen_key = disc_key = None
        packed = {"segment_ids_BL": batch["segment_ids"]} if "segment_ids" in batch else {}
        generator = merge_model(gen_graphdef, model_params(params, "generator"))
        gen_logits_BPV = generator(batch["input_ids"], batch["attention_mask"],
                                   masked_positions_BP=batch["masked_positions"], dropout_key=gen_key, **packed)
        sample_BP = jax.random.categorical(sample_key, jax.lax.stop_gradient(gen_logits_BPV) / temperature)
        sample_BP = jnp.where(batch["masked_weights"] > 0, sample_BP, batch["masked_labels"])
        corrupted_BL = _put(batch["input_ids"], batch["masked_positions"], sample_BP, batch["masked_weights"])
        discriminator = merge_model(disc_graphdef, model_params(params, "discriminator"))
        disc_logits_BL = discriminator(corrupted_BL, batch["attention_mask"], dropout_key=disc_key, **packed)
        real_BL = batch["segment_ids"] > 0 if packed else batch["attention_mask"] > 0
        return electra_sums(gen_logits_BPV, sample_BP, corrupted_BL, disc_logits_BL, batch, real_BL,
                            discriminator_weight)

    def collate(rows, rng):
        """The masker's batch and, in every row, the ratio of its masked slots to its real tokens."""
        batch = masker(rows, rng)
        real = (batch["segment_ids"] > 0 if "segment_ids" in batch else batch["attention_mask"] > 0).sum()
        ratio = batch["masked_weights"].sum() / max(int(real), 1)
        return {**batch, "masked_per_real": np.full(len(batch["input_ids"]), ratio, np.float32)}

    return Objective(loss_sums=loss_sums, collate=collate, pad_id=masker.pad_token_id, weights_key="masked_weights",
                     flops_per_example=electra_train_flops(gen_config, disc_config, seq_len, masker.num_predictions),
                     tokens_per_example=seq_len, perplexity=False)
