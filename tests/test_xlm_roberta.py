"""What only XLM-RoBERTa and CamemBERT have (their parity cases are in test_parity.py): presets with the hub's
configs and transformers' parameter counts; train_tokenizer.py's XLM-R tokenizer; run_mlm_flax.py with --model_type
alone, and continuing a checkpoint transformers wrote."""
import json
import os

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer

from flaxlm.errors import UserError

from flaxlm import models
from flaxlm.models.presets import build_config
from flaxlm.tokenization.trainers import train_xlmr_unigram

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


def test_xlmr_unigram_tokenizer_loads_as_xlm_robertas(model_dir_for, tmp_path):
    """train_tokenizer.py --type xlmr-unigram: AutoTokenizer loads an XLMRobertaTokenizer with XLM-R's ids, which
    encodes sentences and pairs as XLMRobertaTokenizer built from the same pieces does (how transformers builds
    the hub's), and as tokenizer.json read directly does (transformers 4); create_config.py takes its ids."""
    import create_config
    d = model_dir_for("xlm-roberta-tiny", "xlmr-unigram", 300)
    assert json.loads(open(os.path.join(d, "tokenizer_config.json")).read())["tokenizer_class"] == \
        "XLMRobertaTokenizer"
    back = transformers.AutoTokenizer.from_pretrained(d)
    assert type(back) is transformers.XLMRobertaTokenizerFast and len(back) == 300
    assert [back.bos_token_id, back.pad_token_id, back.eos_token_id, back.unk_token_id, back.mask_token_id] == \
        [0, 1, 2, 3, 299]
    assert back.convert_ids_to_tokens([0, 1, 2, 3, 299]) == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    pieces = json.loads(open(os.path.join(d, "tokenizer.json")).read())["model"]["vocab"]
    reference = transformers.XLMRobertaTokenizerFast(vocab=[tuple(p) for p in pieces])
    raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    a, b = "The film was good, 12 times.", "Another line"
    ids_a, ids_b = back(a).input_ids, back(b).input_ids
    assert ids_a[0] == 0 and ids_a[-1] == 2 and 3 not in ids_a and back.tokenize(a)[0].startswith("▁")
    assert back(a, b).input_ids == ids_a + [2] + ids_b[1:]  # <s> A </s></s> B </s>
    for args in ((a,), (a, b), ("ünseen ¤ char",)):
        assert back(*args).input_ids == reference(*args).input_ids == raw.encode(*args).ids
    assert back("¤").input_ids == [0, back.convert_tokens_to_ids("▁"), 3, 2]  # a character never seen: <unk>
    assert back(a + " <mask>").input_ids == ids_a[:-1] + [299, 2]  # the space went into <mask> (lstrip)
    assert back.decode(ids_a, skip_special_tokens=True) == a

    create_config.main(["--preset", "xlm-roberta-base", "--tokenizer_name", d, "--output_dir", str(tmp_path)])
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["bos_token_id"], config["pad_token_id"], config["eos_token_id"], config["vocab_size"]) == \
        (0, 1, 2, 300)


def test_xlmr_unigram_refuses_what_would_not_survive_reloading():
    with pytest.raises(UserError, match="--lowercase does not survive reloading"):
        train_xlmr_unigram(["Hei du"], vocab_size=100, lowercase=True)
    with pytest.raises(UserError, match="--vocab_size 8 is too small for this text"):
        train_xlmr_unigram(["abcdefghij"], vocab_size=8)


TINY = "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=37"


# a tiny run: two steps of one row per device, no evaluation
STEPS = ["--per_device_train_batch_size", "1", "--max_steps", "2", "--logging_steps", "1", "--do_eval", "false"]


def mlm_args(out, tokenizer_dir, corpus, *flags):
    """A tiny run_mlm_flax.py run's flags on the test corpus."""
    return ["--output_dir", str(out), "--tokenizer_name", tokenizer_dir, "--train_file", corpus["train"],
            "--validation_file", corpus["validation"], "--max_seq_length", "32", *STEPS, *flags]


