"""The masked-LM objective: loss and accuracy at the masked slots only."""
from flaxlm.training.flops import encoder_mlm_train_flops
from flaxlm.objectives.lm_loss import head_loss_sums
from flaxlm.models import apply_hidden
from flaxlm.training.objective import Objective


def mlm_objective(graphdef, config, masker, seq_len, head_chunk_rows=None, z_loss=0.0):
    """Objective for run_mlm_flax: the head at the masked slots only, fused with the cross-entropy
    (flaxlm.objectives.lm_loss; z_loss: --z_loss); correct when the label's logit is the largest (an exact tie counts
    as correct).
    A batch of packed rows (--line_by_line) carries segment_ids, which keep each sequence to itself."""
    def loss_sums(params, batch, dropout_key):
        packed = {"segment_ids_BL": batch["segment_ids"]} if "segment_ids" in batch else {}
        h_BPD, head = apply_hidden(graphdef, params, batch["input_ids"], batch["attention_mask"],
                                   masked_positions_BP=batch["masked_positions"], dropout_key=dropout_key, **packed)
        return head_loss_sums(h_BPD, head, batch["masked_labels"], batch["masked_weights"], head_chunk_rows,
                              z_loss)

    return Objective(loss_sums=loss_sums, collate=masker, pad_id=masker.pad_token_id,
                     weights_key="masked_weights",
                     flops_per_example=encoder_mlm_train_flops(config, 1, seq_len, masker.num_predictions),
                     tokens_per_example=seq_len)
