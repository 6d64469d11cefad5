"""Hugging Face checkpoint files: safetensors (one file or shards listed in an index), PyTorch pickle checkpoints
read only through torch's safe loader, config.json, and the hub download. About files only: how a model's tensors
are named is its family's name map (flaxlm.models.family), the conversion is flaxlm.models.convert.

torch.load(weights_only=True) rebuilds tensors and plain containers only: a file that would run code on loading is
refused. Without torch installed the user gets the one-line way to convert to safetensors.

A safetensors checkpoint is opened lazily (lazy_checkpoint): each tensor is a LazyTensor that knows its shape and
dtype from the file's header and reads its bytes when asked; so a checkpoint of billions of parameters goes tensor
by tensor to where it belongs, in its own dtype (bfloat16 stays bfloat16), and the host never holds a copy of the
whole model.
"""
import json
import math
import os
import tempfile

import numpy as np

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


def _checkpoint_files(path, single, index, fix_index):
    """The files of a checkpoint in `path`: [single], or every shard its `index` file lists (all checked to exist
    before anything is read). fix_index: what the user should do when the index is unreadable."""
    index_file = os.path.join(path, index)
    files = [single]
    if os.path.isfile(index_file):
        try:
            with open(index_file) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
            raise UserError(f"invalid {index_file} ({e}); {fix_index}") from None
    for name in files:
        if not os.path.isfile(os.path.join(path, name)):
            raise UserError(f"shard {os.path.join(path, name)} listed in {index} is missing; download the whole "
                            f"model again")
    return [os.path.join(path, name) for name in files]


def _read_checkpoint(path, single, index, fix_index, read):
    """{name: array} of every file of a checkpoint, each read by read(file) -> {name: array}."""
    tensors = {}
    for file in _checkpoint_files(path, single, index, fix_index):
        tensors.update(read(file))
    return tensors


SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _damaged(file, e):
    return UserError(f"cannot read {file} ({type(e).__name__}: {e}); the file is damaged, download or export it "
                     f"again")


class LazyTensor:
    """One tensor of a safetensors file, read when used: np.asarray(t) reads exactly its bytes (into memory of
    its own, in the file's dtype: bfloat16 as ml_dtypes' bfloat16). The file is not memory-mapped: a mapping
    keeps every page it touched resident while it is open, a read buffer is freed with the array."""

    def __init__(self, file, name, shape, dtype, offset):
        self.file, self.name, self.shape, self.offset = file, name, tuple(shape), offset
        self.dtype = np.dtype(_numpy_dtype(dtype)).newbyteorder("<")  # safetensors is little-endian
        self.ndim = len(self.shape)
        self.size = math.prod(self.shape)
        self.nbytes = self.size * self.dtype.itemsize

    def __array__(self, dtype=None, copy=None):
        try:
            x = np.fromfile(self.file, dtype=self.dtype, count=self.size, offset=self.offset)
        except (OSError, ValueError) as e:
            raise _damaged(self.file, e) from None
        if x.size != self.size:
            raise _damaged(self.file, EOFError(f"tensor {self.name} is cut short"))
        x = x.reshape(self.shape)
        return x if dtype is None else x.astype(dtype)

    def __getitem__(self, index):
        return np.asarray(self)[index]

    def __getattr__(self, name):  # any other array attribute or method (T, reshape, astype): of the whole tensor
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(np.asarray(self), name)


def _numpy_dtype(name):
    if name not in SAFETENSORS_DTYPES:
        raise UserError(f"unsupported tensor dtype {name} in a safetensors file; save the model in float32, float16 "
                        f"or bfloat16")
    if name == "BF16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return SAFETENSORS_DTYPES[name]


