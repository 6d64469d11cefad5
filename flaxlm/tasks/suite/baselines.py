"""The trivial baselines a fine-tuned model must beat, each from the task's training split (the examples the model
was trained on: the held-out validation examples left out, at most --max_train_samples of them, as the scripts take
them):
  classification   the training split's most frequent class, for every example
  tagging, ner     each word's most frequent training tag (words never seen: the most frequent tag overall), as
                   run_token_classification.py computes it
  seq2seq          the source itself as the output (Nynorsk copied as Bokmål scores high)
"""
import collections

from flaxlm.tasks.suite.suite_file import script_options


def majority_labels(train_labels, n):
    """The most frequent training label, n times (ties: the first of them in sorted order)."""
    counts = collections.Counter(train_labels)
    best = max(sorted(counts), key=counts.__getitem__)
    return [best] * n


def most_frequent_tag(task):
    """The tagging task's baseline (flaxlm.tasks.tagging_metrics.MostFrequentTag: .tags(words)), from exactly the
    training split run_token_classification.py trains on: its own readers, held-out split, seed and
    max_train_samples, from the task's flags."""
    from flaxlm.data.tagged_sentences import load_sentences
    from flaxlm.tasks.tagging_metrics import MostFrequentTag
    _, source, data_args, task_args, args = script_options(task)
    sentences = load_sentences(source, task_args, data_args.validation_split_percentage, args.seed,
                               max_train_samples=data_args.max_train_samples)
    return MostFrequentTag(sentences["train"])
