#!/usr/bin/env python
"""Fill in <extra_id_0>, <extra_id_1>, ... with an exported T5, through transformers' PyTorch model (needs torch).

    python fill_spans.py runs/t5-demo/run "Return the <extra_id_0> value of a number."
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.errors import UserError, run_main  # noqa: E402


def main():
    if len(sys.argv) < 3:
        raise UserError("usage: fill_spans.py MODEL_DIR TEXT [TEXT ...] (TEXT holds <extra_id_0>, <extra_id_1>, ...)")
    model_dir, texts = sys.argv[1], sys.argv[2:]
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise UserError(f"{model_dir} holds no exported model (config.json); pass run_t5_mlm_flax.py's --output_dir")
    import torch
    from transformers import AutoTokenizer, T5ForConditionalGeneration
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model = T5ForConditionalGeneration.from_pretrained(model_dir, use_safetensors=True).eval()  # never a pickle
    for text in texts:
        if "<extra_id_0>" not in text:
            raise UserError(f"no <extra_id_0> in {text!r}; put <extra_id_0> where a span should be filled in")
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=20, do_sample=False)
        target = tokenizer.decode(out[0], skip_special_tokens=False).replace("<pad>", "").replace("</s>", "").strip()
        spans = re.split(r"<extra_id_\d+>", target)
        fills = [s.strip() for s in spans[1:]]
        filled = text
        for k, fill in enumerate(fills):
            filled = filled.replace(f"<extra_id_{k}>", f"[{fill}]")
        print(f"{text}\n  -> {filled}\n     (generated target: {target})", flush=True)


if __name__ == "__main__":
    run_main(main)
