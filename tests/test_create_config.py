"""Presets, build_config and the create_config.py script (hub-free)."""
import contextlib
import io
import json
import types

import pytest
import transformers

import create_config
from flaxlm import models
from flaxlm.errors import UserError, run_main
from flaxlm.models.presets import PRESETS, build_config, parse_overrides
from flaxlm.models.t5 import ties_embeddings


def count_params(config):
    """Parameters of the model `config` describes, built abstractly (from one and two layers: checked below)."""
    return models.count_config_params(config)


HF_SHAPES = {  # from the Hugging Face hub config.json files
    "roberta-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                         max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                         bos_token_id=0, eos_token_id=2, vocab_size=50265, hidden_act="gelu",
                         hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
    "roberta-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                          max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                          vocab_size=50265),
    "bert-base-uncased": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                              max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0,
                              vocab_size=30522, hidden_act="gelu"),
    "bert-large-uncased": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                               intermediate_size=4096, max_position_embeddings=512, type_vocab_size=2,
                               layer_norm_eps=1e-12, pad_token_id=0, vocab_size=30522),
    "roberta-small": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
                          max_position_embeddings=258),
}
_T5_HUB = dict(vocab_size=32128, d_kv=64, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
               dropout_rate=0.1, layer_norm_epsilon=1e-6, initializer_factor=1.0, relative_attention_num_buckets=32,
               relative_attention_max_distance=128)
