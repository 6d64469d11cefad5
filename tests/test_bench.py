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


def test_dropout_rows_llama_and_the_profile_table(tmp_path):
    """--dropout both: a dropout-0 row and a config-dropout row per task (one where the config's rates are all 0,
    as llama's); --profile: every op of the traced steps in a category, the categories and the idle host adding up
    to the traced wall time, and the step's known parts (attention, matmuls, LM head and loss, optimizer) found."""
    out, stdout = run_bench(tmp_path, "--tasks", "clm", "llama", "--dropout", "both", "--steps", "1",
                            "--profile", str(tmp_path / "profile"))
    assert list(out["tasks"]) == ["clm-dropout0", "clm", "llama"] and out["dropout"] == "both"
    rates = {k: r["dropout_rates"] for k, r in out["tasks"].items()}
    assert rates["clm-dropout0"] == {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    assert rates["clm"] == {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}  # GPT2Config's
    assert rates["llama"] == {"attention_dropout": 0.0}
    assert "dropout 0 (every rate" in stdout and "dropout 0.1 (the config's)" in stdout
    for key, r in out["tasks"].items():
        p = r["profile"]
        assert sum(v["pct"] for v in p["categories"].values()) == pytest.approx(100, abs=1)
        for part in ("attention", "matmuls", "LM head and loss", "optimizer"):
            assert p["categories"][part]["ms"] > 0, (key, part)
        assert p["top_ops"] and p["unattributed_ms"] == 0
    assert stdout.count("where a step's time goes") == 3


def test_a_row_out_of_memory_runs_again_at_half_the_batch(monkeypatch):
    from bench import run
    tried = []

    def fake_bench_row(task, c, a):
        tried.append(c["batch"])
        if c["batch"] > 2:
            return {"error": "out of memory", "oom": True}
        return {"tokens_per_s": 100.0, "step_ms": 1.0, "batch": c["batch"], "mfu": 0.1, "flops_per_step": 1,
                "peak_flops": 1}
    monkeypatch.setattr(run, "bench_row", fake_bench_row)
    monkeypatch.setattr(run, "run_reference", lambda python, task, c, a: {"hf-torch x": c["batch"] * 25.0})
    a = run.parse_args(["--suite", "tiny", "--tasks", "clm"])
    r = run.measure_rounds("clm", {**TINY["clm"], "dropout": "config"}, a, [], "python")
    assert tried == [8, 4, 2] and r["batch_halved_from"] == [8, 4] and r["batch"] == 2
    assert r["ratios"] == {"hf-torch x": 2.0}  # the reference ran at the batch that fit: 2 rows
    r0 = {**r, "tokens_per_s": 125.0}
    t = run.check_targets(r, {"dropout0_ratio": 0.8, "tokens_per_s": 150}, dropout0=r0)
    assert t["dropout0_ratio"] == {"target": 0.8, "measured": 0.8, "met": True}
    assert t["tokens_per_s"]["met"] is False
    a = run.parse_args(["--suite", "tiny", "--tasks", "clm", "--no-halve_on_oom"])
    assert run.measure_rounds("clm", {**TINY["clm"], "dropout": "config"}, a, [], None)["oom"]


def test_nanogpt_reference_is_gpt2():
    """bench/nanogpt_reference.py's model with transformers' GPT-2 weights computes GPT2LMHeadModel's logits
    (float64); its vocabulary is padded to a multiple of 64; one train step runs."""
    torch = pytest.importorskip("torch")
    import transformers as tr
    from types import SimpleNamespace
    from bench.nanogpt_reference import gpt2_model, time_steps
    vocab, hidden, layers, heads, seq = 500, 32, 2, 4, 16
    theirs = tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                                              n_positions=seq)).double().eval()
    ours = gpt2_model(vocab, hidden, layers, heads, 4 * hidden, seq, 0.0).double().eval()
    assert ours.wte.weight.shape == (512, hidden) and ours.lm_head.weight is ours.wte.weight
    sd = theirs.transformer.state_dict()
    with torch.no_grad():
        ours.wte.weight[:vocab] = sd["wte.weight"]
        for name, p in ours.named_parameters():
            if name == "wte.weight":
                continue
            w = sd[name]  # the same names: wpe, h.N.ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc ..., ln_f
            p.copy_(w.T if w.dim() == 2 and name.startswith("h.") else w)  # Conv1D keeps (in, out)
    ids = torch.randint(0, vocab, (2, seq))
    got, want = ours(ids)[..., :vocab], theirs(ids).logits
    assert (got - want).abs().max() < 1e-9
    c = {**TINY["clm"], "dropout": "config"}
    step_s, peak = time_steps(SimpleNamespace(task="clm", device="cpu", dtype="float32", compile=False, steps=1), c)
    assert step_s > 0 and peak is None


