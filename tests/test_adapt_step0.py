"""bench/adapt_step0.py: the output prior set from the training text lowers a random model's loss on that text, for
a masked LM (its own output bias replaced) and a causal LM without one (GPT-2: the bias added to its logits)."""
import argparse
import shutil

import pytest

from bench.adapt_step0 import decompose
from flaxlm.models import create_model, load_config, save_pretrained, split_model


@pytest.mark.parametrize("preset", ["roberta-tiny", "gpt2-tiny"])
def test_prior_lowers_the_loss(preset, model_dir_for, corpus, tmp_path):
    d = str(tmp_path / "model")
    shutil.copytree(model_dir_for(preset, vocab_size=304), d)
    config = load_config(d)
    save_pretrained(d, config, split_model(create_model(config, seed=1))[1])
    a = argparse.Namespace(train_file=corpus["train"], eval_file=corpus["train"], rows=16, seq_len=32, seed=0)
    losses = decompose(d, a)
    # a random model predicts nearly uniformly: the corpus's unigram prior is worth most of a nat
    assert losses["log-prior"] < losses["as is"] - 0.5
    # the shift moves the model's own mean prediction onto that prior: as good, and it converges
    assert losses["shift x2"] < losses["as is"] - 0.5
    assert abs(losses["shift x2"] - losses["shift"]) < 0.1
