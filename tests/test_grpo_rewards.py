"""GRPO's host side (run_grpo.py): driving TRL's own GRPOTrainer on a tiny checkpoint (generation replaced by fixed
completions, rewards by a fixed table with None in it), our group advantages and logged reward figures equal TRL's
for each scale_rewards, our prompt tokens equal those TRL generates from, and our reward functions are called with
what TRL calls them with; the built-ins score SQuAD's way (Norwegian too) and the length reward is TRL's; a user's
reward file loads by its spec; every mistake is one line."""
import json
import shutil

import numpy as np
import pytest

from flaxlm.data.chat_template import CHATML
from flaxlm.data.prompts import Prompt, decode_completions, encode_prompt, load_prompts, prompt_record, prompt_text
from flaxlm.errors import UserError
from flaxlm.rl.advantages import group_advantages
from flaxlm.rl.rewards import BuiltInOptions, RewardFunc, load_reward_funcs, score

G = 4  # completions per prompt
# Two reward functions' rewards for 4 groups of 4 completions (NaN: the function returned None). Group 0 mixed, one
# completion unscored; group 1 one weighted reward throughout (std 0); group 2 one scored completion (std NaN);
# group 3 none scored.
N = np.nan
REWARDS = np.array([[1.0, 0.0], [0.0, 1.0], [N, 1.0], [N, N],
                    [1.0, 0.0], [0.5, 1.0], [1.0, 0.0], [0.0, 2.0],
                    [N, N], [0.25, N], [N, N], [N, N],
                    [N, N], [N, N], [N, N], [N, N]], np.float32)
WEIGHTS = [1.0, 0.5]
TEXT_PROMPTS = ["Hva er 1+2?", "Hvem skrev Peer Gynt?", "Hovedstaden i Norge er", "To og to er"]
ANSWERS = ["3", "Henrik Ibsen", "Oslo", "fire"]
CALLS = {}  # reward function name -> the keyword arguments of its last call


def _table(j):
    def reward(prompts, completions, completion_ids, **kwargs):
        CALLS[reward.__name__] = dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                      **kwargs)
        return [None if np.isnan(v) else float(v) for v in REWARDS[:len(prompts), j]]
    reward.__name__ = ("correctness", "style")[j]
    return reward


TABLE_FUNCS = [_table(0), _table(1)]


def rows(chat):
    """The 16 records TRL's sampler hands over: each prompt G times in a row, with its columns."""
    prompts = [[{"role": "system", "content": "Svar kort."}, {"role": "user", "content": p}] if chat else p
               for p in TEXT_PROMPTS]
    return [{"prompt": p, "answer": a, "id": k} for k, (p, a) in enumerate(zip(prompts, ANSWERS)) for _ in range(G)]


COMPLETION_IDS = [np.random.default_rng(i).integers(5, 300, 1 + i % 7).tolist() for i in range(4 * G)]


@pytest.fixture(scope="module")
def checkpoint(tiny_gpt2_dir, tmp_path_factory):
    import torch
    import transformers
    d = tmp_path_factory.mktemp("grpo-model")
    shutil.copytree(tiny_gpt2_dir, d, dirs_exist_ok=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(d)).save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def trainer(checkpoint, tmp_path_factory):
    """TRL's GRPOTrainer with the table's reward functions, its generation returning COMPLETION_IDS (and recording
    the prompt ids it was given)."""
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    tok.chat_template = CHATML
    t = GRPOTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(checkpoint), reward_funcs=TABLE_FUNCS,
                    processing_class=tok, train_dataset=Dataset.from_list(rows(False)),
                    args=GRPOConfig(output_dir=str(tmp_path_factory.mktemp("grpo-trl")), report_to=[], use_cpu=True,
                                    bf16=False, per_device_train_batch_size=4 * G, num_generations=G,
                                    max_completion_length=8, reward_weights=WEIGHTS))
    t.model.train()

    def generate(prompt_ids, images, multimodal_fields, num_generations):
        t.seen_prompt_ids = [list(p) for p in prompt_ids]
        return [[int(i) for i in ids] for ids in COMPLETION_IDS], None
    t._generate_single_turn = generate
    return t


