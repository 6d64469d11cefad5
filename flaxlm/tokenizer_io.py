"""Loading a tokenizer for training, and the checks that it fits the model config."""
import os

from flaxlm.errors import UserError


def load_tokenizer(name, token=None, local_only=False):
    """AutoTokenizer from a local directory (or a hub name when online), with a one-line error."""
    if not name:
        raise UserError("no tokenizer given; pass --tokenizer_name DIR (train one with train_tokenizer.py) "
                        "or --model_name_or_path")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name, token=token, local_files_only=local_only)
    except Exception as e:  # missing, broken or foreign tokenizer files; no network for a hub name
        where = "directory" if os.path.isdir(name) else "name"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"could not load a tokenizer from {where} {name} ({first}); "
                        f"train one with train_tokenizer.py --output_dir {name}") from None


def check_fits(tokenizer, config):
    if len(tokenizer) > config.vocab_size:
        raise UserError(f"the tokenizer has {len(tokenizer)} tokens but the model config's vocab_size is "
                        f"{config.vocab_size}; rewrite the config with create_config.py (it reads vocab_size "
                        f"from the tokenizer) or use the matching tokenizer")
