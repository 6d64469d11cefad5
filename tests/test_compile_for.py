"""--compile_for: TPU slices by name, the TPU compiler's HBM per device, a run that does not fit, the errors a user
can cause, the scripts that fine-tune, ELECTRA's pair, train.py's key, and bench/run.py's target (each model
module's pretraining script: tests/test_compile_for_families.py)."""
import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import run_classification
import run_clm_flax
import run_electra_flax
import run_helpers
from flaxlm.errors import UserError
from flaxlm.platform import building_for, platform
from flaxlm.planning.tpu_slices import GENERATIONS, parse_name, tpu_slice
from tpu_compile import needs_libtpu

pytestmark = needs_libtpu


@pytest.mark.parametrize("name, topology, devices, hosts", [
    ("v3-8", "v3:2x2", 8, 1), ("v4-8", "v4:2x2x1", 4, 1), ("v4-32", "v4:2x2x4", 16, 4), ("v5e-8", "v5e:2x4", 8, 1),
    ("v5litepod-16", "v5e:4x4", 16, 4), ("v5p-16", "v5:2x2x2", 8, 2), ("v6e-8", "v6e:2x4", 8, 1),
    ("v6e-16", "v6e:4x4", 16, 4)])
def test_slices_by_the_names_users_rent_them_under(name, topology, devices, hosts):
    target = tpu_slice(name)
    assert (target.topology, target.num_devices, target.hosts) == (topology, devices, hosts)
    assert target.devices[0].platform == "tpu" and target.devices[0].device_kind == target.generation.kind


@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_hbm_per_device_is_what_the_tpu_compiler_allows(generation):
    """Each generation's hbm_gib is the figure libtpu's compiler gives when a program needs more."""
    target = tpu_slice(f"{generation}-8")
    mesh = jax.sharding.Mesh(np.asarray(target.devices), ("data",))
    too_big = jax.ShapeDtypeStruct((target.num_devices * 1024, 2 ** 26), jnp.float32,  # 256 GiB a device
                                   sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    with pytest.raises(jax.errors.JaxRuntimeError, match="exceeds available HBM") as e:
        jax.jit(lambda x: x * 2).lower(too_big).compile()
    assert float(re.search(r"available HBM \((\d+\.\d+)G\)", str(e.value)).group(1)) == target.generation.hbm_gib


def test_unknown_slice_and_missing_libtpu_are_one_line(monkeypatch):
    with pytest.raises(UserError, match=r"--compile_for v5e-9 is not a TPU slice known here; use one of v2-8, .*v5e-8"):
        parse_name("v5e-9")
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else find_spec(name, *a))
    with pytest.raises(UserError, match=r"--compile_for needs libtpu.*pip install -r requirements-tpu.txt"):
        tpu_slice("v5e-8")


def test_a_step_is_traced_for_the_tpu_not_for_the_cpu_it_is_compiled_on():
    """The CPU-only form of the weight gradient (flaxlm.models.matmul) stays out of a program built for a TPU."""
    from flaxlm.models.matmul import dot_general

    def grad_text():
        f = lambda x, w: dot_general(x, w, (((1,), (0,)), ((), ()))).sum()  # noqa: E731
        return str(jax.make_jaxpr(jax.grad(f, argnums=1))(jnp.ones((4, 3)), jnp.ones((3, 2))))
    assert platform() == "cpu" and "optimization_barrier" in grad_text()
    with building_for("tpu"):
        assert platform() == "tpu" and "optimization_barrier" not in grad_text()
    assert platform() == "cpu"


@pytest.fixture(scope="module")
def gpt2_dir(model_dir_for):
    return model_dir_for("gpt2-tiny", vocab_size=304)


def clm_args(model_dir, corpus, *extra):
    return ["--config_name", model_dir, "--tokenizer_name", model_dir, "--train_file", corpus["train"],
            "--block_size", "32", "--dtype", "bfloat16", *extra]


