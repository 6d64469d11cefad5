"""The other side of bench/finetune_vs_torch.py: a fine-tuning script's run redone as a transformers PyTorch loop.

    figures = finetune("run_token_classification.py", the script's flags, checkpoint dir)   # {metric: value}

The script's options are parsed by its own parser and its data made by its own functions, so both sides train on the
same rows and are scored by the same metric code; what differs is the model and its training: transformers' PyTorch
model of the checkpoint (a new head initialized by transformers, dropout as the config says, the loss the model
computes from its labels), torch AdamW (no weight decay on biases and norms, as ours), transformers' linear schedule,
clipping to --max_grad_norm, fp32. The batches are ours, in our order: flaxlm.data.rows.ShuffledRows over the same
rows with the same seed, --train_batch_size rows a step, total_train_steps steps.

    initial_checkpoint("run_token_classification.py", flags, checkpoint dir, out)   # the model before training

writes the model the loop would start from (the checkpoint with the task's new head, drawn by transformers from
torch.manual_seed(--seed)) to `out` with the checkpoint's tokenizer: a start both sides can share.
"""
import numpy as np

from flaxlm.config.cli import parse_args
from flaxlm.config import options


def _loop(model, rows, inputs_of, args, losses):
    """Train the PyTorch model on rows as our loop would order them; each step's loss appended to `losses`."""
    import torch
    import transformers
    from flaxlm.data.rows import ShuffledRows, total_train_steps
    batch = args.train_batch_size or args.per_device_train_batch_size
    shuffled = ShuffledRows(rows, batch, args.seed)
    steps = total_train_steps(args, shuffled)
    named = list(model.named_parameters())
    plain = [p for n, p in named if "bias" in n or "norm" in n.lower()]
    decayed = [p for n, p in named if not ("bias" in n or "norm" in n.lower())]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": args.weight_decay},
                             {"params": plain, "weight_decay": 0.0}], lr=args.learning_rate,
                            betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    schedule = transformers.get_linear_schedule_with_warmup(opt, args.warmup_steps, steps)
    model.train()
    for step in range(steps):
        loss = model(**inputs_of(shuffled.batch_rows(step, slice(None)))).loss
        loss.backward()
        losses.append(float(loss.detach()))
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        schedule.step()
        opt.zero_grad()
    model.eval()
    return model


def _save(model, checkpoint, out):
    """The model as built (before training) saved to `out` with the checkpoint's tokenizer files; returns out."""
    import os
    import shutil
    model.save_pretrained(out)
    for name in os.listdir(checkpoint):
        if name.startswith(("tokenizer", "special_tokens_map", "vocab", "merges", "spiece")):
            shutil.copy(os.path.join(checkpoint, name), os.path.join(out, name))
    return out


def _tensors(rows, keys, **renamed):
    import torch
    out = {k: torch.as_tensor(np.asarray(rows[k]), dtype=torch.long) for k in keys}
    out.update({k: torch.as_tensor(np.asarray(v), dtype=torch.long) for k, v in renamed.items()})
    return out


def _outputs(model, rows, keys, batch, read):
    """{name: numpy array over every row}: read(model output, batch rows) per batch of the dev rows, in order."""
    import torch
    n, parts = len(rows[keys[0]]), []
    with torch.no_grad():
        for start in range(0, n, batch):
            chunk = {k: np.asarray(v)[start:start + batch] for k, v in rows.items()}
            parts.append(read(chunk))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def classification(flags, checkpoint, losses, save_to=None):
    import transformers
    from flaxlm.data.sentence_data import label_names, load_examples, token_rows
    from flaxlm.models import load_config
    from flaxlm.tasks.sentence_prediction import compute_metrics, resolve_task
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.training.pipeline import resolve_seq_len
    model_args, source, data_args, task_args, args = parse_args(
        options.ModelArgs, options.TextSourceArgs, options.DataArgs, options.SentencePredictionArgs,
        options.TrainingArgs, argv=flags, prog="run_classification.py")
    task = resolve_task(task_args, source.text_column)
    examples = load_examples(source, task, data_args.validation_split_percentage, args.seed,
                             max_train_samples=data_args.max_train_samples, max_eval_samples=data_args.max_eval_samples)
    config = load_config(checkpoint)
    names = label_names(examples["train"], config.id2label)
    tokenizer = load_tokenizer(checkpoint)
    rows = token_rows(examples, tokenizer, resolve_seq_len(data_args.max_seq_length, tokenizer, config), config, names)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        checkpoint, id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
        trust_remote_code=False)
    if save_to:
        return _save(model, checkpoint, save_to)
    keys = ("input_ids", "attention_mask", "token_type_ids")
    model = _loop(model, rows["train"], lambda r: _tensors(r, keys + ("labels",)), args, losses)
    dev = rows["validation"]
    outputs = _outputs(model, dev, keys, 64, lambda r: {"logits": model(**_tensors(r, keys)).logits.numpy(),
                                                         "labels": r["labels"]})
    return compute_metrics(task, outputs)


