"""Bad input to every script ends cleanly: exit code 2, exactly one stderr line "error: ..." naming the problem
(progress bars of `datasets` aside, never a traceback), and nothing on disk changed: the files placed in the
output directory beforehand and every input file stay byte for byte the same, and no new file appears.

The bad inputs come from one table, CASES (script, name, flags, pattern of the message), run through
test_bad_input; test_case_count prints how many there are per script. Each case runs the script's main(argv)
in-process, wrapped as flaxlm.errors.run_main wraps it; test_end_to_end_in_a_subprocess runs one case per
script as a real process. Text that is odd but valid must work: a line longer than the block, one long line
for a tokenizer. Text that is not UTF-8 is an error naming the file and line (flaxlm.data.text explains why).
"""
import collections
import gzip
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import types

import pytest

import create_config
import train_tokenizer
from flaxlm.errors import run_main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a tqdm progress line, e.g. "Generating train split: 0 examples [00:00, ? examples/s]" or " 40%|####  | 2/5"
PROGRESS = re.compile(r"\[\d+:\d+[<,\]]|\d+%\|")
# what a run of ours may find in its output directory already: foreign files and an earlier run's checkpoint
PLACED = {"notes.txt": b"my notes\n", "metrics.jsonl": b'{"split": "train", "step": 7}\n',
          "checkpoints/7/_CHECKPOINT_METADATA": b"{}", "checkpoints/7/state/data": b"\x00\x01\x02",
          "tokenizer.json": b'{"an": "older tokenizer"}', "config.json": b'{"an": "older config"}'}


# ---------------------------------------------------------------------------------------------------------
# Inputs: tiny models of each family, their tokenizers, and bad files, built once.


@pytest.fixture(scope="module")
def env(tmp_path_factory, corpus):
    """Paths of the inputs (all under env.root, which every case checks for changes)."""
    root = tmp_path_factory.mktemp("fuzz")
    e = types.SimpleNamespace(root=str(root))
    inputs = root / "inputs"
    inputs.mkdir()
    e.train, e.valid = str(inputs / "train.txt"), str(inputs / "valid.txt")
    shutil.copy(corpus["train"], e.train)
    shutil.copy(corpus["validation"], e.valid)
    for family, kind, preset in (("gpt2", "bpe", "gpt2-tiny"), ("roberta", "bpe", "roberta-tiny"),
                                 ("t5", "unigram", "t5-tiny")):
        d = str(root / family)
        train_tokenizer.main(["--type", kind, "--train_file", e.train, "--vocab_size", "300",
                              "--model_max_length", "64", "--output_dir", d])
        create_config.main(["--preset", preset, "--output_dir", d])
        setattr(e, family, d)
    e.gen = str(root / "gen")  # a causal LM export for generate.py
    shutil.copytree(e.gpt2, e.gen)
    from flaxlm.models import create_model, load_config, split_model
    from flaxlm.models import save_pretrained
    config = load_config(e.gen)
    save_pretrained(e.gen, config, split_model(create_model(config))[1])

    def model_dir(name, files):
        d = root / name
        d.mkdir()
        for f, data in files.items():
            (d / f).write_bytes(data)
        return str(d)

    config_json = (root / "gpt2" / "config.json").read_bytes()
    weights = (root / "gen" / "model.safetensors").read_bytes()
    tokenizer = {f: (root / "gpt2" / f).read_bytes() for f in ("tokenizer.json", "tokenizer_config.json")}
    e.no_tokenizer = model_dir("no_tokenizer", {"config.json": config_json, "model.safetensors": weights})
    e.broken_tokenizer = model_dir("broken_tokenizer", {**tokenizer, "tokenizer.json": b'{"model": '})
    e.no_config = model_dir("no_config", tokenizer)
    e.not_json = model_dir("not_json", {"config.json": b'{"model_type": "gpt2",', **tokenizer,
                                        "model.safetensors": weights})
    e.json_list = model_dir("json_list", {"config.json": b"[1, 2]"})
    e.wrong_value = model_dir("wrong_value", {"config.json": b'{"model_type": "gpt2", "n_layer": "two"}'})
    e.no_weights = model_dir("no_weights", {"config.json": config_json, **tokenizer})
    # run_distill.py's teachers: another tokenizer (T5's), positions fewer than --max_length
    t5_tokenizer = {f: (root / "t5" / f).read_bytes() for f in os.listdir(root / "t5") if f != "config.json"}
    e.other_vocab = model_dir("other_vocab", {"config.json": config_json, **t5_tokenizer})
    e.short_teacher = model_dir("short_teacher", {"config.json": json.dumps(
        {**json.loads(config_json), "n_positions": 8}).encode(), **tokenizer, "model.safetensors": weights})
    # upcycle_moe.py's dense Qwen3, the same without a tokenizer, a mixture already, windows on one layer of two
    e.qwen3 = str(root / "qwen3")
    create_config.main(["--preset", "qwen3-tiny", "--tokenizer_name", e.gpt2, "--output_dir", e.qwen3])
    qwen3 = load_config(e.qwen3)
    save_pretrained(e.qwen3, qwen3, split_model(create_model(qwen3))[1])
    for f, data in tokenizer.items():
        (root / "qwen3" / f).write_bytes(data)
    qwen3_json = json.loads((root / "qwen3" / "config.json").read_bytes())
    assert qwen3_json["num_hidden_layers"] == 2
    e.qwen3_bare = model_dir("qwen3_bare", {f: (root / "qwen3" / f).read_bytes()
                                            for f in ("config.json", "model.safetensors")})
    e.qwen3_moe = str(root / "qwen3_moe")
    create_config.main(["--preset", "qwen3-moe-tiny", "--tokenizer_name", e.gpt2, "--output_dir", e.qwen3_moe])
    e.mixed_windows = model_dir("mixed_windows", {**tokenizer, "config.json": json.dumps(
        {**qwen3_json, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1,
         "layer_types": ["full_attention", "sliding_attention"]}).encode()})

    files = {
        "non_utf8.txt": b"good line one\nabc \xff\xfe def\ngood line three\n",
        "non_utf8.jsonl": b'{"text": "good"}\n{"text": "caf\xe9"}\n',
        "non_utf8.csv": b"text\ngood\ncaf\xe9 au lait\n",
        "non_utf8.txt.gz": gzip.compress(("fine text\n" * 50 + "ol\xe9\n").encode("latin-1"), mtime=0),
        "empty.txt": b"", "blank.txt": b"\n   \n\t\n\n",
        "long_line.txt": (" ".join(f"word{i % 97}" for i in range(2000)) + "\n").encode(),
        "broken.json": b'{"text": "a"', "not_gzip.txt.gz": b"plain text, not gzip\n",
        "a_file": b"a file where a directory belongs\n",
        "syntax.yaml": b"learning_rate: [1, 2\nseed: 3\n", "list.yaml": b"- learning_rate\n- 3\n",
        "unknown.yaml": b"learning_rat: 3\n", "binary.yaml": b"seed: \xff\xfe\n",
        "python_tag.yaml": b"seed: !!python/object/apply:os.system ['echo owned']\n",
        "prompts_non_utf8.txt": b"hello\nabc \xff def\n",
        # run_grpo.py's prompts and reward functions; run_distill.py's conversations that are plain text
        "prompts.jsonl": "".join(json.dumps({"prompt": f"Hva er {a}+2?", "answer": str(a + 2)}) + "\n"
                                 for a in range(8)).encode(),
        "no_prompt.jsonl": b'{"prompt": "Hva er 1+1?", "answer": "2"}\n{"prompt": "Hva er 2+1?", "answer": "3"}\n'
                           b'{"question": "Hva er 3+1?", "answer": "4"}\n',
        "rewards.py": b"def short(prompts, completions, **kwargs):\n    return [-len(c) for c in completions]\n",
        "plain.jsonl": "".join(json.dumps({"text": f"{a} and {a + 1} make {2 * a + 1}."}) + "\n"
                               for a in range(8)).encode(),
    }
    for name, data in files.items():
        (inputs / name).write_bytes(data)
    e.inputs = str(inputs)
    return e


