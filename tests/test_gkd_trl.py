"""run_distill.py --mode gkd against TRL's GKDTrainer (trl.experimental.gkd) on the same tiny checkpoints (a 2-layer
GPT-2 teacher, a 1-layer student, random weights saved by transformers) and conversations:

- the batch: our rows' token ids and taught tokens are those of TRL's collator (DataCollatorForChatML: the chat
  template, only the last answer taught, a long conversation's end kept);
- lmbda 0 (the data's completions): every step's loss of run_distill.py equals TRL's over 4 AdamW steps (the whole
  dataset one batch, so neither sampler's order matters), and the first one a float64 evaluation of TRL's
  generalized_jsd_loss;
- on-policy rows: given the same sampled completions (an EOS inside, at the start, none), our rows of them
  (flaxlm.distillation.rows.completion_rows) have TRL's loss (generate_on_policy_outputs then compute_loss).

Every conversation renders to the same number of tokens and the on-policy prompts too: TRL's collator left-pads and
its forward passes no position ids, so a padded row's GPT-2 positions would start past 0 there (ours start at 0);
the test checks its batches carry no padding.
"""
import json

import numpy as np
import pytest

from flaxlm.data.chat_template import CHATML

BETA, LR, STEPS, MAX_LENGTH = 0.5, 1e-3, 4, 64


def _u(text):
    return {"role": "user", "content": text}


def _a(text):
    return {"role": "assistant", "content": text}


def conversations(tok):
    """One and two answers, with and without a system turn, each user turn before the last answer lengthened until
    every conversation renders to as many tokens as the longest."""
    convs = [[_u(f"Hva er {i}+{j}?"), _a(f"Svaret er {i + j}.")] for i, j in [(1, 2), (2, 3), (3, 1), (4, 4)]]
    convs += [[{"role": "system", "content": "Kort."}, _u("Norge?"), _a("Oslo.")],
              [_u("1+1?"), _a("To."), _u("2+2?"), _a("Fire.")], [_u("Hvem skrev Peer Gynt?"), _a("Ibsen.")],
              [_u("Hva heter du?"), _a("Jeg er en modell.")]]

    def length(messages):
        return len(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])

    target = max(map(length, convs))
    for m in convs:
        while length(m) < target:
            m[-2] = _u(m[-2]["content"] + next(p for p in (" ja", "!", "a") if length(
                [*m[:-2], _u(m[-2]["content"] + p), m[-1]]) <= target))
    return convs