def trl_run(trainer, scale_rewards, chat=False):
    """(advantages, {metric: value}) of TRL's _generate_and_score_completions over rows(chat)."""
    trainer.scale_rewards = scale_rewards
    trainer._metrics["train"].clear()
    out = trainer._generate_and_score_completions(rows(chat))
    return out["advantages"].numpy(), {k: v[-1] for k, v in trainer._metrics["train"].items()}


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_advantages_and_reward_figures_are_trls(trainer, scale_rewards):
    theirs, logged = trl_run(trainer, scale_rewards)
    ours, metrics = group_advantages(REWARDS, WEIGHTS, G, scale_rewards, ["correctness", "style"])
    assert ours.dtype == np.float32 and ours.shape == (4 * G,)
    # float32 on both sides; numpy and torch may add the same numbers in another order (an ulp)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    assert np.all(ours[[3, 8, 9, 10, 11, 12]] == 0) and np.all(ours[4:8] == 0)  # unscored, std 0, std NaN, none
    assert set(metrics) == {"reward", "reward_std", "frac_reward_zero_std", "rewards/correctness/mean",
                            "rewards/correctness/std", "rewards/style/mean", "rewards/style/std"}
    for name, value in metrics.items():
        assert value == pytest.approx(logged[name], rel=1e-6, abs=1e-7, nan_ok=True), name


@pytest.mark.parametrize("chat", [False, True], ids=["text", "messages"])
def test_prompt_tokens_and_reward_calls_are_trls(trainer, checkpoint, chat):
    """encode_prompt gives the tokens TRL generates from; score calls a function with TRL's arguments (the prompts
    as in the data, decoded completions, their ids, every column) and gets the rewards TRL got."""
    from flaxlm.tokenization.loading import load_tokenizer
    trl_run(trainer, "group", chat)
    theirs = {name: CALLS.pop(name) for name in ("correctness", "style")}
    logged = np.array([list(trainer._logs["rewards"][name])[-4 * G:] for name in ("correctness", "style")]).T
    tok = load_tokenizer(checkpoint)
    assert tok("Hei")["input_ids"] != tok("Hei", add_special_tokens=False)["input_ids"]  # <s> Hei </s>: it shows
    records = [prompt_record(r, f"row {i}") for i, r in enumerate(rows(chat))]
    assert [encode_prompt(tok, CHATML, p.prompt) for p in records] == trainer.seen_prompt_ids
    prompts = [p.prompt for p in records]
    rewards = score([RewardFunc(f.__name__, f, w) for f, w in zip(TABLE_FUNCS, WEIGHTS)], prompts,
                    decode_completions(tok, prompts, COMPLETION_IDS), COMPLETION_IDS, [p.columns for p in records])
    np.testing.assert_array_equal(rewards, logged)
    for name, call in theirs.items():
        for extra in ("trainer_state", "log_extra", "log_metric"):
            call.pop(extra)
        assert CALLS[name] == call
    assert prompt_text(tok, CHATML, prompts[0]) == (
        "<|im_start|>system\nSvar kort.<|im_end|>\n<|im_start|>user\nHva er 1+2?<|im_end|>\n<|im_start|>assistant\n"
        if chat else "Hva er 1+2?")


def test_prompts_load_with_their_columns(tmp_path):
    from flaxlm.config.options import TextSourceArgs
    path = tmp_path / "train.jsonl"
    records = rows(True)[::G]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    splits = load_prompts(TextSourceArgs(train_file=[str(path)]), 25, seed=0)
    loaded = sorted(splits["train"] + splits["validation"], key=lambda p: p.columns["id"])
    assert len(splits["validation"]) == 1
    assert loaded == [Prompt(r["prompt"], {"answer": r["answer"], "id": r["id"]}) for r in records]


