"""Loading a tokenizer for training, and the checks that it fits the model config."""
import os

from flaxlm.errors import UserError

# files a tokenizer may have in a model directory (other files there, such as config.json, are not ours)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt",
                   "special_tokens_map.json", "added_tokens.json", "spiece.model", "tokenizer.model",
                   "sentencepiece.bpe.model")


def has_tokenizer(path):
    """Whether directory `path` holds tokenizer files (AutoTokenizer would otherwise build an empty one from a
    bare config.json instead of failing)."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES)


def _looks_like_a_path(name):
    """A local path rather than a hub name ('org/model' has one slash and no leading . ~ or /)."""
    return os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1


def load_tokenizer(name, token=None, local_only=False, trust_remote_code=False):
    """AutoTokenizer from a local directory (or a hub name when online), with a one-line error.

    Code shipped with a hub tokenizer runs only with trust_remote_code (--trust_remote_code); it is passed
    explicitly, so transformers never asks on the terminal either."""
    if not name:
        raise UserError("no tokenizer given; pass --tokenizer_name DIR (train one with train_tokenizer.py) "
                        "or --model_name_or_path")
    name = os.path.expanduser(name)
    if os.path.isdir(name):
        if not has_tokenizer(name):
            raise UserError(f"no tokenizer in directory {name} (none of {', '.join(TOKENIZER_FILES[:3])}, ...); "
                            f"train one with train_tokenizer.py --output_dir {name}, or pass --tokenizer_name DIR")
    elif os.path.exists(name):
        raise UserError(f"tokenizer {name} is a file; pass the directory that holds the tokenizer's files")
    elif local_only or _looks_like_a_path(name):
        raise UserError(f"tokenizer directory {name} does not exist; check the path, or train a tokenizer there "
                        f"with train_tokenizer.py --output_dir {name}")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name, token=token, local_files_only=local_only,
                                             trust_remote_code=trust_remote_code)
    except Exception as e:  # broken or foreign tokenizer files; no network or no such repo for a hub name
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if os.path.isdir(name):
            raise UserError(f"could not load the tokenizer in directory {name} ({first}); fix or re-create it "
                            f"with train_tokenizer.py --output_dir {name} --overwrite_output_dir") from None
        raise UserError(f"could not load tokenizer {name} from the hub ({first}); check the name and your "
                        f"network, or pass a local --tokenizer_name DIR") from None


def check_fits(tokenizer, config):
    if len(tokenizer) > config.vocab_size:
        raise UserError(f"the tokenizer has {len(tokenizer)} tokens but the model config's vocab_size is "
                        f"{config.vocab_size}; rewrite the config with create_config.py (it reads vocab_size "
                        f"from the tokenizer) or use the matching tokenizer")
