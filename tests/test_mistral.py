"""Mistral: what the parity table (tests/test_parity.py) does not cover: greedy generation with prompts and
continuations that pass the sliding window several times (the table's greedy prompts are 7 tokens, a window of 4)."""
import transformers

from generation_check import add_noise, assert_greedy_matches_transformers


def test_greedy_generation_past_the_window_several_times(tmp_path):
    """A window of 4: the 13-token prompt is three windows long and the 10 new tokens slide it twice more, the
    5-token prompt (left-padded to 13) passes it; every token as transformers' generate picks it."""
    import torch
    torch.manual_seed(0)
    config = transformers.MistralConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=37, max_position_embeddings=64,
                                        sliding_window=4, pad_token_id=0)
    hf = add_noise(transformers.MistralForCausalLM(config).eval())
    hf.save_pretrained(tmp_path)
    prompts = [[5, 17, 42, 8, 93, 11, 64, 23, 7, 51, 38, 76, 12], [44, 9, 88, 31, 60]]
    tokens = assert_greedy_matches_transformers(hf, tmp_path, prompts, max_new_tokens=10)
    assert all(len(set(row)) > 2 for row in tokens)  # not one repeated token
