"""Fill in the blanks of a few sentences with an exported model, and score the ones whose answer is given: what
fill_mask.py (encoder, <mask>) and fill_spans.py (T5, <extra_id_0>) share. A script gives `fill_in` a function
text -> its guesses; this module reads the arguments, checks the model directory, prints and scores.
"""
import os

from flaxlm.errors import UserError


def read_arguments(argv, usage, trained_by):
    """(MODEL_DIR, [(text, expected answer or None)]) from argv[1:], once MODEL_DIR holds an exported model (its
    config.json). A --cloze TEXT WORD pair is a prompt with its answer; a bare TEXT has none."""
    if len(argv) < 3:
        raise UserError(usage)
    model_dir, args = argv[1], argv[2:]
    prompts, i = [], 0
    while i < len(args):
        if args[i] == "--cloze":
            if len(args) - i < 3:
                raise UserError(f"--cloze takes two values, a TEXT and the WORD expected in its blank; {usage}")
            prompts.append((args[i + 1], args[i + 2].strip()))
            i += 3
        elif args[i].startswith("--"):
            raise UserError(f"unknown option {args[i]}; {usage}")
        else:
            prompts.append((args[i], None))
            i += 1
    if not prompts:
        raise UserError(usage)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise UserError(f"{model_dir} holds no exported model (config.json); pass {trained_by}'s --output_dir")
    return model_dir, prompts


def fill_in(prompts, guesses_for, name):
    """Print each prompt with the model's guesses for its blank: guesses_for(text) -> [(answer, shown)], best first
    (`shown` is how a guess prints: the answer quoted and its score, say). A prompt with an expected answer is right
    when the first answer is it (spaces around it ignored); a last line, "NAME: k of n top-1 answers right",
    counts them. Returns (k, n)."""
    right = 0
    for text, expected in prompts:
        guesses = guesses_for(text)
        print(f"{text}\n  -> {', '.join(shown for _, shown in guesses)}", flush=True)
        if expected is not None:
            hit = guesses[0][0].strip() == expected
            right += hit
            print(f"  expected {expected!r}: {'right' if hit else 'wrong'}", flush=True)
    scored = sum(expected is not None for _, expected in prompts)
    if scored:
        print(f"{name}: {right} of {scored} top-1 answers right", flush=True)
    return right, scored
