"""DeBERTa-v2/v3: what the parity checks of every family (tests/test_parity.py) do not cover: the log buckets, the
last layer at the masked positions only, scanned and rematerialized layers, packed rows, the MLM head's two
namings and the hub's v3 checkpoints, the fine-tuning heads, the presets' sizes and the config errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from flaxlm import models
from flaxlm.models.deberta_v2 import log_bucket
from flaxlm.models.presets import build_config
from generation_check import add_noise
from parity import (assert_close_at_real, assert_initialized_like_transformers, assert_load_fails, batch, hf_logits,
                    jnp_args, randomize)
from test_classification_parity import assert_close, hf_outputs
from test_parity import CASE

V3, V2 = CASE["deberta-v2-v3"], CASE["deberta-v2-v2-absolute-conv"]


@pytest.mark.parametrize("length,buckets,max_position", [(600, 256, 512), (40, 8, 64), (100, 32, 128)])
def test_log_buckets_are_transformers(length, buckets, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]
    ref = make_log_bucket_position(torch.tensor(distance), buckets, max_position).long().numpy()
    np.testing.assert_array_equal(log_bucket(distance, buckets, max_position), ref)


def test_masked_positions_scan_remat_and_packed_rows():
    """The last layer at the masked positions only, the layers after the convolution's first one scanned and
    rematerialized, and two sequences packed in one row: each gives the plain forward's logits."""
    case = V2
    config = case.config(num_hidden_layers=3)
    graphdef, params = models.split_model(models.create_model(config))
    scanned = models.abstract_model(config, execution=models.Execution(scan=True, remat="full"))[0]
    apply = jax.jit(models.apply_model, static_argnums=0)
    params = randomize(params, std=0.1)
    ids, mask, types = jnp_args(batch(case))
    full = apply(graphdef, params, ids, mask, types)
    pos = jnp.array([[0, 3, 11], [1, 2, 6]], jnp.int32)
    got = apply(graphdef, params, ids, mask, types, masked_positions_BP=pos)
    np.testing.assert_allclose(got, jnp.take_along_axis(full, pos[..., None], axis=1), atol=1e-5)
    np.testing.assert_allclose(apply(scanned, params, ids, mask, types), full, atol=1e-5)

    # row 1's first 6 tokens, then row 0's: each sequence as if alone (positions restart, no attention across)
    alone_ids = jnp.stack([ids[1, :6], ids[0, :6]])
    alone = apply(graphdef, params, alone_ids, None, jnp.zeros_like(alone_ids))
    packed = alone_ids.reshape(1, 12)
    got = apply(graphdef, params, packed, None, jnp.zeros_like(packed), segment_ids_BL=jnp.array([[1] * 6 + [2] * 6]))
    np.testing.assert_allclose(got.reshape(alone.shape), alone, atol=1e-4)


def test_initialization_is_transformers():
    """Biases and norms exactly transformers' initialization; weights, the position table and the convolution
    normal(initializer_range) as there."""
    config = V2.config(initializer_range=0.02, num_hidden_layers=1, type_vocab_size=16)  # enough for a std
    assert_initialized_like_transformers(config, transformers.DebertaV2ForMaskedLM,
                                         lambda name: name.endswith(("bias", "LayerNorm.weight")))


def test_new_mlm_head_names_and_the_hubs_v3_checkpoints(tmp_path):
    """legacy false (lm_predictions.lm_head.*) both ways; and a v3 checkpoint as the hub's are (that head under a
    config without legacy, the replaced-token-detection head, unused absolute positions) computes what
    transformers computes with legacy false."""
    torch.manual_seed(0)
    hf = add_noise(transformers.DebertaV2ForMaskedLM(V3.config(legacy=False)), V3.std).eval()
    hf.save_pretrained(tmp_path / "new")
    config, model = models.load_pretrained(tmp_path / "new")
    b = batch(V3)
    ref = hf_logits(hf, b.hf)
    assert_close_at_real(model(*jnp_args(b)), ref, b.real_BL, 1e-4)
    models.save_pretrained(tmp_path / "ours", config, models.split_model(model)[1])
    back, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert_close_at_real(hf_logits(back, b.hf), ref, b.real_BL, 1e-4)

    tensors = {k: v.numpy() for k, v in hf.state_dict().items()}
    tensors["mask_predictions.classifier.weight"] = np.zeros((1, 32), np.float32)
    tensors["deberta.embeddings.position_embeddings.weight"] = np.zeros((64, 32), np.float32)
    params = models.from_hf_state_dict(V3.config(), tensors)  # legacy: the default
    assert_close_at_real(models.apply_model(models.split_model(model)[0], params, *jnp_args(b)), ref, b.real_BL,
                         1e-4)
    bare = {k[len("deberta."):]: x for k, x in tensors.items() if k.startswith("deberta.")}  # a DebertaV2Model's
    encoder = models.from_hf_state_dict(V3.config(), bare)  # with a fresh MLM head
    np.testing.assert_array_equal(encoder["rel_norm"]["scale"], params["rel_norm"]["scale"])
    assert_load_fails(V3.config(), {**tensors, "cls.predictions.decoder.weight": tensors[
        "deberta.embeddings.word_embeddings.weight"] + 1}, "cls.predictions.decoder.weight differs")


