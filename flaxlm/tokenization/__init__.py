"""Tokenizers: training one on your text (trainers, unigram) and loading one for a run (loading)."""
