#!/usr/bin/env python
"""Give a pretrained model a new tokenizer's vocabulary, its new embedding rows started from what it knows.

    python adapt_vocabulary.py --model_name_or_path runs/roberta-en --tokenizer_name tok-no --method mean \\
        --output_dir runs/roberta-no-init
    python adapt_vocabulary.py --model_name_or_path runs/roberta-en --tokenizer_name tok-no --method focus \\
        --focus_train_file no.txt --output_dir runs/roberta-no-focus
    python adapt_vocabulary.py --model_name_or_path runs/gpt2-en --tokenizer_name tok-no --extend_vocabulary 2000 \\
        --focus_train_file no.txt --output_dir runs/gpt2-en-no

The output directory holds a Hugging Face model (config.json with the new vocab_size and special ids, weights) and
the new tokenizer, ready for continued pretraining. Methods: random, overlap, mean (FVT), focus (FOCUS); see
flaxlm.adaptation.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.config.options import AdaptArgs  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    (args,) = parse_args(AdaptArgs, argv=argv, prog="adapt_vocabulary.py", description=__doc__.splitlines()[0])
    from flaxlm.adaptation.adapt import adapt
    summary = adapt(args)
    print(f"wrote {args.output_dir} ({args.method if not args.extend_vocabulary else 'extended'}): {summary}")


if __name__ == "__main__":
    run_main(main)