@pytest.mark.parametrize("task", ["sequence_classification", "question_answering"])
def test_fine_tuning_heads_both_ways(tmp_path, task):
    auto = {"sequence_classification": transformers.AutoModelForSequenceClassification,
            "question_answering": transformers.AutoModelForQuestionAnswering}[task]
    config = V2.config(num_labels=3 if task == "sequence_classification" else 2, pooler_hidden_act="tanh")
    torch.manual_seed(0)
    hf = add_noise(auto.from_config(config), 0.3)
    hf.save_pretrained(tmp_path / "hf")
    ids, mask, types = batch(V2).args
    ref = hf_outputs(hf, ids, mask, types)
    _, model = models.load_for_task(tmp_path / "hf", task)
    assert_close(model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)), ref, mask)
    graphdef, params = models.split_model(model)
    models.save_pretrained(tmp_path / "ours", models.task_config(config, task), params)
    back, info = auto.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(back) is type(hf) and models.count_params(params) == sum(p.numel() for p in hf.parameters())
    assert_close(model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)), hf_outputs(back, ids, mask, types),
                 mask)


def microsoft_rtd_logits(encoder, path, ids, mask):
    """The replaced-token-detection logits [B, L] of Microsoft's DeBERTa code (its mask_predictions head, as
    checkpoint `path` holds it) on the output of transformers' DebertaV2Model `encoder`."""
    from flaxlm.models.hf_io import read_safetensors
    t = {k: torch.tensor(np.asarray(v)) for k, v in read_safetensors(str(path)).items()
         if k.startswith("mask_predictions.")}
    with torch.no_grad():
        h = encoder.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
        x = torch.nn.functional.layer_norm(h[:, :1] + h, h.shape[-1:], t["mask_predictions.LayerNorm.weight"],
                                           t["mask_predictions.LayerNorm.bias"], encoder.config.layer_norm_eps)
        x = torch.nn.functional.gelu(x @ t["mask_predictions.dense.weight"].T + t["mask_predictions.dense.bias"])
        return (x @ t["mask_predictions.classifier.weight"].T + t["mask_predictions.classifier.bias"])[..., 0].numpy()


def test_a_v3_checkpoint_with_its_replaced_token_head_loads_as_the_discriminator(tmp_path):
    """A DeBERTa-v3 checkpoint as Microsoft's code saves it (the encoder, its MLM head under lm_predictions.*, the
    replaced-token-detection head under mask_predictions.*) loads as run_electra_flax.py's discriminator with the
    logits of that head on transformers' encoder; the MLM head is dropped with a note; ours saves back the
    same tensors but the MLM head."""
    from safetensors.numpy import save_file
    from flaxlm.models.family import REPLACED_TOKEN_DETECTION
    config = V3.config()
    torch.manual_seed(0)
    hf = add_noise(transformers.DebertaV2ForMaskedLM(V3.config(legacy=False)), V3.std).eval()
    rng = np.random.default_rng(0)
    D = config.hidden_size
    head = {"mask_predictions.dense.weight": rng.normal(0, 0.2, (D, D)), "mask_predictions.dense.bias":
            rng.normal(0, 0.2, D), "mask_predictions.LayerNorm.weight": 1 + rng.normal(0, 0.2, D),
            "mask_predictions.LayerNorm.bias": rng.normal(0, 0.2, D),
            "mask_predictions.classifier.weight": rng.normal(0, 0.2, (1, D)),
            "mask_predictions.classifier.bias": rng.normal(0, 0.2, 1)}
    tensors = {**{k: v.numpy() for k, v in hf.state_dict().items()},
               **{k: v.astype(np.float32) for k, v in head.items()}}
    (tmp_path / "ms").mkdir()
    save_file(tensors, str(tmp_path / "ms" / "model.safetensors"))
    config.save_pretrained(tmp_path / "ms")
    _, ours = models.load_for_task(tmp_path / "ms", REPLACED_TOKEN_DETECTION)
    b = batch(V3)
    ids, mask, _ = b.args
    expected = microsoft_rtd_logits(hf.deberta, tmp_path / "ms", ids, mask)
    assert_close_at_real(ours(jnp.asarray(ids), jnp.asarray(mask)), expected, b.real_BL, 1e-4)
    models.save_pretrained(tmp_path / "ours", config, models.split_model(ours)[1])
    from flaxlm.models.hf_io import read_safetensors
    saved = read_safetensors(str(tmp_path / "ours"))
    assert set(saved) == {k for k in tensors if not k.startswith("lm_predictions.")}


