"""The explicit (dropout) attention path against jax.nn.dot_product_attention, causal halves included; sliding
windows, soft-capping and ALiBi against the scores written out, with and without the KV cache."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxlm.models import kv_cache, layers
from flaxlm.models.layers import attention

NO_DROP = 1e-9  # takes the explicit path but drops nothing (keep threshold rounds to 0)


def qkv(T, B=2, N=2, H=8, seed=0):
    return [jnp.asarray(x) for x in np.random.default_rng(seed).normal(size=(3, B, T, N, H)).astype(np.float32)]


def score_dots(T, mask=None):
    """The matmuls (dot_general) the explicit causal path traces for rows of T."""
    q, k, v = qkv(T)
    jaxpr = jax.make_jaxpr(lambda q, k, v: attention(q, k, v, mask, causal=True, dropout_rate=0.1,
                                                     dropout_key=jax.random.key(0)))(q, k, v)
    return [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]


def test_causal_rows_run_as_halves_only_when_long_and_even():
    T = layers.CAUSAL_HALVES_MIN_LENGTH
    halves = score_dots(T)
    assert len(halves) == 4  # scores and values for each half
    assert {tuple(e.outvars[0].aval.shape[-2:]) for e in halves[::2]} == {(T // 2, T // 2), (T // 2, T)}
    assert len(score_dots(T + 1)) == 2 and len(score_dots(T - 2)) == 2


@pytest.mark.parametrize("mask_kind", ["none", "padding", "segments"])
@pytest.mark.parametrize("T", [layers.CAUSAL_HALVES_MIN_LENGTH, layers.CAUSAL_HALVES_MIN_LENGTH + 1])
def test_explicit_causal_attention_and_its_gradient_match_dot_product_attention(T, mask_kind):
    q, k, v = qkv(T)
    if mask_kind == "padding":  # row 1 right-padded: its last 9 keys hidden
        mask = jnp.arange(T)[None, :] < jnp.array([[T], [T - 9]])
    elif mask_kind == "segments":  # two packed sequences per row, split at 20 and at T - 5
        seg = (jnp.arange(T)[None, :] >= jnp.array([[20], [T - 5]])).astype(jnp.int32)
        mask = seg[:, :, None] == seg[:, None, :]
    else:
        mask = None

    def loss(q, k, v, explicit):
        kw = dict(dropout_rate=NO_DROP, dropout_key=jax.random.key(0)) if explicit else {}
        o = attention(q, k, v, mask, causal=True, **kw)
        return (o * jnp.cos(jnp.arange(o.size, dtype=jnp.float32).reshape(o.shape))).sum(), o

    (_, ref), ref_grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v, False)
    (_, got), got_grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v, True)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    for g, r in zip(got_grads, ref_grads):
        np.testing.assert_allclose(g, r, atol=2e-5)


def test_causal_halves_drop_out_each_half_at_the_rate():
    T, rate = 2 * layers.CAUSAL_HALVES_MIN_LENGTH, 0.25
    q, k, v = qkv(T, B=4, N=4)
    v = jnp.ones_like(v)  # each output is the sum of the query's kept probabilities / (1 - rate)
    o = attention(q, k, v, causal=True, dropout_rate=rate, dropout_key=jax.random.key(3))[..., 0]
    for half in (o[:, :T // 2], o[:, T // 2:]):  # E[output] = 1 in both halves
        assert abs(float(half.mean()) - 1.0) < 0.05
    again = attention(q, k, v, causal=True, dropout_rate=rate, dropout_key=jax.random.key(3))[..., 0]
    np.testing.assert_array_equal(o, again)
    assert not np.array_equal(o[:, :T // 2], o[:, T // 2:])


def reference_attention(q, k, v, mask_BS, window=None, softcap=None, slopes=None):
    """Causal attention written out: scores (+ ALiBi slope * (key - query)), soft-capped, masked, softmax."""
    T, H = q.shape[1], q.shape[-1]
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H)
    d = jnp.arange(T)[:, None] - jnp.arange(T)[None, :]
    if slopes is not None:
        s = s - slopes[None, :, None, None] * d
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)
    allowed = (d >= 0) & (d < (window or T + 1))
    s = jnp.where(allowed[None, None] & mask_BS[:, None, None, :], s, -1e30)
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, -1), v)


@pytest.mark.parametrize("window,softcap,alibi", [(5, None, False), (None, 3.0, False), (5, 3.0, False),
                                                  (None, None, True), (4, None, True)],
                         ids=["window", "softcap", "window-softcap", "alibi", "window-alibi"])
def test_window_softcap_alibi_match_the_scores_written_out_with_and_without_the_cache(window, softcap, alibi):
    """Row 1 left-padded by 3; with the cache, 6 tokens of prefill then one token per step."""
    T, N = 12, 2
    q, k, v = qkv(T, N=N)
    mask = jnp.arange(T)[None, :] >= jnp.array([[0], [3]])
    slopes = jnp.array([0.5, 0.125]) if alibi else None
    ref = reference_attention(q, k, v, mask, window, softcap, slopes)
    d = jnp.arange(T)[:, None] - jnp.arange(T)[None, :]
    bias = None if slopes is None else -(slopes[:, None, None] * d)[None]
    real = np.asarray(mask)
    for explicit in (False, True):
        kw = dict(dropout_rate=NO_DROP, dropout_key=jax.random.key(0)) if explicit else {}
        got = attention(q, k, v, mask, causal=True, window=window, softcap=softcap, bias=bias, **kw)
        np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real], atol=2e-5)
    cache = kv_cache.init_cache(1, 2, T, N, q.shape[-1], jnp.float32)
    outs = []
    for start, stop in [(0, 6)] + [(t, t + 1) for t in range(6, T)]:
        cache, visible = kv_cache.start_step(cache, mask[:, start:stop])
        o, (kc, vc) = kv_cache.attend(q[:, start:stop], (cache["k"][0], cache["v"][0]), k[:, start:stop],
                                      v[:, start:stop], cache["index"], visible, window=window, softcap=softcap,
                                      alibi_slopes=slopes)
        cache = kv_cache.finish_step(cache, [kc], [vc], stop - start)
        outs.append(o)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1))[real], np.asarray(ref)[real], atol=2e-5)
