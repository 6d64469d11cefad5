"""--pad_vocab_multiple (flaxlm.models.vocab_padding): a causal LM whose vocabulary tables hold more rows in memory is
the unpadded model. For GPT-2 (tied head) and Llama (untied head), loaded padded from one checkpoint: zero rows past
the checkpoint's, logits, loss and gradients of the unpadded model (padding rows: exactly zero gradient, and zero
after an AdamW step), the same greedy tokens, an export byte for byte the unpadded model's that transformers loads
with our logits; a fresh model draws the unpadded model's rows. LoRA's trainable token rows, a vocabulary grown by an
adapter or by the chat template's markers, --train_only embeddings, run_clm_flax.py's checkpoints (resumed exactly,
exported unpadded) and --compile_for keep working.

Tolerances: the padded and unpadded logits are the same float32 dot products, but a matmul of another width may
accumulate them in another order: RTOL = 1e-6 of the largest logit (about 8 ulps; seen: 4.8e-7 at |logit| 2.8, 2
ulps; the loss sums came out equal). A gradient entry sums such products over the batch's 64 rows: GRAD_RTOL = 4e-6
of the largest gradient (seen: 5e-7)."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from transformers import AutoModelForCausalLM, BertConfig, GPT2Config, LlamaConfig

from flaxlm.errors import UserError
from flaxlm.models import Execution, create_model, load_pretrained, merge_model, save_pretrained, split_model
from flaxlm.models.generation import generate
from flaxlm.models.vocab_padding import padded_rows
from flaxlm.objectives.clm import clm_objective
from parity import randomize
from tpu_compile import needs_libtpu

V, MULTIPLE = 300, 128  # 300 tokens held in 384 rows
ROWS = padded_rows(V, MULTIPLE)
RTOL, GRAD_RTOL = 1e-6, 4e-6
CONFIGS = {
    "gpt2": lambda: GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=64, vocab_size=V, bos_token_id=V - 1,
                               eos_token_id=V - 1),
    "llama": lambda: LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=64, vocab_size=V,
                                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
}
TABLES = {"gpt2": [(("embed", "embedding"), 0)],  # (path, vocabulary axis)
          "llama": [(("embed", "embedding"), 0), (("lm_head", "kernel"), 1)]}


def execution(padded):
    return Execution(vocab_multiple=MULTIPLE if padded else 1)


def at(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def true_rows(x, axis):
    return np.take(np.asarray(x), np.arange(V), axis=axis)


def padding_rows(x, axis):
    return np.take(np.asarray(x), np.arange(V, x.shape[axis]), axis=axis)


def assert_padded_copy(family, padded, plain):
    """padded: plain's params with the vocabulary tables zero-padded to ROWS; every other tensor equal."""
    for path, axis in TABLES[family]:
        x = at(padded, path)
        assert x.shape[axis] == ROWS and at(plain, path).shape[axis] == V
        np.testing.assert_array_equal(true_rows(x, axis), np.asarray(at(plain, path)))
        assert not padding_rows(x, axis).any()
    others = lambda p: {k: v for k, v in p.items() if k not in ("embed", "lm_head")}  # noqa: E731
    jax.tree.map(np.testing.assert_array_equal, others(padded), others(plain))


