"""Group advantages of GRPO (run_grpo.py) as TRL's GRPOTrainer computes them (multi_objective_aggregation
"sum_then_normalize", its default), in float32 as TRL does:

    reward_i      the weighted sum of completion i's rewards over the functions that gave one (NaN if none did)
    A_i           (reward_i - mean of its group) / (std + 1e-4)    std: of its group (scale_rewards "group"), of the
                                                                   whole batch ("batch"); "none": no division
    A_i = 0       where reward_i is NaN (a completion no function scored carries no signal)

A group is num_generations consecutive rows (one prompt's completions); means and stds skip NaN, the stds unbiased
(TRL's nanstd). Logged with TRL's names: reward, reward_std, rewards/NAME/mean, rewards/NAME/std,
frac_reward_zero_std (the share of completions whose std, the one their advantage is divided by, is 0).
"""
import warnings

import numpy as np


def nanstd(x, axis=None):
    """TRL's nanstd: the standard deviation over the values that are not NaN with Bessel's correction (NaN with
    fewer than two)."""
    with warnings.catch_warnings():  # an all-NaN slice is NaN, as in torch, without numpy's warning
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(x, axis=axis, keepdims=True)
        variance = np.nanmean((x - mean) ** 2, axis=axis)
    count = np.sum(~np.isnan(x), axis=axis)
    correction = np.where(count > 1, count / np.maximum(count - 1, 1), np.nan).astype(np.float32)
    return np.sqrt(variance * correction).astype(np.float32)


def _nanmean(x, axis=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def group_advantages(rewards_NF, weights_F, num_generations, scale_rewards, names):
    """(advantages float32 [N], {metric: float}) of rewards [N, F] (NaN where a function gave None), the functions'
    weights [F] and names [F], N a multiple of num_generations."""
    rewards_NF = np.asarray(rewards_NF, np.float32)
    weights_F = np.asarray(weights_F, np.float32)
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards {scale_rewards!r}: one of group, batch, none")
    unscorable_N = np.isnan(rewards_NF).all(axis=1)
    rewards_N = np.nansum(rewards_NF * weights_F[None], axis=1).astype(np.float32)
    rewards_N[unscorable_N] = np.nan
    rewards_GK = rewards_N.reshape(-1, num_generations)
    mean_N = np.repeat(_nanmean(rewards_GK, axis=1), num_generations)
    if scale_rewards == "batch":
        std_N = np.broadcast_to(nanstd(rewards_N), rewards_N.shape) if rewards_N.size > 1 else np.zeros_like(rewards_N)
    elif num_generations > 1:  # "group", and "none" (whose std only says which groups are all one reward)
        std_N = np.repeat(nanstd(rewards_GK, axis=1), num_generations)
    else:
        std_N = np.zeros_like(rewards_N)
    advantages_N = rewards_N - mean_N
    if scale_rewards != "none":
        advantages_N = advantages_N / (std_N + np.float32(1e-4))
    advantages_N = np.nan_to_num(advantages_N.astype(np.float32), nan=0.0)
    metrics = {}
    for name, column in zip(names, rewards_NF.T):
        metrics[f"rewards/{name}/mean"] = float(_nanmean(column))
        metrics[f"rewards/{name}/std"] = float(nanstd(column))
    metrics["reward"] = float(_nanmean(rewards_N))
    metrics["reward_std"] = float(nanstd(rewards_N))
    metrics["frac_reward_zero_std"] = float(np.isclose(std_N, 0.0).mean())
    return advantages_N, metrics
