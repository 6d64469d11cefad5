"""No secret leaves in anything a run writes, sends or prints (flaxlm.secrets).

One run as a user starts it (tests/secret_run.py: a process of its own, with HOME, TMPDIR, libtpu's log directory and
every tracker's directory in one folder): a token on the command line (--hub_token), one in a recipe (token:) and one
in the environment (HF_TOKEN, and WANDB_API_KEY beside it), reporting to every tracker; it crashes with an error
quoting the tokens, then resumes, finishes, exports and pushes to a stand-in for the hub. Every byte written under
that folder is searched for each token, raw and base64 (strace of the run: nothing else is written outside it but
/dev/shm's semaphores)."""
import base64
import hashlib
import json
import os
import secrets as random_secrets
import subprocess
import sys

import pytest

from run_helpers import REPO, run_args
from flaxlm import secrets
from flaxlm.config import options as all_options
from flaxlm.config.cli import parse_args
from flaxlm.errors import UserError, run_main

TOKENS = {"command line": f"hf_cli{random_secrets.token_hex(12)}", "recipe": f"hf_recipe{random_secrets.token_hex(12)}",
          "HF_TOKEN": f"hf_env{random_secrets.token_hex(12)}", "WANDB_API_KEY": random_secrets.token_hex(20)}


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory, model_dir_for, corpus):
    """(the folder everything the run wrote is in, the finished process)."""
    inputs, root = tmp_path_factory.mktemp("inputs"), tmp_path_factory.mktemp("secret-run")
    recipe = inputs / "recipe.yaml"
    recipe.write_text(f"token: {TOKENS['recipe']}\n")
    for d in ("home", "tmp", "wandb_dir", "hub"):
        (root / d).mkdir()
    env = {**os.environ, "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"), "TPU_LOG_DIR": str(root / "tmp"),
           "PYTHONUNBUFFERED": "1",
           "WANDB_DIR": str(root / "wandb_dir"), "WANDB_MODE": "offline", "MLFLOW_ALLOW_FILE_STORE": "true",
           "MLFLOW_TRACKING_URI": f"file://{root}/mlruns", "TRACKIO_DIR": str(root / "trackio"),
           "HF_TOKEN": TOKENS["HF_TOKEN"], "WANDB_API_KEY": TOKENS["WANDB_API_KEY"]}
    args = run_args(model_dir_for("gpt2-tiny"), corpus, root / "out", "--block_size", "32", "--max_steps", "4",
                    "--save_steps", "2", "--do_train", "--do_eval", "--eval_steps", "2", "--report_to", "all",
                    "--hub_token", TOKENS["command line"])
    done = subprocess.run([sys.executable, os.path.join(REPO, "tests", "secret_run.py"), str(recipe), str(root / "hub"),
                           *args], cwd=root, env=env, capture_output=True, text=True)
    (root / "console.txt").write_text(done.stdout + done.stderr)
    assert done.returncode == 0 and "secret_run: crashed, resumed and pushed" in done.stdout, done.stderr[-3000:]
    return root, done


def encodings(token):
    """The token raw and in base64 (standard and URL-safe, at each of the three byte alignments a longer encoded
    text may put it), as bytes to search for."""
    raw = token.encode()
    found = {raw}
    for start in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            found.add(encode(raw[start:])[:-4])  # the last group also encodes what follows the token
    return found


def files_under(path):
    return [path] if os.path.isfile(path) else [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]


def leaks(path, tokens=TOKENS):
    """[(file, which token)] for every file at or under path that holds a token in any encoding."""
    found = []
    for file in files_under(path):
        with open(file, "rb") as f:
            data = f.read()
        found += [(file, which) for which, token in tokens.items() if any(e in data for e in encodings(token))]
    return found


# What the run wrote, by where: each must hold files (the tracker did write) and no token.
AREAS = {"output directory": "out", "checkpoints": "out/checkpoints", "TensorBoard": "out/tensorboard",
         "W&B": "wandb_dir", "MLflow": "mlruns", "trackio": "trackio", "hub upload": "hub", "home": "home",
         "console": "console.txt"}


@pytest.mark.parametrize("area", AREAS)
def test_no_token_in_what_the_run_wrote(secret_run, area):
    root, _ = secret_run
    assert files_under(root / AREAS[area]), f"{area}: nothing written"
    assert leaks(root / AREAS[area]) == []


def test_nothing_anywhere_the_run_wrote_holds_a_token(secret_run):
    root, _ = secret_run
    assert leaks(root) == []


def test_the_search_finds_a_token_where_there_is_one(tmp_path):
    """The search is not blind: each token, raw or base64 inside other bytes, is found."""
    for which, token in TOKENS.items():
        (tmp_path / "raw").write_bytes(b"x" + token.encode() + b"y")
        (tmp_path / "b64").write_bytes(base64.b64encode(b'{"token": "' + token.encode() + b'"}'))
        assert sorted(leaks(tmp_path)) == sorted([(str(tmp_path / "raw"), which), (str(tmp_path / "b64"), which)])


