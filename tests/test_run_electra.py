"""run_electra_flax.py and its objective (flaxlm.objectives.electra): the loss against an independent numpy
computation, the shared embeddings, a tiny run that trains, resumes and exports (both models loading in transformers
with equal logits), bad input."""
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import run_electra_flax
import run_helpers
from run_helpers import assert_resume_matches, expect_user_error, read_metrics
from flaxlm.data.mlm_masking import MLMMasker
from flaxlm.models import create_model, split_model
from flaxlm.models.electra import DISCRIMINATOR
from flaxlm.models.hf_io import load_config
from flaxlm.objectives.electra import electra_objective, join_params, model_params


@pytest.fixture(scope="module")
def dirs(model_dir_for):
    """(generator dir, discriminator dir): the tiny presets beside one 300-token BPE tokenizer."""
    return model_dir_for("electra-tiny-generator"), model_dir_for("electra-tiny-discriminator")


def run_args(dirs, corpus, out, *extra):
    gen, disc = dirs
    return run_helpers.run_args(disc, corpus, out, "--generator_config_name", gen, "--max_seq_length", "32",
                                "--learning_rate", "3e-3", *extra)


@pytest.fixture(scope="module")
def pair(dirs):
    """(gen config, gen model, disc config, disc model, masker) of the tiny presets, the masker for rows of 16."""
    gen_config, disc_config = load_config(dirs[0]), load_config(dirs[1])
    masker = MLMMasker(seq_len=16, vocab_size=300, mask_token_id=4, pad_token_id=1, special_token_ids=(0, 1, 2, 3, 4),
                       mlm_probability=0.25)
    generator, discriminator = create_model(gen_config, seed=1), create_model(disc_config, seed=0, task=DISCRIMINATOR)
    for name in ("word", "position", "token_type", "norm"):  # the embeddings the two share in training
        nnx.update(getattr(generator.embeddings, name), nnx.state(getattr(discriminator.embeddings, name)))
    generator.generator_head.bias[...] = generator.generator_head.bias[...].at[5:8].set(8.0)  # _batch's tokens:
    # some samples then equal the original
    return gen_config, generator, disc_config, discriminator, masker


def _objective(pair, weight=50.0, temperature=1.0, sharing="shared"):
    gen_config, generator, disc_config, discriminator, masker = pair
    (gen_graphdef, gen_params), (disc_graphdef, disc_params) = split_model(generator), split_model(discriminator)
    objective = electra_objective(gen_graphdef, disc_graphdef, gen_config, disc_config, masker, 16, weight, temperature)
    return objective, join_params(gen_params, disc_params, sharing, new_discriminator=True)


def _gradients(objective, params, batch):
    """(gradient of the generator's loss, gradient of the discriminator's) with respect to params."""
    def grad_of(name):
        return jax.grad(lambda p: objective.loss_sums(p, batch, jax.random.PRNGKey(0))[name])(params)
    return jax.jit(lambda: (grad_of("generator_loss_sum"), grad_of("discriminator_loss_sum")))()


