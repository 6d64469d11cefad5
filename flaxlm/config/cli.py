"""Command lines from option dataclasses, with yaml config files (Hugging Face's flag names work).

parse_args(ModelArgs, DataArgs, ...) builds one argparse parser from the dataclasses' fields and
returns one filled instance per dataclass. Precedence: field defaults < each --config_file yaml in
order (later files win) < flags on the command line.

A yaml file is a mapping of option names to values. It may also hold a section named after a
script (e.g. `run_mlm_flax:`), whose keys apply to that script only and win over the top-level keys;
so one recipe file can serve train_tokenizer.py, create_config.py and run_mlm_flax.py. Top-level keys
that this script does not take are skipped when some other flaxlm script takes them; anything else
is an error naming the key and its nearest valid names.
"""
import argparse
import dataclasses
import difflib
import math
import os
import sys
import types
import typing

import yaml

from flaxlm.errors import UserError

SCRIPT_SECTIONS = ("train_tokenizer", "create_config", "run_mlm_flax", "run_t5_mlm_flax", "run_clm_flax",
                   "generate", "run_classification", "run_qa")

# The least value of the numeric options that count something, in whichever script has them: a value below it
# (or NaN/inf in any float option) fails here in one line, not as a ZeroDivisionError deep inside training.
MINIMUM = {
    "per_device_train_batch_size": 1, "per_device_eval_batch_size": 1, "train_batch_size": 1, "eval_batch_size": 1,
    "gradient_accumulation_steps": 1, "logging_steps": 1, "eval_steps": 1, "save_steps": 1, "save_total_limit": 1,
    "warmup_steps": 0, "cpu_chunk_tokens": 0, "lm_head_chunk_rows": 0, "eval_timeout": 0, "num_train_epochs": 0, "learning_rate": 0, "weight_decay": 0,
    "adam_epsilon": 0, "max_grad_norm": 0, "seed": 0, "max_seq_length": 1, "block_size": 1,
    "preprocessing_num_workers": 1, "max_train_samples": 1, "max_eval_samples": 1,
    "vocab_size": 1, "min_frequency": 0, "model_max_length": 1, "max_new_tokens": 1, "top_k": 0,
    "doc_stride": 0, "n_best_size": 1, "max_answer_length": 1,
}
TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 via run_main, no usage dump
        raise UserError(f"{message} (see {self.prog} --help)")


def _base_type(tp):
    """(scalar type, is_list) of a field annotation such as int, str | None, list[str] | None."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    if origin is list:
        return typing.get_args(tp)[0], True
    return tp, False


def _to_bool(value):
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "y", "on"):
        return True
    if s in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _converter(scalar):
    return _to_bool if scalar is bool else scalar


def _fields(groups):
    for group in groups:
        for f in dataclasses.fields(group):
            yield f


def _build_parser(groups, prog, description):
    parser = _Parser(prog=prog, description=description, allow_abbrev=False,
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config_file", action="append", default=[], metavar="YAML",
                        help="yaml file of options; repeatable, later files win, flags win over files")
    for f in _fields(groups):
        scalar, is_list = _base_type(f.type)
        names = [f"--{f.name}"] + list(f.metadata.get("aliases", ()))
        kw = dict(dest=f.name, help=f.metadata.get("help", ""), default=argparse.SUPPRESS)
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if scalar is bool:
            parser.add_argument(*names, type=_to_bool, nargs="?", const=True, metavar="BOOL", **kw)
        elif is_list:
            parser.add_argument(*names, type=scalar, nargs="+", action="extend", **kw)
        else:
            parser.add_argument(*names, type=scalar, **kw)
    return parser


def _coerce(field, value, source):
    scalar, is_list = _base_type(field.type)
    try:
        if value is None:
            return None
        if is_list:
            items = value if isinstance(value, list) else [value]
            return [_scalar(scalar, v) for v in items]
        out = _scalar(scalar, value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        kind = TYPE_NAMES.get(scalar, getattr(scalar, "__name__", scalar))
        raise UserError(f"{source}: option '{field.name}' has a bad value {value!r} ({e}); "
                        f"it takes {'a list of ' if is_list else ''}{kind}") from None
    choices = field.metadata.get("choices")
    if choices and out not in choices:
        raise UserError(f"{source}: option '{field.name}' must be one of {', '.join(map(str, choices))}, "
                        f"not {out!r}")
    return out


def _scalar(scalar, value):
    """One yaml value as the option's type; a list or mapping where one value belongs is an error."""
    if isinstance(value, (list, dict)):
        raise ValueError("expected a single value")
    if scalar in (int, float) and isinstance(value, bool):
        raise ValueError("expected a number")
    if scalar is int and isinstance(value, float) and not value.is_integer():
        raise ValueError("expected an integer")
    return _converter(scalar)(value)


