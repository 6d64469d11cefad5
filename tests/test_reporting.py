"""--report_to's trackers (flaxlm.reporting.trackers) and the model card beside each export
(flaxlm.reporting.model_card): W&B in offline mode read back with wandb's own reader (`wandb leet inspect --json`),
MLflow on a local file store, trackio's local store; a run that crashed and resumed continues each tracker's run and
sends no step twice; a missing package is one line before any work, a tracker failing mid-run a warning; the card's
metadata as huggingface_hub parses it, its figures metrics.jsonl's, a README.md the user wrote kept."""
import glob
import json
import os
import subprocess
import sys
import tempfile

import pytest

import run_clm_flax
import run_helpers
from run_helpers import expect_user_error
from flaxlm.reporting import trackers
from flaxlm.reporting.run_log import read_rows

os.environ.setdefault("TRACKIO_DIR", tempfile.mkdtemp(prefix="trackio-"))  # read when trackio is first imported
TIMINGS = ("tokens_per_s", "step_ms", "data_ms", "data_share", "mfu", "seconds")  # differ between two runs of a step


@pytest.fixture(scope="module")
def model_dir(model_dir_for):
    return model_dir_for("gpt2-tiny")


@pytest.fixture(scope="module")
def resumed_run(model_dir, corpus, tmp_path_factory):
    """A tiny GPT-2 run of 5 steps reporting to every tracker: crashed when it asks for step 4's rows (steps 1-3
    logged, checkpoint at 2), then resumed from step 2. Returns (output dir, MLflow tracking URI)."""
    from flaxlm.data.rows import ShuffledRows
    tmp = tmp_path_factory.mktemp("reported")
    out, uri = tmp / "run", f"file://{tmp}/mlruns"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": uri,
           "MLFLOW_ALLOW_FILE_STORE": "true", "TRACKIO_PROJECT": f"flaxlm-test-{os.getpid()}"}
    saved_env = {k: os.environ.get(k) for k in [*env, "WANDB_DIR"]}
    os.environ.update(env)
    os.environ.pop("WANDB_DIR", None)  # unset: W&B writes in OUTPUT_DIR/wandb
    args = run_helpers.run_args(model_dir, corpus, out, "--block_size", "32", "--max_steps", "5", "--save_steps", "2",
                                "--do_train", "--do_eval", "--eval_steps", "2",
                                "--report_to", "wandb", "mlflow,trackio", "tensorboard", "--run_name", "tiny",
                                "--language", "no", "nb", "--license", "mit")
    original = ShuffledRows.batch_rows

    def crash(self, step, local):
        if step == 3:
            raise RuntimeError("simulated crash")
        return original(self, step, local)
    try:
        ShuffledRows.batch_rows = crash
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_clm_flax.main(args)
        ShuffledRows.batch_rows = original
        run_clm_flax.main([*args, "--resume_from_checkpoint", "latest"])
    finally:
        ShuffledRows.batch_rows = original
        for k, v in saved_env.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return out, uri


def wandb_history(out):
    """{(key, step): [values]} of every offline W&B run under out/wandb, read by wandb's own inspector."""
    got = {}
    for path in sorted(glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))):
        lines = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path], check=True,
                               capture_output=True, text=True).stdout.splitlines()
        for record in map(json.loads, lines):
            if record.get("type") == "history":
                item = record["history"]["item"]
                for key, value in item.items():
                    if not key.startswith("_"):
                        got.setdefault((key, item["_step"]), []).append(value)
    return got


def mlflow_history(out, uri):
    from mlflow import MlflowClient
    client = MlflowClient(uri)
    run_id = json.loads((out / "trackers.json").read_text())["mlflow"]["run_id"]
    got = {}
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            got.setdefault((key, m.step), []).append(m.value)
    return got, client.get_run(run_id).data.params


