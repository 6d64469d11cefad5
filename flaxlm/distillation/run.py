"""What run_distill.py does besides training: its checks, the teacher, the rows, and the offline store.

    check_settings(distill)                                   # UserError on options out of range
    teacher_config = check_teacher(path, tokenizer)           # a decoder of the student's tokenizer
    check_lengths(...), check_top_k(...)                      # the options against both models
    teacher_graphdef, teacher_params = load_teacher(...)      # placed as the student's (shapes only: --compile_for)
    rows = distill_rows(...)                                  # {split: rows} (text or conversations)
    taught = offline_rows(...)                                # the training rows with the teacher's top k
"""
import dataclasses
import os

import numpy as np

from flaxlm.errors import UserError

DEFAULT_TEMPERATURE = {"offline": 1.0, "gkd": 0.9}  # MaxText's distillation; TRL's GKDConfig


def check_settings(distill):
    for name in ("alpha", "beta", "lmbda"):
        if getattr(distill, name) > 1:
            raise UserError(f"--{name} {getattr(distill, name)} is a share and lies in [0, 1]; pass one there")
    if distill.temperature == 0:
        raise UserError("--temperature 0 leaves no distribution to learn from; pass a positive temperature")


def check_top_k(k, vocab_size):
    """--top_k against the vocabulary student and teacher share (before the teacher is loaded, or a store begun)."""
    if k > vocab_size:
        raise UserError(f"--top_k {k} is more than the {vocab_size} tokens of the vocabulary student and teacher "
                        f"share; pass at most {vocab_size}")


def check_lengths(distill, max_length, prompt_length, teacher_config):
    """--max_length against the teacher's positions (the student's: resolve_block_size) and, for gkd, a prompt plus
    --max_new_tokens against --max_length: UserError before any teacher work."""
    from flaxlm.distillation.rows import check_room_to_sample
    from flaxlm.models import family_of
    positions = family_of(teacher_config).max_length
    limit = None if positions is None else positions(teacher_config)  # None: no limit (ALiBi)
    if limit is not None and max_length > limit:
        # (a learned position table past its end is read clamped: the teacher's predictions there would be made up)
        raise UserError(f"--max_length {max_length} is longer than the teacher's {limit} positions "
                        f"({distill.teacher_model_name_or_path}, config.json); pass --max_length {limit} or less")
    if distill.mode == "gkd":
        check_room_to_sample(prompt_length, distill.max_new_tokens, max_length, distill.lmbda, distill.seq_kd)


def temperature_of(distill):
    return distill.temperature or DEFAULT_TEMPERATURE[distill.mode]


def data_format(distill, source, prep):
    """'text' or 'conversations': --data_format, or with auto text for .txt files and --prepared_data."""
    if distill.data_format != "auto":
        return distill.data_format
    files = list(source.train_file or [])
    return "text" if prep.prepared_data or (files and all(str(f).endswith(".txt") for f in files)) else \
        "conversations"


def check_teacher(path, tokenizer, model_args):
    """The teacher's config, after checking it is a decoder and its tokenizer (where its directory has one) is the
    student's token for token: UserError otherwise, naming both. (--token and --trust_remote_code: the student's.)"""
    from flaxlm.models import check_causal_lm, load_config
    from flaxlm.tokenization.loading import check_fits, load_tokenizer
    config = load_config(path)
    check_causal_lm(config, path)
    has_tokenizer = not os.path.isdir(path) or any(
        os.path.exists(os.path.join(path, name)) for name in ("tokenizer.json", "tokenizer_config.json"))
    if has_tokenizer:
        theirs = load_tokenizer(path, model_args.token, trust_remote_code=model_args.trust_remote_code)
        if theirs.get_vocab() != tokenizer.get_vocab():
            raise UserError(f"the teacher's vocabulary ({path}: {len(theirs)} tokens) is not the student's "
                            f"({tokenizer.name_or_path}: {len(tokenizer)} tokens); distillation compares them token "
                            f"by token: give the student the teacher's tokenizer (adapt_vocabulary.py)")
    check_fits(tokenizer, config)  # after the comparison: a teacher of a smaller vocabulary is named as such
    return config


