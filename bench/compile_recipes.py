#!/usr/bin/env python
"""What each training recipe in configs/ needs per TPU device, from the TPU compiler, before anyone rents a slice.

    python bench/compile_recipes.py                                   # every recipe on its slices (see RECIPES)
    python bench/compile_recipes.py --recipes norwegian-gpt2 --slices v5e-8 v5e-4
    python bench/compile_recipes.py --recipes sft-mistral-7b-lora --preset gemma-2-9b   # another model, same recipe
    python bench/compile_recipes.py --recipes dpo-mistral-7b-lora --flags "--precompute_ref_log_probs false"

Each recipe's own script runs with --config_file configs/RECIPE.yaml --compile_for SLICE (one process per run) on a
stand-in for the model it names: the preset's config.json (the hub model's shape and vocabulary) beside a small
tokenizer of the recipe's kind (only the shapes matter; nothing is downloaded). Prints one markdown row per run:
per-device GiB of the train step (parameters, optimizer state, temporaries, total), the eval step's total, whether
it fits, and the compile time. Needs libtpu (requirements-tpu.txt).
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# recipe: (its script, the preset of the model it trains or starts from, the tokenizer kind, how the recipe names the
# model, the slices: those it names, then the next smaller)
RECIPES = {
    "norwegian-roberta-base": ("run_mlm_flax.py", "roberta-base", "bpe", "--config_name", ["v3-8", "v5e-8", "v5e-4"]),
    "norwegian-t5-v1_1-base": ("run_t5_mlm_flax.py", "t5-v1_1-base", "unigram", "--config_name",
                               ["v3-8", "v5e-8", "v5e-4"]),
    "norwegian-gpt2": ("run_clm_flax.py", "gpt2", "bpe", "--config_name", ["v3-8", "v5e-8", "v5e-4"]),
    "opt-350m-wikitext": ("run_clm_flax.py", "opt-350m", "bpe", "--model_name_or_path", ["v5e-8", "v5e-4"]),
    "continue-mistral-7b": ("run_clm_flax.py", "mistral-7b", "bpe", "--model_name_or_path",
                            ["v4-32", "v5e-32", "v4-16", "v5e-16"]),
    "adapt-roberta-to-norwegian": ("run_mlm_flax.py", "roberta-base", "bpe", "--model_name_or_path",
                                   ["v5e-8", "v5e-4"]),
    "sft-mistral-7b-lora": ("run_sft.py", "mistral-7b", "bpe", "--model_name_or_path",
                            ["v5e-4", "v5e-8", "v5e-16", "v4-8", "v6e-8"]),
    "sft-mistral-7b": ("run_sft.py", "mistral-7b", "bpe", "--model_name_or_path",
                       ["v5e-4", "v5e-8", "v5e-16", "v4-8", "v6e-8"]),
    "dpo-mistral-7b-lora": ("run_dpo.py", "mistral-7b", "bpe", "--model_name_or_path", ["v5e-4", "v5e-8"]),
    "grpo-mistral-7b-lora": ("run_grpo.py", "mistral-7b", "bpe", "--model_name_or_path", ["v5e-8", "v5e-16"]),
    # mixtures of experts (--sharding expert; --flags "--sharding fsdp" compiles them without the expert axis)
    "continue-qwen3-30b-a3b": ("run_clm_flax.py", "qwen3-30b-a3b", "bpe", "--model_name_or_path",
                               ["v5e-32", "v5e-64", "v5p-16", "v5p-32", "v6e-16", "v6e-32"]),
    "sft-qwen3-30b-a3b-lora": ("run_sft.py", "qwen3-30b-a3b", "bpe", "--model_name_or_path",
                               ["v5e-8", "v5e-16", "v5p-8", "v6e-8"]),
    "continue-mixtral-8x7b": ("run_clm_flax.py", "mixtral-8x7b", "bpe", "--model_name_or_path",
                              ["v5e-64", "v5e-128", "v5p-32", "v5p-64", "v6e-32", "v6e-64"]),
    "sft-mixtral-8x7b-lora": ("run_sft.py", "mixtral-8x7b", "bpe", "--model_name_or_path",
                              ["v5e-8", "v5e-16", "v5p-8", "v6e-8"]),
}


def stand_in(preset, kind, corpus, where):
    """A directory with the preset's config.json (its own vocabulary size) and a small tokenizer of `kind`."""
    d = os.path.join(where, f"{preset}-{kind}")
    if not os.path.isdir(d):
        py = sys.executable
        subprocess.run([py, "train_tokenizer.py", "--type", kind, "--train_file", corpus, "--vocab_size", "1000",
                        "--model_max_length", "4096", "--output_dir", d], cwd=ROOT, check=True, capture_output=True)
        subprocess.run([py, "create_config.py", "--preset", preset, "--output_dir", d], cwd=ROOT, check=True,
                       capture_output=True)
    return d


def figures(out):
    """{name: value} from a --compile_for run's output (or its error line)."""
    r = {}
    for name in ("parameters", "optimizer state", "temporaries", "total"):
        m = re.search(rf"^  {name} +(\S+) +(\S+)$", out, re.M)
        if m:
            r[name] = m.groups()
    m = re.search(r"compiled in ([\d.]+) s \(train step\) \+ ([\d.]+) s", out)
    r["compile_s"] = m.groups() if m else None
    m = re.search(r"^(fits .*)$|^error: (.*)$", out, re.M)
    r["verdict"] = (m.group(1) or m.group(2)) if m else out.strip().splitlines()[-1][:200]
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    p.add_argument("--slices", nargs="+", help="instead of each recipe's own")
    p.add_argument("--preset", help="the model of this preset in each recipe's place (e.g. gemma-2-9b)")
    p.add_argument("--flags", default="", help="more flags for each recipe's script, in one string (they win)")
    p.add_argument("--work_dir", help="where the stand-in model directories go (default: a temporary one)")
    a = p.parse_args()
    from flaxlm.data.demo_corpus import write_demo_corpus
    work = a.work_dir or tempfile.mkdtemp(prefix="compile-recipes-")
    corpus = write_demo_corpus(os.path.join(work, "corpus"))["train"]
    print("| recipe | slice | parameters | optimizer state | temporaries | train step total | eval step total | "
          "compile s (train + eval) | verdict |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for name in a.recipes:
        script, preset, kind, flag, slices = RECIPES[name]
        label = f"{name} ({a.preset})" if a.preset and a.preset != preset else name
        label += f" {a.flags}" if a.flags else ""
        model = stand_in(a.preset or preset, kind, corpus, work)
        for target in a.slices or slices:
            cmd = [sys.executable, script, "--config_file", f"configs/{name}.yaml", flag, model, "--tokenizer_name",
                   model, "--compile_for", target, *shlex.split(a.flags)]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            r = figures(done.stdout + done.stderr)
            cells = [r.get(k, ("-", "-"))[0] for k in ("parameters", "optimizer state", "temporaries", "total")]
            compile_s = "+".join(r["compile_s"]) if r["compile_s"] else "-"
            print(f"| {label} | {target} | {' | '.join(cells)} | {r.get('total', ('-', '-'))[1]} | {compile_s} | "
                  f"{r['verdict']} |", flush=True)


if __name__ == "__main__":
    main()
