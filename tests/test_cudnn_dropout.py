"""Attention dropout through cuDNN's fused kernel (flaxlm.models.cudnn_dropout): which calls take it (a stand-in
kernel records what it is given and attends without dropout, checked against XLA's attention), what reaches the
real kernel (its jaxpr, traced on the CPU with cuDNN's version check stood in), the run's one line for a TPU or
--scan_layers; on an NVIDIA GPU only, the kernel against XLA at rate 0 and its masks at rate p."""
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxlm.models import cudnn_dropout
from flaxlm.models.layer_stack import Execution, run_layers
from flaxlm.models.layers import Segments, attention

on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's kernel runs on NVIDIA GPUs only")
KEY = jax.random.key(0)


def qkv(T=16, B=2, N=4, K=2, H=8, dtype=jnp.bfloat16, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(B, T, n, H)) for n in (N, K, K))
    return [jnp.asarray(x, dtype) for x in (q, k, v)]


@pytest.fixture
def kernel(monkeypatch):
    """A GPU of compute capability 9.0 as far as where_not can tell, and the kernel replaced by a stand-in that
    records its arguments and attends as XLA does, without dropout. Returns the list of recorded calls."""
    calls = []

    def fused(q, k, v, bias, mask, *, scale, causal, window, dropout_rate, seed):
        calls.append(dict(K=k.shape[2], bias=bias, mask=mask, scale=scale, causal=causal, window=window,
                          rate=dropout_rate, seed=seed))
        return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, is_causal=causal, scale=scale,
                                            local_window_size=None if window is None else (window - 1, 0),
                                            implementation="xla")
    monkeypatch.setattr(cudnn_dropout, "compute_capability", lambda: (9, 0))
    monkeypatch.setattr(cudnn_dropout, "fused_attention", fused)
    return calls


def padding(T, B=2):
    return jnp.arange(T)[None, :] < jnp.array([[T], [T - 5]])[:B]  # row 1: its last 5 keys hidden


