"""The supervised fine-tuning objective (run_sft.py): next-token cross-entropy on the trained tokens only (the
assistant turns, or every token with --train_on_prompt), averaged over the batch's trained tokens as TRL's
SFTTrainer averages it; each conversation of a packed row attends only to itself, at positions from 0
(flaxlm.data.chat_rows). An MoE config with output_router_logits adds the load-balancing loss over the real
tokens, and logs the router's metrics (flaxlm.models.moe.add_router_losses)."""
import numpy as np

from flaxlm.models import apply_hidden, moe
from flaxlm.models.layers import Segments
from flaxlm.objectives.lm_loss import head_loss_sums
from flaxlm.training.flops import decoder_lm_train_flops
from flaxlm.training.objective import Objective


def label_weights(rows):
    """float32 [B, L - 1]: 1 where position t predicts a trained token t + 1 of its own conversation."""
    same_BL = (rows["segment_ids"][:, 1:] == rows["segment_ids"][:, :-1]) & (rows["segment_ids"][:, 1:] > 0)
    return (same_BL & (rows["trained"][:, 1:] > 0)).astype(np.float32)


def collate(rows, rng=None):
    return {"input_ids": rows["input_ids"], "segment_ids": rows["segment_ids"], "positions": rows["positions"],
            "label_weights": label_weights(rows)}


def sft_objective(graphdef, config, params, max_length, pad_id, head_chunk_rows=None, z_loss=0.0):
    def loss_sums(params, batch, dropout_key):
        ids_BL = batch["input_ids"]
        with moe.routing(config, batch["segment_ids"] > 0) as router:  # an MoE's router statistics, padding out
            h_BLD, head = apply_hidden(graphdef, params, ids_BL, Segments(batch["segment_ids"]), batch["positions"],
                                       dropout_key=dropout_key)
        sums = head_loss_sums(h_BLD[:, :-1], head, ids_BL[:, 1:], batch["label_weights"], head_chunk_rows, z_loss)
        return moe.add_router_losses(config, sums, router.value)

    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="label_weights",
                     flops_per_example=decoder_lm_train_flops(config, params, 1, max_length),
                     tokens_per_example=max_length)