def check_range(name, value):
    """UserError when a numeric option is NaN/inf or below its MINIMUM."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"--{name} {value} is not a finite number; give a number")
    least = MINIMUM.get(name)
    if least is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value < least:
        raise UserError(f"--{name} {value} is out of range; it must be at least {least}")


def _all_known_options():
    from flaxlm.config import options as all_args
    known = set()
    for obj in vars(all_args).values():
        if dataclasses.is_dataclass(obj) and isinstance(obj, type):
            known.update(f.name for f in dataclasses.fields(obj))
    return known


def load_config_files(paths, fields_by_name, script):
    """Merge yaml files into {option: value} for this script, with clear errors."""
    merged = {}
    for path in paths:
        data = read_yaml_mapping(path, "a mapping of option: value")
        section = data.get(script) or {}
        if not isinstance(section, dict):
            raise UserError(f"config file {path}: section '{script}' must be a mapping of option: value")
        other_known = None
        for key, value in data.items():
            if key in SCRIPT_SECTIONS:
                continue
            if key not in fields_by_name:
                other_known = other_known if other_known is not None else _all_known_options()
                if key in other_known:
                    continue  # an option of another script in a shared recipe file
                _unknown(key, fields_by_name, f"config file {path}")
            merged[key] = _coerce(fields_by_name[key], value, f"config file {path}")
        for key, value in section.items():
            if key not in fields_by_name:
                _unknown(key, fields_by_name, f"config file {path}, section '{script}'")
            merged[key] = _coerce(fields_by_name[key], value, f"config file {path}")
    return merged


def read_yaml_mapping(path, what):
    """A --config_file's mapping ({} when empty); a missing file, bad yaml or something other than a mapping
    (`what` says what it should hold) is one clear error."""
    if not os.path.isfile(path):
        raise UserError(f"config file {path} does not exist; pass an existing yaml file to --config_file")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"config file {path} is not valid yaml ({first}); fix the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold {what}, not a {type(data).__name__}")
    return data


def _unknown(key, fields_by_name, where):
    near = difflib.get_close_matches(str(key), list(fields_by_name), n=3)
    hint = f"; did you mean {' or '.join(near)}?" if near else "; see --help for the options"
    raise UserError(f"{where}: unknown option '{key}'{hint}")


def parse_args(*groups, argv=None, prog=None, description=None):
    """Parse flags and --config_file yaml into one instance per option dataclass, in order."""
    prog = prog or os.path.basename(sys.argv[0])
    script = os.path.splitext(prog)[0]
    parser = _build_parser(groups, prog, description)
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    fields_by_name = {f.name: f for f in _fields(groups)}
    values = load_config_files(ns.config_file, fields_by_name, script)
    values.update({k: v for k, v in vars(ns).items() if k != "config_file"})
    for name, value in values.items():
        for item in value if isinstance(value, list) else [value]:
            check_range(name, item)
    out = []
    for group in groups:
        kwargs = {f.name: values[f.name] for f in dataclasses.fields(group) if f.name in values}
        missing = [f.name for f in dataclasses.fields(group)
                   if f.name not in kwargs and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise UserError(f"missing required option --{missing[0]} (give it as a flag or in a --config_file)")
        out.append(group(**kwargs))
    return tuple(out)


def option(default=None, help="", **metadata):
    """A dataclass field with help text and optional aliases/choices; lists get a fresh default."""
    metadata["help"] = help
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def required(help="", **metadata):
    metadata["help"] = help
    return dataclasses.field(metadata=metadata)
