"""The parity harness: our models against transformers' PyTorch models, one tiny Case at a time.

A Case is one tiny model of a family (tests/test_parity.py holds the table of them and the checks every family
passes; tests/test_<family>.py what only one family has). The helpers build the random models on both sides and
an input batch of the family's kind, and compare what the two compute:

    hf = random_hf(case)                               # transformers' model, noise on every tensor
    b = batch(case)                                    # b.args for our model, b.hf for transformers'
    assert_close_at_real(model(*jnp_args(b)), hf_logits(hf, b.hf), b.real_BL, case.tol)
    assert_losses_match(case, model, hf, b)            # transformers' loss from labels is ours
"""
import os
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors import safe_open

from flaxlm import models
from flaxlm.errors import UserError
from generation_check import add_noise


@dataclass(frozen=True)
class Case:
    """One tiny model of a family, checked against transformers' model of it."""
    name: str  # the case within its family ("post_ln_projected"); str(case) adds the model_type
    hf_class: type  # transformers' model class; its config_class builds the config from `fields`
    inputs: str  # a key of BATCHES: "encoder" (ids, mask, token types), "encoder-decoder", "causal" (left-padded),
    # "replaced-token" (the encoder's, a logit per token)
    fields: dict  # the transformers config's fields
    task: str | None = None  # our model: the family's pretraining model, or this Head's (ELECTRA's discriminator)
    std: float = 0.1  # the noise added to every weight, on either side
    tol: float = 1e-4  # the largest |logit difference| allowed against transformers
    cache_tol: float = 1e-5  # the same between decoding with the KV cache and one full forward
    bf16_std: float = 0.05  # the noise on the weights of the bfloat16 check (0: the initialization)
    bf16_rel: float = 0.05  # bfloat16 logits within bf16_rel * max |float32 logit| + 0.05 of float32's

    def __post_init__(self):
        assert self.inputs in BATCHES, self.inputs

    def __str__(self):
        return f"{self.model_type}-{self.name}"

    @property
    def model_type(self):
        return self.hf_class.config_class.model_type

    @property
    def tied(self):
        """Whether the LM head is the input embeddings (transformers' default: tied)."""
        return self.fields.get("tie_word_embeddings", True)

    @property
    def per_position(self):
        """The shape of the logits at one position: the vocabulary's, or () for one logit (replaced or not)."""
        return () if self.inputs == "replaced-token" else (self.fields["vocab_size"],)

    def config(self, **overrides):
        """A fresh transformers config of the case, with overrides."""
        return self.hf_class.config_class(**{**self.fields, **overrides})


