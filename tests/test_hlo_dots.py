"""bench/hlo_dots.py (the matmuls of a compiled program, with how often one run executes each) against
exact counts, and bench/matmul_floor.py end to end on the tiny suite."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.hlo_dots import Dot, dots_per_run  # noqa: E402


def test_loop_bodies_count_once_per_trip_and_gradients_add_their_matmuls():
    def loss(w_DD, xs_NBD):  # 5 steps of a recurrence, each one [16, 8] x [8, 8] matmul
        def body(h_BD, x_BD):
            return jnp.tanh(h_BD @ w_DD + x_BD), None
        h, _ = jax.lax.scan(body, jnp.ones((16, 8)), xs_NBD)
        return h.sum()
    w, xs = jnp.eye(8) * 0.5, jnp.ones((5, 16, 8))
    one = 2 * 16 * 8 * 8
    dots, unknown = dots_per_run(jax.jit(loss).lower(w, xs).compile().as_text())
    assert unknown == [] and sum(d.count for d in dots) == 5 and sum(d.flops * d.count for d in dots) == 5 * one
    # forward, then per step the weight's gradient h^T g and the carry's g w^T: three matmuls a step
    dots, _ = dots_per_run(jax.jit(jax.grad(loss)).lower(w, xs).compile().as_text())
    assert sum(d.count for d in dots) == 15 and sum(d.flops * d.count for d in dots) == 15 * one


def test_batched_and_contracting_dimensions_give_the_flops_of_the_math():
    q, k = jnp.ones((2, 3, 5, 4)), jnp.ones((2, 3, 7, 4))
    scores = jax.jit(lambda q, k: jnp.einsum("bntd,bnsd->bnts", q, k))
    (dot,), _ = dots_per_run(scores.lower(q, k).compile().as_text())
    assert dot.count == 1 and dot.flops == 2 * (2 * 3) * 5 * 7 * 4 and dot.dtype == dot.out_dtype == "f32"
    out = jax.lax.dot_general(np.ones(dot.lhs, np.float32), np.ones(dot.rhs, np.float32), dot.dimension_numbers)
    assert out.size * 4 * 2 == dot.flops  # what the parsed shapes and numbers compute: 4 multiply-adds each
    assert Dot((4, 6), (6, 5), "f32", "f32", (((1,), (0,)), ((), ())), 1).flops == 2 * 4 * 6 * 5


def test_the_tiny_causal_lm_step_holds_exactly_its_analytic_flops():
    """The compiled step's matmuls, LM head in 4 chunks (a loop), times the devices that each run the program
    on their share of the batch, equal flaxlm.training.flops' count for GPT-2."""
    from bench.run import compile_step, parse_args
    from bench.setups import SUITES
    c = SUITES["tiny"]["tasks"]["clm"]
    rows_per_device = c["batch"] // jax.device_count()
    head_rows = 8 * rows_per_device  # 8 of the 31 predicted positions per chunk: 4 chunks
    a = parse_args(["--suite", "tiny", "--tasks", "clm", "--reference", "none", "--lm_head_chunk_rows",
                    str(head_rows)])
    built = compile_step("clm", c, a)
    dots, unknown = dots_per_run(built.compiled.as_text())
    assert unknown == []
    assert max(d.count for d in dots) == 4  # the head's matmuls, once per chunk
    flops = sum(d.flops * d.count for d in dots) * built.mesh.size
    assert flops == built.objective.flops_per_example * c["batch"]


def test_matmul_floor_reports_the_step_against_its_matmuls(capsys):
    from bench import matmul_floor
    matmul_floor.main(["--suite", "tiny", "--tasks", "clm", "--rounds", "2", "--steps", "1", "--reference", "none"])
    out = capsys.readouterr().out
    assert out.count("round ") == 2 and "step / matmuls alone:" in out
    ratio = float(out.split("step / matmuls alone:")[1].split()[0])
    assert ratio > 0
    assert "GFLOP/s" in out and "batched (attention)" in out


def _train_step_dots(loss_sums, params, batch):
    """(the compiled train step's matmul FLOPs, matmuls of unknown count) for one SGD step on `batch`."""
    import optax
    from flaxlm.training.train_step import make_train_step
    tx = optax.sgd(0.1)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    compiled = jax.jit(make_train_step(loss_sums, tx, 1)).lower(state, batch, jax.random.PRNGKey(0)).compile()
    dots, unknown = dots_per_run(compiled.as_text())
    return sum(d.flops * d.count for d in dots), unknown


def _relative_table_flops(config):
    """DeBERTa's per-step FLOPs that flops.py leaves out: each layer's projections of the relative-position
    table (forward and the two gradients) by the key (c2p) and query (p2c) projections."""
    from flaxlm.models.deberta_v2 import position_types, relative_span
    if config.model_type != "deberta-v2":
        return 0
    rows, d = 2 * relative_span(config)[2], config.hidden_size
    return config.num_hidden_layers * len(position_types(config)) * 3 * 2 * rows * d * d


@pytest.mark.parametrize("preset", ["bert-tiny", "electra-tiny-generator", "deberta-v3-tiny", "modernbert-tiny"])
def test_masked_lm_flops_are_the_compiled_steps_matmuls(preset):
    """flops.encoder_mlm_train_flops of each encoder family (the last layer at the masked slots only, or every
    layer in full; ModernBERT's GeGLU; DeBERTa's relative-position scores) equals the matmuls XLA compiles for a
    masked-LM train step."""
    from flaxlm.data.mlm_masking import MLMMasker
    from flaxlm.models import create_model, split_model
    from flaxlm.models.presets import build_config
    from flaxlm.objectives.mlm import mlm_objective
    config = build_config(preset, overrides=["vocab_size=96"])
    L = 16
    masker = MLMMasker(seq_len=L, vocab_size=96, mask_token_id=4, pad_token_id=1, special_token_ids=(0, 1, 2, 3, 4),
                       mlm_probability=0.25)
    graphdef, params = split_model(create_model(config))
    objective = mlm_objective(graphdef, config, masker, L)
    rows = np.random.default_rng(0).integers(5, 96, (2, L)).astype(np.int32)
    batch = {k: jnp.asarray(v) for k, v in masker(rows, np.random.default_rng(1)).items()}
    flops, unknown = _train_step_dots(objective.loss_sums, params, batch)
    assert unknown == [] and flops == objective.flops_per_example * 2 + _relative_table_flops(config)
