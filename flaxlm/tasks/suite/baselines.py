"""The trivial baselines a fine-tuned model must beat, each from the task's training split (the examples the model
was trained on: the held-out validation examples left out, at most --max_train_samples of them, as the scripts take
them):
  classification   the training split's most frequent class, for every example
  tagging, ner     each word's most frequent training tag (words never seen: the most frequent tag overall)
  seq2seq          the source itself as the output (Nynorsk copied as Bokmål scores high)
"""
import collections
import json

from flaxlm.errors import UserError

CONLLU_COLUMNS = {"upos": 3, "xpos": 4}  # 0-based columns of CoNLL-U (NDT files too: FORM, then the tag columns)


def majority_labels(train_labels, n):
    """The most frequent training label, n times (ties: the first of them in sorted order)."""
    counts = collections.Counter(train_labels)
    best = max(sorted(counts), key=counts.__getitem__)
    return [best] * n


def tag_by_word(train_sentences):
    """A function word -> its most frequent tag in train_sentences ([(words, tags)]), the most frequent tag overall
    for an unseen word (ties: the first in sorted order)."""
    per_word, overall = collections.defaultdict(collections.Counter), collections.Counter()
    for words, tags in train_sentences:
        for word, tag in zip(words, tags):
            per_word[word][tag] += 1
            overall[tag] += 1
    if not overall:
        raise UserError("the training split holds no tagged words, so there is no most-frequent-tag baseline")

    def most_frequent(counts):
        return max(sorted(counts), key=counts.__getitem__)

    best = {word: most_frequent(counts) for word, counts in per_word.items()}
    fallback = most_frequent(overall)
    return lambda word: best.get(word, fallback)


def training_sentences(task, validation_sentences):
    """[(words, tags)] of a tagging task's training split: its train files' sentences less those of the validation
    predictions when the validation split was held out of them (matched by their words), at most max_train_samples."""
    sentences = [s for path in task.flags["train_file"] for s in read_tagged_file(path, task.flags.get("tag_column"))]
    if not task.flags.get("validation_file"):
        held_out = collections.Counter(tuple(words) for words in validation_sentences)
        kept = []
        for words, tags in sentences:
            if held_out[tuple(words)] > 0:
                held_out[tuple(words)] -= 1
            else:
                kept.append((words, tags))
        sentences = kept
    limit = task.flags.get("max_train_samples")
    return sentences[:int(limit)] if limit else sentences


def read_tagged_file(path, tag_column):
    """[(words, tags)] of a CoNLL-U file (UD or NorNE's NDT layout; tag_column upos, xpos or misc:KEY, upos when
    None; multi-word token and empty-node lines skipped) or of a JSON-lines file of {"tokens", "tags"}."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if path.endswith((".json", ".jsonl")):
        rows = [json.loads(line) for line in lines if line.strip()]
        return [(list(r["tokens"]), [str(t) for t in r["tags"]]) for r in rows]
    column = tag_column or "upos"
    sentences, words, tags = [], [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        cells = line.split("\t")
        if line.startswith("#") or "-" in cells[0] or "." in cells[0]:
            continue
        if len(cells) != 10:
            raise UserError(f"{path} line {n} has {len(cells)} columns, not CoNLL-U's 10")
        words.append(cells[1])
        tags.append(_tag(cells, column, path, n))
    if words:
        sentences.append((words, tags))
    return sentences


def _tag(cells, column, path, line_no):
    if column in CONLLU_COLUMNS:
        return cells[CONLLU_COLUMNS[column]]
    if column.startswith("misc:"):
        key = column[len("misc:"):]
        for item in cells[9].split("|"):
            if item.startswith(key + "="):
                return item[len(key) + 1:]
        return "O"
    raise UserError(f"tag_column {column} of {path} (line {line_no}): use upos, xpos or misc:KEY")
