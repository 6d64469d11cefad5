"""Prompts for GRPO (run_grpo.py) in TRL's formats, read, checked and tokenized as TRL's GRPOTrainer does:

    prompt      a string (the completion follows it as text), or a list of messages [{"role", "content"}] (the
                completion is the assistant's answer after them)
    any other   kept in Prompt.columns and handed to the reward functions by name (an `answer` column, say)

    prompts = load_prompts(source, 5, seed=42)                       # {split: [Prompt]}
    ids = encode_prompt(tokenizer, template, prompts["train"][0].prompt)
    completions = decode_completions(tokenizer, [p.prompt for p in batch], completion_ids)

A message list is rendered with the chat template and its generation prompt and tokenized without special tokens (the
template writes its own); a string prompt is tokenized as the tokenizer does by default (its BOS, if it adds one).
Reward functions see the prompts as they are in the data and the completions as text, or for message-list prompts
as [{"role": "assistant", "content": text}] (TRL's conversational completions).
"""
import dataclasses

from flaxlm.data.chat_template import render
from flaxlm.data.conversations import checked_messages, load_records
from flaxlm.data.preferences import text_ids
from flaxlm.errors import UserError

# What TRL's GRPOTrainer passes under its own names, so never as a dataset column
RESERVED = ("prompt", "completion", "completion_ids")


@dataclasses.dataclass(frozen=True)
class Prompt:
    prompt: str | list  # text, or messages
    columns: dict  # the record's other columns (not prompt, completion, completion_ids), for the reward functions


def load_prompts(source, validation_split_percentage, seed, max_train_samples=None, max_eval_samples=None,
                 need_validation=True):
    """{"train", "validation": [Prompt]}; without a validation set, validation_split_percentage % of train is held
    out (seeded), and a percentage of 0 with need_validation False (--do_eval false) gives no "validation"."""
    return load_records(source, validation_split_percentage, seed, max_train_samples, max_eval_samples,
                        "GRPO", "prompt", prompt_record, need_validation)


def prompt_record(record, where):
    """One record as a Prompt; a UserError naming `where` when its prompt is missing or not one of TRL's formats."""
    prompt = record.get("prompt")
    columns = {k: v for k, v in record.items() if k not in RESERVED}
    if isinstance(prompt, str):
        if not prompt.strip():
            raise UserError(f"{where} has an empty prompt; fill it in or drop the record")
        return Prompt(prompt, columns)
    if isinstance(prompt, list) and prompt:
        return Prompt(checked_messages(prompt, where, "prompt"), columns)
    if prompt is None:
        given = ", ".join(k for k, v in record.items() if v is not None)  # a JSON file's other rows add columns
        raise UserError(f"{where} has no 'prompt' (its fields: {given}); give each record a 'prompt': a "
                        f"string or a list of {{role, content}} messages")
    raise UserError(f"{where}: its 'prompt' is a {type(prompt).__name__}{' (empty)' if prompt == [] else ''}; make it "
                    f"a string or a non-empty list of {{role, content}} messages")


def encode_prompt(tokenizer, template, prompt):
    """The prompt's token ids as TRL's GRPOTrainer gives them to generation: messages rendered with the generation
    prompt, no special tokens added; a string tokenized with the tokenizer's default special tokens."""
    return text_ids(tokenizer, template, prompt, generation_prompt=True)


def prompt_text(tokenizer, template, prompt):
    """The text the model continues: a string prompt itself, messages rendered with the generation prompt (for
    logging completions; reward functions get the prompt as it is in the data)."""
    return prompt if isinstance(prompt, str) else render(tokenizer, template, prompt, add_generation_prompt=True)


def decode_completions(tokenizer, prompts, completion_ids):
    """Each completion as TRL hands it to reward functions: its ids decoded without special tokens, as text after a
    string prompt or as [{"role": "assistant", "content": text}] after messages."""
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return [text if isinstance(p, str) else [{"role": "assistant", "content": text}] for p, text in zip(prompts, texts)]
