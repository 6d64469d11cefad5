"""PyTorch pickle checkpoints (pytorch_model.bin, sharded or not), read only through torch's safe loader.

torch.load(weights_only=True) rebuilds tensors and plain containers only: a file that would run code on
loading is refused. Without torch installed the user gets the one-line way to convert to safetensors.
"""
import json
import os

from flaxlm.errors import UserError

PICKLE_WEIGHTS = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
CONVERT_HINT = ("convert it to safetensors where torch is installed: python -c \"import transformers as t; "
                "t.AutoModel.from_pretrained('DIR').save_pretrained('DIR', safe_serialization=True)\" "
                "(AutoModelForCausalLM / AutoModelForMaskedLM / T5ForConditionalGeneration for the model's task)")


def has_pickle_checkpoint(path):
    return any(os.path.isfile(os.path.join(path, f)) for f in (PICKLE_WEIGHTS, PICKLE_INDEX))


def read_pickle_checkpoint(path):
    """{name: numpy array} from pytorch_model.bin or the shards of pytorch_model.bin.index.json in `path`."""
    try:
        import torch
    except ImportError:
        raise UserError(f"{path} holds only a PyTorch pickle checkpoint (pytorch_model.bin) and torch is not "
                        f"installed to read it safely; pip install torch, or {CONVERT_HINT}") from None
    index = os.path.join(path, PICKLE_INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise UserError(f"invalid {index} ({e}); download the model again") from None
    else:
        files = [PICKLE_WEIGHTS]
    tensors = {}
    for name in files:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise UserError(f"shard {file} listed in {PICKLE_INDEX} is missing; download the whole model again")
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as e:  # an unsafe pickle (refused), a damaged file
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"cannot read {file} with torch.load(weights_only=True) ({first[:200]}); only plain "
                            f"weight files are read, never arbitrary pickles: {CONVERT_HINT}") from None
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                tensors[k] = (v.float() if v.dtype in (torch.bfloat16, torch.float16) else v).numpy()
    return tensors
