"""ModernBERT: what the parity checks of every family (tests/test_parity.py) and the layer-stack checks
(tests/test_layer_stack.py) do not cover: RoPE frequencies of each kind of layer, the local window at the test's
lengths, packed rows, the masked-position gather, the hub's config.json, bare and older checkpoints,
initialization, preset sizes, config errors, the fine-tuning heads against transformers' (both directions, both
poolings), and the scripts that train them."""
import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models import modernbert
from flaxlm.models.presets import build_config
from generation_check import add_noise
from parity import (assert_initialized_like_transformers, assert_same_params, batch, hf_logits, jnp_args, random_hf,
                    randomize)
from test_classification_parity import AUTO, assert_close, hf_outputs
from test_parity import CASE

MB = CASE["modernbert-global3-window4"]
UNTIED = CASE["modernbert-biases-untied-relu"]


def assert_rope_buffers(model, config):
    """Our inverse frequencies of local and global layers are transformers' buffers (to torch's float32 pow)."""
    rotary = ModernBertRotaryEmbedding(config)
    for ours, kind in zip((r.inv_freq for r in model.ropes), ("sliding_attention", "full_attention")):
        np.testing.assert_allclose(np.float32(ours), getattr(rotary, f"{kind}_inv_freq").numpy(), rtol=2e-7, atol=0)


def test_rope_frequencies_are_transformers_buffers():
    model = models.create_model(MB.config())
    assert_rope_buffers(model, MB.config())
    assert model.is_global == (True, False, False)


def test_the_local_window_matters_at_the_test_lengths():
    """transformers' logits of the parity batch change when the window widens: the parity checks see the band."""
    b = batch(MB)
    wide = dataclasses.replace(MB, fields={**MB.fields, "local_attention": 64})
    assert np.abs(hf_logits(random_hf(MB), b.hf) - hf_logits(random_hf(wide), b.hf))[b.real_BL].max() > 1e-2


def test_hub_config_json_loads(tmp_path):
    """A config.json as answerdotai/ModernBERT-base's (global_attn_every_n_layers, global_rope_theta,
    local_rope_theta; no layer_types, no rope_parameters) gives the layer kinds, window and thetas transformers
    reads from it."""
    (tmp_path / "config.json").write_text(json.dumps({**modernbert.PRESETS["modernbert-base"],
                                                      "architectures": ["ModernBertForMaskedLM"]}))
    config = models.load_config(tmp_path)
    model = jax.eval_shape(lambda: models.create_model(config))
    assert model.is_global == tuple(i % 3 == 0 for i in range(22))
    assert model.layers[1].attn.window == 65  # a local layer's keys: at most 64 positions away
    assert_rope_buffers(model, config)


@pytest.mark.parametrize("case", [MB, UNTIED], ids=str)
def test_masked_positions_and_hidden_rows(case):
    model = models.create_model(case.config())
    ids, mask, types = jnp_args(batch(case))
    full = model(ids, mask)
    np.testing.assert_array_equal(model(ids, mask, types), full)  # token types are ignored
    pos = jnp.array([[0, 3, 11], [1, 2, 6]], jnp.int32)
    got = model(ids, mask, masked_positions_BP=pos)
    np.testing.assert_allclose(got, jnp.take_along_axis(full, pos[..., None], axis=1), atol=1e-5)
    np.testing.assert_allclose(model.head().logits(model(ids, mask, masked_positions_BP=pos, hidden=True)), got,
                               atol=1e-5)


def test_packed_rows_compute_each_sequence_alone():
    """Two sequences packed in a row (segment ids) give the logits each gives alone (a padded row of its own):
    the masks and the rotary positions restart at every sequence. Rows of 12, as the parity batch's."""
    model = models.create_model(MB.config())
    ids = np.random.default_rng(0).integers(3, 99, (2, 12))
    seg = np.array([[1] * 7 + [2] * 4 + [0]] * 2)
    packed = np.asarray(model(jnp.asarray(ids), segment_ids_BL=jnp.asarray(seg)))
    alone_ids = np.zeros((2, 12), np.int64)
    alone_ids[0, :7], alone_ids[1, :4] = ids[0, :7], ids[0, 7:11]
    alone = np.asarray(model(jnp.asarray(alone_ids), jnp.asarray(alone_ids != 0)))
    np.testing.assert_allclose(packed[0, :7], alone[0, :7], atol=1e-5)
    np.testing.assert_allclose(packed[0, 7:11], alone[1, :4], atol=1e-5)


