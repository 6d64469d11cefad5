"""flaxlm.models.generation and generate.py: greedy parity with transformers' generate, sampling, errors, the script."""
import re

import numpy as np
import pytest

from flaxlm.errors import UserError, run_main
from flaxlm.models.generation import generate
from tests.generation_check import add_noise, assert_greedy_matches_transformers, cut_after_eos

VOCAB = 97


def tiny_gpt2(**overrides):
    from transformers import GPT2Config
    return GPT2Config(**{"vocab_size": VOCAB, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
                         "bos_token_id": 1, "eos_token_id": 2, **overrides})


def hf_gpt2():
    from transformers import GPT2LMHeadModel
    return GPT2LMHeadModel(tiny_gpt2())


def hf_opt(**overrides):
    from transformers import OPTConfig, OPTForCausalLM
    config = OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                       max_position_embeddings=64, pad_token_id=1, bos_token_id=2, eos_token_id=2,
                       **overrides)
    return OPTForCausalLM(config)


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config)


FAMILIES = {
    "gpt2": hf_gpt2,
    "opt": hf_opt,
    "opt-post-norm-projected": lambda: hf_opt(do_layer_norm_before=False, word_embed_proj_dim=16),
    "llama-gqa": hf_llama,
}


def prompts_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(transformers model with noisy random weights, the directory it is saved in)."""
    import torch
    from flaxlm.models import CAUSAL_LM_TYPES
    torch.manual_seed(0)
    hf_model = FAMILIES[request.param]()
    if hf_model.config.model_type not in CAUSAL_LM_TYPES:
        pytest.skip(f"{hf_model.config.model_type} is not a flaxlm causal LM (yet)")
    add_noise(hf_model.eval())
    model_dir = tmp_path_factory.mktemp(request.param)
    hf_model.save_pretrained(model_dir)
    return hf_model, model_dir


def test_greedy_matches_transformers(family):
    hf_model, model_dir = family
    prompts = prompts_of([7, 2, 11, 4])
    tokens = assert_greedy_matches_transformers(hf_model, model_dir, prompts, max_new_tokens=12)
    assert len({t for row in tokens for t in row}) > 2, f"degenerate continuations {tokens}"
    # EOS: a token one row produces early that another row never produces, so rows end at different steps
    eos = next(t for row in tokens for t in row[:6] if any(t not in other for other in tokens))
    ended = assert_greedy_matches_transformers(hf_model, model_dir, prompts, 12, eos_token_id=eos)
    assert ended == [cut_after_eos(row, eos) for row in tokens]
    assert any(len(row) < 12 for row in ended) and any(len(row) == 12 and eos not in row for row in ended)

def test_greedy_up_to_the_last_position(family):
    """A prompt that with the new tokens fills every position: the bucketed cache must not pass the end."""
    hf_model, model_dir = family
    limit = hf_model.config.max_position_embeddings  # GPT-2's n_positions under its common name
    assert_greedy_matches_transformers(hf_model, model_dir, prompts_of([limit - 5, 3], seed=1), 5)


@pytest.fixture(scope="module")
def gpt2_model():
    from flaxlm.models import create_model
    return create_model(tiny_gpt2(initializer_range=0.3), seed=1)


def test_sampling_is_reproducible_and_seeded(gpt2_model):
    prompts = prompts_of([5, 9, 3])
    one = generate(gpt2_model, prompts, 10, temperature=1.0, seed=3).tokens
    assert generate(gpt2_model, prompts, 10, temperature=1.0, seed=3).tokens == one
    assert generate(gpt2_model, prompts, 10, temperature=1.0, seed=4).tokens != one
    greedy = generate(gpt2_model, prompts, 10).tokens
    assert one != greedy
    assert generate(gpt2_model, prompts, 10, temperature=2.0, top_k=1, seed=5).tokens == greedy
    assert generate(gpt2_model, prompts, 10, temperature=1.0, top_p=1e-6, seed=5).tokens == greedy


def _next_token_logits(model, prompt, new):
    """The model's logits for each new token, recomputed without cache or padding: [len(new), V]."""
    seq = np.array([prompt + new], np.int32)
    return np.asarray(model(seq))[0, len(prompt) - 1:-1]


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.5)])
def test_sampling_stays_in_top_k_and_nucleus(gpt2_model, top_k, top_p):
    prompts = prompts_of([6, 2])
    out = generate(gpt2_model, prompts, 16, temperature=1.5, top_k=top_k, top_p=top_p, seed=0).tokens
    for prompt, new in zip(prompts, out):
        for logits_V, token in zip(_next_token_logits(gpt2_model, prompt, new), new):
            order = np.argsort(-logits_V)
            probs = np.exp((logits_V - logits_V.max()) / 1.5)
            probs = probs[order] / probs.sum()
            rank = int(np.nonzero(order == token)[0][0])
            assert rank < (top_k or VOCAB)
            assert probs[:rank].sum() < top_p + 1e-5  # the tokens before it hold less than top_p
    assert len({t for row in out for t in row}) > 4


