#!/usr/bin/env python
"""Run a registered experiment (TensorFlow Model Garden style) through the same code as the run_*.py scripts.

    python train.py --experiment=bert/sentence_prediction --mode=train_and_eval --model_dir=runs/sst2 \
        --config_file=configs/models/roberta_base.yaml --config_file=configs/sst2.yaml \
        --params_override=task.model.model_name_or_path=runs/my-roberta,trainer.optimizer.learning_rate=2e-5

Pipeline: the experiment's typed config (flaxlm.config.experiment_registry) <- each --config_file in order (the
scripts' recipes: flag names or nested keys, and the section of the experiment's script) <- each
--params_override -> printed and written to model_dir/experiment.yaml -> for a model pretrained from scratch, its
config.json in model_dir from task.model.preset (create_config.py) -> the experiment's script run with the flat
flags of that config (the same parsing and checks as its own command line), --mode deciding between training,
evaluation and continuous evaluation of model_dir's checkpoints.
"""
import importlib
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.cli import parse_args, parse_flags  # noqa: E402
from flaxlm.config.experiment_registry import EXPERIMENTS, MODE_OPTIONS, get_experiment  # noqa: E402
from flaxlm.config.experiments import options_of, resolve, to_argv, to_yaml  # noqa: E402
from flaxlm.config.options import DriverArgs, TrainingArgs  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402
from flaxlm.secrets import redact_argv  # noqa: E402

CONFIG_FILE = "experiment.yaml"  # what a training run writes; an evaluation job writes experiment_{mode}.yaml
CONFIG_FILE_HELP = ("yaml recipe: the experiment's keys (task:, trainer:, ...; dotted keys too) or the scripts' flag "
                    "names, and the section of the experiment's script; repeatable, later files win")


def main(argv=None):
    flags, config_files = parse_driver_flags(argv)
    experiment = get_experiment(flags.experiment)
    mode = flags.mode

    # The typed config: registry defaults < config files in order < overrides in order.
    config = resolve(experiment.config_class(), config_files, flags.params_override or [], experiment.script)
    header = f"# train.py --experiment={experiment.name} --mode={mode}: {experiment.about}\n"
    if flags.print_config:
        print(header + to_yaml(config))
        return
    training = mode in ("train", "train_and_eval")
    if config.runtime.compile_for:  # a check for a TPU slice: compiled from shapes, nothing written
        return compile_for(experiment, config, flags)
    model_dir = flags.model_dir
    if not model_dir:
        raise UserError("missing --model_dir (the run's directory: checkpoints, logs, the export)")

    # The script's options: the config's leaves, the ones --mode and --model_dir set, and a model built from
    # task.model.preset when pretraining from scratch.
    options = {**options_of(config), **MODE_OPTIONS[mode], "output_dir": model_dir}
    from_preset = (experiment.pretraining and config.task.model.preset and not config.task.model.config_name
                   and not config.task.model.model_name_or_path)
    if from_preset:
        if training and not config.task.model.tokenizer_name:
            raise UserError(f"task.model.preset {config.task.model.preset} needs task.model.tokenizer_name (a "
                            f"tokenizer from train_tokenizer.py) for the vocabulary size; set it, or give "
                            f"task.model.config_name")
        options["config_name"] = model_dir
    elif config.task.model.preset:  # the model comes from a checkpoint or a config instead
        print(f"task.model.preset {config.task.model.preset} is not used: {experiment.name} takes the model "
              f"of task.model.model_name_or_path / task.model.config_name")
    if training and _holds_only_ours(model_dir):  # train.py's own files (below) may be replaced by this run
        options["overwrite_output_dir"] = True
    argv = to_argv(experiment.groups, options)

    # The script's own parsing and output-directory rule, before anything is written.
    from flaxlm.training.output_dir import prepare_output_dir
    args = next(a for a in parse_args(*experiment.groups, argv=argv, prog=f"{experiment.script}.py")
                if isinstance(a, TrainingArgs))
    prepare_output_dir(args)
    config_file = os.path.join(model_dir, CONFIG_FILE if training else f"experiment_{mode}.yaml")
    _write(config_file, header + to_yaml(config) + "\n")
    print(f"{header}{to_yaml(config)}\n(written to {config_file})", flush=True)
    if from_preset:
        write_model_config(config.task.model, model_dir, fresh=training and not args.resume_from_checkpoint)

    print(f"running: {shlex.join([experiment.script + '.py', *redact_argv(argv)])}", flush=True)
    importlib.import_module(experiment.script).main(argv)


def compile_for(experiment, config, flags):
    """runtime.compile_for: the experiment's script run with that flag (flaxlm.planning.compile_for), no model_dir
    needed; a model from task.model.preset gets its config.json in a temporary directory."""
    import tempfile
    options = {**options_of(config), **MODE_OPTIONS[flags.mode]}
    if flags.model_dir:
        options["output_dir"] = flags.model_dir
    model = config.task.model
    with tempfile.TemporaryDirectory(prefix="flaxlm-compile-for-") as tmp:
        if experiment.pretraining and model.preset and not model.config_name and not model.model_name_or_path:
            if not model.tokenizer_name:
                raise UserError(f"task.model.preset {model.preset} needs task.model.tokenizer_name (a tokenizer from "
                                f"train_tokenizer.py) for the vocabulary size; set it, or give task.model.config_name")
            write_model_config(model, tmp, fresh=True)
            options["config_name"] = tmp
        argv = to_argv(experiment.groups, options)
        print(f"running: {shlex.join([experiment.script + '.py', *redact_argv(argv)])}", flush=True)
        importlib.import_module(experiment.script).main(argv)


def parse_driver_flags(argv):
    """(DriverArgs, the --config_file paths) from train.py's command line."""
    flags, config_files = parse_flags([DriverArgs], argv, "train.py", __doc__.splitlines()[0], CONFIG_FILE_HELP)
    if "experiment" not in flags:
        raise UserError(f"missing --experiment; known experiments: {', '.join(EXPERIMENTS)}")
    return DriverArgs(**flags), config_files


def write_model_config(model, model_dir, fresh):
    """model_dir/config.json from task.model.preset, sized to the tokenizer (create_config.py). A run that
    continues model_dir (resuming, or an evaluation job) uses the one already there."""
    path = os.path.join(model_dir, "config.json")
    if not fresh:
        if not os.path.exists(path):
            raise UserError(f"{path} does not exist: this run reads the model config its training run wrote to "
                            f"model_dir; start the training job first, or set task.model.config_name")
        print(f"model config: {path} (written when the training run started)")
        return
    import create_config
    create_config.main(["--preset", model.preset, "--output_dir", model_dir, "--tokenizer_name",
                        model.tokenizer_name, "--overwrite_output_dir", "true",
                        *(["--set", *model.config_overrides] if model.config_overrides else [])])


def _holds_only_ours(model_dir):
    """Whether model_dir is absent, empty, or holds only what train.py writes before its script starts (a run
    that stopped before training did)."""
    names = set(os.listdir(model_dir)) if os.path.isdir(model_dir) else set()
    return not names or (CONFIG_FILE in names and names <= {CONFIG_FILE, "config.json"})


def _write(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    run_main(main)
