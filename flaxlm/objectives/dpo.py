"""The DPO objective (run_dpo.py), as TRL's DPOTrainer computes it: each pair's chosen and rejected answer scored by
the sum of their tokens' log-probabilities under the policy (logps) and under the reference (computed once before
training: reference_logps), and

    delta = (logps_chosen - ref_chosen) - (logps_rejected - ref_rejected)
    sigmoid  -log sigmoid(beta * delta)                                  (DPO; --label_smoothing: cDPO)
    hinge    relu(1 - beta * delta)                                      (SLiC)
    ipo      (delta' - 1 / (2 beta))^2, delta' with each logp ratio divided by its answer's token count (IPO)

averaged over the pairs of the batch, with TRL's logged figures: rewards/chosen and rewards/rejected (beta times each
log ratio), rewards/margins, rewards/accuracies (chosen's reward above rejected's), logps/chosen, logps/rejected.
A mixture of experts adds router_aux_loss_coef times the policy's load-balancing loss over its rows' tokens (TRL's
aux_loss, on unless the coefficient is 0: flaxlm.training.pipeline.trl_router_loss).
"""
import jax
import jax.numpy as jnp
import numpy as np

from flaxlm.models import apply_hidden, moe
from flaxlm.models.lora import adapters_off
from flaxlm.training.evaluation import collect_predictions
from flaxlm.training.flops import decoder_lm_train_flops
from flaxlm.training.objective import Objective

LOSS_TYPES = ("sigmoid", "hinge", "ipo")
FIGURES = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
           "logps/rejected")


def token_logps(h_BTD, head, labels_BT):
    """float32 [B, T]: log p(label) of each row under the LM head (its bias and soft-capping included; a padded
    vocabulary's columns cut off)."""
    logp = jax.nn.log_softmax(head.logits(h_BTD))
    return jnp.take_along_axis(logp, labels_BT[..., None], axis=-1)[..., 0]


def answer_logps(graphdef, params, ids_BL, answer_BL, dropout_key=None):
    """float32 [B]: the summed log-probability of each row's answer tokens (position t predicts token t + 1)."""
    h_BLD, head = apply_hidden(graphdef, params, ids_BL, dropout_key=dropout_key)  # right padding: never attended
    per_token_BT = token_logps(h_BLD[:, :-1], head, ids_BL[:, 1:])
    return jnp.sum(per_token_BT * answer_BL[:, 1:], axis=1)


def dpo_loss(loss_type, beta, logps, ref, tokens, label_smoothing=0.0):
    """(per-pair loss [B], {figure: per-pair value [B]}) from {chosen, rejected} logps, reference logps and answer
    token counts (each [B]). label_smoothing (sigmoid): the share of pairs taken to be flipped (conservative DPO,
    TRL's sigmoid before 1.0; 0 is DPO)."""
    ratio = {k: logps[k] - ref[k] for k in ("chosen", "rejected")}
    delta = ratio["chosen"] - ratio["rejected"]
    if loss_type == "sigmoid":
        loss = (-(1 - label_smoothing) * jax.nn.log_sigmoid(beta * delta)
                - label_smoothing * jax.nn.log_sigmoid(-beta * delta))
    elif loss_type == "hinge":
        loss = jax.nn.relu(1 - beta * delta)
    else:  # ipo: length-normalized log ratios, as TRL (with the IPO authors)
        normalized = (ratio["chosen"] / jnp.maximum(tokens["chosen"], 1)
                      - ratio["rejected"] / jnp.maximum(tokens["rejected"], 1))
        loss = (normalized - 1 / (2 * beta)) ** 2
    rewards = {k: beta * jax.lax.stop_gradient(ratio[k]) for k in ratio}
    figures = {"rewards/chosen": rewards["chosen"], "rewards/rejected": rewards["rejected"],
               "rewards/margins": rewards["chosen"] - rewards["rejected"],
               "rewards/accuracies": (rewards["chosen"] > rewards["rejected"]).astype(jnp.float32),
               "logps/chosen": jax.lax.stop_gradient(logps["chosen"]),
               "logps/rejected": jax.lax.stop_gradient(logps["rejected"])}
    return loss, figures


def collate(rows, rng=None):
    return {**rows, "weights": np.ones(len(rows["chosen_ids"]), np.float32)}


def pair_logps(graphdef, params, batch, dropout_key=None):
    """{"chosen", "rejected": float32 [B]}: each pair's answers' summed log-probabilities, both in one forward (as
    TRL)."""
    B = batch["chosen_ids"].shape[0]
    ids = jnp.concatenate([batch["chosen_ids"], batch["rejected_ids"]])
    answer = jnp.concatenate([batch["chosen_answer"], batch["rejected_answer"]])
    both = answer_logps(graphdef, params, ids, answer, dropout_key)
    return {"chosen": both[:B], "rejected": both[B:]}


def real_tokens(batch):
    """bool [2B, L]: the tokens of pair_logps' rows (chosen rows, then rejected) up to each row's last answer token,
    the rows' right padding left out (TRL's attention mask)."""
    answer_BL = jnp.concatenate([batch["chosen_answer"], batch["rejected_answer"]]) > 0
    return jnp.flip(jnp.cumsum(jnp.flip(answer_BL, 1), 1), 1) > 0


def reference_logps(graphdef, params, rows, global_batch, mesh, pad_id):
    """{"ref_chosen", "ref_rejected": float32 [N]} of pair rows under params (eval mode), on all devices: the
    reference computed once, before training, so that no second model is held beside the policy."""
    scoring = Objective(loss_sums=None, collate=collate, pad_id=pad_id, weights_key="weights", flops_per_example=0,
                        tokens_per_example=0, predict=lambda p, b: pair_logps(graphdef, p, b))
    out = collect_predictions(params, scoring, rows, global_batch, mesh)
    return {"ref_chosen": out["chosen"].astype(np.float32), "ref_rejected": out["rejected"].astype(np.float32)}


def dpo_objective(graphdef, config, params, max_length, pad_id, loss_type="sigmoid", beta=0.1, label_smoothing=0.0,
                  live_reference=False):
    """Objective over pair_rows (flaxlm.data.preferences) that carry ref_chosen / ref_rejected (reference_logps); with
    live_reference (a LoRA run) the reference is scored in every step instead: the params with the adapters off, in
    eval mode, one more forward pass and no gradient."""
    def loss_sums(params, batch, dropout_key):
        with moe.routing(config, real_tokens(batch)) as router:  # an MoE's router statistics, policy only (as TRL)
            logps = pair_logps(graphdef, params, batch, dropout_key)
        if live_reference:
            ref = jax.lax.stop_gradient(pair_logps(graphdef, adapters_off(params), batch))
        else:
            ref = {"chosen": batch["ref_chosen"], "rejected": batch["ref_rejected"]}
        tokens = {k: batch[f"{k}_answer"][:, 1:].sum(axis=1) for k in ("chosen", "rejected")}
        loss, figures = dpo_loss(loss_type, beta, logps, ref, tokens, label_smoothing)
        w = batch["weights"]
        return moe.add_router_losses(config, {"loss_sum": jnp.sum(loss * w), "weight_sum": jnp.sum(w),
                                              **{f"{name}_sum": jnp.sum(v * w) for name, v in figures.items()}},
                                     router.value)

    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="weights",
                     flops_per_example=2 * decoder_lm_train_flops(config, params, 1, max_length)
                     * (4 / 3 if live_reference else 1),  # a forward pass is a third of a train step's FLOPs
                     tokens_per_example=2 * max_length, perplexity=False, count_name="pairs")
