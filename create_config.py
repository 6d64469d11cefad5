"""Write a model's config.json from a shape preset, sized to the tokenizer in the model directory.

    python create_config.py --output_dir runs/my-roberta --preset roberta-base
    python create_config.py --output_dir runs/tiny --preset roberta-tiny --set num_hidden_layers=4
    python create_config.py --output_dir runs/x --list_presets

The tokenizer (from train_tokenizer.py) gives vocab_size and the pad/bos/eos ids. Nothing is downloaded.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import ConfigArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402
from flaxlm.models import count_config_params, save_config  # noqa: E402
from flaxlm.files import check_writable_dir  # noqa: E402
from flaxlm.tokenization.loading import has_tokenizer, load_tokenizer  # noqa: E402
from flaxlm.models.presets import PRESETS, build_config, get_preset, human, parse_overrides  # noqa: E402


def size(config):
    """'125M': the parameters of the model `config` describes (built abstractly, nothing allocated); '?' when
    config.json describes no model flaxlm can build."""
    try:
        return human(count_config_params(config))
    except UserError:
        return "?"


def list_presets():
    for name in PRESETS:
        config = build_config(name)
        decoder = getattr(config, "num_decoder_layers", None)
        layers = f"{config.num_hidden_layers}+{decoder}" if decoder else f"{config.num_hidden_layers}"
        print(f"{name:20s} {config.model_type:10s} {size(config):>6s} params  "
              f"hidden {config.hidden_size}, layers {layers}, "
              f"heads {config.num_attention_heads}, vocab {config.vocab_size}")


def find_tokenizer(path, explicit, overrides):
    """The tokenizer saved at path; None when there is none and vocab_size is given by --set."""
    if not has_tokenizer(path):
        if not explicit and "vocab_size" in overrides:
            return None
        if explicit:
            raise UserError(f"no tokenizer found in --tokenizer_name {path}; pass a directory saved by "
                            f"train_tokenizer.py")
        raise UserError(f"no tokenizer found in {path}; run train_tokenizer.py --output_dir {path} first, "
                        f"pass --tokenizer_name DIR, or give --set vocab_size=N to go without one")
    return load_tokenizer(path, local_only=True)


def main(argv=None):
    (args,) = parse_args(ConfigArgs, argv=argv, prog="create_config.py", description=__doc__.splitlines()[0])
    if args.list_presets:
        list_presets()
        return
    if not args.output_dir:
        raise UserError("missing required option --output_dir (give it as a flag or in a --config_file)")
    check_writable_dir(args.output_dir)
    get_preset(args.preset)  # fail fast on a bad name
    overrides = parse_overrides(args.set)
    config_path = os.path.join(args.output_dir, "config.json")
    if os.path.exists(config_path) and not args.overwrite_output_dir:
        raise UserError(f"{config_path} already exists; pass --overwrite_output_dir to replace it")

    tokenizer = find_tokenizer(args.tokenizer_name or args.output_dir, args.tokenizer_name is not None, overrides)
    config = build_config(args.preset, tokenizer, overrides)
    save_config(args.output_dir, config)
    source = "tokenizer" if tokenizer is not None else "--set"
    print(f"wrote {config_path}: preset {args.preset} ({config.model_type}, {size(config)} params), "
          f"vocab_size {config.vocab_size} from {source}")


if __name__ == "__main__":
    run_main(main)
