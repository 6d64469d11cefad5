"""Hugging Face checkpoint files: safetensors (one file or shards listed in an index), PyTorch pickle checkpoints
read only through torch's safe loader, config.json, and the hub download. About files only: how a model's tensors
are named is its family's name map (flaxlm.models.family), the conversion is flaxlm.models.convert.

torch.load(weights_only=True) rebuilds tensors and plain containers only: a file that would run code on loading is
refused. Without torch installed the user gets the one-line way to convert to safetensors.
"""
import json
import os
import tempfile

from flaxlm.errors import UserError

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
CONVERT_HINT = ("convert it to safetensors where torch is installed: python -c \"import transformers as t; "
                "t.AutoModel.from_pretrained('DIR').save_pretrained('DIR', safe_serialization=True)\" "
                "(AutoModelForCausalLM / AutoModelForMaskedLM / T5ForConditionalGeneration for the model's task)")


def _looks_local(path):
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1


def resolve_dir(path, allow_patterns=("config.json", "*.safetensors", "*.json")):
    """A local directory for `path`: itself if local, else a snapshot downloaded from the hub."""
    path = os.fspath(path)
    if os.path.isdir(os.path.expanduser(path)):
        return os.path.expanduser(path)
    if os.path.exists(path):
        raise UserError(f"{path} is a file; pass the model directory holding config.json")
    if _looks_local(path):
        raise UserError(f"directory {path} does not exist; pass a model directory holding config.json")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(path, allow_patterns=list(allow_patterns))
    except Exception as e:  # network, auth, offline mode, unknown repo
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"could not download {path} from the hub ({type(e).__name__}: {reason}); download it "
                        f"beforehand and pass the local directory") from None


def _model_type_of(architectures):
    """The model_type of the pretraining class config.json's architectures name (None if none does), for a
    config.json without model_type."""
    from transformers.models.auto import modeling_auto as auto
    names = {**auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, **auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
             **auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES}
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    return next((model_type for model_type, cls in names.items() if cls == arch), None)


def load_config(path):
    """The transformers config in directory `path` (or a hub name); UserError if absent or invalid."""
    from transformers import AutoConfig

    path = resolve_dir(path, allow_patterns=("config.json",))
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise UserError(f"no config.json in {path}; pass a model directory (create one with create_config.py)")
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON (the message says where)
        raise UserError(f"invalid config.json in {path}: not JSON ({e}); fix it or write a new one with "
                        f"create_config.py") from None
    if not isinstance(data, dict):
        raise UserError(f"invalid config.json in {path}: a JSON {type(data).__name__}, not an object of config "
                        f"keys; fix it or write a new one with create_config.py")
    try:  # flaxlm runs its own model code only: a config's custom (hub) code is never needed, nor run
        model_type = data.get("model_type") or _model_type_of(data.get("architectures"))
        if model_type and "model_type" not in data:  # google/umt5-*: architectures only
            from transformers import CONFIG_MAPPING
            return CONFIG_MAPPING[model_type].from_pretrained(path, local_files_only=True)
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # no or unknown model_type, a value of the wrong type: transformers' own errors
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        raise UserError(f"invalid config.json in {path} ({reason}); fix or regenerate it") from None


def has_pickle_checkpoint(path):
    return any(os.path.isfile(os.path.join(path, f)) for f in (PICKLE_WEIGHTS, PICKLE_INDEX))


def has_weights(path):
    return any(os.path.isfile(os.path.join(path, f)) for f in (SAFE_WEIGHTS, SAFE_INDEX)) or has_pickle_checkpoint(path)


def _read_checkpoint(path, single, index, fix_index, read):
    """{name: array} of a checkpoint in `path`: the file `single`, or every shard its `index` file lists, each
    read by read(file) -> {name: array}. fix_index: what the user should do when the index is unreadable."""
    index_file = os.path.join(path, index)
    files = [single]
    if os.path.isfile(index_file):
        try:
            with open(index_file) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise UserError(f"invalid {index_file} ({e}); {fix_index}") from None
    tensors = {}
    for name in files:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise UserError(f"shard {file} listed in {index} is missing; download the whole model again")
        tensors.update(read(file))
    return tensors


def _read_safetensors_file(file):
    from safetensors import safe_open

    try:
        with safe_open(file, framework="np") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {file} ({e}); the file is damaged, download or export it again") from None
    except Exception as e:  # safetensors raises its own SafetensorError for corrupt headers
        raise UserError(f"cannot read {file} ({type(e).__name__}: {e}); the file is damaged, download or "
                        f"export it again") from None


def read_safetensors(path):
    """{name: numpy array} from model.safetensors or the shards listed in model.safetensors.index.json
    (else from a pytorch_model.bin, read safely by torch when it is installed)."""
    if not any(os.path.isfile(os.path.join(path, f)) for f in (SAFE_WEIGHTS, SAFE_INDEX)):
        if has_pickle_checkpoint(path):
            return read_pickle_checkpoint(path)  # through torch.load(weights_only=True) only
        raise UserError(f"no {SAFE_WEIGHTS} in {path}; pass a directory written by save_pretrained")
    return _read_checkpoint(path, SAFE_WEIGHTS, SAFE_INDEX, "re-save the model", _read_safetensors_file)


def read_pickle_checkpoint(path):
    """{name: numpy array} from pytorch_model.bin or the shards of pytorch_model.bin.index.json in `path`."""
    try:
        import torch
    except ImportError:
        raise UserError(f"{path} holds only a PyTorch pickle checkpoint (pytorch_model.bin) and torch is not "
                        f"installed to read it safely; pip install torch, or {CONVERT_HINT}") from None

    def read(file):
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as e:  # an unsafe pickle (refused), a damaged file
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"cannot read {file} with torch.load(weights_only=True) ({first[:200]}); only plain "
                            f"weight files are read, never arbitrary pickles: {CONVERT_HINT}") from None
        return {k: (v.float() if v.dtype in (torch.bfloat16, torch.float16) else v).numpy()
                for k, v in state.items() if isinstance(v, torch.Tensor)}
    return _read_checkpoint(path, PICKLE_WEIGHTS, PICKLE_INDEX, "download the model again", read)


def _atomic_write(path, write):
    """Call write(tmp_path) then move the file into place, so a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_safetensors(output_dir, tensors):
    """{name: numpy array} as output_dir/model.safetensors, with the metadata transformers writes."""
    from safetensors.numpy import save_file

    os.makedirs(output_dir, exist_ok=True)
    _atomic_write(os.path.join(output_dir, SAFE_WEIGHTS), lambda p: save_file(tensors, p, metadata={"format": "pt"}))


def write_config(output_dir, config):
    """A transformers config as output_dir/config.json (the values that differ from its class's defaults)."""
    os.makedirs(output_dir, exist_ok=True)
    _atomic_write(os.path.join(output_dir, "config.json"), lambda p: config.to_json_file(p, use_diff=True))
