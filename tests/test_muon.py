"""--optim muon (flaxlm.training.muon): its updates against optax.contrib.muon applied by hand to each matrix alone
(a fused tensor cut into its parts, a mixture's experts one by one) and optax.adamw to the rest; a tiny Llama
pretrained with it (--scan_layers, FSDP over 8 devices, a cosine schedule, --z_loss); a mixture compiled for a TPU
slice with it, its optimizer state smaller than AdamW's; and its options' errors."""
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import muon

import run_clm_flax
from run_helpers import read_metrics, run_args
from tpu_compile import compile_for_v5e_8, needs_libtpu
from flaxlm.errors import UserError
from flaxlm.models import create_model, decay_mask, split_model
from flaxlm.models.presets import build_config
from flaxlm.training.optim import make_optimizer

ARGS = dict(optim="muon", adafactor=False, learning_rate=2e-2, warmup_steps=1, warmup_ratio=0.0,
            lr_scheduler_type="linear", lr_scheduler_kwargs=None, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
            adam_epsilon=1e-8, max_grad_norm=0.0, freeze_steps=None)
STEPS = 3


def muon_alone(schedule):
    """alone(grads_by_step): optax.contrib.muon on one matrix [a, b] by itself (as Moonlight: momentum 0.95,
    Nesterov, RMS 0.2, decoupled weight decay), over the steps' gradients: its updates. Its update is compiled once
    for each shape of matrix (op by op, the Newton-Schulz steps of every expert's matrices took most of the test)."""
    tx = muon(schedule, beta=0.95, weight_decay=ARGS["weight_decay"], consistent_rms=0.2)
    update = jax.jit(tx.update)

    def alone(grads_by_step):
        params = jnp.zeros_like(grads_by_step[0])  # weight decay times params: 0 here, the params' own below
        state, out = tx.init(params), []
        for g in grads_by_step:
            u, state = update(g, state, params)
            out.append(u)
        return out
    return alone


def parts(x, keys):
    """The matrices a leaf holds, each [a, b], and how to put their updates back."""
    if keys[-2:] == ("qkv", "kernel"):  # GPT-2's [q | k | v]
        D = x.shape[0]
        return [x[:, i * D:(i + 1) * D] for i in range(3)], lambda ms: jnp.concatenate(ms, axis=1)
    if keys[-1] == "gate_up_proj":  # [E, 2I, D]: each expert's gate rows, then its up rows
        E, two_I, _ = x.shape
        I_ = two_I // 2
        ms = [x[e, h * I_:(h + 1) * I_] for e in range(E) for h in range(2)]
        return ms, lambda us: jnp.stack([jnp.concatenate(us[2 * e:2 * e + 2], axis=0) for e in range(E)])
    if x.ndim == 3:  # down_proj [E, D, I]: an expert a matrix
        return list(x), jnp.stack
    return [x], lambda ms: ms[0]


def flat(tree):
    return {tuple(str(k.key) for k in path): x for path, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("preset", ["gpt2-tiny", "qwen3-moe-tiny"])
def test_each_matrix_is_muon_alone_and_the_rest_adamw(preset):
    """Three steps of random gradients: every hidden matrix's update is optax.contrib.muon's on that matrix alone
    (q, k and v of GPT-2's fused qkv separately; each expert's gate, up and down separately) less the decay of its
    params; the embeddings, the head (vocabulary-sized) and the vectors get optax.adamw's, on the decay mask."""
    config = build_config(preset)
    _, params = split_model(create_model(config))
    tx, schedule = make_optimizer(types.SimpleNamespace(**ARGS), 10, decay_mask(params), params=params,
                                  vocab_size=config.vocab_size, config=config)
    rng = np.random.default_rng(0)
    grads = [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params) for _ in range(STEPS)]
    state, ours = tx.init(params), []
    for g in grads:
        u, state = jax.jit(tx.update)(g, state, params)
        ours.append(flat(u))
    P, G, decays = flat(params), [flat(g) for g in grads], flat(decay_mask(params))

    adam_keys = sorted(k for k, x in P.items() if x.ndim < 2 or "embedding" in k or config.vocab_size in x.shape)
    assert any("lm_head" in k or "embed" in k for k in adam_keys) and len(adam_keys) < len(P)
    adam_tx = optax.adamw(schedule, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask={k: decays[k] for k in adam_keys})
    adam_params = {k: P[k] for k in adam_keys}
    adam_state = adam_tx.init(adam_params)
    for s in range(STEPS):
        want, adam_state = adam_tx.update({k: G[s][k] for k in adam_keys}, adam_state, adam_params)
        for k in adam_keys:
            np.testing.assert_allclose(ours[s][k], want[k], rtol=1e-6, atol=1e-9)

    alone = muon_alone(schedule)
    for k in sorted(set(P) - set(adam_keys)):
        matrices, join = parts(P[k], k)
        by_matrix = [alone([parts(G[s][k], k)[0][m] for s in range(STEPS)]) for m in range(len(matrices))]
        for s in range(STEPS):
            want = join([by_matrix[m][s] for m in range(len(matrices))]) - schedule(s) * ARGS["weight_decay"] * P[k]
            # the same float32 Newton-Schulz steps, batched over a tensor's matrices here and one matrix alone there,
            # round differently: 2.0e-7 at most against updates up to 1.4e-2 (2026-12-07); bound: 1e-4 of the largest
            np.testing.assert_allclose(ours[s][k], want, rtol=0, atol=1e-4 * float(np.abs(want).max()), err_msg=str(k))


