"""Learning-rate schedules (flaxlm.training.schedules): every schedule of transformers' get_scheduler, at every step,
against transformers' own (a torch optimizer stepped through it); their errors; and warmup-stable-decay as a way of
working: a cooldown branched from a stable checkpoint, a run continued past its planned end and a resume inside
each phase, each step for step the losses of a straight run."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import run_clm_flax
from run_helpers import read_metrics, run_args
from flaxlm.errors import UserError
from flaxlm.training.schedules import make_schedule, warmup_steps_of

LR, STEPS = 3e-4, 100
CASES = [("linear", {}), ("cosine", {}), ("cosine", {"num_cycles": 1.5}), ("cosine_with_restarts", {"num_cycles": 3}),
         ("polynomial", {"lr_end": 1e-5, "power": 2.0}), ("polynomial", {}), ("constant", {}),
         ("constant_with_warmup", {}), ("inverse_sqrt", {}), ("inverse_sqrt", {"timescale": 7}),
         ("cosine_with_min_lr", {"min_lr_rate": 0.1}), ("cosine_with_min_lr", {"min_lr": 3e-5, "num_cycles": 0.4}),
         ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
         ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1, "warmup_lr_rate": 0.05}),
         ("warmup_stable_decay", {"num_decay_steps": 20}),
         ("warmup_stable_decay", {"num_decay_steps": 30, "warmup_type": "cosine", "decay_type": "1-sqrt",
                                  "min_lr_ratio": 0.1}),
         ("warmup_stable_decay", {"num_decay_steps": 25, "num_stable_steps": 40, "warmup_type": "1-sqrt",
                                  "decay_type": "linear"})]


def transformers_rates(name, kwargs, warmup):
    """The rate of each of STEPS optimizer steps under transformers' scheduler (stepped after each, as Trainer)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = transformers.get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=STEPS,
                                           scheduler_specific_kwargs=dict(kwargs))
    rates = []
    for _ in range(STEPS):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return np.array(rates)


@pytest.mark.parametrize("warmup", [0, 10])
@pytest.mark.parametrize("name, kwargs", CASES, ids=[f"{n}{sorted(k.items())}" for n, k in CASES])
def test_every_rate_is_transformers(name, kwargs, warmup):
    """float32 factors in [0, 1] times the peak rate: within a few float32 ulps of the peak (6e-8 relative each);
    transformers computes in float64. 1e-6 of the peak, or of the rate, whichever is larger."""
    ours = np.asarray(jax.vmap(make_schedule(name, LR, warmup, STEPS, kwargs))(jnp.arange(STEPS)), np.float64)
    theirs = transformers_rates(name, kwargs, warmup)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6 * LR)


def test_warmup_ratio_and_steps_as_transformers():
    assert warmup_steps_of(0, 0.03, 1000) == 30 and warmup_steps_of(0, 0.031, 1000) == 31  # ceil, as transformers
    assert warmup_steps_of(50, 0.5, 1000) == 50  # steps win
    assert warmup_steps_of(0, 0.0, 1000) == 0


@pytest.mark.parametrize("name, kwargs, message", [
    ("cosinus", None, r"^--lr_scheduler_type cosinus is not one of transformers' schedules; pass one of linear, "),
    ("reduce_lr_on_plateau", None, r"follows an evaluation metric.*use cosine or warmup_stable_decay$"),
    ("cosine", '{"num_cycle": 1}', r"^--lr_scheduler_kwargs: cosine takes no num_cycle \(it takes: num_cycles\)$"),
    ("linear", '{"power": 2}', r"linear takes no power \(it takes: none\)"),
    ("cosine", "{num_cycles: 1}", r"^--lr_scheduler_kwargs '\{num_cycles: 1\}' is not JSON \("),
    ("cosine", "[0.5]", r"is not a JSON object"),
    ("warmup_stable_decay", None, r"warmup_stable_decay needs num_decay_steps"),
    ("warmup_stable_decay", '{"num_decay_steps": 200}', r"num_decay_steps 200 leaves no room in --max_steps 100"),
    ("warmup_stable_decay", '{"num_decay_steps": 2, "decay_type": "exp"}', r"decay_type 'exp' is none of linear"),
    ("cosine_with_min_lr", None, r"cosine_with_min_lr needs min_lr or min_lr_rate"),
    ("polynomial", '{"lr_end": 1}', r"lr_end 1 must be below --learning_rate"),
])
def test_a_bad_schedule_is_one_line(name, kwargs, message):
    with pytest.raises(UserError, match=message) as e:
        make_schedule(name, LR, 0, STEPS, kwargs)
    assert "\n" not in str(e.value)