def token_classification(flags, checkpoint, losses, save_to=None):
    import transformers
    from flaxlm.data.tagged_sentences import load_sentences, tag_names
    from flaxlm.models import load_config
    from flaxlm.tasks.tagging_metrics import resolve_scheme, score
    from flaxlm.tasks.token_classification import token_rows, word_tags
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.tokenization.split_words import prefix_every_word
    from flaxlm.training.pipeline import resolve_seq_len
    model_args, source, data_args, task_args, args = parse_args(
        options.ModelArgs, options.TextSourceArgs, options.DataArgs, options.TokenClassificationArgs,
        options.TrainingArgs, argv=flags, prog="run_token_classification.py")
    sentences = load_sentences(source, task_args, data_args.validation_split_percentage, args.seed,
                               max_train_samples=data_args.max_train_samples,
                               max_eval_samples=data_args.max_eval_samples)
    config = load_config(checkpoint)
    names = tag_names(sentences, config.id2label)
    scheme = resolve_scheme(task_args.metric, names)
    tokenizer = prefix_every_word(load_tokenizer(checkpoint))
    rows = token_rows(sentences, tokenizer, resolve_seq_len(data_args.max_seq_length, tokenizer, config), names,
                      task_args.label_all_tokens)
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        checkpoint, id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
        trust_remote_code=False)
    if save_to:
        return _save(model, checkpoint, save_to)
    keys = ("input_ids", "attention_mask", "token_type_ids")
    model = _loop(model, rows["train"], lambda r: _tensors(r, keys + ("labels",)), args, losses)

    def read(r):
        logits = model(**_tensors(r, keys)).logits.numpy()
        return {"predictions": logits.argmax(-1), "labels": r["labels"], "word_ids": r["word_ids"]}
    return score(scheme, *word_tags(_outputs(model, rows["validation"], keys, 64, read), names))


def question_answering(flags, checkpoint, losses, save_to=None):
    import transformers
    from flaxlm.data.squad import read_squad, squad_windows
    from flaxlm.models import load_config
    from flaxlm.tasks.squad_objective import MASKED, predicted_answers
    from flaxlm.tasks.squad_metric import squad_scores
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.training.pipeline import resolve_seq_len
    model_args, source, data_args, qa_args, args = parse_args(
        options.ModelArgs, options.TextSourceArgs, options.DataArgs, options.QuestionAnsweringArgs,
        options.TrainingArgs, argv=flags, prog="run_qa.py")
    tokenizer = load_tokenizer(checkpoint)
    seq_len = resolve_seq_len(data_args.max_seq_length, tokenizer, load_config(checkpoint))
    train = read_squad(source.train_file, qa_args.version_2_with_negative, "train")
    train_rows, _ = squad_windows(train[:data_args.max_train_samples], tokenizer, seq_len, qa_args.doc_stride)
    dev = read_squad(source.validation_file, qa_args.version_2_with_negative, "validation")
    dev = dev[:data_args.max_eval_samples]
    dev_rows, offsets_NL2 = squad_windows(dev, tokenizer, seq_len, qa_args.doc_stride, keep_offsets=True)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(checkpoint, trust_remote_code=False)
    if save_to:
        return _save(model, checkpoint, save_to)
    keys = ("input_ids", "attention_mask", "token_type_ids")
    labeled = keys + ("start_positions", "end_positions")
    model = _loop(model, train_rows, lambda r: _tensors(r, labeled), args, losses)

    def read(r):  # padding positions at our MASKED logit, as our predict gives them
        out, real = model(**_tensors(r, keys)), np.asarray(r["attention_mask"]) > 0
        return {"start_logits": np.where(real, out.start_logits.numpy(), MASKED),
                "end_logits": np.where(real, out.end_logits.numpy(), MASKED)}
    outputs = _outputs(model, dev_rows, keys, 64, read)
    answers = predicted_answers(outputs, (dev, dev_rows, offsets_NL2), qa_args)
    return squad_scores(answers, {e.id: e.answers for e in dev})