def load_teacher(model_args, distill, args, mesh, target, tokenizer):
    """(graphdef, params) of the teacher, read straight into --sharding's layout on the mesh (shapes with their
    shardings only, for --compile_for), in --teacher_param_dtype (default the student's)."""
    import jax

    from flaxlm.models import split_model
    from flaxlm.training.pipeline import load_model
    from flaxlm.training.sharding import state_shardings
    teacher_args = dataclasses.replace(model_args, model_name_or_path=distill.teacher_model_name_or_path,
                                       config_name=None, tokenizer_name=None, model_type=None, config_overrides=None,
                                       param_dtype=distill.teacher_param_dtype or model_args.param_dtype)
    config, model = load_model(teacher_args, seed=args.seed, script="run_clm_flax.py", tokenizer=tokenizer,
                               mesh=mesh, sharding=args.sharding, abstract=target is not None)
    graphdef, params = split_model(model)
    shardings = state_shardings(params, mesh, args.sharding)
    if target is not None:
        params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, shardings)
    else:
        params = jax.device_put(params, shardings)
    return config, graphdef, params


def last_answer(trained):
    """0/1 per token: only the last run of taught tokens (a conversation's last answer, as TRL's GKD collator)."""
    trained = np.asarray(trained)
    ends = np.flatnonzero(trained)
    if not len(ends):
        return trained
    last = ends[-1]
    start = last
    while start > 0 and trained[start - 1]:
        start -= 1
    out = np.zeros_like(trained)
    out[start:last + 1] = 1
    return out


def keep_ends(seqs, max_length):
    """(ids, trained) sequences cut to their last max_length tokens, as TRL's GKD collator keeps a long conversation's
    end (its oldest prompt tokens go first, never its answer), those left without a prompt token dropped (nothing to
    sample from; TRL stops there): (the sequences, how many were cut, how many of those dropped)."""
    kept = [(ids[-max_length:], trained[-max_length:]) for ids, trained in seqs]
    out = [(ids, trained) for ids, trained in kept if not trained[0]]
    return out, sum(len(ids) > max_length for ids, _ in seqs), len(kept) - len(out)


def check_gkd_examples(seqs, split):
    """UserError when no (ids, trained) example of `split` has what GKD needs, whatever --max_length: a prompt before
    its answer to sample the answer from (plain text rows have none; an answer every example has, load_conversations
    checks that)."""
    if not any(any(trained) and not trained[0] for _, trained in seqs):
        raise UserError(f"none of the {len(seqs)} {split} examples has a prompt before its answer (plain text rows "
                        f"have none), and --mode gkd samples each answer from its prompt; give conversations "
                        f"(\"messages\") or prompt/completion rows, or use --mode offline for text")


def conversation_rows(examples, tokenizer, template, max_length, pad_id, gkd, packing):
    """{split: sft rows}: conversations encoded as run_sft.py's; gkd: one a row, only the last answer taught, a long
    one's end kept (keep_ends)."""
    from flaxlm.data.chat_rows import encode, report_line, sft_rows
    out = {}
    for split, split_examples in examples.items():
        seqs = [encode(tokenizer, template, e) for e in split_examples]
        if gkd:
            check_gkd_examples(seqs, split)
            seqs, cut, dropped = keep_ends([(ids, list(last_answer(t))) for ids, t in seqs], max_length)
            if cut:
                print(f"{split}: {cut} conversations longer than {max_length} tokens lost their oldest ones"
                      + (f", {dropped} of them their whole prompt (left out)" if dropped else ""), flush=True)
        out[split], report = sft_rows(seqs, max_length, pad_id, packing and not gkd)
        print(report_line(split, report, len(out[split]["input_ids"]), max_length), flush=True)
    return out


