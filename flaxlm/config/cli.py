"""Command lines from option dataclasses, with yaml config files: the one reader both front doors share.

parse_args(ModelArgs, DataArgs, ...) builds one argparse parser from the dataclasses' fields and returns one
filled instance per dataclass. Precedence: field defaults < each --config_file in order (later files win) <
flags on the command line. train.py parses its own flags with parse_flags and reads the same files into its
nested config (flaxlm.config.experiments).

A config file (a recipe) is a yaml mapping that names each option by its flag name (learning_rate: 3.0e-4, as
Hugging Face's flags) or by its key in train.py's nested config (trainer: {optimizer: {learning_rate: 3.0e-4}},
or trainer.optimizer.learning_rate: 3.0e-4). It may also hold a section named after a script (e.g.
`run_mlm_flax:`) whose keys apply to that script only and win over the top-level keys; so one recipe can serve
train_tokenizer.py, create_config.py and run_mlm_flax.py, and train.py reads the section of its experiment's
script. Top-level keys that this script does not take are skipped when some other flaxlm script takes them;
anything else is an error naming the key and its nearest valid names.
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

from flaxlm import secrets
from flaxlm.config.options import declared_fields, script_fields
from flaxlm.errors import UserError

SCRIPT_SECTIONS = ("train_tokenizer", "create_config", "run_mlm_flax", "run_t5_mlm_flax", "run_clm_flax",
                   "generate", "run_classification", "run_qa", "run_seq2seq", "run_sft", "run_dpo", "run_grpo",
                   "run_distill", "run_electra_flax", "run_token_classification", "run_fewshot", "adapt_vocabulary",
                   "upcycle_moe", "prepare_data", "evaluate_lm", "evaluate_suite")  # every script that reads options
TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
CONFIG_FILE_HELP = "yaml file of options; repeatable, later files win, flags win over files"


def _key_sections(keys):
    """The dotted sections that hold the keys: trainer and trainer.optimizer for trainer.optimizer.learning_rate."""
    return {key.rsplit(".", n)[0] for key in keys for n in range(1, key.count(".") + 1)}


# What some flaxlm script takes, by flag name and by nested key (another script's options in a shared recipe are
# skipped), and the sections of the nested keys.
FLAG_NAMES = {f.name for f in declared_fields()}
NESTED_KEYS = {f.metadata["key"] for f in declared_fields() if "key" in f.metadata}
KEY_SECTIONS = _key_sections(NESTED_KEYS)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 via run_main, no usage dump
        raise UserError(f"{message} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        """argparse's, but the arguments it does not know are named with their secrets masked (a misspelled
        --hub-token VALUE)."""
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(secrets.redact_argv(unknown))}")
        return parsed


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


def _help(field):
    """The option's help with its default, "(default: X)" as argparse's ArgumentDefaultsHelpFormatter writes it, where
    it has one (not None) that the help does not already state. Flags give no argparse default (a config file's
    value must not be overwritten by it), so the formatter cannot."""
    text = field.metadata.get("help", "")
    default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    if default is None or default is dataclasses.MISSING or "default" in text.lower():
        return text
    shown = " ".join(_shown(v) for v in default) if isinstance(default, list) else _shown(default)
    return f"{text} (default: {shown})".lstrip().replace("%", "%%")  # argparse %-formats help


def _shown(value):
    """A default as it is written on a command line: true/false, a string quoted where it is empty or has spaces."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and (not value or not value.isprintable() or any(c.isspace() for c in value)):
        return repr(value)
    return str(value)


def _all_fields(groups):
    return [f for group in groups for f in dataclasses.fields(group)]


def _build_parser(groups, prog, description, config_file_help):
    parser = _Parser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--config_file", action="append", default=[], metavar="YAML", help=config_file_help)
    read = script_fields(groups, os.path.basename(prog))
    taken = {name for f in read for name in f.metadata.get("aliases", ())}
    # The options the script does not read stay on its command line, unlisted (Hugging Face's command lines pass
    # them; parse_args says they are ignored), unless a read option has their flag as an alias.
    unread = [f for f in _all_fields(groups) if f not in read and f"--{f.name}" not in taken]
    for f in read + unread:
        scalar, is_list = _base_type(f.type)
        names = [f"--{f.name}"] + list(f.metadata.get("aliases", ()))
        kw = dict(dest=f.name, help=_help(f) if f in read else argparse.SUPPRESS, default=argparse.SUPPRESS)
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if scalar is bool:
            parser.add_argument(*names, type=_to_bool, nargs="?", const=True, metavar="BOOL", **kw)
        elif is_list:
            parser.add_argument(*names, type=scalar, nargs="+", action="extend", **kw)
        else:
            parser.add_argument(*names, type=scalar, **kw)
    return parser


def coerce(name, field, value, source):
    """A config value as the field's type (named `name` in errors), within its choices."""
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
        raise UserError(f"{source}: option '{name}' has a bad value {value!r} ({e}); "
                        f"it takes {'a list of ' if is_list else ''}{kind}") from None
    choices = field.metadata.get("choices")
    if choices and out not in choices:
        raise UserError(f"{source}: option '{name}' must be one of {', '.join(map(str, choices))}, not {out!r}")
    return out


def _scalar(scalar, value):
    """One yaml value as the option's type; a list or mapping where one value belongs is an error."""
    if isinstance(value, (list, dict)):
        raise ValueError("expected a single value")
    if scalar in (int, float) and isinstance(value, bool):
        raise ValueError("expected a number")
    if scalar is int and isinstance(value, float) and not value.is_integer():
        raise ValueError("expected an integer")
    return _to_bool(value) if scalar is bool else scalar(value)


