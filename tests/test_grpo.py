"""GRPO (run_grpo.py) end to end on a tiny GPT-2: a run logs TRL's figures and sample completions and exports a model
transformers loads; the completions drawn are a function of the seed alone (the same on 1 device and 8); a run
resumed inside a round (--num_iterations 2) continues the same curve; a failing reward function, a batch that is no
multiple of the groups and --compile_for's plan. The loss itself against TRL's: tests/test_grpo_loss.py; rewards
and advantages: tests/test_grpo_rewards.py."""
import json
import shutil

import numpy as np
import pytest

import run_grpo
from run_helpers import read_metrics
from flaxlm.errors import UserError, run_main

QUESTIONS = [{"prompt": f"Hva er {a}+{b}?", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 5)]
REWARDS = '''
def brevity(prompts, completions, completion_ids, answer, **kwargs):
    return [1.0 / (1 + len(ids)) if a != "3" else None for ids, a in zip(completion_ids, answer)]


CALLS = []


def boom(prompts, completions, **kwargs):
    raise RuntimeError("boom")


def never(prompts, completions, **kwargs):
    return [None] * len(prompts)


def broken(prompts, completions, **kwargs):
    CALLS.append(1)
    if len(CALLS) > 2:  # the third round's batch (and each completion of it, tried alone)
        raise ValueError("no reward today")
    return [0.0] * len(prompts)
'''


@pytest.fixture(scope="module")
def checkpoint(tiny_gpt2_dir, tmp_path_factory):
    """A tiny GPT-2 of random weights, dropout off, saved by transformers with our tokenizer."""
    import torch
    import transformers
    d = tmp_path_factory.mktemp("grpo-model")
    shutil.copytree(tiny_gpt2_dir, d, dirs_exist_ok=True)
    config = transformers.AutoConfig.from_pretrained(d, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("grpo-data")
    (d / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    (d / "rewards.py").write_text(REWARDS, encoding="utf-8")
    return d


def argv(checkpoint, data, out, *extra):
    """8 completions a step (2 prompts x 4), of at most 8 tokens, one per device."""
    return ["--output_dir", str(out), "--model_name_or_path", checkpoint, "--train_file", str(data / "q.jsonl"),
            "--validation_split_percentage", "20", "--num_generations", "4", "--max_completion_length", "8",
            "--per_device_train_batch_size", "1", "--max_steps", "4", "--logging_steps", "1", "--eval_steps", "4",
            "--learning_rate", "1e-3", "--report_to", "none", "--soft_punish_cache", "2", *extra]


def test_a_run_logs_trls_figures_and_samples_and_exports(checkpoint, data, tmp_path):
    import transformers
    out = tmp_path / "run"
    run_grpo.main(argv(checkpoint, data, out, "--reward_funcs", "token_f1", f"{data / 'rewards.py'}:brevity",
                       "--reward_weights", "1", "0.5", "--log_completions_steps", "2", "--beta", "0.04"))
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for name in ("loss", "reward", "reward_std", "rewards/token_f1/mean", "rewards/brevity/mean",
                 "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio", "kl", "entropy",
                 "clip_ratio/region_mean"):
        assert all(np.isfinite(r[name]) for r in rows), name
    assert all(0 < r["generation_share"] <= 1 for r in rows[1:])  # (the first step compiles: not timed)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first step's policy is the reference
    assert rows[-1]["kl"] > 0  # and moves away from it
    evaluated = read_metrics(out, "eval")[-1]
    assert evaluated["completions"] == 5 and "rewards/token_f1/mean" in evaluated and "loss" not in evaluated
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted({s["step"] for s in samples}) == [2, 4] and len(samples) == 16
    assert {"prompt", "completion", "rewards/token_f1", "rewards/brevity", "advantage"} <= set(samples[0])
    assert any(s["rewards/brevity"] is None for s in samples) or all(s["prompt"] != "Hva er 1+2?" for s in samples)
    transformers.AutoModelForCausalLM.from_pretrained(out)
    assert "GRPO" in (out / "README.md").read_text(encoding="utf-8")


def test_the_completions_are_a_function_of_the_seed_alone(checkpoint):
    """The same key draws the same completions on 8 devices and on 1 (partitionable threefry); another key others."""
    import jax
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.models.generation import left_pad
    from flaxlm.rl.sampling import Sampler
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.training.mesh import make_mesh, replicated
    tok = load_tokenizer(checkpoint)
    graphdef, params = split_model(load_pretrained(checkpoint)[1])
    ids, mask = left_pad([tok(q["prompt"])["input_ids"] for q in QUESTIONS[:8]], 16, tok.eos_token_id)

    def draw(devices, seed):
        mesh = make_mesh(devices)
        sampler = Sampler(graphdef, mesh, max_new_tokens=8, eos_id=None, pad_id=tok.eos_token_id,
                          temperature=1.0, top_k=50, top_p=0.9)
        return sampler(jax.device_put(params, replicated(mesh)), ids, mask, jax.random.key(seed))
    eight = draw(None, 0)
    np.testing.assert_array_equal(eight, draw(jax.devices()[:1], 0))
    assert (eight != draw(None, 1)).mean() > 0.5


def test_a_run_resumed_inside_a_round_continues_the_same_curve(checkpoint, data, tmp_path, capsys):
    """--num_iterations 2: the checkpoint after step 3 is inside round 2, whose completions are read back."""
    from flaxlm.rl.rollout import Rollouts

    def args(out, *extra):
        return argv(checkpoint, data, out, "--num_iterations", "2", "--max_steps", "6", "--save_steps", "3",
                    "--reward_funcs", "token_f1", "length", *extra)
    run_grpo.main(args(tmp_path / "straight"))
    original = Rollouts.batch_rows

    def crash(self, step, local, params):
        if step == 3:
            raise RuntimeError("simulated crash")
        return original(self, step, local, params)
    Rollouts.batch_rows = crash
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_grpo.main(args(tmp_path / "resumed"))
    finally:
        Rollouts.batch_rows = original
    capsys.readouterr()
    run_grpo.main(args(tmp_path / "resumed", "--resume_from_checkpoint", "latest"))
    assert "inside round 2 (its completions read back)" in capsys.readouterr().out
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "reward", "completions/mean_length", "clip_ratio/region_mean"):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in straight], rel=1e-6, abs=1e-7), key
    assert any(r["clip_ratio/region_mean"] > 0 or r["loss"] != 0 for r in straight[1::2])  # the second iteration moved


