"""Data: text in (text), token rows out, batches of rows per step (batches), and what each objective or task
makes of rows (mlm_masking, span_corruption, packing, sentence_data, squad)."""
