"""Where bench/run.py's host side gets each step's rows (--rows): the loop's own row readers over rows on disk.

    rows = row_source("mixture", vocab, row_len, batch, tmp_dir)   # None for "memory"
    ids_BL = rows.batch_rows(step, slice(None))

memory:   one fixed array of random ids (no reading: the step's collation alone);
prepared: a prepared directory's shard (uint16 or uint32 ids, as prepare_data.py writes them) read through
          PreparedRows' memory map by ShuffledRows, as `--prepared_data DIR` trains;
mixture:  three such sources (books 0.6, news 0.3, web 0.1) drawn by MixedRows, as `--prepared_data A B C
          --prepared_data_weights 0.6 0.3 0.1` trains.
The shards are written just before (so they are in the page cache, as a corpus read once is).
"""
import os

import numpy as np

ROWS = ("memory", "prepared", "mixture")
MIXTURE = {"books": 0.6, "news": 0.3, "web": 0.1}


def row_source(kind, vocab, row_len, batch, tmp_dir, batches_per_source=64, seed=0):
    """None for "memory", else a ShuffledRows / MixedRows over shards of random ids written to tmp_dir."""
    if kind == "memory":
        return None
    # imported here: flaxlm.data.rows needs `datasets`, which the GPU machine's image lacks (bench/gpu_session.sh)
    from flaxlm.data.mixture import MixedRows
    from flaxlm.data.prepared import PreparedRows, row_dtype
    from flaxlm.data.rows import ShuffledRows
    names = ["train"] if kind == "prepared" else list(MIXTURE)
    dtype, n = row_dtype(vocab), batches_per_source * batch
    sources = []
    for i, name in enumerate(names):
        ids = np.random.default_rng([seed, i]).integers(5, vocab - 100, size=(n, row_len)).astype(dtype)
        shard = f"{name}-000-00000"
        ids.tofile(os.path.join(tmp_dir, f"{shard}.input_ids"))
        sources.append(PreparedRows([(tmp_dir, {"name": shard, "rows": n})], row_len, dtype, ["input_ids"]))
    if kind == "prepared":
        return ShuffledRows(sources[0], batch, seed)
    return MixedRows(sources, list(MIXTURE.values()), batch, seed, names)
