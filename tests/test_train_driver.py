"""train.py: registry, config layering and errors, one option per key, and a tiny roberta/mlm run with a
continuous-evaluation job beside it."""
import collections
import dataclasses
import glob
import importlib
import json
import os
import re
import subprocess
import sys
import time

import pytest

import train
from run_helpers import read_metrics
from flaxlm.config import options as all_args
from flaxlm.config.cli import parse_args
from flaxlm.errors import UserError
from flaxlm.secrets import redact_argv
from flaxlm.config.experiments import DRIVER_READ, DRIVER_SET, leaves, options_of, resolve, to_argv, to_yaml
from flaxlm.config.experiment_registry import EXPERIMENTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "models", "roberta_tiny.yaml")


def config_of(name, files=(), overrides=()):
    return resolve(EXPERIMENTS[name].config_class(), files, overrides, EXPERIMENTS[name].script)


def test_layering_defaults_then_files_in_order_then_overrides(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("task:\n  data: {max_seq_length: 64}\ntrainer:\n  train_steps: 100\n"
                     "  optimizer: {learning_rate: 1.0e-4, warmup_steps: 10}\n")
    second.write_text("trainer.optimizer.warmup_steps: 20\ntrainer:\n  optimizer:\n    learning_rate: 2.0e-4\n")
    c = config_of("roberta/mlm", [str(first), str(second)], ["trainer.optimizer.learning_rate=3e-4"])
    assert c.trainer.optimizer.learning_rate == 3e-4  # the override beats both files
    assert c.trainer.optimizer.warmup_steps == 20  # the second file beats the first
    assert (c.task.data.max_seq_length, c.trainer.train_steps) == (64, 100)  # only the first file sets these
    assert (c.trainer.optimizer.adam_beta2, c.task.model.preset) == (0.98, "roberta-base")  # registry defaults
    assert c.trainer.optimizer.adam_beta1 == 0.9 and c.trainer.seed == 42  # options.py defaults
    assert config_of("bert/sentence_prediction").trainer.optimizer.learning_rate == 2e-5


def test_override_syntax_dotted_yaml_and_json():
    dotted = config_of("roberta/mlm", overrides=[
        "task.train_data.input_path=[a.txt, 'b,c.txt'],trainer.train_steps=7,trainer.eval_at_start=true",
        "task.model.tokenizer_name=tok,runtime.process_id=null"])
    as_yaml = config_of("roberta/mlm", overrides=[
        "{task: {train_data: {input_path: [a.txt, 'b,c.txt']}}, trainer: {train_steps: 7, eval_at_start: true}}",
        "task.model.tokenizer_name: tok"])
    as_json = config_of("roberta/mlm", overrides=[
        '{"task": {"train_data": {"input_path": ["a.txt", "b,c.txt"]}, "model": {"tokenizer_name": "tok"}}, '
        '"trainer.train_steps": 7, "trainer.eval_at_start": true}'])
    assert dotted == as_yaml == as_json
    assert dotted.task.train_data.input_path == ["a.txt", "b,c.txt"]
    assert dotted.trainer.train_steps == 7 and dotted.trainer.eval_at_start is True
    single = config_of("roberta/mlm", overrides=["task.train_data.input_path=x.txt"])
    assert single.task.train_data.input_path == ["x.txt"]  # a list option takes one value too


def test_tokens_are_neither_written_nor_printed():
    config = config_of("roberta/mlm", overrides=["task.model.token=hf_SECRET,export.hub_token=hf_SECRET2"])
    assert "hf_SECRET" not in to_yaml(config) and "token: null  # --token (given, not written" in to_yaml(config)
    argv = to_argv(EXPERIMENTS["roberta/mlm"].groups, options_of(config))
    assert "--token=hf_SECRET" in argv and "SECRET" not in " ".join(redact_argv(argv))


@pytest.mark.parametrize("override, message", [
    ("trainer.optimizer.learning_rte=1e-4", "unknown key 'trainer.optimizer.learning_rte'; did you mean "
                                            "trainer.optimizer.learning_rate"),
    ("learning_rate=1e-4", "unknown key 'learning_rate'; did you mean trainer.optimizer.learning_rate?"),
    ("task.train_data.train_file=x", "did you mean task.train_data.input_path?"),
    ("task.squad.doc_stride=64", "'task.squad.doc_stride' (--doc_stride) does not apply to this experiment"),
    ("trainer.optimizer.learning_rate=fast", "'trainer.optimizer.learning_rate' has a bad value 'fast'"),
    ("trainer.train_steps=2.5", "'trainer.train_steps' has a bad value '2.5'"),
    ("{trainer: {optimizer: 3}}", "'trainer.optimizer' is a section"),
    ("trainer.optimizer.warmup_steps=-1", "'trainer.optimizer.warmup_steps': --warmup_steps -1 is out of range"),
    ("runtime.sharding=tensor", "'runtime.sharding' must be one of data, fsdp"),
])
def test_bad_keys_and_values_name_the_key(override, message):
    with pytest.raises(UserError, match=re.escape(message)):
        train.main(["--experiment=roberta/mlm", "--print_config", f"--params_override={override}"])


def test_unknown_experiment_lists_the_known_ones_in_one_line():
    proc = subprocess.run([sys.executable, "train.py", "--experiment=bert/glue", "--model_dir=/nonexistent/x"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "unknown experiment 'bert/glue'" in proc.stderr
    assert all(name in proc.stderr for name in EXPERIMENTS)


def test_a_preset_needs_a_tokenizer_and_nothing_is_written(tmp_path):
    with pytest.raises(UserError, match="task.model.preset roberta-tiny needs task.model.tokenizer_name"):
        train.main(["--experiment=roberta/mlm", f"--model_dir={tmp_path / 'run'}", f"--config_file={TINY}"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_option_of_the_script_is_one_key(name, capsys):
    """Each option of the script's groups (less those it does not read) is exactly one key (or set by train.py's own
    flags), with options.py's type and help; the script's parser takes exactly these options."""
    experiment = EXPERIMENTS[name]
    fields = {f.name: f for f in all_args.script_fields(experiment.groups, experiment.script)}
    keys = leaves(experiment.config_class())
    counts = collections.Counter(f.metadata["option"] for f in keys.values())
    assert set(counts) == (set(fields) - set(DRIVER_SET)) | set(DRIVER_READ)
    assert set(counts.values()) == {1}
    for key, f in keys.items():
        original = fields.get(f.metadata["option"]) or all_args.ConfigArgs.__dataclass_fields__[f.metadata["option"]]
        assert f.type == original.type and f.metadata["help"] == original.metadata["help"], key
    script = importlib.import_module(experiment.script)
    with pytest.raises(SystemExit):
        script.main(["--help"])
    flags = set(re.findall(r"^  (--\w+)", capsys.readouterr().out, flags=re.M))  # the help's option lines
    assert flags - {"--config_file"} == {f"--{n}" for n in fields}, experiment.script
    # to_argv gives every changed value back as the script's own flag, parsed as the script parses it
    config = config_of(name, overrides=["trainer.optimizer.learning_rate=0.125,task.data.streaming=true"])
    argv = to_argv(experiment.groups, {**options_of(config), "output_dir": "x"})
    assert "--learning_rate=0.125" in argv and "--streaming=true" in argv and "--output_dir=x" in argv


@pytest.fixture(scope="module")
def tokenizer_dir(model_dir_for):
    return model_dir_for(None, vocab_size=400)


# The training job: train.py in a subprocess that, once it has saved its first checkpoint (step 2), waits until the
# evaluation job has evaluated that checkpoint, so the evaluation job provably runs beside a running training job.
GATED_SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
from flaxlm.data import rows
original = rows.ShuffledRows.batch_rows
def gated(self, step, local):
    log, t0 = os.environ["GATE_FILE"], time.time()
    while step == 2 and time.time() - t0 < 240 and not (os.path.exists(log) and open(log).read().strip()):
        time.sleep(0.1)
    return original(self, step, local)
rows.ShuffledRows.batch_rows = gated
import train
from flaxlm.errors import run_main
run_main(lambda: train.main(sys.argv[1:]))
"""


def test_train_and_eval_with_a_continuous_eval_job_beside_it(tokenizer_dir, corpus, tmp_path, capsys):
    """A tiny roberta/mlm train_and_eval run through train.py (model from the tiny preset) with continuous_eval
    started as a separate job, configured only by the experiment.yaml the training run wrote."""
    run = tmp_path / "run"
    override = (f"task.model.tokenizer_name={tokenizer_dir},task.train_data.input_path={corpus['train']},"
                f"task.validation_data.input_path={corpus['validation']},task.validation_data.max_samples=32,"
                f"task.data.max_seq_length=32,task.train_data.global_batch_size=8,trainer.train_steps=6,"
                f"trainer.summary_interval=1,trainer.validation_interval=6,trainer.checkpoint_interval=2,"
                f"trainer.optimizer.learning_rate=3e-3,trainer.optimizer.warmup_steps=2")
    script = tmp_path / "gated_train.py"
    script.write_text(GATED_SCRIPT.format(root=ROOT))
    env = dict(os.environ, GATE_FILE=str(run / "eval_metrics.jsonl"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(script), "--experiment=roberta/mlm", f"--model_dir={run}",
                             f"--config_file={TINY}", f"--params_override={override}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.time()
        while not (run / "checkpoints" / "2").is_dir():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.time() - t0 < 240, "the training job saved no checkpoint"
            time.sleep(0.2)
        train.main(["--experiment=roberta/mlm", "--mode=continuous_eval", f"--model_dir={run}",
                    f"--config_file={run / 'experiment.yaml'}", "--params_override=trainer.eval_timeout=120"])
        output = proc.communicate(timeout=240)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]

    # the evaluation job: each checkpoint exactly once, in order, and it stopped after the final one
    with open(run / "eval_metrics.jsonl") as f:
        job = [json.loads(line) for line in f]
    assert [r["step"] for r in job] == [2, 4, 6]
    assert sorted(int(s) for s in os.listdir(run / "checkpoints")) == [2, 4, 6]
    assert job[0]["time"] < os.path.getmtime(run / "checkpoints" / "6")  # while the training job was running
    # ... and it computed what the training run's own evaluation did at step 6 (same config from the yaml)
    trained = read_metrics(run, "eval")
    assert [r["step"] for r in trained] == [6]
    assert job[-1]["loss"] == pytest.approx(trained[-1]["loss"], rel=1e-5)

    # the training run: the override's values reached the script, the preset and the tokenizer made the model
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert max(r["learning_rate"] for r in read_metrics(run)) == pytest.approx(3e-3)
    with open(run / "config.json") as f:
        model_config = json.load(f)
    assert (model_config["hidden_size"], model_config["num_hidden_layers"], model_config["vocab_size"]) == (64, 2, 400)
    assert (run / "model.safetensors").is_file()
    assert "running: run_mlm_flax.py" in output and "    learning_rate: 0.003  # --learning_rate" in output
    # the resolved config was written (nested, commented) and reads back as the same config
    cls = EXPERIMENTS["roberta/mlm"].config_class()
    assert resolve(cls, [str(run / "experiment.yaml")]) == resolve(cls, [TINY], [override])
    assert "trainer:\n  train_steps: 6  # --max_steps" in (run / "experiment.yaml").read_text()
    assert "--eval_checkpoints=all" in capsys.readouterr().out


@pytest.mark.parametrize("name, files", [
    ("bert/sentence_prediction", ["models/roberta_base.yaml", "sst2.yaml"]),
    ("bert/sentence_prediction", ["norec_sentence.yaml"]),
    ("bert/squad", ["models/roberta_base.yaml", "squad.yaml"]),
    ("roberta/mlm", ["models/roberta_small.yaml", "norec_mlm.yaml"]),
])
def test_recipes_resolve(name, files):
    config = config_of(name, [os.path.join(ROOT, "configs", f) for f in files])
    assert config.task.train_data.input_path  # each recipe names its data


def test_flat_recipes_and_script_sections(tmp_path):
    """train.py reads the scripts' recipes: flag names at their keys, the section of the experiment's script (which
    wins), nested and dotted keys besides; other scripts' options and sections, and the options train.py sets
    itself, are skipped."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rate: 1.0e-4\ntrain_file: [a.txt]\nvocab_size: 500\ndoc_stride: 64\n"
                      "trainer: {train_steps: 9}\ntask.data.max_seq_length: 32\n"
                      "create_config:\n  preset: gpt2\n"
                      "run_classification:\n  learning_rate: 2.0e-4\n  output_dir: elsewhere\n  do_train: false\n")
    c = config_of("bert/sentence_prediction", [str(recipe)])
    assert c.trainer.optimizer.learning_rate == 2e-4 and c.task.train_data.input_path == ["a.txt"]
    assert c.trainer.train_steps == 9 and c.task.data.max_seq_length == 32 and c.task.model.preset is None
    assert config_of("roberta/mlm", [str(recipe)]).trainer.optimizer.learning_rate == 1e-4  # not its section
    recipe.write_text("task.squad.doc_stride: 64\n")  # a key names one experiment's option
    with pytest.raises(UserError, match=re.escape("'task.squad.doc_stride' (--doc_stride) does not apply")):
        config_of("bert/sentence_prediction", [str(recipe)])
    recipe.write_text("learning_rat: 1\n")
    with pytest.raises(UserError, match="unknown key 'learning_rat'; did you mean trainer.optimizer.learning_rate"):
        config_of("roberta/mlm", [str(recipe)])


def test_a_script_reads_the_experiment_yaml(tmp_path):
    """experiment.yaml (nested keys) configures the experiment's script as train.py's flags would."""
    experiment = EXPERIMENTS["roberta/mlm"]
    config = config_of("roberta/mlm", [TINY], ["task.train_data.input_path=[a.txt],trainer.train_steps=7,"
                                               "task.data.line_by_line=true,trainer.optimizer.learning_rate=0.125"])
    written = tmp_path / "experiment.yaml"
    written.write_text(to_yaml(config))
    parsed = parse_args(*experiment.groups, argv=["--output_dir", "x", "--config_file", str(written)],
                        prog=f"{experiment.script}.py")
    values = {k: v for group in parsed for k, v in dataclasses.asdict(group).items()}
    assert {k: values[k] for k in options_of(config) if k in values} == {
        k: v for k, v in options_of(config).items() if k in values}
    assert values["line_by_line"] is True and values["max_steps"] == 7 and values["learning_rate"] == 0.125


@pytest.mark.parametrize("recipe", sorted(os.path.relpath(p, ROOT) for pattern in ("*.yaml", "*/*.yaml")
                                          for p in glob.glob(os.path.join(ROOT, "configs", pattern))
                                          if "suites" not in p))  # evaluate_suite.py's files: tests/test_suite.py
def test_every_recipe_reads_in_both_front_doors(recipe):
    """Each file in configs/ is one dialect: every experiment and every script it runs read it without an error."""
    for name, experiment in EXPERIMENTS.items():
        config_of(name, [os.path.join(ROOT, recipe)])
        parse_args(*experiment.groups, argv=["--output_dir", "x", "--config_file", os.path.join(ROOT, recipe)],
                   prog=f"{experiment.script}.py")