def test_a_failing_reward_function_is_one_line_naming_it_and_the_prompt_and_the_steps_are_kept(
        checkpoint, data, tmp_path, capsys):
    out = tmp_path / "broken"
    with pytest.raises(UserError, match=r"reward function 'broken' failed with ValueError: no reward today on "
                                        r"prompt \d+ 'Hva er"):
        run_grpo.main(argv(checkpoint, data, out, "--reward_funcs", f"{data / 'rewards.py'}:broken",
                           "--save_steps", "10"))
    assert "saved step 2 to" in capsys.readouterr().out and (out / "checkpoints").exists()
    run_grpo.main(argv(checkpoint, data, out, "--reward_funcs", "token_f1", "--resume_from_checkpoint", "latest"))
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]  # steps 1-2 kept, 3-4 trained after the fix


def test_a_reward_function_failing_in_the_first_round_says_the_rerun_that_works(checkpoint, data, tmp_path, capsys):
    """Nothing trained, so no checkpoint: the line says to rerun with --overwrite_output_dir, and that rerun trains."""
    out = tmp_path / "first"
    with pytest.raises(UserError, match="reward function 'boom' failed"):
        run_grpo.main(argv(checkpoint, data, out, "--reward_funcs", f"{data / 'rewards.py'}:boom", "--max_steps", "1",
                           "--do_eval", "false"))
    said = capsys.readouterr().out
    assert "nothing trained yet; once the error below is fixed, rerun the same command with --overwrite_output_dir" \
        in said
    run_grpo.main(argv(checkpoint, data, out, "--reward_funcs", "token_f1", "--max_steps", "1", "--do_eval", "false",
                       "--overwrite_output_dir"))
    assert [r["step"] for r in read_metrics(out)] == [1]


def test_rewards_that_never_apply_warn_each_round_and_export_nothing(checkpoint, data, tmp_path, capsys):
    """A reward function that returns None (TRL's "does not apply") for every completion of every round: a warning
    line a round, and exit 2 instead of an export of the untrained model; the checkpoints kept."""
    out = tmp_path / "never"
    with pytest.raises(UserError, match=r"^no reward function scored a single completion in the 2 rounds of this run "
                                        r"\(each returned None\): the model got no reward signal, so it was not "
                                        r"exported") as e:
        run_grpo.main(argv(checkpoint, data, out, "--reward_funcs", f"{data / 'rewards.py'}:never",
                           "--max_steps", "2", "--do_eval", "false"))
    assert "\n" not in str(e.value)
    said = capsys.readouterr().out
    assert [line for line in said.splitlines() if "no reward function scored any of round" in line] == [
        f"warning: no reward function scored any of round {r}'s 8 completions (each returned None): its steps "
        f"learn nothing; a function should return a number where it applies" for r in (1, 2)]
    assert (out / "checkpoints").exists() and not (out / "model.safetensors").exists()


def test_the_batch_must_hold_whole_groups_and_a_refused_run_leaves_no_directory(checkpoint, data, tmp_path, capsys):
    """Refused after --output_dir was made (and the inputs read): exit 2, and the directories the run made gone."""
    with pytest.raises(SystemExit) as e:
        run_main(lambda: run_grpo.main(argv(checkpoint, data, tmp_path / "x" / "run", "--num_generations", "3")))
    assert e.value.code == 2 and "no multiple of --num_generations 3" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    (tmp_path / "mine").mkdir()  # a directory of the user's, empty: kept
    with pytest.raises(SystemExit):
        run_main(lambda: run_grpo.main(argv(checkpoint, data, tmp_path / "mine", "--num_generations", "3")))
    assert (tmp_path / "mine").is_dir()


@pytest.mark.parametrize("flags", [[], ["--lora_rank", "4", "--beta", "0.04", "--num_iterations", "2"]],
                         ids=["full", "lora-kl-iterations"])
def test_compile_for_a_slice_plans_sampling_and_the_step_and_writes_nothing(checkpoint, tmp_path, capsys, flags):
    out = tmp_path / "run"
    r = run_grpo.main(["--output_dir", str(out), "--model_name_or_path", checkpoint, "--compile_for", "v5e-4",
                       "--max_prompt_length", "24", "--max_completion_length", "16", "--num_generations", "4",
                       "--per_device_train_batch_size", "2", *flags])
    printed = capsys.readouterr().out
    assert "fits v5e-4" in printed and "generation" in printed and r["eval"]["temporaries"] > 0 and not out.exists()
