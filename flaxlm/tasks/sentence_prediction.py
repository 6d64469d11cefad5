"""Sentence prediction (GLUE-style classification or regression): the task's columns and metrics, the labels of
the model's head, the objective the training loop runs, and the predictions file.

    task = resolve_task(task_args)                       # columns, regression or not, metrics (GLUE's per task)
    config, model = load_model(model_args, seed, task="sequence_classification",
                               **classifier_labels(task, names))   # flaxlm.training.pipeline: encoder + head
    objective = sentence_objective(graphdef, config, task, width, pad_id)
    write_predictions(path, task, logits, names, labels)  # index<TAB>prediction[<TAB>label]: names or numbers

The loss is the mean cross-entropy over the batch's examples (regression: the mean squared error of the single
output), as Hugging Face's *ForSequenceClassification computes it. Metrics come from scikit-learn and scipy.
"""
import dataclasses
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from flaxlm.errors import UserError
from flaxlm.training.flops import encoder_mlm_train_flops
from flaxlm.models import apply_model
from flaxlm.training.objective import Objective

# GLUE task -> (sentence1 column, sentence2 column, metrics, regression), as the GLUE benchmark scores each task
GLUE_TASKS = {
    "cola": ("sentence", None, ("matthews",), False),
    "sst2": ("sentence", None, ("accuracy",), False),
    "mrpc": ("sentence1", "sentence2", ("f1", "accuracy"), False),
    "qqp": ("question1", "question2", ("f1", "accuracy"), False),
    "stsb": ("sentence1", "sentence2", ("pearson", "spearman"), True),
    "mnli": ("premise", "hypothesis", ("accuracy",), False),
    "qnli": ("question", "sentence", ("accuracy",), False),
    "rte": ("sentence1", "sentence2", ("accuracy",), False),
    "wnli": ("sentence1", "sentence2", ("accuracy",), False),
}
CLASSIFICATION_METRICS = ("accuracy", "f1", "macro_f1", "matthews")
REGRESSION_METRICS = ("pearson", "spearman")


@dataclasses.dataclass(frozen=True)
class Task:
    name: str  # the GLUE name, or "the task" for messages
    sentence1_column: str | None  # None: 'sentence' or 'text' or the only string column
    sentence2_column: str | None
    label_column: str
    is_regression: bool
    metrics: tuple


def resolve_task(args, text_column=None):
    """The Task of the options (SentencePredictionArgs): a GLUE --task_name gives its columns, regression and
    metrics; explicit options win. text_column (--text_column) stands in for --sentence1_column."""
    glue = None
    if args.task_name is not None:
        glue = GLUE_TASKS.get(args.task_name.lower().replace("-", ""))
        if glue is None:
            raise UserError(f"--task_name {args.task_name} is not a GLUE task ({', '.join(GLUE_TASKS)}); drop it and "
                            f"give --sentence1_column / --sentence2_column / --metric yourself")
    first, second, glue_metrics, glue_regression = glue or (None, None, None, False)
    is_regression = args.is_regression or glue_regression
    if args.metric:
        metrics = tuple(m.strip().lower() for m in args.metric.split(",") if m.strip())
    else:
        metrics = glue_metrics or (("pearson",) if is_regression else ("accuracy",))
    allowed = REGRESSION_METRICS if is_regression else CLASSIFICATION_METRICS
    for m in metrics:
        if m not in allowed:
            kind = "regression" if is_regression else "classification"
            raise UserError(f"--metric {m} does not apply to {kind}; use {', '.join(allowed)} (comma-separated)")
    return Task(name=args.task_name or "the task", sentence1_column=args.sentence1_column or text_column or first,
                sentence2_column=args.sentence2_column or second, label_column=args.label_column,
                is_regression=is_regression, metrics=metrics)


def classifier_labels(task, label_names):
    """The classification head's labels for load_model (flaxlm.training.pipeline): label_names [id] -> name, or
    None for regression (1 output)."""
    return dict(id2label=None if task.is_regression else dict(enumerate(label_names)),
                num_labels=1 if task.is_regression else None,
                problem_type="regression" if task.is_regression else "single_label_classification")


