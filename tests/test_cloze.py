"""fill_mask.py and fill_spans.py share flaxlm.tasks.cloze: the arguments they read and how they score."""
import pytest

from flaxlm.errors import UserError
from flaxlm.tasks.cloze import fill_in, read_arguments


def test_read_arguments_keeps_the_order_and_the_answers(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    argv = ["fill_mask.py", str(tmp_path), "a <mask>.", "--cloze", "b <mask>.", " loop ", "c <mask>."]
    model_dir, prompts = read_arguments(argv, "usage: x", trained_by="run_mlm_flax.py")
    assert model_dir == str(tmp_path)
    assert prompts == [("a <mask>.", None), ("b <mask>.", "loop"), ("c <mask>.", None)]


@pytest.mark.parametrize("args, match", [
    ([], r"^usage: x$"),
    (["--cloze", "b <mask>."], r"--cloze takes two values"),
    (["--top_k", "3"], r"unknown option --top_k"),
])
def test_read_arguments_names_the_problem(tmp_path, args, match):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match=match):
        read_arguments(["fill_mask.py", str(tmp_path), *args] if args else ["fill_mask.py"], "usage: x", "s.py")


def test_read_arguments_wants_an_exported_model(tmp_path):
    with pytest.raises(UserError, match=r"holds no exported model \(config\.json\); pass s\.py's --output_dir"):
        read_arguments(["fill_mask.py", str(tmp_path), "a <mask>."], "usage: x", "s.py")


def test_fill_in_scores_the_first_guess_of_each_cloze(capsys):
    guesses = {"a": [(" loop", "' loop'"), (" if", "' if'")], "b": [(" if", "' if'"), (" loop", "' loop'")],
               "c": [("x", "'x'")]}
    right, scored = fill_in([("a", "loop"), ("b", "loop"), ("c", None)], guesses.__getitem__, "fill-mask")
    assert (right, scored) == (1, 2)  # a's first guess is right; b's right answer is only second; c is not scored
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["a", "  -> ' loop', ' if'", "  expected 'loop': right"]
    assert "  expected 'loop': wrong" in out
    assert out[-1] == "fill-mask: 1 of 2 top-1 answers right"
