"""Passkey retrieval, as Landmark Attention (Mohtashami and Jaggi, 2023), LongLoRA and YaRN judge a decoder's context
extension: a five-digit number hidden at some depth of filler text, asked for at the end.

    check_lengths(lm, [1024, 4096])          # before the weights load: each fits lm.max_length and the prompt
    rows = passkey_retrieval(lm, [1024, 4096], depths=5)   # lm loaded: lm.scorer
    # [{"length", "accuracy", "trials": [{"depth", "tokens", "retrieved"}, ...]}, ...]

A trial's prompt is the task line, the filler sentences, the key line after round(depth * n) of the n filler units
(depth 0: before all of them, 1: after all), the rest of the filler and the question:

    There is an important info hidden inside ... The grass is green. ... The pass key is 48213. Remember it. 48213 is
    the pass key. The grass is green. ... What is the pass key? The pass key is

with n as large as fits: the prefix token (BOS, else EOS), the prompt and the key's tokens but the last (what the
model reads) at most `length` tokens. Each length holds `depths` trials, at depths evenly spaced from 0 to 1 (one
trial: 0.5), each its own key drawn from a generator seeded by (SEED, length, trial): the same prompts on every run
and whatever other lengths are asked for.

The key counts as retrieved when every token of " 48213" (prompt and key encoded whole, the key's tokens those past
the prompt's, as lm-eval splits a continuation) is the argmax given the prompt and the key's tokens before it
(lm.scorer's greedy flag, lm-eval's is_greedy). That is exactly when greedy decoding of that many tokens writes the
key: its k-th step, having written the key's first k - 1 tokens, sees what the teacher-forced k-th prediction sees.
One forward pass per prompt in the scorer's compiled shapes replaces the decode loop; a model that would write the
same digits in another tokenization counts as wrong.
"""
import numpy as np

SEED = 0
TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz "
        "you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


def passkey_text(key, before, after):
    """The prompt (ending in QUESTION) with `before` filler units, the key line, `after` more."""
    return " ".join([TASK, *[FILLER] * before, KEY.format(key=key), *[FILLER] * after, QUESTION])


def depths_of(depths):
    """`depths` fractions evenly spaced from 0 to 1 (one: 0.5)."""
    return [0.5] if depths == 1 else [i / (depths - 1) for i in range(depths)]


def key_for(length, trial):
    """The trial's five-digit key, the same on every run."""
    return str(np.random.default_rng([SEED, length, trial]).integers(10000, 100000))


def model_positions(config):
    """The model's positions (None: no limit, BLOOM's ALiBi)."""
    from flaxlm.models import family_of
    max_length = family_of(config).max_length
    return max_length(config) if max_length else None


def check_lengths(lm, lengths, flag="--passkey_lengths"):
    """UserError naming the fix when a length is more than the context lm reads (lm.max_length) or too short for a
    filler unit beside the task, key and question (tokenizing only: before the weights load)."""
    from flaxlm.errors import UserError
    for length in lengths:
        if length > lm.max_length:
            positions = model_positions(lm.config)
            fix = (f"pass --max_length {length}" if positions is None or length <= positions else
                   f"the model has {positions} positions: use lengths up to {positions}, or extend its context first")
            raise UserError(f"{flag} {length} is more than the {lm.max_length} tokens of context evaluated "
                            f"(--max_length); {fix}")
    for length in lengths:
        passkey_request(lm, length, 0.0, key_for(length, 0), flag)


def encoded(lm, prompt, key):
    """(ids, first): the prefix token, prompt and " key" encoded whole, the key's tokens those past the prompt's
    (lm-eval's split of a continuation; the prompt ends in a word, so the space goes with the key)."""
    whole = [lm.prefix] + lm.encode(f"{prompt} {key}")
    return whole, 1 + len(lm.encode(prompt))


def passkey_request(lm, length, depth, key, flag="--passkey_lengths"):
    """((ids, first) for lm.scorer, the model reading at most `length` tokens of ids: all but the last), the filler
    units before the key, and those in all. UserError when not even one filler unit fits."""
    from flaxlm.errors import UserError

    def request(units):
        before = int(depth * units + 0.5)
        ids, first = encoded(lm, passkey_text(key, before, units - before), key)
        return (ids, first), before, len(ids) - 1

    fixed, one = request(0)[2], request(1)[2]
    unit = max(one - fixed, 1)
    if one > length:
        raise UserError(f"{flag} {length} leaves no room for the filler: the task, key and question take {fixed} "
                        f"tokens and a filler unit {unit}; use lengths of at least {one}")
    # The tokens grow by about `unit` a filler unit: from the estimate, down while too long, then up while it fits.
    units = max((length - fixed) // unit, 1)
    while units > 1 and (tokens := request(units)[2]) > length:
        units = max(units - -(-(tokens - length) // unit), 1)
    while request(units + 1)[2] <= length:
        units += 1
    found, before, _ = request(units)
    return found, before, units


def passkey_retrieval(lm, lengths, depths=5):
    """Per length: {"length", "accuracy" (the share of its trials retrieved), "trials": [{"depth", "tokens" (that the
    model reads), "retrieved"}]}. lm: a loaded CausalLM (its encode, prefix, max_length and scorer)."""
    check_lengths(lm, lengths)
    lengths = list(dict.fromkeys(lengths))  # a length asked twice: its trials once
    requests, trials = [], []
    for length in lengths:
        for t, depth in enumerate(depths_of(depths)):
            (ids, first), _, _ = passkey_request(lm, length, depth, key_for(length, t))
            requests.append((ids, first))
            trials.append((length, {"depth": depth, "tokens": len(ids) - 1}))
    _, greedy = lm.scorer(requests)
    rows = []
    for length in lengths:
        mine = [dict(trial, retrieved=bool(g)) for (at, trial), g in zip(trials, greedy) if at == length]
        rows.append({"length": length, "accuracy": sum(t["retrieved"] for t in mine) / len(mine), "trials": mine})
    return rows
