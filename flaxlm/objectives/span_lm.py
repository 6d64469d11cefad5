"""The T5 span-corruption objective: loss and accuracy over the real target tokens, plus its lengths."""
from flaxlm.errors import UserError
from flaxlm.training.flops import encoder_decoder_train_flops
from flaxlm.objectives.lm_loss import head_loss_sums
from flaxlm.models import apply_hidden
from flaxlm.training.objective import Objective

MAX_INPUT_LENGTH = 512  # default --max_seq_length when the tokenizer allows more (relative positions have no limit)


def resolve_input_length(requested, tokenizer):
    """--max_seq_length: the encoder's input length (the corpus chunks are longer, see t5_lengths)."""
    if requested is None:
        return min(tokenizer.model_max_length, MAX_INPUT_LENGTH)
    return requested  # t5_lengths says when it is too short


def check_decoder_start(config):
    if config.decoder_start_token_id is None:
        raise UserError("config.json has no decoder_start_token_id; set it (T5 uses the pad id, 0) with "
                        "create_config.py --set decoder_start_token_id=0")


def span_objective(graphdef, config, corruptor, head_chunk_rows=None, z_loss=0.0):
    """Objective for run_t5_mlm_flax: the collator is a SpanCorruptor; decoder inputs are the targets
    shifted right; targets of padding rows and padded positions weigh nothing. The LM head is fused with
    the cross-entropy (flaxlm.objectives.lm_loss; z_loss: --z_loss)."""
    def loss_sums(params, batch, dropout_key):
        h_BTD, head = apply_hidden(graphdef, params, batch["input_ids"], batch["attention_mask"],
                                   batch["decoder_input_ids"], dropout_key=dropout_key)
        return head_loss_sums(h_BTD, head, batch["labels"], batch["label_weights"], head_chunk_rows, z_loss)

    flops = encoder_decoder_train_flops(config, 1, corruptor.inputs_length, corruptor.targets_length)
    return Objective(loss_sums=loss_sums, collate=corruptor, pad_id=corruptor.pad_token_id,
                     weights_key="label_weights", flops_per_example=flops,
                     tokens_per_example=corruptor.inputs_length)
