"""MixedRows: rows of several sources by weight, deterministic from the seed, any step on its own (resume), each
source read in whole epochs; bad weights are one-line errors."""
import numpy as np
import pytest

from flaxlm.data.mixture import MixedRows, check_weights
from flaxlm.errors import UserError

SIZES, WEIGHTS, BATCH = (50, 30, 20), (0.6, 0.3, 0.1), 64


def sources():
    """Rows of 4 tokens whose first token names the source (1, 2, 3) and second the row."""
    return [np.stack([np.array([i + 1, r, 0, 0], np.int32) for r in range(n)]) for i, n in enumerate(SIZES)]


def walk(mixed, steps):
    return np.concatenate([mixed.batch_rows(s, slice(None)) for s in range(steps)])


def test_proportions_follow_the_weights_and_each_source_is_read_in_whole_epochs():
    mixed = MixedRows(sources(), WEIGHTS, BATCH, seed=0)
    rows = walk(mixed, 300)
    share = np.bincount(rows[:, 0], minlength=4)[1:] / len(rows)
    sigma = np.sqrt(np.array(WEIGHTS) * (1 - np.array(WEIGHTS)) / len(rows))
    assert np.all(np.abs(share - WEIGHTS) < 4 * sigma), share
    for i, n in enumerate(SIZES):
        drawn = rows[rows[:, 0] == i + 1, 1]
        whole = len(drawn) // n * n
        for epoch in drawn[:whole].reshape(-1, n):  # every row once per epoch, in a new order each time
            assert sorted(epoch) == list(range(n))
    np.testing.assert_allclose(mixed.epochs(300), np.bincount(rows[:, 0], minlength=4)[1:] / SIZES)
    early = mixed.epochs(2)  # 128 rows in: the first source repeats while the third is not read through
    assert early[0] > 1 > early[2]


def test_same_seed_same_rows_and_another_seed_others():
    a, b = (walk(MixedRows(sources(), WEIGHTS, BATCH, seed=3), 20) for _ in range(2))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, walk(MixedRows(sources(), WEIGHTS, BATCH, seed=4), 20))


def test_a_step_asked_alone_or_by_two_processes_has_the_rows_of_the_walk():
    straight = walk(MixedRows(sources(), WEIGHTS, BATCH, seed=0), 40).reshape(40, BATCH, 4)
    resumed = MixedRows(sources(), WEIGHTS, BATCH, seed=0)  # a run resumed at step 37
    assert np.array_equal(resumed.batch_rows(37, slice(None)), straight[37])
    assert np.array_equal(resumed.batch_rows(38, slice(None)), straight[38])
    halves = [MixedRows(sources(), WEIGHTS, BATCH, seed=0).batch_rows(39, slice(h * 32, h * 32 + 32)) for h in (0, 1)]
    assert np.array_equal(np.concatenate(halves), straight[39])
    assert np.array_equal(resumed.batch_rows(2, slice(None)), straight[2])  # back to an earlier step


def test_a_zero_weight_source_is_never_read_and_dict_rows_mix_too():
    rows = walk(MixedRows(sources(), (1, 0, 1), BATCH, seed=0), 10)
    assert set(rows[:, 0]) == {1, 3}
    dicts = [{"input_ids": s, "segment_ids": s + 100} for s in sources()]
    got = MixedRows(dicts, WEIGHTS, BATCH, seed=0).batch_rows(5, slice(None))
    want = MixedRows(sources(), WEIGHTS, BATCH, seed=0).batch_rows(5, slice(None))
    assert np.array_equal(got["input_ids"], want) and np.array_equal(got["segment_ids"], want + 100)


@pytest.mark.parametrize("weights,match", [
    ((0.5, 0.5), "gives 2 weights for 3 sources"),
    ((0.5, -0.1, 0.6), "weight -0.1; weights must be finite and not negative"),
    ((0, 0, 0), "weights are all zero"),
    ((1, float("nan"), 1), "weight nan"),
])
def test_bad_weights_are_one_line_errors(weights, match):
    with pytest.raises(UserError, match=match):
        check_weights(list(weights), 3)
