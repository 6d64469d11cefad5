"""The uncertainty of a score: a percentile bootstrap over the validation examples.

A score is a function of statistics summed over the examples (Scored): the correct tags and the tags of each
sentence, an entity count triple, sacrebleu's n-gram counts, one row of a confusion matrix. Resampling the examples
with replacement and summing their rows gives the score of each resample without re-reading anything; the interval
is the 2.5th and 97.5th percentile of those scores.

    scored = Scored(stats_NK, score)               # score(stats_K) -> a number (percent)
    low, high = bootstrap_interval(scored, resamples=1000, seed=0)

The resamples are drawn as rng.integers(0, N, size=(resamples, N)) with rng = numpy.random.default_rng(seed).
"""
import dataclasses
from typing import Callable

import numpy as np

CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Scored:
    """A metric over N examples: stats_NK, one row of sufficient statistics per example; score(stats_K), the metric
    of statistics summed over any set of examples."""
    stats_NK: np.ndarray
    score: Callable

    @property
    def value(self):
        """The metric over all the examples."""
        return float(self.score(self.stats_NK.sum(axis=0)))


def bootstrap_scores(scored, resamples, seed):
    """[resamples] the metric over each resample of the examples (drawn with replacement, as many as there are)."""
    n = len(scored.stats_NK)
    index_RN = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    return np.array([scored.score(scored.stats_NK[index_N].sum(axis=0)) for index_N in index_RN], np.float64)


def bootstrap_interval(scored, resamples=1000, seed=0, confidence=CONFIDENCE):
    """(low, high): the central `confidence` interval of the resampled metrics (percentiles, numpy's linear rule)."""
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(bootstrap_scores(scored, resamples, seed), [tail, 100 - tail])
    return float(low), float(high)