CASES = {  # name: (attention keywords, what the kernel is given)
    "causal": (dict(causal=True), dict(causal=True, window=None, mask=None)),
    "causal-padding": (dict(causal=True, mask=padding(16)), dict(causal=True, mask=(2, 1, 16, 16))),
    "segments": (dict(mask=Segments((jnp.arange(16)[None, :] >= jnp.array([[6], [11]])).astype(jnp.int32))),
                 dict(causal=False, mask=(2, 1, 16, 16))),
    "window": (dict(causal=True, window=5), dict(causal=True, window=5)),
    "alibi": (dict(causal=True, bias=-(jnp.array([0.5, 0.25, 0.125, 0.0625])[:, None, None]
                                       * (jnp.arange(16)[:, None] - jnp.arange(16)[None, :]))[None]),
              dict(causal=True, mask=None)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cudnn_with_dropout_gives_the_kernel_the_rate_scale_causality_and_mask(kernel, case):
    """implementation "cudnn" with a key and a rate: one kernel call, with the rate, the scale, causality, the
    window, the K key/value heads as they are and the mask as whole [B, 1, T, S] rows; what it returns (attention
    without dropout here) is XLA's attention of the same call."""
    kw, given = CASES[case]
    q, k, v = qkv()
    got = attention(q, k, v, scale=0.3, dropout_rate=0.1, dropout_key=KEY, implementation="cudnn", **kw)
    (call,) = kernel
    assert (call["rate"], call["scale"], call["K"]) == (0.1, 0.3, 2)
    for name, want in given.items():
        if name == "mask" and want is not None:
            assert call["mask"].shape == want and call["mask"].dtype == jnp.bool_
        else:
            assert call[name] == want
    if "bias" in kw:
        assert call["bias"].dtype == jnp.bfloat16  # cuDNN's bias is in the compute dtype
    np.testing.assert_array_equal(got, attention(q, k, v, scale=0.3, implementation="xla", **kw))


def test_auto_on_a_gpu_takes_the_kernel_and_each_call_site_draws_its_own_masks(kernel):
    q, k, v = qkv()
    attention(q, k, v, causal=True, dropout_rate=0.1, dropout_key=KEY)
    attention(q, k, v, causal=True, dropout_rate=0.1, dropout_key=KEY)
    assert len(kernel) == 2 and kernel[0]["seed"] != kernel[1]["seed"]


def test_without_dropout_cudnn_is_jax_nn_with_the_padding_mask_as_whole_rows(kernel, monkeypatch):
    """No key (evaluation) or rate 0: jax.nn.dot_product_attention's cuDNN as before, the stand-in untouched; a
    [B, S] padding mask reaches it as [B, 1, T, S] (cuDNN refuses the [B, 1, 1, S] form: test_real_kernel_...)."""
    seen = []
    xla = jax.nn.dot_product_attention

    def recorded(*args, implementation=None, **kw):
        seen.append((implementation, kw["mask"].shape))
        return xla(*args, implementation="xla", **kw)
    monkeypatch.setattr(jax.nn, "dot_product_attention", recorded)
    q, k, v = qkv()
    attention(q, k, v, padding(16), causal=True, implementation="cudnn")
    attention(q, k, v, padding(16), causal=True, dropout_rate=0.0, dropout_key=KEY, implementation="cudnn")
    assert seen == [("cudnn", (2, 1, 16, 16))] * 2 and kernel == []


def test_on_the_cpu_auto_keeps_the_explicit_path(monkeypatch):
    """No GPU: where_not says so and attention with dropout is the explicit float32 path, its hash masks those of
    implementation "xla" (numerics: tests/test_attention.py)."""
    monkeypatch.setattr(cudnn_dropout, "fused_attention", lambda *a, **kw: pytest.fail("the kernel was called"))
    assert cudnn_dropout.where_not(jnp.bfloat16, 16, 16, 8, causal=True) == "not an NVIDIA GPU"
    q, k, v = qkv()
    kw = dict(causal=True, dropout_rate=0.25, dropout_key=KEY)
    np.testing.assert_array_equal(attention(q, k, v, **kw), attention(q, k, v, implementation="xla", **kw))


@pytest.mark.parametrize("capability, dtype, T, H, kw, reason", [
    ((7, 5), jnp.bfloat16, 16, 64, {}, "compute capability 7.5"),
    ((9, 0), jnp.float32, 16, 64, {}, "float32 inputs"),
    ((9, 0), jnp.bfloat16, 16, 12, {}, "heads of width 12"),
    ((8, 0), jnp.bfloat16, 16, 192, {}, "heads of width 192 (cuDNN: a multiple of 8, at most 128)"),
    ((9, 0), jnp.bfloat16, 16, 64, dict(softcap=30.0), "soft-capped"),
    ((9, 0), jnp.bfloat16, 16, 64, dict(causal=False, window=4), "both sides"),
    ((9, 0), jnp.bfloat16, 15, 64, dict(masked=True), "15 queries and 15 keys with a mask"),
    ((9, 0), jnp.bfloat16, 16, 256, dict(masked=True), ""),
    ((8, 0), jnp.float16, 15, 128, {}, "")])
def test_where_not_names_what_the_kernel_cannot_take(monkeypatch, capability, dtype, T, H, kw, reason):
    monkeypatch.setattr(cudnn_dropout, "compute_capability", lambda: capability)
    got = cudnn_dropout.where_not(dtype, T, T, H, **{"causal": True, **kw})
    assert reason in got if reason else got == ""


def test_a_call_the_kernel_cannot_take_keeps_the_explicit_path(kernel):
    q, k, v = qkv()
    kw = dict(causal=True, dropout_rate=0.25, dropout_key=KEY, softcap=5.0)
    np.testing.assert_array_equal(attention(q, k, v, implementation="cudnn", **kw),
                                  attention(q, k, v, implementation="xla", **kw))
    assert kernel == []


class Layer(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((), jnp.bfloat16))


@pytest.mark.parametrize("scan, remat, calls", [(False, "none", 2), (False, "full", 2), (True, "none", 0),
                                                (True, "full", 0)])
def test_layers_under_scan_keep_the_explicit_path(kernel, scan, remat, calls):
    """cuDNN's offsets advance per kernel launch and the backward runs scanned layers in reverse: under
    --scan_layers the explicit path; a loop of layers (rematerialized or not) takes the kernel, one call each."""
    q, _, _ = qkv(K=4)

    def call(i, layer, x, extra):
        return x + attention(x * layer.w, x, x, causal=True, dropout_rate=0.1, dropout_key=jax.random.fold_in(KEY, i),
                             implementation="cudnn")
    jax.grad(lambda x: run_layers([Layer(), Layer()], x, call, Execution(scan=scan, remat=remat))
             .astype(jnp.float32).sum())(q)
    assert len(kernel) == calls


def all_eqns(jaxpr):
    """The equations of a jaxpr and of the jaxprs inside them (jit, custom_vjp, ...)."""
    for e in jaxpr.eqns:
        yield e
        for sub in jax.extend.core.jaxprs_in_params(e.params):
            yield from all_eqns(sub)


def test_real_kernel_gets_the_rate_and_one_seed_forward_and_backward_without_float32_scores(monkeypatch):
    """The private kernel traced on the CPU (cuDNN's version check stood in, a 9.0 GPU as far as where_not can
    tell): its forward and backward primitives carry the rate, the scale, the causal mask, the window and one seed,
    and no [B, N, T, S] float32 array is left in the program. jax.nn's cuDNN path with a [B, 1, 1, S] padding mask
    fails there, which attention() avoids by passing whole rows."""
    from jax._src.cudnn import fused_attention_stablehlo as fused
    monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(cudnn_dropout, "compute_capability", lambda: (9, 0))
    B, T, N, H = 2, 16, 4, 64
    q, k, v = qkv(T=T, B=B, N=N, K=N, H=H)

    def loss(q, k, v):
        o = attention(q, k, v, padding(T), causal=True, window=6, scale=0.2, dropout_rate=0.1, dropout_key=KEY,
                      implementation="cudnn")
        return o.astype(jnp.float32).sum()
    eqns = list(all_eqns(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr))
    fwd, bwd = [e.params for e in eqns if e.primitive.name.startswith("dot_product_attention_")]
    assert fwd["dropout_rate"] == bwd["dropout_rate"] == 0.1 and fwd["seed"] == bwd["seed"]
    assert fwd["scale"] == 0.2 and fwd["mask_type"] == fused.MaskType.CAUSAL and fwd["sliding_window_length"] == 6
    assert fwd["is_training"]
    assert not [v for e in eqns for v in e.outvars if v.aval.shape == (B, N, T, T) and v.aval.dtype == jnp.float32]
    with pytest.raises(ValueError, match="Bias must have same seq length"):
        jax.make_jaxpr(lambda q: jax.nn.dot_product_attention(q, q, q, mask=padding(T)[:, None, None, :],
                                                              implementation="cudnn"))(q)
    jax.make_jaxpr(lambda q: attention(q, q, q, padding(T), implementation="cudnn"))(q)


def test_a_tpu_run_with_attention_dropout_says_what_it_costs_and_the_key_once(monkeypatch, capsys):
    from flaxlm.models.presets import build_config
    from flaxlm.training import pipeline
    monkeypatch.setattr(pipeline, "_SAID", set())
    gpt2 = build_config("gpt2-tiny")
    for _ in range(2):  # run_electra_flax.py loads two models
        pipeline.say_attention(gpt2, "auto", tpu=True)
    pipeline.say_attention(gpt2, "auto")  # a GPU or CPU run: no line
    pipeline.say_attention(gpt2, "xla", tpu=True)  # XLA asked for: no line
    gpt2.attn_pdrop = 0.0
    pipeline.say_attention(gpt2, "auto", tpu=True)  # no attention dropout: no line
    assert capsys.readouterr().out == (
        "TPU attention (auto): GPT-2 drops out attention probabilities (attn_pdrop=0.1 in config.json), which the "
        "splash kernel cannot: XLA attention with [B, N, T, S] float32 scores while training (splash in "
        "evaluation); recent recipes train without it: attn_pdrop=0 (create_config.py --set attn_pdrop=0, "
        "--config_overrides attn_pdrop=0 with --model_type, or in config.json)\n")
    pipeline.say_attention(build_config("roberta-tiny"), "cudnn", scan=True)
    assert capsys.readouterr().out.startswith(
        "--attention_implementation cudnn: RoBERTa drops out attention probabilities (attention_probs_dropout_prob=0.1"
        " in config.json), which cuDNN's kernel cannot under --scan_layers")


@on_gpu
@pytest.mark.parametrize("case", ["causal", "causal-padding", "segments", "window", "alibi"])
def test_gpu_kernel_at_rate_0_matches_xla_and_its_gradients(case):
    """cudnn_dropout.attention at rate 0 (the dropout kernel's plumbing: mask, bias, window, grouped heads) against
    XLA's attention, both bf16, each compared with the float32 attention of the same bf16 inputs: cuDNN no further
    from it than twice XLA's bf16 error (+1e-3: bf16's step near 0.25), outputs and gradients."""
    kw = CASES[case][0]
    T = 16
    q, k, v = qkv(T=T, H=64)
    mask = kw.get("mask")
    if isinstance(mask, Segments):
        mask = mask.ids_BL[:, :, None] == mask.ids_BL[:, None, :]
    mask = None if mask is None else (mask[:, None, None, :] if mask.ndim == 2 else mask[:, None])
    g = jnp.asarray(np.random.default_rng(1).normal(size=(2, T, 4, 64)), jnp.float32)

    def loss(fn, *qkv_):
        o = fn(*qkv_)
        return (o.astype(jnp.float32) * g).sum(), o

    def run(fn, dtype):
        args = [x.astype(dtype) for x in (q, k, v)]
        (_, o), grads = jax.jit(jax.value_and_grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2), has_aux=True))(*args)
        return [np.asarray(x, np.float32) for x in (o, *grads)]
    cudnn = run(lambda q, k, v: cudnn_dropout.attention(q, k, v, mask, kw.get("bias"), causal=kw.get("causal", False),
                                                        scale=0.125, window=kw.get("window"), dropout_rate=0.0),
                jnp.bfloat16)
    xla = run(lambda q, k, v: attention(q, k, v, scale=0.125, implementation="xla", **kw), jnp.bfloat16)
    ref = run(lambda q, k, v: attention(q, k, v, scale=0.125, implementation="xla", **kw), jnp.float32)
    for c, x, r in zip(cudnn, xla, ref):
        assert np.abs(c - r).max() <= 2 * np.abs(x - r).max() + 1e-3


