"""Reward functions for GRPO (run_grpo.py), with TRL's signature, loaded by name and scored over a batch:

    funcs = load_reward_funcs(["token_f1", "rewards.py:brevity"], weights=[1.0, 0.5],
                              options=BuiltInOptions(answer_column="answer"))
    rewards_NF = score(funcs, prompts, completions, completion_ids, columns)   # float32, NaN where None

A reward function is called as TRL's GRPOTrainer calls it, once per batch of N completions:

    f(prompts=[...], completions=[...], completion_ids=[[int]], trainer_state=..., **columns) -> [float | None] * N

prompts as in the data (strings or message lists), completions as text or [{"role": "assistant", "content": text}]
(flaxlm.data.prompts.decode_completions), completion_ids each completion's tokens up to and with the one that ended
it (no padding), every other dataset column by its name as a list of N values, and trainer_state (when the caller
gives one; TRL's has global_step and max_steps). None means "does not apply to this completion".

A spec is a built-in name, FILE.py:FUNCTION (the file run as a module, as a TRL user writes one), or a dotted
module.function (as `trl grpo --reward_funcs` takes it). Its name, in the metrics rewards/NAME/mean, is the built-in's
name or the function's __name__ (TRL's). The built-ins, their options the fields of BuiltInOptions:

    exact_match   1 if the answer equals one of the gold answers, else 0 (SQuAD's normalization: case, punctuation,
    token_f1      the best SQuAD token-overlap F1 against the gold answers           articles and spaces ignored)
                  the answer: the text of the completion's last <answer>...</answer> block, else the whole completion;
                  the gold answers: column answer_column, a string, a list of them, or SQuAD's {"text": [...]}; a
                  record whose gold answer is None gets None
    format        1 if the regular expression format_pattern is found in the completion (re.search, DOTALL), else 0
    length        TRL's soft overlong punishment (DAPO): 0 up to max_completion_length - soft_punish_cache tokens,
                  then falling linearly to -1 at max_completion_length, -1 beyond
"""
import dataclasses
import functools
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable

import numpy as np

from flaxlm.errors import UserError
from flaxlm.tasks import squad_metric

ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class RewardFunc:
    name: str  # in the metrics: rewards/NAME/mean
    fn: Callable  # f(prompts, completions, completion_ids, **columns) -> [float | None]
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class BuiltInOptions:
    answer_column: str = "answer"  # exact_match, token_f1: the gold answers' column
    format_pattern: str = r"<answer>.*?</answer>"  # format: what a completion should hold
    max_completion_length: int = 256  # length: the most tokens a completion may have
    soft_punish_cache: int = 64  # length: tokens before max_completion_length where the penalty starts


def completion_text(completion):
    """A completion's text: the string, or the content of a conversational completion's (last) message."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def answer_of(completion):
    """What exact_match and token_f1 score: the last <answer>...</answer> block's text, else the whole completion."""
    text = completion_text(completion)
    blocks = ANSWER_BLOCK.findall(text)
    return blocks[-1] if blocks else text


def gold_texts(answers):
    """The gold answers of a record: a string, a list of strings, or SQuAD's {"text": [...], ...}."""
    if isinstance(answers, dict):
        answers = answers.get("text", [])
    return [answers] if isinstance(answers, str) else list(answers)


def _no_answer_column(name, answer_column, columns):
    return UserError(f"the reward {name} needs the column '{answer_column}' in the data (columns: "
                     f"{', '.join(columns) or 'none'}); add it or pass --answer_column")


def _answer_reward(name, metric, completions, answer_column, **columns):
    if answer_column not in columns:
        data = [k for k in columns if k not in ("completion_ids", "trainer_state")]
        raise _no_answer_column(name, answer_column, data)
    out = []
    for completion, answers in zip(completions, columns[answer_column]):
        if answers is None:
            out.append(None)
            continue
        golds = squad_metric.gold_answers(gold_texts(answers))
        out.append(max(metric(answer_of(completion), g) for g in golds))
    return out


ANSWER_REWARDS = ("exact_match", "token_f1")  # the built-ins that score a completion against the data's answer


def check_answer_column(rewards, prompts, answer_column):
    """UserError before any work when a reward that scores against the answer finds no record with its column
    (prompts: {split: [Prompt]})."""
    needs = [f.name for f in rewards if f.name in ANSWER_REWARDS]
    records = [p for ps in prompts.values() for p in ps]
    if needs and records and not any(answer_column in p.columns for p in records):
        raise _no_answer_column(needs[0], answer_column, sorted({k for p in records for k in p.columns}))