def _batch(pair):
    """The objective's batch (collate: the masker's + the ratio of masked slots to real tokens) of 4 rows of 16."""
    rows = np.random.default_rng(0).integers(5, 8, (4, 16)).astype(np.int32)
    rows[:, 0], rows[:, -1], rows[3, 10:] = 0, 2, 1  # CLS, SEP; row 3 padded
    return _objective(pair)[0].collate(rows, np.random.default_rng(1))


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def test_loss_equals_an_independent_computation(pair):
    """Masking, sampled replacements and the loss formula, redone in numpy from the models' logits."""
    gen_config, generator, disc_config, discriminator, masker = pair
    objective, params = _objective(pair, weight=7.0, temperature=0.5)
    batch = _batch(pair)
    key = jax.random.PRNGKey(3)
    sums = jax.jit(objective.loss_sums)(params, {k: jnp.asarray(v) for k, v in batch.items()}, key)

    ids, mask = batch["input_ids"], batch["attention_mask"]
    pos, labels, w = batch["masked_positions"], batch["masked_labels"], batch["masked_weights"]
    gen_logits = np.asarray(generator(ids, mask, masked_positions_BP=pos, dropout_key=jax.random.fold_in(key, 0)))
    top = gen_logits.max(-1, keepdims=True)
    logp = gen_logits - top - np.log(np.exp(gen_logits - top).sum(-1, keepdims=True))
    mlm = -(np.take_along_axis(logp, labels[..., None], -1)[..., 0] * w).sum() / w.sum()
    # Samples: the Gumbel-max draw jax.random.categorical makes with the step's sampling key.
    gumbel = np.asarray(jax.random.gumbel(jax.random.fold_in(key, 1), gen_logits.shape))
    sample = np.argmax(gen_logits / 0.5 + gumbel, -1)
    original, corrupted = ids.copy(), ids.copy()
    for b, p in zip(*np.nonzero(w)):
        original[b, pos[b, p]], corrupted[b, pos[b, p]] = labels[b, p], sample[b, p]
    replaced = (corrupted != original).astype(np.float64)
    disc_logits = np.asarray(discriminator(corrupted, mask, dropout_key=jax.random.fold_in(key, 2)), np.float64)
    bce = -(replaced * _log_sigmoid(disc_logits) + (1 - replaced) * _log_sigmoid(-disc_logits))
    disc = (bce * mask).sum() / mask.sum()

    n = w.sum()
    assert 0 < replaced.sum() < n  # the test draws both kinds of slot
    np.testing.assert_allclose(sums["generator_loss_sum"] / n, mlm, rtol=1e-5)
    np.testing.assert_allclose(sums["discriminator_loss_sum"] / n, disc, rtol=1e-5)
    np.testing.assert_allclose(sums["loss_sum"] / n, mlm + 7.0 * disc, rtol=1e-5)
    np.testing.assert_allclose(sums["replaced_sum"] / n, ((sample != labels) * w).sum() / n, rtol=1e-6)
    np.testing.assert_allclose(sums["discriminator_accuracy_sum"] / n,
                               (((disc_logits > 0) == replaced) * mask).sum() / mask.sum(), rtol=1e-5)


def test_a_step_cut_into_pieces_has_the_discriminators_mean_over_all_its_rows(pair):
    """The rows of a step, collated together and then cut into pieces (accumulation, CPU chunks) whose shares of
    masked slots and real tokens differ: the pieces' sums add up to the whole batch's, so the step's
    discriminator loss is its mean over the step's real tokens. Eval mode, near-zero temperature: the same
    replacements however the rows are cut."""
    objective, params = _objective(pair, temperature=1e-6)
    batch = _batch(pair)
    real = batch["attention_mask"] > 0
    halves = [{k: jnp.asarray(v[rows]) for k, v in batch.items()} for rows in (slice(0, 2), slice(2, 4))]
    assert (batch["masked_weights"][:2].sum() / real[:2].sum()) != (batch["masked_weights"][2:].sum() / real[2:].sum())
    sums = jax.jit(objective.loss_sums)
    whole = sums(params, {k: jnp.asarray(v) for k, v in batch.items()}, None)
    pieces = [sums(params, half, None) for half in halves]
    for name in ("discriminator_loss_sum", "discriminator_accuracy_sum", "generator_loss_sum", "weight_sum"):
        np.testing.assert_allclose(pieces[0][name] + pieces[1][name], whole[name], rtol=1e-5)


def test_shared_embeddings_are_one_tensor(pair):
    """One set of embedding params, which both models' losses reach: a gradient step moves the generator's and the
    discriminator's embedding outputs (before their projections) alike."""
    from flaxlm.models import merge_model
    from flaxlm.models.bert import Embeddings
    objective, params = _objective(pair)
    V, E = pair[0].vocab_size, pair[0].embedding_size
    assert sum(x.shape == (V, E) for x in jax.tree.leaves(params)) == 1  # one word table in the train state
    batch = {k: jnp.asarray(v) for k, v in _batch(pair).items()}
    grads = _gradients(objective, params, batch)
    for g in grads:  # each model's loss reaches the shared set
        assert np.abs(g["embeddings"]["word"]["embedding"]).max() > 1e-6
    new = jax.tree.map(lambda p, g, h: p - g - h, params, *grads)
    ids = batch["input_ids"]
    moved = {}
    for name, model in (("generator", pair[1]), ("discriminator", pair[3])):
        def embedded(p):  # the shared embeddings' output as model `name` computes it
            module = merge_model(split_model(model)[0], model_params(p, name)).embeddings
            return Embeddings.__call__(module, ids, jnp.zeros_like(ids), None)
        moved[name] = embedded(new) - embedded(params)
    np.testing.assert_array_equal(moved["generator"], moved["discriminator"])
    assert np.abs(moved["generator"]).max() > 1e-4


