"""Data: raw text in (text), token rows out and handed to the loop step by step (rows, keyed in the cache by the
row function's code: fingerprint), rows made once on disk (preparing, for prepare_data.py) and read back (prepared),
sources mixed by weight (mixture), and what each objective or task makes of rows (mlm_masking, span_corruption,
packing, sentence_data, squad)."""
