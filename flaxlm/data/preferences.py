"""Preference pairs for DPO (run_dpo.py) in TRL's formats, read, checked and tokenized as TRL's DPOTrainer does:

    prompt + chosen + rejected   strings (each answer follows the prompt as text, eos appended), or message lists
                                 (the prompt's turns, then each answer's assistant turn)
    chosen + rejected            two conversations; their shared beginning is the prompt (TRL's extract_prompt)

    pairs = load_pairs(source, 5, seed=42)                         # {split: [Pair]}
    rows = pair_rows([encode_pair(tokenizer, template, p) for p in pairs["train"]], 1024, pad_id)

A pair's tokens: the prompt (rendered with the generation prompt) and each answer after it, the answer starting where
the prompt tokenized alone and prompt + answer stop matching; each sequence cut to --max_length from its end (TRL's
keep_start), after --max_prompt_length cut the prompt from its start. Rows hold the chosen and the rejected sequence
of each pair and which of their tokens are the answer's: the log-probabilities count those only.
"""
import dataclasses

import numpy as np

from flaxlm.data.chat_rows import common_prefix
from flaxlm.data.chat_template import render
from flaxlm.data.conversations import conversation, load_records
from flaxlm.errors import UserError


@dataclasses.dataclass(frozen=True)
class Pair:
    prompt: str | list  # text, or messages
    chosen: str | list  # text, or the assistant messages after the prompt
    rejected: str | list


def load_pairs(source, validation_split_percentage, seed, max_train_samples=None, max_eval_samples=None,
               need_validation=True):
    """{"train", "validation": [Pair]}; without a validation set, validation_split_percentage % of train is held
    out (seeded), and a percentage of 0 with need_validation False (--do_eval false) gives no "validation"."""
    return load_records(source, validation_split_percentage, seed, max_train_samples, max_eval_samples,
                        "preference tuning", "pair", pair, need_validation)


def pair(record, where):
    """One record as a Pair; a UserError naming `where` when it is not one of TRL's formats or cannot train."""
    chosen, rejected, prompt = record.get("chosen"), record.get("rejected"), record.get("prompt")
    if chosen is None or rejected is None:
        raise UserError(f"{where} needs 'chosen' and 'rejected' (and 'prompt', unless both answers are whole "
                        f"conversations); columns: {', '.join(record)}")
    if prompt is None and isinstance(chosen, list) and isinstance(rejected, list):
        shared = next((k for k, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
    if isinstance(prompt, str) and isinstance(chosen, str) and isinstance(rejected, str):
        for name, answer in (("chosen", chosen), ("rejected", rejected)):
            if not answer.strip():
                raise UserError(f"{where} has an empty {name} answer; fill it in or drop the pair")
    elif all(isinstance(x, list) for x in (prompt, chosen, rejected)):
        for name, answer in (("chosen", chosen), ("rejected", rejected)):
            if not answer:
                raise UserError(f"{where} has no {name} answer after the prompt; fill it in or drop the pair")
            conversation(prompt + answer, where, f"prompt + {name}")
    else:
        raise UserError(f"{where} needs a prompt and two answers of one kind: three strings, or message lists")
    if chosen == rejected:
        raise UserError(f"{where}: its chosen and rejected answers are the same, which teaches nothing; drop the pair")
    return Pair(prompt, chosen, rejected)


def text_ids(tokenizer, template, messages_or_text, generation_prompt=False):
    """Token ids of a text (the tokenizer's special tokens added) or of messages rendered with the chat template (with
    the generation prompt if asked; none added: the template places its own)."""
    if isinstance(messages_or_text, str):
        return tokenizer(messages_or_text, verbose=False)["input_ids"]
    return tokenizer(render(tokenizer, template, messages_or_text, generation_prompt), add_special_tokens=False,
                     verbose=False)["input_ids"]


def encode_pair(tokenizer, template, p):
    """(prompt ids, chosen ids, rejected ids), as TRL's DPOTrainer tokenizes a pair (text answers end with eos)."""
    eos = tokenizer.eos_token or ""
    if isinstance(p.prompt, str):
        chosen, rejected = p.prompt + _eos(p.chosen, eos), p.prompt + _eos(p.rejected, eos)
    else:
        chosen, rejected = p.prompt + p.chosen, p.prompt + p.rejected
    prompt_ids = text_ids(tokenizer, template, p.prompt, generation_prompt=True)
    chosen_ids, rejected_ids = text_ids(tokenizer, template, chosen), text_ids(tokenizer, template, rejected)
    n = min(common_prefix(prompt_ids, chosen_ids), common_prefix(prompt_ids, rejected_ids))
    return prompt_ids[:n], chosen_ids[n:], rejected_ids[n:]


def _eos(text, eos):
    return text if text.endswith(eos) else text + eos


def pair_rows(encoded, max_length, pad_id, max_prompt_length=None, where="pair"):
    """{"chosen_ids", "chosen_answer", "rejected_ids", "rejected_answer": int32 [N, max_length]}: each pair's two
    sequences, padded, and 1 on their answer tokens. A pair whose prompt leaves no answer token within max_length
    is one line (TRL drops such pairs silently)."""
    out = {k: [] for k in ("chosen_ids", "chosen_answer", "rejected_ids", "rejected_answer")}
    for i, (prompt, chosen, rejected) in enumerate(encoded):
        if max_prompt_length is not None:
            prompt = prompt[-max_prompt_length:]
        if len(prompt) >= max_length:
            raise UserError(f"{where} {i}: its prompt of {len(prompt)} tokens fills --max_length {max_length}, leaving "
                            f"nothing of its answers; raise --max_length, set --max_prompt_length, or drop the pair")
        for name, answer in (("chosen", chosen), ("rejected", rejected)):
            ids = (list(prompt) + list(answer))[:max_length]
            mask = ([0] * len(prompt) + [1] * len(answer))[:max_length]
            out[f"{name}_ids"].append(ids + [pad_id] * (max_length - len(ids)))
            out[f"{name}_answer"].append(mask + [0] * (max_length - len(mask)))
    return {k: np.asarray(v, np.int32) for k, v in out.items()}


def placeholder_pairs(max_length, vocab_size, n=8):
    """Pair rows shaped as pair_rows gives them, the reference's figures zero, for --compile_for."""
    rng = np.random.default_rng(0)
    half = max_length // 2
    encoded = [(list(rng.integers(8, vocab_size, half)), list(rng.integers(8, vocab_size, max_length - half)),
                list(rng.integers(8, vocab_size, max_length - half))) for _ in range(n)]
    rows = pair_rows(encoded, max_length, 0)
    return {**rows, "ref_chosen": np.zeros(n, np.float32), "ref_rejected": np.zeros(n, np.float32)}