# Warmup-stable-decay as a way of working, on a tiny GPT-2: 2 warmup steps, the peak, a cooldown of 3.


@pytest.fixture(scope="module")
def model_dir(model_dir_for):
    return model_dir_for("gpt2-tiny")


def wsd_run(model_dir, corpus, out, max_steps, decay, *flags, save_steps=100):
    """The run's {step: (loss, rate)}; a checkpoint every save_steps steps (a save is ~0.9 s of a test's time here:
    only the runs resumed from save more than their last step)."""
    args = run_args(model_dir, corpus, out, "--block_size", "32", "--learning_rate", "3e-3", "--max_steps",
                    str(max_steps), "--save_steps", str(save_steps), "--do_eval", "false", "--lr_scheduler_type",
                    "warmup_stable_decay", "--lr_scheduler_kwargs", f'{{"num_decay_steps": {decay}}}', *flags)
    run_clm_flax.main(args)
    return {r["step"]: (r["loss"], r["learning_rate"]) for r in read_metrics(out)}


def test_wsd_branches_a_cooldown_continues_and_resumes_as_a_straight_run(model_dir, corpus, tmp_path):
    """The straight run: 8 steps, the last 3 the cooldown. A long run (12 steps, cooldown from step 10) is the same
    through its stable phase; a branch from its step-4 checkpoint with --max_steps 8 cools down exactly as the
    straight run; the long run continued from step 6 to a later end (14) stays at the peak where its plan cooled
    down; a resume of the straight run inside its warmup (step 1) and cooldown (step 6) gives the same steps (the
    branch and the continued run are resumes inside the stable phase). Exactly: the same programs on the same state
    (a rate of the same value)."""
    straight = wsd_run(model_dir, corpus, tmp_path / "straight", 8, 3, save_steps=1)
    rates = [straight[s][1] for s in range(1, 9)]
    assert rates[:2] == pytest.approx([0.0, 1.5e-3]) and rates[2:6] == pytest.approx([3e-3] * 4)
    assert rates[5] > rates[6] > rates[7] > 0  # the cooldown: steps 6-8 (transformers' starts at the peak)
    long = wsd_run(model_dir, corpus, tmp_path / "long", 12, 3, save_steps=2)
    assert [long[s] for s in range(1, 6)] == [straight[s] for s in range(1, 6)]
    branch = wsd_run(model_dir, corpus, tmp_path / "branch", 8, 3, "--resume_from_checkpoint",
                     str(tmp_path / "long" / "checkpoints" / "4"))
    assert [branch[s] for s in range(5, 9)] == [straight[s] for s in range(5, 9)]
    continued = wsd_run(model_dir, corpus, tmp_path / "continued", 14, 3, "--resume_from_checkpoint",
                        str(tmp_path / "long" / "checkpoints" / "6"))
    assert [continued[s] for s in range(7, 10)] == [long[s] for s in range(7, 10)]
    assert [continued[s][1] for s in (10, 11, 12)] == pytest.approx([3e-3] * 3) and long[11][1] < 3e-3
    for step in (1, 6):
        resumed = wsd_run(model_dir, corpus, tmp_path / f"resumed{step}", 8, 3, "--resume_from_checkpoint",
                          str(tmp_path / "straight" / "checkpoints" / str(step)))
        assert [resumed[s] for s in range(step + 1, 9)] == [straight[s] for s in range(step + 1, 9)]
