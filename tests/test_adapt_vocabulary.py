"""adapt_vocabulary.py: each method's rows (mean, overlap, special roles, FOCUS's sparse weights), models that
transformers loads with our logits, --extend_vocabulary, and bad input ending in one line, nothing written."""
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from huggingface_hub import ModelCard

import adapt_vocabulary
from flaxlm.adaptation.focus import sparsemax
from flaxlm.adaptation.pieces import BYTE_LEVEL, METASPACE, WORDPIECE, Pieces, convention, token_key
from flaxlm.models.vocabulary_tensors import flat, vocabulary_axes
from flaxlm.adaptation.vocabulary import build_rules, special_rules
from flaxlm.models import abstract_model, apply_model, create_model, load_pretrained, save_pretrained, split_model
from flaxlm.models.hf_io import load_config
from flaxlm.models.presets import PRESETS, build_config
from flaxlm.tokenization.loading import load_tokenizer

# (preset, source tokenizer type and size, new tokenizer type and size); each method runs on the first three
KINDS = {"encoder": ("roberta-tiny", ("bpe", 300), ("wordpiece", 260)),
         "t5": ("t5-v1_1-tiny", ("unigram", 300), ("unigram", 500)),
         "decoder": ("llama-tiny", ("bpe", 300), ("bpe", 400)),
         "bert": ("bert-tiny", ("wordpiece", 260), ("bpe", 300)),
         "deberta-v2": ("deberta-v3-tiny", ("bpe", 300), ("wordpiece", 260)),
         "modernbert": ("modernbert-tiny", ("bpe", 300), ("bpe", 400)),
         "mt5": ("mt5-tiny", ("unigram", 300), ("unigram", 500)),
         "gpt2": ("gpt2-tiny", ("bpe", 300), ("unigram", 300)),
         "gemma": ("gemma-tiny", ("unigram", 300), ("bpe", 300)),
         "bloom": ("bloom-tiny", ("bpe", 300), ("bpe", 400)),
         "electra": ("electra-tiny-generator", ("wordpiece", 260), ("wordpiece", 300)),
         "t5-tied": ("t5-tiny", ("unigram", 300), ("unigram", 500)),
         "qwen3": ("qwen3-tiny", ("bpe", 300), ("bpe", 400))}
AUTO = {"encoder": "AutoModelForMaskedLM", "t5": "AutoModelForSeq2SeqLM", "decoder": "AutoModelForCausalLM"}


def kind_of(name):
    """encoder, t5 or decoder: how the model is called."""
    if name in ("encoder", "t5", "decoder"):
        return name
    return {"bert": "encoder", "deberta-v2": "encoder", "modernbert": "encoder", "electra": "encoder", "mt5": "t5",
            "t5-tied": "t5"}.get(name, "decoder")


@pytest.fixture(scope="module")
def source_for(model_dir_for, tmp_path_factory):
    """source_for(kind): (a saved random model of the kind beside its tokenizer, the new tokenizer's dir)."""
    made = {}

    def source(kind):
        if kind not in made:
            preset, (old_type, old_size), (new_type, new_size) = KINDS[kind]
            d = str(tmp_path_factory.mktemp(f"source-{kind}"))
            shutil.copytree(model_dir_for(preset, old_type, old_size), d, dirs_exist_ok=True)
            config = load_config(d)
            save_pretrained(d, config, split_model(create_model(config, seed=1))[1])
            made[kind] = d, model_dir_for(None, new_type, new_size)
        return made[kind]

    return source


def adapt(src, new, out, *extra):
    adapt_vocabulary.main(["--model_name_or_path", src, "--tokenizer_name", new, "--output_dir", str(out), *extra])


def embeddings(path):
    config, model = load_pretrained(path)
    params = split_model(model)[1]
    path_, _ = min(vocabulary_axes(config).items(), key=lambda kv: (kv[1] != 0, len(kv[0]), kv[0]))  # [V, D] first
    table = params
    for k in path_:
        table = table[k]
    return np.asarray(table)


def test_sparsemax_is_sparse_and_sums_to_one():
    w = sparsemax(np.array([3.0, 2.9, 0.1, -1.0, 0.0, 2.0]))
    assert (w >= 0).all() and np.isclose(w.sum(), 1.0) and (w == 0).sum() >= 3
    np.testing.assert_allclose(sparsemax([1.0, 1.0]), [0.5, 0.5])
    # by hand: support {3.0, 2.9}, threshold (3.0 + 2.9 - 1) / 2 = 2.45
    np.testing.assert_allclose(w, [0.55, 0.45, 0, 0, 0, 0], atol=1e-12)
    z_BN = np.random.default_rng(0).normal(size=(5, 7)) * 3
    np.testing.assert_allclose(sparsemax(z_BN), np.stack([sparsemax(z) for z in z_BN]), atol=1e-12)


