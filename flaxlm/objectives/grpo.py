"""The GRPO objective (run_grpo.py), as TRL's GRPOTrainer computes it, over completions sampled from the policy.

A row is one completion after its prompt: `input_ids` [B, P + C] (the prompt left-padded to P, the completion
right-padded to C = --max_completion_length), `attention_mask` [B, P + C], `completion_mask` [B, C] (1 up to and
with the token that ended it; 0 for a whole truncated completion under --mask_truncated_completions), the group
advantage of its reward `advantages` [B], and the per-token log-probabilities `old_logps` [B, C] of the policy that
sampled it (kept when --num_iterations > 1; otherwise the policy's own, without gradient) and `ref_logps` [B, C] of
the reference (--beta > 0). With logps the policy's per-token log-probabilities (logits / --temperature, as TRL):

    ratio   exp(logps - old_logps)                     per token, or per sequence: exp(mean over its tokens) (GSPO)
    loss    -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A) + beta * k3
    k3      exp(ref - logps) - (ref - logps) - 1       (the KL estimate to the reference), times the ratio with
            bias_correction_kl (TRL's use_bias_correction_kl, its default): the unbiased reverse-KL gradient

and the per-token losses summed over the completion tokens and normalized as --loss_type says:

    grpo     each completion's mean over its tokens, averaged over completions
    bnpo     the mean over the tokens of each batch piece (TRL: of each process's micro-batch)
    dr_grpo  the sum over tokens / (completions * max_completion_length)
    dapo     the mean over every completion token of the global batch (TRL's default)

Logged with TRL's names: kl (with beta), entropy, clip_ratio/low_mean, clip_ratio/high_mean, clip_ratio/region_mean
(token means; per sequence under GSPO).
"""
import jax
import jax.numpy as jnp
import numpy as np

from flaxlm.models import apply_hidden, moe
from flaxlm.models.lora import adapters_off
from flaxlm.training.flops import decoder_lm_train_flops
from flaxlm.training.objective import Objective

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IMPORTANCE_LEVELS = ("token", "sequence")


def completion_logps(graphdef, params, batch, completion_length, temperature=1.0, dropout_key=None):
    """(logps [B, C], entropies [B, C]) float32 of each completion token under params: the logits at the positions
    before it, divided by temperature (TRL scores what it sampled from). Positions count only the real tokens, as in
    generation (flaxlm.models.generation)."""
    ids_BL, mask_BL = batch["input_ids"], batch["attention_mask"]
    positions_BL = jnp.maximum(jnp.cumsum(mask_BL, axis=-1) - 1, 0)
    h_BLD, head = apply_hidden(graphdef, params, ids_BL, mask_BL, positions_BL, dropout_key=dropout_key)
    C = completion_length
    logits_BCV = head.logits(h_BLD[:, -C - 1:-1]) / temperature  # position t predicts token t + 1
    logp_BCV = jax.nn.log_softmax(logits_BCV)
    logps_BC = jnp.take_along_axis(logp_BCV, ids_BL[:, -C:, None], axis=-1)[..., 0]
    entropy_BC = -jnp.sum(jnp.exp(logp_BCV) * logp_BCV, axis=-1)
    return logps_BC, jax.lax.stop_gradient(entropy_BC)


def token_losses(logps_BC, old_BC, ref_BC, advantages_B, mask_BC, *, beta, epsilon, epsilon_high, level,
                 bias_correction_kl=True):
    """(per-token loss [B, C] (or [B, 1] under GSPO without beta), {figure: [B, C] or [B, 1]}): the clipped surrogate
    of each token (or sequence) plus beta times the k3 estimate of the KL to the reference."""
    A_B1 = advantages_B[:, None]
    log_ratio_BC = logps_BC - old_BC
    if level == "token":
        log_weight = log_ratio_BC
    else:  # GSPO: one weight per sequence, the geometric mean of its tokens' ratios
        log_weight = (jnp.sum(log_ratio_BC * mask_BC, axis=-1, keepdims=True)
                      / jnp.maximum(jnp.sum(mask_BC, axis=-1, keepdims=True), 1.0))
    ratio = jnp.exp(log_weight)
    clipped = jnp.clip(ratio, 1 - epsilon, 1 + epsilon_high)
    loss = -jnp.minimum(ratio * A_B1, clipped * A_B1)
    figures = {"clip_ratio/low_mean": ((ratio < 1 - epsilon) & (A_B1 < 0)).astype(jnp.float32),
               "clip_ratio/high_mean": ((ratio > 1 + epsilon_high) & (A_B1 > 0)).astype(jnp.float32)}
    figures["clip_ratio/region_mean"] = jnp.maximum(figures["clip_ratio/low_mean"], figures["clip_ratio/high_mean"])
    if beta:
        diff_BC = ref_BC - logps_BC
        kl_BC = jnp.exp(diff_BC) - diff_BC - 1
        if bias_correction_kl:  # weighted by the (differentiable) ratio, as TRL's default; logged so too
            kl_BC = kl_BC * ratio
        loss = loss + beta * kl_BC
        figures["kl"] = jax.lax.stop_gradient(kl_BC)
    return loss, figures


