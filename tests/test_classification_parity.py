"""Fine-tuning heads (sequence classification, question answering) against transformers' torch models, both
directions, and load_for_task on the checkpoints a user fine-tunes from."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models.registry import FAMILIES
from generation_check import add_noise
from parity import batch, randomize
from test_parity import CASE

AUTO = {"sequence_classification": transformers.AutoModelForSequenceClassification,
        "question_answering": transformers.AutoModelForQuestionAnswering}
# RoBERTa's heads under XLM-R's and CamemBERT's names: one task each here, the other in test_xlm_roberta.py's run
CASES = [(m, t) for m in ("bert", "roberta") for t in AUTO] + [("xlm-roberta", "question_answering"),
                                                               ("camembert", "sequence_classification")]


def tiny_config(model_type, **overrides):
    """The parity table's BERT / RoBERTa config (initializer_range 0.2: logits far from 0)."""
    return CASE[f"{model_type}-gelu"].config(**overrides)


def inputs(config, seed=0):
    """ids, attention_mask, token_type_ids [2, 12] (row 1 padded) of the parity checks, for config."""
    return batch(CASE[f"{config.model_type}-gelu"], seed, config).args


def hf_outputs(hf, ids, mask, types):
    with torch.no_grad():
        out = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                        token_type_ids=torch.tensor(types))
    if hasattr(out, "start_logits"):
        return out.start_logits.numpy(), out.end_logits.numpy()
    return out.logits.numpy()


def assert_close(ours, ref, mask):
    """Classification logits [B, C], or QA (start, end) [B, L] compared at real tokens; within 1e-4."""
    if isinstance(ref, tuple):
        for a, b in zip(ours, ref):
            assert np.asarray(a).dtype == np.float32 and a.shape == b.shape
            np.testing.assert_allclose(np.asarray(a)[mask.astype(bool)], b[mask.astype(bool)], atol=1e-4, rtol=0)
        assert max(np.abs(r).max() for r in ref) > 0.5  # not two near-zero tensors
    else:
        assert np.asarray(ours).dtype == np.float32 and ours.shape == ref.shape
        np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)
        assert np.abs(ref).max() > 0.5


@pytest.mark.parametrize("model_type,task", CASES)
def test_hf_to_flaxlm(tmp_path, model_type, task):
    config = tiny_config(model_type, num_labels=3 if task == "sequence_classification" else 2)
    torch.manual_seed(0)
    hf = add_noise(AUTO[task].from_config(config))
    hf.save_pretrained(tmp_path)
    _, model = models.load_for_task(tmp_path, task)
    ids, mask, types = inputs(config)
    ours = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    assert_close(ours, hf_outputs(hf, ids, mask, types), mask)


