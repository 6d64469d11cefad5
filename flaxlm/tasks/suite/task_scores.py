"""A finished task's score and baseline, from the predictions file its script wrote into its output folder."""
import json
import os

from flaxlm.errors import UserError
from flaxlm.tasks.suite import baselines, scores
from flaxlm.tasks.suite.suite_file import KINDS, script_options

BASELINE_DIR = "baseline"  # a bits_per_byte task's folder: --baseline_model's run of the same text


def score_task(task, task_dir):
    """(Scored of the task's metric on its validation examples, the baseline's score or None)."""
    path = os.path.join(task_dir, KINDS[task.kind].predictions)
    if not os.path.isfile(path):
        raise UserError(f"the run wrote no {KINDS[task.kind].predictions} into {task_dir}")
    if task.kind == "classification":
        return _classification(task, path)
    if task.kind in ("tagging", "ner"):
        return _tagging(task, path)
    if task.kind in ("seq2seq", "generate"):
        return _seq2seq(task, path)
    if task.kind == "choice":
        return _choice(task, path)
    if task.kind == "bits_per_byte":
        return _bits_per_byte(task_dir, path)
    return _qa(task, path), None


def _choice(task, path):
    """The few-shot answers' score, and the baseline of the training split's majority label (run_fewshot.py's
    reader and split, from the task's flags)."""
    from flaxlm.data.sentence_data import read_splits
    rows = scores.read_json_lines(path, ("gold", "prediction"), "run_fewshot.py's choices")
    golds, preds = [str(r["gold"]) for r in rows], [str(r["prediction"]) for r in rows]
    args, source = script_options(task)
    classes = list(json.loads(args.choices)) if args.choices else sorted(set(golds))
    splits, _ = read_splits(source, args.validation_split_percentage, args.seed, False, args.max_train_samples,
                            args.max_eval_samples, task.name)
    baseline = baselines.majority_labels([str(x) for x in splits["train"][args.label_column]], len(golds))
    return (scores.class_scored(golds, preds, classes, task.metric),
            scores.class_scored(golds, baseline, classes, task.metric).value)


def _bits_per_byte(task_dir, path):
    """Bits per byte of the documents, and those of --baseline_model's run beside it (BASELINE_DIR) if any."""
    documents = scores.read_json_lines(path, ("log_likelihood", "bytes"), "evaluate_lm.py's documents")
    baseline_file = os.path.join(task_dir, BASELINE_DIR, os.path.basename(path))
    baseline = None
    if os.path.isfile(baseline_file):
        baseline = scores.bits_per_byte_scored(
            scores.read_json_lines(baseline_file, ("log_likelihood", "bytes"), "the baseline model's documents")).value
    return scores.bits_per_byte_scored(documents), baseline


def _seq2seq(task, path):
    """The predictions' score, and the baseline of copying the source (as run_seq2seq.py writes it: unprefixed)."""
    rows = scores.read_generated_predictions(path)
    refs = [r["reference"] for r in rows]
    return (scores.generation_scored([r["prediction"] for r in rows], refs, task.metric),
            scores.generation_scored([r["source"] for r in rows], refs, task.metric).value)


def _classification(task, path):
    golds, preds = scores.read_label_predictions(path)
    train_labels, names = classification_training(task)
    baseline = baselines.majority_labels(train_labels, len(golds))
    return (scores.class_scored(golds, preds, names, task.metric),
            scores.class_scored(golds, baseline, names, task.metric).value)


def _tagging(task, path):
    sentences = scores.read_tagged_predictions(path)
    words = [[w for w, _, _ in s] for s in sentences]
    golds = [[g for _, g, _ in s] for s in sentences]
    preds = [[p for _, _, p in s] for s in sentences]
    tagger = baselines.most_frequent_tag(task)
    baseline = [tagger.tags(ws) for ws in words]
    if task.kind == "tagging":
        return scores.tag_accuracy_scored(golds, preds), scores.tag_accuracy_scored(golds, baseline).value
    return (scores.entity_scored(golds, preds, task.metric),
            scores.entity_scored(golds, baseline, task.metric).value)


def _qa(task, path):
    from flaxlm.data.squad import read_squad
    try:
        with open(path, encoding="utf-8") as f:
            predictions = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the answers in {path} ({e})") from None
    _, source, data_args, qa_args, _ = script_options(task)  # as run_qa.py reads them
    questions = read_squad(source.validation_file, qa_args.version_2_with_negative, "validation")
    references = {q.id: q.answers for q in questions[:data_args.max_eval_samples]}
    return scores.squad_scored(predictions, references, task.metric)


def classification_training(task):
    """(the training split's labels, the class names), read by run_classification.py's own code from the task's
    flags (files, columns, held-out validation split, max_train_samples)."""
    from flaxlm.data.sentence_data import label_ids, label_names, load_examples
    from flaxlm.tasks.sentence_prediction import resolve_task
    _, source, data_args, task_args, args = script_options(task)
    examples = load_examples(source, resolve_task(task_args, source.text_column), data_args.validation_split_percentage,
                             args.seed, max_train_samples=data_args.max_train_samples)
    names = label_names(examples["train"])
    return [names[i] for i in label_ids(examples["train"], names)], names
