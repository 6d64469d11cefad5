"""Pretraining objectives: the loss each training script optimizes (masked LM, T5 span corruption, causal LM)
and the fused LM-head cross-entropy they share (lm_loss)."""
