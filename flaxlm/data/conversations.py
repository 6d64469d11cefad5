"""Supervised fine-tuning data in TRL's dataset formats, read and checked (run_sft.py):

    messages              [{"role": "system" | "user" | "assistant", "content": str}, ...]: a conversation
    prompt + completion   strings (the completion follows the prompt as text), or message lists (the prompt's turns,
                          then the completion's assistant turn)
    text                  plain text

    examples = load_conversations(source, 5, seed=42)       # {split: [Example]}

Files as flaxlm.data.sentence_data reads them (json, jsonl, parquet, csv; or --dataset_name). An example that cannot
be trained on is one line naming its split, index and fix: an unknown role, roles out of order (an optional system
turn, then user and assistant by turns), no assistant turn, an empty answer.
"""
import dataclasses

from flaxlm.data.sentence_data import read_splits
from flaxlm.errors import UserError

ROLES = ("system", "user", "assistant")


@dataclasses.dataclass(frozen=True)
class Example:
    messages: list | None = None  # a conversation (from messages, or a prompt and completion given as messages)
    answers_from: int = 0  # the first message whose assistant turns are trained on (a prompt's own are not)
    prompt: str | None = None  # a prompt and completion given as text
    completion: str | None = None
    text: str | None = None


def load_conversations(source, validation_split_percentage, seed, max_train_samples=None, max_eval_samples=None,
                       need_validation=True):
    """{"train", "validation": [Example]}; without a validation set, validation_split_percentage % of train is held
    out (seeded), and a percentage of 0 with need_validation False (--do_eval false) gives no "validation"."""
    return load_records(source, validation_split_percentage, seed, max_train_samples, max_eval_samples,
                        "supervised fine-tuning", "example", example, need_validation)


RECORD = "__flaxlm_record__"  # the column read_splits numbers the records in


def load_records(source, validation_split_percentage, seed, max_train_samples, max_eval_samples, what, noun, read,
                 need_validation=True):
    """{split: [read(record, "NOUN n of WHERE")]} of a post-training task's files (`what`, for messages), n the
    record's number in the user's file or dataset (from 1; a held-out one's in the training files); no "validation"
    without a validation set, a percentage of 0 and need_validation (sentence_data.read_splits)."""
    splits, where = read_splits(source, validation_split_percentage, seed, False, max_train_samples,
                                max_eval_samples, what, need_validation, record_column=RECORD)
    return {split: [read({k: v for k, v in record.items() if k != RECORD}, f"{noun} {record[RECORD]} of {where[split]}")
                    for record in ds] for split, ds in splits.items()}


def example(record, where):
    """One record as an Example; a UserError naming `where` when it is not one of TRL's formats or cannot train."""
    if record.get("messages") is not None:
        return Example(messages=conversation(record["messages"], where, "messages"))
    if record.get("prompt") is not None or record.get("completion") is not None:
        prompt, completion = record.get("prompt"), record.get("completion")
        if isinstance(prompt, str) and isinstance(completion, str):
            if not completion.strip():
                raise UserError(f"{where} has an empty completion; fill it in or drop the example")
            return Example(prompt=prompt, completion=completion)
        if isinstance(prompt, list) and isinstance(completion, list):
            return Example(messages=conversation(prompt + completion, where, "prompt + completion"),
                           answers_from=len(prompt))
        raise UserError(f"{where} needs a prompt and a completion of one kind, two strings or two lists of "
                        f"messages (found {type(prompt).__name__} and {type(completion).__name__})")
    if isinstance(record.get("text"), str):
        if not record["text"].strip():
            raise UserError(f"{where} has an empty text; fill it in or drop the example")
        return Example(text=record["text"])
    raise UserError(f"{where} has none of TRL's fields (columns: {', '.join(record)}); give each example 'messages' "
                    f"(a list of {{role, content}}), 'prompt' and 'completion', or 'text'")


def conversation(messages, where, field):
    """The messages as [{"role", "content"}], checked: a system turn first at most, then user and assistant by
    turns, ending with an assistant turn, no answer empty."""
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: '{field}' is not a non-empty list of messages")
    out = checked_messages(messages, where, field)
    turns = out[1:] if out[0]["role"] == "system" else out
    expected = ["user", "assistant"] * len(turns)
    wrong = next((k for k, m in enumerate(turns) if m["role"] != expected[k]), None)
    if wrong is not None:
        k = wrong + len(out) - len(turns)
        raise UserError(f"{where}: message {k} is a {out[k]['role']} turn where a {expected[wrong]} turn belongs "
                        f"(a system turn first at most, then user and assistant by turns); fix the order")
    if not turns or turns[-1]["role"] != "assistant":
        raise UserError(f"{where} has no assistant turn at its end to learn from; end each conversation with the "
                        f"answer")
    empty = next((k for k, m in enumerate(out) if m["role"] == "assistant" and not m["content"].strip()), None)
    if empty is not None:
        raise UserError(f"{where}: message {empty} is an empty assistant answer; fill it in or drop the example")
    return out


def checked_messages(messages, where, field):
    """The messages as [{"role", "content"}]: UserError for one without a known role or a text content."""
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise UserError(f"{where}: message {k} of '{field}' needs a 'role' and a text 'content' (found {m!r})")
        if m["role"] not in ROLES:
            raise UserError(f"{where}: message {k} has the unknown role '{m['role']}'; use {', '.join(ROLES)}")
        out.append({"role": m["role"], "content": m["content"]})
    return out
