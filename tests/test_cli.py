"""Flags and yaml config files: Hugging Face's command line parses unchanged; precedence; errors."""
import pytest

from flaxlm.config.options import DataArgs, ModelArgs, TextSourceArgs, TrainingArgs
from flaxlm.config.cli import parse_args
from flaxlm.errors import UserError

GROUPS = (ModelArgs, TextSourceArgs, DataArgs, TrainingArgs)

HF_COMMAND = """--output_dir=./runs --model_type=roberta --config_name=./norwegian-roberta-base
--tokenizer_name=./norwegian-roberta-base --train_file=train.txt --validation_file=valid.txt --max_seq_length=128
--weight_decay=0.01 --per_device_train_batch_size=128 --per_device_eval_batch_size=128 --learning_rate=3e-4
--warmup_steps=1000 --overwrite_output_dir --pad_to_max_length --num_train_epochs=18 --adam_beta1=0.9
--adam_beta2=0.98 --max_steps=5 --logging_steps=500 --eval_steps=2500 --save_steps=2500 --seed=1 --do_train
--do_eval""".split()


def parse(argv):
    return parse_args(*GROUPS, argv=argv, prog="run_mlm_flax.py")


def test_hugging_face_command_line_parses_unchanged():
    model, source, data, train = parse(HF_COMMAND)
    assert model.model_type == "roberta" and model.config_name == "./norwegian-roberta-base"
    assert source.train_file == ["train.txt"] and source.validation_file == ["valid.txt"]
    assert data.max_seq_length == 128 and data.pad_to_max_length is True
    assert train.overwrite_output_dir is True and train.learning_rate == 3e-4 and train.num_train_epochs == 18.0
    assert (train.adam_beta1, train.adam_beta2, train.warmup_steps) == (0.9, 0.98, 1000)
    assert (train.per_device_train_batch_size, train.max_steps, train.seed) == (128, 5, 1)


