"""Rows as a dict of per-example arrays (fine-tuning): batches, evaluation with per-example predictions."""
import jax.numpy as jnp
import numpy as np
import pytest

from flaxlm.training import mesh as meshlib
from flaxlm.data.rows import ShuffledRows, eval_batches
from flaxlm.training.evaluation import collect_predictions, eval_steps_for, evaluate
from flaxlm.training.objective import Objective


def linear_objective(seen):
    """A one-weight-vector regression: score = x . w, squared error; metrics record what they were given."""
    def loss_sums(params, batch, key):
        err = batch["x"] @ params["w"] - batch["y"]
        return {"loss_sum": jnp.sum(batch["weights"] * err ** 2), "weight_sum": jnp.sum(batch["weights"])}

    def metrics(outputs):
        seen.append(outputs)
        return {"mean_score": float(outputs["score"].mean())}

    return Objective(loss_sums=loss_sums, collate=lambda rows, rng: {**rows, "weights": np.ones(len(rows["y"]),
                                                                                                  np.float32)},
                     pad_id=0, weights_key="weights", flops_per_example=1.0, tokens_per_example=1,
                     predict=lambda params, batch: {"score": batch["x"] @ params["w"], "id": batch["id"]},
                     metrics=metrics)


def test_dict_rows_evaluate_every_real_row_once_in_order():
    rng = np.random.default_rng(0)
    rows = {"x": rng.normal(size=(21, 3)).astype(np.float32), "y": rng.normal(size=21).astype(np.float32),
            "id": np.arange(21, dtype=np.int32)}
    params = {"w": jnp.asarray([0.5, -1.0, 2.0])}
    mesh = meshlib.make_mesh()
    seen = []
    objective = linear_objective(seen)
    eval_step, predict_step = eval_steps_for(objective, mesh, meshlib.replicated(mesh))
    result = evaluate(eval_step, params, objective, rows, 8, mesh, seed=0, predict_step=predict_step)
    score = rows["x"] @ np.asarray(params["w"])
    assert result["loss"] == pytest.approx(float(np.mean((score - rows["y"]) ** 2)), rel=1e-5)
    assert "perplexity" not in result and result["target_tokens"] == 21
    np.testing.assert_array_equal(seen[0]["id"], np.arange(21))  # the 3 padding rows of the last batch dropped
    np.testing.assert_allclose(seen[0]["score"], score, rtol=1e-5)
    assert result["mean_score"] == pytest.approx(float(score.mean()), rel=1e-5)
    got = collect_predictions(params, objective, rows, 16, mesh)
    np.testing.assert_array_equal(got["id"], np.arange(21))

    padded = list(eval_batches(rows, 8, slice(0, 8), pad_id=0))
    assert [int(real.sum()) for _, real in padded] == [8, 8, 5]
    assert padded[-1][0]["x"].shape == (8, 3) and not padded[-1][0]["x"][5:].any()


def test_dict_rows_shuffle_as_one_table():
    rows = {"a": np.arange(10), "b": np.arange(10) * 10}
    batches = ShuffledRows(rows, 4, seed=1)
    assert batches.num_rows == 10 and batches.steps_per_epoch == 2
    got = batches.batch_rows(1, slice(None))
    np.testing.assert_array_equal(got["b"], got["a"] * 10)  # the fields of an example stay together

