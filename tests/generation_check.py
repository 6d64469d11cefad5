"""Greedy generation of our causal LMs checked token for token against transformers' PyTorch generate.

Used by tests/test_parity.py (one case of each causal family) and tests/test_generate.py; add_noise by
tests/parity.py too:

    hf_model = GPT2LMHeadModel(config).eval(); add_noise(hf_model); hf_model.save_pretrained(model_dir)
    assert_greedy_matches_transformers(hf_model, model_dir, prompts, max_new_tokens, eos_token_id=None)
"""
import torch

PAD = 0


def add_noise(hf_model, std=0.3, seed=0):
    """Random weights plus noise, so that a tiny model's greedy continuations are not one repeated token."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)
    return hf_model


def hf_greedy(hf_model, prompts, max_new_tokens, eos_token_id=None):
    """transformers' greedy new tokens per prompt (left-padded batch, pad id PAD), each cut after its EOS.

    transformers' generate builds position_ids as cumsum(attention_mask) - 1 (0 on padding) and adds 1 per
    new token, as flaxlm.models.generation does. eos_token_id None turns EOS off: otherwise generate falls back to
    the model's generation_config.eos_token_id (from config.json), even when a generation_config is passed.
    """
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (P - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    config = hf_model.generation_config
    saved = config.eos_token_id
    config.eos_token_id = eos_token_id
    try:
        with torch.no_grad():
            out = hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                    min_new_tokens=0, pad_token_id=PAD, eos_token_id=eos_token_id)
    finally:
        config.eos_token_id = saved
    return [cut_after_eos(row, eos_token_id) for row in out[:, P:].tolist()]


def cut_after_eos(tokens, eos_token_id):
    if eos_token_id is not None and eos_token_id in tokens:
        return tokens[:tokens.index(eos_token_id) + 1]
    return tokens


def ours_greedy(model_dir, prompts, max_new_tokens, eos_token_id=None):
    from flaxlm.models.generation import generate
    from flaxlm.models import load_pretrained
    _, model = load_pretrained(str(model_dir))
    return generate(model, prompts, max_new_tokens, eos_token_id=eos_token_id, pad_token_id=PAD).tokens


def assert_greedy_matches_transformers(hf_model, model_dir, prompts, max_new_tokens, eos_token_id=None):
    """Our greedy tokens (model loaded from model_dir, where hf_model was saved) equal transformers'."""
    theirs = hf_greedy(hf_model, prompts, max_new_tokens, eos_token_id)
    ours = ours_greedy(model_dir, prompts, max_new_tokens, eos_token_id)
    assert ours == theirs, f"greedy tokens differ from transformers'\nours:   {ours}\ntheirs: {theirs}"
    return ours
