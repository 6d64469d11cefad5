#!/usr/bin/env python
"""Fine-tune an encoder to tag every word: part of speech (UPOS, XPOS) or named entities (BIO tags), as Hugging
Face's run_flax_ner.py did.

Pipeline: options -> output directory -> tagged sentences (CoNLL-U, JSON lines or a `datasets` dataset: words and
tags columns) and their tag names -> tokenizer and model (the encoder of --model_name_or_path, e.g. what
run_mlm_flax.py exported, with a new token-classification head) -> sub-token rows (each word's label on its first
sub-token) -> training over all devices with evaluation (loss, word accuracy; seqeval's entity precision/recall/F1
for BIO tags) and checkpoints -> per-label report beside the most-frequent-tag-per-word baseline, predictions files
(word, gold, predicted) -> export in Hugging Face format (AutoModelForTokenClassification) to --output_dir.

    python run_token_classification.py --output_dir runs/pos --model_name_or_path runs/my-model \
        --train_file ud_bokmaal_dev.conllu --validation_split_percentage 20 --tag_column upos
    python run_token_classification.py --output_dir runs/ner --model_name_or_path runs/my-model \
        --train_file norne_nob_train.conllu --validation_file norne_nob_dev.conllu --tag_column misc:name
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import DataArgs, ModelArgs, TextSourceArgs, TokenClassificationArgs, TrainingArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, task_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, TokenClassificationArgs, TrainingArgs, argv=argv,
        prog="run_token_classification.py", description=__doc__)
    from flaxlm.data.rows import ShuffledRows, total_train_steps
    from flaxlm.data.tagged_sentences import load_sentences, tag_names
    from flaxlm.models.hf_io import load_config
    from flaxlm.tasks.tagging_metrics import MostFrequentTag, resolve_scheme
    from flaxlm.tasks.token_classification import token_objective, token_rows, unscored_words
    from flaxlm.tasks.tagging_report import judge_split
    from flaxlm.tokenization.split_words import prefix_every_word
    from flaxlm.planning.compile_for import check_fit, compile_target
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.training.pipeline import export, resolve_seq_len, start_run, train_and_evaluate

    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Sentences and their tags (the training tags sorted; a checkpoint's own order kept when it names the same).
    sentences = load_sentences(source, task_args, data_args.validation_split_percentage, args.seed,
                               include_test=args.do_predict, max_train_samples=data_args.max_train_samples,
                               max_eval_samples=data_args.max_eval_samples,
                               need_validation=args.do_eval)  # --do_eval false: none needed
    model_path = model_args.model_name_or_path or model_args.config_name
    names = tag_names(sentences, load_config(model_path).id2label if model_path else None)
    scheme = resolve_scheme(task_args.metric, names)
    baseline = MostFrequentTag(sentences["train"])

    # Tokenizer, model (the pretrained encoder with a token-classification head; --compile_for: shapes only), devices
    # (--compile_for: the TPU slice's) and batch sizes.
    tokenizer = load_run_tokenizer(model_args, model_path)
    tokenizer = prefix_every_word(tokenizer)  # byte-level BPE: a space before every word, as transformers' recipes
    tokenizer, config, graphdef, params, _, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, task="token_classification", id2label=dict(enumerate(names)))

    # Sub-token rows, each split's in sentence order.
    seq_len = resolve_seq_len(data_args.max_seq_length, tokenizer, config)
    rows = token_rows(sentences, tokenizer, seq_len, names, task_args.label_all_tokens)
    width = rows["train"]["input_ids"].shape[1]
    for split, r in rows.items():
        cut = unscored_words(sentences[split], r)
        note = f"; {cut} words past --max_seq_length {seq_len} are cut off (not scored)" if cut else ""
        print(f"{split}: {len(r['input_ids'])} sentences in rows of {width} tokens ({sentences[split].where}){note}",
              flush=True)
    print(f"{len(names)} tags, scored by {scheme}: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}")

    # The rows of each step and the objective.
    train_rows = ShuffledRows(rows["train"], global_batch, args.seed)
    total_steps = total_train_steps(args, train_rows)
    labeled_test = rows["test"] if "test" in rows and sentences["test"].tags is not None else None
    objective = token_objective(graphdef, config, scheme, names, width, tokenizer.pad_token_id)
    if target:  # --compile_for: compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch, rows["train"],
                         config.vocab_size)
    start_fresh(args)  # inputs all read

    # Train, evaluating the loss and the word-level metrics over the whole validation set.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, rows.get("validation"), total_steps,
                                mesh, micro_batch, eval_batch, labeled_test, config=config)
    if params is None:  # --eval_checkpoints: an evaluation job
        return

    # The per-label report beside the baseline, predictions files (word, gold, predicted) and the export.
    for split, do in (("validation", args.do_eval), ("test", args.do_predict)):
        if do:
            judge_split(split, params, objective, rows[split], sentences[split], names, scheme, baseline,
                        eval_batch, mesh, args.output_dir)
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForTokenClassification")


if __name__ == "__main__":
    run_main(main)
