"""The mixture-of-experts block (flaxlm.models.moe) and Qwen3-MoE beyond the parity table (tests/test_parity.py
checks its logits, loss, exports both ways, strict loading, bfloat16, the KV cache and greedy generation): the
router's choices are transformers', the grouped (dropless, sparse) experts equal every expert computed for every
token, the load-balancing loss and its gradients are transformers', checkpoints with fused experts load too."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models import moe
from flaxlm.models.convert import get_path
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import activation
from flaxlm.models.qwen3_moe import sparse_layer, tensor_names
from flaxlm.objectives.clm import clm_objective
from parity import random_hf
from test_parity import CASE

CASES = ["qwen3_moe-experts4-top2-untied", "qwen3_moe-dense-layer0-top3-unnormalized-tied"]


def ids(config, seed=0, shape=(2, 12)):
    return np.random.default_rng(seed).integers(3, config.vocab_size, shape)


@pytest.mark.parametrize("name", CASES)
def test_router_logits_and_choices_are_transformers(name, tmp_path):
    """Each sparse layer's router logits within 1e-5 of transformers' (output_router_logits), and the same k
    experts picked for every token."""
    case = CASE[name]
    hf = random_hf(case)
    hf.save_pretrained(tmp_path)
    config, model = models.load_pretrained(tmp_path)
    x = ids(config)
    with torch.no_grad():
        theirs = [t.numpy() for t in hf(input_ids=torch.tensor(x), output_router_logits=True).router_logits]
    with moe.router_logits() as ours:
        model(jnp.asarray(x))
    assert len(ours) == len(theirs) == sum(sparse_layer(config, i) for i in range(config.num_hidden_layers))
    k = config.num_experts_per_tok
    for mine, ref in zip(ours, theirs):
        np.testing.assert_allclose(mine, ref, atol=1e-5)
        _, picked = moe.route(mine, k, config.norm_topk_prob)
        _, ref_picked = torch.topk(torch.softmax(torch.tensor(ref), -1), k)
        np.testing.assert_array_equal(np.sort(np.asarray(picked), -1), np.sort(ref_picked.numpy(), -1))


def test_grouped_experts_equal_every_expert_on_every_token():
    """The dropless guarantee: the sorted, grouped matmuls (one expert receiving no token, one most of them) give
    what every expert computed for every token and weighted by the routing gives, and the same gradients."""
    rng = np.random.default_rng(0)
    M, D, I, E, K = 40, 16, 8, 6, 2
    x_MD = jnp.asarray(rng.normal(size=(M, D)), jnp.float32)
    experts_MK = np.stack([rng.choice(E - 1, K, replace=False) for _ in range(M)]).astype(np.int32)
    experts_MK[:25, 0] = 2  # expert 2 gets most tokens, expert 5 none
    experts_MK[:25, 1] = np.where(experts_MK[:25, 1] == 2, 3, experts_MK[:25, 1])
    assert not (experts_MK == E - 1).any()
    weights_MK = jnp.asarray(rng.uniform(size=(M, K)), jnp.float32)
    gate_up = jnp.asarray(rng.normal(size=(E, 2 * I, D)) * 0.3, jnp.float32)
    down = jnp.asarray(rng.normal(size=(E, D, I)) * 0.3, jnp.float32)
    act = activation("silu")

    def loss(fn, *args):
        return (fn(args[0], jnp.asarray(experts_MK), *args[1:], act, jnp.float32) ** 2).sum()

    grouped = moe.grouped_swiglu(x_MD, jnp.asarray(experts_MK), weights_MK, gate_up, down, act, jnp.float32)
    dense = moe.dense_swiglu(x_MD, jnp.asarray(experts_MK), weights_MK, gate_up, down, act, jnp.float32)
    np.testing.assert_allclose(grouped, dense, atol=1e-5)
    assert float(jnp.abs(dense).max()) > 0.5
    g_grouped = jax.grad(lambda *a: loss(moe.grouped_swiglu, *a), argnums=(0, 1, 2, 3))(x_MD, weights_MK, gate_up,
                                                                                       down)
    g_dense = jax.grad(lambda *a: loss(moe.dense_swiglu, *a), argnums=(0, 1, 2, 3))(x_MD, weights_MK, gate_up, down)
    for a, b in zip(g_grouped, g_dense):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-5)
    assert float(jnp.abs(g_grouped[2][E - 1]).max()) == 0.0  # the idle expert gets no gradient


def test_load_balancing_loss_is_transformers():
    """Over 3 layers of random router logits, with and without a padding mask."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    rng = np.random.default_rng(1)
    B, T, E, k = 2, 7, 6, 2
    logits = [rng.normal(size=(B * T, E)).astype(np.float32) * 2 for _ in range(3)]
    mask_BT = np.ones((B, T), np.int64)
    mask_BT[1, :3] = 0
    for mask in (None, mask_BT):
        theirs = load_balancing_loss_func(tuple(map(torch.tensor, logits)), E, k,
                                          None if mask is None else torch.tensor(mask))
        ours = moe.load_balancing_loss([jnp.asarray(x) for x in logits], E, k,
                                       None if mask is None else jnp.asarray(mask))
        assert float(ours) == pytest.approx(float(theirs), rel=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_loss_with_aux_loss_and_gradients_are_transformers(name, tmp_path):
    """output_router_logits: run_clm_flax.py's objective gives transformers' loss from labels (the mean
    cross-entropy plus router_aux_loss_coef times the load-balancing loss), and its gradient (divided by the token
    count, as the train step does) is transformers' for every tensor: the router's, the experts', the rest."""
    case = CASE[name]
    hf = random_hf(case)
    # a weight that shows in the loss (the model keeps its own copy of the coefficient from construction)
    hf.config.output_router_logits, hf.config.router_aux_loss_coef = True, 0.5
    hf.router_aux_loss_coef = 0.5
    hf.save_pretrained(tmp_path)
    config, model = models.load_pretrained(tmp_path)
    assert config.output_router_logits and config.router_aux_loss_coef == 0.5
    x = ids(config, seed=2)
    ref = hf.eval()(input_ids=torch.tensor(x), labels=torch.tensor(x))  # eval: no attention dropout
    ref.loss.backward()
    graphdef, params = models.split_model(model)
    objective = clm_objective(graphdef, config, params, x.shape[1], config.eos_token_id)
    batch = objective.collate(x)

    def mean_loss(p):
        sums = objective.loss_sums(p, batch, None)
        return sums["loss_sum"] / sums["weight_sum"], sums

    (loss, sums), grads = jax.value_and_grad(mean_loss, has_aux=True)(params)
    assert float(loss) == pytest.approx(ref.loss.item(), abs=1e-5)
    assert float(sums["aux_loss_sum"] / sums["weight_sum"]) == pytest.approx(ref.aux_loss.item(), rel=1e-5)
    assert float(ref.aux_loss) * 0.5 > 1e-2  # the aux loss weighs in the comparison
    torch_grads = dict(hf.named_parameters())
    for hf_name, path, kind in tensor_names(config):
        g = np.asarray(get_path(grads, path))
        g = g.T if kind == "linear" else g
        ref_g = torch_grads[hf_name].grad.numpy()
        np.testing.assert_allclose(g, ref_g, atol=1e-5, rtol=1e-3, err_msg=hf_name)
    assert np.abs(np.asarray(get_path(grads, ("layers", "1", "mlp", "gate")))).max() > 1e-4


def test_fused_expert_checkpoint_loads(tmp_path):
    """A checkpoint holding transformers' fused mlp.experts.gate_up_proj / down_proj (its in-memory state dict)
    loads as the per-expert one does."""
    case = CASE["qwen3_moe-experts4-top2-untied"]
    hf = random_hf(case)
    hf.save_pretrained(tmp_path / "per_expert")
    hf.config.save_pretrained(tmp_path / "fused")
    save_file({k: v.numpy() for k, v in hf.state_dict().items()}, str(tmp_path / "fused" / "model.safetensors"))
    _, per_expert = models.load_pretrained(tmp_path / "per_expert")
    _, fused = models.load_pretrained(tmp_path / "fused")
    jax.tree.map(np.testing.assert_array_equal, models.split_model(per_expert)[1], models.split_model(fused)[1])


def test_layers_scan_and_the_aux_loss_needs_the_loop():
    """Identical sparse layers scan to the loop's logits; the load-balancing loss under --scan_layers is a
    UserError naming the fix."""
    config = CASE["qwen3_moe-experts4-top2-untied"].config()
    x = jnp.asarray(ids(config))
    loop = models.create_model(config, seed=1)
    scanned = models.create_model(config, seed=1, execution=Execution(scan=True))
    np.testing.assert_allclose(scanned(x), loop(x), atol=1e-5)
    with pytest.raises(UserError, match="--scan_layers"), moe.router_logits():
        scanned(x)


def test_config_errors_name_the_field():
    config = CASE["qwen3_moe-experts4-top2-untied"].config(num_experts_per_tok=5)
    with pytest.raises(UserError, match="num_experts_per_tok 5"):
        models.create_model(config)


def test_sparse_layers_follow_transformers():
    """mlp_only_layers and decoder_sparse_step pick the same dense and sparse layers as transformers'."""
    config = CASE["qwen3_moe-experts4-top2-untied"].config(num_hidden_layers=5, decoder_sparse_step=2,
                                                          mlp_only_layers=[3])
    with torch.device("meta"):
        hf = transformers.Qwen3MoeForCausalLM(config)
    theirs = [hasattr(layer.mlp, "experts") for layer in hf.model.layers]
    ours = [isinstance(layer.mlp, moe.SparseMoE) for layer in models.create_model(config).layers]
    assert ours == theirs == [False, True, False, False, False]
