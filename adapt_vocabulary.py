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
    write_card(args)


AUTO_CLASSES = {"run_clm_flax.py": "AutoModelForCausalLM", "run_mlm_flax.py": "AutoModelForMaskedLM",
                "run_t5_mlm_flax.py": "AutoModelForSeq2SeqLM"}  # by the script that pretrains the family


def write_card(args):
    """The adapted model's card (flaxlm.reporting.model_card), its source as base_model."""
    from flaxlm.config.cli import parsed_options
    from flaxlm.models import count_config_params, family_of, load_config
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.reporting.model_card import write_model_card
    config = load_config(args.output_dir)
    family = family_of(config)
    how = (f"with its vocabulary extended by {args.extend_vocabulary} tokens" if args.extend_vocabulary
           else f"adapted to a new tokenizer ({args.method})")
    write_model_card(args.output_dir, config=config, tokenizer=load_tokenizer(args.output_dir, local_only=True),
                     auto_class=f"transformers.{AUTO_CLASSES.get(family.script, family.architecture)}",
                     script="adapt_vocabulary.py", options=parsed_options(), n_params=count_config_params(config),
                     base_model=args.model_name_or_path, how=how)


if __name__ == "__main__":
    run_main(main)
