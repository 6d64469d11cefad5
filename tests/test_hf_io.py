"""Hugging Face checkpoint import/export: names as transformers 5 writes them, strictness, clear errors."""
import json
import logging
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.numpy import save_file

from flaxlm import models
from flaxlm.errors import UserError


def tiny_config(model_type="bert", **overrides):
    cls = transformers.RobertaConfig if model_type == "roberta" else transformers.BertConfig
    kw = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              max_position_embeddings=64 + (2 if model_type == "roberta" else 0))
    return cls(**{**kw, **overrides})


def our_params(config, seed=0):
    return models.split_model(models.create_model(config, seed=seed))[1]


def saved_keys(path):
    with safe_open(os.path.join(path, "model.safetensors"), framework="np") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}, f.metadata()


def assert_same(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_names_match_transformers_save_pretrained(tmp_path, model_type):
    config = tiny_config(model_type)
    transformers.AutoModelForMaskedLM.from_config(config).save_pretrained(tmp_path / "hf")
    hf_keys, _ = saved_keys(tmp_path / "hf")
    ours = models.to_hf_state_dict(config, our_params(config))
    assert {k: v.shape for k, v in ours.items()} == hf_keys
    assert all(v.dtype == np.float32 for v in ours.values())


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_save_load_roundtrip(tmp_path, model_type):
    config = tiny_config(model_type)
    params = our_params(config, seed=3)
    models.save_pretrained(tmp_path, config, params)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]  # no temp files left behind
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["RobertaForMaskedLM" if model_type == "roberta" else "BertForMaskedLM"]
    assert saved["model_type"] == model_type
    _, metadata = saved_keys(tmp_path)
    assert metadata == {"format": "pt"}
    config2, model = models.load_pretrained(tmp_path, dtype="bfloat16")
    assert config2.model_type == model_type and model.dtype == jax.numpy.bfloat16
    assert_same(models.split_model(model)[1], params)


def test_sharded_checkpoint(tmp_path):
    config = tiny_config("bert")
    hf = transformers.AutoModelForMaskedLM.from_config(config)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    _, model = models.load_pretrained(tmp_path)
    np.testing.assert_array_equal(np.asarray(models.split_model(model)[1]["layers"]["1"]["mlp_in"]["kernel"]),
                                  hf.bert.encoder.layer[1].intermediate.dense.weight.detach().numpy().T)


def test_bare_encoder_checkpoint_gets_fresh_head(tmp_path, caplog):
    config = tiny_config("bert")
    base = transformers.BertModel(config)  # keys without "bert.", with pooler.dense.*, no MLM head
    base.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="flaxlm.models.convert"):
        _, model = models.load_pretrained(tmp_path)
    assert "no masked-LM head" in caplog.text and "pooler.dense.weight" in caplog.text
    params = models.split_model(model)[1]
    np.testing.assert_array_equal(np.asarray(params["embeddings"]["word"]["embedding"]),
                                  base.embeddings.word_embeddings.weight.detach().numpy())
    assert_same(params["mlm_head"], our_params(config)["mlm_head"])


def test_older_checkpoint_conventions_accepted():
    """gamma/beta LayerNorm names, saved buffers, a tied decoder copy, decoder.bias, the NSP head."""
    config = tiny_config("bert")
    params = our_params(config, seed=1)
    tensors = models.to_hf_state_dict(config, params)
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in tensors.items()}
    old["bert.embeddings.position_ids"] = np.arange(64)[None]
    old["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    old["cls.predictions.decoder.bias"] = old.pop("cls.predictions.bias")
    old["cls.seq_relationship.weight"] = np.zeros((2, 32), np.float32)
    old["cls.seq_relationship.bias"] = np.zeros((2,), np.float32)
    assert_same(models.from_hf_state_dict(config, old), params)

    old["cls.predictions.decoder.weight"] = old["cls.predictions.decoder.weight"] + 1.0
    with pytest.raises(UserError, match="cls.predictions.decoder.weight"):
        models.from_hf_state_dict(config, old)


def test_half_precision_tensors_become_float32():
    config = tiny_config("roberta")
    tensors = {k: v.astype(np.float16) for k, v in models.to_hf_state_dict(config, our_params(config)).items()}
    params = models.from_hf_state_dict(config, tensors)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))


