"""A causal LM scored and run on all devices, batched into a few fixed shapes: what evaluate_lm.py (documents in
sliding windows), run_fewshot.py (choices, generations) and the lm-eval backend share.

    lm = CausalLM(path, tokenizer_path, "--model_name_or_path DIR")  # config, tokenizer, context: checked, cheap
    lm.load("bfloat16", per_device_batch=8)                        # the weights on all devices, lm.scorer
    ll, greedy = lm.scorer([(ids, first), ...])
    ll, greedy, token_ll = lm.scorer([(ids, first), ...], per_token=True)
    tokens = lm.generate([prompt_ids, ...], max_new_tokens=64)
    # per request: ll = sum over k >= first of log p(ids[k] | ids[:k]) (float64 on the host), greedy = whether
    # argmax decoding picks each of those tokens (lm-eval's is_greedy), token_ll = those log p one by one (float32)

A request's input is ids[:-1], right-padded to a bucket (a power of two from MIN_BUCKET, capped at max_length), so a
whole evaluation compiles once per bucket; requests are sorted by length so a batch holds similar ones, and the
results come back in the requests' order. The logits are float32 whatever the compute dtype.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from flaxlm.models import merge_model, split_model
from flaxlm.training.mesh import batch_sharding, local_rows, on_mesh, to_device_batch

MIN_BUCKET = 32
DEFAULT_CONTEXT = 2048  # the context when none is asked for and the model's positions allow more (or have no limit)


def context_length(config, requested=None, flag="--max_length"):
    """The tokens of context the model sees at once: `requested` (checked against the model's positions), else
    its positions, at most DEFAULT_CONTEXT (BLOOM's ALiBi has no limit)."""
    from flaxlm.errors import UserError
    from flaxlm.models import family_of
    max_length = family_of(config).max_length
    positions = max_length(config) if max_length else None
    if requested is None:
        return min(positions or DEFAULT_CONTEXT, DEFAULT_CONTEXT)
    if positions is not None and requested > positions:
        raise UserError(f"{flag} {requested} is more than the model's {positions} positions; use at most {positions}")
    return requested


def bucket(length, max_length):
    """The padded input length for `length` tokens: the next power of two from MIN_BUCKET, at most max_length."""
    b = MIN_BUCKET
    while b < length:
        b *= 2
    return min(b, max_length)


def token_log_likelihoods(model, ids_BL, mask_BL, targets_BL, weights_BL, per_token=False):
    """(sum of the weighted targets' log-probabilities [B], whether each weighted target is the argmax [B]), and with
    per_token the weighted log-probabilities themselves [B, L] (0 where the weight is 0)."""
    logits_BLV = model(ids_BL, mask_BL).astype(jnp.float32)
    logp_BLV = jax.nn.log_softmax(logits_BLV, axis=-1)
    ll_BL = jnp.take_along_axis(logp_BLV, targets_BL[..., None], axis=-1)[..., 0]
    hit_BL = jnp.argmax(logits_BLV, axis=-1) == targets_BL
    out = ((ll_BL * weights_BL).sum(-1), jnp.all(hit_BL | (weights_BL == 0), axis=-1))
    return out + (ll_BL * weights_BL,) if per_token else out


class CausalLM:
    def __init__(self, path, tokenizer_path, source, max_length=None, max_length_flag="--max_length", hint="",
                 adapter=None):
        """path: a transformers-format directory (resolved); source: how the user named it, for errors. Checks that it
        holds a causal LM (else one line ending in hint) and that the tokenizer fits it; nothing heavy is read.
        adapter: a LoRA adapter's directory (a LoRA run's export), put on the model when it loads."""
        from flaxlm.models import check_causal_lm, load_config
        from flaxlm.tokenization.loading import check_fits, load_tokenizer
        self.path, self.adapter = path, adapter
        self.config = load_config(path)
        check_causal_lm(self.config, source, hint=hint)
        self.tokenizer = tok = load_tokenizer(tokenizer_path, local_only=True)
        check_fits(tok, self.config)
        self.max_length = context_length(self.config, max_length, max_length_flag)
        self.prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id  # before a document
        self.pad = next((t for t in (tok.pad_token_id, tok.eos_token_id) if t is not None), 0)

    def load(self, dtype, per_device_batch, sharding="data", desc="scoring"):
        """The weights on all devices (replicated, or split with sharding="fsdp"), and self.scorer over them."""
        from flaxlm.models import load_pretrained
        from flaxlm.training.mesh import make_mesh
        from flaxlm.training.sharding import state_shardings
        self.mesh = make_mesh()
        _, self.model = load_pretrained(self.path, dtype, shardings=lambda a: state_shardings(a, self.mesh, sharding))
        if self.adapter:
            from flaxlm.models.lora import load_adapter
            load_adapter(self.model, self.config, self.adapter)
        self.batch = per_device_batch * self.mesh.size
        self.scorer = Scorer(self.model, self.mesh, per_device_batch, self.max_length, self.pad, desc=desc)
        return self

    def encode(self, text):
        """The text's token ids, no special tokens."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompts, max_new_tokens, bar=None, **sampling):
        """Each prompt's new tokens (until EOS or max_new_tokens), in the prompts' order: batches of self.batch rows,
        longest prompts first so that a batch holds similar lengths; bar (a tqdm) counts the prompts done. sampling:
        generation.generate's temperature, top_k, top_p, seed (default greedy)."""
        from flaxlm.models.generation import generate
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        out = [None] * len(prompts)
        for start in range(0, len(order), self.batch):
            chunk = order[start:start + self.batch]
            generated = generate(self.model, [prompts[i] for i in chunk], max_new_tokens,
                                 eos_token_id=self.tokenizer.eos_token_id, pad_token_id=self.pad, **sampling)
            for i, tokens in zip(chunk, generated.tokens):
                out[i] = tokens
            if bar is not None:
                bar.update(len(chunk))
        return out


class Scorer:
    def __init__(self, model, mesh, per_device_batch, max_length, pad_id, desc="scoring"):
        """model: an nnx causal LM (its parameters placed as the caller wants: replicated or fsdp over mesh);
        max_length: the longest input (the model's positions)."""
        self.mesh, self.max_length, self.pad_id, self.desc = mesh, max_length, pad_id, desc
        self.batch = per_device_batch * mesh.size
        self.sharding = batch_sharding(mesh)
        graphdef, params = split_model(model)
        self.params = params

        # per_token static: the plain step (every other caller's) compiles without the [B, L] output
        @functools.partial(jax.jit, static_argnames="per_token")
        def step(params, batch, per_token=False):
            return token_log_likelihoods(merge_model(graphdef, params), batch["ids"], batch["mask"], batch["targets"],
                                         batch["weights"], per_token)
        self.step = on_mesh(step, mesh)

    def rows(self, requests, length):
        """Numpy arrays [batch, length] of up to self.batch requests (the rest filled with weightless padding)."""
        ids = np.full((self.batch, length), self.pad_id, np.int32)
        mask, targets, weights = np.zeros_like(ids), np.zeros_like(ids), np.zeros((self.batch, length), np.float32)
        for r, (tokens, first) in enumerate(requests):
            n = len(tokens) - 1
            ids[r, :n], mask[r, :n], targets[r, :n] = tokens[:-1], 1, tokens[1:]
            weights[r, max(first, 1) - 1:n] = 1
        return {"ids": ids, "mask": mask, "targets": targets, "weights": weights}

    def __call__(self, requests, per_token=False):
        """requests: (ids, first) with 1 <= first < len(ids) <= max_length + 1. Returns (ll [N] float64, greedy [N]),
        and with per_token a list of N float32 arrays: each request's log p(ids[k] | ids[:k]) for k >= first (that of
        ids[k] computed at the model's position k - 1)."""
        for ids, first in requests:
            if not 1 <= first < len(ids) <= self.max_length + 1:
                raise ValueError(f"a request of {len(ids)} tokens scored from {first} does not fit {self.max_length}")
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][0]))
        ll, greedy = np.zeros(len(requests)), np.zeros(len(requests), bool)
        token_ll = [None] * len(requests)
        local = local_rows(self.batch)
        for start in tqdm(range(0, len(order), self.batch), desc=self.desc, dynamic_ncols=True,
                          disable=jax.process_index() != 0 or len(order) <= self.batch):
            chunk = order[start:start + self.batch]
            length = bucket(len(requests[chunk[0]][0]) - 1, self.max_length)
            arrays = self.rows([requests[i] for i in chunk], length)
            out = self.step(self.params, to_device_batch({k: v[local] for k, v in arrays.items()}, self.sharding),
                            per_token=per_token)
            out_ll, out_greedy, *out_tokens = (np.asarray(multihost_utils.process_allgather(x, tiled=True))
                                               for x in out)
            ll[chunk], greedy[chunk] = out_ll[:len(chunk)], out_greedy[:len(chunk)]
            for r, i in enumerate(chunk if per_token else ()):
                ids, first = requests[i]
                token_ll[i] = out_tokens[0][r, first - 1:len(ids) - 1]
        return (ll, greedy, token_ll) if per_token else (ll, greedy)

