#!/usr/bin/env python
"""Score a causal LM (any decoder family: a transformers-format directory) on held-out text: loss per token,
perplexity, and the figures that compare models whose tokenizers differ: bits per byte (of the text's UTF-8), bits
per character, byte and word perplexity (lm-evaluation-harness's definitions). For a context extension, the loss by
position in the window (--loss_by_position N) and passkey retrieval (--passkey_lengths).

    python evaluate_lm.py --model_name_or_path runs/my-gpt2 --validation_file no_valid.txt
    python evaluate_lm.py --model_name_or_path DIR --dataset_name wikitext --dataset_config_name \
        wikitext-2-raw-v1 --dataset_split test --max_length 1024 --stride 512 --dtype bfloat16
    python evaluate_lm.py --model_name_or_path runs/long --validation_file long_valid.txt --max_length 8192 \
        --stride 8192 --loss_by_position 1024 --passkey_lengths 2048 4096 8192 --passkey_depths 5

Pipeline: options -> the model (a causal LM, else one line) and its tokenizer -> the documents (a txt line or a
record each; blank ones dropped) -> each document's tokens after a BOS (or EOS) in windows of --max_length (a longer
document in sliding windows of --stride: every token predicted once) -> their log-likelihoods on all devices, a few
compiled shapes (with --loss_by_position each token's, summed by the position that predicts it) -> with
--passkey_lengths the passkey prompts scored the same way (flaxlm/tasks/passkey.py; without held-out text, only
they) -> one JSON line of results (and --output_file).
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
        raise UserError("pass the held-out text as --validation_file FILE or as --dataset_name NAME (one of them), "
                        "or only --passkey_lengths")
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

    # The model (a causal LM), its tokenizer, the context, the windows' stride and the passkey lengths: all checked
    # before any work.
    path = resolve_dir(args.model_name_or_path)
    lm = CausalLM(path, args.tokenizer_name or path, args.model_name_or_path, args.max_length,
                  hint=", or judge an encoder or T5 with evaluate_suite.py", adapter=args.adapter)
    max_length = lm.max_length
    stride = args.stride or max(max_length // 2, 1)
    if stride > max_length:
        raise UserError(f"--stride {stride} is larger than the model's context of {max_length} tokens (--max_length); "
                        f"use at most {max_length}")
    with_text = bool(args.validation_file or args.dataset_name) or not args.passkey_lengths
    if args.loss_by_position and not with_text:
        raise UserError("--loss_by_position splits the loss on held-out text; pass --validation_file FILE or "
                        "--dataset_name NAME")
    if args.output_dir:
        check_output_dir(args)
    if lm.prefix is None:
        raise UserError(f"the tokenizer of {args.tokenizer_name or args.model_name_or_path} has neither a BOS nor an "
                        f"EOS token to score a document's first token after; give it one (train_tokenizer.py does)")
    if args.passkey_lengths:
        from flaxlm.tasks.passkey import check_lengths
        check_lengths(lm, args.passkey_lengths)
    texts = read_documents(args) if with_text else None

    # The documents' windows and the passkey prompts, scored on all devices; the figures over them.
    import jax
    lm.load(args.dtype, args.per_device_eval_batch_size, args.sharding, desc="evaluate_lm")
    results, documents = {"model": args.model_name_or_path}, None
    if with_text:
        figures, by_position, documents = score_documents(lm, texts, stride, args.loss_by_position)
        results.update(figures, max_length=max_length, stride=stride, dtype=args.dtype)
        if by_position is not None:
            results["loss_by_position"] = by_position
    else:
        results.update(max_length=max_length, dtype=args.dtype)
    if args.passkey_lengths:
        from flaxlm.tasks.passkey import passkey_retrieval
        results["passkey"] = passkey_retrieval(lm, args.passkey_lengths, args.passkey_depths)
    line = json.dumps(results)
    if jax.process_index() == 0:
        print(line, flush=True)
        if args.output_file:
            with open(args.output_file, "w", encoding="utf-8") as f:
                f.write(line + "\n")
        if args.output_dir:
            write_output_dir(args.output_dir, results, documents)
    return results


def score_documents(lm, texts, stride, width=None):
    """(text_figures + {"windows"}, the loss by position in buckets `width` wide or None without width, each
    document's {"log_likelihood", "tokens", "bytes"}): texts in windows of lm.max_length moved by stride."""
    import numpy as np
    from flaxlm.tasks.text_likelihood import document_windows, loss_by_position, text_figures
    ids = lm.tokenizer(texts, add_special_tokens=False)["input_ids"]
    windows, owner = [], []
    for d, doc_ids in enumerate(ids):
        for w in document_windows(doc_ids, lm.prefix, lm.max_length, stride):
            windows.append(w)
            owner.append(d)
    ll, _, *token_ll = lm.scorer(windows, per_token=bool(width))
    tokens = sum(len(doc_ids) for doc_ids in ids)
    figures = {**text_figures(float(np.sum(ll)), tokens, texts), "windows": len(windows)}
    by_position = loss_by_position(windows, token_ll[0], width, lm.max_length) if width else None
    per_doc = np.bincount(owner, weights=ll, minlength=len(texts))
    documents = [{"log_likelihood": float(x), "tokens": len(d), "bytes": len(t.encode("utf-8"))}
                 for x, d, t in zip(per_doc, ids, texts)]
    return figures, by_position, documents


def check_output_dir(args):
    """--output_dir writable, and no earlier run's figures in it unless --overwrite_output_dir."""
    from flaxlm.files import check_writable_dir
    check_writable_dir(args.output_dir)
    for name in (DOCUMENTS, "results.json"):  # a run without held-out text (passkey only) writes results.json alone
        earlier = os.path.join(args.output_dir, name)
        if os.path.exists(earlier) and not args.overwrite_output_dir:
            raise UserError(f"{earlier} exists; pass --overwrite_output_dir to replace it, or another --output_dir")


def write_output_dir(output_dir, results, documents):
    """results.json, and DOCUMENTS (a line per document) unless documents is None (no held-out text scored)."""
    os.makedirs(output_dir, exist_ok=True)
    if documents is not None:
        with open(os.path.join(output_dir, DOCUMENTS), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in documents)
    with open(os.path.join(output_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    run_main(main)
