"""Peak host memory and time of loading a sharded safetensors checkpoint, on a synthetic Llama-shaped model.

    python bench/load_checkpoint.py --make /tmp/ckpt --hidden 2048 --layers 16 --vocab 32000   # ~1B, bfloat16
    python bench/load_checkpoint.py --load /tmp/ckpt                      # flaxlm's loader, float32 master weights
    python bench/load_checkpoint.py --load /tmp/ckpt --eager              # read everything, then convert (control)
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/load_checkpoint.py --load /tmp/ckpt --sharding fsdp

--make writes random bfloat16 tensors under the names transformers gives LlamaForCausalLM, in shards of
--shard_mb with model.safetensors.index.json (nothing but numpy: no model is built). --load measures, in this
process, the growth of resident memory from just before loading to its peak during loading (Linux: the peak is
reset through /proc/self/clear_refs, then read as VmHWM), and prints it beside the bytes the loaded parameters
take on the devices (on CPU they are host memory) and the largest shard. Prints one JSON line.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def llama_config(hidden, layers, vocab):
    import transformers
    heads = max(1, hidden // 64)
    return transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=heads,
                                    intermediate_size=hidden * 8 // 3 // 64 * 64, tie_word_embeddings=False)


def make(out, hidden, layers, vocab, shard_mb):
    """A synthetic bfloat16 checkpoint of a Llama of that shape in shards of about shard_mb."""
    import ml_dtypes
    from flaxlm.models import abstract_model, llama
    from flaxlm.models.hf_io import write_safetensors, write_config
    config = llama_config(hidden, layers, vocab)
    _, shapes = abstract_model(config)
    rng = np.random.default_rng(0)
    tensors = {}
    for hf, path, kind in llama.tensor_names(config):
        shape = shapes
        for k in path:
            shape = shape[k]
        shape = shape.shape[::-1] if kind == "linear" else shape.shape
        tensors[hf] = (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
    write_safetensors(out, tensors, max_shard_bytes=shard_mb * 2 ** 20)
    config.dtype = "bfloat16"
    write_config(out, config)
    n = sum(x.size for x in tensors.values())
    print(json.dumps({"made": out, "params": int(n), "bytes": int(sum(x.nbytes for x in tensors.values()))}))


def resident_bytes(field="VmRSS"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak():
    """Set VmHWM (peak resident memory) to the current resident memory (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def load(path, sharding, param_dtype, eager):
    import jax
    import jax.numpy as jnp
    from flaxlm.models import load_pretrained
    from flaxlm.models.hf_io import lazy_checkpoint
    from flaxlm.training.mesh import make_mesh
    from flaxlm.training.sharding import state_shardings

    shards = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    largest = max(os.path.getsize(os.path.join(path, f)) for f in shards)
    checkpoint_bytes = sum(x.nbytes for x in lazy_checkpoint(path).values())
    from flaxlm.models.hf_io import load_config
    from flaxlm.models.convert import _cast
    mesh = make_mesh()
    load_config(path)  # transformers imported, the runtime up and a cast compiled before measuring
    _cast(jnp.zeros(8, jnp.bfloat16), jnp.float32).block_until_ready()
    before = resident_bytes()
    reset_peak()
    t = time.perf_counter()
    if eager:  # the whole checkpoint read, then converted to float32 numpy, then put on the device
        from flaxlm.models import abstract_model, from_hf_state_dict, merge_model
        from flaxlm.models.hf_io import load_config, read_safetensors
        config = load_config(path)
        params = jax.tree.map(jnp.asarray, from_hf_state_dict(config, read_safetensors(path)))
        model = merge_model(abstract_model(config)[0], params)
    else:
        config, model = load_pretrained(path, shardings=lambda a: state_shardings(a, mesh, sharding),
                                        param_dtype=param_dtype)
    leaves = jax.tree.leaves(jax.block_until_ready(model))
    seconds = time.perf_counter() - t
    peak = resident_bytes("VmHWM") - before
    placed = sum(x.nbytes for x in leaves if isinstance(x, jax.Array))
    return {"loader": "eager" if eager else "flaxlm", "devices": mesh.size, "sharding": sharding,
            "param_dtype": str(leaves[0].dtype), "params": int(sum(x.size for x in leaves)),
            "checkpoint_bytes": int(checkpoint_bytes), "shards": len(shards), "largest_shard_bytes": largest,
            "placed_bytes": int(placed), "peak_growth_bytes": int(peak),
            "bound_bytes": int(placed + largest), "seconds": round(seconds, 2)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--make", metavar="DIR")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--shard_mb", type=int, default=16)
    p.add_argument("--load", metavar="DIR")
    p.add_argument("--sharding", choices=["data", "fsdp"], default="fsdp")
    p.add_argument("--param_dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--eager", action="store_true", help="the control: read all, convert, then place")
    a = p.parse_args(argv)
    if a.make:
        make(a.make, a.hidden, a.layers, a.vocab, a.shard_mb)
    if a.load:
        print(json.dumps(load(a.load, a.sharding, a.param_dtype, a.eager)), flush=True)


if __name__ == "__main__":
    main()
