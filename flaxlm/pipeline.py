"""Steps every pretraining script shares between its options and its training loop."""
import itertools

import numpy as np

from flaxlm.errors import UserError

MATERIALIZE_BYTES = 2 << 30  # token rows up to this size are held in memory as one numpy array
STREAM_EVAL_ROWS = 10_000  # validation rows taken from a stream when --max_eval_samples is not set


def load_model(model_args, seed):
    """(config, model): continued from --model_name_or_path, or new from --config_name."""
    from flaxlm.models import create_model
    from flaxlm.models.hf_io import load_config, load_pretrained
    if model_args.model_name_or_path:
        config, model = load_pretrained(model_args.model_name_or_path, dtype=model_args.dtype)
    elif model_args.config_name:
        config = load_config(model_args.config_name)
        model = create_model(config, dtype=model_args.dtype, seed=seed)
    else:
        raise UserError("no model given; pass --config_name DIR (write one with create_config.py) to train from "
                        "scratch, or --model_name_or_path DIR to continue a Hugging Face checkpoint")
    if model_args.model_type and model_args.model_type != config.model_type:
        raise UserError(f"--model_type {model_args.model_type} does not match the config's model_type "
                        f"{config.model_type}; drop --model_type or use a {model_args.model_type} config")
    return config, model


def train_and_eval_rows(data, streaming):
    """(train rows or stream opener, validation rows as numpy or None) from tokenize_and_group's output."""
    from flaxlm.data import as_numpy_rows, iter_rows
    if streaming:
        train = data["train"]

        def open_stream(skip):
            first = True
            while True:  # epochs over the stream; a resumed run starts `skip` rows in
                got = False
                for row in iter_rows(train, skip=skip if first else 0):
                    got = True
                    yield row
                if not got and not first:
                    raise UserError("the training stream yields no rows; check --train_file / --dataset_name")
                first = False
        evals = data.get("validation")
        eval_rows = None if evals is None else np.stack(list(itertools.islice(iter_rows(evals), STREAM_EVAL_ROWS)))
        return open_stream, eval_rows
    train = data["train"]
    if len(train) * len(train[0]["input_ids"]) * 4 <= MATERIALIZE_BYTES:
        train = as_numpy_rows(train)
    evals = data.get("validation")
    return train, None if evals is None else as_numpy_rows(evals)


def total_train_steps(args, train_rows, streaming):
    if args.max_steps and args.max_steps > 0:
        return args.max_steps
    if streaming:
        raise UserError("--streaming needs --max_steps (a stream has no known length)")
    return max(1, int(train_rows.steps_per_epoch * args.num_train_epochs))