@pytest.fixture(scope="module")
def pair(tiny_gpt2_dir, tmp_path_factory):
    """{"teacher", "student", "data": paths, "tok", "convs"}: the tiny tokenizer with ChatML's markers and template,
    the two GPT-2s (width 32, dropout 0; weights drawn at std 0.5 so that the distributions are peaked and the JSD
    of order 1, not 1e-3 as at the usual 0.02), and the conversations as TRL's messages records."""
    import torch
    import transformers
    from flaxlm.tokenization.loading import load_tokenizer
    d = tmp_path_factory.mktemp("gkd_trl")
    tok = load_tokenizer(tiny_gpt2_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    out = {"tok": tok}
    for name, layers, seed in (("teacher", 2, 0), ("student", 1, 1)):
        path = d / name
        tok.save_pretrained(path)
        config = transformers.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=layers, n_head=2,
                                         n_positions=MAX_LENGTH, initializer_range=0.5, resid_pdrop=0.0,
                                         embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tok.bos_token_id,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(seed)
        transformers.GPT2LMHeadModel(config).save_pretrained(path)
        out[name] = str(path)
    out["convs"] = conversations(tok)
    out["data"] = str(d / "conversations.jsonl")
    with open(out["data"], "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in out["convs"])
    return out


def trl_trainer(pair, tmp_path, **config):
    import transformers
    from datasets import Dataset
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    class Recorded(GKDTrainer):
        """TRL's trainer, each compute_loss's value kept (the log rounds to 4 digits)."""
        losses = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            self.losses.append(float(loss.detach()))
            return loss

    args = GKDConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False, seed=0,
                     per_device_train_batch_size=len(pair["convs"]), max_length=MAX_LENGTH, lmbda=0.0, beta=BETA,
                     learning_rate=LR, max_steps=STEPS, lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0,
                     max_grad_norm=1.0, logging_steps=1, save_strategy="no", dataloader_num_workers=0, **config)
    load = transformers.AutoModelForCausalLM.from_pretrained
    trainer = Recorded(model=load(pair["student"]), teacher_model=load(pair["teacher"]), args=args,
                       processing_class=pair["tok"],
                       train_dataset=Dataset.from_list([{"messages": m} for m in pair["convs"]]))
    trainer.losses = []
    return trainer


def our_rows(pair, convs=None, max_length=MAX_LENGTH):
    """run_distill.py's training rows of the conversations (file order)."""
    from flaxlm.data.conversations import Example
    from flaxlm.distillation.run import conversation_rows
    tok = pair["tok"]
    rows = conversation_rows({"train": [Example(messages=m) for m in convs or pair["convs"]]}, tok, CHATML,
                             max_length, tok.pad_token_id, gkd=True, packing=False)
    return rows["train"]


def test_the_batch_is_trls_collators(pair, tmp_path):
    """The same token ids, and the same taught tokens: each conversation's last answer and what ends its turn."""
    trainer = trl_trainer(pair, tmp_path)
    batch = trainer.data_collator([{"messages": m} for m in pair["convs"]])
    assert int(batch["attention_mask"].min()) == 1, "equal lengths: no left padding in TRL's batch"
    rows, n = our_rows(pair), batch["input_ids"].shape[1]
    np.testing.assert_array_equal(rows["input_ids"][:, :n], batch["input_ids"].numpy())
    np.testing.assert_array_equal(rows["trained"][:, :n], (batch["labels"] != -100).numpy().astype(np.int32))
    assert not rows["trained"][:, n:].any()
    k = next(i for i, m in enumerate(pair["convs"]) if len(m) == 4)  # user, assistant, user, assistant
    ends = np.flatnonzero(rows["input_ids"][k] == pair["tok"].convert_tokens_to_ids("<|im_end|>"))
    assert len(ends) == 4 and not rows["trained"][k, :ends[2] + 1].any()  # the first answer only prompts
    assert rows["trained"][k, ends[3]] == 1  # the last answer's end taught


def test_a_long_conversation_keeps_its_end_as_trls_collator(pair, capsys):
    """Longer than --max_length: its oldest tokens go, the answer stays (TRL's collator keeps the last max_length);
    one whose answer alone fills the row has no prompt left and is left out (TRL's collator raises)."""
    from trl.experimental.utils import DataCollatorForChatML
    long = [_u("Hva er hovedstaden i Norge, og hvorfor?"), _a("Oslo."), _u("Og i Sverige?"), _a("Stockholm, vel.")]
    rambling = [_u("Si noe."), _a("Ja " * 40)]
    collator = DataCollatorForChatML(tokenizer=pair["tok"], max_length=32)
    batch = collator([{"messages": long}])
    assert len(pair["tok"].apply_chat_template(long, tokenize=True, return_dict=True)["input_ids"]) > 40
    rows = our_rows(pair, [long, rambling], max_length=32)
    assert "2 conversations longer than 32 tokens lost their oldest ones, 1 of them their whole prompt" in \
        capsys.readouterr().out
    np.testing.assert_array_equal(rows["input_ids"], batch["input_ids"].numpy())
    np.testing.assert_array_equal(rows["trained"], (batch["labels"] != -100).numpy().astype(np.int32))
    with pytest.raises(ValueError, match="no prompt tokens left"):
        collator([{"messages": rambling}])


def test_lmbda_0_losses_are_trls(pair, tmp_path):
    """run_distill.py's logged loss each step equals TRL's: 1e-5 relative, float32 forwards of two libraries (TRL's
    first is 1e-7 from the float64 reference; ours, logged to 6 decimals, agree with TRL's to those decimals over
    the 4 steps: measured 6e-7 at most, AdamW on the same gradients keeping the two students together)."""
    import torch
    import transformers
    import run_distill
    from run_helpers import read_metrics
    trainer = trl_trainer(pair, tmp_path)
    batch = trainer.data_collator([{"messages": m} for m in pair["convs"]])
    with torch.no_grad():  # the float64 reference of the first step: TRL's loss on double copies of both models
        load = transformers.AutoModelForCausalLM.from_pretrained
        student, teacher = (load(pair[name]).double().eval() for name in ("student", "teacher"))
        logits = [m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
                  for m in (student, teacher)]
        reference = float(trainer.generalized_jsd_loss(*logits, labels=batch["labels"][:, 1:], beta=BETA))
    trainer.train()
    theirs = trainer.losses
    out = tmp_path / "ours"
    run_distill.main(["--mode", "gkd", "--output_dir", str(out), "--model_name_or_path", pair["student"],
                      "--teacher_model_name_or_path", pair["teacher"], "--train_file", pair["data"],
                      "--chat_template", "chatml", "--max_length", str(MAX_LENGTH), "--lmbda", "0", "--beta",
                      str(BETA), "--train_batch_size", str(len(pair["convs"])), "--max_steps", str(STEPS),
                      "--learning_rate", str(LR), "--warmup_steps", "0", "--weight_decay", "0", "--max_grad_norm",
                      "1.0", "--logging_steps", "1", "--do_eval", "false", "--validation_split_percentage", "0",
                      "--report_to", "none"])
    ours = [r["loss"] for r in read_metrics(out)]
    assert len(ours) == len(theirs) == STEPS
    assert theirs[0] == pytest.approx(reference, rel=1e-6) and ours[0] == pytest.approx(reference, rel=1e-5)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert theirs[-1] < theirs[0] - 0.01  # the steps moved the student


def test_on_policy_rows_have_trls_loss(pair, tmp_path):
    """The same completions of four prompts of one length (an EOS inside, one at the start, none, one last): our
    rows of them score the loss TRL's generate_on_policy_outputs + compute_loss give."""
    from types import SimpleNamespace

    import jax
    import torch
    from transformers import GenerationConfig
    from flaxlm.distillation.rows import completion_rows
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.objectives.distill import gkd_objective
    tok, eos, pad = pair["tok"], pair["tok"].eos_token_id, pair["tok"].pad_token_id
    trainer = trl_trainer(pair, tmp_path)
    batch = trainer.data_collator([{"messages": m} for m in pair["convs"][:4]])
    assert int(batch["prompt_attention_mask"].min()) == 1, "prompts of one length: no left padding"
    completions = np.random.default_rng(0).integers(10, len(tok) - 2, (4, 7))
    completions[0, 3], completions[1, 0], completions[3, 6] = eos, eos, eos
    generated = torch.cat([batch["prompts"], torch.tensor(completions)], dim=1)
    sampler = SimpleNamespace(generate=lambda **kwargs: SimpleNamespace(sequences=generated))
    ids, mask, labels = trainer.generate_on_policy_outputs(sampler, batch, GenerationConfig(eos_token_id=eos))
    with torch.no_grad():
        theirs = float(trainer.compute_loss(trainer.model.eval(), {"input_ids": ids, "attention_mask": mask,
                                                                   "labels": labels}))

    prompts = [p.tolist() for p in batch["prompts"]]
    rows, lengths, truncated = completion_rows(prompts, completions, eos, MAX_LENGTH, pad)
    assert lengths.tolist() == [4, 1, 7, 7] and truncated.tolist() == [False, False, True, False]
    (config, student), (teacher_config, teacher) = load_pretrained(pair["student"]), load_pretrained(pair["teacher"])
    graphdef, params = split_model(student)
    teacher_graphdef, teacher_params = split_model(teacher)
    objective = gkd_objective(graphdef, config, params, teacher_graphdef, teacher_config, teacher_params, MAX_LENGTH,
                              pad, beta=BETA)
    sums = jax.jit(objective.loss_sums)(params, objective.collate(rows), None, teacher_params)
    assert int(sums["weight_sum"]) == int((labels[:, 1:] != -100).sum()) == 19
    assert float(sums["loss_sum"]) / float(sums["weight_sum"]) == pytest.approx(theirs, rel=1e-5)