def text_rows(source, data_args, prep, tokenizer, max_length, args, prompt_length):
    """{split: rows} of text in blocks of max_length, exactly as run_clm_flax.py makes them by default, or of
    --prepared_data; the training split as TextRows (a tokenized dataset read a batch at a time), the held-out one
    in memory. prompt_length: the tokens of a row that only prompt (gkd), 0 for offline."""
    from flaxlm.data import prepared, rows, text_mixture
    from flaxlm.distillation.rows import TextRows
    if prep.prepared_data:
        data = prepared.load_rows(prep.prepared_data, tokenizer, "documents", max_length, source=source,
                                  data_args=data_args, weights=prep.prepared_data_weights)
    else:
        weights = text_mixture.mixture_weights(source, prep)
        # keep_linebreaks: run_clm_flax.py's default (a .txt file's lines run on, "\n" between them), so that its
        # rows and these are the same tokens
        raw = text_mixture.load_text(source, weights, data_args.validation_split_percentage, args.seed,
                                     keep_linebreaks=True)
        data = rows.from_text(raw, rows.documents(tokenizer, max_length, eos=tokenizer.eos_token_id), max_length,
                              num_workers=data_args.preprocessing_num_workers,
                              overwrite_cache=data_args.overwrite_cache, max_train_samples=data_args.max_train_samples,
                              max_eval_samples=data_args.max_eval_samples)
    train = data["train"]
    if isinstance(train, rows.StreamedRows) or hasattr(train, "rows_by_step"):
        raise UserError("run_distill.py trains on fixed rows (the teacher's top-k is stored per row): drop "
                        "--streaming and the mixture weights, or prepare one directory with prepare_data.py")
    out = {"train": TextRows(rows.in_memory(train), prompt_length)}
    validation = rows.held_out_rows(data.get("validation"))
    if validation is not None:
        out["validation"] = TextRows(validation, prompt_length).materialized()
    return out


def offline_rows(path, rows, distill, vocab_size, teacher_graphdef, teacher_params, eval_batch, mesh, pad_id):
    """The training rows joined with the teacher's top k over the first vocab_size tokens (the vocabulary student and
    teacher share: a config may pad its table further): read from the store in `path` when it holds them, else
    computed there (with the teacher given, let go afterwards by the caller)."""
    from flaxlm.data.rows import num_rows
    from flaxlm.distillation.teacher_store import TaughtRows, compute_store, open_store, teacher_identity
    from flaxlm.reporting.run_log import say
    from flaxlm.training import mesh as meshlib
    k, temperature = distill.top_k, temperature_of(distill)
    teacher = teacher_identity(distill.teacher_model_name_or_path)
    store = open_store(path, rows, k, temperature, teacher, vocab_size)
    if store is not None:
        say(f"the teacher's top-{k} log-probabilities: {path} (computed by an earlier run)")
    else:
        score = top_k_scorer(teacher_graphdef, teacher_params, k, temperature, eval_batch, mesh, pad_id, vocab_size)
        store = compute_store(path, rows, k, temperature, teacher, vocab_size, score,
                              is_main=meshlib.is_main_process())
        say(f"the teacher's top-{k} log-probabilities of {num_rows(rows)} rows, computed once, in {path}")
    return TaughtRows(rows, store, k)


def top_k_scorer(graphdef, params, k, temperature, eval_batch, mesh, pad_id, vocab_size=None):
    """rows -> (ids, logps) numpy [n, L - 1, k]: the teacher's top k at each position, on all devices (eval mode),
    its distribution over the first vocab_size tokens (default: all of its own)."""
    from flaxlm.objectives.distill import collate, logits_of
    from flaxlm.objectives.distill_losses import teacher_top_k
    from flaxlm.training.evaluation import collect_predictions
    from flaxlm.training.objective import Objective

    def predict(p, batch):
        ids, logps = teacher_top_k(logits_of(graphdef, p, batch)[..., :vocab_size], k, temperature)
        return {"ids": ids, "logps": logps}
    scoring = Objective(loss_sums=None, collate=collate, pad_id=pad_id, weights_key="label_weights",
                        flops_per_example=0, tokens_per_example=0, predict=predict)

    def score(rows):
        rows = {**rows, "trained": np.ones_like(rows["input_ids"])}
        out = collect_predictions(params, scoring, rows, eval_batch, mesh)
        return out["ids"], out["logps"]
    return score


def placeholder_taught_rows(max_length, vocab_size, k, n=8):
    """Rows shaped as the offline training rows (flaxlm.data.chat_rows.placeholder_rows plus the teacher's top k),
    for --compile_for."""
    from flaxlm.data.chat_rows import placeholder_rows
    rows = placeholder_rows(max_length, vocab_size, n)
    m = len(rows["input_ids"])
    return {**rows, "teacher_ids": np.zeros((m, max_length - 1, k), np.int32),
            "teacher_logps": np.full((m, max_length - 1, k), -np.log(k), np.float32)}