def test_bare_and_older_checkpoints_load(tmp_path):
    """A bare ModernBertModel gets a fresh masked-LM head; the rotary buffers older transformers saved and a saved
    copy of the tied decoder are accepted; a decoder that differs from the embeddings is one clear error."""
    config = MB.config()
    hf = random_hf(MB)
    hf.model.save_pretrained(tmp_path / "bare")
    _, model = models.load_pretrained(tmp_path / "bare", seed=5)
    params = models.split_model(model)[1]
    fresh = models.split_model(models.create_model(config, seed=5))[1]
    assert_same_params(params["mlm_head"], fresh["mlm_head"])
    np.testing.assert_array_equal(params["layers"]["1"]["mlp"]["Wi"]["kernel"],
                                  hf.model.layers[1].mlp.Wi.weight.detach().numpy().T)
    tensors = {k: v.numpy() for k, v in hf.state_dict().items()}  # decoder.weight: the tied copy
    tensors["model.rotary_emb.full_attention_inv_freq"] = np.ones(4, np.float32)
    want = models.from_hf_state_dict(config, {k: v.numpy() for k, v in hf.state_dict().items()
                                              if k != "decoder.weight"})
    assert_same_params(models.from_hf_state_dict(config, tensors), want)
    tensors["decoder.weight"] = tensors["decoder.weight"] + 1
    with pytest.raises(UserError, match="decoder.weight differs from model.embeddings.tok_embeddings.weight"):
        models.from_hf_state_dict(config, tensors)


@pytest.mark.parametrize("case", [MB, UNTIED], ids=str)
def test_initialized_like_transformers(case):
    """Truncated normals of transformers' stds (inputs, outputs / sqrt(2 layers)), unit norms, zero biases."""
    config = case.config(initializer_range=0.2)
    ours = assert_initialized_like_transformers(config, case.hf_class,
                                                lambda name: name.endswith(("norm.weight", "bias")))
    cutoff = 2 * 0.2 / (2 * config.num_hidden_layers) ** 0.5
    assert np.abs(ours["model.layers.1.attn.Wo.weight"]).max() <= cutoff


HUB_SIZES = {"modernbert-base": 149_655_232, "modernbert-large": 395_881_664}  # the model cards' 149M and 395M


@pytest.mark.parametrize("name", ["modernbert-base", "modernbert-large", "modernbert-tiny"])
def test_preset_parameter_counts_equal_transformers(name):
    config = build_config(name)
    with torch.device("meta"):
        hf = transformers.ModernBertForMaskedLM(config)
    ours = models.count_params(models.abstract_model(config)[1])
    assert ours == sum(p.numel() for p in hf.parameters())
    assert ours == HUB_SIZES.get(name, ours)


def test_config_errors():
    with pytest.raises(UserError, match="even head width"):
        models.create_model(MB.config(hidden_size=36, num_attention_heads=4))
    with pytest.raises(UserError, match="unsupported layer type.s. chunked_attention in config.json's layer_types"):
        models.create_model(MB.config(layer_types=["full_attention"] * 2 + ["chunked_attention"]))
    with pytest.raises(UserError, match="hidden_act 'mish'"):
        models.create_model(MB.config(hidden_activation="mish"))


HEAD_CASES = [("sequence_classification", "cls"), ("sequence_classification", "mean"), ("question_answering", "cls")]


@pytest.mark.parametrize("task,pooling", HEAD_CASES)
def test_head_from_transformers(tmp_path, task, pooling):
    config = MB.config(num_labels=3 if task == "sequence_classification" else 2, classifier_pooling=pooling)
    torch.manual_seed(0)
    hf = add_noise(AUTO[task].from_config(config), std=0.1)
    hf.save_pretrained(tmp_path)
    _, model = models.load_for_task(tmp_path, task)
    ids, mask, types = batch(MB, config=config).args
    assert_close(model(jnp.asarray(ids), jnp.asarray(mask)), hf_outputs(hf, ids, mask, types), mask)


@pytest.mark.parametrize("task,pooling", HEAD_CASES)
def test_head_to_transformers(tmp_path, task, pooling):
    config = models.task_config(UNTIED.config(classifier_pooling=pooling), task, id2label={0: "a", 1: "b", 2: "c"})
    graphdef, params = models.split_model(models.create_model(config, seed=1, task=task))
    params = randomize(params, seed=1, std=0.1)
    models.save_pretrained(tmp_path, config, params)
    hf, info = AUTO[task].from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(hf).__name__ == "ModernBert" + ("ForSequenceClassification" if task == "sequence_classification"
                                                else "ForQuestionAnswering")
    ids, mask, types = batch(UNTIED, seed=1).args
    ours = models.apply_model(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types),
                              dropout_key=None)
    assert_close(ours, hf_outputs(hf, ids, mask, types), mask)
    assert models.count_params(params) == sum(p.numel() for p in hf.parameters())


