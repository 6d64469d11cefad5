#!/usr/bin/env python
"""Score a causal LM (any decoder family: a transformers-format directory) on held-out text: loss per token,
perplexity, and the figures that compare models whose tokenizers differ: bits per byte (of the text's UTF-8), bits
per character, byte and word perplexity (lm-evaluation-harness's definitions).

    python evaluate_lm.py --model_name_or_path runs/my-gpt2 --validation_file no_valid.txt
    python evaluate_lm.py --model_name_or_path DIR --dataset_name wikitext --dataset_config_name \
        wikitext-2-raw-v1 --dataset_split test --max_length 1024 --stride 512 --dtype bfloat16

Pipeline: options -> the model (a causal LM, else one line) and its tokenizer -> the documents (a txt line or a
record each; blank ones dropped) -> each document's tokens after a BOS (or EOS) in windows of --max_length (a longer
document in sliding windows of --stride: every token predicted once) -> their log-likelihoods on all devices, a few
compiled shapes -> one JSON line of results (and --output_file).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.config.options import EvaluateLMArgs  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402

DOCUMENTS = "predictions_validation.jsonl"  # with --output_dir: each document's log-likelihood, tokens and bytes

def read_documents(args):
    """The held-out texts: --validation_file's lines/records, or --dataset_split of --dataset_name."""
    from flaxlm.data import text
    if bool(args.validation_file) == bool(args.dataset_name):
        raise UserError("pass the held-out text as --validation_file FILE or as --dataset_name NAME (one of them)")
    args.streaming = False
    if args.validation_file:
        where = f"--validation_file {', '.join(args.validation_file)}"
        ds = text.load_files(args.validation_file, "--validation_file", args)
    else:
        where = f"dataset {args.dataset_name}"
        import datasets
        try:
            split = text.hub_split(args.dataset_name, args.dataset_config_name, args.dataset_split, args.cache_dir)
            ds = datasets.load_dataset(args.dataset_name, args.dataset_config_name, split=split,
                                       cache_dir=args.cache_dir)
        except Exception as e:  # offline, unknown name, config or split
            raise UserError(f"could not load split {args.dataset_split} of dataset {args.dataset_name} "
                            f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}); check the "
                            f"name, --dataset_config_name, --dataset_split and your network") from None
    with text.naming_bad_bytes(fresh=True):
        ds = text._text_only(ds, args, where)
        if args.max_eval_samples:
            ds = ds.select(range(min(args.max_eval_samples, len(ds))))
        return list(ds["text"])


def main(argv=None):
    (args,) = parse_args(EvaluateLMArgs, argv=argv, prog="evaluate_lm.py", description=__doc__)
    from flaxlm.models.hf_io import resolve_dir
    from flaxlm.tasks.lm_scoring import CausalLM

    # The model (a causal LM), its tokenizer, the context and the windows' stride: all checked before any work.
    path = resolve_dir(args.model_name_or_path)
    lm = CausalLM(path, args.tokenizer_name or path, args.model_name_or_path, args.max_length,
                  hint=", or judge an encoder or T5 with evaluate_suite.py", adapter=args.adapter)
    max_length = lm.max_length
    stride = args.stride or max(max_length // 2, 1)
    if stride > max_length:
        raise UserError(f"--stride {stride} is larger than the model's context of {max_length} tokens (--max_length); "
                        f"use at most {max_length}")
    if args.output_dir:
        check_output_dir(args)
    if lm.prefix is None:
        raise UserError(f"the tokenizer of {args.tokenizer_name or args.model_name_or_path} has neither a BOS nor an "
                        f"EOS token to score a document's first token after; give it one (train_tokenizer.py does)")
    texts = read_documents(args)

    # Each document's windows, scored on all devices; the figures over all documents.
    import jax
    import numpy as np
    from flaxlm.tasks.text_likelihood import document_windows, text_figures

    lm.load(args.dtype, args.per_device_eval_batch_size, args.sharding, desc="evaluate_lm")
    ids = lm.tokenizer(texts, add_special_tokens=False)["input_ids"]
    windows, owner = [], []
    for d, doc_ids in enumerate(ids):
        for w in document_windows(doc_ids, lm.prefix, max_length, stride):
            windows.append(w)
            owner.append(d)
    ll, _ = lm.scorer(windows)
    tokens = sum(len(doc_ids) for doc_ids in ids)
    results = {"model": args.model_name_or_path, **text_figures(float(np.sum(ll)), tokens, texts),
               "max_length": max_length, "stride": stride, "windows": len(windows), "dtype": args.dtype}
    line = json.dumps(results)
    if jax.process_index() == 0:
        print(line, flush=True)
        if args.output_file:
            with open(args.output_file, "w", encoding="utf-8") as f:
                f.write(line + "\n")
        if args.output_dir:
            per_doc = np.bincount(owner, weights=ll, minlength=len(texts))
            write_output_dir(args.output_dir, results, [
                {"log_likelihood": float(x), "tokens": len(d), "bytes": len(t.encode("utf-8"))}
                for x, d, t in zip(per_doc, ids, texts)])
    return results


def check_output_dir(args):
    """--output_dir writable, and no earlier run's figures in it unless --overwrite_output_dir."""
    from flaxlm.files import check_writable_dir
    check_writable_dir(args.output_dir)
    earlier = os.path.join(args.output_dir, DOCUMENTS)
    if os.path.exists(earlier) and not args.overwrite_output_dir:
        raise UserError(f"{earlier} exists; pass --overwrite_output_dir to replace it, or another --output_dir")


def write_output_dir(output_dir, results, documents):
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, DOCUMENTS), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in documents)
    with open(os.path.join(output_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    run_main(main)