def _lazy_file(file):
    """{name: LazyTensor} of one safetensors file, from its header: 8 bytes of header length (little-endian),
    then a JSON object {name: {dtype, shape, data_offsets: [begin, end]} relative to the header's end}."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= os.path.getsize(file) - 8:
                raise ValueError(f"header length {size} does not fit the file")
            header = json.loads(f.read(size))
        tensors = {}
        for name, meta in header.items():
            if name != "__metadata__":
                tensors[name] = LazyTensor(file, name, meta["shape"], meta["dtype"], 8 + size + meta["data_offsets"][0])
                if meta["data_offsets"][1] - meta["data_offsets"][0] != tensors[name].nbytes:
                    raise ValueError(f"tensor {name}'s bytes do not match its shape and dtype")
        return tensors
    except UserError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _damaged(file, e) from None


def checkpoint_files(path):
    """The weight files of the checkpoint in directory `path` ([] if it has none), each shard its index lists
    checked to exist (UserError naming a missing one)."""
    if os.path.isfile(os.path.join(path, SAFE_INDEX)) or os.path.isfile(os.path.join(path, SAFE_WEIGHTS)):
        return _checkpoint_files(path, SAFE_WEIGHTS, SAFE_INDEX, "re-save the model")
    if has_pickle_checkpoint(path):
        return _checkpoint_files(path, PICKLE_WEIGHTS, PICKLE_INDEX, "download the model again")
    return []


def lazy_checkpoint(path):
    """{name: LazyTensor} of model.safetensors or of every shard listed in model.safetensors.index.json (each shard
    checked to exist first), nothing read but the headers; a PyTorch pickle checkpoint is read whole instead
    (through torch.load(weights_only=True) only)."""
    if not any(os.path.isfile(os.path.join(path, f)) for f in (SAFE_WEIGHTS, SAFE_INDEX)):
        if has_pickle_checkpoint(path):
            return read_pickle_checkpoint(path)
        raise UserError(f"no {SAFE_WEIGHTS} in {path}; pass a directory written by save_pretrained")
    return _read_checkpoint(path, SAFE_WEIGHTS, SAFE_INDEX, "re-save the model", _lazy_file)


def read_safetensors(path):
    """{name: numpy array} from model.safetensors or the shards listed in model.safetensors.index.json
    (else from a pytorch_model.bin, read safely by torch when it is installed); bfloat16 stays bfloat16."""
    return {k: np.asarray(v) for k, v in lazy_checkpoint(path).items()}


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


MAX_SHARD_BYTES = 5 * 10 ** 9  # transformers' default max_shard_size ("5GB")


def write_safetensors(output_dir, tensors, max_shard_bytes=MAX_SHARD_BYTES):
    """{name: numpy array} as output_dir/model.safetensors with the metadata transformers writes; a model larger
    than max_shard_bytes as shards model-0000i-of-0000n.safetensors listed in model.safetensors.index.json, as
    transformers' save_pretrained writes them. Weight files of an earlier export in output_dir are replaced."""
    from safetensors.numpy import save_file

    os.makedirs(output_dir, exist_ok=True)
    shards, size = [{}], 0
    for name, x in tensors.items():
        if shards[-1] and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    names = [SAFE_WEIGHTS] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    _remove_old_weights(output_dir, keep=names)
    for name, shard in zip(names, shards):
        _atomic_write(os.path.join(output_dir, name), lambda p, t=shard: save_file(t, p, metadata={"format": "pt"}))
    if len(shards) > 1:
        index = {"metadata": {"total_size": int(sum(x.nbytes for x in tensors.values()))},
                 "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
        _atomic_write(os.path.join(output_dir, SAFE_INDEX),
                      lambda p: open(p, "w").write(json.dumps(index, indent=2, sort_keys=True) + "\n"))


def _remove_old_weights(output_dir, keep):
    """An earlier export's weight files (single or sharded) that the new one does not overwrite."""
    import re
    for name in os.listdir(output_dir):
        if name not in keep and (name == SAFE_WEIGHTS or name == SAFE_INDEX or
                                 re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", name)):
            os.remove(os.path.join(output_dir, name))


def write_config(output_dir, config):
    """A transformers config as output_dir/config.json (the values that differ from its class's defaults)."""
    os.makedirs(output_dir, exist_ok=True)
    _atomic_write(os.path.join(output_dir, "config.json"), lambda p: config.to_json_file(p, use_diff=True))