def test_missing_extra_and_misshapen_tensors():
    config = tiny_config("bert")
    tensors = models.to_hf_state_dict(config, our_params(config))

    missing = dict(tensors)
    del missing["bert.encoder.layer.1.attention.self.key.weight"]
    with pytest.raises(UserError, match=r"missing tensor\(s\) bert.encoder.layer.1.attention.self.key.weight"):
        models.from_hf_state_dict(config, missing)

    extra = {**tensors, "bert.encoder.layer.2.output.dense.bias": np.zeros(32, np.float32)}
    with pytest.raises(UserError, match=r"unexpected tensor\(s\) bert.encoder.layer.2.output.dense.bias"):
        models.from_hf_state_dict(config, extra)

    bad = {**tensors, "bert.encoder.layer.0.intermediate.dense.weight": np.zeros((36, 32), np.float32)}
    with pytest.raises(UserError, match=r"bert.encoder.layer.0.intermediate.dense.weight has shape \(36, 32\) "
                                        r"but config.json implies \(37, 32\)"):
        models.from_hf_state_dict(config, bad)

    roberta = tiny_config("roberta")  # a BERT checkpoint under a RoBERTa config.json
    with pytest.raises(UserError, match="missing tensor"):
        models.from_hf_state_dict(roberta, tensors)


def test_pickle_checkpoint_read_safely(tmp_path):
    """pytorch_model.bin (and its sharded form) loads through torch.load(weights_only=True), equal to the
    safetensors path; bf16 tensors come back float32."""
    config = tiny_config()
    hf = transformers.BertForMaskedLM(config).eval()
    hf.save_pretrained(tmp_path / "safe")
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    (tmp_path / "bin").mkdir()
    config.save_pretrained(tmp_path / "bin")
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "sharded").mkdir()
    config.save_pretrained(tmp_path / "sharded")
    names = sorted(state)
    halves = {"a.bin": names[: len(names) // 2], "b.bin": names[len(names) // 2:]}
    for file, keys in halves.items():
        torch.save({k: state[k].to(torch.bfloat16) if "LayerNorm" in k else state[k] for k in keys},
                   tmp_path / "sharded" / file)
    (tmp_path / "sharded" / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {k: f for f, keys in halves.items() for k in keys}}))
    _, safe = models.load_pretrained(tmp_path / "safe")
    _, from_bin = models.load_pretrained(tmp_path / "bin")
    _, sharded = models.load_pretrained(tmp_path / "sharded")
    assert_same(models.split_model(safe)[1], models.split_model(from_bin)[1])
    bf16 = models.split_model(sharded)[1]
    np.testing.assert_allclose(bf16["layers"]["0"]["attn_norm"]["scale"],
                               safe.layers[0].attn_norm.scale[...], rtol=1e-2)
    assert bf16["layers"]["0"]["attn_norm"]["scale"].dtype == np.float32


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_pickle_that_runs_code_is_refused(tmp_path, monkeypatch):
    import pickle
    monkeypatch.chdir(tmp_path)
    tiny_config().save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps({"x": _Exploit()}))
    with pytest.raises(UserError, match=r"weights_only=True.*never arbitrary pickles.*safe_serialization=True"):
        models.load_pretrained(tmp_path)
    assert not (tmp_path / "pwned").exists()


def test_pickle_without_torch_says_how_to_convert(tmp_path, monkeypatch):
    import sys
    tiny_config().save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"whatever")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(UserError, match=r"torch is not installed.*pip install torch.*safe_serialization=True"):
        models.load_pretrained(tmp_path)


def test_missing_weights(tmp_path):
    tiny_config().save_pretrained(tmp_path)
    with pytest.raises(UserError, match="no model.safetensors"):
        models.load_pretrained(tmp_path)


def test_missing_or_invalid_config(tmp_path):
    config = tiny_config()
    save_file(models.to_hf_state_dict(config, our_params(config)), str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="no config.json"):
        models.load_pretrained(tmp_path)
    with pytest.raises(UserError, match="no config.json"):
        models.load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="invalid config.json"):
        models.load_config(tmp_path)


def test_load_config(tmp_path):
    tiny_config("roberta").save_pretrained(tmp_path)
    config = models.load_config(tmp_path)
    assert isinstance(config, transformers.RobertaConfig) and config.hidden_size == 32


def test_unsupported_model_type(tmp_path):
    transformers.ViTConfig().save_pretrained(tmp_path)
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="unsupported model_type 'vit'"):
        models.load_pretrained(tmp_path)


def test_missing_paths_and_hub_failures(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="does not exist"):
        models.load_pretrained(str(tmp_path / "nope"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="could not download no-such-org/no-such-model from the hub.*local directory"):
        models.load_pretrained("no-such-org/no-such-model")


def test_torch_state_dict_matches_ours():
    """to_hf_state_dict is the torch model's state_dict, less the tied decoder entries and buffers."""
    config = tiny_config("roberta")
    torch.manual_seed(0)
    hf = transformers.AutoModelForMaskedLM.from_config(config)
    sd = {k: v.numpy() for k, v in hf.state_dict().items()}
    params = models.from_hf_state_dict(config, sd)
    back = models.to_hf_state_dict(config, params)
    for k, v in back.items():
        np.testing.assert_array_equal(v, sd[k])
    assert set(sd) - set(back) <= {"lm_head.decoder.weight", "lm_head.decoder.bias"}