def test_gdes_sharing_keeps_the_discriminators_loss_off_the_generators_embeddings(pair):
    """--embedding_sharing gdes: the discriminator's embeddings start as the generator's (a zero delta); its loss
    reaches only its delta, the generator's loss only the shared set."""
    objective, params = _objective(pair, sharing="gdes")
    for k, v in model_params(params, "generator")["embeddings"].items():
        if k != "project":
            jax.tree.map(np.testing.assert_array_equal, model_params(params, "discriminator")["embeddings"][k], v)
    gen_grads, disc_grads = _gradients(objective, params, {k: jnp.asarray(v) for k, v in _batch(pair).items()})
    assert np.abs(gen_grads["embeddings"]["word"]["embedding"]).max() > 1e-6
    assert np.abs(disc_grads["discriminator"]["embeddings_delta"]["word"]["embedding"]).max() > 1e-6
    for g in jax.tree.leaves(disc_grads["embeddings"]) + jax.tree.leaves(gen_grads["discriminator"]):
        np.testing.assert_array_equal(g, 0.0)


def test_run_trains_resumes_and_exports_both_models(dirs, corpus, tmp_path, monkeypatch):
    """A tiny run, straight and crashed-and-resumed (the same losses): both models' metrics in the train and eval
    rows; the discriminator exported to --output_dir and the generator to generator/, each loading in transformers
    with our logits, the shared embeddings written into both."""
    import torch
    from transformers import ElectraForMaskedLM, ElectraForPreTraining
    from flaxlm.models import load_for_task, load_pretrained
    from flaxlm.models.hf_io import read_safetensors

    def args_for(out, *extra):
        return run_args(dirs, corpus, out, "--max_steps", "4", "--save_steps", "2", "--eval_steps", "4", *extra)
    assert_resume_matches(run_electra_flax.main, args_for, monkeypatch, tmp_path, steps=4, crash_step=2)
    out = tmp_path / "straight"
    train_rows, eval_rows = read_metrics(out), read_metrics(out, "eval")
    assert [r["step"] for r in eval_rows] == [4]
    for r in train_rows + eval_rows:
        assert r["loss"] == pytest.approx(r["generator_loss"] + 50 * r["discriminator_loss"], rel=1e-5)
        assert 0 < r["replaced"] <= 1 and 0 <= r["discriminator_accuracy"] <= 1 and 0 <= r["generator_accuracy"] <= 1
    assert all(0 < r["mfu"] < 1 for r in train_rows[1:])
    assert "perplexity" not in eval_rows[0]

    ids = np.random.default_rng(0).integers(5, 300, (2, 12))
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    for path, load, hf_class in ((out, lambda p: load_for_task(p, DISCRIMINATOR), ElectraForPreTraining),
                                 (out / "generator", load_pretrained, ElectraForMaskedLM)):
        _, ours = load(str(path))
        with torch.no_grad():
            expected = hf_class.from_pretrained(path).eval()(torch.tensor(ids), attention_mask=torch.tensor(mask))
        np.testing.assert_allclose(np.asarray(ours(ids, mask))[mask > 0], expected.logits.numpy()[mask > 0],
                                   atol=1e-4)
        assert (path / "tokenizer.json").exists()
    word = "electra.embeddings.word_embeddings.weight"
    np.testing.assert_array_equal(read_safetensors(str(out))[word], read_safetensors(str(out / "generator"))[word])