def test_token_keys_agree_across_conventions():
    """A word start is ('hello', True) whether written 'Ġhello', '▁hello' or 'hello' (WordPiece); bytes that are
    not a whole character keep their bytes."""
    assert token_key("Ġhello", BYTE_LEVEL) == token_key("▁hello", METASPACE) == token_key("hello", WORDPIECE) \
        == ("hello", True)
    assert token_key("lo", BYTE_LEVEL) == token_key("lo", METASPACE) == token_key("##lo", WORDPIECE) == ("lo", False)
    assert token_key("▁New▁York", METASPACE) == ("New York", True)
    e_acute = "é".encode()  # 2 bytes: 'Ã' '©' in byte-level BPE's alphabet, <0xC3> <0xA9> in SentencePiece's
    assert token_key("Ã©", BYTE_LEVEL) == ("é", False)
    first = token_key("<0xC3>", METASPACE)[0]
    assert first.encode("utf-8", "surrogateescape") == e_acute[:1]


def test_mean_overlap_and_special_rows(source_for, corpus, tmp_path):
    src, new = source_for("encoder")
    old_tok, new_tok = load_tokenizer(src), load_tokenizer(new)
    old_E = embeddings(src)
    adapt(src, new, tmp_path / "mean", "--method", "mean")
    adapt(src, new, tmp_path / "overlap", "--method", "overlap")
    mean_E, overlap_E = embeddings(tmp_path / "mean"), embeddings(tmp_path / "overlap")
    old_vocab = {token_key(t, convention(old_tok)): i for t, i in old_tok.get_vocab().items()}
    pieces, shared, meaned = Pieces(old_tok), 0, 0
    specials = special_rules(new_tok, old_tok)
    for token, i in new_tok.get_vocab().items():
        key = token_key(token, convention(new_tok))
        if i in specials:
            continue
        if key in old_vocab:  # a shared token: copied by both
            shared += 1
            np.testing.assert_array_equal(overlap_E[i], old_E[old_vocab[key]])
            np.testing.assert_array_equal(mean_E[i], old_E[old_vocab[key]])
        elif pieces(key):  # hand-computed mean of the old pieces
            meaned += 1
            np.testing.assert_allclose(mean_E[i], old_E[pieces(key)].mean(0), atol=1e-6)
    assert shared > 20 and meaned > 20
    roles = {"[CLS]": "<s>", "[SEP]": "</s>", "[PAD]": "<pad>", "[MASK]": "<mask>", "[UNK]": "<unk>"}
    for new_token, old_token in roles.items():  # WordPiece's roles land on RoBERTa's rows of the same role
        np.testing.assert_array_equal(mean_E[new_tok.convert_tokens_to_ids(new_token)],
                                      old_E[old_tok.convert_tokens_to_ids(old_token)])
    config = load_config(str(tmp_path / "mean"))
    assert config.vocab_size == len(new_tok) and config.pad_token_id == new_tok.pad_token_id


def test_t5_sentinels_and_focus_weights(source_for, corpus):
    src, new = source_for("t5")
    old_tok, new_tok = load_tokenizer(src), load_tokenizer(new)
    rules, kinds = build_rules("focus", new_tok, old_tok, corpus["train"])
    for n in (0, 7, 99):
        new_id = new_tok.convert_tokens_to_ids(f"<extra_id_{n}>")
        assert rules[new_id] == ([old_tok.convert_tokens_to_ids(f"<extra_id_{n}>")], [1.0])
    focus = [rules[i] for i, k in kinds.items() if k == "focus"]
    shared = sum(k == "copied" for k in kinds.values())
    assert focus and shared > 100
    for ids, weights in focus:
        w = np.asarray(weights)
        assert (w > 0).all() and np.isclose(w.sum(), 1.0) and len(ids) < shared / 4  # sparse


def our_logits(path, kind, ids_BL):
    config, model = load_pretrained(path)
    graphdef, params = split_model(model)
    mask = jnp.ones_like(ids_BL)
    if kind == "encoder":
        return config, apply_model(graphdef, params, ids_BL, mask)
    if kind == "t5":
        return config, apply_model(graphdef, params, ids_BL, mask, ids_BL[:, :5], jnp.ones_like(ids_BL[:, :5]))
    return config, apply_model(graphdef, params, ids_BL, mask, jnp.arange(ids_BL.shape[1])[None].repeat(2, 0))


def hf_logits(path, kind, ids_BL):
    import torch
    import transformers
    model, info = getattr(transformers, AUTO[kind]).from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = torch.tensor(np.asarray(ids_BL))
    with torch.no_grad():
        if kind == "t5":
            return model.eval()(input_ids=ids, decoder_input_ids=ids[:, :5]).logits.numpy()
        return model.eval()(input_ids=ids).logits.numpy()


