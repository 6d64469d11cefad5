"""Train tokenizers from text: byte-level BPE as RoBERTa has (for encoders) and as GPT-2 has (for decoders),
WordPiece as BERT has, Unigram as T5 has and Unigram as XLM-RoBERTa has; and ByT5's byte tokenizer, which has
nothing to learn.

Each returns a `transformers` tokenizer; save_pretrained(dir) writes tokenizer.json and
tokenizer_config.json, and AutoTokenizer.from_pretrained(dir) gives it back (RobertaTokenizer, GPT2Tokenizer,
BertTokenizer, for Unigram a TokenizersBackend, XLMRobertaTokenizer) with its special tokens and model_max_length.
"""
import os
import tempfile

import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from flaxlm.errors import UserError
from flaxlm.files import check_writable_dir
from flaxlm.tokenization.loading import TOKENIZER_FILES
from flaxlm.tokenization.unigram import XLMR_SPECIALS, SentencePieceUnigramTokenizer, VocabTooSmall, train_xlmr_pieces
BPE_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0..4, as RoBERTa has them
GPT2_EOS = "<|endoftext|>"  # GPT-2's one special token
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4
UNIGRAM_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0..2, as T5 has them
T5_SENTINELS = tuple(f"<extra_id_{k}>" for k in range(100))  # span k of T5's span corruption


def train_bpe(texts_iter, vocab_size=50265, min_frequency=2, model_max_length=512, lowercase=False, total=None):
    """Byte-level BPE (lossless on any text) wrapped as a RobertaTokenizer, for encoders: <s> text </s>.

    texts_iter yields strings or lists of strings; total (number of texts) sizes the progress bar.
    With lowercase the tokenizer is saved as a plain TokenizersBackend, because RobertaTokenizer
    rebuilds itself on loading without a normalizer and would silently stop lowercasing.
    """
    mask = AddedToken("<mask>", lstrip=True, special=True)  # "a <mask>" keeps the space out of the mask
    specials = [AddedToken(t, special=True) for t in BPE_SPECIALS[:-1]] + [mask]
    tok = _byte_level_bpe(texts_iter, vocab_size, min_frequency, lowercase, specials, total)
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")),
                                                      trim_offsets=True, add_prefix_space=False)
    wrapper = transformers.TokenizersBackend if lowercase else transformers.RobertaTokenizer
    return wrapper(tokenizer_object=tok, model_max_length=model_max_length, bos_token="<s>", eos_token="</s>",
                   sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token=mask)


def train_gpt2_bpe(texts_iter, vocab_size=50257, min_frequency=2, model_max_length=1024, lowercase=False,
                   total=None):
    """Byte-level BPE as GPT-2 has it, for decoders: a GPT2Tokenizer whose one special token, <|endoftext|> (id 0),
    is bos, eos and unk, and which adds nothing around a text (tok("Hei") is the pieces of "Hei" alone; the
    pretraining rows end each document with eos themselves, flaxlm.data.rows). No pad token, as GPT-2; the scripts
    pad with eos. lowercase: a TokenizersBackend, as train_bpe explains."""
    tok = _byte_level_bpe(texts_iter, vocab_size, min_frequency, lowercase, [AddedToken(GPT2_EOS, special=True)],
                          total)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)  # offsets only: no token added
    wrapper = transformers.TokenizersBackend if lowercase else transformers.GPT2Tokenizer
    return wrapper(tokenizer_object=tok, model_max_length=model_max_length, bos_token=GPT2_EOS, eos_token=GPT2_EOS,
                   unk_token=GPT2_EOS, add_prefix_space=False)


def _byte_level_bpe(texts_iter, vocab_size, min_frequency, lowercase, specials, total):
    """A tokenizers.Tokenizer of byte-level BPE trained on the texts, its special tokens first (ids 0..)."""
    if vocab_size < 256 + len(specials):
        raise UserError(f"--vocab_size {vocab_size} is too small for byte-level BPE; it needs at least "
                        f"{256 + len(specials)} (256 bytes + {len(specials)} special tokens)")
    tok = Tokenizer(models.BPE())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    tok.train_from_iterator(texts_iter, trainer, length=total)
    return tok


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


def train_unigram(texts_iter, vocab_size=32000, min_frequency=2, model_max_length=512, lowercase=False,
                  total=None):
    """T5's SentencePiece-style Unigram tokenizer (flaxlm/unigram_tokenizer.py) with T5's 100 sentinels.

    Ids: <pad> 0, </s> 1 (appended to every sequence), <unk> 2, then the trained pieces, then the
    sentinels in reverse, as Hugging Face's T5 tokenizers have them: <extra_id_k> is len(tokenizer) - 1 - k.
    vocab_size counts the trained pieces with the 3 special tokens, not the sentinels, as in Google's T5
    and Hugging Face's recipe: len(tokenizer) is vocab_size + 100 (fewer pieces when the text is too
    small to fill the vocabulary). min_frequency is accepted for a common signature and ignored: Unigram
    prunes pieces by likelihood, not by count.

    It is saved as a TokenizersBackend, not a T5Tokenizer, because T5Tokenizer rebuilds its pipeline on
    loading and would drop this one's normalizer and digit/punctuation splits; the sentinels are its
    extra_special_tokens (what transformers 4 called additional_special_tokens).
    """
    too_small = UserError(f"--vocab_size {vocab_size} is too small for this text: a Unigram vocabulary needs "
                          f"every character seen in training plus 3 special tokens; raise --vocab_size")
    if vocab_size <= len(UNIGRAM_SPECIALS):
        raise too_small
    pad, eos, unk = UNIGRAM_SPECIALS
    unigram = SentencePieceUnigramTokenizer(pad_token=pad, eos_token=eos, unk_token=unk, lowercase=lowercase)
    try:
        unigram.train_from_iterator(texts_iter, vocab_size=vocab_size, show_progress=True, length=total)
    except VocabTooSmall:
        raise too_small from None
    tok = Tokenizer.from_str(unigram.to_str())
    tok.add_special_tokens([AddedToken(t, special=True) for t in reversed(T5_SENTINELS)])
    return transformers.TokenizersBackend(tokenizer_object=tok, model_max_length=model_max_length, pad_token=pad,
                                          eos_token=eos, unk_token=unk, extra_special_tokens=list(T5_SENTINELS))


