"""mT5 and UMT5 (flaxlm/models/mt5.py): what the parity checks of every family (tests/test_parity.py) do not
cover: the checkpoints transformers 5 writes for them (the head tied), UMT5's bias table in every block (also
under scan), and the transformers 5.0-5.23 UMT5 quirk the parity harness works around (parity.as_untied)."""
import numpy as np
import pytest
import torch

from flaxlm import models
from flaxlm.models.layer_stack import Execution
from parity import as_untied, batch, hf_logits, hf_tied, jnp_args, saved_keys
from test_parity import CASE

MT5, UMT5 = CASE["mt5-gated-gelu"], CASE["umt5-gated-gelu"]


@pytest.mark.parametrize("case", [MT5, UMT5], ids=str)
def test_transformers5_tied_checkpoint(case, tmp_path):
    """transformers 5 builds mT5/UMT5 from any config with the head tied and saves no lm_head.weight; its UMT5
    then scales the decoder output by d_model**-0.5, its mT5 does not. Ours (always untied) computes the same."""
    torch.manual_seed(0)
    hf = case.hf_class(case.config()).eval()
    assert hf_tied(hf)
    hf.save_pretrained(tmp_path)
    assert "lm_head.weight" not in saved_keys(tmp_path)
    _, model = models.load_pretrained(tmp_path)
    b = batch(case)
    np.testing.assert_allclose(np.asarray(model(*jnp_args(b))), hf_logits(hf, b.hf), atol=1e-4, rtol=0)


def test_umt5_export_reloads_in_transformers(tmp_path):
    """Our export (untied, config.json tie_word_embeddings false) reloads in transformers 5 with the config saying
    tied. transformers >= 5.24 reads the false into scale_decoder_outputs and computes our logits; earlier 5.x scale
    the decoder output as if tied (by d_model**-0.5), what parity.as_untied undoes."""
    config = UMT5.config()
    model = models.create_model(config, seed=1)
    models.save_pretrained(tmp_path, config, models.split_model(model)[1])
    hf = UMT5.hf_class.from_pretrained(tmp_path).eval()
    assert hf.config.tie_word_embeddings and not hf_tied(hf)
    b = batch(UMT5)
    ours = np.asarray(model(*jnp_args(b)))
    scales = getattr(hf.config, "scale_decoder_outputs", True)  # absent before transformers 5.24
    np.testing.assert_allclose(hf_logits(hf, b.hf), ours * (config.d_model ** -0.5 if scales else 1), atol=1e-5)
    np.testing.assert_allclose(hf_logits(as_untied(hf), b.hf), ours, atol=1e-5)


def test_umt5_bias_in_every_block_also_under_scan():
    config = UMT5.config()
    params = models.split_model(models.create_model(config))[1]
    for stack in ("encoder", "decoder"):
        assert "relative_attention_bias" not in params[stack]
        assert all(layer["relative_attention_bias"]["embedding"].shape == (8, 4)
                   for layer in params[stack]["layers"].values())
    assert "relative_attention_bias" in models.split_model(models.create_model(MT5.config()))[1]["encoder"]
    args = jnp_args(batch(UMT5))
    loop = models.create_model(config, seed=2)
    graphdef, _ = models.split_model(models.create_model(config, execution=Execution(scan=True)))
    np.testing.assert_allclose(models.apply_model(graphdef, models.split_model(loop)[1], *args), loop(*args),
                               atol=1e-5, rtol=0)


def test_config_json_without_model_type(tmp_path):
    """google/umt5-*'s config.json names only its architecture: the checkpoint loads all the same."""
    import json
    hf = UMT5.hf_class(UMT5.config()).eval()
    hf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config, _ = models.load_pretrained(tmp_path)
    assert config.model_type == "umt5" and config.num_decoder_layers == 3