@pytest.mark.parametrize("bad", [2, 7])
def test_a_bad_prompt_is_named_by_its_record_in_the_users_file(tmp_path, bad):
    """A record without a prompt, whether it lands among the training prompts or the held-out ones: named by its
    number in the file (from 1), not by its place after the held-out ones are drawn."""
    from flaxlm.config.options import TextSourceArgs
    path = tmp_path / "train.jsonl"
    records = [{"prompt": f"Hva er {i}+{i}?", "answer": str(2 * i)} for i in range(1, 11)]
    records[bad - 1] = {"question": "Hva er 1+1?", "answer": "2"}
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    with pytest.raises(UserError, match=rf"^prompt {bad} of --train_file {path} has no 'prompt' \(its fields: answer, "
                                        rf"question\)"):
        load_prompts(TextSourceArgs(train_file=[str(path)]), 30, seed=0)


def _score_one(name, completions, answers, options=BuiltInOptions()):
    func = load_reward_funcs([name], options=options)
    ids = [[1] * len(str(c)) for c in completions]
    return score(func, ["?"] * len(completions), completions, ids, [{"answer": a} for a in answers])[:, 0]


def test_exact_match_and_f1_are_squads():
    squad = {"text": ["Denver Broncos", "The Denver Broncos"], "answer_start": [0, 0]}
    completions = ["the Denver Broncos.", "Broncos won", "<think>Tja</think><answer>Henrik  Ibsen!</answer>",
                   "Henrik Ibsen skrev", [{"role": "assistant", "content": "Bjørnstjerne BJØRNSON."}], "noe", "",
                   "noe"]
    answers = [squad, squad, "Henrik Ibsen", ["Ibsen", "Henrik Ibsen"], "Bjørnstjerne Bjørnson", [], [], None]
    em, f1 = _score_one("exact_match", completions, answers), _score_one("token_f1", completions, answers)
    np.testing.assert_array_equal(em, [1, 0, 1, 0, 1, 0, 1, N])
    np.testing.assert_allclose(f1, [1, 0.5, 1, 0.8, 1, 0, 1, N])  # 0.5: p = r = 1/2; 0.8: p = 2/3, r = 1


def test_format_and_length_rewards():
    from trl.rewards import get_soft_overlong_punishment
    np.testing.assert_array_equal(
        _score_one("format", ["<answer>\n42\n</answer>", "Svar: <answer>42", "<answer></answer> ja"], [None] * 3),
        [1, 0, 1])
    assert _score_one("format", ["42", "Svar: 42"], [None] * 2, BuiltInOptions(format_pattern=r"^\d+$")).tolist() \
        == [1, 0]
    for cache in (0, 4, 16):
        options = BuiltInOptions(max_completion_length=16, soft_punish_cache=cache)
        completions = ["x" * n for n in range(20)]
        theirs = get_soft_overlong_punishment(16, cache)(completion_ids=[[1] * n for n in range(20)])
        np.testing.assert_array_equal(_score_one("length", completions, [None] * 20, options),
                                      np.array(theirs, np.float32))


def test_a_user_reward_file_loads_by_its_spec(tmp_path, monkeypatch):
    (tmp_path / "helpers.py").write_text("def count(text):\n    return len(text.split())\n", encoding="utf-8")
    (tmp_path / "my_rewards.py").write_text(
        "import dataclasses\nfrom helpers import count\n\n@dataclasses.dataclass\nclass Config:\n    most: int = 3\n\n"
        "def brevity(prompts, completions, answer, **kwargs):\n"
        "    return [None if a is None else -max(count(c) - Config().most, 0) for c, a in zip(completions, answer)]\n",
        encoding="utf-8")
    funcs = load_reward_funcs(["token_f1", f"{tmp_path}/my_rewards.py:brevity"], weights=[1, 0.5])
    assert [(f.name, f.weight) for f in funcs] == [("token_f1", 1.0), ("brevity", 0.5)]
    rewards = score(funcs, ["?"] * 3, ["a b c d e", "Oslo", "x"], [[1], [2], [3]],
                    [{"answer": "Oslo"}, {"answer": "Oslo"}, {"answer": None}])
    np.testing.assert_array_equal(rewards, np.array([[0, -2], [1, 0], [N, N]], np.float32))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # helpers, as `trl grpo` has the working directory
    assert load_reward_funcs(["my_rewards.brevity"])[0].name == "brevity"


