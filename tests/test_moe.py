"""The mixture-of-experts block (flaxlm.models.moe) and its families (Qwen3-MoE, Mixtral) beyond the parity table
(tests/test_parity.py checks their logits, loss, exports both ways, strict loading, bfloat16, the KV cache and
greedy generation): the router's choices are transformers', the grouped (dropless, sparse) experts equal every
expert computed for every token, the load-balancing loss and its gradients are transformers', checkpoints with
fused experts load too."""
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
from flaxlm.objectives.clm import clm_objective
from parity import random_hf
from test_parity import CASE
from tpu_compile import compile_for_v5e_8, needs_libtpu

CASES = ["qwen3_moe-experts4-top2-untied", "qwen3_moe-dense-layer0-top3-unnormalized-tied", "mixtral-window4-untied",
         "mixtral-no-window-top3-head_dim12-tied", "qwen2_moe-experts4-top2-untied",
         "qwen2_moe-dense0-window4-nobias-top3-normalized-tied", "olmoe-experts4-top2-untied",
         "olmoe-clip-gqa-top3-normalized-tied"]


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
    assert len(ours) == len(theirs) == sum(isinstance(layer.mlp, moe.SparseMoE) for layer in model.layers)
    k = config.num_experts_per_tok
    for mine, ref in zip(ours, theirs):
        np.testing.assert_allclose(mine, ref, atol=1e-5)
        _, picked = moe.route(mine, k, getattr(config, "norm_topk_prob", True))  # Mixtral: always renormalized
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


def test_router_losses_and_loads_are_the_references():
    """Over 3 layers of random router logits, with and without a padding mask: the load-balancing loss is
    transformers' load_balancing_loss_func, the z-loss switch_transformers' router_z_loss_func (over the counted
    rows), the most and least loaded expert's share numpy's count of each layer's top k."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func
    rng = np.random.default_rng(1)
    B, T, E, k = 2, 7, 6, 2
    logits = [rng.normal(size=(B * T, E)).astype(np.float32) * 2 for _ in range(3)]
    mask_BT = np.ones((B, T), np.int64)
    mask_BT[1, :3] = 0
    for mask in (None, mask_BT):
        theirs = load_balancing_loss_func(tuple(map(torch.tensor, logits)), E, k,
                                          None if mask is None else torch.tensor(mask))
        stats = moe.statistics([jnp.asarray(x) for x in logits], k, None if mask is None else jnp.asarray(mask))
        assert float(moe.load_balancing_loss(stats, E)) == pytest.approx(float(theirs), rel=1e-6)
        kept = np.ones(B * T, bool) if mask is None else mask.reshape(-1) > 0
        z_ref = router_z_loss_func(torch.tensor(np.concatenate([x[kept] for x in logits]))[None])
        assert float(moe.z_loss(stats)) == pytest.approx(float(z_ref), rel=1e-6)
        shares = [np.bincount(np.argsort(-x[kept], -1)[:, :k].reshape(-1), minlength=E) / (kept.sum() * k)
                  for x in logits]
        assert float(stats["load_max"]) == pytest.approx(max(s.max() for s in shares), rel=1e-6)
        assert float(stats["load_min"]) == pytest.approx(min(s.min() for s in shares), rel=1e-6)


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
    for hf_name, path, kind in models.family_of(config).tensor_names(config):
        g = np.asarray(get_path(grads, path))
        g = g.T if kind == "linear" else g
        ref_g = torch_grads[hf_name].grad.numpy()
        np.testing.assert_allclose(g, ref_g, atol=1e-5, rtol=1e-3, err_msg=hf_name)
    assert np.abs(np.asarray(get_path(grads, ("layers", "1", "mlp", "gate")))).max() > 1e-4


@pytest.mark.parametrize("name", ["qwen3_moe-experts4-top2-untied", "mixtral-window4-untied",
                                  "olmoe-experts4-top2-untied", "qwen2_moe-experts4-top2-untied"])
def test_fused_expert_checkpoint_loads(name, tmp_path):
    """A checkpoint holding transformers' fused mlp.experts.gate_up_proj / down_proj (its in-memory state dict;
    Mixtral's router mlp.gate.weight, not the hub's block_sparse_moe.gate.weight) loads as the per-expert one does."""
    case = CASE[name]
    hf = random_hf(case)
    hf.save_pretrained(tmp_path / "per_expert")
    hf.config.save_pretrained(tmp_path / "fused")
    save_file({k: v.numpy() for k, v in hf.state_dict().items()}, str(tmp_path / "fused" / "model.safetensors"))
    _, per_expert = models.load_pretrained(tmp_path / "per_expert")
    _, fused = models.load_pretrained(tmp_path / "fused")
    jax.tree.map(np.testing.assert_array_equal, models.split_model(per_expert)[1], models.split_model(fused)[1])


@pytest.mark.parametrize("execution", [Execution(scan=True), Execution(remat="full"),
                                       Execution(scan=True, remat="dots_saveable")], ids=str)
def test_router_losses_under_scan_and_remat_are_the_loops(execution):
    """The router statistics travel through --scan_layers and remat (layer_stack.Carried): the loss with the
    load-balancing and z-losses, the router metrics and the gradients equal the plain loop's."""
    config = CASE["qwen3_moe-experts4-top2-untied"].config(output_router_logits=True, router_aux_loss_coef=0.5)
    config.router_z_loss_coef = 0.1
    x = ids(config, shape=(2, 12))

    def loss_and_grads(model):
        graphdef, params = models.split_model(model)
        objective = clm_objective(graphdef, config, params, x.shape[1], config.eos_token_id)
        batch = objective.collate(x)
        return jax.value_and_grad(lambda p: (lambda s: (s["loss_sum"], s))(objective.loss_sums(p, batch, None)),
                                  has_aux=True)(params)

    (_, loop), loop_grads = loss_and_grads(models.create_model(config, seed=1))
    (_, other), other_grads = loss_and_grads(models.create_model(config, seed=1, execution=execution))
    assert set(loop) >= {"aux_loss_sum", "router_z_loss_sum", "expert_load_max_sum", "expert_load_min_sum"}
    for key in loop:
        np.testing.assert_allclose(other[key], loop[key], rtol=1e-5, err_msg=key)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), other_grads, loop_grads)


