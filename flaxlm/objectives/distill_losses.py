"""The divergences a student learns a teacher's next-token distributions by (run_distill.py), per position: each
takes logits [..., V] (or the teacher's top k) and returns float32 [...], summed over the vocabulary; the caller
masks and averages.

    generalized_jsd(student, teacher, beta, T)   TRL's GKDTrainer.generalized_jsd_loss before its masking: beta 0 is
                                                 the forward KL(teacher || student), 1 the reverse KL(student ||
                                                 teacher), between them the generalized JSD of the GKD paper (Agarwal
                                                 et al. 2024, eq. 1) against the mixture beta * teacher + (1 - beta) *
                                                 student (TRL's weights)
    teacher_top_k(logits, k, T)                  the teacher's k likeliest tokens and their log-probabilities at
                                                 temperature T: what the offline store keeps per position
    top_k_kl(student, ids, logps, T, tail)       the forward KL on those k (offline distillation), the rest of the
                                                 teacher's mass handled as `tail` says:
        renormalize   both distributions cut to the k tokens and renormalized (MaxText's distillation fork's default)
        bucket        the k tokens plus one "other" category holding the rest of each distribution's mass (k + 1
                      categories; the tail's KL counted, never its shape)
"""
import jax
import jax.numpy as jnp

TAILS = ("renormalize", "bucket")


def _kl(log_p, log_q):
    """sum p (log p - log q) over the last axis; p = 0 counts 0 (as torch's kl_div with log_target)."""
    p = jnp.exp(log_p)
    return jnp.sum(jnp.where(p > 0, p * (log_p - log_q), 0.0), axis=-1)


def generalized_jsd(student_logits, teacher_logits, beta, temperature=1.0):
    """float32 [...]: the generalized JSD of each position's two distributions (logits [..., V] at temperature T)."""
    log_s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
    log_t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature)
    if beta == 0:
        return _kl(log_t, log_s)
    if beta == 1:
        return _kl(log_s, log_t)
    # log(beta * teacher + (1 - beta) * student), the mixture both are measured against
    log_m = jnp.logaddexp(log_s + jnp.log1p(-beta), log_t + jnp.log(beta))
    return beta * _kl(log_t, log_m) + (1 - beta) * _kl(log_s, log_m)


def teacher_top_k(logits, k, temperature=1.0):
    """(ids int32 [..., k], logps float32 [..., k]): the k likeliest tokens of log_softmax(logits / T), likeliest
    first (ties: the lower id first)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature)
    logps, ids = jax.lax.top_k(logp, k)
    return ids.astype(jnp.int32), logps


def top_k_kl(student_logits, teacher_ids, teacher_logps, temperature=1.0, tail="renormalize"):
    """float32 [...]: KL(teacher || student) over the teacher's top k (ids and log-probabilities [..., k] at
    temperature T, as teacher_top_k), the student's logits [..., V] at the same temperature."""
    log_s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
    log_s_k = jnp.take_along_axis(log_s, teacher_ids, axis=-1)
    log_t_k = teacher_logps.astype(jnp.float32)
    if tail == "renormalize":
        return _kl(log_t_k - jax.nn.logsumexp(log_t_k, axis=-1, keepdims=True),
                   log_s_k - jax.nn.logsumexp(log_s_k, axis=-1, keepdims=True))
    if tail != "bucket":
        raise ValueError(f"tail must be one of {TAILS}, not {tail!r}")
    # log(1 - sum of the k probabilities), kept finite where the k hold (nearly) all the mass
    rest_t = jnp.log(jnp.clip(-jnp.expm1(jax.nn.logsumexp(log_t_k, axis=-1)), 1e-30))
    rest_s = jnp.log(jnp.clip(-jnp.expm1(jax.nn.logsumexp(log_s_k, axis=-1)), 1e-30))
    return _kl(jnp.concatenate([log_t_k, rest_t[..., None]], axis=-1),
               jnp.concatenate([log_s_k, rest_s[..., None]], axis=-1))
