"""Train a tokenizer on your text and save it in the model directory.

    python train_tokenizer.py --train_file a.txt --train_file b.txt --output_dir models/my-roberta
    python train_tokenizer.py --train_file a.txt --type gpt2 --vocab_size 50257 --output_dir models/my-gpt2
    python train_tokenizer.py --dataset_name NAME --dataset_config_name CONFIG --type wordpiece \\
        --vocab_size 30522 --output_dir models/my-bert
    python train_tokenizer.py --train_file a.txt --type unigram --vocab_size 32000 --output_dir models/my-t5
    python train_tokenizer.py --train_file a.txt --type xlmr-unigram --vocab_size 64000 --output_dir models/my-xlmr
    python train_tokenizer.py --type byte --output_dir models/my-byt5     # ByT5's bytes: no text is read
"""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import TextSourceArgs, TokenizerArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.data.text import iter_texts, load_raw_text  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402
from flaxlm.tokenization.trainers import byte_tokenizer, check_output_dir, get_trainer, save_tokenizer  # noqa: E402


def main(argv=None):
    src, args = parse_args(TextSourceArgs, TokenizerArgs, argv=argv, prog="train_tokenizer.py",
                           description=__doc__)
    if args.type == "byte":  # nothing to learn: ByT5's 256 bytes, 3 special tokens and 125 extra ids
        if args.vocab_size is not None or args.lowercase:
            raise UserError("--type byte has a fixed vocabulary of 384 ids (UTF-8 bytes, as ByT5) and keeps the "
                            "text's case; drop --vocab_size and --lowercase")
        check_output_dir(args.output_dir, args.overwrite_output_dir)
        tokenizer = byte_tokenizer(args.model_max_length or 512)
    else:
        tokenizer = train(src, args)
    save_tokenizer(tokenizer, args.output_dir)
    print(f"saved a {args.type} tokenizer with {len(tokenizer)} tokens to {args.output_dir}")


def train(src, args):
    """The tokenizer of --type trained on the training split of the text."""
    train_fn = get_trainer(args.type)
    check_output_dir(args.output_dir, args.overwrite_output_dir)

    # the training split only: no validation file is read and nothing is held out
    texts = load_raw_text(dataclasses.replace(src, validation_file=None), validation_split_percentage=0)["train"]
    total = None if src.streaming else len(texts)
    if args.max_train_samples is not None:
        n = args.max_train_samples
        texts = texts.take(n) if src.streaming else texts.select(range(min(n, total)))
        total = n if src.streaming else len(texts)

    options = {"vocab_size": args.vocab_size, "lowercase": args.lowercase, "model_max_length": args.model_max_length}
    return train_fn(iter_texts(texts), min_frequency=args.min_frequency, total=total,
                    **{k: v for k, v in options.items() if v is not None})


if __name__ == "__main__":
    run_main(main)
