"""The causal-LM objective: each token predicted from the ones before it, plus the block-size limits."""
import numpy as np

from flaxlm.errors import UserError
from flaxlm.training.flops import decoder_lm_train_flops
from flaxlm.objectives.lm_loss import head_loss_sums
from flaxlm.models import apply_hidden, family_of
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


def clm_objective(graphdef, config, params, block_size, pad_id, head_chunk_rows=None):
    """Objective for run_clm_flax: the head at positions 0..L-2 against the tokens at 1..L-1 (fused with the
    cross-entropy: flaxlm.objectives.lm_loss; the last position's head is never computed)."""
    def loss_sums(params, batch, dropout_key):
        ids_BL = batch["input_ids"]
        h_BLD, head = apply_hidden(graphdef, params, ids_BL, dropout_key=dropout_key)
        return head_loss_sums(h_BLD[:, :-1], head, ids_BL[:, 1:], batch["label_weights"], head_chunk_rows)

    return Objective(loss_sums=loss_sums, collate=collate_blocks, pad_id=pad_id, weights_key="label_weights",
                     flops_per_example=decoder_lm_train_flops(config, params, 1, block_size),
                     tokens_per_example=block_size)