@on_gpu
def test_gpu_kernel_keeps_each_probability_at_1_minus_p_scaled_and_its_backward_drops_the_same():
    """q = k = 0 (each probability 1/S) and v the identity (S = H): the output is the dropped-out probabilities,
    kept ones (1/S)/(1 - p). The kept share is 1 - p within 6 standard deviations; the gradient of v is the
    forward's dropped-out probabilities times the output's gradient (the backward's masks are the forward's); a
    second run draws other masks; the program calls the dropout kernel."""
    B, N, S, p = 4, 4, 64, 0.2
    zeros = jnp.zeros((B, S, N, S), jnp.bfloat16)
    v = jnp.broadcast_to(jnp.eye(S, dtype=jnp.bfloat16)[None, :, None, :], (B, S, N, S))
    g = jnp.asarray(np.random.default_rng(0).normal(size=(B, S, N, S)), jnp.float32)

    def loss(v):
        o = attention(zeros, zeros, v, dropout_rate=p, dropout_key=KEY, implementation="cudnn")
        return (o.astype(jnp.float32) * g).sum(), o
    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    assert "fmhaSoftmaxDropout" in step.lower(v).as_text()
    (_, o), dv = step(v)
    o, dv = np.asarray(o, np.float32), np.asarray(dv, np.float32)
    kept = o > 0
    assert abs(kept.mean() - (1 - p)) < 6 * np.sqrt(p * (1 - p) / o.size)
    np.testing.assert_allclose(o[kept], 1 / (S * (1 - p)), rtol=2 ** -7)  # bf16's rounding
    want = np.einsum("btns,btnh->bsnh", o, np.asarray(g))
    np.testing.assert_allclose(dv, want, atol=2e-2 * np.abs(want).max())
    (_, again), _ = step(v)
    assert not np.array_equal(np.asarray(again, np.float32), o)
