"""Completions sampled from the policy inside a training run, on all devices, with the training params as they are
placed (no second copy of the weights) and the KV cache of flaxlm.models.generation.

    sample = Sampler(graphdef, mesh, max_new_tokens=256, eos_id=2, pad_id=0, temperature=1.0, top_k=0, top_p=1.0)
    completions_BC = sample(params, ids_BP, mask_BP, key)     # numpy int32 [B, C], pad after each row's EOS

ids_BP / mask_BP are the whole batch's left-padded prompts (every process passes the same); each process hands the
devices only its rows, and every process reads back all completions (its rewards need whole groups). The draw is
a function of the key alone, not of how the batch is split over devices (jax's partitionable threefry), so a seed
gives the same completions on 1 device or 8.
"""
import jax
import jax.numpy as jnp
import numpy as np

from flaxlm.models import generation
from flaxlm.training import mesh as meshlib


class Sampler:
    def __init__(self, graphdef, mesh, *, max_new_tokens, eos_id, pad_id, temperature=1.0, top_k=0, top_p=1.0):
        """temperature 0: greedy. eos_id None: every completion runs to max_new_tokens."""
        self.mesh, self.C = mesh, max_new_tokens
        do_sample = temperature > 0
        sampling = generation.sampling_options(temperature, top_k, top_p)
        eos_pad = np.array([-1 if eos_id is None else eos_id, pad_id], np.int32)

        def sample(params, ids_BP, mask_BP, key):
            first_B, cache = generation._prefill(graphdef, params, ids_BP, mask_BP, key, sampling,
                                                 cache_length=ids_BP.shape[1] + max_new_tokens, do_sample=do_sample)
            lengths_B = jnp.sum(mask_BP, axis=1).astype(jnp.int32)
            out_BC, _ = generation._decode(graphdef, params, cache, first_B, lengths_B, key, sampling, eos_pad,
                                           max_new_tokens=max_new_tokens, do_sample=do_sample)
            return out_BC

        self.sample_fn = sample
        self._jitted = meshlib.on_mesh(jax.jit(sample, out_shardings=meshlib.replicated(mesh)), mesh)

    def __call__(self, params, ids_BP, mask_BP, key):
        sharding = meshlib.batch_sharding(self.mesh)
        local = meshlib.local_rows(len(ids_BP))
        batch = meshlib.to_device_batch({"ids": ids_BP[local], "mask": mask_BP[local]}, sharding)
        return np.asarray(jax.device_get(self._jitted(params, batch["ids"], batch["mask"], key)))


def completion_masks(completions_BC, eos_id):
    """(mask_BC float32: 1 up to and with each row's first EOS, or every token of a row without one; truncated_B
    bool: the rows that never produced EOS, cut at the length limit)."""
    if eos_id is None:
        return np.ones(completions_BC.shape, np.float32), np.ones(len(completions_BC), bool)
    is_eos_BC = completions_BC == eos_id
    truncated_B = ~is_eos_BC.any(axis=1)
    first_B = np.where(truncated_B, completions_BC.shape[1], is_eos_BC.argmax(axis=1) + 1)
    mask_BC = (np.arange(completions_BC.shape[1])[None, :] < first_B[:, None]).astype(np.float32)
    return mask_BC, truncated_B
