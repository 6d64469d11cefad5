"""T5's tokenizer: a SentencePiece-style Unigram model trained with the `tokenizers` library.

The pipeline, applied to every text:
  normalizer      NMT cleanup (control characters), NFKC, runs of spaces collapsed to one, optional lowercasing
  pre-tokenizer   split on whitespace, mark each word start with "▁" (Metaspace), every digit alone,
                  punctuation alone
  model           Unigram; ids 0, 1, 2 are <pad>, </s>, <unk> (unknown pieces map to 2)
  post-processor  "</s>" appended to each sequence
  decoder         "▁" back to spaces

Splitting on whitespace first (as transformers' T5Tokenizer does) keeps the spaces around added tokens
such as "<extra_id_0>", and at the ends of a text, from turning into stray "▁" pieces (NMT has already
made tabs and newlines spaces). Every word gets its "▁", the first one included.

    tokenizer = SentencePieceUnigramTokenizer()
    tokenizer.train_from_iterator(texts, vocab_size=32000)   # or tokenizer.train(["a.txt", "b.txt"], ...)
    tokenizer.save("tokenizer.json")

flaxlm.tokenization.trainers.train_unigram wraps this into a transformers tokenizer with T5's sentinels.

XLM-RoBERTa's Unigram (train_xlmr_pieces, wrapped by trainers.train_xlmr_unigram) has another pipeline: the one
transformers' XLMRobertaTokenizer rebuilds from the vocabulary whenever it loads (split on whitespace, "▁" before
each word, no normalizer), so that what is trained is what loads.
"""
import json

import transformers
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.implementations import BaseTokenizer
from tokenizers.models import Unigram

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
XLMR_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # XLM-RoBERTa's ids 0..3; its <mask> follows the pieces
_TOO_SMALL = "not large enough to contain all chars"  # the tokenizers trainer's message for it


class VocabTooSmall(ValueError):
    """vocab_size cannot hold every character of the training text plus the special tokens."""


class SentencePieceUnigramTokenizer(BaseTokenizer):
    """A Unigram tokenizer as T5 uses it (pipeline in the module docstring), trainable from files or texts.

    The special tokens are the first three pieces of the trained vocabulary: pad_token (id 0),
    eos_token (id 1, appended to every encoded sequence) and unk_token (id 2).
    """

    def __init__(self, replacement="▁", unk_token="<unk>", eos_token="</s>", pad_token="<pad>", lowercase=False):
        self.special_tokens = [pad_token, eos_token, unk_token]  # in id order
        tokenizer = Tokenizer(Unigram())
        steps = [normalizers.Nmt(), normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
        tokenizer.normalizer = normalizers.Sequence(steps + ([normalizers.Lowercase()] if lowercase else []))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement=replacement, prepend_scheme="always"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(),
        ])
        tokenizer.decoder = decoders.Metaspace(replacement=replacement, prepend_scheme="always")
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {eos_token}", pair=f"$A {eos_token} $B {eos_token}", special_tokens=[(eos_token, EOS_ID)])
        parameters = {"model": "SentencePieceUnigram", "replacement": replacement, "lowercase": lowercase}
        super().__init__(tokenizer, parameters)

    def _trainer(self, vocab_size, show_progress):
        return trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=self.special_tokens,
                                       unk_token=self.special_tokens[UNK_ID], show_progress=show_progress)

    def train(self, files, vocab_size=8000, show_progress=True):
        """Train on text files (a path or a list of paths; one text per line)."""
        if isinstance(files, str):
            files = [files]
        self._train(lambda trainer: self._tokenizer.train(files, trainer), vocab_size, show_progress)

    def train_from_iterator(self, iterator, vocab_size=8000, show_progress=True, length=None):
        """Train on an iterator of texts (or of lists of texts); length (the number of items) sizes the bar."""
        self._train(lambda trainer: self._tokenizer.train_from_iterator(iterator, trainer, length=length),
                    vocab_size, show_progress)

    def _train(self, run, vocab_size, show_progress):
        """vocab_size counts every piece, the 3 special tokens included; it must hold each character seen."""
        _run_trainer(lambda: run(self._trainer(vocab_size, show_progress)), vocab_size)


def _run_trainer(run, vocab_size):
    """run() (a Unigram training), its too-small-vocabulary failure as VocabTooSmall."""
    try:
        run()
    except Exception as e:
        if _TOO_SMALL in str(e):
            raise VocabTooSmall(f"vocab_size {vocab_size} is too small for this text: a Unigram vocabulary "
                                f"holds every character seen in training plus the special tokens") from None
        raise


def train_xlmr_pieces(iterator, vocab_size, show_progress=True, length=None):
    """XLM-RoBERTa's Unigram trained on an iterator of texts (or of lists of texts): its pieces [(piece, log
    probability)], at most vocab_size, <s> <pad> </s> <unk> first (ids 0-3). The texts are split by the very
    pre-tokenizer XLMRobertaTokenizer uses, so the loaded tokenizer splits words as training did."""
    tokenizer = Tokenizer(Unigram())
    tokenizer.pre_tokenizer = transformers.XLMRobertaTokenizer().backend_tokenizer.pre_tokenizer
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(XLMR_SPECIALS),
                                      unk_token=XLMR_SPECIALS[3], show_progress=show_progress)
    _run_trainer(lambda: tokenizer.train_from_iterator(iterator, trainer, length=length), vocab_size)
    return [tuple(piece) for piece in json.loads(tokenizer.to_str())["model"]["vocab"]]