def sentence_objective(graphdef, config, task, width, pad_id):
    """Objective for run_classification: batches of whole examples (rows of token_rows), one weight each."""
    def logits(params, batch, dropout_key):
        return apply_model(graphdef, params, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                           dropout_key=dropout_key)

    def loss_sums(params, batch, dropout_key):
        logits_BC, w_B = logits(params, batch, dropout_key), batch["weights"]
        if task.is_regression:
            err_B = logits_BC[:, 0] - batch["labels"]
            return {"loss_sum": jnp.sum(err_B * err_B * w_B), "weight_sum": jnp.sum(w_B)}
        logp_BC = jax.nn.log_softmax(logits_BC)
        nll_B = -jnp.take_along_axis(logp_BC, batch["labels"][:, None], axis=1)[:, 0]
        correct_B = (jnp.argmax(logits_BC, axis=-1) == batch["labels"]).astype(jnp.float32)
        return {"loss_sum": jnp.sum(nll_B * w_B), "accuracy_sum": jnp.sum(correct_B * w_B), "weight_sum": jnp.sum(w_B)}

    def predict(params, batch):
        return {"logits": logits(params, batch, None), "labels": batch["labels"]}

    def collate(rows, rng):
        return {**rows, "weights": np.ones(len(rows["labels"]), np.float32)}

    # the MLM count with one "masked" slot (the first token, the only row the last layer computes), less the
    # vocabulary projection, plus the pooler and classifier
    d, v, c = config.hidden_size, config.vocab_size, config.num_labels
    flops = encoder_mlm_train_flops(config, 1, width, 1) - 3 * 2 * d * v + 3 * 2 * d * c
    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="weights",
                     flops_per_example=flops, tokens_per_example=width, predict=predict,
                     metrics=lambda outputs: compute_metrics(task, outputs))


def predictions_of(task, logits_NC):
    """Class ids [N] (argmax), or the regression outputs [N]."""
    return logits_NC[:, 0] if task.is_regression else np.argmax(logits_NC, axis=-1)


def compute_metrics(task, outputs):
    """{metric: value} for the task's metrics, from predict's outputs over a whole split."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
    labels, preds = outputs["labels"], predictions_of(task, outputs["logits"])
    out = {}
    with warnings.catch_warnings():  # constant predictions (an untrained model): nan / 0, not a warning per eval
        warnings.simplefilter("ignore")
        for m in task.metrics:
            if m == "accuracy":
                out[m] = float(accuracy_score(labels, preds))
            elif m == "f1":  # two classes: F1 of class 1 (GLUE's MRPC/QQP); more: the mean over the classes
                binary = outputs["logits"].shape[1] == 2
                out[m] = float(f1_score(labels, preds, average="binary" if binary else "macro", zero_division=0))
            elif m == "macro_f1":  # the mean of every class's F1: NorBench's metric for NoReC_sentence
                out[m] = float(f1_score(labels, preds, labels=range(outputs["logits"].shape[1]), average="macro",
                                        zero_division=0))
            elif m == "matthews":
                out[m] = float(matthews_corrcoef(labels, preds))
            elif m == "pearson":
                out[m] = float(pearsonr(preds, labels)[0])
            elif m == "spearman":
                out[m] = float(spearmanr(preds, labels)[0])
    return out


def majority_scores(task, train_labels_N, labels_N, num_classes):
    """(class id, {metric: value}): what always predicting the training set's most frequent class scores on
    labels_N, for accuracy and the task's metrics: the baseline a fine-tuned classifier must beat."""
    majority = int(np.bincount(train_labels_N, minlength=num_classes).argmax())
    logits_NC = np.zeros((len(labels_N), num_classes), np.float32)
    logits_NC[:, majority] = 1.0
    scored = dataclasses.replace(task, metrics=tuple(dict.fromkeys(("accuracy",) + task.metrics)))
    return majority, compute_metrics(scored, {"labels": labels_N, "logits": logits_NC})


def write_predictions(path, task, logits_NC, label_names, labels_N=None):
    """index<TAB>prediction per example, in order: the class name, or the regression output; with labels_N (a
    labeled split's class ids or targets) a third column, label, the gold one."""
    def value(x):
        return f"{float(x):.6g}" if task.is_regression else label_names[int(x)]

    preds = predictions_of(task, logits_NC)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("index\tprediction\tlabel\n" if labels_N is not None else "index\tprediction\n")
        for i, p in enumerate(preds):
            f.write(f"{i}\t{value(p)}\t{value(labels_N[i])}\n" if labels_N is not None else f"{i}\t{value(p)}\n")
    os.replace(tmp, path)
