"""run_clm_flax.py --separate_documents: packed rows in which no token attends across the EOS that ends its document
and positions restart after it, so that each document gets the logits it gets alone (XLA and splash attention)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import run_clm_flax
import run_helpers
from flaxlm import models
from flaxlm.models.layers import Segments
from flaxlm.models.layer_stack import Execution
from flaxlm.models.presets import build_config
from flaxlm.objectives.clm import documents
from parity import randomize

EOS = 3
LENGTHS = [40, 57, 32]  # three documents packed into a row of 128: the last one cut by the row's end


def test_documents_and_their_positions():
    ids = np.array([[5, 6, EOS, 7, EOS, EOS, 8, 9], [EOS, 5, 6, 7, 8, 9, 5, 6]])
    segments, positions = documents(ids, EOS)
    np.testing.assert_array_equal(segments, [[0, 0, 0, 1, 1, 2, 3, 3], [0, 1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(positions, [[0, 1, 2, 0, 1, 0, 0, 1], [0, 0, 1, 2, 3, 4, 5, 6]])


def packed_row(vocab):
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(4, vocab, n - 1)) + [EOS] for n in LENGTHS]
    docs[-1] = docs[-1][:-1]  # the row ends inside the third document
    return docs, np.concatenate(docs)[None].astype(np.int32)


@pytest.mark.parametrize("preset, attention", [("gpt2-tiny", "xla"), ("llama-tiny", "xla"), ("llama-tiny", "splash"),
                                               ("mistral-tiny", "splash"), ("bloom-tiny", "xla")])
def test_each_document_of_a_packed_row_gets_the_logits_it_gets_alone(preset, attention):
    """Absolute positions (GPT-2), rotary ones with grouped-query attention (Llama; Mistral's sliding window of 16),
    ALiBi (BLOOM); float32."""
    config = build_config(preset)
    graphdef, params = models.split_model(models.create_model(config, execution=Execution(attention=attention)))
    params = randomize(params, std=0.1)
    docs, row = packed_row(config.vocab_size)
    segments, positions = documents(row, EOS)
    assert row.shape[1] == 128 and segments.max() == 2
    packed = jax.jit(lambda p: models.apply_model(graphdef, p, row, Segments(segments), positions))(params)
    start = 0
    for doc in docs:
        alone = models.apply_model(graphdef, params, np.asarray([doc], np.int32))
        np.testing.assert_allclose(packed[:, start:start + len(doc)], alone, atol=2e-5, rtol=1e-5)
        start += len(doc)
    whole = models.apply_model(graphdef, params, row)  # without the segments the later documents see the earlier
    assert np.abs(whole[:, LENGTHS[0]:] - packed[:, LENGTHS[0]:]).max() > 1e-2


def test_a_run_with_separate_documents_trains(tiny_gpt2_dir, corpus, tmp_path):
    out = tmp_path / "run"
    run_clm_flax.main(run_helpers.run_args(tiny_gpt2_dir, corpus, out, "--block_size", "32", "--max_steps", "3",
                                           "--separate_documents", "--eval_steps", "3"))
    rows = run_helpers.read_metrics(out, "eval")
    assert rows and np.isfinite(rows[-1]["loss"])
