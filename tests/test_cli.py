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