def test_prompt_too_long(gpt2_model):
    with pytest.raises(UserError, match="prompt of 60 tokens \\+ max_new_tokens 5 exceeds the model's 64 "
                                        "positions; shorten"):
        generate(gpt2_model, prompts_of([60, 3]), 5)
    with pytest.raises(UserError, match="prompt 2 is empty"):
        generate(gpt2_model, [[5], []], 5)


def test_timings(gpt2_model):
    out = generate(gpt2_model, prompts_of([4, 4]), 8)
    assert out.decode_steps == 7 and out.batch == 2 and [len(t) for t in out.tokens] == [8, 8]
    assert out.prefill_seconds > 0 and out.decode_tokens_per_second > 0
    again = generate(gpt2_model, prompts_of([9, 1]), 8)  # same bucket and batch: compiled code is reused
    assert again.compile_seconds < 0.1 < out.compile_seconds


# ----------------------------------------------------------------------------------------------------------
# generate.py


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny byte-level BPE tokenizer and a tiny GPT-2 (random weights) in one directory."""
    from flaxlm.models import create_model, save_pretrained, split_model
    from flaxlm.tokenization.trainers import save_tokenizer, train_bpe
    d = tmp_path_factory.mktemp("gpt2-script")
    lines = ["the quick brown fox jumps over the lazy dog", "def main(): return 0", "hello world, hello flax"] * 5
    tokenizer = train_bpe(iter(lines), vocab_size=300, min_frequency=1)
    save_tokenizer(tokenizer, str(d))
    config = tiny_gpt2(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                       bos_token_id=tokenizer.bos_token_id, initializer_range=0.3)
    save_pretrained(str(d), config, split_model(create_model(config))[1])
    return d


def run_script(argv):
    import generate as script
    run_main(lambda: script.main([str(a) for a in argv]))


def test_script_prints_continuations_and_speed(model_dir, capsys, tmp_path):
    run_script(["--model_name_or_path", model_dir, "--prompt", "hello world", "--prompt", "the quick brown",
                "--max_new_tokens", 6])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "hello world" and out[1].startswith("  -> ")
    assert out[2] == "the quick brown" and out[3].startswith("  -> ")
    assert "tokens/s" in out[4] and "prompt(s)" in out[4]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def main\n\nhello\n", encoding="utf-8")
    run_script(["--model_name_or_path", model_dir, "--prompt_file", prompts, "--max_new_tokens", 4,
                "--do_sample", "--top_k", 5, "--temperature", 0.7, "--seed", 1])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "def main" and out[2] == "hello" and "tokens/s" in out[4]


@pytest.mark.parametrize("case,message", [
    ("missing", "directory .* does not exist"),
    ("bert", "holds a bert model, which does not generate text left to right; pass a causal LM \\(gpt2"),
    ("long", "prompt of .* tokens \\+ max_new_tokens 100 exceeds the model's 64 positions"),
    ("empty", "prompt 2 is empty"),
    ("none", "no prompt given"),
])
def test_script_errors(model_dir, tmp_path, capsys, case, message):
    from transformers import BertConfig
    argv = {"missing": ["--model_name_or_path", tmp_path / "nope", "--prompt", "hi"],
            "bert": ["--model_name_or_path", tmp_path, "--prompt", "hi"],
            "long": ["--model_name_or_path", model_dir, "--prompt", "hello", "--max_new_tokens", 100],
            "empty": ["--model_name_or_path", model_dir, "--prompt", "hi", "--prompt", " "],
            "none": ["--model_name_or_path", model_dir]}[case]
    BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=16).save_pretrained(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        run_script(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert re.search(message, err[0]), err[0]