@pytest.fixture(scope="module", params=list(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """(family, directory): a tiny model of the family with noise on every tensor, saved as Hugging Face does."""
    config = CONFIGS[request.param]()
    d = tmp_path_factory.mktemp(f"{request.param}-vocab")
    save_pretrained(str(d), config, randomize(split_model(create_model(config))[1]))
    return request.param, str(d)


def both(path):
    """{False: (config, model) loaded unpadded, True: loaded with --pad_vocab_multiple's padding}."""
    return {padded: load_pretrained(path, execution=execution(padded)) for padded in (False, True)}


def ids(n=4, length=17, seed=0):
    return np.random.default_rng(seed).integers(0, V, (n, length)).astype(np.int32)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_fresh_padded_model_draws_the_unpadded_rows_then_zeros(family):
    """... and its FLOPs (MFU's) are the model's: the padding is not counted."""
    from flaxlm.training.flops import decoder_lm_train_flops
    config = CONFIGS[family]()
    padded, plain = (split_model(create_model(config, seed=3, execution=execution(p)))[1] for p in (True, False))
    assert_padded_copy(family, padded, plain)
    assert decoder_lm_train_flops(config, padded, 2, 16) == decoder_lm_train_flops(config, plain, 2, 16)


def test_loaded_padded_gives_the_unpadded_logits_loss_and_gradients(checkpoint):
    family, path = checkpoint
    models = both(path)
    config = models[False][0]
    params = {p: split_model(m)[1] for p, (_, m) in models.items()}
    assert_padded_copy(family, params[True], params[False])
    rows = ids()
    logits = {p: np.asarray(m(jnp.asarray(rows))) for p, (_, m) in models.items()}
    assert logits[True].shape == logits[False].shape == (4, 17, V)
    np.testing.assert_allclose(logits[True], logits[False], rtol=RTOL, atol=RTOL * np.abs(logits[False]).max())

    for chunk_rows in (0, 24):  # the fused head + loss in one piece, and in chunks of 24 rows (a lax.scan)
        sums = {}
        for p, (_, m) in models.items():
            graphdef, _ = split_model(m)
            objective = clm_objective(graphdef, config, params[p], rows.shape[1], pad_id=0, head_chunk_rows=chunk_rows)
            loss = lambda q: objective.loss_sums(q, objective.collate(rows), None)["loss_sum"]  # noqa: E731
            sums[p] = jax.value_and_grad(loss)(params[p])
        assert float(sums[True][0]) == pytest.approx(float(sums[False][0]), rel=RTOL)
        grads = {p: g for p, (_, g) in sums.items()}
        for path_, axis in TABLES[family]:
            g, ref = at(grads[True], path_), np.asarray(at(grads[False], path_))
            np.testing.assert_allclose(true_rows(g, axis), ref, rtol=0, atol=GRAD_RTOL * np.abs(ref).max())
            assert not padding_rows(g, axis).any()  # exactly zero: the masked columns weigh exactly 0
        scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(grads[False]))
        rest = lambda p: {k: v for k, v in p.items() if k not in ("embed", "lm_head")}  # noqa: E731
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=GRAD_RTOL * scale),
                     rest(grads[True]), rest(grads[False]))

    tx = optax.adamw(1e-2, weight_decay=0.1)  # the padding stays zero under Adam and weight decay
    updates, _ = tx.update(grads[True], tx.init(params[True]), params[True])
    stepped = optax.apply_updates(params[True], updates)
    for path_, axis in TABLES[family]:
        assert not padding_rows(at(stepped, path_), axis).any() and true_rows(at(stepped, path_), axis).any()


def test_greedy_generation_is_the_unpadded_models(checkpoint):
    prompts = [list(ids(1, 5, seed=1)[0]), list(ids(1, 9, seed=2)[0])]
    out = {p: generate(m, prompts, max_new_tokens=12).tokens for p, (_, m) in both(checkpoint[1]).items()}
    assert out[True] == out[False] and len(out[True][0]) == 12


def test_the_export_is_the_unpadded_models_byte_for_byte_and_transformers_loads_it(checkpoint, tmp_path):
    family, path = checkpoint
    for p, (config, model) in both(path).items():
        save_pretrained(str(tmp_path / str(p)), config, split_model(model)[1])
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "True" / name).read_bytes() == (tmp_path / "False" / name).read_bytes()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "True").eval()
    assert hf.config.vocab_size == V and hf.get_input_embeddings().weight.shape == (V, 32)
    rows = ids()
    with torch.no_grad():
        theirs = hf(torch.tensor(rows, dtype=torch.long)).logits.numpy()
    ours = np.asarray(both(path)[True][1](jnp.asarray(rows)))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)  # the parity tests' float32 tolerance (tests/parity.py)


