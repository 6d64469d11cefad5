"""Adapting a pretrained model to a new tokenizer (adapt_vocabulary.py): what each token of a vocabulary means as
text (pieces), the rules that give each new token's embedding row (vocabulary), FOCUS's weights (focus), a
vocabulary extended with new tokens (extend), and the rows rebuilt in the params (rows); and a dense model upcycled
into its family's mixture of experts (upcycle_moe.py: upcycle)."""