def trackio_history(out):
    import trackio
    saved = json.loads((out / "trackers.json").read_text())["trackio"]
    got = {}
    for row in trackio.SQLiteStorage.get_logs(saved["project"], saved["name"], run_id=saved["id"]):
        for key, value in row.items():
            if "/" in key and isinstance(value, (int, float)):
                got.setdefault((key, row["step"]), []).append(value)
    return got


def test_every_row_reaches_each_tracker_once_across_a_crash_and_resume(resumed_run):
    out, uri = resumed_run
    rows = read_rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5]
    expected = {(f"{r['split']}/{k}", r["step"]): v for r in rows for k, v in r.items()
                if k not in ("step", "split", "time") and isinstance(v, (int, float))}
    assert len(list((out / "wandb").glob("offline-run-*"))) == 2  # no WANDB_DIR: under the output directory
    mlflow, params = mlflow_history(out, uri)
    histories = {"wandb": wandb_history(out), "mlflow": mlflow, "trackio": trackio_history(out)}
    for name, got in histories.items():
        assert [k for k, values in got.items() if len(values) > 1] == [], name  # no step sent twice
        for (key, step), value in expected.items():
            assert (key, step) in got, (name, key, step)
            if key.split("/")[1] not in TIMINGS:  # step 3 was redone: same figures, its own timings
                assert got[key, step][0] == pytest.approx(value, rel=1e-12), (name, key, step)
    assert json.loads(params["max_steps"]) == 5 and json.loads(params["warmup_steps"]) == 2  # the run's options
    assert json.loads(params["report_to"]) == ["wandb", "mlflow", "trackio", "tensorboard"]
    assert "hub_token" not in params and "token" not in params  # secrets left out


def test_the_card_holds_metrics_jsonl_figures_and_huggingface_hub_parses_it(resumed_run):
    from huggingface_hub import ModelCard
    out, _ = resumed_run
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert card.data.language == ["no", "nb"] and card.data.license == "mit" and card.data.base_model is None
    assert "flaxlm" in card.data.tags
    rows = read_rows(out / "metrics.jsonl")
    evals, train = [r for r in rows if r["split"] == "eval"], [r for r in rows if r["split"] == "train"]
    best = min(evals, key=lambda r: r["loss"])
    assert f"| eval | loss | {evals[-1]['loss']} | {best['loss']} (step {best['step']}) |" in card.text
    assert f"| eval | perplexity | {evals[-1]['perplexity']} |" in card.text
    assert f"Tokens seen: {train[-1]['tokens']} in 5 steps." in card.text
    assert "![loss curves](loss.png)" in card.text and (out / "loss.png").exists()
    assert "AutoModelForCausalLM.from_pretrained" in card.text and "| `--max_steps` | 5 |" in card.text


def test_a_readme_the_user_wrote_is_kept_and_ours_is_rewritten(resumed_run, model_dir, tmp_path, capsys):
    from flaxlm.models import load_config
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.reporting.model_card import MARK, write_model_card
    out, _ = resumed_run
    kwargs = dict(config=load_config(model_dir), tokenizer=load_tokenizer(model_dir), script="run_clm_flax.py",
                  auto_class="transformers.AutoModelForCausalLM", options={}, n_params=1000)
    mine = tmp_path / "README.md"
    mine.write_text("# my own notes\n")
    assert write_model_card(str(tmp_path), **kwargs) is None
    assert mine.read_text() == "# my own notes\n" and "not a card flaxlm wrote" in capsys.readouterr().out
    mine.write_text(f"# an old card\n{MARK}\n")
    assert write_model_card(str(tmp_path), base_model="runs/source", how="continued pretraining", **kwargs)
    assert "base_model: runs/source" in mine.read_text() and "an old card" not in mine.read_text()


@pytest.mark.parametrize("base, on_hub", [("openai-community/gpt2", True), ("gpt2", True),
                                          ("runs/my-gpt2-sft", False), ("gpt2-en/", False), ("./gpt2-en", False)])
