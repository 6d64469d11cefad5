"""The distillation objectives (run_distill.py) over rows shaped as run_sft.py's (flaxlm.data.chat_rows: input_ids,
segment_ids, positions and which tokens are taught), position t predicting token t + 1:

    offline  the student's loss is alpha * T^2 * KL_top-k(teacher || student) + (1 - alpha) * cross-entropy, on the
             teacher's stored top k (teacher_ids, teacher_logps [B, L - 1, k] in the batch: flaxlm.distillation.
             teacher_store); T^2 keeps the KL's gradient on the scale of the cross-entropy's (Hinton et al. 2015).
             Logs kd_loss and ce_loss beside the loss.
    gkd      the generalized JSD between the student's and the live teacher's distributions (TRL's GKDTrainer: its
             loss at temperature 1, whatever the sampling temperature), the teacher's params the train step's
             frozen input (Objective.frozen: placed as the student's, never trained, in no checkpoint).

Both average over the batch's taught tokens, and evaluate the student's own next-token loss (and perplexity) on the
held-out rows: what the student is for. An MoE student adds its router losses (flaxlm.models.moe).
"""
import jax
import jax.numpy as jnp

from flaxlm.models import apply_hidden, moe
from flaxlm.models.layers import Segments
from flaxlm.objectives.distill_losses import generalized_jsd, top_k_kl
from flaxlm.objectives.sft import collate as sft_collate, sft_objective
from flaxlm.training.flops import decoder_lm_train_flops
from flaxlm.training.objective import Objective

TEACHER_FIELDS = ("teacher_ids", "teacher_logps")


def collate(rows, rng=None):
    """sft's batch (input_ids, segment_ids, positions, label_weights) plus the teacher's top k where the rows carry
    it (the training rows of an offline run)."""
    return {**sft_collate(rows), **{k: rows[k] for k in TEACHER_FIELDS if k in rows}}


def logits_of(graphdef, params, batch, dropout_key=None):
    """float32-able logits [B, L - 1, V] of each position but the last (the head's, padded columns cut off)."""
    h_BLD, head = apply_hidden(graphdef, params, batch["input_ids"], Segments(batch["segment_ids"]),
                               batch["positions"], dropout_key=dropout_key)
    return head.logits(h_BLD[:, :-1])


def _cross_entropy(logits_BTV, labels_BT):
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32))
    return -jnp.take_along_axis(logp_BTV, labels_BT[..., None], axis=-1)[..., 0]


def _evaluation(graphdef, config, params, max_length, pad_id):
    """The student's next-token loss sums (eval mode): what an evaluation reports."""
    plain = sft_objective(graphdef, config, params, max_length, pad_id)
    return lambda p, batch: plain.loss_sums(p, batch, None)


def offline_objective(graphdef, config, params, max_length, pad_id, *, alpha, temperature, tail):
    def loss_sums(params, batch, dropout_key):
        with moe.routing(config, batch["segment_ids"] > 0) as router:
            logits_BTV = logits_of(graphdef, params, batch, dropout_key)
        kl_BT = top_k_kl(logits_BTV, batch["teacher_ids"], batch["teacher_logps"], temperature, tail)
        ce_BT = _cross_entropy(logits_BTV, batch["input_ids"][:, 1:])
        w_BT = batch["label_weights"]
        loss_BT = alpha * temperature ** 2 * kl_BT + (1 - alpha) * ce_BT
        sums = {"loss_sum": jnp.sum(loss_BT * w_BT), "weight_sum": jnp.sum(w_BT),
                "kd_loss_sum": jnp.sum(kl_BT * w_BT), "ce_loss_sum": jnp.sum(ce_BT * w_BT)}
        return moe.add_router_losses(config, sums, router.value)

    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="label_weights",
                     flops_per_example=decoder_lm_train_flops(config, params, 1, max_length),
                     tokens_per_example=max_length,
                     eval_sums=_evaluation(graphdef, config, params, max_length, pad_id))


def gkd_objective(graphdef, config, params, teacher_graphdef, teacher_config, teacher_params, max_length, pad_id, *,
                  beta):
    """teacher_params: placed on the mesh (or ShapeDtypeStructs with shardings, for --compile_for)."""
    vocab = min(config.vocab_size, teacher_config.vocab_size)  # one tokenizer; a config may pad its table further

    def loss_sums(params, batch, dropout_key, teacher):
        with moe.routing(config, batch["segment_ids"] > 0) as router:
            student_BTV = logits_of(graphdef, params, batch, dropout_key)
        teacher_BTV = jax.lax.stop_gradient(logits_of(teacher_graphdef, teacher, batch))  # eval mode
        jsd_BT = generalized_jsd(student_BTV[..., :vocab], teacher_BTV[..., :vocab], beta)
        w_BT = batch["label_weights"]
        return moe.add_router_losses(config, {"loss_sum": jnp.sum(jsd_BT * w_BT), "weight_sum": jnp.sum(w_BT)},
                                     router.value)

    # a teacher's forward pass is a third of its train step's FLOPs
    flops = (decoder_lm_train_flops(config, params, 1, max_length)
             + decoder_lm_train_flops(teacher_config, teacher_params, 1, max_length) / 3)
    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="label_weights",
                     flops_per_example=flops, tokens_per_example=max_length,
                     eval_sums=_evaluation(graphdef, config, params, max_length, pad_id), frozen=teacher_params,
                     perplexity=True)