def check_range(name, value, least=None):
    """UserError when a numeric option is NaN/inf or below `least` (its declared minimum)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"--{name} {value} is not a finite number; give a number")
    if least is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value < least:
        raise UserError(f"--{name} {value} is out of range; it must be at least {least}")


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


def read_recipe(path, script, what):
    """One --config_file for `script`: (its top-level keys, the keys of its section named `script`), two mappings
    applied in that order (the section's keys win); the sections of other scripts are left out."""
    data = read_yaml_mapping(path, what)
    section = data.get(script) or {}
    if not isinstance(section, dict):
        raise UserError(f"config file {path}: section '{script}' must be a mapping of option: value")
    return {key: value for key, value in data.items() if key not in SCRIPT_SECTIONS}, section


def flat_items(mapping, sections, prefix=""):
    """(dotted key, value) of a mapping whose values under the given sections may be nested mappings:
    {trainer: {optimizer: {learning_rate: 1}}} -> trainer.optimizer.learning_rate. A section given something
    other than a mapping comes out as it is, under the section's key."""
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if path in sections and isinstance(value, dict):
            yield from flat_items(value, sections, path + ".")
        else:
            yield path, value


def _recipe_options(path, fields, script):
    """{option: value} that one --config_file gives a script whose options are `fields` ({name: field})."""
    top, section = read_recipe(path, script, "a mapping of option: value")
    by_key = {f.metadata["key"]: f for f in fields.values() if "key" in f.metadata}
    values = {}
    for mapping, where, shared in ((top, f"config file {path}", True),
                                   (section, f"config file {path}, section '{script}'", False)):
        for key, value in flat_items(mapping, KEY_SECTIONS):
            field = fields.get(key) or by_key.get(key)
            if field is None:
                if shared and (key in FLAG_NAMES or key in NESTED_KEYS):
                    continue  # an option of another script in a shared recipe file
                _unknown(key, list(fields) + (list(by_key) if "." in key else []), where)
            values[field.name] = coerce(key, field, value, f"config file {path}")
    return values


def _unknown(key, names, where):
    near = difflib.get_close_matches(str(key), names, n=3)
    hint = f"; did you mean {' or '.join(near)}?" if near else "; see --help for the options"
    raise UserError(f"{where}: unknown option '{key}'{hint}")


def parse_flags(groups, argv=None, prog=None, description=None, config_file_help=CONFIG_FILE_HELP):
    """The command line alone: ({option: value} of the flags given, the --config_file paths, not read)."""
    parser = _build_parser(groups, prog or os.path.basename(sys.argv[0]), description, config_file_help)
    flags = vars(parser.parse_args(sys.argv[1:] if argv is None else argv))
    secrets.protect_command_line()
    return flags, flags.pop("config_file")


def parse_args(*groups, argv=None, prog=None, description=None):
    """Parse flags and --config_file yaml into one instance per option dataclass, in order. The options of the
    groups that the script (prog) does not read (options.LEFT_OUT) are not listed in --help and keep their defaults;
    given on the command line (an old Hugging Face command), one line says they are ignored."""
    prog = prog or os.path.basename(sys.argv[0])
    flags, config_files = parse_flags(groups, argv, prog, description)
    fields = {f.name: f for f in script_fields(groups, os.path.basename(prog))}
    ignored = [name for name in flags if name not in fields]
    if ignored:
        print(f"note: {prog} does not use {', '.join('--' + n for n in ignored)} (taken for Hugging Face's command "
              f"lines, ignored)", flush=True)
        flags = {name: value for name, value in flags.items() if name in fields}
    values = {}
    for path in config_files:
        values.update(_recipe_options(path, fields, os.path.splitext(prog)[0]))
    values.update(flags)
    secrets.remember(*(value for name, value in values.items() if secrets.is_secret(name)))
    secrets.protect_command_line()  # the values just read, masked in sys.argv for the libraries that record it
    for name, value in values.items():
        for item in value if isinstance(value, list) else [value]:
            check_range(name, item, fields[name].metadata.get("minimum"))
    parsed = tuple(_instance(group, values) for group in groups)
    _PARSED[:] = parsed
    _PROG[:] = [prog]
    return parsed


_PARSED, _PROG = [], []  # this process's latest parse_args: the run whose options the trackers and card record


def parsed_prog():
    """The script of this process's latest parse_args (run_mlm_flax.py)."""
    return _PROG[0] if _PROG else os.path.basename(sys.argv[0])


def parsed_options():
    """{option: value} of this process's latest parse_args (the script now running), secrets (tokens) and the
    options the script does not read left out."""
    read = {f.name for f in script_fields([type(group) for group in _PARSED], parsed_prog())}
    out = {}
    for group in _PARSED:
        for f in dataclasses.fields(group):
            if f.name in read and not secrets.is_secret(f.name):
                out.setdefault(f.name, getattr(group, f.name))
    return out


def _instance(group, values):
    """The group filled from values; a missing option without a default, or one of the group's
    required_options without a value, is an error."""
    kwargs = {f.name: values[f.name] for f in dataclasses.fields(group) if f.name in values}
    for f in dataclasses.fields(group):  # a required option that another option's value makes optional
        if f.name not in kwargs and values.get(f.metadata.get("unless")):
            kwargs[f.name] = None
    needed = getattr(group, "required_options", ())
    missing = [f.name for f in dataclasses.fields(group)
               if (f.name not in kwargs and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING) or (f.name in needed and kwargs.get(f.name) is None)]
    if missing:
        raise UserError(f"missing required option --{missing[0]} (give it as a flag or in a --config_file)")
    return group(**kwargs)