def exact_match(prompts, completions, answer_column="answer", **columns):
    return _answer_reward("exact_match", squad_metric.exact_match, completions, answer_column, **columns)


def token_f1(prompts, completions, answer_column="answer", **columns):
    return _answer_reward("token_f1", squad_metric.f1, completions, answer_column, **columns)


def format_reward(prompts, completions, pattern, **columns):
    return [float(pattern.search(completion_text(c)) is not None) for c in completions]


def length_reward(completion_ids, max_completion_length, soft_punish_cache, **columns):
    """TRL's get_soft_overlong_punishment(max_completion_length, soft_punish_cache), the same cases."""
    start = max_completion_length - soft_punish_cache
    return [0.0 if len(ids) <= start else (start - len(ids)) / soft_punish_cache
            if len(ids) <= max_completion_length else -1.0 for ids in completion_ids]


def built_in(name, options):
    """The built-in reward `name` with its options bound, or None if there is none of that name."""
    if name in ("exact_match", "token_f1"):
        fn = exact_match if name == "exact_match" else token_f1
        return functools.partial(fn, answer_column=options.answer_column)
    if name == "format":
        try:
            pattern = re.compile(options.format_pattern, re.DOTALL)
        except re.error as e:
            raise UserError(f"--reward_format_pattern {options.format_pattern!r} is not a regular expression "
                            f"({e}); fix it") from None
        return functools.partial(format_reward, pattern=pattern)
    if name == "length":
        if not 0 <= options.soft_punish_cache <= options.max_completion_length:
            raise UserError(f"the length reward's --soft_punish_cache {options.soft_punish_cache} is not between 0 "
                            f"and --max_completion_length {options.max_completion_length}; lower it")
        return functools.partial(length_reward, max_completion_length=options.max_completion_length,
                                 soft_punish_cache=options.soft_punish_cache)
    return None


BUILT_INS = ("exact_match", "token_f1", "format", "length")


def load_reward_funcs(specs, weights=None, options=None):
    """[RewardFunc] of the specs (built-in names, FILE.py:FUNCTION, module.function), each with its weight (1 by
    default); the built-ins take their options from `options` (BuiltInOptions)."""
    options = options or BuiltInOptions()
    if not specs:
        raise UserError(f"no reward functions; pass --reward_funcs with built-ins ({', '.join(BUILT_INS)}) or "
                        f"FILE.py:FUNCTION")
    if weights is not None and len(weights) != len(specs):
        raise UserError(f"--reward_weights gives {len(weights)} weights for {len(specs)} reward functions "
                        f"({', '.join(specs)}); give one weight per function")
    funcs = []
    for spec, weight in zip(specs, weights if weights is not None else [1.0] * len(specs)):
        fn = built_in(spec, options)
        name = spec if fn is not None else None
        if fn is None:
            fn = _load_user_function(spec)
            name = _callable_name(fn)
        if name in [f.name for f in funcs]:
            raise UserError(f"two reward functions are named '{name}' (--reward_funcs {' '.join(specs)}); their "
                            f"metrics would mix: rename one")
        funcs.append(RewardFunc(name, fn, float(weight)))
    return funcs