def test_base_model_names_only_a_hub_model_a_local_one_is_in_the_text(model_dir, tmp_path, monkeypatch, base, on_hub):
    """The card's base_model is what the hub links as a model id: a local folder (runs/my-gpt2-sft, here on disk)
    or a path is named in the card's text instead."""
    from huggingface_hub import ModelCard
    from flaxlm.models import load_config
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.reporting.model_card import write_model_card
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "my-gpt2-sft").mkdir(parents=True)
    write_model_card(str(tmp_path), config=load_config(model_dir), tokenizer=load_tokenizer(model_dir),
                     script="run_sft.py", auto_class="transformers.AutoModelForCausalLM", options={}, n_params=1000,
                     base_model=base, how="fine-tuned")
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.base_model == (base if on_hub else None)
    assert (f"fine-tuned from `{base}`" if on_hub else f"fine-tuned from the local model `{base}`") in card.text


def test_report_to_takes_transformers_values():
    assert trackers.resolve_report_to(None) == ["tensorboard"]
    assert trackers.resolve_report_to(["none"]) == []
    assert trackers.resolve_report_to(["wandb,mlflow", "wandb"]) == ["wandb", "mlflow"]
    assert trackers.resolve_report_to(["all"]) == [t for t in trackers.TRACKERS if trackers.installed(t)]
    with pytest.raises(Exception, match="--report_to comet is not a tracker here; use tensorboard, wandb"):
        trackers.resolve_report_to(["comet"])


def test_a_missing_tracker_is_one_line_before_any_work(model_dir, corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(trackers, "installed", lambda name: name != "wandb")
    out = tmp_path / "run"
    expect_user_error(run_clm_flax.main, run_helpers.run_args(model_dir, corpus, out, "--report_to", "wandb"),
                      r"--report_to wandb needs the wandb package, which is not installed: pip install wandb")
    assert not out.exists()


class Failing:
    name = "mlflow"
    state = {}

    def log(self, step, split, metrics):
        raise ConnectionError("the tracking server went away")


class Keeping:
    name = "trackio"
    state = {}

    def __init__(self):
        self.rows = []

    def log(self, step, split, metrics):
        self.rows.append((step, split))

    def close(self):
        pass


def test_a_tracker_failing_mid_run_is_a_warning_and_the_others_go_on(capsys):
    kept = Keeping()
    reporting = trackers.Reporting([Failing(), kept])
    reporting.log(1, "train", {"loss": 1.0})
    reporting.log(2, "train", {"loss": 0.5})
    reporting.close()
    assert kept.rows == [(1, "train"), (2, "train")]
    err = capsys.readouterr().err
    assert err.count("warning: --report_to mlflow failed at step 1 (ConnectionError: the tracking server went "
                     "away); the run goes on without it") == 1


def test_sample_tables_go_to_a_jsonl_file_and_to_wandb_as_a_table(tmp_path):
    """RunLog.table (run_grpo.py's completions): one line per row with its step in OUTPUT_DIR/NAME.jsonl; W&B gets a
    wandb.Table whose message-list cells are JSON text; a tracker without tables (Keeping) is skipped."""
    import types
    from flaxlm.reporting.run_log import RunLog
    logged = []
    wandb = trackers.Wandb.__new__(trackers.Wandb)
    wandb.wandb = types.SimpleNamespace(Table=lambda columns, data: (columns, data))
    wandb.run = types.SimpleNamespace(log=lambda row, step: logged.append((row, step)))
    log = RunLog(str(tmp_path), trackers=[Keeping(), wandb])
    messages = [{"role": "user", "content": "Hei?"}]
    log.table(4, "completions", {"prompt": ["Hva er 1+2?", messages], "reward": [1.0, None]})
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert lines == [{"step": 4, "prompt": "Hva er 1+2?", "reward": 1.0}, {"step": 4, "prompt": messages, "reward": None}]
    (row, step), = logged
    assert step == 4 and row["completions"] == (["step", "prompt", "reward"], [
        [4, "Hva er 1+2?", 1.0], [4, json.dumps(messages, ensure_ascii=False), None]])
