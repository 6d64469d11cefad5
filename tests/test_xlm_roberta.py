"""What only XLM-RoBERTa and CamemBERT have (their parity cases are in test_parity.py): presets with the hub's
configs and transformers' parameter counts."""
import pytest
import torch
import transformers

from flaxlm import models
from flaxlm.models.presets import build_config

# from the hub's config.json of FacebookAI/xlm-roberta-base, -large and almanach/camembert-base
_HUB = dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, hidden_act="gelu",
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)
_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
HUB_CONFIGS = {
    "xlm-roberta-base": dict(_HUB, **_BASE, vocab_size=250002, bos_token_id=0, eos_token_id=2),
    "xlm-roberta-large": dict(_HUB, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                              intermediate_size=4096, vocab_size=250002, bos_token_id=0, eos_token_id=2),
    "camembert-base": dict(_HUB, **_BASE, vocab_size=32005, bos_token_id=5, eos_token_id=6),
}
HUB_SIZES = {"xlm-roberta-base": 278_295_186, "xlm-roberta-large": 560_142_482, "camembert-base": 110_655_493}


@pytest.mark.parametrize("name", [*HUB_CONFIGS, "xlm-roberta-tiny", "camembert-tiny"])
def test_presets_have_the_hub_configs_and_transformers_parameter_counts(name):
    """Our model of each preset has as many parameters as transformers' *ForMaskedLM of the same config (built on
    the meta device: no memory, no initialization)."""
    config = build_config(name)
    for key, value in HUB_CONFIGS.get(name, {}).items():
        assert getattr(config, key) == value, key
    with torch.device("meta"):
        hf = transformers.AutoModelForMaskedLM.from_config(config)
    assert type(hf).__name__ == models.family_of(config).architecture
    ours = models.count_params(models.abstract_model(config)[1])
    assert ours == sum(p.numel() for p in hf.parameters()) == HUB_SIZES.get(name, ours)
