"""Experiment configs for train.py: the options of flaxlm/config/options.py arranged into nested, typed sections.

Each option declares its key: task.model.dtype is --dtype, and a few keys take TensorFlow Model Garden's names
(task.train_data.input_path is --train_file, trainer.train_steps is --max_steps). The leaves ARE the options'
fields (same type, default, help; nothing is declared twice): config_class() builds one experiment's nested
dataclasses from the fields of its script's option groups, in their declaration order. resolve() layers config
files (flaxlm.config.cli's reader: flag names, nested or dotted keys, the section of the experiment's script)
and --params_override (keys only) onto the defaults with the checks the scripts' own flags get, options_of()
flattens the result back into {option: value} and to_argv() into the script's command line.
"""
import dataclasses
import difflib
import types
import typing

import yaml

from flaxlm import secrets
from flaxlm.config.cli import FLAG_NAMES, check_range, coerce, flat_items, read_recipe
from flaxlm.config.options import ConfigArgs, declared_fields
from flaxlm.errors import UserError

def _option_of_key():
    """{key: option name} of every option with a key; two options with one key are an error in options.py."""
    out = {}
    for f in declared_fields():
        if "key" in f.metadata:
            if out.setdefault(f.metadata["key"], f.name) != f.name:
                raise ValueError(f"key {f.metadata['key']} belongs to --{out[f.metadata['key']]} and --{f.name}")
    return out


OPTION_OF_KEY = _option_of_key()
# Options train.py sets itself from its own flags ({option: flag}); they have no key.
DRIVER_SET = {f.name: f.metadata["set_by"] for f in declared_fields() if "set_by" in f.metadata}
# create_config.py's options that train.py consumes itself (the architecture of a model pretrained from scratch);
# they never go to the script.
DRIVER_READ = tuple(f.name for f in dataclasses.fields(ConfigArgs) if "key" in f.metadata)


def config_class(name, option_fields, defaults=None):
    """The nested dataclass of one experiment: option_fields (dataclass fields of its options; those train.py sets
    itself are left out) placed at their keys, sections and leaves in the order the options are declared (a section
    where its first option is); defaults ({dotted key: value}) replace the
    options' defaults."""
    defaults = dict(defaults or {})
    tree = {}  # nested {name: subtree or leaf field}, in declaration order
    for f in option_fields:
        if "set_by" in f.metadata:
            continue
        if "key" not in f.metadata:  # a new option in flaxlm/config/options.py needs its key
            raise ValueError(f"option --{f.name} has no key in train.py's config")
        key = f.metadata["key"]
        *parents, leaf = key.split(".")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = _leaf_field(key, f, defaults.pop(key, dataclasses.MISSING))
    if defaults:
        raise ValueError(f"defaults for keys {name} does not have: {sorted(defaults)}")
    return _make_class(name.replace("/", "_") + "_config", tree)


def _leaf_field(key, f, default):
    if default is dataclasses.MISSING:
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
    else:
        default = _checked(key, f, default, "experiment defaults")
    if default is dataclasses.MISSING:
        raise ValueError(f"--{f.name} has no default; train.py must set it (set_by)")
    meta = {**f.metadata, "option": f.name}
    if isinstance(default, list):
        return f.type, dataclasses.field(default_factory=lambda d=default: list(d), metadata=meta)
    return f.type, dataclasses.field(default=default, metadata=meta)


def _make_class(name, tree):
    """The dataclass of one section: its leaves, then its subsections."""
    fields = []
    for key, node in sorted(tree.items(), key=lambda item: isinstance(item[1], dict)):
        if isinstance(node, dict):
            section = _make_class(f"{name}_{key}", node)
            fields.append((key, section, dataclasses.field(default_factory=section)))
        else:
            fields.append((key, *node))
    return dataclasses.make_dataclass("".join(p.title() for p in name.replace("-", "_").split("_")), fields)


