"""A suite file: the tasks evaluate_suite.py fine-tunes a pretrained model on, read and checked before any training.

    tasks:
      - name: ud_upos                       # the task's folder under --output_dir and its row in the table
        kind: tagging                       # classification | tagging | ner | qa | seq2seq; decoders: choice |
                                            # generate | bits_per_byte (KINDS)
        metric: accuracy                    # optional: the kind's first metric by default
        train_file: no/ud_bokmaal_dev.conllu  # *_file paths: relative to --data_dir (or absolute)
        tag_column: upos                    # any other key: the script's flag (--tag_column upos)
        hub: {dataset_name: commul/universal_dependencies, dataset_config_name: no_bokmaal, tags_column: upos}
                                            # optional: the task's Hugging Face dataset and the flags that differ
                                            # from the local files' (read instead of the *_file paths when there is
                                            # no local data folder: see suite_data_dir)
    defaults: {seed: 42}                    # optional: flags every task gets unless it sets them itself (a decoder's
                                            # tasks: those of its script's options)

`metric` is the suite's own key (the table's score), not passed on: the script reports its default metrics. A
mistake in the file (an unknown kind or metric, a missing data file, a flag the suite sets itself, for the scripts
whose options are declared in flaxlm.config.options an unknown flag, a task without a hub dataset when there is no
local data) is a UserError naming the task and the key.
"""
import dataclasses
import json
import os
import re

import yaml

from flaxlm.config import options
from flaxlm.errors import UserError


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a kind of task runs and how it is scored."""
    script: str  # the script that runs it (fine-tunes, or prompts a decoder), beside evaluate_suite.py
    model: str  # the kind of model it judges: "encoder", "seq2seq" or "decoder" (model_kind)
    metrics: tuple  # the metrics the suite can score it by; the first is the default
    predictions: str  # the predictions file the script writes into its --output_dir (the output contract)
    baseline: str | None  # what the trivial baseline does, for the table


KINDS = {
    "classification": Kind("run_classification.py", "encoder", ("accuracy", "macro_f1"),
                           "predictions_validation.tsv", "majority class"),
    "tagging": Kind("run_token_classification.py", "encoder", ("accuracy",), "predictions_validation.conll",
                    "most frequent tag per word"),
    "ner": Kind("run_token_classification.py", "encoder", ("f1", "precision", "recall"),
                "predictions_validation.conll", "most frequent tag per word"),
    "qa": Kind("run_qa.py", "encoder", ("f1", "exact"), "predictions.json", None),
    "seq2seq": Kind("run_seq2seq.py", "seq2seq", ("chrf", "bleu"), "predictions_validation.jsonl",
                    "copy the source"),
    "choice": Kind("run_fewshot.py", "decoder", ("accuracy", "macro_f1", "mcc"), "predictions_validation.jsonl",
                   "majority class"),
    "generate": Kind("run_fewshot.py", "decoder", ("chrf", "bleu"), "predictions_validation.jsonl", "copy the source"),
    "bits_per_byte": Kind("evaluate_lm.py", "decoder", ("bits_per_byte",), "predictions_validation.jsonl",
                          "--baseline_model"),
}
TRAINED = ("classification", "tagging", "ner", "qa", "seq2seq")  # the kinds that fine-tune (--max_steps caps them)
FILE_KEYS = ("train_file", "validation_file", "test_file")  # paths under --data_dir
HUB = "hub"  # a task's Hugging Face dataset: dataset_name, dataset_config_name, and the flags that differ for it
SUITE_SETS = ("model_name_or_path", "output_dir", "config_name", "overwrite_output_dir")  # flags the suite passes
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclasses.dataclass(frozen=True)
class SuiteTask:
    name: str
    kind: str  # a key of KINDS
    metric: str
    flags: dict  # the script's flags {name: value}, the *_file paths resolved

    def argv(self, max_steps=None):
        """The script's flags as a command line (lists as several values; a mapping as JSON), --max_steps last when
        given to a kind that trains; run_fewshot.py's --task_type first."""
        out = ["--task_type", self.kind] if KINDS[self.kind].script == "run_fewshot.py" else []
        capped = {"max_steps": max_steps} if max_steps and self.kind in TRAINED else {}
        for key, value in {**self.flags, **capped}.items():
            if isinstance(value, dict):
                value = json.dumps(value, ensure_ascii=False)
            values = value if isinstance(value, list) else [value]
            out += [f"--{key}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
        return out


def suite_data_dir(data_dir, scripts_dir):
    """The folder the tasks' files are read from: --data_dir, else $FLAXLM_DATA_DIR, else ../shared/data beside the
    scripts when it exists (this repository's development data); None when there is none of them: the tasks then
    load their `hub` datasets."""
    given = data_dir or os.environ.get("FLAXLM_DATA_DIR")
    if given:
        return given
    default = os.path.join(scripts_dir, "..", "shared", "data")
    return default if os.path.isdir(default) else None


def read_suite(path, data_dir):
    """The SuiteTasks of the yaml file at `path`, in order: their files resolved under data_dir and present, or with
    data_dir None their `hub` datasets instead of the files."""
    where = f"suite file {path}"
    try:
        with open(path, encoding="utf-8") as f:
            suite = yaml.safe_load(f)
    except OSError as e:
        raise UserError(f"cannot read {where} ({e.strerror}); pass --suite with a yaml file such as "
                        f"configs/suites/norwegian.yaml") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"{where} is not valid yaml ({' '.join(str(e).split())[:200]}); fix it") from None
    if not isinstance(suite, dict) or not isinstance(suite.get("tasks"), list) or not suite["tasks"]:
        raise UserError(f"{where} needs a list of tasks under the key 'tasks' (each a mapping with name, kind and "
                        f"the files and flags of its script)")
    unknown = set(suite) - {"tasks", "defaults"}
    if unknown:
        raise UserError(f"{where} has unknown top-level key(s) {', '.join(sorted(unknown))}; only 'tasks' and "
                        f"'defaults' are read")
    defaults = suite.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"'defaults' in {where} must be a mapping of flags (e.g. seed: 42)")
    tasks = [_task(entry, i, defaults, data_dir, where) for i, entry in enumerate(suite["tasks"])]
    names = [t.name for t in tasks]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"task name {repeated[0]} appears twice in {where}; give each task its own name")
    return tasks


