"""Hugging Face's T5 recipe imported its Unigram tokenizer from this file; it lives in flaxlm now:

    from t5_tokenizer_model import SentencePieceUnigramTokenizer

Run as a script, this is `python train_tokenizer.py --type unigram ...` (same flags), which also adds
T5's 100 sentinel tokens and saves a directory that AutoTokenizer.from_pretrained loads:

    python t5_tokenizer_model.py --train_file corpus.txt --vocab_size 32000 --output_dir my-t5
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.tokenization.unigram import SentencePieceUnigramTokenizer  # noqa: E402

__all__ = ["SentencePieceUnigramTokenizer"]

if __name__ == "__main__":
    import train_tokenizer
    from flaxlm.errors import run_main

    run_main(lambda: train_tokenizer.main(["--type", "unigram", *sys.argv[1:]]))
