"""ELECTRA: what the parity checks of every family (tests/test_parity.py) do not cover: the presets' sizes, the
fine-tuning heads against transformers, checkpoints of one model read as another (generator <-> discriminator),
run_mlm_flax.py continuing a transformers generator, run_classification.py fine-tuning a transformers discriminator."""
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import run_classification
import run_helpers
import run_mlm_flax
from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models.electra import DISCRIMINATOR, PRESETS
from flaxlm.models.presets import build_config
from generation_check import add_noise
from parity import batch, randomize
from run_helpers import read_metrics
from test_classification_parity import AUTO, assert_close, hf_outputs
from test_parity import CASE
from test_sentence_prediction import sentences, write_tsv

GENERATOR = CASE["electra-generator-projected"]  # embeddings 16 wide, layers 32: projected
HF_CLASS = {None: transformers.ElectraForMaskedLM, DISCRIMINATOR: transformers.ElectraForPreTraining}


def inputs(config, seed=0):
    """ids, attention_mask, token_type_ids [2, 12] (row 1 padded) of the parity checks, for config."""
    return batch(GENERATOR, seed, config).args


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_sizes_are_what_transformers_builds(name):
    """Each preset's model (ElectraForMaskedLM for a generator, ElectraForPreTraining for a discriminator) has the
    parameter count of transformers' model of the same config (built on the meta device)."""
    config = build_config(name)
    task = DISCRIMINATOR if name.endswith("discriminator") else None
    with torch.device("meta"):
        theirs = sum(p.numel() for p in HF_CLASS[task](config).parameters())
    assert models.count_params(models.abstract_model(config, task=task)[1]) == theirs


@pytest.mark.parametrize("size", ["small", "base", "tiny"])
def test_each_generator_can_share_its_discriminators_embeddings(size):
    """Same vocabulary and embedding width, layers no wider (the small generator was released as large as its
    discriminator)."""
    generator, discriminator = (build_config(f"electra-{size}-{m}") for m in ("generator", "discriminator"))
    assert (generator.vocab_size, generator.embedding_size) == (discriminator.vocab_size, discriminator.embedding_size)
    assert generator.hidden_size <= discriminator.hidden_size


@pytest.mark.parametrize("task", list(AUTO))
def test_fine_tuning_heads_match_transformers_both_ways(task, tmp_path):
    """ElectraForSequenceClassification (GELU head, dropout first) and ElectraForQuestionAnswering: transformers'
    checkpoint in ours, and ours in transformers, with equal logits on a padded batch (embeddings projected)."""
    config = models.task_config(GENERATOR.config(), task, id2label={0: "a", 1: "b", 2: "c"})
    torch.manual_seed(0)
    hf = add_noise(AUTO[task].from_config(config))
    hf.save_pretrained(tmp_path / "hf")
    _, model = models.load_for_task(tmp_path / "hf", task)
    ids, mask, types = inputs(config)
    assert_close(model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)), hf_outputs(hf, ids, mask, types),
                 mask)

    graphdef, params = models.split_model(models.create_model(config, seed=1, task=task))
    params = randomize(params, seed=1, std=0.3)
    models.save_pretrained(tmp_path / "ours", config, params)
    hf, info = AUTO[task].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(hf).__name__ == "Electra" + ("ForSequenceClassification" if task == "sequence_classification"
                                             else "ForQuestionAnswering")
    ids, mask, types = inputs(config, seed=1)
    assert_close(models.apply_model(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)),
                 hf_outputs(hf, ids, mask, types), mask)


def _saved(hf_class, case, path):
    torch.manual_seed(0)
    hf = hf_class(case.config())
    hf.save_pretrained(path)
    return hf


def test_a_checkpoint_of_one_model_starts_the_other(tmp_path, caplog):
    """A discriminator checkpoint continues as a generator and a generator's as a discriminator: the encoder is
    the checkpoint's, the other's head is dropped (a note) and the model's own head starts fresh (a warning)."""
    _saved(transformers.ElectraForPreTraining, GENERATOR, tmp_path / "disc")
    gen = _saved(transformers.ElectraForMaskedLM, GENERATOR, tmp_path / "gen")
    with caplog.at_level("WARNING", logger="flaxlm.models.convert"):
        _, generator = models.load_pretrained(tmp_path / "disc")
        _, discriminator = models.load_for_task(tmp_path / "gen", DISCRIMINATOR)
    assert "ignored the discriminator head" in caplog.text and "no masked-LM head" in caplog.text
    assert "dropped the pretraining head(s)" in caplog.text and "discriminator_head weights" in caplog.text
    np.testing.assert_array_equal(np.asarray(discriminator.embeddings.project.kernel[...]),
                                  gen.electra.embeddings_project.weight.detach().numpy().T)
    assert generator(jnp.asarray(inputs(GENERATOR.config())[0])).shape == (2, 12, 99)