def randomize(params, seed=0, std=0.1):
    """Our params plus noise everywhere (biases and norms too), so that every tensor's mapping is exercised."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def hf_tied(hf):
    """Whether transformers' model shares one tensor between its input embeddings and its LM head; for a model
    without an LM head (ELECTRA's discriminator), what its config says."""
    if hf.get_output_embeddings() is None:
        return hf.config.tie_word_embeddings
    return hf.get_output_embeddings().weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()


def as_untied(hf):
    """transformers' model with config.tie_word_embeddings false if its head is untied. transformers 5's T5-family
    configs say true whatever config.json says, and its UMT5 (up to 5.23; later ones by scale_decoder_outputs, which
    a model built from a config without tie_word_embeddings false sets) then scales the decoder output of an
    untied head as if tied (by d_model**-0.5); transformers 4 and T5X, which trained the released UMT5, do not."""
    if not hf_tied(hf):
        hf.config.tie_word_embeddings = False
        if hasattr(hf.config, "scale_decoder_outputs"):  # transformers >= 5.24's UMT5 scales by this flag
            hf.config.scale_decoder_outputs = False
    return hf


def random_hf(case, seed=0, std=None):
    """transformers' model of the case in eval mode: its initialization plus noise (case.std) on every tensor."""
    torch.manual_seed(seed)
    hf = case.hf_class(case.config())
    if hf.config.tie_word_embeddings and not case.tied:  # transformers 5's T5Config says tied even for v1.1
        hf.get_output_embeddings().weight = torch.nn.Parameter(hf.get_input_embeddings().weight.detach().clone())
    assert hf_tied(hf) == case.tied
    return add_noise(as_untied(hf), case.std if std is None else std, seed).eval()


class Batch(NamedTuple):
    """One batch of inputs in both conventions (numpy int64)."""
    args: tuple  # our model's positional inputs
    hf: dict  # the same inputs as keyword arguments of transformers' forward
    real_BL: np.ndarray  # the output positions compared: True where not padding
    losses: list  # [(our inputs, transformers' inputs, labels_BL with -100 where there is no target)]


def encoder_batch(config, rng):
    """ids, mask, token types [2, 12]: row 1 padded from 7, token type 1 from 5."""
    ids = rng.integers(3, config.vocab_size, (2, 12))
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    ids[1, 7:] = config.pad_token_id
    types = np.zeros_like(ids)
    types[:, 5:] = 1
    hf = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
    return Batch((ids, mask, types), hf, mask == 1, [((ids, mask, types), hf, np.where(mask == 1, ids, -100))])


def encoder_decoder_batch(config, rng):
    """ids, mask [2, 30] (row 1 padded from 20), decoder ids and mask [2, 25]: labels shifted right (row 1's
    labels -100 from 19). Every decoder position is compared; the loss goes from the labels as transformers'."""
    ids = rng.integers(2, config.vocab_size, (2, 30))
    mask = np.ones_like(ids)
    mask[1, 20:] = 0
    ids[1, 20:] = config.pad_token_id
    labels = rng.integers(2, config.vocab_size, (2, 25))
    labels[1, 19:] = -100
    dec_ids = np.concatenate([np.full((2, 1), config.decoder_start_token_id), labels[:, :-1]], axis=1)
    dec_ids[dec_ids == -100] = config.pad_token_id
    dec_mask = (labels != -100).astype(np.int64)
    dec_mask[:, 0] = 1
    hf = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
    loss = ((ids, mask, dec_ids), dict(input_ids=ids, attention_mask=mask), labels)
    return Batch((ids, mask, dec_ids, dec_mask), hf, np.ones(labels.shape, bool), [loss])


def causal_batch(config, rng):
    """ids, mask, positions [3, 20]: row 1 left-padded by 5, row 2 by 11; positions count each row's real
    tokens. Losses: the batch (no target at padding or right after it), and row 0 given its ids only."""
    ids = rng.integers(3, config.vocab_size, (3, 20))
    mask = np.ones_like(ids)
    mask[1, :5] = 0
    mask[2, :11] = 0
    ids[mask == 0] = config.pad_token_id
    pos = np.clip(mask.cumsum(1) - 1, 0, None)
    hf = dict(input_ids=ids, attention_mask=mask, position_ids=pos)
    labels = np.where(mask * np.pad(mask, ((0, 0), (1, 0)))[:, :-1] == 1, ids, -100)
    return Batch((ids, mask, pos), hf, mask == 1, [((ids, mask, pos), hf, labels),
                                                   ((ids[:1],), dict(input_ids=ids[:1]), ids[:1])])


def replaced_token_batch(config, rng):
    """The encoder batch; its loss's labels 1 (replaced) or 0 at random, -100 at padding (transformers leaves
    padding out by the attention mask)."""
    b = encoder_batch(config, rng)
    ids, mask, _ = b.args
    return b._replace(losses=[(b.args, b.hf, np.where(mask == 1, rng.integers(0, 2, ids.shape), -100))])


BATCHES = {"encoder": encoder_batch, "encoder-decoder": encoder_decoder_batch, "causal": causal_batch,
           "replaced-token": replaced_token_batch}


def batch(case, seed=0, config=None):
    """An input Batch of the case's kind, for its config (or `config`: the case's with other settings)."""
    return BATCHES[case.inputs](config or case.config(), np.random.default_rng(seed))


def load_ours(case, path):
    """(config, our model) from a directory in Hugging Face's format: the pretraining model, or the case's Head."""
    return models.load_pretrained(path) if case.task is None else models.load_for_task(path, case.task)


def jitted(graphdef, params):
    """The forward of (graphdef, params) as one compiled program: f(*inputs) -> logits. A tiny model's forward run
    op by op compiles each op for the case's shapes; one program per case is about 40 % quicker (measured on
    test_parity.py's checkpoint-loading check, 2026-12-07) and computes the same within the tolerances."""
    apply = jax.jit(lambda p, *args: models.apply_model(graphdef, p, *args))
    return lambda *args: apply(params, *args)


def jnp_args(b):
    """The batch's inputs for our model, as jax arrays."""
    return tuple(map(jnp.asarray, b.args))


def hf_forward(hf, inputs, labels=None):
    with torch.no_grad():
        return hf.eval()(**{k: torch.tensor(v) for k, v in inputs.items()},
                         labels=None if labels is None else torch.tensor(labels))


def hf_logits(hf, inputs):
    return hf_forward(hf, inputs).logits.numpy()


def our_loss(logits_BLV, labels_BL, causal):
    """Mean cross-entropy of the logits at the labels that are not -100 (binary for one logit per position);
    causal: the logits at t predict the label at t + 1, as transformers' causal LMs shift their labels."""
    logits_BLV, labels_BL = jnp.asarray(logits_BLV), np.asarray(labels_BL)
    if causal:
        logits_BLV, labels_BL = logits_BLV[:, :-1], labels_BL[:, 1:]
    real = labels_BL != -100
    if logits_BLV.ndim == labels_BL.ndim:  # one logit per position: replaced (label 1) or not
        nll = jax.nn.softplus(logits_BLV) - np.where(real, labels_BL, 0) * logits_BLV
    else:
        logp = jax.nn.log_softmax(logits_BLV, axis=-1)
        nll = -jnp.take_along_axis(logp, jnp.asarray(np.where(real, labels_BL, 0))[..., None], axis=-1)[..., 0]
    return float((nll * real).sum() / real.sum())


def assert_close_at_real(ours, ref, real_BL, tol):
    """Our logits within tol of transformers' (ref) at the real positions; a meaningful comparison."""
    ours = np.asarray(ours)
    assert ours.dtype == np.float32 and ours.shape == ref.shape, (ours.dtype, ours.shape, ref.shape)
    assert np.isfinite(ours[real_BL]).all() and np.isfinite(ref[real_BL]).all()
    err = float(np.abs(ours - ref)[real_BL].max())
    assert err < tol, err
    assert np.abs(ref[real_BL]).max() > 1.0  # not two near-zero tensors


def assert_losses_match(case, model_fn, hf, b):
    """transformers' loss from labels (each of b.losses) is our mean cross-entropy, within 1e-5."""
    for args, inputs, labels in b.losses:
        theirs = float(hf_forward(hf, inputs, labels).loss)
        mine = our_loss(model_fn(*map(jnp.asarray, args)), labels, case.inputs == "causal")
        assert mine == pytest.approx(theirs, abs=1e-5)


def saved_keys(path):
    """{name: shape} of the tensors in path/model.safetensors."""
    with safe_open(os.path.join(path, "model.safetensors"), framework="np") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def assert_same_params(a, b):
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b))


def assert_initialized_like_transformers(config, hf_class, exact):
    """Our initialization of config against transformers' hf_class (its _init_weights), tensor by tensor in its
    names: the same where exact(name) (biases, norms), elsewhere a mean near 0 and the std within 20%. Returns
    our tensors."""
    ours = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    torch.manual_seed(0)
    ref = {k: v.numpy() for k, v in hf_class(config).state_dict().items()}
    assert set(ours) <= set(ref)
    for name, x in ours.items():
        if exact(name):
            np.testing.assert_array_equal(x, ref[name])
        else:
            assert abs(x.mean()) < 0.2 * ref[name].std() + 1e-3, name
            assert x.std() == pytest.approx(ref[name].std(), rel=0.2), name
    return ours


def assert_load_fails(config, tensors, pattern, task=None):
    """Loading `tensors` under `config` (for the task's Head) raises a one-line UserError matching pattern."""
    with pytest.raises(UserError, match=pattern) as e:
        models.from_hf_state_dict(config, tensors, task=task)
    assert "\n" not in str(e.value)