def test_run_mlm_with_model_type_alone_then_continuing_a_transformers_camembert(model_dir_for, corpus, tmp_path):
    """Hugging Face's command line `--model_type xlm-roberta --tokenizer_name DIR`, no config: transformers'
    default XLMRobertaConfig sized to our XLM-R tokenizer (made tiny with --config_overrides) trains, and its export
    loads as XLMRobertaForMaskedLM with our logits. A CamembertForMaskedLM saved by transformers continues
    pretraining and exports back as one."""
    import run_mlm_flax
    from run_helpers import read_metrics
    tokenizer_dir = model_dir_for(None, "xlmr-unigram", 300)
    out = tmp_path / "xlmr"
    run_mlm_flax.main(mlm_args(out, tokenizer_dir, corpus, "--model_type", "xlm-roberta", "--config_overrides", TINY))
    assert [r["step"] for r in read_metrics(out) if np.isfinite(r["loss"])] == [1, 2]
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert type(hf) is transformers.XLMRobertaForMaskedLM and not any(info.values()), info
    default = transformers.XLMRobertaConfig()
    assert (hf.config.vocab_size, hf.config.hidden_size, hf.config.pad_token_id, hf.config.layer_norm_eps) == \
        (300, 32, 1, default.layer_norm_eps)  # the tokenizer's size and ids, the overrides, the rest default
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = np.asarray(tok(["The for statement is used.", "A loop"], padding=True)["input_ids"])
    _, ours = models.load_pretrained(str(out))
    with torch.no_grad():
        theirs = hf(torch.tensor(ids), attention_mask=torch.tensor(ids != 1)).logits.numpy()
    real = ids != 1
    assert np.abs(np.asarray(ours(ids, real.astype(np.int32)))[real] - theirs[real]).max() < 1e-4

    hf_dir = tmp_path / "camembert"
    torch.manual_seed(0)
    camembert = transformers.CamembertForMaskedLM(build_config("camembert-tiny", tok))
    camembert.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    out = tmp_path / "continued"
    run_mlm_flax.main(mlm_args(out, str(hf_dir), corpus, "--model_name_or_path", str(hf_dir)))
    after, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert type(after) is transformers.CamembertForMaskedLM and not any(info.values()), info
    before = camembert.state_dict()
    assert any(not torch.equal(before[k], v) for k, v in after.state_dict().items())  # trained


def test_fine_tuning_xlm_roberta_and_camembert_exports_their_heads(model_dir_for, tmp_path):
    """run_classification.py fine-tunes an XLMRobertaForMaskedLM saved by transformers (its MLM head dropped, a
    fresh classifier) and run_qa.py a new CamemBERT; each export loads cleanly as transformers' class."""
    import run_classification
    import run_qa
    from test_sentence_prediction import sentences, write_tsv
    from test_squad import facts_file
    xlmr_dir = model_dir_for("xlm-roberta-tiny", "xlmr-unigram", 300)
    pretrained = tmp_path / "xlmr"
    torch.manual_seed(0)
    transformers.XLMRobertaForMaskedLM(models.load_config(xlmr_dir)).save_pretrained(pretrained)
    transformers.AutoTokenizer.from_pretrained(xlmr_dir).save_pretrained(pretrained)
    tsv = write_tsv(tmp_path / "train.tsv", sentences(16, 1))
    run_classification.main(["--output_dir", str(tmp_path / "cls"), "--model_name_or_path", str(pretrained),
                             "--train_file", tsv, *STEPS])
    camembert_dir = model_dir_for("camembert-tiny", "xlmr-unigram", 300)
    squad = facts_file(tmp_path / "facts.json")
    run_qa.main(["--output_dir", str(tmp_path / "qa"), "--config_name", camembert_dir, "--tokenizer_name",
                 camembert_dir, "--train_file", squad, "--max_seq_length", "64", "--doc_stride", "16",
                 *STEPS])
    for run, auto, cls in (("cls", transformers.AutoModelForSequenceClassification,
                            transformers.XLMRobertaForSequenceClassification),
                           ("qa", transformers.AutoModelForQuestionAnswering,
                            transformers.CamembertForQuestionAnswering)):
        hf, info = auto.from_pretrained(tmp_path / run, output_loading_info=True)
        assert type(hf) is cls and not any(info.values()), info