def test_deberta_v3_run_trains_both_models_and_exports_them(model_dir_for, corpus, tmp_path):
    """DeBERTa-v3-style pretraining (deberta-v2 generator half as deep as its discriminator, --embedding_sharing
    gdes): the generator's export loads in transformers' DebertaV2ForMaskedLM with our logits; the discriminator's
    encoder in DebertaV2Model (only the mask_predictions.* head unused), Microsoft's head on its output giving our
    discriminator's logits."""
    import torch
    from transformers import DebertaV2ForMaskedLM, DebertaV2Model
    from flaxlm.models import load_for_task, load_pretrained
    from test_deberta_v2 import microsoft_rtd_logits
    gen, disc = model_dir_for("deberta-v3-tiny-generator"), model_dir_for("deberta-v3-tiny")
    out = tmp_path / "out"
    run_electra_flax.main(run_helpers.run_args(disc, corpus, out, "--generator_config_name", gen, "--max_seq_length",
                                               "32", "--max_steps", "3", "--eval_steps", "3", "--learning_rate", "3e-3",
                                               "--embedding_sharing", "gdes"))
    row = read_metrics(out, "eval")[-1]
    assert row["loss"] == pytest.approx(row["generator_loss"] + 50 * row["discriminator_loss"], rel=1e-5)
    ids = np.random.default_rng(0).integers(5, 300, (2, 12))
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    _, generator = load_pretrained(str(out / "generator"))
    with torch.no_grad():
        expected = DebertaV2ForMaskedLM.from_pretrained(out / "generator").eval()(
            torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(np.asarray(generator(ids, mask))[mask > 0], expected[mask > 0], atol=1e-4)
    encoder, info = DebertaV2Model.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    assert info["unexpected_keys"] and all(k.startswith("mask_predictions.") for k in info["unexpected_keys"])
    _, discriminator = load_for_task(str(out), DISCRIMINATOR)
    np.testing.assert_allclose(np.asarray(discriminator(ids, mask))[mask > 0],
                               microsoft_rtd_logits(encoder, out, ids, mask)[mask > 0], atol=1e-4)


def _config_copy(src, tmp_path, name, **changes):
    """A copy of the config directory src with config.json changed."""
    d = tmp_path / name
    shutil.copytree(src, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **changes}))
    return str(d)


def test_bad_pairs_are_one_line_user_errors(dirs, corpus, tmp_path, model_dir_for):
    gen, disc = dirs
    for name, changes, match in (("wide", {"hidden_size": 128, "intermediate_size": 256}, "generator .* is wider"),
                                 ("vocab", {"vocab_size": 400}, "vocab_size 400 differs"),
                                 ("emb", {"embedding_size": 32}, "embedding_size 32 differs")):
        bad = _config_copy(gen, tmp_path, name, **changes)
        argv = run_helpers.run_args(disc, corpus, tmp_path / name / "out", "--generator_config_name", bad)
        expect_user_error(run_electra_flax.main, argv, match)
    expect_user_error(run_electra_flax.main, run_helpers.run_args(disc, corpus, tmp_path / "none"),
                      "no generator given")
    expect_user_error(run_electra_flax.main,
                      run_helpers.run_args(gen, corpus, tmp_path / "bert_out", "--generator_config_name",
                                           _config_copy(gen, tmp_path, "bert", model_type="bert")),
                      "two configs of one family")
    deberta_gen, deberta_disc = model_dir_for("deberta-v3-tiny-generator"), model_dir_for("deberta-v3-tiny")
    for name, gen_dir, changes, match in (
            ("deberta-mixed", gen, {}, "two configs of one family"),
            ("deberta-wide", deberta_gen, {"hidden_size": 128, "intermediate_size": 256}, "generator .* is wider"),
            ("deberta-narrow", deberta_gen, {"hidden_size": 32, "intermediate_size": 128}, "hidden_size 32 differs")):
        bad = _config_copy(gen_dir, tmp_path, name, **changes)
        argv = run_helpers.run_args(deberta_disc, corpus, tmp_path / name / "out", "--generator_config_name", bad)
        expect_user_error(run_electra_flax.main, argv, match)
    wide = _config_copy(gen, tmp_path, "cli", hidden_size=128)
    done = run_helpers.run_script("run_electra_flax.py", run_helpers.run_args(
        disc, corpus, tmp_path / "cli_out", "--generator_config_name", wide))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_train_flops_are_the_compiled_steps_matmuls(pair):
    """The analytic FLOPs (generator + discriminator) equal the matmuls of the compiled train step, but for the
    discriminator's last gradient, an outer product (one logit per token) that XLA computes without a dot."""
    from bench.hlo_dots import dots_per_run
    from flaxlm.training.train_step import make_train_step
    objective, params = _objective(pair)
    batch = {k: jnp.asarray(v) for k, v in _batch(pair).items()}
    tx = optax.sgd(0.1)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    compiled = jax.jit(make_train_step(objective.loss_sums, tx, 1)).lower(state, batch, jax.random.PRNGKey(0))
    dots, unknown = dots_per_run(compiled.compile().as_text())
    B, L = batch["input_ids"].shape
    outer = B * L * 2 * pair[2].hidden_size  # d(loss)/d(hidden) of the one-logit head
    assert unknown == [] and sum(d.flops * d.count for d in dots) + outer == objective.flops_per_example * B
