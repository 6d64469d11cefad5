"""flaxlm.models.t5_generation against transformers: greedy and beam search give generate()'s tokens on the same
weights (t5 and umt5, whose every layer has its own bias table), and the cached decoder's logits equal the full
forward's."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from flaxlm import models
from flaxlm.models.t5_generation import GenerationOptions, decode_step, generate_jit, init_cache, start_decoding
from tests.generation_check import add_noise

TINY = dict(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
# family: (transformers' class, config fields, the beam search's num_beams and length_penalty)
CLASSES = {"t5": (transformers.T5ForConditionalGeneration, dict(feed_forward_proj="relu"), (3, 0.6)),
           "umt5": (transformers.UMT5ForConditionalGeneration,
                    dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False), (4, 0.8))}


@pytest.fixture(scope="module", params=sorted(CLASSES))
def pair(request, tmp_path_factory):
    """(transformers' tiny model with noisy weights, ours loaded from its export, the inputs ids and mask, an EOS
    id that some rows reach early, the beam options)."""
    hf_class, fields, beams = CLASSES[request.param]
    torch.manual_seed(0)
    hf = add_noise(hf_class(hf_class.config_class(**TINY, **fields)), std=0.5).eval()
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    _, ours = models.load_pretrained(str(path))
    rng = np.random.default_rng(0)
    ids = rng.integers(2, TINY["vocab_size"], (4, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    mask[3, 3:] = 0
    ids[mask == 0] = 0
    return hf, ours, ids, mask, frequent_token(hf, ids, mask), beams


def theirs(hf, ids, mask, eos, **kw):
    with torch.no_grad():
        out = hf.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False, eos_token_id=eos,
                          pad_token_id=0, decoder_start_token_id=0, min_length=0, **kw)
    return [trim_list(row[1:], eos) for row in out.tolist()]


def trim_list(tokens, eos):
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def ours_tokens(model, ids, mask, eos, max_length, num_beams=1, length_penalty=1.0):
    opts = GenerationOptions(max_length=max_length, decoder_start_token_id=0, eos_token_id=eos, pad_token_id=0,
                             num_beams=num_beams, length_penalty=length_penalty)
    graphdef, params = models.split_model(model)
    out = generate_jit(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), opts)
    return [trim_list(row, eos) for row in np.asarray(out).tolist()]


def frequent_token(hf, ids, mask):
    """A token transformers' greedy search emits early in some rows but not all: made the EOS so that some
    hypotheses end early and others run to max_length."""
    rows = theirs(hf, ids, mask, eos=TINY["vocab_size"] + 1, max_length=12)
    return rows[0][2]


def test_greedy_matches_transformers(pair):
    hf, ours, ids, mask, eos, _ = pair
    expected = theirs(hf, ids, mask, eos, max_length=12)
    assert any(row[-1] == eos and len(row) < 11 for row in expected)
    assert ours_tokens(ours, ids, mask, eos, 12) == expected


def test_beam_search_matches_transformers(pair):
    hf, ours, ids, mask, eos, (num_beams, length_penalty) = pair
    expected = theirs(hf, ids, mask, eos, max_length=10, num_beams=num_beams, length_penalty=length_penalty)
    assert any(row[-1] == eos and len(row) < 9 for row in expected)  # a hypothesis finished early
    assert any(eos not in row and len(row) == 9 for row in expected)  # and one the max length cut
    assert ours_tokens(ours, ids, mask, eos, 10, num_beams, length_penalty) == expected


# How far a float32 forward of the fixture's model may land from the float64 one, as a share of the largest |logit|.
# Measured on one CPU under XLA_FLAGS=--xla_cpu_max_isa=SSE4_2, AVX2 and the default AVX-512 (the noised weights,
# std 0.5, give logits up to 29.5 and attention logits in the hundreds): our full forward 0.85-1.9e-5, our cached
# decode 1.9-3.4e-5, transformers' own float32 forward 2.6e-5. The ISA picks the order of the sums (the cached
# decode's matrix-vector products change most), never the math: 1e-4 leaves 3x. A cache bug (a position off by one,
# the encoder's padding seen) is off by about 1.0 of the largest logit.
FLOAT32_SPREAD = 1e-4


@pytest.mark.parametrize("pair", ["umt5"], indirect=True)  # a bias table per layer; the searches cover T5's
def test_cached_decoding_equals_full_forward(pair):
    """The cached decoder's logits at each step and the full forward's are both the float64 forward's (transformers'
    model in float64), within what float32 holds for logits of their size."""
    hf, ours, ids, mask, _, _ = pair
    dec_ids = np.random.default_rng(1).integers(2, TINY["vocab_size"], (4, 7))
    with torch.no_grad():
        exact = copy.deepcopy(hf).double()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                           decoder_input_ids=torch.tensor(dec_ids)).logits.numpy()
    atol = FLOAT32_SPREAD * np.abs(exact).max()
    graphdef, params = models.split_model(ours)
    full = jax.jit(lambda p, *args: models.apply_model(graphdef, p, *args))(params, ids, mask, dec_ids)
    np.testing.assert_allclose(full, exact, atol=atol, rtol=0)
    cross_kv, enc_mask = start_decoding(ours, jnp.asarray(ids), jnp.asarray(mask), 1)
    cache = init_cache(ours, 4, 7)
    step = jax.jit(lambda p, *args: decode_step(models.merge_model(graphdef, p), *args))
    for t in range(7):
        logits, cache = step(params, jnp.asarray(dec_ids[:, t]), jnp.int32(t), cache, cross_kv, enc_mask)
        np.testing.assert_allclose(logits, exact[:, t], atol=atol, rtol=0)