def test_fine_tuning_starts_from_the_masked_lm_head(tmp_path):
    """As in transformers, a masked-LM checkpoint's head (dense, norm) is the classifier's head; its decoder is
    dropped and only the classifier starts fresh: the logits equal transformers' of the same checkpoint."""
    hf = random_hf(MB)
    hf.save_pretrained(tmp_path)
    config, model = models.load_for_task(tmp_path, "sequence_classification", num_labels=2, seed=0)
    params = models.split_model(model)[1]
    np.testing.assert_array_equal(params["head"]["dense"]["kernel"], hf.head.dense.weight.detach().numpy().T)
    theirs = transformers.ModernBertForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    theirs.classifier.weight.data = torch.tensor(np.asarray(params["classifier"]["kernel"]).T.copy())
    theirs.classifier.bias.data = torch.tensor(np.asarray(params["classifier"]["bias"]))
    ids, mask, types = batch(MB).args
    assert_close(model(jnp.asarray(ids), jnp.asarray(mask)), hf_outputs(theirs, ids, mask, types), mask)
    assert hf_logits(hf, batch(MB).hf).shape == (2, 12, 99)


def test_continue_a_transformers_checkpoint_export_and_fine_tune(model_dir_for, corpus, tmp_path):
    """run_mlm_flax.py continues a ModernBertForMaskedLM written by transformers (the modernbert-tiny preset as
    create_config.py writes it) and exports what transformers reloads with our logits; run_classification.py
    fine-tunes that export into a ModernBertForSequenceClassification transformers loads cleanly."""
    import run_classification
    import run_mlm_flax
    from run_helpers import read_metrics, run_args
    from test_sentence_prediction import sentences, write_tsv
    model_dir = model_dir_for("modernbert-tiny", vocab_size=400)
    hf_dir = tmp_path / "hf"
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(models.load_config(model_dir)).save_pretrained(hf_dir)
    for name in (n for n in os.listdir(model_dir) if n.startswith("tokenizer")):
        shutil.copy(os.path.join(model_dir, name), hf_dir)
    out = tmp_path / "mlm"
    run_mlm_flax.main(run_args(str(hf_dir), corpus, out, "--max_seq_length", "32", "--learning_rate", "3e-3",
                               "--max_steps", "3", "--do_eval", "false", model_flag="--model_name_or_path"))
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out)
    before = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir)
    assert not torch.equal(hf.model.layers[1].mlp.Wi.weight, before.model.layers[1].mlp.Wi.weight)  # trained
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(["The for statement is used to iterate.", "A short one."], padding="max_length", max_length=24,
              return_tensors="np")
    _, ours = models.load_pretrained(out)
    theirs = hf_logits(hf, dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]))
    real = enc["attention_mask"] == 1
    assert np.abs(np.asarray(ours(enc["input_ids"], enc["attention_mask"])) - theirs)[real].max() < 1e-4

    fine = tmp_path / "cls"
    run_classification.main([
        "--output_dir", str(fine), "--model_name_or_path", str(out), "--train_file",
        write_tsv(tmp_path / "train.tsv", sentences(16, 1)), "--validation_file",
        write_tsv(tmp_path / "dev.tsv", sentences(6, 2)), "--per_device_train_batch_size", "2", "--max_steps", "4",
        "--learning_rate", "1e-3", "--logging_steps", "2", "--do_eval", "false", "--save_steps", "4"])
    assert [r["step"] for r in read_metrics(fine)] == [2, 4]
    cls, info = transformers.AutoModelForSequenceClassification.from_pretrained(fine, output_loading_info=True)
    assert type(cls).__name__ == "ModernBertForSequenceClassification" and not info["missing_keys"], info
    _, ours = models.load_for_task(fine, "sequence_classification")
    with torch.no_grad():
        theirs = cls.eval()(input_ids=torch.tensor(enc["input_ids"]),
                            attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()
    np.testing.assert_allclose(ours(enc["input_ids"], enc["attention_mask"]), theirs, atol=1e-4, rtol=0)
