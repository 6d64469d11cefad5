"""SQuAD v1.1 / v2.0 json in, the windows the model reads out (with the start/end labels it learns).

    examples = read_squad(["train-v1.1.json"], version_2=False, split="train")
    rows, offsets_NL2 = squad_windows(examples, tokenizer, max_seq_length=384, doc_stride=128)

A SQuAD file is {"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers":
[{"text", "answer_start"}], "is_impossible"?}]}]}]}. An answer whose answer_start (a character offset
into the context) does not point at its text is skipped, and counted: the run reports how many in one
line and goes on; a file where no answer matches is an error.

Each question is tokenized with its context as a pair (question first); a context too long for one
window of max_seq_length tokens is split into several that overlap by doc_stride tokens. A window's
label is the first and last token of the answer, or the [CLS] / <s> position where the window does
not contain the whole answer (and for v2.0 questions without an answer).
"""
import dataclasses
import json
import os

import numpy as np

from flaxlm.errors import UserError

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TOKENIZE_BATCH = 1000  # examples tokenized per call


@dataclasses.dataclass
class Example:
    id: str
    question: str
    context: str
    answers: list  # every gold answer text ([] for a question without an answer)
    answer_start: int  # character offset of the answer trained on (the first gold one), -1 for none
    answer_text: str


def read_squad(paths, version_2, split="train"):
    """The questions of SQuAD json files, in file order, with the bad answers skipped (reported in one line)."""
    examples, total, bad, lost, first_bad = [], 0, 0, 0, None
    for path in paths:
        for qa, context in _questions(path):
            where = f"{path}, question {qa.get('id')!r}"
            try:
                qid, question, answers = str(qa["id"]), qa["question"], qa.get("answers") or []
                texts_starts = [(str(a["text"]), int(a["answer_start"])) for a in answers]
            except (KeyError, TypeError, ValueError) as e:
                raise UserError(f"{where} is not in SQuAD format ({_what(e)}); each question needs 'id', "
                                f"'question' and 'answers' [{{'text', 'answer_start'}}]") from None
            if qa.get("is_impossible") or not texts_starts:
                if not version_2:
                    raise UserError(f"{where} has no answer, which only SQuAD v2.0 allows; pass "
                                    f"--version_2_with_negative (or give the question an answer)")
                examples.append(Example(qid, question, context, [], -1, ""))
                continue
            good = [(t, s) for t, s in texts_starts if 0 <= s and context[s:s + len(t)] == t and t.strip()]
            total += len(texts_starts)
            bad += len(texts_starts) - len(good)
            if not good:
                lost += 1
                first_bad = first_bad or where
                continue
            if len(good) < len(texts_starts):
                first_bad = first_bad or where
            examples.append(Example(qid, question, context, [t for t, _ in good], good[0][1], good[0][0]))
    files = ", ".join(paths)
    if total and bad == total:
        raise UserError(f"none of the {total} answers in {files} matches its context: each answer_start must be "
                        f"the character offset of its text in the context (e.g. {first_bad}); fix the file")
    if bad:
        also = f", and the {lost} question(s) left without an answer" if lost else ""
        print(f"warning: {split}: skipped {bad} of {total} answers whose answer_start does not point at their "
              f"text in the context{also} (first: {first_bad})", flush=True)
    if not examples:
        raise UserError(f"no questions in {files}; pass SQuAD json files")
    return examples


def _questions(path):
    """(qa dict, context) for every question of one SQuAD json file."""
    if not os.path.isfile(path):
        raise UserError(f"SQuAD file {path} does not exist; check the path")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a UTF-8 json file ({_what(e)}); pass a SQuAD json file") from None
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise UserError(f"{path} is not a SQuAD json file: it needs a top-level 'data' list of "
                        f"{{'title', 'paragraphs': [{{'context', 'qas': [...]}}]}}")
    for i, article in enumerate(articles):
        try:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                if not isinstance(context, str):
                    raise TypeError("'context' is not a string")
                for qa in paragraph["qas"]:
                    yield qa, context
        except (KeyError, TypeError) as e:
            raise UserError(f"{path}: article {i} is not in SQuAD format ({_what(e)}); each needs 'paragraphs' "
                            f"[{{'context', 'qas'}}]") from None


def _what(e):
    return f"missing {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]