def with_adapter(path, padded, grow):
    """(config, model, lora, modules): the checkpoint with random LoRA adapters and trainable rows of tokens 3 and
    V + grow - 1 (the vocabulary grown by `grow` rows first, as an adapter's tokens past the base grow it)."""
    from flax import nnx
    from flaxlm.models.lora import LoraConfig, add_lora, grow_vocabulary
    config, model = load_pretrained(path, execution=execution(padded))
    grow_vocabulary(model, config, V + grow)
    lora = LoraConfig(rank=2, alpha=4.0, trainable_tokens=(3, V + grow - 1))
    modules = add_lora(model, config, lora, seed=1)
    key = jax.random.PRNGKey(7)
    for i, (_, node) in enumerate((p, n) for p, n in nnx.iter_graph(model) if getattr(n, "lora_b", None) is not None):
        node.lora_b[...] = 0.05 * jax.random.normal(jax.random.fold_in(key, i), node.lora_b.shape)
    for i, (_, node) in enumerate((p, n) for p, n in nnx.iter_graph(model)
                                  if getattr(n, "token_delta", None) is not None):
        node.token_delta[...] = 0.3 * jax.random.normal(jax.random.fold_in(key, 100 + i), node.token_delta.shape)
    return config, model, lora, modules


def test_lora_trainable_tokens_a_grown_vocabulary_and_the_merge(checkpoint, tmp_path):
    """An adapter's tokens past the vocabulary grow it into the padding rows (384 stay 384); the logits, the PEFT
    adapter, the merged export and --merge_lora's (from the base's own checkpoint) are the unpadded run's."""
    from flaxlm.models.lora import add_token_rows, merged, save_adapter, save_merged
    family, path = checkpoint
    logits = {}
    for padded in (False, True):
        config, model, lora, modules = with_adapter(path, padded, grow=5)
        params = split_model(model)[1]
        assert params["embed"]["embedding"].shape[0] == (ROWS if padded else V + 5) and config.vocab_size == V + 5
        logits[padded] = np.asarray(model(jnp.asarray(ids() + 5)))
        out = tmp_path / str(padded)
        save_adapter(str(out / "adapter"), config, params, lora, modules, base=path)
        save_pretrained(str(out / "merged"), config, merged(params, modules, lora, config))
        save_merged(str(out / "from_base"), config, params, lora, modules, base=path)
        with pytest.raises(UserError, match=f"token id {V + 5} is outside the model's vocabulary of {V + 5} rows"):
            add_token_rows(model, config, (V + 5,))
    assert logits[True].shape == (4, 17, V + 5)
    np.testing.assert_allclose(logits[True], logits[False], rtol=RTOL, atol=RTOL * np.abs(logits[False]).max())
    for where in ("adapter/adapter_model.safetensors", "adapter/adapter_config.json", "merged/model.safetensors",
                  "merged/config.json", "from_base/model.safetensors"):
        assert (tmp_path / "True" / where).read_bytes() == (tmp_path / "False" / where).read_bytes(), where


def test_chat_markers_grow_a_padded_vocabulary(model_dir_for):
    """run_sft.py's markers added to a padded GPT-2: the new rows are the unpadded run's, then zeros; the head keeps
    the grown vocabulary."""
    from transformers import AutoTokenizer
    from flaxlm.adaptation.added_tokens import add_special_tokens
    tokenizer = AutoTokenizer.from_pretrained(model_dir_for(None))
    config = CONFIGS["gpt2"]()
    assert len(tokenizer) == V
    grown = {}
    for padded in (False, True):
        model = create_model(config, execution=execution(padded))
        graphdef, params = split_model(model)
        tok, grown_config, params = add_special_tokens(tokenizer, config, params, ["<|im_start|>", "<|im_end|>"],
                                                       multiple=model.execution.vocab_multiple)
        model = merge_model(graphdef, params)
        model.set_vocab_size(grown_config.vocab_size)
        assert len(tok) == grown_config.vocab_size == V + 2
        grown[padded] = params, np.asarray(model(jnp.asarray(ids() + 2)))
    table, plain = grown[True][0]["embed"]["embedding"], grown[False][0]["embed"]["embedding"]
    assert table.shape == (ROWS, 32) and plain.shape == (V + 2, 32)
    np.testing.assert_array_equal(table[:V + 2], plain)
    assert not np.asarray(table[V + 2:]).any()
    assert grown[True][1].shape == (4, 17, V + 2)
    np.testing.assert_allclose(grown[True][1], grown[False][1], rtol=RTOL, atol=RTOL * np.abs(grown[False][1]).max())