def _callable_name(fn):
    """TRL's name of a reward function: a partial's function's, a function's __name__, else its class's name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _load_user_function(spec):
    """The callable of FILE.py:FUNCTION or module.function; a UserError naming the spec and the fix."""
    if ":" in spec:
        path, attr = spec.rsplit(":", 1)
        if not os.path.isfile(path):
            raise UserError(f"--reward_funcs {spec}: no file {path}; give FILE.py:FUNCTION with an existing file")
        module = _run_module(spec, path)
    elif "." in spec:
        module_name, attr = spec.rsplit(".", 1)
        module = _run_module(spec, None, module_name)
    else:
        raise UserError(f"--reward_funcs {spec}: no built-in reward of that name; use one of "
                        f"{', '.join(BUILT_INS)}, FILE.py:FUNCTION or module.function")
    fn = getattr(module, attr, None)
    if fn is None:
        defined = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise UserError(f"--reward_funcs {spec}: no '{attr}' in it (callables there: {', '.join(defined) or 'none'}); "
                        f"name the reward function after the colon")
    if not callable(fn):
        raise UserError(f"--reward_funcs {spec}: '{attr}' is a {type(fn).__name__}, not a function; name a function "
                        f"f(prompts, completions, **kwargs) -> list of floats")
    return fn


def _run_module(spec, path, module_name=None):
    """The module of a reward file (its folder importable while it runs, as `python FILE.py` has it) or of a module
    name (the working directory importable, as `trl grpo` has it)."""
    folder = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
    sys.path.insert(0, folder)
    try:
        if path is None:
            return importlib.import_module(module_name)
        name = f"_flaxlm_reward_{os.path.splitext(os.path.basename(path))[0]}"
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
        sys.modules[name] = module  # as an import has it: a dataclass or pickle in the file looks itself up there
        module.__spec__.loader.exec_module(module)
        return module
    except Exception as e:  # noqa: BLE001 -- the user's file: its error, in one line
        raise UserError(f"--reward_funcs {spec}: loading it failed with {_one_line(e)}; fix the file") from None
    finally:
        sys.path.remove(folder)


def _one_line(error, limit=200):
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _show(prompt, limit=80):
    """A prompt in a message: its text (a message list's last message), repr'd on one line, cut to ~limit."""
    text = repr(prompt if isinstance(prompt, str) else (prompt[-1].get("content") if prompt else ""))
    return text if len(text) <= limit else text[:limit - 4] + "...'"


def score(funcs, prompts, completions, completion_ids, columns, trainer_state=None):
    """float32 [N, F]: reward function f's reward of completion i, NaN where it gave None. `columns` holds each
    completion's dataset columns (its Prompt.columns), handed to the functions by name as lists of N. A function
    that fails, or returns other than N numbers or None, is one UserError naming it and the first prompt concerned."""
    n = len(prompts)
    keys = [k for k in (columns[0] if columns else {}) if k not in ("prompt", "completion", "completion_ids")]
    kwargs = {k: [c.get(k) for c in columns] for k in keys}
    if trainer_state is not None:
        kwargs["trainer_state"] = trainer_state
    out = np.full((n, len(funcs)), np.nan, np.float32)
    for j, f in enumerate(funcs):
        rewards = _call(f, prompts, completions, completion_ids, kwargs)
        if len(rewards) != n:
            raise UserError(f"the reward function '{f.name}' returned {len(rewards)} rewards for {n} completions "
                            f"(first prompt {_show(prompts[0])}); return one per completion, None where it does not "
                            f"apply")
        for i, r in enumerate(rewards):
            out[i, j] = _number(r, f.name, prompts[i])
    return out


def _call(f, prompts, completions, completion_ids, kwargs):
    try:
        rewards = f.fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's function: its error, and the prompt it failed on
        i = _first_failing(f, prompts, completions, completion_ids, kwargs)
        raise UserError(f"the reward function '{f.name}' failed with {_one_line(e)} on prompt {i} "
                        f"{_show(prompts[i])}; fix the function") from None
    if isinstance(rewards, (str, bytes, dict)) or not hasattr(rewards, "__len__"):
        raise UserError(f"the reward function '{f.name}' returned a {type(rewards).__name__} for the batch (first "
                        f"prompt {_show(prompts[0])}); return a list with one number or None per completion")
    return list(rewards)


def _first_failing(f, prompts, completions, completion_ids, kwargs):
    """The first completion the function fails on alone (0 if it fails only on the whole batch)."""
    for i in range(len(prompts)):
        row = {k: v if k == "trainer_state" else v[i:i + 1] for k, v in kwargs.items()}
        try:
            list(f.fn(prompts=prompts[i:i + 1], completions=completions[i:i + 1],
                      completion_ids=completion_ids[i:i + 1], **row))
        except Exception:  # noqa: BLE001 -- looking for the failing one
            return i
    return 0


def _number(r, name, prompt):
    """A reward as float: None (TRL's "does not apply") is NaN; a NaN or infinite number is the function's bug."""
    if r is None:
        return np.nan
    if not isinstance(r, (str, bytes)):
        try:
            value = float(r)
        except (TypeError, ValueError):
            pass
        else:
            if np.isfinite(value):
                return value
            raise UserError(f"the reward function '{name}' returned {value} for prompt {_show(prompt)}; return a "
                            f"finite number, or None where it does not apply")
    raise UserError(f"the reward function '{name}' returned {_one_line_value(r)} for prompt {_show(prompt)}; return a "
                    f"number or None")


def _one_line_value(r, limit=40):
    text = " ".join(repr(r).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
