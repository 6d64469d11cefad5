"""What an objective gives the training loop (Objective), and the generator each batch is collated with.

Every objective (flaxlm.objectives, flaxlm.tasks) is one Objective: the loop steps, evaluates and logs through it
and knows nothing else about masking, span corruption or fine-tuning heads.
"""
import dataclasses
from typing import Callable, Optional

import jax
import numpy as np


@dataclasses.dataclass
class Objective:
    """loss_sums(params, batch, dropout_key or None) -> dict of sums with 'loss_sum' and 'weight_sum'
    (the count of target tokens) and any other '*_sum' metric; collate(rows_BL, rng) -> numpy batch,
    whose entry `weights_key` [B, ...] weighs each target (evaluation zeroes it on padding rows)."""
    loss_sums: Callable
    collate: Callable
    pad_id: int
    weights_key: str
    flops_per_example: float
    tokens_per_example: int
    # Fine-tuning: predict(params, batch) -> {name: [B, ...]} per-example outputs (eval mode), and
    # metrics(outputs) -> {name: float} over the outputs of every real row of a split, in row order.
    # With metrics set, an evaluation reports the loss sums' metrics plus these (and no perplexity).
    predict: Optional[Callable] = None
    metrics: Optional[Callable] = None
    perplexity: bool = True  # an evaluation without `metrics` reports exp(loss); False where loss is no LM loss
    count_name: str = "target_tokens"  # what an evaluation's row calls the weights' sum: what it counted (DPO: pairs)
    # eval_sums(params, batch) -> sums with 'weight_sum', what an evaluation adds up instead of loss_sums in eval mode
    # (GRPO: no loss on held-out prompts, only what `metrics` makes of the completions `predict` samples)
    eval_sums: Optional[Callable] = None
    # frozen: arrays on the mesh that the train step reads and never trains (a distillation's teacher params, placed
    # as the student's); with it, loss_sums(params, batch, dropout_key, frozen). Evaluation never sees them.
    frozen: Optional[object] = None

    def frozen_args(self):
        """What the train step takes after (state, batch, key): (frozen,) or ()."""
        return () if self.frozen is None else (self.frozen,)


def collate_rng(seed, split, index):
    """The generator for the masking / span corruption of one batch. Each process collates only its own rows,
    so on a multi-host run the process index is part of the seed: otherwise every process would draw the
    same masks for its rows (correlated across the global batch)."""
    key = [seed, split, index] + ([jax.process_index()] if jax.process_count() > 1 else [])
    return np.random.default_rng(key)
