#!/usr/bin/env python
"""Fill in <mask> with an exported model, through transformers' PyTorch pipeline (needs torch).

    python fill_mask.py runs/demo/run "The <mask> statement is used to leave a loop."
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.errors import UserError, run_main  # noqa: E402


def main():
    if len(sys.argv) < 3:
        raise UserError("usage: fill_mask.py MODEL_DIR TEXT [TEXT ...] (TEXT holds the mask token, e.g. <mask>)")
    model_dir, texts = sys.argv[1], sys.argv[2:]
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise UserError(f"{model_dir} holds no exported model (config.json); pass run_mlm_flax.py's --output_dir")
    from transformers import pipeline
    fill = pipeline("fill-mask", model=model_dir, tokenizer=model_dir, device="cpu", trust_remote_code=False,
                    model_kwargs={"use_safetensors": True})  # our export: no pickle, no hub code
    mask = fill.tokenizer.mask_token
    for text in texts:
        text = text.replace("<mask>", mask).replace("[MASK]", mask)
        if mask not in text:
            raise UserError(f"no {mask} in {text!r}; put {mask} where a word should be filled in")
        guesses = ", ".join(f"{g['token_str']!r} ({g['score']:.2f})" for g in fill(text, top_k=5))
        print(f"{text}\n  -> {guesses}", flush=True)


if __name__ == "__main__":
    run_main(main)
