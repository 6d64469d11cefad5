"""XLM-RoBERTa and CamemBERT, two families (model_type xlm-roberta, camembert): RoBERTa's architecture and tensor
names (bert.py's modules, bert.ROBERTA_LIKE) under their own config classes and Hugging Face classes
(XLMRobertaForMaskedLM, CamembertForMaskedLM, their *ForSequenceClassification and *ForQuestionAnswering).

Their tokenizers are SentencePiece-style Unigram ones: train_tokenizer.py --type xlmr-unigram writes XLM-R's.
"""
from flaxlm.models.bert import encoder_family, roberta_max_length

# The full-size presets copy the hub's config.json (FacebookAI/xlm-roberta-base, -large, almanach/camembert-base);
# the tiny ones are for tests (positions start at pad_token_id + 1: 2 extra).
_XLMR = dict(model_type="xlm-roberta", vocab_size=250002, max_position_embeddings=514, type_vocab_size=1,
             layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2, hidden_act="gelu",
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)
# CamemBERT's <s> and </s> are ids 5 and 6 (0 and 2 are fairseq's unused <s>NOTUSED, </s>NOTUSED)
_CAMEMBERT = {**_XLMR, "model_type": "camembert", "vocab_size": 32005, "bos_token_id": 5, "eos_token_id": 6}
_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, vocab_size=1024,
             max_position_embeddings=130)

PRESETS = {
    "xlm-roberta-base": {**_XLMR, **_BASE},
    "xlm-roberta-large": {**_XLMR, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                          "intermediate_size": 4096},
    "camembert-base": {**_CAMEMBERT, **_BASE},
    "xlm-roberta-tiny": {**_XLMR, **_TINY},
    "camembert-tiny": {**_CAMEMBERT, **_TINY},
}

XLM_ROBERTA = encoder_family("xlm-roberta", "XLM-RoBERTa", "XLMRoberta", roberta_max_length, PRESETS)
CAMEMBERT = encoder_family("camembert", "CamemBERT", "Camembert", roberta_max_length, PRESETS)
