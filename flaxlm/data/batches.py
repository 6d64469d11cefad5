"""Which rows of the corpus make the batch of each step, so that a resumed run sees the same data.

ShuffledRows: epochs over fixed rows in a seeded order; the rows of any step are known without
reading the steps before it. StreamRows: rows read in order from a stream (--streaming); a resumed
run skips the rows already consumed. Both hand each process only its slice of the global batch.
"""
import numpy as np

from flaxlm.errors import UserError


def take_rows(rows, idx):
    """rows[idx] for a numpy array, a dict of equal-length numpy arrays (one entry per example field, as
    fine-tuning uses) or a `datasets.Dataset` with an input_ids column."""
    if isinstance(rows, np.ndarray):
        return rows[idx]
    if isinstance(rows, dict):
        return {k: v[idx] for k, v in rows.items()}
    if "segment_ids" in rows.column_names:  # packed lines (flaxlm.data.packing): both columns
        got = rows[idx]
        return {k: np.asarray(got[k], dtype=np.int32) for k in ("input_ids", "segment_ids")}
    return np.asarray(rows[idx]["input_ids"], dtype=np.int32)


def num_rows(rows):
    """How many examples `rows` holds (any of take_rows' kinds)."""
    return len(next(iter(rows.values()))) if isinstance(rows, dict) else len(rows)


class ShuffledRows:
    def __init__(self, rows, global_batch, seed):
        self.rows, self.global_batch, self.seed = rows, global_batch, seed
        self.num_rows = num_rows(rows)
        self.steps_per_epoch = self.num_rows // global_batch
        if self.steps_per_epoch == 0:
            raise UserError(f"the training data has {self.num_rows} examples, fewer than one global batch "
                            f"of {global_batch}; add data or lower the batch size")
        self._epoch, self._perm = None, None

    def epoch_of(self, step):
        return step // self.steps_per_epoch

    def batch_rows(self, step, local):
        """The rows (this process's slice `local` of the global batch) for 0-based `step`."""
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
        idx = self._perm[i * self.global_batch:(i + 1) * self.global_batch][local]
        return take_rows(self.rows, idx)


class StreamRows:
    """Rows from `open_stream(skip)` (an iterator of int32 [L] rows that starts after `skip` rows and
    runs over the corpus again when it ends); batches must be asked for in step order. A stream cannot
    be entered in the middle of a batch, so every process reads the global batch and keeps its slice."""

    def __init__(self, open_stream, global_batch):
        self.open_stream, self.global_batch = open_stream, global_batch
        self._it, self._next_step = None, None
        self.steps_per_epoch = None

    def epoch_of(self, step):
        return 0

    def batch_rows(self, step, local):
        if self._next_step != step:
            self._it = self.open_stream(step * self.global_batch)
        rows = [next(self._it) for _ in range(self.global_batch)]
        self._next_step = step + 1
        return np.stack(rows)[local].astype(np.int32)


def eval_batches(rows, global_batch, local, pad_id):
    """Every row of the validation set once, in order, as (rows, real): this process's slice `local` of
    each global batch (only those rows are read) and a bool per row, False for the rows of pad_id that
    fill up the last batch (the loop gives those no weight, so every metric excludes them). Dict rows are
    filled up with zeros, their input_ids with pad_id."""
    n = num_rows(rows)
    if n == 0:
        return
    first = take_rows(rows, np.arange(1))
    for start in range(0, n, global_batch):
        idx = np.arange(start, start + global_batch)[local]
        real = idx < n
        got = take_rows(rows, idx[real]) if real.any() else None
        if isinstance(first, dict):
            chunk = {k: _filled(v, len(idx), pad_id if k == "input_ids" else 0) for k, v in first.items()}
            for k in chunk:
                if got is not None:
                    chunk[k][real] = got[k]
        else:
            chunk = _filled(first, len(idx), pad_id)
            if got is not None:
                chunk[real] = got
        yield chunk, real


def _filled(example, n, value):
    """n rows shaped and typed like example's rows, all `value`."""
    return np.full((n, *example.shape[1:]), value, dtype=example.dtype)