def test_nothing_is_written_and_no_output_dir_is_needed(gpt2_dir, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    r = run_clm_flax.main(clm_args(gpt2_dir, corpus, "--output_dir", str(out), "--compile_for", "v4-8",
                                   "--gradient_accumulation_steps", "2", "--per_device_train_batch_size", "3"))
    assert not out.exists()
    printed = capsys.readouterr().out
    assert "global batch 24 (4 devices x 3 x 2 accumulation)" in printed and "fits v4-8" in printed
    assert printed.count("TPU attention (auto): GPT-2 drops out attention probabilities (attn_pdrop=0.1 in "
                         "config.json), which the splash kernel cannot") == 1  # gpt2-tiny's rate, once
    assert r["train_batch"] / 6 == r["eval_batch"] / 8  # per device: 2 pieces of 3 rows; 8 rows (the default)
    # no --output_dir; a run that does not evaluate compiles its train step alone
    r = run_clm_flax.main(clm_args(gpt2_dir, corpus, "--compile_for", "v4-8", "--do_eval", "false"))
    assert r["params"] > 0 and r["eval"] is None and r["compile_s"][1] == 0
    printed = capsys.readouterr().out
    assert re.search(r"^  per device \(GiB\) +train step$", printed, re.M)  # the table's one column
    assert "(train step; no eval step: --do_eval false)" in printed
    assert platform() == "cpu"  # what runs next in this process (a test, a notebook's real run) is built for the CPU


def test_auto_attention_is_splash_from_v4_on_and_xla_on_v3(model_dir_for, corpus, capsys):
    """Mosaic cannot compile the splash kernel for a TPU v3 (or v2): there `auto` attends with XLA, and an explicit
    splash is one line; from v4 on `auto` runs the kernel (a Llama: no attention dropout; rows of 128, a multiple of
    the kernel's blocks)."""
    llama_dir = model_dir_for("llama-tiny", model_max_length=128)

    def kernels(slice_, *extra):
        argv = clm_args(llama_dir, corpus, "--compile_for", slice_, "--do_eval", "false", *extra)
        argv[argv.index("--block_size") + 1] = "128"
        return run_clm_flax.main(argv)["kernels"]
    assert kernels("v3-8") == 0 and kernels("v4-8") >= 2  # the forward and backward kernels
    with pytest.raises(UserError, match=r"^--attention_implementation splash needs a TPU v4 or newer: .*TPU v3 "
                                        r"\(v3-8\); use auto"):
        kernels("v3-8", "--attention_implementation", "splash")


def test_a_run_too_big_for_the_slice_is_one_line_with_what_would_help(gpt2_dir, tmp_path, corpus):
    """A vocabulary of 16M tokens: 2 GiB of float32 embeddings, 6 GiB with AdamW's moments, on each chip of a
    v5e-4 (16 GiB) with --sharding data and a batch whose logits need more: the compiler's or our own verdict,
    exit 2 through run_main, with the flags that would help."""
    big = tmp_path / "big"
    big.mkdir()
    for name in os.listdir(gpt2_dir):
        (big / name).write_bytes((pathlib.Path(gpt2_dir) / name).read_bytes())
    config = json.loads((big / "config.json").read_text())
    config["vocab_size"] = 2 ** 24
    (big / "config.json").write_text(json.dumps(config))
    argv = clm_args(str(big), corpus, "--compile_for", "v5e-4", "--per_device_train_batch_size", "64",
                    "--lm_head_chunk_rows", "0")
    with pytest.raises(UserError, match=r"the run does not fit v5e-4: .*GiB.*; try --sharding fsdp; "
                                        r"--remat_policy full \(or dots_saveable\); --scan_layers; "
                                        r"--per_device_train_batch_size 32 --gradient_accumulation_steps 2"):
        run_clm_flax.main(argv)
    done = run_helpers.run_script("run_clm_flax.py", argv)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "does not fit v5e-4" in done.stderr


def test_electra_pair_compiles(model_dir_for, corpus, capsys):
    """DeBERTa-v3's pair (gdes sharing) compiles its train step for a slice with FSDP (the eval step, both models'
    forward, is the train step's without the update: --do_eval false halves the test's time)."""
    gen, disc = model_dir_for("deberta-v3-tiny-generator"), model_dir_for("deberta-v3-tiny")
    r = run_electra_flax.main(["--config_name", disc, "--generator_config_name", gen, "--tokenizer_name", disc,
                               "--train_file", corpus["train"], "--max_seq_length", "32", "--embedding_sharing",
                               "gdes", "--compile_for", "v5e-8", "--sharding", "fsdp", "--do_eval", "false"])
    assert r["compiled_flops"] > 0 and "fits v5e-8" in capsys.readouterr().out


def test_fine_tuning_compiles_from_its_labeled_examples(tmp_path, capsys):
    """run_classification.py reads its examples (the labels and row width), compiles, writes nothing."""
    from test_sentence_prediction import sentences, write_tsv
    (tmp_path / "pretrained").mkdir()
    pretrained = run_helpers.tiny_pretrained_roberta(tmp_path / "pretrained", [s for s, _ in sentences(50, 0)])
    train = write_tsv(tmp_path / "train.tsv", sentences(40, 1))
    r = run_classification.main(["--model_name_or_path", pretrained, "--train_file", train,
                                 "--validation_file", train, "--compile_for", "v6e-4", "--output_dir",
                                 str(tmp_path / "run")])
    assert "fits v6e-4" in capsys.readouterr().out and r["params"] > 0 and not (tmp_path / "run").exists()


def test_train_py_takes_it_as_runtime_compile_for(model_dir_for, corpus, tmp_path, capsys):
    import train
    tokenizer = model_dir_for(None, vocab_size=304)
    train.main(["--experiment", "gpt2/clm", "--params_override",
                f"task.model.preset=gpt2-tiny,task.model.tokenizer_name={tokenizer},runtime.compile_for=v5e-4,"
                f"task.train_data.input_path={corpus['train']},task.data.block_size=32"])
    assert "fits v5e-4" in capsys.readouterr().out


def test_bench_memory_plan_from_the_tpu_compiler(capsys):
    import bench.run
    bench.run.main(["--suite", "tiny", "--tasks", "clm", "--compile_for", "v5e-8", "--sharding", "fsdp"])
    printed = capsys.readouterr().out
    assert "TPU v5 lite x8" in printed and re.search(r"HBM per device +15\.75 GiB +v5e-8: headroom 15\.7", printed)
