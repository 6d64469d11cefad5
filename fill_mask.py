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
from flaxlm.tasks.cloze import fill_in, read_arguments  # noqa: E402

USAGE = ("usage: fill_mask.py MODEL_DIR TEXT [TEXT ...] [--cloze TEXT WORD ...] "
         "(TEXT holds the mask token, e.g. <mask>; WORD is the word expected there)")


def main():
    model_dir, prompts = read_arguments(sys.argv, USAGE, trained_by="run_mlm_flax.py")
    from transformers import pipeline
    fill = pipeline("fill-mask", model=model_dir, tokenizer=model_dir, device="cpu", trust_remote_code=False,
                    model_kwargs={"use_safetensors": True})  # our export: no pickle, no hub code
    mask = fill.tokenizer.mask_token

    def top_five(text):
        text = text.replace("<mask>", mask).replace("[MASK]", mask)
        if text.count(mask) != 1:
            raise UserError(f"{text!r} holds {text.count(mask)} {mask} tokens; put one {mask} where a word "
                            f"should be filled in")
        return [(g["token_str"], f"{g['token_str']!r} ({g['score']:.2f})") for g in fill(text, top_k=5)]

    fill_in(prompts, top_five, "fill-mask")


if __name__ == "__main__":
    run_main(main)