def squad_windows(examples, tokenizer, max_seq_length, doc_stride, keep_offsets=False):
    """(rows, offsets_NL2 or None) for the windows of every example, in example order.

    rows: input_ids, attention_mask, token_type_ids int32 [N, max_seq_length] (padded to it); start_positions,
    end_positions (the answer's first and last token, or cls_index), cls_index and example_index int32 [N].
    offsets_NL2 (with keep_offsets): each token's (start, end) character span in its context, -1 for the
    tokens that are not context (question, special tokens, padding): what maps predictions back to text."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("question answering needs a fast tokenizer (character offsets); pass a tokenizer saved "
                        "with tokenizer.json")
    parts = [_windows(examples[i:i + TOKENIZE_BATCH], i, tokenizer, max_seq_length, doc_stride, keep_offsets)
             for i in range(0, len(examples), TOKENIZE_BATCH)]
    cut = sum(p[2] for p in parts)
    if cut:
        print(f"warning: {cut} of {len(examples)} questions are longer than half a window ({max_seq_length // 2} "
              f"tokens) and were cut to that length", flush=True)
    rows = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}
    return rows, (np.concatenate([p[1] for p in parts]) if keep_offsets else None)


def _questions_that_fit(questions, tokenizer, max_seq_length, doc_stride):
    """(the questions, left whitespace stripped, each cut to at most half a window of tokens; how many were cut).
    UserError when doc_stride leaves a window no room to move forward (the tokenizer would abort)."""
    questions = [q.lstrip() for q in questions]
    limit = max_seq_length // 2
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    longest, cut = 0, 0
    for i, offsets in enumerate(enc["offset_mapping"]):
        if len(offsets) > limit:
            questions[i] = questions[i][:offsets[limit - 1][1]]
            cut += 1
        longest = max(longest, min(len(offsets), limit))
    room = max_seq_length - longest - tokenizer.num_special_tokens_to_add(pair=True)
    if doc_stride >= room:
        raise UserError(f"--doc_stride {doc_stride} leaves a window no room to move: a window of --max_seq_length "
                        f"{max_seq_length} tokens holds {room} context tokens next to the longest question "
                        f"({longest} tokens); use a --doc_stride below {max(room, 1)} or a larger --max_seq_length")
    return questions, cut


def _windows(examples, first, tokenizer, max_seq_length, doc_stride, keep_offsets):
    questions, cut = _questions_that_fit([e.question for e in examples], tokenizer, max_seq_length, doc_stride)
    enc = tokenizer(questions, [e.context for e in examples], truncation="only_second", max_length=max_seq_length,
                    stride=doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                    padding="max_length")
    ids_NL = np.asarray(enc["input_ids"], dtype=np.int32)
    N, L = ids_NL.shape
    sample_N = np.asarray(enc["overflow_to_sample_mapping"], dtype=np.int64)
    offsets_NL2 = np.asarray(enc["offset_mapping"], dtype=np.int32).reshape(N, L, 2)
    context_NL = np.array([[s == 1 for s in enc.sequence_ids(i)] for i in range(N)], dtype=bool).reshape(N, L)
    cls_N = np.zeros(N, np.int32)
    if tokenizer.cls_token_id is not None:
        is_cls_NL = ids_NL == tokenizer.cls_token_id
        cls_N = np.where(is_cls_NL.any(1), is_cls_NL.argmax(1), 0).astype(np.int32)

    # labels: the answer's tokens where the window's context covers all of it, else the CLS position
    start_char_N = np.array([examples[s].answer_start for s in sample_N], np.int64)
    end_char_N = start_char_N + np.array([len(examples[s].answer_text) for s in sample_N], np.int64)
    first_char_N = np.where(context_NL, offsets_NL2[..., 0], np.iinfo(np.int32).max).min(1)
    last_char_N = np.where(context_NL, offsets_NL2[..., 1], -1).max(1)
    inside_N = (start_char_N >= 0) & (first_char_N <= start_char_N) & (last_char_N >= end_char_N)
    starts_NL = context_NL & (offsets_NL2[..., 1] > start_char_N[:, None])  # tokens ending after the start
    ends_NL = context_NL & (offsets_NL2[..., 0] < end_char_N[:, None])  # tokens beginning before the end
    start_N = np.where(inside_N, starts_NL.argmax(1), cls_N)
    end_N = np.where(inside_N, L - 1 - ends_NL[:, ::-1].argmax(1), cls_N)

    rows = {"input_ids": ids_NL, "attention_mask": np.asarray(enc["attention_mask"], np.int32).reshape(N, L),
            "token_type_ids": (np.asarray(enc["token_type_ids"], np.int32).reshape(N, L) if "token_type_ids" in enc
                               else np.zeros((N, L), np.int32)),
            "start_positions": start_N.astype(np.int32), "end_positions": end_N.astype(np.int32),
            "cls_index": cls_N, "example_index": (sample_N + first).astype(np.int32)}
    offsets = np.where(context_NL[..., None], offsets_NL2, -1).astype(np.int32) if keep_offsets else None
    return rows, offsets, cut