def test_an_untied_generator_head_is_refused(tmp_path):
    config = GENERATOR.config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    tensors["generator_lm_head.weight"] = tensors["electra.embeddings.word_embeddings.weight"] + 1.0
    with pytest.raises(UserError, match="generator_lm_head.weight differs from electra.embeddings.word_embeddings"):
        models.from_hf_state_dict(config, tensors)


def with_tokenizer(model_dir, hf_model, path):
    """hf_model saved to path by transformers, with model_dir's tokenizer files beside it."""
    hf_model.save_pretrained(path)
    for f in os.listdir(model_dir):
        if f.startswith(("tokenizer", "special_tokens", "vocab")):
            shutil.copy(os.path.join(model_dir, f), path)
    return str(path)


def test_run_mlm_continues_a_transformers_generator_and_exports_it(model_dir_for, corpus, tmp_path):
    """--model_type electra --model_name_or_path <ElectraForMaskedLM saved by transformers>: three steps, and
    transformers reloads the export (trained) with our logits on a padded batch."""
    model_dir = model_dir_for("electra-tiny-generator", vocab_size=400)
    torch.manual_seed(0)
    hf_dir = with_tokenizer(model_dir, transformers.ElectraForMaskedLM(models.load_config(model_dir)),
                            tmp_path / "hf")
    out = tmp_path / "run"
    run_mlm_flax.main(run_helpers.run_args(hf_dir, corpus, out, "--model_type", "electra", "--max_seq_length", "32",
                                           "--learning_rate", "3e-3", "--max_steps", "3", "--do_eval", "false",
                                           model_flag="--model_name_or_path"))
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) for r in read_metrics(out))
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(hf) is transformers.ElectraForMaskedLM
    before = transformers.ElectraForMaskedLM.from_pretrained(hf_dir).state_dict()
    assert any(not torch.equal(before[k], v) for k, v in hf.state_dict().items())  # trained
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(["The for statement is used to iterate.", "A short one."], padding=True, return_tensors="np")
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(enc["input_ids"]),
                           attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()
    _, ours = models.load_pretrained(str(out))
    real = enc["attention_mask"] == 1
    assert not real.all()  # a padded batch
    assert np.abs(np.asarray(ours(enc["input_ids"], enc["attention_mask"])) - theirs)[real].max() < 1e-4


def test_run_classification_fine_tunes_a_transformers_discriminator(model_dir_for, tmp_path):
    """An ElectraForPreTraining saved by transformers (WordPiece tokenizer) fine-tuned for a few steps: the export
    is an ElectraForSequenceClassification computing our logits."""
    model_dir = model_dir_for("electra-tiny-discriminator", tokenizer="wordpiece", vocab_size=400)
    torch.manual_seed(0)
    hf_dir = with_tokenizer(model_dir, transformers.ElectraForPreTraining(models.load_config(model_dir)),
                            tmp_path / "hf")
    out = tmp_path / "run"
    run_classification.main(["--output_dir", str(out), "--model_name_or_path", hf_dir, "--train_file",
                             write_tsv(tmp_path / "train.tsv", sentences(32, 1)), "--do_eval", "false",
                             "--per_device_train_batch_size", "1", "--learning_rate", "1e-3", "--max_steps", "3",
                             "--logging_steps", "1"])
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) for r in read_metrics(out))
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(hf) is transformers.ElectraForSequenceClassification and hf.config.id2label == {0: "neg", 1: "pos"}
    texts = [s for s, _ in sentences(4, 2)] + ["a longer one : the plot , the actors ."]  # a padded batch
    enc = transformers.AutoTokenizer.from_pretrained(out)(texts, padding=True, return_tensors="np")
    assert not enc["attention_mask"].all()
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(enc["input_ids"]),
                           attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()
    _, ours = models.load_for_task(str(out), "sequence_classification")
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(enc["input_ids"]), jnp.asarray(enc["attention_mask"]))),
                               theirs, atol=1e-4, rtol=0)