HF_SHAPES.update({  # google/t5-v1_1-* and google-t5/t5-* config.json
    "t5-v1_1-small": dict(_T5_HUB, d_model=512, d_ff=1024, num_layers=8, num_decoder_layers=8, num_heads=6,
                          feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "t5-v1_1-base": dict(_T5_HUB, d_model=768, d_ff=2048, num_layers=12, num_decoder_layers=12, num_heads=12,
                         feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "t5-v1_1-large": dict(_T5_HUB, d_model=1024, d_ff=2816, num_layers=24, num_decoder_layers=24, num_heads=16,
                          feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "t5-small": dict(_T5_HUB, d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                     feed_forward_proj="relu", tie_word_embeddings=True),
    "t5-base": dict(_T5_HUB, d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12,
                    feed_forward_proj="relu", tie_word_embeddings=True),
})
_MT5_HUB = dict(_T5_HUB, d_ff=1024, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
HF_SHAPES.update({  # google/mt5-*, google/umt5-*, google/byt5-* config.json
    "mt5-small": dict(_MT5_HUB, vocab_size=250112, d_model=512, num_layers=8, num_decoder_layers=8, num_heads=6),
    "mt5-base": dict(_MT5_HUB, vocab_size=250112, d_model=768, d_ff=2048, num_layers=12, num_heads=12),
    "umt5-small": dict(_MT5_HUB, vocab_size=256384, d_model=512, num_layers=8, num_decoder_layers=8, num_heads=6),
    "umt5-base": dict(_MT5_HUB, vocab_size=256384, d_model=768, d_ff=2048, num_layers=12, num_heads=12),
    "byt5-small": dict(_MT5_HUB, vocab_size=384, d_model=1472, d_ff=3584, num_layers=12, num_decoder_layers=4,
                       num_heads=6),
    "byt5-base": dict(_MT5_HUB, vocab_size=384, d_model=1536, d_ff=3968, num_layers=18, num_decoder_layers=6,
                      num_heads=12),
})
CONFIG_CLASS = {"roberta": transformers.RobertaConfig, "bert": transformers.BertConfig, "t5": transformers.T5Config,
                "gpt2": transformers.GPT2Config, "opt": transformers.OPTConfig, "llama": transformers.LlamaConfig,
                "electra": transformers.ElectraConfig,
                "xlm-roberta": transformers.XLMRobertaConfig, "camembert": transformers.CamembertConfig,
                "modernbert": transformers.ModernBertConfig, "deberta-v2": transformers.DebertaV2Config,
                "mt5": transformers.MT5Config, "umt5": transformers.UMT5Config, "gpt_neo": transformers.GPTNeoConfig,
                "gptj": transformers.GPTJConfig, "bloom": transformers.BloomConfig, "gemma": transformers.GemmaConfig,
                "gemma2": transformers.Gemma2Config, "gemma3_text": transformers.Gemma3TextConfig,
                "mistral": transformers.MistralConfig, "mixtral": transformers.MixtralConfig,
                "qwen2": transformers.Qwen2Config,
                "qwen3": transformers.Qwen3Config, "qwen3_moe": transformers.Qwen3MoeConfig,
                "qwen2_moe": transformers.Qwen2MoeConfig, "olmoe": transformers.OlmoeConfig}


def config_value(config, key):
    """config.key, except tie_word_embeddings: what the family writes on export (transformers 5 keeps T5's in
    scale_decoder_outputs and says true for every mT5 / UMT5)."""
    if key == "tie_word_embeddings":
        return models.family_of(config).tie_word_embeddings(config)
    if key == "rope_theta" and not hasattr(config, "rope_theta"):  # transformers 5 keeps it in rope_parameters
        return config.rope_parameters["rope_theta"]
    if key in ("global_rope_theta", "local_rope_theta"):  # ModernBERT's hub keys, in rope_parameters in transformers 5
        return config.rope_parameters["full_attention" if key[0] == "g" else "sliding_attention"]["rope_theta"]
    return getattr(config, key)


def save_tokenizer(path, specials=("<s>", "<pad>", "</s>", "<unk>", "<mask>"), n_words=40):
    """A tiny WordLevel tokenizer saved like train_tokenizer.py would: RoBERTa-style special tokens first."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(list(specials) + [f"w{i}" for i in range(n_words)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=specials[3]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    names = ("bos_token", "pad_token", "eos_token", "unk_token", "mask_token")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **dict(zip(names, specials)))
    hf.save_pretrained(str(path))
    return hf


def run_script(*args):
    """create_config.py with these flags, as its __main__ runs it (flaxlm.errors.run_main: a user's error one line on
    stderr, exit 2), in this process: (returncode, stdout, stderr). The script as a process, with its exit code:
    tests/test_bad_input_fuzz.py's test_end_to_end_in_a_subprocess."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run_main(lambda: create_config.main(list(map(str, args))))
            code = 0
        except SystemExit as e:
            code = e.code
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_round_trips(name, tmp_path):
    config = build_config(name)
    assert isinstance(config, CONFIG_CLASS[PRESETS[name]["model_type"]])
    config.save_pretrained(tmp_path)
    loaded = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is type(config)
    for key, value in PRESETS[name].items():
        assert config_value(loaded, key) == value, key
    for key, value in HF_SHAPES.get(name, {}).items():
        assert config_value(loaded, key) == value, key


TINY = [name for name in PRESETS if name.endswith("-tiny")]


@pytest.mark.parametrize("name", TINY)
def test_count_from_two_layers_is_the_count_of_every_layer(name):
    """count_config_params (the models of one and two layers) counts what the whole model holds, deeper than 2."""
    config = build_config(name)
    layers = {"num_hidden_layers": 5}
    if getattr(config, "num_decoder_layers", None) is not None:
        layers["num_decoder_layers"] = 4
    for key, value in layers.items():
        setattr(config, key, value)
    for key in ("layer_types", "attention_layers"):
        if isinstance(getattr(config, key, None), list):
            setattr(config, key, (getattr(config, key) * 5)[:5])
    if hasattr(config, "attention_types"):  # GPT-Neo: counted in full (the shallow configs contradict these)
        config.attention_types = [[["global", "local"], 2], [["global"], 1]]
    assert count_params(config) == models.count_params(models.abstract_model(config)[1])


def test_param_counts_match_known_sizes():
    assert abs(count_params(build_config("roberta-base")) / 1e6 - 124.7) < 1
    assert abs(count_params(build_config("bert-base-uncased")) / 1e6 - 110) < 1.5
    # transformers' T5ForConditionalGeneration.num_parameters() of the hub models
    assert count_params(build_config("t5-small")) == 60_506_624
    assert count_params(build_config("t5-base")) == 222_903_552
    assert count_params(build_config("t5-v1_1-small")) == 76_961_152
    assert count_params(build_config("t5-v1_1-base")) == 247_577_856
    assert count_params(build_config("t5-v1_1-large")) == 783_150_080
    # transformers' num_parameters() of openai-community/gpt2, gpt2-medium, facebook/opt-125m, opt-350m
    assert count_params(build_config("gpt2")) == 124_439_808
    assert count_params(build_config("gpt2-medium")) == 354_823_168
    assert count_params(build_config("opt-125m")) == 125_239_296
    assert count_params(build_config("opt-350m")) == 331_196_416
    assert 95e6 < count_params(build_config("llama-100m")) < 105e6
    assert count_params(build_config("llama-3.2-1b")) == 1_235_814_400  # meta-llama/Llama-3.2-1B (tied head)
    # mistralai/Mistral-7B-v0.1 and v0.3, Qwen/Qwen2.5-0.5B, -7B, Qwen/Qwen3-0.6B-Base, -8B-Base (a tied head once)
    assert count_params(build_config("mistral-7b")) == 7_241_732_096
    assert count_params(build_config("mistral-7b-v0.3")) == 7_248_023_552
    # mistralai/Mixtral-8x7B-v0.1 (46.7B) and Mixtral-8x22B-v0.1 (141B): every expert counted
    assert count_params(build_config("mixtral-8x7b")) == 46_702_792_704
    assert count_params(build_config("mixtral-8x22b")) == 140_620_634_112
    assert count_params(build_config("qwen2.5-0.5b")) == 494_032_768
    assert count_params(build_config("qwen2.5-7b")) == 7_615_616_512
    assert count_params(build_config("qwen3-0.6b")) == 596_049_920
    assert count_params(build_config("qwen3-8b")) == 8_190_735_360
    # Qwen/Qwen1.5-MoE-A2.7B's model card: 14.3B in total; Qwen/Qwen2-57B-A14B's: 57B
    assert round(count_params(build_config("qwen1.5-moe-a2.7b")) / 1e8) == 143
    assert round(count_params(build_config("qwen2-57b-a14b")) / 1e9) == 57
    assert count_params(build_config("mt5-small")) == 300_176_768  # google/mt5-small, lm_head untied
    # EleutherAI/gpt-neo-125m, 1.3b, bigscience/bloom-560m, bloom-1b7 (their model cards' counts); EleutherAI/gpt-j-6b:
    # transformers' GPTJForCausalLM (its model card's 6,053,381,344 counts otherwise)
    assert count_params(build_config("gpt-neo-125m")) == 125_198_592
    assert count_params(build_config("gpt-neo-1.3b")) == 1_315_575_808
    assert count_params(build_config("bloom-560m")) == 559_214_592
    assert count_params(build_config("bloom-1b7")) == 1_722_408_960
    assert count_params(build_config("gpt-j-6b")) == 6_050_882_784


@pytest.mark.parametrize("name", ["mt5-small", "mt5-base", "umt5-small", "umt5-base", "byt5-small", "byt5-base"])
def test_param_counts_equal_transformers(name):
    """Our count is that of transformers' model of the preset's config (built on the meta device, its LM head
    untied as in the released checkpoints)."""
    import torch
    config = build_config(name)
    with torch.device("meta"):
        hf = transformers.AutoModelForSeq2SeqLM.from_config(config)
    head = hf.get_output_embeddings()
    if head.weight is hf.get_input_embeddings().weight:  # transformers 5 ties every mT5 / UMT5 / T5 config
        head.weight = torch.nn.Parameter(torch.empty_like(head.weight, device="meta"))
    assert count_params(config) == sum(p.numel() for p in hf.parameters())


CAUSAL_PRESETS = [name for name, fields in PRESETS.items() if fields["model_type"] in models.CAUSAL_LM_TYPES]


@pytest.mark.parametrize("name", CAUSAL_PRESETS)
def test_causal_param_counts_equal_transformers(name):
    """Every decoder preset: our count is that of transformers' causal LM of its config (built on the meta
    device; a tied head shares the embeddings' parameters, counted once)."""
    import torch
    config = build_config(name)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    assert count_params(config) == sum(p.numel() for p in hf.parameters())


def test_t5_special_ids_from_tokenizer(tmp_path):
    """T5 takes pad and eos from the tokenizer, starts the decoder at pad and has no bos."""
    tok = save_tokenizer(tmp_path / "bpe")  # train_tokenizer.py's bpe layout: <s> 0, <pad> 1, </s> 2
    config = build_config("t5-v1_1-base", transformers.AutoTokenizer.from_pretrained(tmp_path / "bpe"))
    assert config.vocab_size == len(tok) == 45
    assert (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (1, 2, 1)
    assert getattr(config, "bos_token_id", None) is None
    assert not ties_embeddings(config) and config.d_model == 768

    from tokenizers import Tokenizer, models as tok_models
    vocab = {t: i for i, t in enumerate(["<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(20)])}
    t5_like = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(tok_models.WordLevel(vocab, "<unk>")),
                                                   pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    config = build_config("t5-tiny", t5_like)
    assert (config.vocab_size, config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (23, 0, 1, 0)
    assert getattr(config, "bos_token_id", None) is None and ties_embeddings(config)
    config.save_pretrained(tmp_path / "t5")
    saved = json.loads((tmp_path / "t5" / "config.json").read_text())
    assert "bos_token_id" not in saved and saved["decoder_start_token_id"] == 0


def test_t5_overrides_and_shapes():
    # the attention width is num_heads * d_kv, which need not divide or equal d_model
    config = build_config("t5-tiny", overrides={"d_model": 70, "num_heads": 3})
    assert (config.hidden_size, config.num_attention_heads, config.d_kv) == (70, 3, 16)
    assert count_params(config) > 0
    config = build_config("t5-v1_1-tiny", overrides=["num_decoder_layers=3", "dropout_rate=0"])
    assert (config.num_layers, config.num_decoder_layers, config.dropout_rate) == (2, 3, 0.0)
    for bad in (["d_ff=0"], ["num_decoder_layers=0"], ["d_kv=0"]):
        with pytest.raises(UserError, match="positive"):
            build_config("t5-tiny", overrides=bad)
    with pytest.raises(UserError, match="feed_forward_proj|bad config value"):
        build_config("t5-tiny", overrides=["feed_forward_proj=gated-gelu-x"])


def test_vocab_and_special_ids_from_tokenizer(tmp_path):
    tok = save_tokenizer(tmp_path)
    config = build_config("roberta-tiny", transformers.AutoTokenizer.from_pretrained(tmp_path))
    assert config.vocab_size == len(tok) == 45
    assert (config.bos_token_id, config.pad_token_id, config.eos_token_id) == (0, 1, 2)

    bert_dir = tmp_path / "bert"
    save_tokenizer(bert_dir, specials=("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"))
    bert_tok = transformers.AutoTokenizer.from_pretrained(bert_dir)
    bert_tok.bos_token = bert_tok.eos_token = None  # as in a BERT tokenizer: only pad matters
    config = build_config("bert-tiny", bert_tok)
    assert config.vocab_size == 45 and config.pad_token_id == 1 and config.bos_token_id is None
    # a RoBERTa preset (bos 0, eos 2) on it: the ids of its [CLS] and [SEP] where the tokenizer names them, not
    # those of [CLS] and [SEP]'s neighbours
    assert build_config("roberta-tiny", bert_tok).eos_token_id is None
    bert_tok.cls_token, bert_tok.sep_token = "[CLS]", "[SEP]"
    bert_tok.pad_token = "[PAD]"
    config = build_config("roberta-tiny", bert_tok)
    assert (config.bos_token_id, config.pad_token_id, config.eos_token_id) == (0, 1, 2)
    bert_tok.cls_token, bert_tok.sep_token = "[SEP]", "[CLS]"  # ids 2 and 0: not the preset's
    config = build_config("roberta-tiny", bert_tok)
    assert (config.bos_token_id, config.eos_token_id) == (2, 0)


def test_overrides_are_typed():
    assert parse_overrides(["num_hidden_layers=4", "hidden_dropout_prob=0.0", "layer_norm_eps=1e-6",
                            "hidden_act=relu", "use_cache=false", "classifier_dropout="]) == {
        "num_hidden_layers": 4, "hidden_dropout_prob": 0.0, "layer_norm_eps": 1e-6, "hidden_act": "relu",
        "use_cache": False, "classifier_dropout": None}
    config = build_config("roberta-tiny", overrides=["num_hidden_layers=3", "layer_norm_eps=1e-6",
                                                      "hidden_dropout_prob=0", "use_cache=false"])
    assert config.num_hidden_layers == 3 and config.layer_norm_eps == 1e-6 and config.use_cache is False
    assert isinstance(config.hidden_dropout_prob, float)
    config = build_config("bert-tiny", overrides={"hidden_size": 128, "num_attention_heads": 4})
    assert (config.hidden_size, config.num_attention_heads) == (128, 4)


def test_override_beats_tokenizer_and_too_small_vocab_fails(tmp_path):
    tok = save_tokenizer(tmp_path)
    assert build_config("roberta-tiny", tok, {"vocab_size": 64}).vocab_size == 64
    with pytest.raises(UserError, match="tokenizer has 45 tokens but vocab_size is 40"):
        build_config("roberta-tiny", tok, {"vocab_size": 40})


@pytest.mark.parametrize("overrides, pattern", [
    (["num_hiden_layers=4"], "unknown config key 'num_hiden_layers'.*did you mean num_hidden_layers"),
    (["num_hidden_layers=abc"], "num_hidden_layers.*takes a number"),
    (["hidden_size=64.5"], "hidden_size.*integer"),
    (["use_cache=3"], "use_cache.*true or false"),
    (["hidden_size=65"], "divisible"),
    (["num_hidden_layers=0"], "positive"),
    (["model_type=bert"], "preset"),
    (["novalue"], "key=value"),
])
def test_bad_overrides(overrides, pattern):
    with pytest.raises(UserError, match=pattern):
        build_config("roberta-tiny", overrides=overrides)


def test_unknown_preset_lists_presets():
    with pytest.raises(UserError, match="unknown preset 'roberta-huge'; did you mean roberta-.*roberta presets: "
                                        "roberta-base, .*roberta-tiny; create_config.py --list_presets lists all"):
        build_config("roberta-huge")
    with pytest.raises(UserError, match="unknown preset 'zzz'; presets exist for roberta, bert, t5, .*electra"):
        build_config("zzz")


def test_script_writes_config(tmp_path):
    save_tokenizer(tmp_path)
    result = run_script("--output_dir", tmp_path, "--preset", "roberta-tiny", "--set", "num_hidden_layers=3")
    assert result.returncode == 0, result.stderr
    assert "roberta-tiny" in result.stdout and "vocab_size 45" in result.stdout
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, transformers.RobertaConfig)
    assert config.vocab_size == 45 and config.num_hidden_layers == 3 and config.hidden_size == 64
    assert (tmp_path / "tokenizer.json").exists()  # other files untouched


def test_script_refuses_existing_config(tmp_path):
    save_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text('{"old": true}')
    result = run_script("--output_dir", tmp_path, "--preset", "roberta-tiny")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "overwrite_output_dir" in result.stderr
    assert json.loads((tmp_path / "config.json").read_text()) == {"old": True}
    result = run_script("--output_dir", tmp_path, "--preset", "roberta-tiny", "--overwrite_output_dir")
    assert result.returncode == 0, result.stderr
    assert transformers.AutoConfig.from_pretrained(tmp_path).vocab_size == 45


def test_script_without_tokenizer(tmp_path):
    result = run_script("--output_dir", tmp_path / "model", "--preset", "bert-tiny")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "train_tokenizer.py" in result.stderr
    assert not (tmp_path / "model" / "config.json").exists()
    result = run_script("--output_dir", tmp_path / "model", "--preset", "bert-tiny", "--set", "vocab_size=512")
    assert result.returncode == 0, result.stderr
    assert transformers.AutoConfig.from_pretrained(tmp_path / "model").vocab_size == 512


def test_list_presets():
    """Every preset on a line with its size: each preset's model builds (a size, never '?')."""
    result = run_script("--list_presets")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]  # name, model_type, size, "params", ...
    assert [row[0] for row in rows] == list(PRESETS)
    assert all(row[2] != "?" and row[3] == "params" for row in rows), result.stdout
    assert "125M" in result.stdout


def test_each_presets_special_ids_are_in_its_vocabulary():
    for name in PRESETS:
        config = build_config(name)
        for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(config, key, None)
            assert value is None or 0 <= value < config.vocab_size, (name, key, value)