@pytest.mark.parametrize("kind", list(KINDS)[:3])
@pytest.mark.parametrize("method", ["random", "overlap", "mean", "focus"])
def test_each_method_on_each_kind_loads_in_transformers(source_for, corpus, tmp_path, kind, method):
    src, new = source_for(kind)
    out = tmp_path / "out"
    adapt(src, new, out, "--method", method, "--focus_train_file", corpus["train"])
    check_against_transformers(str(out), kind_of(kind))
    card = ModelCard.load(out / "README.md")  # its source (a local folder: no hub base_model) named in the text
    assert card.data.base_model is None and f"the local model `{src}`" in card.text
    assert card.data.library_name == "transformers"


@pytest.mark.parametrize("family", list(KINDS)[3:])
def test_mean_on_more_families_loads_in_transformers(source_for, tmp_path, capsys, family):
    src, new = source_for(family)
    adapt(src, new, tmp_path / "out", "--method", "mean")
    assert "mean " in capsys.readouterr().out  # the coverage line
    check_against_transformers(str(tmp_path / "out"), kind_of(family))


def check_against_transformers(out, kind):
    ids_BL = jnp.asarray(np.random.default_rng(0).integers(3, len(load_tokenizer(out)), (2, 9)))
    config, ours = our_logits(out, kind, ids_BL)
    assert config.vocab_size == len(load_tokenizer(out))
    np.testing.assert_allclose(np.asarray(ours), hf_logits(out, kind, ids_BL), atol=1e-4)


def test_every_family_has_vocabulary_tensors():
    """Every family's tiny preset: the input embeddings [V, D] found, each tensor V long on its axis."""
    for name in [n for n in PRESETS if n.endswith("tiny")]:
        config = build_config(name)
        axes = vocabulary_axes(config)
        shapes = {p: s.shape for p, s in flat(abstract_model(config)[1]).items()}
        assert all(shapes[p][a] == config.vocab_size for p, a in axes.items()), name
        assert any(len(shapes[p]) == 2 and a == 0 for p, a in axes.items()), name


@pytest.mark.parametrize("kind", ["decoder", "t5"])  # a byte-level BPE source; a SentencePiece (metaspace) one
def test_extend_vocabulary_keeps_old_rows(source_for, corpus, tmp_path, kind):
    src, new = source_for(kind)
    adapt(src, new, tmp_path / "out", "--extend_vocabulary", "20", "--focus_train_file", corpus["train"])
    old_tok, merged = load_tokenizer(src), load_tokenizer(str(tmp_path / "out"))
    old_E, new_E = embeddings(src), embeddings(tmp_path / "out")
    assert len(merged) == len(old_tok) + 20 and new_E.shape[0] == len(merged)
    np.testing.assert_array_equal(new_E[:len(old_tok)], old_E)
    pieces = Pieces(old_tok)
    for i in range(len(old_tok), len(merged)):
        word = merged.convert_ids_to_tokens(i)
        np.testing.assert_allclose(new_E[i], old_E[pieces((word.strip(), True))].mean(0), atol=1e-6)
        assert i in merged("a " + word.strip() + " b", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("case", ["no_mask", "too_many", "output_exists", "tokenizer_too_big", "focus_no_text",
                                  "extend_with_focus"])
def test_bad_input_is_one_line_and_writes_nothing(source_for, model_dir_for, tmp_path, capsys, case):
    src, new = source_for("encoder")
    out, extra = tmp_path / "out", ["--method", "mean"]
    if case == "no_mask":  # an MLM model and a tokenizer without a mask token
        new = model_dir_for(None, "unigram", 250)
    elif case == "too_many":
        extra = ["--extend_vocabulary", "100000"]
    elif case == "output_exists":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "tokenizer_too_big":  # a source whose embeddings have fewer rows than its tokenizer
        src2 = tmp_path / "src"
        shutil.copytree(src, src2)
        shutil.rmtree(src2 / "tokenizer.json", ignore_errors=True)
        for f in os.listdir(src2):
            if f.startswith(("tokenizer", "vocab", "merges", "special")):
                os.remove(src2 / f)
        shutil.copytree(model_dir_for(None, "bpe", 400), src2, dirs_exist_ok=True)
        src = str(src2)
    elif case == "focus_no_text":
        extra = ["--method", "focus"]
    else:
        extra = ["--method", "focus", "--extend_vocabulary", "5"]
    with pytest.raises(SystemExit) as e:
        adapt_vocabulary.run_main(lambda: adapt(src, new, out, *extra))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert os.listdir(out) == (["notes.txt"] if case == "output_exists" else []) if out.exists() else True
