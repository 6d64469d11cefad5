#!/usr/bin/env python
"""Fill in <mask> with an exported model, through transformers' PyTorch pipeline (needs torch).

    python fill_mask.py runs/demo/run "The <mask> statement is used to leave a loop."
    python fill_mask.py runs/demo/run --cloze "A break statement terminates the nearest enclosing <mask>." loop

Each TEXT prints with the model's five top guesses. A --cloze TEXT WORD also names the word expected at the
mask and is scored: right when the top guess is that word (a leading space ignored); a last line counts them.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.errors import UserError, run_main  # noqa: E402

USAGE = ("usage: fill_mask.py MODEL_DIR TEXT [TEXT ...] [--cloze TEXT WORD ...] "
         "(TEXT holds the mask token, e.g. <mask>; WORD is the word expected there)")


def read_prompts(args):
    """[(text, expected word or None)] from the arguments after MODEL_DIR, in their order."""
    prompts, i = [], 0
    while i < len(args):
        if args[i] == "--cloze":
            if len(args) - i < 3:
                raise UserError(f"--cloze takes two values, a TEXT and the WORD expected at its mask; {USAGE}")
            prompts.append((args[i + 1], args[i + 2].strip()))
            i += 3
        elif args[i].startswith("--"):
            raise UserError(f"unknown option {args[i]}; {USAGE}")
        else:
            prompts.append((args[i], None))
            i += 1
    if not prompts:
        raise UserError(USAGE)
    return prompts


def main():
    if len(sys.argv) < 3:
        raise UserError(USAGE)
    model_dir, prompts = sys.argv[1], read_prompts(sys.argv[2:])
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise UserError(f"{model_dir} holds no exported model (config.json); pass run_mlm_flax.py's --output_dir")
    from transformers import pipeline
    fill = pipeline("fill-mask", model=model_dir, tokenizer=model_dir, device="cpu", trust_remote_code=False,
                    model_kwargs={"use_safetensors": True})  # our export: no pickle, no hub code
    mask = fill.tokenizer.mask_token
    right = 0
    for text, expected in prompts:
        text = text.replace("<mask>", mask).replace("[MASK]", mask)
        if text.count(mask) != 1:
            raise UserError(f"{text!r} holds {text.count(mask)} {mask} tokens; put one {mask} where a word "
                            f"should be filled in")
        top = fill(text, top_k=5)
        guesses = ", ".join(f"{g['token_str']!r} ({g['score']:.2f})" for g in top)
        print(f"{text}\n  -> {guesses}", flush=True)
        if expected is not None:
            hit = top[0]["token_str"].strip() == expected
            right += hit
            print(f"  expected {expected!r}: {'right' if hit else 'wrong'}", flush=True)
    scored = sum(expected is not None for _, expected in prompts)
    if scored:
        print(f"fill-mask: {right} of {scored} top-1 answers right", flush=True)


if __name__ == "__main__":
    run_main(main)