def write_input(e, name, text):
    """A small input file made for one case (kept: every later case checks it stays the same)."""
    path = os.path.join(e.inputs, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def inp(e, name):
    return os.path.join(e.inputs, name)


# ---------------------------------------------------------------------------------------------------------
# The table.

Case = collections.namedtuple("Case", "script name flags match setup", defaults=(None,))
# flags(e) -> {flag: value} over base_flags(script) (None drops a flag, True is a bare flag);
# setup(out, monkeypatch) prepares the case (a read-only output directory, say) and may skip it

TRAINING = ("run_clm_flax", "run_mlm_flax", "run_t5_mlm_flax")
MODEL_OF = {"run_clm_flax": "gpt2", "run_mlm_flax": "roberta", "run_t5_mlm_flax": "t5"}


def base_flags(script, e, out):
    """Flags with which the script would run; each case spoils one thing."""
    if script in TRAINING:
        model = getattr(e, MODEL_OF[script])
        return {"output_dir": out, "overwrite_output_dir": True, "config_name": model, "tokenizer_name": model,
                "train_file": e.train, "validation_file": e.valid, "max_seq_length": 16, "max_steps": 1,
                "per_device_train_batch_size": 1, "do_eval": "false"}
    if script == "train_tokenizer":
        return {"output_dir": out, "overwrite_output_dir": True, "train_file": e.train, "vocab_size": 300}
    if script == "create_config":
        return {"output_dir": out, "overwrite_output_dir": True, "preset": "gpt2-tiny", "tokenizer_name": e.gpt2}
    if script == "generate":
        return {"model_name_or_path": e.gen, "prompt": "hello", "max_new_tokens": 2}
    new = os.path.join(out, "new")  # the newest scripts: a directory the run would make, which a refusal must not
    if script == "run_grpo":
        return {"output_dir": new, "model_name_or_path": e.gen, "train_file": inp(e, "prompts.jsonl"),
                "reward_funcs": "token_f1", "num_generations": 2, "max_completion_length": 4, "max_steps": 1,
                "per_device_train_batch_size": 1, "do_eval": "false", "report_to": "none"}
    if script == "run_distill":
        return {"output_dir": new, "model_name_or_path": e.gen, "teacher_model_name_or_path": e.gen,
                "train_file": e.train, "max_length": 16, "top_k": 4, "max_steps": 1, "per_device_train_batch_size": 1,
                "do_eval": "false", "report_to": "none"}
    if script == "upcycle_moe":
        return {"output_dir": new, "model_name_or_path": e.qwen3, "num_experts": 4, "num_experts_per_tok": 2}
    return {}  # fill_mask, fill_spans: positional arguments only


def argv_of(flags):
    argv = []
    for name, value in flags.items():
        if name == "positional":
            argv += value
        elif value is True:
            argv.append(f"--{name}")
        elif value is not None:
            argv += [f"--{name}", str(value)]
    return argv


def read_only(out, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory; the unwritable cases cover the check")
    os.chmod(out, 0o555)


def unwritable(out, monkeypatch):
    """Any directory refusing files (as a read-only one does, even for root)."""
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)


# (script -> yaml text with a value of the wrong type for one of its own options)
WRONG_TYPE_YAML = {"run_clm_flax": "max_steps: 1.5\n", "run_mlm_flax": "max_steps: 1.5\n",
                   "run_t5_mlm_flax": "max_steps: 1.5\n", "train_tokenizer": "vocab_size: many\n",
                   "create_config": "list_presets: maybe\n", "generate": "max_new_tokens: 1.5\n",
                   "run_grpo": "num_generations: 1.5\n", "run_distill": "top_k: 1.5\n",
                   "upcycle_moe": "num_experts: many\n"}


# (script -> one of its single-valued options)
SCALAR = {"run_clm_flax": "seed", "run_mlm_flax": "seed", "run_t5_mlm_flax": "seed", "train_tokenizer": "vocab_size",
          "create_config": "preset", "generate": "seed", "run_grpo": "seed", "run_distill": "seed",
          "upcycle_moe": "num_experts"}


def common_cases(script):
    """Bad config files and flags, for every script that parses flags."""
    s = script
    return [
        Case(s, "yaml syntax error", lambda e: {"config_file": inp(e, "syntax.yaml")},
             r"config file .*syntax\.yaml is not valid yaml \(while parsing"),
        Case(s, "yaml list", lambda e: {"config_file": inp(e, "list.yaml")},
             r"list\.yaml must hold a mapping of option: value, not a list"),
        Case(s, "yaml unknown key", lambda e: {"config_file": inp(e, "unknown.yaml")},
             r"unknown.yaml: unknown option 'learning_rat'"),
        Case(s, "yaml missing", lambda e: {"config_file": inp(e, "nope.yaml")},
             r"config file .*nope\.yaml does not exist"),
        Case(s, "yaml is a directory", lambda e: {"config_file": e.inputs}, r"config file .* does not exist"),
        Case(s, "yaml not UTF-8", lambda e: {"config_file": inp(e, "binary.yaml")},
             r"binary\.yaml is not valid yaml \('utf-8' codec can't decode"),
        Case(s, "yaml python tag", lambda e: {"config_file": inp(e, "python_tag.yaml")},
             r"python_tag\.yaml is not valid yaml \(could not determine a constructor"),
        Case(s, "yaml wrong type", lambda e: {"config_file": write_input(e, f"type_{s}.yaml", WRONG_TYPE_YAML[s])},
             r"option '\w+' has a bad value .*; it takes (an integer|true or false)"),
        Case(s, "yaml section not a mapping",
             lambda e: {"config_file": write_input(e, f"section_{s}.yaml", f"{s}: [1, 2]\n")},
             rf"section '{s}' must be a mapping"),
        Case(s, "yaml list for a single value",
             lambda e: {"config_file": write_input(e, f"listvalue_{s}.yaml", f"{s}:\n  {SCALAR[s]}: [1, 2]\n")},
             rf"option '{SCALAR[s]}' has a bad value \[1, 2\] \(expected a single value\)"),
        Case(s, "unknown flag", lambda e: {"no_such_flag": "1"}, r"unrecognized arguments: --no_such_flag 1"),
        Case(s, "flag without its value", lambda e: {"positional": ["--config_file"]},
             r"argument --config_file: expected one argument"),
    ]


def training_cases(script):
    s = script
    return [
        Case(s, "learning rate abc", lambda e: {"learning_rate": "abc"},
             r"argument --learning_rate: invalid float value: 'abc'"),
        Case(s, "max steps 1.5", lambda e: {"max_steps": "1.5"}, r"argument --max_steps: invalid int value: '1.5'"),
        Case(s, "negative batch", lambda e: {"per_device_train_batch_size": -3},
             r"--per_device_train_batch_size -3 is out of range; it must be at least 1"),
        Case(s, "zero accumulation", lambda e: {"gradient_accumulation_steps": 0},
             r"--gradient_accumulation_steps 0 is out of range"),
        Case(s, "zero logging steps", lambda e: {"logging_steps": 0}, r"--logging_steps 0 is out of range"),
        Case(s, "zero save steps", lambda e: {"save_steps": 0}, r"--save_steps 0 is out of range"),
        Case(s, "NaN learning rate", lambda e: {"learning_rate": "nan"}, r"--learning_rate nan is not a finite"),
        Case(s, "infinite epochs", lambda e: {"max_steps": None, "num_train_epochs": "inf"},
             r"--num_train_epochs inf is not a finite"),
        Case(s, "bad dtype", lambda e: {"dtype": "float64"}, r"argument --dtype: invalid choice: 'float64'"),
        Case(s, "yaml negative batch",
             lambda e: {"per_device_train_batch_size": None,
                        "config_file": write_input(e, "neg_batch.yaml", "per_device_train_batch_size: -3\n")},
             r"--per_device_train_batch_size -3 is out of range"),
        # the training text
        Case(s, "train file missing", lambda e: {"train_file": inp(e, "nope.txt")},
             r"--train_file .*nope\.txt does not exist"),
        Case(s, "train file is a directory", lambda e: {"train_file": e.inputs}, r"--train_file .* is a directory"),
        Case(s, "empty train file", lambda e: {"train_file": inp(e, "empty.txt")},
             r"--train_file .*empty\.txt is empty"),
        Case(s, "blank lines only", lambda e: {"train_file": inp(e, "blank.txt")},
             r"--train_file .*blank\.txt holds no text \(every line is blank\)"),
        Case(s, "non-UTF-8 txt", lambda e: {"train_file": inp(e, "non_utf8.txt")},
             r"--train_file .*non_utf8\.txt line 2 is not UTF-8 text \(byte 0xff.*iconv"),
        Case(s, "non-UTF-8 jsonl", lambda e: {"train_file": inp(e, "non_utf8.jsonl")},
             r"--train_file .*non_utf8\.jsonl line 2 is not UTF-8 text \(byte 0xe9"),
        Case(s, "non-UTF-8 csv", lambda e: {"train_file": inp(e, "non_utf8.csv")},
             r"--train_file .*non_utf8\.csv line 3 is not UTF-8 text"),
        Case(s, "non-UTF-8 gzip", lambda e: {"train_file": inp(e, "non_utf8.txt.gz")},
             r"--train_file .*non_utf8\.txt\.gz line 51 is not UTF-8 text"),
        Case(s, "non-UTF-8 validation file", lambda e: {"validation_file": inp(e, "non_utf8.txt")},
             r"--validation_file .*non_utf8\.txt line 2 is not UTF-8"),
        Case(s, "non-UTF-8 streamed", lambda e: {"train_file": inp(e, "non_utf8.txt"), "streaming": True},
             r"--train_file .*non_utf8\.txt line 2 is not UTF-8 text"),
        Case(s, "broken json", lambda e: {"train_file": inp(e, "broken.json")},
             r"could not read --train_file .*broken\.json as json \(JSON parse error"),
        Case(s, "not gzip", lambda e: {"train_file": inp(e, "not_gzip.txt.gz")},
             r"could not read --train_file .*not_gzip\.txt\.gz as txt \(Not a gzipped file"),
        Case(s, "one long line, nothing to hold out",
             lambda e: {"train_file": inp(e, "long_line.txt"), "validation_file": None},
             r"has too little text to hold out a validation split; pass --validation_file"),
        # the tokenizer and the config
        Case(s, "tokenizer dir missing", lambda e: {"tokenizer_name": os.path.join(e.root, "nope")},
             r"tokenizer directory .*nope does not exist"),
        Case(s, "tokenizer dir without a tokenizer", lambda e: {"tokenizer_name": e.no_tokenizer},
             r"no tokenizer in directory .*no_tokenizer"),
        Case(s, "broken tokenizer.json", lambda e: {"tokenizer_name": e.broken_tokenizer},
             r"could not load the tokenizer in directory .*broken_tokenizer"),
        Case(s, "config dir missing", lambda e: {"config_name": os.path.join(e.root, "nope")},
             r"directory .*nope does not exist; pass a model directory"),
        Case(s, "config dir without config.json", lambda e: {"config_name": e.no_config},
             r"no config\.json in .*no_config"),
        Case(s, "config.json not JSON", lambda e: {"config_name": e.not_json},
             r"invalid config\.json in .*not_json: not JSON \(Expecting"),
        Case(s, "config.json a list", lambda e: {"config_name": e.json_list},
             r"invalid config\.json in .*json_list: a JSON list"),
        Case(s, "config.json value of the wrong type", lambda e: {"config_name": e.wrong_value},
             r"invalid config\.json in .*wrong_value \(.*n_layer"),
        # the output directory
        Case(s, "output dir is a file", lambda e: {"output_dir": inp(e, "a_file")}, r"--output_dir .*a_file is a file"),
        Case(s, "output dir under a file", lambda e: {"output_dir": os.path.join(inp(e, "a_file"), "run")},
             r"--output_dir .*run cannot be created: .*a_file is a file"),
        Case(s, "output dir not empty", lambda e: {"overwrite_output_dir": None},
             r"already exists and is not empty; pass --overwrite_output_dir"),
        Case(s, "read-only output dir", lambda e: {}, r"cannot write to .*Permission denied", read_only),
        Case(s, "unwritable output dir", lambda e: {}, r"cannot write to .*Permission denied", unwritable),
        # resuming: checked before the output directory is made
        Case(s, "resume with no checkpoint", lambda e: {"output_dir": os.path.join(e.root, "fresh"),
                                                         "resume_from_checkpoint": "latest"},
             r"--resume_from_checkpoint latest: no checkpoint in .*fresh/checkpoints; train without it first"),
        Case(s, "resume from a directory that is no checkpoint", lambda e: {"resume_from_checkpoint": e.inputs},
             r"--resume_from_checkpoint .*inputs is not a checkpoint directory"),
        # the optimizer and its schedule: checked before any work
        Case(s, "an optimizer flaxlm lacks", lambda e: {"optim": "lion_32bit"},
             r"--optim lion_32bit is not one of flaxlm's optimizers; pass adamw, adafactor, muon"),
        Case(s, "a schedule transformers lacks", lambda e: {"lr_scheduler_type": "cosinus"},
             r"--lr_scheduler_type cosinus is not one of transformers' schedules"),
        Case(s, "a schedule's setting it does not take", lambda e: {"lr_scheduler_kwargs": '{"num_cycle": 1}'},
             r"--lr_scheduler_kwargs: linear takes no num_cycle \(it takes: none\)"),
        Case(s, "a negative z-loss", lambda e: {"z_loss": -1}, r"--z_loss -1(\.0)? is out of range"),
    ]


def tokenizer_cases():
    s = "train_tokenizer"
    return [
        Case(s, "vocab size abc", lambda e: {"vocab_size": "abc"}, r"argument --vocab_size: invalid int value"),
        Case(s, "vocab size 1.5", lambda e: {"vocab_size": "1.5"}, r"argument --vocab_size: invalid int value"),
        Case(s, "negative min frequency", lambda e: {"min_frequency": -1}, r"--min_frequency -1 is out of range"),
        Case(s, "zero model max length", lambda e: {"model_max_length": 0}, r"--model_max_length 0 is out of range"),
        Case(s, "zero samples", lambda e: {"max_train_samples": 0}, r"--max_train_samples 0 is out of range"),
        Case(s, "vocab too small", lambda e: {"vocab_size": 100}, r"--vocab_size 100 is too small for byte-level"),
        Case(s, "unknown type", lambda e: {"type": "sentencepiece"}, r"argument --type: invalid choice"),
        Case(s, "train file missing", lambda e: {"train_file": inp(e, "nope.txt")}, r"nope\.txt does not exist"),
        Case(s, "empty train file", lambda e: {"train_file": inp(e, "empty.txt")}, r"empty\.txt is empty"),
        Case(s, "blank lines only", lambda e: {"train_file": inp(e, "blank.txt")}, r"blank\.txt holds no text"),
        Case(s, "non-UTF-8 txt", lambda e: {"train_file": inp(e, "non_utf8.txt")},
             r"non_utf8\.txt line 2 is not UTF-8 text"),
        Case(s, "non-UTF-8 jsonl", lambda e: {"train_file": inp(e, "non_utf8.jsonl")},
             r"non_utf8\.jsonl line 2 is not UTF-8 text"),
        Case(s, "non-UTF-8 gzip", lambda e: {"train_file": inp(e, "non_utf8.txt.gz")},
             r"non_utf8\.txt\.gz line 51 is not UTF-8 text"),
        Case(s, "non-UTF-8 streamed", lambda e: {"train_file": inp(e, "non_utf8.txt"), "streaming": True},
             r"non_utf8\.txt line 2 is not UTF-8 text"),
        Case(s, "output dir is a file", lambda e: {"output_dir": inp(e, "a_file")}, r"a_file is a file"),
        Case(s, "output dir under a file", lambda e: {"output_dir": os.path.join(inp(e, "a_file"), "tok")},
             r"cannot be created: .*a_file is a file"),
        Case(s, "tokenizer already there", lambda e: {"overwrite_output_dir": None},
             r"already holds a tokenizer \(tokenizer\.json\); pass --overwrite_output_dir"),
        Case(s, "read-only output dir", lambda e: {}, r"cannot write to .*Permission denied", read_only),
        Case(s, "unwritable output dir", lambda e: {}, r"cannot write to .*Permission denied", unwritable),
    ]


def config_cases():
    s = "create_config"
    return [
        Case(s, "unknown preset", lambda e: {"preset": "gpt5"}, r"unknown preset 'gpt5'"),
        Case(s, "bad --set", lambda e: {"set": "n_layer=two"}, r"config key 'n_layer' takes a number"),
        Case(s, "--set without =", lambda e: {"set": "n_layer"}, r"--set expects key=value"),
        Case(s, "bool flag not a bool", lambda e: {"list_presets": "maybe"},
             r"argument --list_presets: expected true or false"),
        Case(s, "tokenizer dir missing", lambda e: {"tokenizer_name": os.path.join(e.root, "nope")},
             r"no tokenizer found in --tokenizer_name .*nope"),
        Case(s, "tokenizer dir without a tokenizer", lambda e: {"tokenizer_name": e.no_tokenizer},
             r"no tokenizer found in --tokenizer_name .*no_tokenizer"),
        Case(s, "broken tokenizer.json", lambda e: {"tokenizer_name": e.broken_tokenizer},
             r"could not load the tokenizer in directory .*broken_tokenizer"),
        Case(s, "output dir is a file", lambda e: {"output_dir": inp(e, "a_file")}, r"a_file is a file"),
        Case(s, "output dir under a file", lambda e: {"output_dir": os.path.join(inp(e, "a_file"), "m")},
             r"cannot be created: .*a_file is a file"),
        Case(s, "config.json already there", lambda e: {"overwrite_output_dir": None},
             r"config\.json already exists; pass --overwrite_output_dir"),
        Case(s, "no output dir", lambda e: {"output_dir": None}, r"missing required option --output_dir"),
        Case(s, "read-only output dir", lambda e: {}, r"cannot write to .*Permission denied", read_only),
        Case(s, "unwritable output dir", lambda e: {}, r"cannot write to .*Permission denied", unwritable),
    ]


def generate_cases():
    s = "generate"
    return [
        Case(s, "max new tokens 1.5", lambda e: {"max_new_tokens": "1.5"}, r"--max_new_tokens: invalid int value"),
        Case(s, "zero new tokens", lambda e: {"max_new_tokens": 0}, r"--max_new_tokens 0 is out of range"),
        Case(s, "temperature abc", lambda e: {"temperature": "abc"}, r"--temperature: invalid float value"),
        Case(s, "NaN temperature", lambda e: {"temperature": "nan", "do_sample": True},
             r"--temperature nan is not a finite number"),
        Case(s, "negative top k", lambda e: {"top_k": -3}, r"--top_k -3 is out of range"),
        Case(s, "model dir missing", lambda e: {"model_name_or_path": os.path.join(e.root, "nope")},
             r"directory .*nope does not exist"),
        Case(s, "model dir without a tokenizer", lambda e: {"model_name_or_path": e.no_tokenizer},
             r"no tokenizer in directory .*no_tokenizer"),
        Case(s, "model dir without config.json", lambda e: {"model_name_or_path": e.no_config},
             r"no config\.json in .*no_config"),
        Case(s, "config.json not JSON", lambda e: {"model_name_or_path": e.not_json},
             r"invalid config\.json in .*not_json: not JSON"),
        Case(s, "config.json a list", lambda e: {"model_name_or_path": e.json_list}, r"a JSON list"),
        Case(s, "config.json value of the wrong type", lambda e: {"model_name_or_path": e.wrong_value},
             r"invalid config\.json in .*wrong_value"),
        Case(s, "no weights", lambda e: {"model_name_or_path": e.no_weights}, r"no model\.safetensors in"),
        Case(s, "prompt file missing", lambda e: {"prompt": None, "prompt_file": inp(e, "nope.txt")},
             r"--prompt_file .*nope\.txt does not exist"),
        Case(s, "prompt file is a directory", lambda e: {"prompt": None, "prompt_file": e.inputs},
             r"--prompt_file .* is a directory"),
        Case(s, "prompt file not UTF-8", lambda e: {"prompt": None, "prompt_file": inp(e, "prompts_non_utf8.txt")},
             r"--prompt_file .*prompts_non_utf8\.txt line 2 is not UTF-8 text"),
        Case(s, "prompt file blank", lambda e: {"prompt": None, "prompt_file": inp(e, "blank.txt")},
             r"no prompt given"),
    ]


def grpo_cases():
    s = "run_grpo"
    return [
        Case(s, "batch of no whole groups", lambda e: {"num_generations": 3},
             r"global batch of 8 completions .* is no multiple of --num_generations 3; make it one"),
        Case(s, "a prompt record without its prompt", lambda e: {"train_file": inp(e, "no_prompt.jsonl")},
             r"prompt 3 of .*no_prompt\.jsonl has no 'prompt' \(its fields: answer, question\)"),
        Case(s, "reward file missing", lambda e: {"reward_funcs": inp(e, "nope.py") + ":short"},
             r"--reward_funcs .*nope\.py:short: no file .*nope\.py"),
        Case(s, "reward function not in its file", lambda e: {"reward_funcs": inp(e, "rewards.py") + ":long"},
             r"--reward_funcs .*rewards\.py:long: no 'long' in it \(callables there: short\)"),
        Case(s, "unknown built-in reward", lambda e: {"reward_funcs": "acuracy"},
             r"--reward_funcs acuracy: no built-in reward of that name"),
        Case(s, "a weight for each of two rewards", lambda e: {"positional": ["--reward_weights", "1", "2"]},
             r"--reward_weights gives 2 weights for 1 reward functions"),
        Case(s, "an answer column the prompts lack", lambda e: {"answer_column": "solution"},
             r"the reward token_f1 needs the column 'solution' in the data \(columns: answer\)"),
        Case(s, "top p above 1", lambda e: {"top_p": 1.5}, r"--top_p 1\.5"),
        Case(s, "resume with no checkpoint", lambda e: {"resume_from_checkpoint": "latest"},
             r"--resume_from_checkpoint latest: no checkpoint in"),
        Case(s, "model dir missing", lambda e: {"model_name_or_path": os.path.join(e.root, "nope")},
             r"directory .*nope does not exist"),
    ]


def distill_cases():
    s = "run_distill"
    return [
        Case(s, "top k above the vocabulary", lambda e: {"top_k": 400},
             r"--top_k 400 is more than the \d+ tokens of the vocabulary student and teacher share"),
        Case(s, "alpha above 1", lambda e: {"alpha": 1.5}, r"--alpha 1\.5 is a share and lies in \[0, 1\]"),
        Case(s, "temperature 0", lambda e: {"temperature": 0}, r"--temperature 0 leaves no distribution to learn from"),
        Case(s, "teacher dir missing", lambda e: {"teacher_model_name_or_path": os.path.join(e.root, "nope")},
             r"nope does not exist"),
        Case(s, "teacher not a decoder", lambda e: {"teacher_model_name_or_path": e.roberta},
             r"holds a roberta model, which does not"),
        Case(s, "teacher of another vocabulary", lambda e: {"teacher_model_name_or_path": e.other_vocab},
             r"the teacher's vocabulary \(.*other_vocab: \d+ tokens\) is not the student's"),
        Case(s, "rows longer than the teacher's positions", lambda e: {"teacher_model_name_or_path": e.short_teacher},
             r"--max_length 16 is longer than the teacher's 8 positions \(.*short_teacher, config\.json\); pass "
             r"--max_length 8 or less"),
        Case(s, "gkd: a prompt and its completion past --max_length", lambda e: {"mode": "gkd", "max_new_tokens": 20},
             r"--max_prompt_length 8 \+ --max_new_tokens 20 exceeds --max_length 16"),
        Case(s, "gkd on plain text",
             lambda e: {"mode": "gkd", "max_new_tokens": 4, "train_file": inp(e, "plain.jsonl")},
             r"none of the \d+ train examples has a prompt before its answer"),
        Case(s, "rows that the teacher store cannot index", lambda e: {"streaming": True},
             r"run_distill\.py trains on fixed rows"),
    ]


def long_context_cases():
    """--rope_scaling (context extension) and --context_parallel_size on run_clm_flax.py (gpt2-tiny has learned
    positions, qwen3-tiny 256 RoPE positions; 8 devices) and run_mlm_flax.py (an encoder)."""
    s, yarn = "run_clm_flax", '{"rope_type": "yarn", "factor": 2}'
    return [
        Case(s, "context parallel not dividing the devices", lambda e: {"context_parallel_size": 3},
             r"--context_parallel_size 3 does not divide the 8 devices; use a divisor of 8"),
        Case(s, "rows not splitting into context chunks", lambda e: {"context_parallel_size": 4, "max_seq_length": 12},
             r"rows of 12 tokens do not split into 2 x --context_parallel_size 4 equal chunks"),
        Case(s, "context parallel with expert sharding", lambda e: {"context_parallel_size": 2, "sharding": "expert",
                                                                    "expert_parallel_size": 2},
             r"--context_parallel_size with --sharding expert is not supported"),
        Case("run_mlm_flax", "context parallel for an encoder", lambda e: {"context_parallel_size": 2},
             r"--context_parallel_size splits a causal LM's sequences, and this is a roberta model; drop it"),
        Case(s, "rope scaling without rotary positions", lambda e: {"rope_scaling": yarn},
             r"--rope_scaling changes rotary position embeddings, and gpt2 has none"),
        Case(s, "rope scaling not JSON", lambda e: {"rope_scaling": "yarn"}, r"--rope_scaling is not JSON"),
        Case(s, "rope scaling dynamic", lambda e: {"config_name": e.qwen3,
                                                   "rope_scaling": '{"rope_type": "dynamic", "factor": 2}'},
             r"--rope_scaling dynamic is an inference-time scaling .* use yarn"),
        Case(s, "rope scaling without a factor", lambda e: {"config_name": e.qwen3,
                                                            "rope_scaling": '{"rope_type": "yarn"}'},
             r"--rope_scaling yarn needs a factor of at least 1"),
        Case(s, "block past the extended context", lambda e: {"config_name": e.qwen3, "rope_scaling": yarn,
                                                              "max_seq_length": 1024},
             r"--block_size 1024 is larger than the model's 512 positions"),
    ]


def upcycle_cases():
    s = "upcycle_moe"
    return [
        Case(s, "one expert", lambda e: {"num_experts": 1, "num_experts_per_tok": 1},
             r"--num_experts 1 is out of range; it must be at least 2"),
        Case(s, "more experts a token than experts", lambda e: {"num_experts_per_tok": 5},
             r"--num_experts_per_tok 5 is more than --num_experts 4"),
        Case(s, "a family with no mixture sibling", lambda e: {"model_name_or_path": e.gen},
             r"no mixture-of-experts sibling"),
        Case(s, "a mixture already", lambda e: {"model_name_or_path": e.qwen3_moe}, r"a mixture of experts already"),
        Case(s, "windows on some layers", lambda e: {"model_name_or_path": e.mixed_windows},
             r"sliding windows \[None, 4\]"),
        Case(s, "model without a tokenizer", lambda e: {"model_name_or_path": e.qwen3_bare}, r"no tokenizer"),
        Case(s, "model dir missing", lambda e: {"model_name_or_path": os.path.join(e.root, "nope")},
             r"nope does not exist"),
        Case(s, "output dir not empty", lambda e: {"output_dir": e.inputs},
             r"already exists and is not empty"),
    ]


def fill_cases(script):
    what = "extra_id_0" if script == "fill_spans" else "mask"
    return [
        Case(script, "no arguments", lambda e: {}, rf"usage: {script}\.py MODEL_DIR TEXT"),
        Case(script, "model dir without config.json", lambda e: {"positional": [e.inputs, f"a <{what}> b"]},
             r"holds no exported model \(config\.json\)"),
    ]


CASES = ([c for s in ("run_clm_flax", "run_mlm_flax", "run_t5_mlm_flax", "train_tokenizer", "create_config",
                      "generate", "run_grpo", "run_distill", "upcycle_moe") for c in common_cases(s)]
         + [c for s in TRAINING for c in training_cases(s)]
         + tokenizer_cases() + config_cases() + generate_cases() + fill_cases("fill_mask") + fill_cases("fill_spans")
         + grpo_cases() + distill_cases() + upcycle_cases() + long_context_cases())
# one case per script, run as a real process: exit code and stderr end to end
SUBPROCESS = {"run_clm_flax": "tokenizer dir without a tokenizer", "run_mlm_flax": "non-UTF-8 csv",
              "run_t5_mlm_flax": "config.json not JSON", "train_tokenizer": "non-UTF-8 streamed",
              "create_config": "yaml syntax error", "generate": "prompt file not UTF-8",
              "fill_mask": "model dir without config.json", "fill_spans": "no arguments",
              "run_grpo": "a prompt record without its prompt",
              "run_distill": "rows longer than the teacher's positions",
              "upcycle_moe": "one expert"}


# ---------------------------------------------------------------------------------------------------------
# Checks.


def snapshot(*roots):
    """{path: sha256} of every file under the roots (a root that is a file counts as one), {path: "directory"} of
    every directory: a refused run leaves no directory it made, empty or not."""
    out = {}
    for root in roots:
        if os.path.isfile(root):
            out[root] = hashlib.sha256(open(root, "rb").read()).hexdigest()
        for d, _, files in os.walk(root):
            out[d] = "directory"
            for f in files:
                p = os.path.join(d, f)
                with open(p, "rb") as fh:
                    out[p] = hashlib.sha256(fh.read()).hexdigest()
    return out


def check_stderr(err, match):
    """One line 'error: ...' matching `match`, last; anything else on stderr only progress bars."""
    assert "Traceback" not in err, err
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    noise = [line for line in lines if not line.startswith("error:") and not PROGRESS.search(line)]
    assert len(errors) == 1 and not noise and lines[-1] == errors[0], lines
    assert re.search(match, errors[0]), errors[0]
    assert len(errors[0]) < 600, errors[0]


def place_output_dir(tmp_path):
    out = tmp_path / "out"
    for name, data in PLACED.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return str(out)


def case_argv(case, e, out):
    flags = {**base_flags(case.script, e, out), **case.flags(e)}
    return argv_of(flags)


def run_in_process(script, argv, capsys, monkeypatch):
    """(exit code, stderr) of the script's main, wrapped as `python script.py` wraps it."""
    module = importlib.import_module(script)
    if script.startswith("fill_"):  # these read sys.argv themselves
        monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
        call = module.main
    else:
        def call():
            module.main(argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_main(call)
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("case", CASES, ids=[f"{c.script}:{c.name}" for c in CASES])
def test_bad_input(case, env, tmp_path, capsys, monkeypatch):
    out = place_output_dir(tmp_path)
    argv = case_argv(case, env, out)
    if case.setup:
        case.setup(out, monkeypatch)
    if case.script == "run_distill":  # every option is checked against the models before any teacher work
        from flaxlm.distillation import run
        monkeypatch.setattr(run, "load_teacher", lambda *a, **k: pytest.fail("the teacher was loaded"))
    before = snapshot(env.root, out)
    try:
        code, err = run_in_process(case.script, argv, capsys, monkeypatch)
    finally:
        os.chmod(out, 0o755)
    assert code == 2, err
    check_stderr(err, case.match)
    assert snapshot(env.root, out) == before, "a file was changed, removed or added"


@pytest.mark.parametrize("script", sorted(SUBPROCESS))
def test_end_to_end_in_a_subprocess(script, env, tmp_path):
    (case,) = [c for c in CASES if c.script == script and c.name == SUBPROCESS[script]]
    out = place_output_dir(tmp_path)
    argv = case_argv(case, env, out)
    before = snapshot(env.root, out)
    proc = subprocess.run([sys.executable, f"{script}.py", *argv], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    check_stderr(proc.stderr, case.match)
    assert snapshot(env.root, out) == before


def test_case_count(capsys):
    """Every script has cases; the count goes to the terminal (the closing note of a run quotes it)."""
    per_script = collections.Counter(c.script for c in CASES)
    assert set(per_script) == {"run_clm_flax", "run_mlm_flax", "run_t5_mlm_flax", "train_tokenizer",
                               "create_config", "generate", "fill_mask", "fill_spans", "run_grpo", "run_distill",
                               "upcycle_moe"}
    assert len({(c.script, c.name) for c in CASES}) == len(CASES)
    listing = ", ".join(f"{script} {n}" for script, n in sorted(per_script.items()))
    with capsys.disabled():
        print(f"\nbad-input fuzz: {len(CASES)} cases in-process ({listing}) + {len(SUBPROCESS)} as subprocesses")


# ---------------------------------------------------------------------------------------------------------
# Odd but valid input works.


def test_a_line_longer_than_the_block_trains(env, tmp_path):
    """Packed text: one line of ~2000 words fills many blocks of 16 tokens; the run trains and exports."""
    import run_clm_flax
    out = str(tmp_path / "run")
    run_clm_flax.main(argv_of({**base_flags("run_clm_flax", env, out), "train_file": inp(env, "long_line.txt"),
                               "validation_file": None, "validation_split_percentage": 0}))
    assert os.path.isfile(os.path.join(out, "model.safetensors"))


@pytest.mark.parametrize("script", ["run_mlm_flax", "run_t5_mlm_flax", "run_mlm_flax --line_by_line"])
def test_a_line_longer_than_the_block_makes_rows(script, env):
    """The masked-LM and T5 scripts cut the long line into blocks like any text (line by line: truncate it)."""
    from transformers import AutoTokenizer
    from flaxlm.data.rows import blocks, from_text, lines
    from flaxlm.data.text import load_raw_text
    src = types.SimpleNamespace(dataset_name=None, dataset_config_name=None, train_file=[inp(env, "long_line.txt")],
                                validation_file=None, text_column=None, streaming=False, cache_dir=None)
    tokenizer = AutoTokenizer.from_pretrained(getattr(env, MODEL_OF[script.split()[0]]))
    raw = load_raw_text(src, validation_split_percentage=0)
    make_rows = lines(tokenizer, 16, pack=False) if "--line_by_line" in script else blocks(tokenizer, 16)
    rows = from_text(raw, make_rows, 16)["train"]
    assert rows[:]["input_ids"].shape == ((1, 16) if "--line_by_line" in script else (len(rows), 16))
    assert len(rows) == 1 if "--line_by_line" in script else len(rows) > 100


def test_a_tokenizer_trains_on_one_long_line(env, tmp_path):
    out = str(tmp_path / "tok")
    train_tokenizer.main(["--train_file", inp(env, "long_line.txt"), "--vocab_size", "300", "--output_dir", out])
    assert json.load(open(os.path.join(out, "tokenizer.json")))["model"]["type"] == "BPE"