def test_the_discriminator_reads_each_packed_sequences_own_first_token():
    """Two sequences packed in one row: the discriminator's logits are each one's alone (its head adds each
    sequence's own first token, not the row's)."""
    from flaxlm.models.family import REPLACED_TOKEN_DETECTION
    model = models.create_model(V3.config(), task=REPLACED_TOKEN_DETECTION)
    graphdef, params = models.split_model(model)
    model = models.merge_model(graphdef, randomize(params, std=0.1))
    ids = jnp.asarray(batch(V3).args[0])
    alone_ids = jnp.stack([ids[1, :6], ids[0, :6]])
    alone = model(alone_ids)
    packed = model(alone_ids.reshape(1, 12), segment_ids_BL=jnp.array([[1] * 6 + [2] * 6]))
    np.testing.assert_allclose(packed.reshape(alone.shape), alone, atol=1e-4)


@pytest.mark.parametrize("preset", ["deberta-v3-xsmall", "deberta-v3-small", "deberta-v3-base", "deberta-v3-large",
                                    "deberta-v3-tiny", "deberta-v3-small-generator", "deberta-v3-base-generator"])
def test_presets_have_the_parameters_transformers_builds(preset):
    config = build_config(preset)
    with torch.device("meta"):
        hf = transformers.DebertaV2ForMaskedLM(config)
    assert models.count_params(models.abstract_model(config)[1]) == sum(p.numel() for p in hf.parameters())


def test_v3_presets_copy_the_hub_configs():
    small, base = build_config("deberta-v3-small"), build_config("deberta-v3-base")
    assert (base.vocab_size, base.num_hidden_layers, base.hidden_size, small.num_hidden_layers) == (128100, 12, 768, 6)
    assert (base.position_buckets, base.norm_rel_ebd, base.share_att_key, base.pos_att_type) == (
        256, "layer_norm", True, ["p2c", "c2p"])
    assert not base.position_biased_input and base.type_vocab_size == 0 and base.layer_norm_eps == 1e-7
    assert build_config("deberta-v3-tiny", overrides=["position_buckets=16"]).position_buckets == 16


@pytest.mark.parametrize("changes,message", [
    (dict(pos_att_type="p2p"), "unsupported pos_att_type p2p"),
    (dict(conv_kernel_size=2), "conv_kernel_size 2 must be odd"),
    (dict(embedding_size=16), "embedding_size 16 differs from hidden_size 32"),
    (dict(attention_head_size=16), "hidden_size 32 is not num_attention_heads 4 times attention_head_size 16"),
    (dict(legacy=True, tie_word_embeddings=False), "tie_word_embeddings false with legacy true"),
])
def test_unsupported_configs_are_one_line_errors(changes, message):
    from flaxlm.errors import UserError
    with pytest.raises(UserError, match=message) as e:
        models.abstract_model(V3.config(**changes))
    assert "\n" not in str(e.value)


def test_run_mlm_continues_a_transformers_checkpoint_and_run_classification_fine_tunes_it(model_dir_for, corpus,
                                                                                           tmp_path):
    """run_mlm_flax.py continues a DeBERTa-v3 that transformers wrote (the deberta-v3-tiny preset) and exports it:
    transformers reloads the export with our logits; run_classification.py fine-tunes that export into a
    DebertaV2ForSequenceClassification that transformers loads with our logits."""
    import shutil
    import run_classification
    import run_mlm_flax
    from run_helpers import read_metrics, run_args
    from test_sentence_prediction import sentences, write_tsv
    model_dir = model_dir_for("deberta-v3-tiny", vocab_size=400)
    hf_dir = tmp_path / "hf"
    shutil.copytree(model_dir, hf_dir)
    torch.manual_seed(0)
    transformers.DebertaV2ForMaskedLM(models.load_config(model_dir)).save_pretrained(hf_dir)
    out = tmp_path / "mlm"
    run_mlm_flax.main(run_args(str(hf_dir), corpus, out, "--max_seq_length", "32", "--learning_rate", "3e-3",
                               "--max_steps", "3", "--eval_steps", "3", model_flag="--model_name_or_path"))
    assert all(np.isfinite(r["loss"]) for r in read_metrics(out))
    before = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir).state_dict()
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out)
    assert any(not torch.equal(before[k], hf.state_dict()[k]) for k in before)  # trained
    ids = np.random.default_rng(0).integers(5, 400, (2, 16))
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    _, ours = models.load_pretrained(out)
    real = mask == 1
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids), jnp.asarray(mask)))[real], theirs[real], atol=1e-4)

    cls = tmp_path / "cls"
    run_classification.main([
        "--output_dir", str(cls), "--model_name_or_path", str(out), "--train_file",
        write_tsv(tmp_path / "train.tsv", sentences(16, 1)), "--validation_file",
        write_tsv(tmp_path / "dev.tsv", sentences(8, 2)), "--per_device_train_batch_size", "1", "--max_steps", "2"])
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(cls, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(hf) is transformers.DebertaV2ForSequenceClassification
    _, ours = models.load_for_task(cls, "sequence_classification")
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids), jnp.asarray(mask))), theirs, atol=1e-4, rtol=0)
