"""A mixture of row sources by weight (e.g. books 0.6, news 0.3, web 0.1), for the training loop.

    train_rows = MixedRows([books, news, web], [0.6, 0.3, 0.1], global_batch, seed)
    rows = train_rows.batch_rows(step, local)      # as ShuffledRows: any step, in any order

Each slot of step s's global batch takes its source at random by weight (a generator seeded by (seed, s)), and a
source gives its rows in its own epochs, each a seeded permutation of its rows (seed, source, epoch): the j-th row
drawn from source i is row perm_i(j // n_i)[j % n_i]. So every step's rows are known from the seed alone (a resumed
run sees the rows of the uninterrupted one; the draws before a step are counted again, about a microsecond a
step, when a run starts in the middle), a small source repeats while a large one has not been read through, and
epochs(step) says how often each source has been read (log_fields: in metrics.jsonl, split "data"). The sources
are any of rows.take_rows' kinds (numpy rows, PreparedRows, a Dataset) of one row length and kind.
"""
import math

import numpy as np

from flaxlm.data.rows import num_rows, take_rows
from flaxlm.errors import UserError

_MIX = 0x6d6978  # a constant in the source generator's seed: other than any epoch's


def check_weights(weights, n_sources, flag="--train_file_weights", sources_flag="--train_file"):
    """The weights normalized to sum 1; a UserError for a count that differs from the sources', a negative or
    non-finite weight, or all zero."""
    if len(weights) != n_sources:
        raise UserError(f"{flag} gives {len(weights)} weights for {n_sources} sources ({sources_flag}); give one "
                        f"weight per source, in the same order")
    bad = [w for w in weights if not math.isfinite(w) or w < 0]
    if bad:
        raise UserError(f"{flag} has the weight {bad[0]}; weights must be finite and not negative")
    if sum(weights) <= 0:
        raise UserError(f"{flag} weights are all zero; give at least one source a positive weight")
    return np.asarray(weights, np.float64) / sum(weights)


def unique_names(labels):
    """Sources' names for metrics.jsonl: letters, digits and _ only, numbered when two are alike."""
    names = ["".join(c if c.isalnum() else "_" for c in label) or "source" for label in labels]
    if len(set(names)) < len(names):
        names = [f"{name}_{i + 1}" for i, name in enumerate(names)]
    return names


class Mixture:
    """Training rows of several named sources with their weights, made into MixedRows (rows_by_step) once the loop's
    global batch is known."""

    def __init__(self, sources, weights, names, flag="--train_file_weights", sources_flag="--train_file"):
        self.sources, self.names = sources, names
        self.weights = check_weights(list(weights), len(sources), flag, sources_flag)

    def map_sources(self, fn):
        """The mixture of fn(source) of each source, same names and weights (e.g. each source's text made rows)."""
        return Mixture([fn(s) for s in self.sources], self.weights, self.names)

    def rows_by_step(self, global_batch, seed):
        return MixedRows(self.sources, self.weights, global_batch, seed, self.names)


class MixedRows:
    """Rows of several sources mixed by weight (module docstring), with ShuffledRows' interface for the loop, and
    log_fields(step) for metrics.jsonl: each source's rows, tokens and epochs drawn so far."""

    def __init__(self, sources, weights, global_batch, seed, names=None):
        self.p = check_weights(list(weights), len(sources))
        self.sources, self.global_batch, self.seed = sources, global_batch, seed
        self.names = names or [f"source_{i + 1}" for i in range(len(sources))]
        self.sizes = np.array([num_rows(s) for s in sources], np.int64)
        self.lengths = [getattr(s, "length", None) or _row_length(s) for s in sources]  # tokens of a row
        empty = [i for i, n in enumerate(self.sizes) if n == 0 and self.p[i] > 0]
        if empty:
            raise UserError(f"source {empty[0] + 1} of the mixture has no rows; give it text or weight 0")
        self.num_rows = int(self.sizes.sum())
        self.steps_per_epoch = max(1, self.num_rows // global_batch)  # an epoch: as many rows as all sources hold
        self._counted_to, self._counts = 0, np.zeros(len(sources), np.int64)
        self._perms = {}  # source -> (epoch, permutation)

    def epoch_of(self, step):
        return step // self.steps_per_epoch

    def sources_of(self, step):
        """int [global_batch]: the source of each slot of step's global batch."""
        rng = np.random.default_rng([self.seed, _MIX, step])
        return rng.choice(len(self.sources), self.global_batch, p=self.p)

    def drawn_before(self, step):
        """int [sources]: rows drawn from each source in the steps before `step`."""
        if step < self._counted_to:
            self._counted_to, self._counts = 0, np.zeros_like(self._counts)
        for s in range(self._counted_to, step):
            self._counts += np.bincount(self.sources_of(s), minlength=len(self.sources))
        self._counted_to = step
        return self._counts.copy()

    def epochs(self, step):
        """float [sources]: how many times each source has been read through before `step`."""
        return self.drawn_before(step) / np.maximum(self.sizes, 1)

    def log_fields(self, step):
        """{name_rows, name_tokens, name_epochs} of each source for the steps before `step`."""
        drawn, out = self.drawn_before(step), {}
        for name, length, n, size in zip(self.names, self.lengths, drawn, self.sizes):
            out.update({f"{name}_rows": int(n), f"{name}_tokens": int(n) * length,
                        f"{name}_epochs": round(float(n / max(size, 1)), 4)})
        return out

    def batch_rows(self, step, local):
        """The rows (this process's slice `local` of the global batch) for 0-based `step`."""
        source_B = self.sources_of(step)
        order = np.argsort(source_B, kind="stable")
        rank_B = np.empty(len(source_B), np.int64)  # each slot's place among its source's slots
        rank_B[order] = np.arange(len(source_B)) - np.searchsorted(source_B[order], source_B[order])
        draw_B = self.drawn_before(step)[source_B] + rank_B
        self.drawn_before(step + 1)  # counted on, so the next step costs one step's draws
        source_b, draw_b = source_B[local], draw_B[local]
        parts = {i: take_rows(self.sources[i], self._rows_of(i, draw_b[source_b == i]))
                 for i in np.unique(source_b)}
        return _placed(parts, source_b)

    def _rows_of(self, i, draws):
        """Row indices in source i of its draws (the j-th draw: epoch j // n, place j % n of that epoch's order)."""
        n = int(self.sizes[i])
        out = np.empty(len(draws), np.int64)
        for epoch in np.unique(draws // n):
            at = draws // n == epoch
            out[at] = self._perm(i, int(epoch))[draws[at] % n]
        return out

    def _perm(self, i, epoch):
        if self._perms.get(i, (None,))[0] != epoch:
            self._perms[i] = (epoch, np.random.default_rng([self.seed, i, epoch]).permutation(int(self.sizes[i])))
        return self._perms[i][1]


def _row_length(rows):
    """Tokens in a row of `rows` (0 when it has none)."""
    if num_rows(rows) == 0:
        return 0
    first = take_rows(rows, np.arange(1))
    return (next(iter(first.values())) if isinstance(first, dict) else first).shape[-1]


def _placed(parts, source_b):
    """The rows of each source (arrays, or dicts of arrays) put in the slots of source_b."""
    first = next(iter(parts.values()))
    if isinstance(first, dict):
        return {k: _placed({i: p[k] for i, p in parts.items()}, source_b) for k in first}
    out = np.empty((len(source_b), *first.shape[1:]), first.dtype)
    for i, rows in parts.items():
        out[source_b == i] = rows
    return out
