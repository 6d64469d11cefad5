"""Safety: no pickle is ever loaded by default, no hub code runs unless --trust_remote_code asks for it, and
an exported model is safetensors only.

The source checks read every module of the package and every script (their syntax trees, not their text), so
a call that loads a pickle, or a trust_remote_code=True default, fails here where it is added. That the one
PyTorch reader (flaxlm/models/hf_io.py) refuses a pickle that runs code is tested in test_hf_io.py.
"""
import ast
import glob
import inspect
import os
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = sorted(glob.glob(os.path.join(REPO, "*.py")) + glob.glob(os.path.join(REPO, "flaxlm", "**", "*.py"),
                                                                     recursive=True)
                 + glob.glob(os.path.join(REPO, "bench", "*.py")))
PICKLE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "shelve"}
PICKLE_SUFFIXES = (".bin", ".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".joblib", ".npy", ".npz")


def calls():
    """(file relative to the repo, line, dotted name of the called function, {keyword: ast node}) of every call."""
    for path in SOURCES:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield (os.path.relpath(path, REPO), node.lineno, _dotted(node.func),
                       {k.arg: k.value for k in node.keywords if k.arg})


def _dotted(func):
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _is_true(node):
    return isinstance(node, ast.Constant) and node.value is True


def test_sources_are_found():
    names = {os.path.relpath(p, REPO) for p in SOURCES}
    assert {"run_mlm_flax.py", "flaxlm/data/text.py", "flaxlm/models/hf_io.py"} <= names


def test_no_pickle_loading():
    """No pickle-family loader, no allow_pickle=True, no unsafe yaml loader, and torch.load only with
    weights_only=True and only in the PyTorch checkpoint reader."""
    bad = []
    for where, line, name, keywords in calls():
        head, _, last = name.rpartition(".")
        if head in PICKLE_MODULES and last in ("load", "loads", "Unpickler", "open"):
            bad.append(f"{where}:{line} {name}")
        if _is_true(keywords.get("allow_pickle")) or "weights_only" in keywords and not _is_true(
                keywords["weights_only"]):
            bad.append(f"{where}:{line} {name} with a pickle-allowing keyword")
        if name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all"):
            bad.append(f"{where}:{line} {name} (use yaml.safe_load)")
        if name == "torch.load" and (where != os.path.join("flaxlm", "models", "hf_io.py")
                                     or not _is_true(keywords.get("weights_only"))):
            bad.append(f"{where}:{line} torch.load outside the safe reader or without weights_only=True")
    assert not bad, bad


def test_pickle_reader_is_only_for_pytorch_bin_files():
    from flaxlm.models import hf_io
    assert hf_io.PICKLE_WEIGHTS == "pytorch_model.bin"
    assert "weights_only=True" in inspect.getsource(hf_io.read_pickle_checkpoint)
    # the hub download takes config, safetensors and json files only: never a pickle
    patterns = inspect.signature(hf_io.resolve_dir).parameters["allow_patterns"].default
    assert not any(p.endswith(PICKLE_SUFFIXES) or p in ("*", "*.*") for p in patterns)


def test_remote_code_runs_only_when_asked():
    """trust_remote_code defaults to False and every Auto*.from_pretrained / pipeline call passes it explicitly
    (transformers would otherwise ask on the terminal and run the code on 'y')."""
    from flaxlm.config.options import DataArgs, ModelArgs, TextSourceArgs, TrainingArgs
    from flaxlm.config.cli import parse_args
    from flaxlm.tokenization.loading import load_tokenizer
    model_args, *_ = parse_args(ModelArgs, TextSourceArgs, DataArgs, TrainingArgs, argv=["--output_dir", "o"])
    assert model_args.trust_remote_code is False
    assert inspect.signature(load_tokenizer).parameters["trust_remote_code"].default is False
    bad = []
    for where, line, name, keywords in calls():
        if _is_true(keywords.get("trust_remote_code")):
            bad.append(f"{where}:{line} {name} with trust_remote_code=True")
        loads_auto = name.endswith(".from_pretrained") and name.split(".")[-2].startswith("Auto")
        if (loads_auto or name in ("pipeline", "transformers.pipeline")) and "trust_remote_code" not in keywords:
            bad.append(f"{where}:{line} {name} without trust_remote_code")
    assert not bad, bad


def test_scripts_pass_the_flag_to_the_tokenizer(monkeypatch):
    """The training scripts load their tokenizer through load_run_tokenizer, which hands --trust_remote_code on."""
    from flaxlm.tokenization import loading
    from flaxlm.training.opening import load_run_tokenizer
    for script in ("run_mlm_flax.py", "run_t5_mlm_flax.py", "run_clm_flax.py", "run_sft.py", "run_dpo.py",
                   "run_grpo.py", "run_distill.py"):
        with open(os.path.join(REPO, script), encoding="utf-8") as f:
            assert "load_run_tokenizer(model_args" in f.read(), script
    seen = []
    monkeypatch.setattr(loading, "load_tokenizer", lambda path, token, trust_remote_code: seen.append(
        trust_remote_code))
    for flag in (False, True):
        load_run_tokenizer(types.SimpleNamespace(tokenizer_name="t", model_name_or_path=None, token=None,
                                                 trust_remote_code=flag))
    assert seen == [False, True]


def test_export_is_safetensors_only(tmp_path):
    """What the training scripts export: config.json, model.safetensors, the tokenizer's json files and the model
    card."""
    from flaxlm.models import create_model, split_model
    from flaxlm.models import load_pretrained
    from flaxlm.training.pipeline import export
    from flaxlm.models.presets import build_config
    from flaxlm.tokenization.trainers import train_bpe
    tokenizer = train_bpe(["the quick brown fox jumps over the lazy dog"] * 20, vocab_size=280, min_frequency=1)
    config = build_config("gpt2-tiny", tokenizer)
    out = tmp_path / "export"
    export(types.SimpleNamespace(output_dir=str(out), push_to_hub=False, eval_checkpoints=None, hub_model_id=None),
           types.SimpleNamespace(token=None, model_name_or_path=None), config, split_model(create_model(config))[1],
           tokenizer, "transformers.AutoModelForCausalLM")
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "README.md"} <= files
    assert not [f for f in files if f.endswith(PICKLE_SUFFIXES)], files
    load_pretrained(str(out))  # and it reads back without torch


@pytest.mark.parametrize("text", ["seed: !!python/object/apply:os.system ['echo owned']\n",
                                  "seed: !!python/name:os.system\n"])
def test_yaml_config_cannot_run_code(tmp_path, text):
    from flaxlm.config.options import GenerateArgs
    from flaxlm.config.cli import parse_args
    from flaxlm.errors import UserError
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(UserError, match="not valid yaml"):
        parse_args(GenerateArgs, argv=["--model_name_or_path", "m", "--config_file", str(f)])
