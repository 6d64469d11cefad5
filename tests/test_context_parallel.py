"""Context parallelism (flaxlm.models.context_parallel, --context_parallel_size) on 8 CPU devices: a causal LM's loss
and gradients with each sequence split over a 'context' axis equal those of the run without it (float32, 1e-5),
on packed documents (each token attending only to its own document), through XLA's attention and splash's
(Pallas' interpret mode), under --scan_layers and full remat; a run resumes exactly; the TPU compiler plans it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import run_clm_flax
from flaxlm import models
from flaxlm.models.context_parallel import balanced_order
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import Segments
from flaxlm.training import mesh as meshlib
from parity import randomize
from run_helpers import read_metrics, run_args, run_until_crash
from test_parity import CASE
from tpu_compile import needs_libtpu


def packed_batch(config, B, T, seed=0):
    """ids, segment ids (1-3 documents a row, contiguous) and positions restarting at each document [B, T]."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.vocab_size, (B, T)).astype(np.int32)
    segments = np.sort(rng.integers(1, 4, (B, T)), axis=1).astype(np.int32)
    starts = np.concatenate([np.ones((B, 1), bool), segments[:, 1:] != segments[:, :-1]], axis=1)
    index = np.broadcast_to(np.arange(T), (B, T))
    positions = (index - np.maximum.accumulate(np.where(starts, index, 0), axis=1)).astype(np.int32)
    return ids, segments, positions


def loss_and_grads(case, execution, devices, C, B, T):
    """(loss, gradients) of the case's model (no dropout, noisy weights) on a packed batch, on a mesh of `devices`
    with a 'context' axis of C (C 1: on one device)."""
    config = case.config(attention_dropout=0.0)
    graphdef, params = models.split_model(models.create_model(config, seed=0, execution=execution))
    params = randomize(params, 0, 0.1)

    def loss(p, ids, segments, positions):
        logits = models.apply_model(graphdef, p, ids, Segments(segments), positions)
        logp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.take_along_axis(logp, ids[:, 1:, None], -1).mean()

    if C == 1:  # the reference: one device
        return jax.jit(jax.value_and_grad(loss))(params, *packed_batch(config, B, T))
    mesh = meshlib.make_mesh(devices, context=C)
    rows = meshlib.batch_sharding(mesh)
    step = jax.jit(jax.value_and_grad(loss), in_shardings=(NamedSharding(mesh, P()), rows, rows, rows))
    return meshlib.on_mesh(step, mesh)(params, *packed_batch(config, B, T))


# (case, attention, --scan_layers and full remat, devices, C, rows, positions)
RUNS = [("llama-gqa-untied", "xla", True, 8, 4, 4, 32),  # scanned, rematerialized layers
        ("gemma2-softcap-window4-untied", "xla", False, 8, 4, 4, 32),  # sliding windows, soft-capped scores
        ("qwen3_moe-experts4-top2-untied", "xla", False, 8, 2, 4, 32),  # experts routed from split positions
        ("llama-gqa-untied", "splash", False, 2, 2, 1, 512)]  # two chunks of 128 queries per device


@pytest.mark.parametrize("name,attention,stacked,devices,C,B,T", RUNS,
                         ids=[f"{r[0]}-{r[1]}{'-scan-remat' if r[2] else ''}-C{r[4]}" for r in RUNS])
def test_loss_and_gradients_equal_the_run_without_it(name, attention, stacked, devices, C, B, T):
    execution = Execution(attention=attention, scan=stacked, remat="full" if stacked else "none")
    used = jax.devices()[:devices]
    loss, grads = loss_and_grads(CASE[name], execution, used, C, B, T)
    ref_loss, ref_grads = loss_and_grads(CASE[name], execution, used, 1, B, T)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    for g, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        assert float(jnp.abs(g - ref).max()) <= 1e-5 * float(jnp.abs(ref).max())  # float32: ~2e-6 measured


def test_balanced_order_gives_each_device_the_same_causal_work():
    """Device c holds chunks c and 2C - 1 - c: the keys its queries see add up to the same for every device."""
    C, T = 4, 64
    order = balanced_order(T, C)
    assert sorted(order) == list(range(T))
    work = [int((order[c * T // C:(c + 1) * T // C] + 1).sum()) for c in range(C)]
    assert len(set(work)) == 1


def test_a_run_resumes_exactly_and_learns_as_without_it(model_dir_for, corpus, tmp_path, monkeypatch):
    """run_clm_flax.py --context_parallel_size 2 on 8 devices (4 groups of 2), stopped at step 3 and resumed:
    every step's loss is the run's without context parallelism (8 devices, the same global batch)."""
    model = model_dir_for("llama-tiny")

    def args(out, *extra):
        return run_args(model, corpus, out, "--block_size", "64", "--max_steps", "4", "--save_steps", "2",
                        "--do_eval", "false", "--learning_rate", "3e-3", "--train_batch_size", "8", *extra)
    run_clm_flax.main(args(tmp_path / "plain"))
    plain = [r["loss"] for r in read_metrics(tmp_path / "plain")]
    run_until_crash(run_clm_flax.main, args(tmp_path / "split", "--context_parallel_size", "2"), monkeypatch, 3)
    run_clm_flax.main(args(tmp_path / "split", "--context_parallel_size", "2", "--resume_from_checkpoint", "latest"))
    split = read_metrics(tmp_path / "split")
    assert [r["step"] for r in split] == [1, 2, 3, 4]
    assert [r["loss"] for r in split] == pytest.approx(plain, rel=1e-5)


@needs_libtpu
def test_the_tpu_compiler_plans_it_with_splash(model_dir_for, corpus, tmp_path, capsys):
    """--compile_for v5p-8 --context_parallel_size 2: 2 groups of 2 chips, splash attention per chunk."""
    model = model_dir_for("llama-tiny")
    r = run_clm_flax.main(run_args(model, corpus, tmp_path / "plan", "--block_size", "512", "--do_eval", "false",
                                   "--context_parallel_size", "2", "--compile_for", "v5p-8",
                                   "--rope_scaling", '{"rope_type": "yarn", "factor": 2}'))
    out = capsys.readouterr().out
    assert "fits v5p-8" in out and "2 groups of 2 devices (context parallel)" in out, out
    assert r["kernels"] > 0 and not (tmp_path / "plan").exists()