def test_gpu_suite_rows_and_their_targets(monkeypatch, tmp_path, capsys):
    """The gpu suite's causal LM: a dropout-0 row, then the config's (0.1), each with its own targets: 470k tokens/s
    at dropout 0, 0.8x of that rate at 0.1 (figures faked: no GPU here)."""
    from bench import run

    def fake_bench_row(task, c, a):
        tokens_per_s = 500_000.0 if c["dropout"] == "0" else 390_000.0
        return {"config": c["name"], "dropout": c["dropout"], "dropout_label": c["dropout"], "dtype": a.dtype,
                "device": "fake", "devices": 1, "params": 1, "compile_s": 1.0, "chunks": 1, "batch": c["batch"],
                "step_ms": 1000 * c["batch"] * c["seq"] / tokens_per_s, "tokens_per_s": tokens_per_s, "mfu": 0.4,
                "peak_flops": 1.0, "peak_source": "fake", "host_ms": 1.0, "host_pct": 1.0, "rows": "memory",
                "memory_bytes": 2 ** 30, "memory_source": "fake", "memory_estimate_parts": {},
                "state_bytes_per_device": {"params": 0, "optimizer": 0}, "param_dtype": "float32", "sharding": "data"}
    monkeypatch.setattr(run, "bench_row", fake_bench_row)
    path = tmp_path / "gpu.json"
    run.main(["--suite", "gpu", "--tasks", "clm", "--reference", "none", "--no-process_per_task", "--json", str(path)])
    out = json.loads(path.read_text())
    assert list(out["tasks"]) == ["clm-dropout0", "clm"] and out["dropout"] == "both"
    t0, t1 = out["tasks"]["clm-dropout0"]["targets"], out["tasks"]["clm"]["targets"]
    assert t0["tokens_per_s"] == {"target": 470_000, "measured": 500_000.0, "met": True}
    assert t0["nanogpt_ratio"]["met"] is None  # no reference ran
    assert t1["dropout0_ratio"] == {"target": 0.8, "measured": 0.78, "met": False} and "tokens_per_s" not in t1
    assert "target >= 0.8x: MISSED" in capsys.readouterr().out


PROFILED_HLO = '''HloModule jit_step, is_scheduled=true

FileNames
1 "/site-packages/optax/_src/transform.py"
2 "/work/flaxlm/models/gpt2.py"

FunctionNames
1 "scale_by_adam.<locals>.update_fn"
2 "Block.__call__"

FileLocations
1 {file_name_id=1 function_name_id=1 line=1 end_line=1 column=0 end_column=1}
2 {file_name_id=2 function_name_id=2 line=1 end_line=1 column=0 end_column=1}

StackFrames
1 {file_location_id=2 parent_frame_id=1}
2 {file_location_id=1 parent_frame_id=2}

%fused_update (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %m = f32[4]{0} multiply(%p, %p), metadata={op_name="jit(step)/mul" stack_frame_id=2}
}

%fused_dot (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  ROOT %d = f32[4,4]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={stack_frame_id=1}
}

ENTRY %main (x: f32[4], y: f32[4,4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %y = f32[4,4]{1,0} parameter(1)
  %fusion.3 = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_update
  %gemm_fusion.1 = f32[4,4]{1,0} fusion(%y), kind=kCustom, calls=%fused_dot
  %custom-call.2 = f32[4,4]{1,0} custom-call(%y), custom_call_target="__cudnn$fmhaSoftmax"
  ROOT %add.1 = f32[4]{0} add(%fusion.3, %x)
}
'''


