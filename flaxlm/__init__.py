"""flaxlm: language-model pretraining in JAX/Flax with Hugging Face-compatible models."""
__version__ = "0.1.0"