def test_config_errors_name_the_field():
    config = CASE["qwen3_moe-experts4-top2-untied"].config(num_experts_per_tok=5)
    with pytest.raises(UserError, match="num_experts_per_tok 5"):
        models.create_model(config)


def test_olmoe_config_errors_name_the_field():
    """OLMoE: heads that do not fill hidden_size (transformers' q_norm is hidden_size wide) and no experts."""
    case = CASE["olmoe-experts4-top2-untied"]
    with pytest.raises(UserError, match="head_dim 12 must equal hidden_size 32"):
        models.create_model(case.config(head_dim=12))
    with pytest.raises(UserError, match="num_experts 0"):
        models.create_model(case.config(num_experts=0))


def test_sparse_layers_follow_transformers():
    """mlp_only_layers and decoder_sparse_step pick the same dense and sparse layers as transformers'."""
    config = CASE["qwen3_moe-experts4-top2-untied"].config(num_hidden_layers=5, decoder_sparse_step=2,
                                                          mlp_only_layers=[3])
    with torch.device("meta"):
        hf = transformers.Qwen3MoeForCausalLM(config)
    theirs = [hasattr(layer.mlp, "experts") for layer in hf.model.layers]
    ours = [isinstance(layer.mlp, moe.SparseMoE) for layer in models.create_model(config).layers]
    assert ours == theirs == [False, True, False, False, False]


def test_qwen2_moe_layers_follow_transformers():
    """Qwen2-MoE: the sparse layers (decoder_sparse_step, mlp_only_layers) hold the shared expert, and the sliding
    windows fall where transformers' config puts them (use_sliding_window: the even layers below
    max_window_layers, unlike Qwen2's rule), as transformers' own layers say."""
    config = CASE["qwen2_moe-experts4-top2-untied"].config(
        num_hidden_layers=5, decoder_sparse_step=2, mlp_only_layers=[3], use_sliding_window=True, sliding_window=4,
        max_window_layers=3)
    with torch.device("meta"):
        hf = transformers.Qwen2MoeForCausalLM(config)
    theirs = [(hasattr(layer.mlp, "shared_expert"), getattr(layer.self_attn, "sliding_window", None))
              for layer in hf.model.layers]
    ours = [(hasattr(layer.mlp, "shared_expert"), layer.attn.window) for layer in models.create_model(config).layers]
    assert ours == theirs == [(False, 4), (True, None), (False, 4), (False, None), (False, None)]