def test_train_only_embeddings_finds_the_padded_tables():
    from types import SimpleNamespace
    from flaxlm.training.freeze import trainable_mask
    from flaxlm.training.pipeline import vocab_rows
    params = split_model(create_model(CONFIGS["llama"](), execution=execution(True)))[1]
    mask = trainable_mask(params, ["embeddings"], vocab_rows(V, SimpleNamespace(pad_vocab_multiple=MULTIPLE)))
    assert mask["embed"]["embedding"] and mask["lm_head"]["kernel"] and not mask["final_norm"]["scale"]


def test_an_encoder_is_one_line():
    from types import SimpleNamespace
    from flaxlm.training.pipeline import check_vocab_padding
    with pytest.raises(UserError, match=r"^--pad_vocab_multiple 128 pads a causal LM's vocabulary .*not a bert "
                                        r"model's; drop it$"):
        check_vocab_padding(SimpleNamespace(pad_vocab_multiple=128), BertConfig())


def test_run_clm_resumes_its_padded_checkpoints_and_exports_unpadded(model_dir_for, corpus, tmp_path, monkeypatch):
    """run_clm_flax.py --pad_vocab_multiple 128: checkpoints (padded tables) resume to the uninterrupted run's losses;
    the export holds vocab_size rows; resumed without the flag, one line, and the checkpoints stay."""
    import run_clm_flax
    from run_helpers import assert_resume_matches, run_args
    from parity import saved_keys
    model_dir = model_dir_for("gpt2-tiny")

    def args_for(out, *extra):
        return run_args(model_dir, corpus, out, "--block_size", "32", "--max_steps", "4", "--save_steps", "2",
                        "--do_eval", "false", "--learning_rate", "3e-3", *extra)
    from flaxlm.reporting import model_card
    cards, write = [], model_card.write_model_card
    monkeypatch.setattr(model_card, "write_model_card", lambda *a, **k: (cards.append(k), write(*a, **k)))
    assert_resume_matches(run_clm_flax.main, lambda out, *extra: args_for(out, "--pad_vocab_multiple", "128", *extra),
                          monkeypatch, tmp_path, steps=4, crash_step=2)
    shapes = saved_keys(str(tmp_path / "straight"))
    config = AutoModelForCausalLM.from_pretrained(tmp_path / "straight").config
    assert shapes["transformer.wte.weight"][0] == config.vocab_size and config.vocab_size % 128
    assert cards[0]["n_params"] == sum(int(np.prod(shape)) for shape in shapes.values())  # the export's count
    with pytest.raises(UserError, match=r"holds params\['embed'\]\['embedding'\] of shape \(384, 64\), this run's "
                                        r"model has \(300, 64\); resume with the model flags the run was started"):
        run_clm_flax.main(args_for(tmp_path / "resumed", "--resume_from_checkpoint", "latest"))  # no padding
    assert sorted(os.listdir(tmp_path / "resumed" / "checkpoints")) == ["2", "4"]  # nothing set aside


@needs_libtpu
def test_compiles_for_a_tpu_slice(model_dir_for, corpus, capsys):
    import run_clm_flax
    model_dir = model_dir_for("gpt2-tiny", vocab_size=304)
    r = run_clm_flax.main(["--config_name", model_dir, "--tokenizer_name", model_dir, "--train_file", corpus["train"],
                           "--block_size", "32", "--dtype", "bfloat16", "--pad_vocab_multiple", "128",
                           "--compile_for", "v5e-8", "--sharding", "fsdp", "--do_eval", "false"])
    assert r["compiled_flops"] > 0 and "fits v5e-8" in capsys.readouterr().out