def normalized_sums(loss, mask_BC, weights_B, loss_type, completion_length):
    """(loss_sum, weight_sum) whose ratio over a global batch (summed over its pieces) is --loss_type's loss."""
    m_BC = mask_BC * weights_B[:, None]
    token_sum = jnp.sum(loss * m_BC)
    rows, tokens = jnp.sum(weights_B), jnp.sum(m_BC)
    if loss_type == "grpo":
        per_row = jnp.sum(loss * mask_BC, axis=-1) / jnp.maximum(jnp.sum(mask_BC, axis=-1), 1.0)
        return jnp.sum(per_row * weights_B), rows
    if loss_type == "bnpo":  # this piece's token mean, weighted by its rows: the mean of the pieces' means
        return token_sum / jnp.maximum(tokens, 1.0) * rows, rows
    if loss_type == "dr_grpo":
        return token_sum / completion_length, rows
    return token_sum, tokens  # dapo


def masked_mean(x, mask_BC, weights_B):
    """The mean of x over the completion tokens of the real rows (x [B, C]), or over the real rows (x [B, 1])."""
    if x.shape[-1] == 1:
        return jnp.sum(x[:, 0] * weights_B) / jnp.maximum(jnp.sum(weights_B), 1.0)
    m_BC = mask_BC * weights_B[:, None]
    return jnp.sum(x * m_BC) / jnp.maximum(jnp.sum(m_BC), 1.0)


def collate(rows, rng=None):
    return {**rows, "weights": np.ones(len(rows["input_ids"]), np.float32)}


def grpo_objective(graphdef, config, params, *, prompt_length, completion_length, pad_id, loss_type="dapo", beta=0.0,
                   epsilon=0.2, epsilon_high=None, importance_sampling_level="token", temperature=1.0,
                   live_reference=False, bias_correction_kl=True):
    """Objective over completion rows (see the module's docstring). live_reference (LoRA): the reference's
    log-probabilities scored in every step as the params with the adapters off (eval mode, no gradient), instead of
    the rows' ref_logps."""
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    C = completion_length

    def loss_sums(params, batch, dropout_key):
        with moe.routing(config, batch["attention_mask"]) as router:  # an MoE's router statistics, policy only
            logps_BC, entropy_BC = completion_logps(graphdef, params, batch, C, temperature, dropout_key)
        old_BC = batch["old_logps"] if "old_logps" in batch else jax.lax.stop_gradient(logps_BC)
        ref_BC = None
        if beta:
            ref_BC = (jax.lax.stop_gradient(completion_logps(graphdef, adapters_off(params), batch, C, temperature)[0])
                      if live_reference else batch["ref_logps"])
        mask_BC, w_B = batch["completion_mask"].astype(jnp.float32), batch["weights"]
        loss, figures = token_losses(logps_BC, old_BC, ref_BC, batch["advantages"], mask_BC, beta=beta,
                                     epsilon=epsilon, epsilon_high=epsilon_high, level=importance_sampling_level,
                                     bias_correction_kl=bias_correction_kl)
        loss_sum, weight_sum = normalized_sums(loss, mask_BC, w_B, loss_type, C)
        figures["entropy"] = entropy_BC
        # each figure as a mean over this piece, weighted like the loss: the step divides by the global weight sum
        return moe.add_router_losses(config, {"loss_sum": loss_sum, "weight_sum": weight_sum, **{
            f"{k}_sum": masked_mean(v, mask_BC, w_B) * weight_sum for k, v in figures.items()}}, router.value)

    sequence = prompt_length + completion_length
    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="weights",
                     flops_per_example=decoder_lm_train_flops(config, params, 1, sequence)
                     * (4 / 3 if live_reference and beta else 1),  # a forward pass is a third of a train step's
                     tokens_per_example=sequence, perplexity=False, count_name="completions")