@pytest.mark.parametrize("model_type,task", CASES)
def test_flaxlm_to_hf(tmp_path, model_type, task):
    config = models.task_config(tiny_config(model_type), task, id2label={0: "neg", 1: "neu", 2: "pos"})
    graphdef, params = models.split_model(models.create_model(config, seed=1, task=task))
    params = randomize(params, seed=1, std=0.3)
    models.save_pretrained(tmp_path, config, params)
    hf, info = AUTO[task].from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(hf).__name__ == models.family_of(config).heads[task].architecture
    assert type(hf).__name__.endswith("ForSequenceClassification" if task == "sequence_classification" else
                                      "ForQuestionAnswering") and type(hf).config_class.model_type == model_type
    if task == "sequence_classification":
        assert hf.config.id2label == {0: "neg", 1: "neu", 2: "pos"} and hf.config.label2id["pos"] == 2
    ids, mask, types = inputs(config, seed=1)
    ours = models.apply_model(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    assert_close(ours, hf_outputs(hf, ids, mask, types), mask)
    assert models.count_params(params) == sum(p.numel() for p in hf.parameters())


def test_regression_head_and_classifier_dropout(tmp_path):
    """num_labels 1 + problem_type regression round-trips; the head's dropout acts only with a key."""
    config = models.task_config(tiny_config("roberta", classifier_dropout=0.5), "sequence_classification",
                               num_labels=1, problem_type="regression")
    graphdef, params = models.split_model(models.create_model(config, task="sequence_classification"))
    models.save_pretrained(tmp_path, config, params)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert hf.config.problem_type == "regression" and hf.config.num_labels == 1
    ids, mask, types = inputs(config)
    det = models.apply_model(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    assert det.shape == (2, 1)
    drop = [models.apply_model(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types),
                               dropout_key=jax.random.key(k)) for k in (1, 1, 2)]
    np.testing.assert_array_equal(drop[0], drop[1])
    assert not np.allclose(drop[0], det) and not np.allclose(drop[0], drop[2])


def test_load_for_task_from_pretraining_checkpoints(tmp_path, caplog):
    """An MLM export loses its MLM head (a note) and gets a fresh head (one warning); a bare BertModel's pooler
    is BERT's classification pooler; RoBERTa and QA drop it; encoder weights are the checkpoint's."""
    config = tiny_config("bert")
    mlm = transformers.BertForMaskedLM(config)
    mlm.save_pretrained(tmp_path / "mlm")
    with caplog.at_level(logging.WARNING, logger="flaxlm.models.convert"):
        cfg, model = models.load_for_task(tmp_path / "mlm", "sequence_classification", num_labels=4, seed=3)
    assert "dropped the pretraining head" in caplog.text and "pooler / classifier weights" in caplog.text
    params = models.split_model(model)[1]
    assert params["classifier"]["kernel"].shape == (32, 4) and cfg.num_labels == 4
    np.testing.assert_array_equal(np.asarray(params["layers"]["1"]["mlp_in"]["kernel"]),
                                  mlm.bert.encoder.layer[1].intermediate.dense.weight.detach().numpy().T)
    fresh = models.split_model(models.create_model(cfg, seed=3, task="sequence_classification"))[1]
    np.testing.assert_array_equal(np.asarray(params["classifier"]["kernel"]), np.asarray(fresh["classifier"]["kernel"]))

    base = transformers.BertModel(config)  # bare names, with pooler.dense.*
    base.save_pretrained(tmp_path / "base")
    _, model = models.load_for_task(tmp_path / "base", "sequence_classification")
    np.testing.assert_array_equal(np.asarray(models.split_model(model)[1]["pooler"]["kernel"]),
                                  base.pooler.dense.weight.detach().numpy().T)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flaxlm.models.convert"):
        _, qa = models.load_for_task(tmp_path / "base", "question_answering")
    assert "dropped the checkpoint's pooler" in caplog.text and "pooler" not in models.split_model(qa)[1]

    # only config.json: a fresh model
    models.save_config(tmp_path / "scratch", tiny_config("roberta"))
    cfg, model = models.load_for_task(tmp_path / "scratch", "sequence_classification", id2label={0: "a", 1: "b"})
    assert cfg.label2id == {"a": 0, "b": 1} and model(jnp.asarray(inputs(cfg)[0])).shape == (2, 2)


def test_load_for_task_errors(tmp_path):
    config = tiny_config("roberta", num_labels=3)
    transformers.RobertaForSequenceClassification(config).save_pretrained(tmp_path / "cls3")
    with pytest.raises(UserError, match=r"classifier.out_proj.weight of the checkpoint's sequence classification "
                                        r"head has shape \(3, 32\), this task needs \(2, 32\)"):
        models.load_for_task(tmp_path / "cls3", "sequence_classification", num_labels=2)
    with pytest.raises(UserError, match=r"unexpected tensor\(s\) classifier.dense.bias"):
        models.load_for_task(tmp_path / "cls3", "question_answering")  # another task's head is not dropped
    gpt2 = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    models.save_config(tmp_path / "gpt2", gpt2)
    with pytest.raises(UserError,
                       match=r"needs a BERT or RoBERTa or .*XLM-RoBERTa.*ModernBERT.* model, not model_type 'gpt2'"):
        models.load_for_task(tmp_path / "gpt2", "question_answering")
    with pytest.raises(UserError, match="unknown task 'ner'"):
        models.create_model(config, task="ner")


def token_classification_case(model_type):
    """The first parity case of model_type: its tiny config and the padded batch of the parity checks."""
    return next(c for name, c in CASE.items() if c.config().model_type == model_type)


TOKEN_TYPES = [t for t, f in FAMILIES.items() if "sequence_classification" in f.heads]


def test_every_encoder_family_has_a_token_classification_head():
    assert len(TOKEN_TYPES) >= 7 and all("token_classification" in FAMILIES[t].heads for t in TOKEN_TYPES)


@pytest.mark.parametrize("model_type", TOKEN_TYPES)
def test_token_classification_both_ways(tmp_path, model_type):
    """*ForTokenClassification: transformers' checkpoint in ours and our export in transformers (strict, same
    class and parameter count), logits [B, L, num_labels] equal within 1e-4 at the real tokens of a padded batch."""
    case = token_classification_case(model_type)
    config = models.task_config(case.config(), "token_classification", id2label={0: "O", 1: "B-PER", 2: "I-PER"})
    torch.manual_seed(0)
    hf = add_noise(transformers.AutoModelForTokenClassification.from_config(config), 0.1)
    hf.save_pretrained(tmp_path / "hf")
    ids, mask, types = batch(case, 0, config).args
    ref = hf_outputs(hf, ids, mask, types)
    _, model = models.load_for_task(tmp_path / "hf", "token_classification")
    ours = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    real = mask.astype(bool)
    assert ours.dtype == jnp.float32 and ours.shape == ref.shape == (*ids.shape, 3) and np.abs(ref).max() > 0.5
    np.testing.assert_allclose(np.asarray(ours)[real], ref[real], atol=1e-4, rtol=0)

    graphdef, params = models.split_model(model)
    params = randomize(params, seed=1, std=0.1)
    models.save_pretrained(tmp_path / "ours", config, params)
    back, info = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "ours",
                                                                              output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(back).__name__ == models.family_of(config).heads["token_classification"].architecture
    assert type(back) is type(hf) and back.config.id2label[1] == "B-PER"
    assert models.count_params(params) == sum(p.numel() for p in back.parameters())
    ours = models.apply_model(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    np.testing.assert_allclose(np.asarray(ours)[real], hf_outputs(back, ids, mask, types)[real], atol=1e-4, rtol=0)
