"""Supervised fine-tuning (run_sft.py): which tokens are trained on, against masks built by hand for ChatML and for
templates in the shapes the families use; the loss TRL's SFTTrainer computes on the same tiny checkpoint and
examples; a packed row computing each conversation as alone; the export rendering what training saw; bad input."""
import json
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import run_sft
from run_helpers import expect_user_error, read_metrics
from flaxlm.data.chat_rows import best_fit, encode, report_line, sft_rows
from flaxlm.data.conversations import Example, example
from flaxlm.errors import UserError
from flaxlm.data.chat_template import CHATML, end_of_turn, missing_markers

SYSTEM = {"role": "system", "content": "Svar kort."}
TURNS = [{"role": "user", "content": "Hva er hovedstaden i Norge?"}, {"role": "assistant", "content": "Oslo."},
         {"role": "user", "content": "Og i Sverige?"}, {"role": "assistant", "content": "Stockholm."}]

# Templates in the shapes the families use, each with the pieces it renders a conversation into, by hand:
# (text, trained) in order; an answer's piece holds what ends its turn.
LLAMA2 = ("{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}{% if m['role'] == 'system' %}"
          "{% set ns.sys = m['content'] + '\n\n' %}{% elif m['role'] == 'user' %}[INST] {{ ns.sys }}{{ m['content'] }} "
          "[/INST]{% set ns.sys = '' %}{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
GEMMA = ("{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}{% if m['role'] == 'system' %}"
         "{% set ns.sys = m['content'] + '\n\n' %}{% else %}<start_of_turn>"
         "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ ns.sys }}{{ m['content'] | trim }}<end_of_turn>\n"
         "{% set ns.sys = '' %}{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def chatml_pieces(messages):
    out = []
    for m in messages:
        head = f"<|im_start|>{m['role']}\n"
        out += [(head, 0), (m["content"] + "<|im_end|>\n", 1)] if m["role"] == "assistant" else [
            (head + m["content"] + "<|im_end|>\n", 0)]
    return _merged(out)


def llama2_pieces(messages):
    sys_ = messages[0]["content"] + "\n\n" if messages[0]["role"] == "system" else ""
    turns = [m for m in messages if m["role"] != "system"]
    out = [("<s>", 0)]
    for k, m in enumerate(turns):
        out += [(f"[INST] {sys_ if k == 0 else ''}{m['content']} [/INST]", 0)] if m["role"] == "user" else [
            (f" {m['content']}</s>", 1)]
    return _merged(out)


def gemma_pieces(messages):
    sys_ = messages[0]["content"] + "\n\n" if messages[0]["role"] == "system" else ""
    turns = [m for m in messages if m["role"] != "system"]
    out = [("<s>", 0)]
    for k, m in enumerate(turns):
        if m["role"] == "user":
            out.append((f"<start_of_turn>user\n{sys_ if k == 0 else ''}{m['content'].strip()}<end_of_turn>\n", 0))
        else:
            out += [("<start_of_turn>model\n", 0), (f"{m['content'].strip()}<end_of_turn>\n", 1)]
    return _merged(out)


def _merged(pieces):
    """Adjacent pieces of the same kind as one (tokenized whole, as the rendering is)."""
    out = []
    for text, trained in pieces:
        if out and out[-1][1] == trained:
            out[-1] = (out[-1][0] + text, trained)
        else:
            out.append((text, trained))
    return out


TEMPLATES = {"chatml": (CHATML, chatml_pieces), "llama2": (LLAMA2, llama2_pieces), "gemma": (GEMMA, gemma_pieces)}


@pytest.fixture(scope="module")
def tokenizer(tiny_gpt2_dir):
    from flaxlm.tokenization.loading import load_tokenizer
    tok = load_tokenizer(tiny_gpt2_dir)
    markers = ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>"]
    tok.add_special_tokens({"additional_special_tokens": markers}, replace_extra_special_tokens=False)
    return tok


@pytest.mark.parametrize("system", [True, False])
@pytest.mark.parametrize("name", TEMPLATES)
def test_trained_tokens_are_the_answers_built_by_hand(tokenizer, name, system):
    template, pieces = TEMPLATES[name]
    messages = [SYSTEM, *TURNS] if system else TURNS
    want_ids, want_mask = [], []
    for text, trained in pieces(messages):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        want_ids += ids
        want_mask += [trained] * len(ids)
    ids, mask = encode(tokenizer, template, Example(messages=messages))
    assert tokenizer.convert_ids_to_tokens(ids) == tokenizer.convert_ids_to_tokens(want_ids)
    assert mask == want_mask and sum(mask) > 0
    assert encode(tokenizer, template, Example(messages=messages), train_on_prompt=True)[1] == [1] * len(ids)


def test_the_end_of_a_turn_and_missing_markers(tokenizer, tiny_gpt2_dir):
    from flaxlm.tokenization.loading import load_tokenizer
    assert end_of_turn(tokenizer, CHATML) == "<|im_end|>" and end_of_turn(tokenizer, GEMMA) == "<end_of_turn>"
    assert end_of_turn(tokenizer, LLAMA2) == "</s>"
    assert missing_markers(load_tokenizer(tiny_gpt2_dir), GEMMA) == ["<start_of_turn>", "<end_of_turn>"]


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    last_only = "{% for m in messages %}{% if loop.last %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
    with pytest.raises(UserError, match="cannot be found by rendering it turn by turn"):
        encode(tokenizer, last_only, Example(messages=TURNS))


@pytest.mark.parametrize("record, message", [
    ({"messages": [TURNS[0]]}, "has no assistant turn at its end"),
    ({"messages": [TURNS[1], TURNS[0]]}, "message 0 is a assistant turn where a user turn belongs"),
    ({"messages": [TURNS[0], TURNS[0], TURNS[1]]}, "message 1 is a user turn where a assistant turn belongs"),
    ({"messages": [{"role": "tool", "content": "x"}, TURNS[1]]}, "unknown role 'tool'"),
    ({"messages": [TURNS[0], {"role": "assistant", "content": "  "}]}, "empty assistant answer"),
    ({"prompt": "Q", "completion": ""}, "empty completion"),
    ({"prompt": "Q", "completion": [TURNS[1]]}, "a prompt and a completion of one kind"),
    ({"question": "Q"}, "none of TRL's fields"),
])
def test_bad_examples_are_one_line(record, message):
    with pytest.raises(UserError, match=message):
        example(record, "example 3 of --train_file x.jsonl")


def test_best_fit_packs_longest_first_into_the_fullest_row():
    row_S, start_S = best_fit([5, 3, 8, 2, 7], 10)
    assert row_S.tolist() == [2, 1, 0, 0, 1] and start_S.tolist() == [0, 7, 0, 8, 0]
    rows, report = sft_rows([([1, 2, 3], [0, 1, 1]), ([4, 5], [0, 1]), (list(range(6, 18)), [0] * 6 + [1] * 6)], 8,
                            0, long="truncate")
    assert report == {"examples": 3, "cut": 1, "dropped": 0, "answer_cut": 0, "trained_tokens": 5, "tokens": 13}
    assert rows["segment_ids"].tolist() == [[1] * 8, [1, 1, 1, 2, 2, 0, 0, 0]]
    assert rows["positions"][1].tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    dropped = sft_rows([([1, 2, 3], [0, 1, 1]), (list(range(6, 18)), [0] * 6 + [1] * 6)], 8, 0, long="drop")[1]
    assert dropped["dropped"] == 1 and dropped["examples"] == 1


def test_a_long_example_cut_past_its_whole_answer_is_counted():
    """Cut from the end, a conversation whose answer lies past --max_length keeps no trained token: left out, and
    counted apart from the cut ones that keep part of their answer."""
    seqs = [([1, 2, 3], [0, 1, 1]), (list(range(6, 18)), [0] * 6 + [1] * 6), (list(range(20, 32)), [0] * 10 + [1] * 2)]
    rows, report = sft_rows(seqs, 8, 0)
    assert (report["examples"], report["cut"], report["answer_cut"], report["trained_tokens"]) == (2, 2, 1, 4)
    assert report_line("train", report, len(rows["input_ids"]), 8) == (
        "train: 2 examples in 2 rows of 8, 4 of 11 tokens trained on; 2 longer than 8 cut to it, 1 of them losing "
        "their whole answer (left out)")
    assert sft_rows(seqs, 8, 0, long="drop")[1]["answer_cut"] == 0  # dropped whole instead, never cut
    assert report_line("validation", sft_rows(seqs[:1], 8, 0)[1], 1, 8) == (
        "validation: 1 examples in 1 rows of 8, 2 of 3 tokens trained on")


def test_a_packed_row_computes_each_conversation_as_alone(tokenizer, tiny_gpt2_dir):
    """The logits of every token of three conversations packed into one row equal those of each alone in a row."""
    import jax.numpy as jnp
    from flaxlm.models import apply_model, create_model, load_config, split_model
    from flaxlm.models.layers import Segments
    config = load_config(tiny_gpt2_dir)
    config.vocab_size = len(tokenizer)
    graphdef, params = split_model(create_model(config, seed=0))
    seqs = [encode(tokenizer, CHATML, Example(messages=m)) for m in ([SYSTEM, *TURNS], TURNS[:2], TURNS)]
    width = sum(len(ids) for ids, _ in seqs) + 5
    packed, _ = sft_rows(seqs, width, 0)
    alone, _ = sft_rows(seqs, width, 0, packing=False)
    assert len(packed["input_ids"]) == 1 and len(alone["input_ids"]) == 3

    def logits(rows):
        return np.asarray(apply_model(graphdef, params, jnp.asarray(rows["input_ids"]),
                                      Segments(jnp.asarray(rows["segment_ids"])), jnp.asarray(rows["positions"])))
    together, apart = logits(packed), logits(alone)
    start = 0
    for k in sorted(range(len(seqs)), key=lambda k: -len(seqs[k][0])):  # best fit lays the longest first
        n = len(seqs[k][0])
        np.testing.assert_allclose(together[0, start:start + n], apart[k, :n], atol=2e-5, rtol=0)
        start += n


def conversations_file(path, n=48):
    qa = [("Hva er hovedstaden i Norge?", "Oslo."), ("Hva er 2+2?", "Fire."), ("Hvem skrev Peer Gynt?", "Ibsen.")]
    rng = np.random.default_rng(0)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            q, a = qa[int(rng.integers(len(qa)))]
            turns = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            f.write(json.dumps({"messages": ([SYSTEM] if i % 2 else []) + turns}, ensure_ascii=False) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def sft_run(tiny_gpt2_dir, tmp_path_factory):
    """A tiny GPT-2 (no chat template, no ChatML tokens) SFT'd with --chat_template chatml."""
    tmp = tmp_path_factory.mktemp("sft")
    out = tmp / "run"
    run_sft.main(["--output_dir", str(out), "--config_name", tiny_gpt2_dir, "--tokenizer_name", tiny_gpt2_dir,
                  "--chat_template", "chatml", "--train_file", conversations_file(tmp / "conv.jsonl"),
                  "--validation_split_percentage", "25", "--max_length", "64", "--train_batch_size", "8",
                  "--max_steps", "12", "--learning_rate", "3e-3", "--logging_steps", "4", "--eval_steps", "12",
                  "--eval_at_start", "--report_to", "none"])
    return out


def test_chatml_is_added_the_answers_learned_and_the_export_renders_what_training_saw(sft_run):
    """The ChatML markers are added, the loss on held-out answers falls, and the export's apply_chat_template
    renders a conversation as training tokenized it, token for token; its generation stops at <|im_end|>."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    evals = read_metrics(sft_run, "eval")
    assert evals[-1]["loss"] < 0.7 * evals[0]["loss"]
    assert "supervised fine-tuned on conversations" in (sft_run / "README.md").read_text()
    tok = AutoTokenizer.from_pretrained(sft_run)
    assert tok.eos_token == "<|im_end|>" and AutoModelForCausalLM.from_pretrained(sft_run).generation_config \
        .eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    messages = [SYSTEM, *TURNS]
    ours, _ = encode(tok, CHATML, Example(messages=messages))
    assert tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"] == ours


def test_generate_chat_answers_as_transformers_does(sft_run, capsys):
    """generate.py --chat: the prompt as a user turn with the generation prompt, greedy to the end of the turn, the
    tokens transformers' apply_chat_template + generate give."""
    import generate
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from flaxlm.models.generation import generate as ours_generate
    tok, hf = AutoTokenizer.from_pretrained(sft_run), AutoModelForCausalLM.from_pretrained(sft_run).eval()
    question = TURNS[0]["content"]
    enc = tok.apply_chat_template([SYSTEM, {"role": "user", "content": question}], add_generation_prompt=True,
                                  return_dict=True, return_tensors="pt")
    with torch.no_grad():
        theirs = hf.generate(**enc, max_new_tokens=8, do_sample=False)[0, enc["input_ids"].shape[1]:].tolist()
    ids = generate.encode(tok, question, chat=True, system=SYSTEM["content"])
    assert ids == enc["input_ids"][0].tolist()
    _, model = generate.load_causal_lm(str(sft_run), "float32")
    out = ours_generate(model, [ids], 8, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    assert out.tokens[0] == theirs  # both up to and including <|im_end|>, or 8 tokens
    generate.main(["--model_name_or_path", str(sft_run), "--chat", "--system", SYSTEM["content"], "--prompt",
                   question, "--max_new_tokens", "8"])
    assert repr(tok.decode(theirs, skip_special_tokens=True)) in capsys.readouterr().out


def test_a_tokenizer_without_a_template_names_the_option(tiny_gpt2_dir, tmp_path):
    out = tmp_path / "run"
    expect_user_error(run_sft.main, ["--output_dir", str(out), "--config_name", tiny_gpt2_dir, "--tokenizer_name",
                                     tiny_gpt2_dir, "--train_file", conversations_file(tmp_path / "c.jsonl"),
                                     "--validation_split_percentage", "25", "--report_to", "none"],
                      "the tokenizer has no chat template .* pass --chat_template chatml")
    assert not os.path.exists(out / "metrics.jsonl")


@pytest.mark.parametrize("family", ["gpt2", "qwen3_moe"])
def test_the_loss_is_trls(tiny_gpt2_dir, tmp_path, family):
    """Prompt/completion examples, as text and as messages: our loss on the trained tokens equals the one TRL's
    SFTTrainer computes (its own data preparation and compute_loss) on the same tiny checkpoint (fp32); for a
    mixture of experts with TRL's load-balancing loss added (a weight of 0.5, so that it shows)."""
    import jax
    import torch
    import transformers
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    from flaxlm.data.chat_rows import encode as ours_encode
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.objectives.sft import sft_objective
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.training.pipeline import trl_router_loss
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_gpt2_dir, ckpt)
    tok = load_tokenizer(str(ckpt))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(ckpt)
    if family == "gpt2":
        config = transformers.AutoConfig.from_pretrained(ckpt, vocab_size=len(tok), resid_pdrop=0.0, embd_pdrop=0.0,
                                                         attn_pdrop=0.0)
    else:
        config = transformers.Qwen3MoeConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                             router_aux_loss_coef=0.5, bos_token_id=tok.bos_token_id,
                                             eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(ckpt)
    cases = {"text": [{"prompt": f"Spørsmål {i}: hva er {i}+{i}?", "completion": f" Svar: {2 * i}."}
                      for i in range(6)],
             "messages": [{"prompt": [TURNS[0]], "completion": [TURNS[1]]},
                          {"prompt": [SYSTEM, *TURNS[:3]], "completion": [TURNS[3]]}]}
    config, model = load_pretrained(str(ckpt))
    config = trl_router_loss(SimpleNamespace(output_router_logits=None), config)
    graphdef, params = split_model(model)
    for kind, records in cases.items():
        trainer = SFTTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(ckpt), processing_class=tok,
                             train_dataset=Dataset.from_list(records),
                             args=SFTConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, bf16=False,
                                            per_device_train_batch_size=len(records), max_length=128))
        batch = next(iter(trainer.get_train_dataloader()))
        with torch.no_grad():
            theirs = float(trainer.compute_loss(trainer.model.eval(), batch))
        seqs = [ours_encode(tok, CHATML, example(r, kind)) for r in records]
        rows, _ = sft_rows(seqs, 128, tok.pad_token_id or 0, packing=False)
        objective = sft_objective(graphdef, config, params, 128, 0)
        sums = jax.jit(objective.loss_sums)(params, objective.collate(rows), None)
        assert float(sums["loss_sum"]) / float(sums["weight_sum"]) == pytest.approx(theirs, rel=1e-4), kind
        if family != "gpt2":  # the aux loss is on (TRL's default) and weighs in the comparison
            assert 0.5 * float(sums["aux_loss_sum"]) / float(sums["weight_sum"]) > 0.5


@pytest.mark.parametrize("flags", [[], ["--lora_rank", "4", "--lora_trainable_tokens", "1", "2"]],
                         ids=["full", "lora_with_token_rows"])
def test_compile_for_a_slice_writes_nothing(tiny_gpt2_dir, tmp_path, capsys, flags):
    out = tmp_path / "run"
    r = run_sft.main(["--output_dir", str(out), "--config_name", tiny_gpt2_dir, "--tokenizer_name", tiny_gpt2_dir,
                      "--chat_template", "chatml", "--max_length", "64", "--compile_for", "v5e-4", "--do_eval", "false",
                      *flags])
    assert "fits v5e-4" in capsys.readouterr().out and r["params"] > 0 and not out.exists()
