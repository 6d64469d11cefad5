"""Train tokenizers from text: byte-level BPE as RoBERTa/GPT-2 have, WordPiece as BERT has.

Both return a `transformers` tokenizer; save_pretrained(dir) writes tokenizer.json and
tokenizer_config.json, and AutoTokenizer.from_pretrained(dir) gives it back (RobertaTokenizer,
BertTokenizer) with its special tokens and model_max_length.
"""
import os

import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from flaxlm.errors import UserError

# files a tokenizer may have in a model directory (other files there, such as config.json, are not ours)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt",
                   "special_tokens_map.json")
BPE_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0..4, as RoBERTa has them
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4


def train_bpe(texts_iter, vocab_size=50265, min_frequency=2, model_max_length=512, lowercase=False, total=None):
    """Byte-level BPE (lossless on any text) wrapped as a RobertaTokenizer.

    texts_iter yields strings or lists of strings; total (number of texts) sizes the progress bar.
    With lowercase the tokenizer is saved as a plain TokenizersBackend, because RobertaTokenizer
    rebuilds itself on loading without a normalizer and would silently stop lowercasing.
    """
    if vocab_size < 256 + len(BPE_SPECIALS):
        raise UserError(f"--vocab_size {vocab_size} is too small for byte-level BPE; "
                        f"it needs at least {256 + len(BPE_SPECIALS)} (256 bytes + 5 special tokens)")
    tok = Tokenizer(models.BPE())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    mask = AddedToken("<mask>", lstrip=True, special=True)  # "a <mask>" keeps the space out of the mask
    specials = [AddedToken(t, special=True) for t in BPE_SPECIALS[:-1]] + [mask]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    tok.train_from_iterator(texts_iter, trainer, length=total)
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")),
                                                      trim_offsets=True, add_prefix_space=False)
    wrapper = transformers.TokenizersBackend if lowercase else transformers.RobertaTokenizer
    return wrapper(tokenizer_object=tok, model_max_length=model_max_length, bos_token="<s>", eos_token="</s>",
                   sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token=mask)


def train_wordpiece(texts_iter, vocab_size=30522, min_frequency=2, model_max_length=512, lowercase=True,
                    total=None):
    """BERT's WordPiece (`##` continuations; lowercasing also strips accents, as BERT does) as a BertTokenizer."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=lowercase)  # strip_accents None: follow lowercase
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=list(WORDPIECE_SPECIALS), limit_alphabet=1000,
                                        continuing_subword_prefix="##", show_progress=True)
    tok.train_from_iterator(texts_iter, trainer, length=total)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return transformers.BertTokenizer(tokenizer_object=tok, do_lower_case=lowercase, strip_accents=None,
                                      model_max_length=model_max_length)


TRAINERS = {"bpe": train_bpe, "wordpiece": train_wordpiece}  # the T5 issue adds "unigram"


def get_trainer(kind):
    """The train_* function for --type, or a UserError naming what exists."""
    if kind == "unigram" and kind not in TRAINERS:
        raise UserError("unigram is added by the T5 issue; use --type bpe or --type wordpiece for now")
    if kind not in TRAINERS:
        raise UserError(f"unknown tokenizer --type {kind}; use one of {', '.join(TRAINERS)}")
    return TRAINERS[kind]


def check_output_dir(output_dir, overwrite):
    """Refuse to replace a tokenizer already in output_dir unless told to."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UserError(f"--output_dir {output_dir} is a file; pass a directory")
    present = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(output_dir, f))]
    if present and not overwrite:
        raise UserError(f"--output_dir {output_dir} already holds a tokenizer ({', '.join(present)}); "
                        f"pass --overwrite_output_dir to replace it (other files there are kept)")


def save_tokenizer(tokenizer, output_dir):
    """Save into output_dir, first removing stale tokenizer files (only those; nothing else is touched)."""
    os.makedirs(output_dir, exist_ok=True)
    for f in TOKENIZER_FILES:
        path = os.path.join(output_dir, f)
        if os.path.isfile(path):
            os.remove(path)
    tokenizer.save_pretrained(output_dir)
