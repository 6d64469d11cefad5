"""The question-answering objective: start/end cross-entropy over each window, SQuAD EM/F1 at evaluation.

The loss of a window is the mean of the start and the end position's cross-entropy over the window's
positions, padding included, as transformers' *ForQuestionAnswering computes it; predictions never pick a padding
position, and 'accuracy' is the share of windows whose most likely start and end are both right.
Evaluation also turns the logits of every validation window into answers (flaxlm.tasks.squad_answers) and
scores them with the official exact match and F1 (flaxlm.tasks.squad_metric).
"""
import jax.numpy as jnp
import numpy as np
import optax

from flaxlm.training.flops import encoder_mlm_train_flops
from flaxlm.models import apply_model
from flaxlm.tasks.squad_answers import best_answers
from flaxlm.tasks.squad_metric import squad_scores
from flaxlm.training.objective import Objective

BATCH_KEYS = ("input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions")
MASKED = -1e9  # the logit of a padding position


def padding_masked(logits_BL, batch):
    """Start or end logits with the padding positions at MASKED: what predictions are read from."""
    return jnp.where(batch["attention_mask"] > 0, logits_BL, MASKED)


def collate(rows, rng=None):
    """The model's batch from a dict of window rows: its inputs and labels, and a weight of 1 per window."""
    batch = {k: rows[k] for k in BATCH_KEYS}
    batch["weights"] = np.ones(len(rows["input_ids"]), np.float32)
    return batch


def predicted_answers(outputs, eval_windows, qa_args):
    """{question id: answer text} from predict's outputs over every window of eval_windows = (examples, rows,
    offsets_NL2) (flaxlm.data.squad.squad_windows), with the QuestionAnsweringArgs' n_best_size, max_answer_length
    and v2.0 null threshold."""
    examples, rows, offsets_NL2 = eval_windows
    return best_answers(outputs["start_logits"], outputs["end_logits"], offsets_NL2, rows["example_index"],
                        rows["cls_index"], examples, n_best_size=qa_args.n_best_size,
                        max_answer_length=qa_args.max_answer_length, version_2=qa_args.version_2_with_negative,
                        null_score_diff_threshold=qa_args.null_score_diff_threshold)


def squad_objective(graphdef, config, seq_len, pad_id, qa_args, eval_windows=None):
    """Objective for run_qa.py. eval_windows = (examples, rows, offsets_NL2) of the validation set: its
    evaluations then report SQuAD exact match and F1 (in percent) besides the loss."""
    def logits(params, batch, dropout_key=None):
        return apply_model(graphdef, params, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                           dropout_key=dropout_key)

    def loss_sums(params, batch, dropout_key):
        start_BL, end_BL = logits(params, batch, dropout_key)
        start_pos_B, end_pos_B = batch["start_positions"], batch["end_positions"]
        ce_B = 0.5 * (optax.softmax_cross_entropy_with_integer_labels(start_BL, start_pos_B)
                      + optax.softmax_cross_entropy_with_integer_labels(end_BL, end_pos_B))
        right_B = ((padding_masked(start_BL, batch).argmax(-1) == start_pos_B)
                   & (padding_masked(end_BL, batch).argmax(-1) == end_pos_B))
        w_B = batch["weights"]
        return {"loss_sum": (ce_B * w_B).sum(), "accuracy_sum": (right_B * w_B).sum(), "weight_sum": w_B.sum()}

    def predict(params, batch):
        start_BL, end_BL = logits(params, batch)
        return {"start_logits": padding_masked(start_BL, batch), "end_logits": padding_masked(end_BL, batch)}

    def metrics(outputs):
        examples = eval_windows[0]
        return squad_scores(predicted_answers(outputs, eval_windows, qa_args), {e.id: e.answers for e in examples})

    # FLOPs: the encoder over every position (the masked-LM count with every position predicted, less its
    # vocabulary head) plus the start/end layer
    d = config.hidden_size
    mlm_head = 3 * seq_len * (2 * d * d + 2 * d * config.vocab_size)
    flops = encoder_mlm_train_flops(config, 1, seq_len, seq_len) - mlm_head + 3 * seq_len * 2 * d * 2
    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="weights",
                     flops_per_example=flops, tokens_per_example=seq_len, predict=predict,
                     metrics=metrics if eval_windows is not None else None)