def test_the_crash_printed_its_traceback_with_the_tokens_masked(secret_run):
    _, done = secret_run
    assert "Traceback (most recent call last)" in done.stderr
    assert "PermissionError: 401 Client Error: Unauthorized for tokens ***, ***, ***" in done.stderr


def test_a_token_on_the_command_line_is_one_warning(secret_run):
    _, done = secret_run
    warnings = [line for line in done.stderr.splitlines() if "can be read by every user of this host" in line]
    assert warnings == ["warning: --hub_token on the command line can be read by every user of this host (ps); set "
                        "HF_TOKEN in the environment or log in once with `hf auth login` (huggingface-cli login) "
                        "instead"]


def test_wandb_writes_under_wandb_dir_and_records_the_command_line_masked(secret_run):
    root, _ = secret_run
    assert not (root / "out" / "wandb").exists()
    runs = sorted((root / "wandb_dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2  # the crashed run and its resumption
    for path in runs:
        records = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)], check=True,
                                 capture_output=True, text=True).stdout.splitlines()
        recorded = [r["environment"]["args"] for r in map(json.loads, records) if "args" in r.get("environment", {})]
        assert recorded and all(args[-2:] == ["--hub_token", "***"] and "--output_dir" in args for args in recorded)


def test_the_hub_got_the_token_to_log_in_and_the_export_without_it(secret_run):
    root, _ = secret_run
    calls = [json.loads(line) for line in (root / "hub" / "calls.jsonl").read_text().splitlines()]
    assert [c["call"] for c in calls] == ["whoami", "create_repo", "upload_folder"]
    assert {c["token_sha256"] for c in calls} == {hashlib.sha256(TOKENS["command line"].encode()).hexdigest()}
    assert {"model.safetensors", "config.json", "README.md", "tokenizer.json"} <= set(calls[-1]["files"])


@pytest.mark.parametrize("argv, shown", [
    (["--hub_token", "hf_abcdefgh1"], ["--hub_token", "***"]),
    (["--hub_token=hf_abcdefgh1", "--seed", "1"], ["--hub_token=***", "--seed", "1"]),
    (["--hub-token", "x", "--seed", "1"], ["--hub-token", "***", "--seed", "1"]),  # misspelled, short
    (["--wandb_api_key", "k", "--token"], ["--wandb_api_key", "***", "--token"]),
    (["--params_override=task.model.token=t,trainer.seed=3"],
     ["--params_override=task.model.token=***,trainer.seed=3"]),
    (["--tokenizer_name", "tok", "--max_new_tokens", "5"], ["--tokenizer_name", "tok", "--max_new_tokens", "5"]),
])
def test_a_command_line_is_redacted(argv, shown):
    assert secrets.redact_argv(argv) == shown


def test_secret_names():
    secret = ["token", "hub_token", "HF_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD", "client_secret",
              "task.model.token", "--hub-token"]
    not_secret = ["tokenizer_name", "max_new_tokens", "label_all_tokens", "TOKENIZERS_PARALLELISM", "keys_column",
                  "monkey", "output_dir", "num_key_value_heads"]
    assert [n for n in secret + not_secret if secrets.is_secret(n)] == secret
    declared = {f.name for f in all_options.declared_fields()}
    assert {n for n in declared if secrets.is_secret(n)} == {"token", "hub_token"}  # a new secret option: add it here


def test_a_misspelled_token_flag_is_named_without_its_value():
    with pytest.raises(UserError, match=r"unrecognized arguments: --hub-token \*\*\*") as e:
        parse_args(all_options.TrainingArgs, argv=["--output_dir", "x", "--hub-token", "hf_misspelled1"])
    assert "hf_misspelled1" not in str(e.value)


def test_an_error_quoting_a_secret_is_printed_masked(monkeypatch, capsys):
    monkeypatch.setenv("SOME_SERVICE_API_KEY", "k3y-0f-some-service")
    secrets.remember("hf_remembered01")

    def main():
        raise UserError("the hub refused hf_remembered01 and k3y-0f-some-service; log in again")
    with pytest.raises(SystemExit):
        run_main(main)
    assert capsys.readouterr().err == "error: the hub refused *** and ***; log in again\n"


def test_a_secret_in_train_pys_overrides_is_masked_in_sys_argv_with_one_warning(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "--params_override=task.model.token=hf_override1,trainer.seed=1"])
    monkeypatch.setattr(secrets, "_warned", [])
    secrets.protect_command_line()
    secrets.protect_command_line()
    assert sys.argv == ["train.py", "--params_override=task.model.token=***,trainer.seed=1"]
    assert capsys.readouterr().err.count("warning: task.model.token on the command line can be read by every") == 1