def _raising(prompts, completions, **kwargs):
    return [1 / len(c) for c in completions]


@pytest.mark.parametrize("specs, weights, options, message", [
    ([], None, None, "no reward functions"),
    (["token_f1", "format"], [1.0], None, "gives 1 weights for 2 reward functions"),
    (["accuracy"], None, None, "no built-in reward of that name"),
    (["missing.py:f"], None, None, "no file missing.py"),
    (["FILE:nothing"], None, None, r"no 'nothing' in it \(callables there: good\)"),
    (["FILE:CONSTANT"], None, None, "'CONSTANT' is a int, not a function"),
    (["BROKEN:f"], None, None, "loading it failed with SyntaxError"),
    (["FILE:good", "FILE:good"], None, None, "two reward functions are named 'good'"),
    (["no_such_module.f"], None, None, "loading it failed with ModuleNotFoundError"),
    (["format"], None, BuiltInOptions(format_pattern="<answer>("), "is not a regular expression"),
    (["length"], None, BuiltInOptions(max_completion_length=32), "--soft_punish_cache 64 is not between 0 and"),
])
def test_bad_reward_specs_are_one_line(tmp_path, specs, weights, options, message):
    (tmp_path / "good.py").write_text("CONSTANT = 3\n\ndef good(prompts, completions, **kw):\n    return [1.0]\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    specs = [s.replace("FILE", str(tmp_path / "good.py")).replace("BROKEN", str(tmp_path / "broken.py"))
             for s in specs]
    with pytest.raises(UserError, match=message) as e:
        load_reward_funcs(specs, weights, options)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fn, message", [
    (_raising, r"'bad' failed with ZeroDivisionError: division by zero on prompt 2 'Hvem skrev Peer Gynt"),
    (lambda prompts, **kw: [1.0], "'bad' returned 1 rewards for 3 completions"),
    (lambda prompts, **kw: 1.0, "'bad' returned a float for the batch"),
    (lambda prompts, **kw: [1.0, "1.0", 2.0], r"'bad' returned '1.0' for prompt 'Hvem skrev"),
    (lambda prompts, **kw: [0.0, float("nan"), None], r"'bad' returned nan for prompt 'Hvem skrev Peer Gynt"),
    (lambda prompts, **kw: [float("inf"), 0.0, 0.0], r"'bad' returned inf for prompt 'Hva er 1\+2"),
    (lambda prompts, **kw: [0.0] * 3, None),
])
def test_bad_rewards_are_one_line(fn, message):
    prompts = ["Hva er 1+2?", "Hvem skrev Peer Gynt? " * 10, [{"role": "user", "content": "Hvem skrev Peer Gynt?"}]]
    args = ([RewardFunc("bad", fn)], prompts, ["x", "y", ""], [[1], [2], []], [{}] * 3)
    if message is None:
        assert score(*args).tolist() == [[0.0]] * 3
        return
    with pytest.raises(UserError, match=message) as e:
        score(*args)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_a_missing_answer_column_names_the_option():
    with pytest.raises(UserError, match=r"needs the column 'answer' in the data \(columns: id\); add it or pass "
                                        r"--answer_column"):
        score(load_reward_funcs(["exact_match"]), ["?"], ["x"], [[1]], [{"id": 1}])


@pytest.mark.parametrize("record, message", [
    ({"messages": [{"role": "user", "content": "Hei"}]}, r"row 3 has no 'prompt' \(its fields: messages\)"),
    ({"prompt": "  "}, "row 3 has an empty prompt"),
    ({"prompt": []}, r"its 'prompt' is a list \(empty\)"),
    ({"prompt": 7}, "its 'prompt' is a int"),
    ({"prompt": [{"role": "user"}]}, "message 0 of 'prompt' needs a 'role' and a text 'content'"),
    ({"prompt": [{"role": "bot", "content": "Hei"}]}, "message 0 has the unknown role 'bot'"),
])
def test_bad_prompts_are_one_line(record, message):
    with pytest.raises(UserError, match=message) as e:
        prompt_record(record, "row 3")
    assert "\n" not in str(e.value)