def _task(entry, index, defaults, data_dir, where):
    if not isinstance(entry, dict):
        raise UserError(f"task {index + 1} of {where} is not a mapping; give it name, kind, files and flags")
    entry = {**_taken(defaults, entry.get("kind")), **entry}
    name = entry.pop("name", None)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UserError(f"task {index + 1} of {where} needs a name of letters, digits, '_', '.' or '-' (got "
                        f"{name!r}): it names the task's output folder")
    where = f"task {name} of {where}"
    kind = entry.pop("kind", None)
    if kind not in KINDS:
        raise UserError(f"{where} has kind {kind!r}; use one of {', '.join(KINDS)}")
    metric = entry.pop("metric", KINDS[kind].metrics[0])
    if metric not in KINDS[kind].metrics:
        raise UserError(f"{where}: metric {metric!r} does not score a {kind} task; use one of "
                        f"{', '.join(KINDS[kind].metrics)}")
    hub = entry.pop(HUB, None)
    if data_dir is None:
        entry = _hub_flags(entry, hub, where)
    for key in entry:
        if key in SUITE_SETS:
            raise UserError(f"{where} sets {key}, which evaluate_suite.py sets itself; remove it from the suite file")
    if data_dir is None:
        return SuiteTask(name, kind, metric, entry)
    needed = {"qa": ("train_file", "validation_file"), "bits_per_byte": ("validation_file",)}.get(kind, ("train_file",))
    for key in needed:
        if not entry.get(key):
            raise UserError(f"{where} has no {key}; a {kind} task needs " + " and ".join(needed))
    for key in FILE_KEYS:
        if key in entry:
            entry[key] = [_data_file(p, data_dir, f"{where}, {key}") for p in _as_list(entry[key])]
    return SuiteTask(name, kind, metric, entry)


def _hub_flags(entry, hub, where):
    """The task's flags for its hub dataset: the local *_file paths dropped, the `hub` mapping's flags over the
    others (its dataset_name, dataset_config_name, and the columns, prompt or splits that differ)."""
    if not (isinstance(hub, dict) and isinstance(hub.get("dataset_name"), str) and hub["dataset_name"]):
        raise UserError(f"{where} has no '{HUB}' mapping with a dataset_name, and there is no local data folder to "
                        f"read its files from; pass --data_dir (or set FLAXLM_DATA_DIR), or give the task "
                        f"{HUB}: {{dataset_name: ...}}")
    return {**{key: value for key, value in entry.items() if key not in FILE_KEYS}, **hub}


def _taken(defaults, kind):
    """The defaults a task of `kind` takes: all of them, but only its script's own options for a decoder's kinds
    (which train nothing: no logging_steps, no save_steps)."""
    if kind not in KINDS or KINDS[kind].model != "decoder":
        return defaults
    names = {f.name for group in SCRIPT_OPTIONS[kind] for f in dataclasses.fields(group)}
    return {key: value for key, value in defaults.items() if key in names}


def _as_list(value):
    return value if isinstance(value, list) else [value]


def _data_file(path, data_dir, where):
    """The absolute path of a data file named relative to data_dir; UserError if it is not a file."""
    if not isinstance(path, str) or not path:
        raise UserError(f"{where} is {path!r}; give a file path relative to --data_dir")
    full = os.path.abspath(os.path.join(data_dir, path))
    if not os.path.isfile(full):
        hint = ("" if os.path.isdir(data_dir) else
                f" (--data_dir {data_dir} does not exist: pass --data_dir, or set FLAXLM_DATA_DIR)")
        raise UserError(f"{where}: no file {full}{hint}; fix the path or the data folder")
    return full


# The option groups of the scripts whose options are declared in flaxlm.config.options, as each script parses them
_TOKEN_CLASSIFICATION = (options.ModelArgs, options.TextSourceArgs, options.DataArgs,
                         options.TokenClassificationArgs, options.TrainingArgs)
SCRIPT_OPTIONS = {
    "classification": (options.ModelArgs, options.TextSourceArgs, options.DataArgs, options.SentencePredictionArgs,
                       options.TrainingArgs),
    "tagging": _TOKEN_CLASSIFICATION,
    "ner": _TOKEN_CLASSIFICATION,
    "qa": (options.ModelArgs, options.TextSourceArgs, options.DataArgs, options.QuestionAnsweringArgs,
           options.TrainingArgs),
    "choice": (options.FewShotArgs, options.TextSourceArgs),
    "generate": (options.FewShotArgs, options.TextSourceArgs),
    "bits_per_byte": (options.EvaluateLMArgs,),
}


def script_options(task):
    """The task's flags as its script parses them (one instance per option group), or None for a kind whose
    script's options are not known here. An unknown flag or a bad value is a UserError naming the task."""
    from flaxlm.config.cli import parse_args
    if task.kind not in SCRIPT_OPTIONS:
        return None
    try:
        return parse_args(*SCRIPT_OPTIONS[task.kind], argv=[*task.argv(), "--output_dir", "unused",
                                                            "--model_name_or_path", "unused"],
                          prog=KINDS[task.kind].script)
    except UserError as e:
        raise UserError(f"task {task.name}: {e}") from None
