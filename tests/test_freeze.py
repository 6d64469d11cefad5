"""--train_only / --freeze_steps (flaxlm.training.freeze): which parameters 'embeddings' names in each family, no
optimizer state and no update for the frozen ones in the first phase, fresh state for them at the switch, resume
before and after the switch with --sharding fsdp, and the bad input."""
import os
import re
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import run_clm_flax
import run_helpers
from run_helpers import expect_user_error, read_metrics
from flaxlm.config.options import TrainingArgs
from flaxlm.errors import UserError
from flaxlm.data.rows import ShuffledRows
from flaxlm.models import abstract_model, create_model, decay_mask, load_config, save_pretrained, split_model
from flaxlm.models.presets import build_config
from flaxlm.training import mesh as meshlib
from flaxlm.training.checkpoint import checkpoint_root
from flaxlm.training.freeze import Phases, flat_params, trainable_mask
from flaxlm.training.optim import make_optimizer
from flaxlm.training.train_step import initial_state

FREEZE = ["--train_only", "embeddings", "--freeze_steps", "2"]


@pytest.mark.parametrize("preset, expected", [
    ("gpt2-tiny", {"embed/embedding"}),  # tied: the output embeddings are the input ones
    ("llama-tiny", {"embed/embedding", "lm_head/kernel"}),
    ("roberta-tiny", {"embeddings/word/embedding", "mlm_head/bias"}),
    ("t5-v1_1-tiny", {"shared/embedding", "lm_head/kernel"}),
    ("gptj-tiny", {"embed/embedding", "lm_head/kernel", "lm_head/bias"}),
    ("modernbert-tiny", {"embeddings/tok/embedding", "mlm_head/bias"}),
])
def test_embeddings_are_the_vocabulary_sized_parameters_of_each_family(preset, expected):
    config = build_config(preset)
    _, params = abstract_model(config)
    mask = flat_params(trainable_mask(params, ["embeddings"], config.vocab_size))
    assert {p for p, t in mask.items() if t} == expected
    patterns = flat_params(trainable_mask(params, ["embeddings", "final_norm|layers/0/"], config.vocab_size))
    assert {p for p, t in patterns.items() if t} == expected | {p for p in mask if re.search("final_norm|layers/0/", p)}


def test_a_pattern_matching_nothing_names_the_paths_form():
    config = build_config("llama-tiny")
    _, params = abstract_model(config)
    with pytest.raises(UserError, match=r"--train_only lm_haed matches no parameter; patterns are regular "
                                        r"expressions searched in the '/'-joined parameter paths, which here look "
                                        r"like embed/embedding, final_norm/scale, layers/0/"):
        trainable_mask(params, ["embed", "lm_haed"], config.vocab_size)


def test_frozen_parameters_have_no_optimizer_state_until_the_switch():
    """The first phase's optimizer state holds Adam moments for the trained parameters only; the switch keeps
    those and gives the others zero moments (their count at 0), the trained group's count going on, their learning
    rate the schedule's at the switch."""
    config = build_config("llama-tiny")
    _, params = split_model(create_model(config, seed=0))
    trainable = trainable_mask(params, ["embeddings"], config.vocab_size)
    args = TrainingArgs(output_dir="unused", learning_rate=1e-2, warmup_steps=1, freeze_steps=2)
    phases, schedule = make_optimizer(args, 10, decay_mask(params), trainable)
    assert isinstance(phases, Phases) and phases.switch_step == 2
    mesh = meshlib.make_mesh(jax.devices()[:1])
    state, _ = initial_state(params, phases[0].tx, mesh, "data")
    trained = [x for p, x in flat_params(params).items() if flat_params(trainable)[p]]
    moments = [x for x in jax.tree.leaves(state["opt_state"]) if x.ndim > 0]
    assert len(trained) == 2 and sorted(x.shape for x in moments) == sorted(2 * [x.shape for x in trained])
    grads = jax.tree.map(np.ones_like, params)
    updates, opt_state = phases[0].tx.update(grads, state["opt_state"], params)
    assert all(not np.any(u) for p, u in flat_params(updates).items() if not flat_params(trainable)[p])
    kept = jax.tree.map(np.asarray, opt_state[1].inner_states["train"])
    switched, _ = phases.switch({**state, "opt_state": opt_state}, mesh, "data")  # donates the state
    moments_after = [x for x in jax.tree.leaves(switched["opt_state"]) if x.ndim > 0]
    assert len(moments_after) == 2 * len(jax.tree.leaves(params))
    inner = switched["opt_state"][1].inner_states
    assert int(inner["train"].inner_state[0].count) == 1 and int(inner["frozen"].inner_state[0].count) == 0
    assert all(not np.any(m) for m in jax.tree.leaves(inner["frozen"].inner_state[0].mu))
    jax.tree.map(np.testing.assert_array_equal, inner["train"], kept)
    updates, _ = phases[1].tx.update(grads, switched["opt_state"], switched["params"])
    # Adam's first step moves each newly trained parameter by the learning rate the run's schedule has reached
    np.testing.assert_allclose(flat_params(updates)["final_norm/scale"], -schedule(2), rtol=1e-4)



