"""The causal-LM objective: each token predicted from the ones before it, plus the block-size limits."""
import numpy as np

from flaxlm.errors import UserError
from flaxlm.training.flops import decoder_lm_train_flops
from flaxlm.objectives.lm_loss import head_loss_sums
from flaxlm.models import apply_hidden, family_of, moe
from flaxlm.models.layers import Segments
from flaxlm.training.objective import Objective

MAX_BLOCK_SIZE = 1024  # default block size when the tokenizer allows more (as Hugging Face's run_clm)


def resolve_block_size(block_size, max_seq_length, tokenizer, config):
    """--block_size (or its alias --max_seq_length); at most the model's positions (its family's max_length)."""
    if block_size and max_seq_length and block_size != max_seq_length:
        raise UserError(f"--block_size {block_size} and --max_seq_length {max_seq_length} disagree; pass one")
    requested = block_size or max_seq_length
    max_length = family_of(config).max_length
    limit = None if max_length is None else max_length(config)  # None: no positions limit (BLOOM's ALiBi)
    if requested is None:
        return min(tokenizer.model_max_length, MAX_BLOCK_SIZE, *([] if limit is None else [limit]))
    if limit is not None and requested > limit:
        raise UserError(f"--block_size {requested} is larger than the model's {limit} positions "
                        f"(config.json); use at most {limit}")
    if requested < 2:
        raise UserError(f"--block_size {requested} is too short; use at least 2")
    return requested


def collate_blocks(rows_BL, rng=None):
    """A batch of packed token blocks: every next token is a target (evaluation zeroes padding rows)."""
    B, L = rows_BL.shape
    return {"input_ids": rows_BL, "label_weights": np.ones((B, L - 1), np.float32)}


def documents(ids_BL, eos_id):
    """(segment ids, positions), int32 [B, L], of packed rows whose documents each end with eos_id: a token's
    segment counts the EOS before it in its row; positions restart at 0 after each EOS."""
    ends_BL = np.asarray(ids_BL) == eos_id
    starts_BL = np.concatenate([np.zeros_like(ends_BL[:, :1]), ends_BL[:, :-1]], axis=1)
    index_BL = np.broadcast_to(np.arange(ends_BL.shape[1]), ends_BL.shape)
    first_BL = np.maximum.accumulate(np.where(starts_BL, index_BL, 0), axis=1)  # where each token's document starts
    return np.cumsum(starts_BL, axis=1).astype(np.int32), (index_BL - first_BL).astype(np.int32)


def collate_documents(eos_id):
    """collate_blocks plus each token's document (segment_ids) and its position within it (--separate_documents)."""
    def collate(rows_BL, rng=None):
        segments_BL, positions_BL = documents(rows_BL, eos_id)
        return {**collate_blocks(rows_BL), "segment_ids": segments_BL, "positions": positions_BL}
    return collate


def clm_objective(graphdef, config, params, block_size, pad_id, head_chunk_rows=None, separate_documents=False,
                  z_loss=0.0):
    """Objective for run_clm_flax: the head at positions 0..L-2 against the tokens at 1..L-1 (fused with the
    cross-entropy: flaxlm.objectives.lm_loss, with --z_loss's term; the last position's head is never computed).
    separate_documents: each token attends only within its document (pad_id is the EOS that ends one), at positions
    from 0 in it.
    An MoE config with output_router_logits adds router_aux_loss_coef times the load-balancing loss, as
    transformers does, and logs the router's metrics (flaxlm.models.moe.add_router_losses)."""
    def loss_sums(params, batch, dropout_key):
        ids_BL = batch["input_ids"]
        mask = Segments(batch["segment_ids"]) if separate_documents else None
        with moe.routing(config) as router:  # an MoE's router statistics: its losses and metrics
            h_BLD, head = apply_hidden(graphdef, params, ids_BL, mask, batch.get("positions"), dropout_key=dropout_key)
        sums = head_loss_sums(h_BLD[:, :-1], head, ids_BL[:, 1:], batch["label_weights"], head_chunk_rows, z_loss)
        return moe.add_router_losses(config, sums, router.value)

    collate = collate_documents(pad_id) if separate_documents else collate_blocks
    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="label_weights",
                     flops_per_example=decoder_lm_train_flops(config, params, 1, block_size),
                     tokens_per_example=block_size)