def test_yaml_files_then_flags(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("learning_rate: 1.0e-3\nwarmup_steps: 10\nvocab_size: 500\nrun_mlm_flax:\n  seed: 7\n"
                 "train_tokenizer:\n  output_dir: elsewhere\n")
    b.write_text("warmup_steps: 20\n")
    *_, train = parse(["--output_dir", "o", "--config_file", str(a), "--config_file", str(b), "--seed", "9"])
    assert train.learning_rate == 1e-3  # from a
    assert train.warmup_steps == 20  # b wins over a
    assert train.seed == 9  # the flag wins over a's section
    assert train.output_dir == "o"  # another script's section does not apply


@pytest.mark.parametrize("text, match", [
    ("learning_rat: 1\n", "did you mean learning_rate"),
    ("run_mlm_flax:\n  sed: 1\n", "did you mean seed"),
    ("max_steps: many\n", "max_steps"),
    ("do_train: maybe\n", "do_train"),
    ("[1, 2\n", "not valid yaml"),
    ("- a\n- b\n", "mapping"),
])
def test_bad_config_files(tmp_path, text, match):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(UserError, match=match):
        parse(["--output_dir", "o", "--config_file", str(f)])


def test_bad_flags():
    with pytest.raises(UserError, match="unrecognized"):
        parse(["--output_dir", "o", "--no_such_flag"])
    with pytest.raises(UserError, match="invalid int"):
        parse(["--output_dir", "o", "--max_steps", "ten"])
    with pytest.raises(UserError, match="output_dir"):
        parse([])
    with pytest.raises(UserError, match="does not exist"):
        parse(["--output_dir", "o", "--config_file", "missing.yaml"])


def test_recipes_in_configs_parse():
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("demo.yaml", "norwegian-roberta-base.yaml"):
        *_, train = parse(["--config_file", os.path.join(root, "configs", name)])
        assert train.output_dir


def test_nested_keys_in_a_scripts_recipe(tmp_path):
    """A script reads train.py's nested and dotted keys too; another script's keys are skipped, unknown ones are
    errors naming the nearest keys."""
    f = tmp_path / "c.yaml"
    f.write_text("trainer:\n  optimizer: {learning_rate: 1.0e-3}\n  train_steps: 7\ntask.train_data.input_path: a.txt\n"
                 "task:\n  squad: {doc_stride: 64}\n  model: {preset: roberta-tiny}\n")
    _, source, _, train = parse(["--output_dir", "o", "--config_file", str(f)])
    assert (train.learning_rate, train.max_steps, source.train_file) == (1e-3, 7, ["a.txt"])
    f.write_text("trainer.optimizer.learning_rte: 1\n")
    with pytest.raises(UserError, match="unknown option 'trainer.optimizer.learning_rte'; did you mean "
                                        "trainer.optimizer.learning_rate"):
        parse(["--output_dir", "o", "--config_file", str(f)])


@pytest.mark.parametrize("script", ["run_t5_mlm_flax", "run_clm_flax", "run_classification", "run_qa"])
def test_line_by_line_is_run_mlm_flax_only(script):
    import importlib
    with pytest.raises(UserError, match="unrecognized arguments: --line_by_line"):
        importlib.import_module(script).main(["--output_dir", "o", "--line_by_line"])


def help_text(script, capsys):
    """`script.py --help` as one line (argparse's wrapping undone)."""
    import importlib
    with pytest.raises(SystemExit) as done:
        importlib.import_module(script).main(["--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("script, shown", [
    ("run_mlm_flax", ["--learning_rate LEARNING_RATE peak learning rate (default: 5e-05)",
                      "--mlm_probability MLM_PROBABILITY fraction of tokens masked", "(default: 0.15)",
                      "--num_train_epochs NUM_TRAIN_EPOCHS epochs to train (ignored when --max_steps > 0) "
                      "(default: 3.0)", "--do_predict [BOOL] after training, evaluate the test split (--test_file or "
                      "the dataset's) (default: false)", "--report_to REPORT_TO [REPORT_TO ...]"]),
    ("run_sft", ["--learning_rate LEARNING_RATE peak learning rate (default: 5e-05)",
                 "--long_examples {truncate,drop} an example longer than --max_length: cut to it (TRL's), or left out "
                 "(default: truncate)"]),
    ("generate", ["--max_new_tokens MAX_NEW_TOKENS tokens to generate per prompt (fewer if EOS comes first) "
                  "(default: 50)", "--seed SEED seed of the sampling (default: 42)"]),
    ("create_config", ["--preset PRESET shape preset; see create_config.py --list_presets (default: roberta-base)"]),
    ("run_fewshot", ["between the solved examples and the question (default: '\\n\\n')"]),
])
def test_help_shows_each_default(script, shown, capsys):
    """--help gives each option's default where it has one; none where it is None (the help says what happens
    then, once: --tokenizer_name's '(default: --model_name_or_path)')."""
    text = help_text(script, capsys)
    for piece in shown:
        assert piece in text
    assert "(default: None)" not in text and "MISSING" not in text
    assert "(default: --model_name_or_path) (default" not in text


def test_every_default_is_in_the_help():
    from flaxlm.config.cli import _help
    from flaxlm.config.options import declared_fields
    import dataclasses
    for f in declared_fields():
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if default is not None and default is not dataclasses.MISSING:
            assert "default" in _help(f), f.name


SFT_GROUPS = "ModelArgs TextSourceArgs DataArgs SFTArgs LoraArgs TrainingArgs".split()


def test_a_script_lists_only_the_options_it_reads(capsys):
    """run_sft.py takes DataArgs for the split and sample counts but not its pretraining options: --help leaves them
    out, the command line takes them (Hugging Face's commands) with a note that they are ignored; TRL's older --max_seq_length is --max_length's alias; generate.py's model
    is not one to train from scratch."""
    from flaxlm.config import options
    text = help_text("run_sft", capsys)
    for name in ("mlm_probability", "pad_to_max_length", "preprocessing_num_workers", "overwrite_cache",
                 "text_column", "test_file", "do_predict"):
        assert f"--{name}" not in text
    assert "--max_length MAX_LENGTH, --max_seq_length MAX_LENGTH" in text
    assert text.count("--max_seq_length") == 1  # the alias, nowhere else
    groups = [getattr(options, g) for g in SFT_GROUPS]
    *_, data, sft, _, train = parse_args(*groups, argv=["--output_dir", "o", "--max_seq_length", "256",
                                                        "--validation_split_percentage", "7"], prog="run_sft.py")
    assert (sft.max_length, data.validation_split_percentage, data.max_seq_length) == (256, 7, None)
    assert (data.mlm_probability, train.do_predict) == (0.15, False)  # the defaults, never read
    from flaxlm.config.cli import parsed_options  # what the trackers and the model card record of the run
    assert parsed_options()["max_length"] == 256 and "mlm_probability" not in parsed_options()
    capsys.readouterr()
    *_, data, _, _, _ = parse_args(*groups, argv=["--output_dir", "o", "--mlm_probability", "0.3"], prog="run_sft.py")
    assert data.mlm_probability == 0.15  # an old command line runs, and is told what it passed does nothing
    assert capsys.readouterr().out == ("note: run_sft.py does not use --mlm_probability (taken for Hugging Face's "
                                       "command lines, ignored)\n")
    with pytest.raises(UserError, match="unrecognized arguments: --mlm_probabilty 0.3"):
        parse_args(*groups, argv=["--output_dir", "o", "--mlm_probabilty", "0.3"], prog="run_sft.py")
    assert "train from scratch" not in help_text("generate", capsys)
    assert "train from scratch" in help_text("run_clm_flax", capsys)


def test_left_out_options_exist_and_train_py_has_no_key_for_them():
    from flaxlm.config.cli import FLAG_NAMES
    from flaxlm.config.experiment_registry import EXPERIMENTS
    from flaxlm.config.experiments import leaves
    from flaxlm.config.options import LEFT_OUT
    assert all(name in FLAG_NAMES for names in LEFT_OUT.values() for name in names)
    keys = {f.metadata["option"] for f in leaves(EXPERIMENTS["decoder/sft"].config_class()).values()}
    assert "mlm_probability" not in keys and "max_seq_length" not in keys and "max_length" in keys
    assert "mlm_probability" in {f.metadata["option"]
                                 for f in leaves(EXPERIMENTS["roberta/mlm"].config_class()).values()}
