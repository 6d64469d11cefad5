#!/usr/bin/env python
"""Fill in <extra_id_0>, <extra_id_1>, ... with an exported T5 (mT5, UMT5, ByT5: its sentinels are the last byte
ids), through transformers' PyTorch model (needs torch).

    python fill_spans.py runs/t5-demo/run "Return the <extra_id_0> value of a number."
    python fill_spans.py runs/t5-demo/run --cloze "Return the <extra_id_0> value of a number." absolute

Each TEXT prints with its spans filled in by greedy decoding. A --cloze TEXT WORD also names the text expected in
<extra_id_0> and is scored: right when the first span is that text; a last line counts them.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.data.span_corruption import byte_sentinels_in, byte_sentinels_out  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402
from flaxlm.tasks.cloze import fill_in, read_arguments  # noqa: E402

USAGE = ("usage: fill_spans.py MODEL_DIR TEXT [TEXT ...] [--cloze TEXT WORD ...] "
         "(TEXT holds <extra_id_0>, <extra_id_1>, ...; WORD is the text expected in <extra_id_0>)")


def main():
    model_dir, prompts = read_arguments(sys.argv, USAGE, trained_by="run_t5_mlm_flax.py")
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, use_safetensors=True,  # T5/mT5/UMT5; never a pickle
                                                  trust_remote_code=False).eval()

    def spans(text):
        if "<extra_id_0>" not in text:
            raise UserError(f"no <extra_id_0> in {text!r}; put <extra_id_0> where a span should be filled in")
        ids = torch.tensor([byte_sentinels_in(tokenizer(text).input_ids, tokenizer)])  # ByT5: its own sentinels
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=20, do_sample=False)
        target = tokenizer.decode(byte_sentinels_out(out[0].tolist(), tokenizer), skip_special_tokens=False)
        target = target.replace("<pad>", "").replace("</s>", "").strip()
        fills = [s.strip() for s in re.split(r"<extra_id_\d+>", target)[1:]] or [""]
        filled = text
        for k, fill in enumerate(fills):
            filled = filled.replace(f"<extra_id_{k}>", f"[{fill}]")
        return [(fills[0], f"{filled}\n     (generated target: {target})")]

    fill_in(prompts, spans, "fill-spans")


if __name__ == "__main__":
    run_main(main)