@pytest.fixture(scope="module")
def pretrained(tiny_gpt2_dir, tmp_path_factory):
    """A gpt2-tiny checkpoint (our tokenizer, 304 tokens) of known weights: (its directory, its params)."""
    d = tmp_path_factory.mktemp("pretrained")
    shutil.copytree(tiny_gpt2_dir, d, dirs_exist_ok=True)
    config = load_config(str(d))
    _, params = split_model(create_model(config, seed=0))
    params = jax.tree.map(np.asarray, params)
    save_pretrained(str(d), config, params)
    return str(d), params


def run_args(model_dir, corpus, out, *extra):
    return run_helpers.run_args(model_dir, corpus, out, "--block_size", "32", "--learning_rate", "3e-3",
                                "--max_steps", "5", "--do_eval", "false", *extra, model_flag="--model_name_or_path")


def checkpoint_params(out, step):
    """The params of OUTPUT_DIR/checkpoints/STEP, as numpy, whatever the optimizer state's form."""
    path = os.path.join(checkpoint_root(str(out)), str(step), "state")
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(path)
    return flat_params(jax.tree.map(np.asarray, state["params"]))


def test_frozen_parameters_stay_bit_identical_then_train_and_resume_matches(pretrained, corpus, tmp_path,
                                                                            monkeypatch):
    """--train_only embeddings --freeze_steps 2 with --sharding fsdp over 8 devices: after 2 steps every other
    parameter is bit-identical to the checkpoint's, after step 3 every parameter has changed; a run crashed after
    step 2 (its state the first phase's, the switch next) or 4 (the second phase's) and resumed gives every loss
    of the uninterrupted run."""
    model_dir, initial = pretrained

    def args_for(out, *extra):
        return run_args(model_dir, corpus, out, "--save_steps", "1", "--sharding", "fsdp", *FREEZE, *extra)

    run_clm_flax.main(args_for(tmp_path / "straight"))
    initial = flat_params(initial)
    at_switch, after = checkpoint_params(tmp_path / "straight", 2), checkpoint_params(tmp_path / "straight", 3)
    for path, value in initial.items():
        if path == "embed/embedding":
            assert not np.array_equal(at_switch[path], value)
        else:
            np.testing.assert_array_equal(at_switch[path], value, err_msg=path)  # bit-identical after 2 steps
        assert not np.array_equal(after[path], at_switch[path]), path  # step 3 trains everything
    straight = [r["loss"] for r in read_metrics(tmp_path / "straight")]
    assert len(straight) == 5 and all(np.isfinite(straight))

    original = ShuffledRows.batch_rows
    for crash_step in (2, 4):
        out = tmp_path / f"crash{crash_step}"

        def crash(self, step, local):
            if step == crash_step:
                raise RuntimeError("simulated crash")
            return original(self, step, local)

        with monkeypatch.context() as m:
            m.setattr(ShuffledRows, "batch_rows", crash)
            with pytest.raises(RuntimeError, match="simulated crash"):
                run_clm_flax.main(args_for(out))
        run_clm_flax.main(args_for(out, "--resume_from_checkpoint", "latest"))
        resumed = read_metrics(out)
        assert [r["step"] for r in resumed] == list(range(1, 6))
        assert [r["loss"] for r in resumed] == pytest.approx(straight, rel=1e-6), crash_step


def test_bad_input_is_one_line(pretrained, corpus, tmp_path):
    model_dir, _ = pretrained
    expect_user_error(run_clm_flax.main, run_args(model_dir, corpus, tmp_path / "a", "--freeze_steps", "3"),
                      r"^--freeze_steps 3 trains only the --train_only parameters for that many steps; pass "
                      r"--train_only embeddings")
    assert not (tmp_path / "a").exists()
    expect_user_error(run_clm_flax.main, run_args(model_dir, corpus, tmp_path / "b", "--train_only", "lm_head"),
                      r"^--train_only lm_head matches no parameter; .* look like embed/embedding, ")
    expect_user_error(run_clm_flax.main, run_args(model_dir, corpus, tmp_path / "c", "--train_only", "(embed"),
                      r"^--train_only '\(embed' is not a regular expression")