def gpu_trace(lines):
    """A jax.profiler.ProfileData of one GPU plane: lines = {line name: [(kernel, start ms, ms, {stat: value})]}."""
    from jax.profiler import ProfileData
    names = sorted({e[0] for events in lines.values() for e in events})
    stats = ["hlo_op", "hlo_module"]
    text = 'planes { id: 1 name: "/device:GPU:0"\n'
    for i, (line, events) in enumerate(lines.items()):
        text += f'lines {{ id: {i + 1} name: "{line}" timestamp_ns: 0\n'
        for kernel, start, ms, kw in events:
            text += (f"events {{ metadata_id: {names.index(kernel) + 1} offset_ps: {int(start * 1e9)} "
                     f"duration_ps: {int(ms * 1e9)} ")
            text += " ".join(f'stats {{ metadata_id: {stats.index(k) + 1} str_value: "{v}" }}' for k, v in kw.items())
            text += "}\n"
        text += "}\n"
    for kind, table in (("event_metadata", names), ("stat_metadata", stats)):
        text += "".join(f'{kind} {{ key: {i + 1} value {{ id: {i + 1} name: "{n}" }} }}\n' for i, n in enumerate(table))
    return ProfileData.from_text_proto(text + "}\n")


def test_profile_categories_of_a_gpu_trace():
    """bench/profile_step.py on GPU-shaped traces (built here; no GPU): kernels sorted by their HLO op's source
    stack and contents (an optax fusion -> optimizer, a dot fusion -> matmuls, cuDNN's fmha -> attention), other
    programs apart, kernels without an op by name, an "XLA Ops" line preferred to the streams it summarises,
    the idle time the host's; two steps."""
    from bench.profile_step import breakdown, source_stacks
    assert source_stacks(PROFILED_HLO) == {1: ["/work/flaxlm/models/gpt2.py:Block.__call__"],
                                           2: ["/site-packages/optax/_src/transform.py:scale_by_adam.<locals>."
                                               "update_fn", "/work/flaxlm/models/gpt2.py:Block.__call__"]}
    ours = {"hlo_module": "jit_step"}
    stream = [("loop_fusion", 0, 2, {"hlo_op": "fusion.3", **ours}), ("sm90_xmma_gemm_bf16", 3, 1, {}),
              ("fmha_kernel", 4, 1, {"hlo_op": "custom-call.2", **ours}),
              ("fold_in", 6, 1, {"hlo_op": "fusion.3", "hlo_module": "jit_fold_in"}),
              ("loop_fusion", 10, 2, {"hlo_op": "fusion.3", **ours})]
    b = breakdown(gpu_trace({"Stream #7(Compute)": stream}), PROFILED_HLO, steps=2, wall_s=20e-3)
    ms = {k: v["ms"] for k, v in b["categories"].items()}
    assert ms == {"attention": 0.5, "matmuls": 0.5, "LM head and loss": 0.0, "optimizer": 2.0,
                  "elementwise and other": 0.0, "other programs": 0.5, "host (device idle)": 6.5}
    assert b["unattributed_ms"] == 0.5 and b["top_ops"][0] == {"op": "fusion.3", "category": "optimizer",
                                                                "ms": 2.0, "count": 1}
    xla_ops = [("gemm_fusion.1", 0, 4, {}), ("add.1", 5, 1, {})]
    b = breakdown(gpu_trace({"XLA Ops": xla_ops, "Stream #7(Compute)": stream}), PROFILED_HLO, 1, 10e-3)
    ms = {k: v["ms"] for k, v in b["categories"].items() if v["ms"]}
    assert ms == {"matmuls": 4.0, "elementwise and other": 1.0, "host (device idle)": 5.0}