@pytest.fixture(scope="module")
def llama_dir(model_dir_for):
    return model_dir_for("llama-tiny")


def test_a_tiny_llama_learns_with_muon_scanned_over_8_devices(llama_dir, corpus, tmp_path, capsys):
    """--optim muon --scan_layers --sharding fsdp over 8 devices, cosine after a 25 % warmup, z-loss on: the loss
    falls, the logged rate is transformers' cosine, z_loss is logged, and one line says what Muon trains."""
    out = tmp_path / "run"
    run_clm_flax.main(run_args(llama_dir, corpus, out, "--block_size", "32", "--learning_rate", "2e-2", "--max_steps",
                               "8", "--do_eval", "false", "--optim", "muon", "--scan_layers", "--sharding", "fsdp",
                               "--lr_scheduler_type", "cosine", "--warmup_steps", "0", "--warmup_ratio", "0.25",
                               "--z_loss", "1e-4", "--per_device_train_batch_size", "2"))
    said = capsys.readouterr().out
    assert "--optim muon: Muon for the hidden matrices (" in said and "MiB of float32 optimizer state" in said
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert all(0 < r["z_loss"] < 1e-2 for r in rows)  # 1e-4 * log(Z)^2, log(Z) ~ log(vocabulary) at the start
    want = [2e-2 * (s / 2 if s < 2 else 0.5 * (1 + math.cos(math.pi * (s - 2) / 6))) for s in range(8)]
    assert [r["learning_rate"] for r in rows] == pytest.approx(want, rel=1e-3)  # the log keeps 4 digits


@needs_libtpu
def test_a_mixture_compiles_for_a_slice_with_less_optimizer_state(model_dir_for, corpus):
    """qwen3-moe-tiny compiled for a TPU v5e-8 with FSDP and Muon: its optimizer state per chip is less than AdamW's
    two moments of every parameter (one momentum buffer for each matrix), more than one."""
    with_muon = compile_for_v5e_8("qwen3_moe", model_dir_for("qwen3-moe-tiny"), corpus, "xla", 32, "--optim", "muon",
                                  "--do_eval", "false")
    assert with_muon["params"] < with_muon["optimizer"] < 1.9 * with_muon["params"]


@pytest.mark.parametrize("flags, message", [
    (["--optim", "lion_32bit"], r"^--optim lion_32bit is not one of flaxlm's optimizers; pass adamw, adafactor, muon"),
    (["--optim", "muon", "--adafactor"], r"^--adafactor and --optim muon name two optimizers"),
])
def test_an_optimizer_flaxlm_lacks_is_one_line_before_any_work(llama_dir, corpus, tmp_path, flags, message):
    with pytest.raises(UserError, match=message):
        run_clm_flax.main(run_args(llama_dir, corpus, tmp_path / "x", "--max_steps", "1", *flags))
    assert not (tmp_path / "x").exists()


def test_adamw_names_of_transformers_run_adamw():
    from flaxlm.training.optim import optimizer_name
    for name in ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw"):
        assert optimizer_name(types.SimpleNamespace(optim=name, adafactor=False)) == "adamw"
    assert optimizer_name(types.SimpleNamespace(optim="adamw_torch", adafactor=True)) == "adafactor"