def leaves(cls, prefix=""):
    """{dotted key: field} of every leaf of a config class."""
    out = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type):
            out.update(leaves(f.type, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = f
    return out


def sections(cls, prefix=""):
    """The dotted keys of the sections of a config class."""
    out = set()
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type):
            out |= {prefix + f.name} | sections(f.type, f"{prefix}{f.name}.")
    return out


def resolve(cls, config_files=(), overrides=(), script=None):
    """An instance of cls: its defaults, then each config file in order (with the section of `script`, the
    experiment's), then each override in order."""
    config = cls()
    for path in config_files:
        top, section = read_recipe(path, script, "a nested mapping of keys (task:, trainer:, ...)")
        for mapping in (top, section):
            apply(config, _keyed(cls, mapping), f"config file {path}")
    for text in overrides:
        apply(config, parse_override(text), "--params_override")
    return config


def _keyed(cls, mapping):
    """A config file's mapping with each flag name (a flat recipe's learning_rate) as its key in cls; the options of
    other scripts, and those train.py sets itself, are left out (a recipe shared with other scripts)."""
    key_of = {f.metadata["option"]: key for key, f in leaves(cls).items()}
    out = {}
    for name, value in mapping.items():
        if name in key_of:
            out[key_of[name]] = value
        elif name not in FLAG_NAMES:  # a nested or dotted key (or an unknown one: apply says so)
            out[name] = value
    return out


def apply(config, mapping, source):
    """Set the values of a nested mapping (keys may be dotted) on config, each checked."""
    cls = type(config)
    known_leaves, known_sections = leaves(cls), sections(cls)
    for path, value in flat_items(mapping, known_sections):
        if path in known_sections:
            if value is not None:
                raise UserError(f"{source}: '{path}' is a section; give it a mapping of its keys, not {value!r}")
        elif path in known_leaves:
            value = _checked(path, known_leaves[path], value, source)
            *parents, leaf = path.split(".")
            target = config
            for p in parents:
                target = getattr(target, p)
            setattr(target, leaf, value)
        else:
            _unknown(path, known_leaves, known_sections, source)


def _checked(key, f, value, source):
    """value as the field's type, within the option's range (flaxlm.config.cli's checks, naming the dotted key)."""
    value = coerce(key, f, value, source)
    option = f.metadata.get("option", f.name)
    if value is None and option not in DRIVER_READ and not _optional(f.type):
        raise UserError(f"{source}: '{key}' (--{option}) cannot be null; give it a value")
    for item in value if isinstance(value, list) else [value]:
        try:
            check_range(option, item, f.metadata.get("minimum"))
        except UserError as e:
            raise UserError(f"{source}: '{key}': {e}") from None
    return value


def _optional(tp):
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _unknown(path, known_leaves, known_sections, source):
    if path in OPTION_OF_KEY:
        raise UserError(f"{source}: '{path}' (--{OPTION_OF_KEY[path]}) does not apply to this experiment; drop it")
    last = path.rsplit(".", 1)[-1]
    names = {k: {k.rsplit(".", 1)[-1], f.metadata["option"]} for k, f in known_leaves.items()}
    same_name = [k for k, n in names.items() if last in n]  # a leaf or an option name under another section
    near_name = [k for k, n in names.items() if difflib.get_close_matches(last, list(n), n=1, cutoff=0.8)]
    near_path = difflib.get_close_matches(path, list(known_leaves) + sorted(known_sections), n=3)
    near = same_name or list(dict.fromkeys(near_path + near_name))[:3]
    hint = f"; did you mean {' or '.join(near)}?" if near else "; the keys are those of train.py --print_config"
    raise UserError(f"{source}: unknown key '{path}'{hint}")


def parse_override(text):
    """'a.b=1,c.d=x' (values as on a command line; [..] and quoted ones read as yaml) or a yaml/json mapping
    string -> {key: value}."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict) and not any("=" in str(k) for k in data):
        return data
    out = {}
    for item in _split_top_level(text):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--params_override expects key=value[,key=value...] or a yaml mapping, got '{item}'")
        out[key.strip()] = _override_value(key.strip(), raw.strip())
    return out


def _override_value(key, raw):
    if raw in ("null", "~"):
        return None
    if raw[:1] in ("[", "{", '"', "'"):
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError:
            raise UserError(f"--params_override: the value of '{key}' is not valid yaml: "
                            f"{secrets.MASK if secrets.is_secret(key) else raw}") from None
    return raw


def _split_top_level(text):
    """Split on the commas outside brackets and quotes."""
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def options_of(config):
    """{option name: value} of every leaf of a config instance."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(f.type):
            out.update(options_of(value))
        else:
            out[f.metadata["option"]] = value
    return out


def to_argv(groups, options):
    """The command line of a script taking `groups` for {option: value}: `--name=value` for each value that
    differs from its declared default (lists: one flag per item)."""
    argv = []
    for group in groups:
        for f in dataclasses.fields(group):
            if f.name not in options:
                continue
            value = options[f.name]
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            if value == default or value is None:
                continue
            for item in value if isinstance(value, list) else [value]:
                argv.append(f"--{f.name}={str(item).lower() if isinstance(item, bool) else item}")
    return argv


def to_yaml(config, indent=0):
    """The config as nested yaml, each leaf commented with the flag it is."""
    lines = []
    for f in dataclasses.fields(config):
        value, pad = getattr(config, f.name), "  " * indent
        if dataclasses.is_dataclass(f.type):
            lines.append(f"{pad}{f.name}:")
            lines.append(to_yaml(value, indent + 1))
        else:
            option = f.metadata["option"]
            flag = f"create_config.py --{option}" if option in DRIVER_READ else f"--{option}"
            if secrets.is_secret(option) and value is not None:  # a token must not sit in model_dir (flaxlm.secrets)
                value, flag = None, f"{flag} (given, not written: a secret)"
            text = yaml.safe_dump([value], default_flow_style=True, width=float("inf")).strip()[1:-1]
            lines.append(f"{pad}{f.name}: {text}  # {flag}")
    return "\n".join(lines)