def seq2seq(flags, checkpoint, losses):
    import torch
    import transformers
    from flaxlm.data.seq2seq_data import load_pairs, token_rows
    from flaxlm.tasks.seq2seq import decode, text_metrics
    from flaxlm.tokenization.loading import load_tokenizer
    model_args, source, data_args, task_args, args = parse_args(
        options.ModelArgs, options.TextSourceArgs, options.DataArgs, options.Seq2SeqArgs, options.TrainingArgs,
        argv=flags, prog="run_seq2seq.py")
    pairs = load_pairs(source, task_args.source_column or source.text_column or "source", task_args.target_column,
                       data_args.validation_split_percentage, args.seed,
                       max_train_samples=data_args.max_train_samples, max_eval_samples=data_args.max_eval_samples)
    tokenizer = load_tokenizer(checkpoint)
    rows = token_rows(pairs, tokenizer, task_args.source_prefix, task_args.max_source_length,
                      task_args.max_target_length)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(checkpoint, trust_remote_code=False)

    def inputs_of(r):  # labels: -100 on padding (transformers shifts them right into the decoder's inputs)
        return _tensors(r, ("input_ids", "attention_mask"),
                        labels=np.where(np.asarray(r["label_mask"]) == 1, r["labels"], -100))
    model = _loop(model, rows["train"], inputs_of, args, losses)
    max_length = task_args.generation_max_length or task_args.max_target_length

    def read(r):
        with torch.no_grad():
            tokens = model.generate(**_tensors(r, ("input_ids", "attention_mask")), max_length=max_length,
                                    num_beams=task_args.num_beams, length_penalty=task_args.length_penalty,
                                    do_sample=False)
        return {"tokens": np.pad(tokens.numpy(), ((0, 0), (0, max_length - tokens.shape[1])),
                                 constant_values=tokenizer.pad_token_id), "index": r["index"]}
    outputs = _outputs(model, rows["validation"], ("input_ids",), 64, read)
    references = pairs["validation"].targets
    return text_metrics(decode(tokenizer, outputs["tokens"]), [references[i] for i in outputs["index"]])


KINDS = {"run_classification.py": classification, "run_token_classification.py": token_classification,
         "run_qa.py": question_answering, "run_seq2seq.py": seq2seq}


def _seeded(flags):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()  # the new head's "newly initialized" report, every run
    seed = int(flags[flags.index("--seed") + 1])
    torch.manual_seed(seed)
    np.random.seed(seed)
    return [*flags, "--output_dir", "unused (nothing is written)"]


def initial_checkpoint(script, flags, checkpoint, out):
    """The model the PyTorch loop of the script's run would start from, saved to `out` (with the tokenizer): an
    encoder script's (a new head); run_seq2seq.py starts from the checkpoint itself."""
    return KINDS[script](_seeded(flags), checkpoint, [], save_to=out)


def finetune(script, flags, checkpoint, losses=None):
    """{metric: dev value} of the script's run (its flags) redone in PyTorch, each step's loss appended to `losses`;
    the seed from --seed."""
    return KINDS[script](_seeded(flags), checkpoint, [] if losses is None else losses)