@pytest.mark.parametrize("groups", [2, 4])
def test_expert_parallel_equals_one_device(groups):
    """--sharding expert on 8 devices, a ('data', 'expert') mesh of 8 / groups x groups: each device holds
    4 / groups whole experts (and a 'data' share of them) and runs only those, yet the loss with the router's
    losses and every gradient equal one device's."""
    from flaxlm.training import mesh as meshlib
    from flaxlm.training.sharding import state_shardings
    config = CASE["qwen3_moe-experts4-top2-untied"].config(output_router_logits=True, router_aux_loss_coef=0.5)
    graphdef, params = models.split_model(models.create_model(config, seed=1))
    x = ids(config, shape=(8, 12))
    objective = clm_objective(graphdef, config, params, x.shape[1], config.eos_token_id)
    batch = objective.collate(x)
    grad = jax.jit(jax.value_and_grad(lambda p, b: objective.loss_sums(p, b, None)["loss_sum"]))
    loss, grads = grad(params, batch)

    mesh = meshlib.make_mesh(expert=groups)
    assert dict(mesh.shape) == {"data": 8 // groups, "expert": groups}
    shardings = state_shardings(params, mesh, "expert")
    sharded = jax.device_put(params, shardings)
    experts = get_path(sharded, ("layers", "0", "mlp", "gate_up_proj"))
    assert experts.addressable_shards[0].data.shape[0] == 4 // groups  # whole experts, E / groups of them
    on_devices = jax.device_put(batch, meshlib.batch_sharding(mesh))
    loss_ep, grads_ep = meshlib.on_mesh(grad, mesh)(sharded, on_devices)
    assert float(loss_ep) == pytest.approx(float(loss), rel=1e-5)
    # the sums run in another order over the devices: float32 rounding, a few ulps of the largest gradients
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-6), grads_ep, grads)


def test_a_run_with_expert_sharding_learns_as_the_fsdp_run(model_dir_for, corpus, tmp_path):
    """run_clm_flax.py on 8 devices, layers scanned, with the load-balancing and z-losses: --sharding expert (the
    preset's 8 experts one a device by default) logs the same loss and router metrics, step by step, as fsdp."""
    import run_clm_flax
    from run_helpers import read_metrics, run_args
    model_dir = model_dir_for("qwen3-moe-tiny")
    logged = {}
    for mode in ("fsdp", "expert"):
        run_clm_flax.main(run_args(model_dir, corpus, tmp_path / mode, "--block_size", "32", "--max_steps", "3",
                                   "--do_eval", "false", "--learning_rate", "3e-3", "--sharding", mode,
                                   "--scan_layers", "--output_router_logits", "true", "--router_z_loss_coef",
                                   "0.01"))
        logged[mode] = [m for m in read_metrics(tmp_path / mode) if m["split"] == "train"]
    assert len(logged["expert"]) == 3
    for fsdp, expert in zip(logged["fsdp"], logged["expert"]):
        for key in ("loss", "aux_loss", "router_z_loss", "expert_load_max", "expert_load_min"):
            assert expert[key] == pytest.approx(fsdp[key], rel=1e-4), key
    assert 1 / 8 < logged["fsdp"][0]["expert_load_max"] <= 1 and logged["fsdp"][0]["expert_load_min"] < 1 / 8


@needs_libtpu
def test_expert_sharding_compiles_for_a_v5e_8(model_dir_for, corpus, capsys):
    """--compile_for plans --sharding expert: 2 expert groups of 4 chips, each chip holding 2 of the 8 experts."""
    r = compile_for_v5e_8("qwen3_moe", model_dir_for("qwen3-moe-tiny"), corpus, "xla", 32,
                          "--sharding", "expert", "--expert_parallel_size", "4", "--do_eval", "false")
    out = capsys.readouterr().out
    assert "fits v5e-8" in out and "--sharding expert" in out
    assert r["kernels"] > 0  # the local experts' grouped matmuls: libtpu's Mosaic kernels
