"""bench/run.py end to end on the tiny suite (a subprocess, one CPU device): every column of every objective,
with figures that follow from the setup; and --memory_only, which compiles without running."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.setups import SUITES, t5_target_length  # noqa: E402
from xla_devices import xla_flags  # noqa: E402

TINY = SUITES["tiny"]["tasks"]


def run_bench(tmp_path, *flags):
    path = tmp_path / "bench.json"
    env = {**os.environ, "XLA_FLAGS": xla_flags(1), "PYTHONPATH": ROOT,
           "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}  # compiles faster; the figures are checked, not their size
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--suite", "tiny",
                           "--reference", "none", "--json", str(path), *flags],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(path.read_text()), proc.stdout


def test_tiny_suite_reports_every_column(tmp_path):
    out, stdout = run_bench(tmp_path, "--steps", "2")
    assert sorted(out["tasks"]) == ["clm", "mlm", "t5"]
    for task, r in out["tasks"].items():
        c = TINY[task]
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0 and r["steps"] == 2
        # tokens/s and MFU are the step time's consequences: batch x input length, analytic FLOPs / peak
        # (step_ms is rounded to 0.01 ms: a fast tiny step's relative rounding error can pass 1e-3)
        assert r["tokens_per_s"] == pytest.approx(c["batch"] * c["seq"] / (r["step_ms"] / 1000),
                                                  rel=max(1e-3, 0.006 / r["step_ms"]))
        # mfu is rounded to 4 decimals (+-5e-5) on top of step_ms's own rounding (relative 0.005 / step_ms)
        mfu = r["flops_per_step"] / (r["step_ms"] / 1000) / r["peak_flops"]
        assert 0 < r["mfu"] == pytest.approx(mfu, rel=0, abs=5.1e-5 + mfu * max(1e-3, 0.006 / r["step_ms"]))
        assert r["peak_source"] and r["memory_source"]
        assert r["memory_bytes"] > 0 and r["memory_estimate_bytes"] > 0
        # the state alone (params + two AdamW moments, float32) is part of what the step holds
        assert r["memory_bytes"] >= 3 * 4 * r["params"]
        assert r["host_ms"] >= 0 and 0 <= r["host_pct"]
        assert r["loss"] == pytest.approx(r["loss"]) and 0 < r["loss"] < 20  # finite, about ln(vocab)
        assert f"{r['tokens_per_s']:,.0f}" in stdout  # the table shows it
    assert out["tasks"]["t5"]["target_length"] == t5_target_length(TINY["t5"]["seq"])


def test_memory_only_compiles_without_running(tmp_path):
    out, stdout = run_bench(tmp_path, "--memory_only", "--tasks", "clm")
    r = out["tasks"]["clm"]
    assert out["memory_only"] and list(out["tasks"]) == ["clm"]
    assert r["memory_bytes"] == r["memory_estimate_bytes"] >= 3 * 4 * r["params"]
    assert "estimate" in r["memory_source"]
    assert "step_ms" not in r and "tokens_per_s" not in r  # nothing ran
    assert "GiB" in stdout


def test_rounds_report_medians_and_the_ratio_of_medians(monkeypatch):
    from bench import run
    ours, theirs = iter([100.0, 300.0, 200.0]), iter([50.0, 400.0, 100.0])
    peaks = iter([1e11, 0.5e11, 0.8e11])  # the second round's peak was measured in a busy moment

    def fake_bench_task(task, c, a):
        tokens_per_s = next(ours)
        return {"tokens_per_s": tokens_per_s, "step_ms": 1e6 / tokens_per_s, "mfu": 0.0, "flops_per_step": 2e9,
                "peak_flops": next(peaks)}
    monkeypatch.setattr(run, "bench_task", fake_bench_task)
    monkeypatch.setattr(run, "run_reference",
                        lambda python, task, c, a: {"hf-torch x": next(theirs), "hf-flax x": "error: boom"})
    a = run.parse_args(["--suite", "tiny", "--tasks", "clm", "--rounds", "3"])
    r = run.measure_rounds("clm", TINY["clm"], a, [], "python")
    assert [x["tokens_per_s"] for x in r["rounds"]] == [100, 300, 200]
    assert [x["reference"]["hf-torch x"] for x in r["rounds"]] == [50, 400, 100]
    assert r["tokens_per_s"] == 200 and r["step_ms"] == 5000  # the median round's
    assert r["peak_flops"] == 1e11 and r["mfu"] == 0.004  # against the highest peak
    assert r["reference"] == {"hf-torch x": 100, "hf-flax x": "error: boom"}
    assert r["ratios"] == {"hf-torch x": 2.0}  # median over median, not a median of per-round ratios
    with pytest.raises(run.UserError, match="--rounds 0"):
        run.parse_args(["--rounds", "0"])


def test_row_sources_read_the_shards_they_write(tmp_path):
    """--rows prepared / mixture: the host reads int32 rows of the uint16 shards through the loop's own readers, and
    the mixture draws its three sources (ShuffledRows / MixedRows: tested in test_prepared / test_mixture)."""
    import numpy as np
    from bench.row_sources import MIXTURE, row_source
    assert row_source("memory", 300, 8, 4, str(tmp_path)) is None
    for kind, names in (("prepared", ["train"]), ("mixture", list(MIXTURE))):
        rows = row_source(kind, 300, 8, 4, str(tmp_path))
        shards = {n: np.fromfile(tmp_path / f"{n}-000-00000.input_ids", np.uint16).reshape(-1, 8) for n in names}
        seen = {n: 0 for n in names}
        for step in range(20):
            got = rows.batch_rows(step, slice(None))
            assert got.dtype == np.int32 and got.shape == (4, 8)
            for row in got:
                owner = [n for n, s in shards.items() if (s == row).all(axis=1).any()]
                assert len(owner) == 1
                seen[owner[0]] += 1
        assert all(seen.values())  # every source is read
