"""CoNLL-U files read as tagged sentences: each sentence's words (FORM) and one column of tags.

    sentences = read_conllu("ud_bokmaal_dev.conllu", "upos")      # [(words, tags)]
    sentences = read_conllu("norne_nob_train.conllu", "misc:name")  # NorNE's entities, MISC's name=B-PER

Both layouts the Norwegian treebanks come in read alike: Universal Dependencies' (comment lines, UPOS in column 4,
XPOS in column 5) and the NDT layout of NorNE's training file (no comments; Oslo-Bergen tags in columns 4-5, so
`upos` and `xpos` name those columns there). Ten tab-separated columns per word line; multiword-token lines
(IDs 1-2) and empty nodes (IDs 1.1) are skipped, as their words appear on the lines after. A malformed line is a
UserError naming the file and line; so is a tag column the file does not have (`_` on every word, or no KEY= in
MISC). A file without any tags may be read with labeled=False (its tags are None: a test file to predict).
"""
import re

from flaxlm.errors import UserError

COLUMNS = 10
FORM, UPOS, XPOS, MISC = 1, 3, 4, 9
_WORD_ID = re.compile(r"\d+$")
_SKIPPED_ID = re.compile(r"\d+(-\d+|\.\d+)$")


def tag_reader(tag_column):
    """A function of a word line's columns -> its tag (None where the line has none), for --tag_column upos, xpos
    or misc:KEY; UserError for another value."""
    if tag_column in ("upos", "xpos"):
        index = UPOS if tag_column == "upos" else XPOS
        return lambda cols: None if cols[index] == "_" else cols[index]
    if tag_column.startswith("misc:") and len(tag_column) > len("misc:"):
        prefix = tag_column[len("misc:"):] + "="
        return lambda cols: next((item[len(prefix):] for item in cols[MISC].split("|") if item.startswith(prefix)),
                                 None)
    raise UserError(f"--tag_column {tag_column} is not a CoNLL-U tag column; use upos, xpos or misc:KEY (e.g. "
                    f"misc:name for NorNE's name=B-PER)")


def read_conllu(path, tag_column, labeled=True):
    """[(words, tags)] of the sentences of CoNLL-U file `path`, tags from tag_column (see tag_reader); with
    labeled=False a file without that column gives tags None."""
    tag_of = tag_reader(tag_column)
    sentences, words, tags, missing = [], [], [], None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                if words:
                    sentences.append((words, tags))
                words, tags = [], []
                continue
            if line.startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != COLUMNS or not (_WORD_ID.match(cols[0]) or _SKIPPED_ID.match(cols[0])):
                raise UserError(f"{path}, line {number}: not a CoNLL-U word line (expected {COLUMNS} tab-separated "
                                f"columns starting with a word ID, found {len(cols)} column(s): {line[:60]!r}); "
                                f"fix the line")
            if _SKIPPED_ID.match(cols[0]):
                continue
            tag = tag_of(cols)
            if tag is None and missing is None:
                missing = number
            words.append(cols[FORM])
            tags.append(tag)
    if words:
        sentences.append((words, tags))
    if not sentences:
        raise UserError(f"{path} holds no sentences; pass a CoNLL-U file with word lines")
    return _checked_tags(sentences, path, tag_column, missing, labeled)


def _checked_tags(sentences, path, tag_column, missing, labeled):
    """The sentences when every word has a tag; tags None when none has and labeled is False; else a UserError."""
    if missing is None:
        return sentences
    if all(t is None for _, tags in sentences for t in tags):
        if not labeled:
            return [(words, None) for words, _ in sentences]
        raise UserError(f"{path} has no tag column {tag_column} (no word has a tag there); pass the --tag_column "
                        f"the file has (upos, xpos, misc:KEY)")
    raise UserError(f"{path}, line {missing}: the word has no {tag_column} tag while others have; give every word "
                    f"a tag")