def train_xlmr_unigram(texts_iter, vocab_size=32000, min_frequency=2, model_max_length=512, lowercase=False,
                       total=None):
    """XLM-RoBERTa's SentencePiece-style Unigram tokenizer, an XLMRobertaTokenizer (AutoTokenizer loads it as one).

    Ids: <s> 0, <pad> 1, </s> 2, <unk> 3, the trained pieces, <mask> last; "<s> A </s>", pairs
    "<s> A </s></s> B </s>". vocab_size counts them all: len(tokenizer) is vocab_size (fewer pieces when the text
    is too small to fill the vocabulary). min_frequency is ignored, as for T5's Unigram. The pipeline is the one
    XLMRobertaTokenizer rebuilds on loading (flaxlm.tokenization.unigram); it keeps no normalizer but a
    SentencePiece charsmap, which `tokenizers` cannot make, so there is no NFKC and lowercasing is refused rather
    than silently lost on reload.
    """
    if lowercase:
        raise UserError("--lowercase does not survive reloading an XLM-RoBERTa tokenizer (XLMRobertaTokenizer rebuilds "
                        "its pipeline without it); lowercase the text itself, or use --type unigram")
    too_small = UserError(f"--vocab_size {vocab_size} is too small for this text: an XLM-RoBERTa Unigram vocabulary "
                          f"needs every character seen in training plus 5 special tokens; raise --vocab_size")
    if vocab_size <= len(XLMR_SPECIALS) + 1:
        raise too_small
    try:
        pieces = train_xlmr_pieces(texts_iter, vocab_size - 1, show_progress=True, length=total)
    except VocabTooSmall:
        raise too_small from None
    mask = AddedToken("<mask>", lstrip=True, special=True)  # "a <mask>" keeps the space out of the mask
    return transformers.XLMRobertaTokenizer(vocab=pieces + [("<mask>", 0.0)], mask_token=mask,
                                            model_max_length=model_max_length)


def byte_tokenizer(model_max_length=512):
    """ByT5's tokenizer (transformers' ByT5Tokenizer, which AutoTokenizer loads back): UTF-8 bytes, no training.

    Ids: <pad> 0, </s> 1 (appended to every sequence), <unk> 2, byte b at b + 3, then <extra_id_0> ..
    <extra_id_124> at 259 .. 383 in ascending order, as ByT5Tokenizer numbers them: 384 ids, google/byt5-*'s
    vocab_size. ByT5's span corruption marks spans with the last byte ids instead (flaxlm.data.span_corruption).
    """
    return transformers.ByT5Tokenizer(model_max_length=model_max_length)


TRAINERS = {"bpe": train_bpe, "gpt2": train_gpt2_bpe, "wordpiece": train_wordpiece, "unigram": train_unigram,
            "xlmr-unigram": train_xlmr_unigram}
TYPES = (*TRAINERS, "byte")  # --type: a trained tokenizer, or ByT5's bytes


def get_trainer(kind):
    """The train_* function for --type, or a UserError naming what exists."""
    if kind not in TRAINERS:
        raise UserError(f"unknown tokenizer --type {kind}; use one of {', '.join(TYPES)}")
    return TRAINERS[kind]


def check_output_dir(output_dir, overwrite):
    """Before training: refuse to replace a tokenizer already in output_dir unless told to, and fail at once
    when output_dir cannot be written (a file, a read-only directory)."""
    check_writable_dir(output_dir)
    present = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(output_dir, f))]
    if present and not overwrite:
        raise UserError(f"--output_dir {output_dir} already holds a tokenizer ({', '.join(present)}); "
                        f"pass --overwrite_output_dir to replace it (other files there are kept)")


def save_tokenizer(tokenizer, output_dir):
    """Save into output_dir, replacing the tokenizer files there (only those; nothing else is touched).

    The new files are written to a temporary directory inside output_dir first and then moved in, so a save
    that fails (a full disk) leaves the old tokenizer whole; old tokenizer files the new one lacks go."""
    os.makedirs(output_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".tokenizer-") as tmp:
        tokenizer.save_pretrained(tmp)
        new = os.listdir(tmp)
        for f in TOKENIZER_FILES:
            if f not in new and os.path.isfile(os.path.join(output_dir, f)):
                os.remove(os.path.join(output_dir, f))
        for f in new:
            os.replace(os.path.join(tmp, f), os.path.join(output_dir, f))
