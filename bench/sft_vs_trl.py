#!/usr/bin/env python
"""run_sft.py against TRL's SFTTrainer (PyTorch) fine-tuning the same small checkpoint on the same conversations
with the same hyperparameters, full and LoRA; and the train-step time of an SFT step against a run_clm_flax.py step
of the same tokens, and of a LoRA step against a full one.

    python bench/sft_vs_trl.py --work_dir /tmp/sft-vs-trl          # needs trl and peft (requirements-dev.txt)

1. A small decoder (GPT-2 shape: 2 layers, width 128, BPE of 8,192 on Norwegian Wikipedia) pretrained here with
   run_clm_flax.py, then given ChatML: its two markers added as tokens (rows the mean of the others, transformers'
   resize_token_embeddings) and the template set on the tokenizer. Both trainers start from that directory.
2. NorQuAD's questions as prompt + completion conversations (bench/norquad_chat.py): the first --train_examples of
   its training articles, its held-out articles for the held-out loss. Loss on the completion (the answer and its
   <|im_end|>) only, as TRL does for prompt-completion data.
3. The same optimizer (AdamW, linear decay, no warmup, clipping at 1.0), batch, epochs, max_length and dropout (the
   config's); fp32, the LoRA base too (--param_dtype float32). The data order is each trainer's own (same seed,
   different samplers), so the curves agree in their trend, not step for step.
Prints, per mode (full, LoRA rank 8 alpha 16 on every linear layer): the training loss every --logging_steps side by
side, and the held-out loss on completion tokens after training (ours / TRL's). Then our median step time (ms) of a
full SFT step, a LoRA SFT step and a run_clm_flax.py step of the same rows (batch x max_length tokens): short runs of
each in turn --rounds times, read from their metrics.jsonl after the first logging window (compilation). Last,
NorQuAD's held-out questions answered by the full SFT export zero-shot through its chat template and by the
pretrained base few-shot (run_fewshot.py --metric squad: exact match and F1 as run_qa.py scores them).
"""
import argparse
import json
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

from bench.adapt_vocabulary import median_step_ms, run  # noqa: E402  -- scripts as subprocesses, logged

LORA = {"rank": 8, "alpha": 16}


def base_checkpoint(a, w, log):
    """The pretrained small GPT-2 with ChatML's markers and template (made once)."""
    tok, pre, start = (os.path.join(w, n) for n in ("tokenizer", "pretrained", "chatml-start"))
    wiki = os.path.join(a.data_dir, "no", "nbailab_wiki_no_100k.txt")
    if not os.path.exists(os.path.join(tok, "config.json")):
        run("train_tokenizer.py", ["--type", "bpe", "--train_file", wiki, "--vocab_size", "8192",
                                   "--model_max_length", "512", "--output_dir", tok, "--overwrite_output_dir"], log)
        run("create_config.py", ["--preset", "gpt2", "--set", "n_layer=2", "n_embd=128", "n_head=4",
                                 "n_positions=512", "--output_dir", tok], log)
    if not os.path.exists(os.path.join(pre, "model.safetensors")):
        run("run_clm_flax.py", ["--config_name", tok, "--tokenizer_name", tok, "--output_dir", pre, "--train_file",
                                wiki, "--validation_split_percentage", "2", "--block_size", "128",
                                "--train_batch_size", "32", "--max_steps", str(a.pretrain_steps), "--learning_rate",
                                "3e-3", "--warmup_steps", str(a.pretrain_steps // 10), "--logging_steps", "100",
                                "--eval_steps", str(a.pretrain_steps), "--save_steps", str(a.pretrain_steps),
                                "--report_to", "none", "--overwrite_output_dir"], log)
    if not os.path.exists(os.path.join(start, "model.safetensors")):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from flaxlm.data.chat_template import CHATML
        tokenizer = AutoTokenizer.from_pretrained(pre, trust_remote_code=False)
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tokenizer.chat_template = CHATML
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(pre, trust_remote_code=False)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        model.save_pretrained(start)
        tokenizer.save_pretrained(start)
    return start


def conversations(a, w):
    """(train file, held-out file): prompt + completion records, the first --train_examples for training."""
    data = os.path.join(w, "norquad-chat")
    if not os.path.exists(os.path.join(data, "sft_test.jsonl")):
        from bench.norquad_chat import main as build
        build(["--output_dir", data, "--data_dir", a.data_dir])
    out = {}
    for split, n in (("train", a.train_examples), ("test", None)):
        path = os.path.join(w, f"sft_{split}.jsonl")
        with open(os.path.join(data, f"sft_{split}.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f][:n]
        with open(path, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps({"prompt": r["prompt"], "completion": r["completion"]}, ensure_ascii=False) + "\n")
        out[split] = path
    return out["train"], out["test"]


def ours(a, w, start, files, lora, log):
    """{"train": [(step, loss)], "heldout": loss, "step_ms": median} of run_sft.py."""
    out = os.path.join(w, "runs", f"ours-{'lora' if lora else 'full'}-{a.seed}")
    if not os.path.exists(os.path.join(out, "config.json")) and not os.path.exists(
            os.path.join(out, "adapter_config.json")):
        flags = ["--model_name_or_path", start, "--output_dir", out, "--train_file", files[0], "--validation_file",
                 files[1], "--packing", "false", "--max_length", str(a.max_length), "--train_batch_size",
                 str(a.batch), "--per_device_eval_batch_size", "32", "--learning_rate", str(a.lr[lora]),
                 "--num_train_epochs", "1", "--warmup_steps", "0", "--weight_decay", "0", "--max_grad_norm", "1.0",
                 "--logging_steps", str(a.logging_steps), "--eval_steps", "100000", "--save_steps", "100000",
                 "--do_eval", "--seed", str(a.seed), "--dtype", "float32", "--param_dtype", "float32",
                 "--report_to", "none", "--overwrite_output_dir"]
        if lora:  # the base in float32 as TRL's (run_sft.py holds a LoRA base in bfloat16 unless told)
            flags += ["--lora_rank", str(LORA["rank"]), "--lora_alpha", str(LORA["alpha"])]
        run("run_sft.py", flags, log)
    return read_metrics(out)


def read_metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    train = [r for r in rows if r.get("split") == "train" and "loss" in r]
    evals = [r for r in rows if r.get("split") == "eval"]
    return {"train": [(r["step"], r["loss"]) for r in train], "heldout": evals[-1]["loss"] if evals else None,
            "step_ms": statistics.median(r["step_ms"] for r in train[1:]) if len(train) > 1 else None}


def theirs(a, w, start, files, lora):
    """{"train": [(step, loss)], "heldout": loss} of TRL's SFTTrainer (cached in --work_dir)."""
    path = os.path.join(w, "runs", f"trl-{'lora' if lora else 'full'}-{a.seed}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer
    tokenizer = AutoTokenizer.from_pretrained(start, trust_remote_code=False)
    data = load_dataset("json", data_files={"train": files[0], "test": files[1]})
    peft_config = None
    if lora:
        import peft
        peft_config = peft.LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                      target_modules=["c_attn", "c_proj", "c_fc"], task_type="CAUSAL_LM")
    args = SFTConfig(output_dir=os.path.join(w, "trl-tmp"), report_to=[], use_cpu=True, bf16=False, seed=a.seed,
                     per_device_train_batch_size=a.batch, per_device_eval_batch_size=32, max_length=a.max_length,
                     packing=False, learning_rate=a.lr[lora], num_train_epochs=1, lr_scheduler_type="linear",
                     warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, logging_steps=a.logging_steps,
                     save_strategy="no", eval_strategy="no", dataloader_num_workers=0)
    model = AutoModelForCausalLM.from_pretrained(start, trust_remote_code=False)
    trainer = SFTTrainer(model=model, processing_class=tokenizer, args=args,
                         train_dataset=data["train"], eval_dataset=data["test"], peft_config=peft_config)
    trainer.train()
    train = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    model = trainer.model.eval()
    total, count = 0.0, 0
    with torch.no_grad():  # the token mean over every held-out completion token (not a mean of batch means)
        for batch in trainer.get_eval_dataloader():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
            labels = batch["labels"][:, 1:]
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                     labels.reshape(-1), ignore_index=-100, reduction="sum")
            total, count = total + float(loss), count + int((labels != -100).sum())
    figures = {"train": train, "heldout": total / count}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(figures, f)
    return figures


def step_times(a, w, start, files, log):
    """{kind: median step ms}: run_clm_flax.py, run_sft.py full and run_sft.py LoRA on rows of the same shape (batch x
    max_length tokens; SFT unpacked, each row padded to max_length), each run for 4 logging windows, in turn --rounds
    times (the machine is shared: side by side, medians over every window after each run's first)."""
    wiki = os.path.join(a.data_dir, "no", "nbailab_wiki_no_100k.txt")
    common = ["--model_name_or_path", start, "--train_batch_size", str(a.batch), "--max_steps",
              str(4 * a.logging_steps), "--logging_steps", str(a.logging_steps), "--save_steps", "100000",
              "--dtype", "float32", "--param_dtype", "float32", "--report_to", "none", "--overwrite_output_dir"]
    sft = ["--train_file", files[0], "--validation_file", files[1], "--packing", "false", "--max_length",
           str(a.max_length), "--learning_rate", str(a.learning_rate)]
    kinds = {"clm": ("run_clm_flax.py", ["--train_file", wiki, "--block_size", str(a.max_length)]),
             "sft_full": ("run_sft.py", sft),
             "sft_lora": ("run_sft.py", sft + ["--lora_rank", str(LORA["rank"]), "--lora_alpha", str(LORA["alpha"])])}
    return median_step_ms(kinds, common, a.rounds, os.path.join(w, "runs"), log)


def norquad_answers(a, w, log):
    """{model: {"exact", "f1"}}: the held-out NorQuAD questions answered by the full SFT export zero-shot through its
    chat template, and by the pretrained base (no template) with --base_shots solved examples, run_fewshot.py's
    --metric squad (run_qa.py's exact match and F1)."""
    data, out = os.path.join(w, "norquad-chat"), {}
    common = ["--task_type", "generate", "--train_file", os.path.join(data, "qa_train.jsonl"), "--validation_file",
              os.path.join(data, "qa_test.jsonl"), "--metric", "squad", "--answers_column", "answers",
              "--max_new_tokens", "32", "--per_device_eval_batch_size", "32", "--overwrite_output_dir"]
    for name, model, flags in (
            ("SFT, zero-shot, chat template", os.path.join(w, "runs", f"ours-full-{a.seed}"),
             ["--chat", "--prompt", "{question}", "--target", "{answer}", "--num_fewshot", "0"]),
            (f"base, {a.base_shots}-shot", os.path.join(w, "pretrained"),
             ["--prompt", "{question}\\nSvar:", "--target", " {answer}", "--stop", "\\n",
              "--num_fewshot", str(a.base_shots)])):
        result = os.path.join(w, "runs", f"norquad-{name.split(',')[0].lower()}")
        if not os.path.exists(os.path.join(result, "results.json")):
            run("run_fewshot.py", ["--model_name_or_path", model, "--output_dir", result, *common, *flags], log)
        with open(os.path.join(result, "results.json")) as f:
            r = json.load(f)
        out[name] = {"exact": r["exact"], "f1": r["f1"], "questions": r["questions"]}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/flaxlm-sft-vs-trl")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--pretrain_steps", type=int, default=1000)
    p.add_argument("--train_examples", type=int, default=1600)
    p.add_argument("--max_length", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=5e-4, help="full fine-tuning's")
    p.add_argument("--lora_learning_rate", type=float, default=2e-3)
    p.add_argument("--logging_steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2, help="step times: each kind of run this many times in turn")
    p.add_argument("--base_shots", type=int, default=2, help="solved examples before each question for the base")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    a.lr = {False: a.learning_rate, True: a.lora_learning_rate}
    w = os.path.abspath(a.work_dir)
    os.makedirs(w, exist_ok=True)
    log = os.path.join(w, "log.txt")
    print(f"work dir {w} (script output in {log})", flush=True)
    start = base_checkpoint(a, w, log)
    files = conversations(a, w)
    results = {}
    for lora in (False, True):
        mode = "lora" if lora else "full"
        results[mode] = {"ours": ours(a, w, start, files, lora, log), "trl": theirs(a, w, start, files, lora)}
        o, t = results[mode]["ours"], results[mode]["trl"]
        print(f"\n{mode}: training loss every {a.logging_steps} steps (batch {a.batch}, lr {a.lr[lora]})\n"
              f"| step | run_sft.py | TRL SFTTrainer |\n|---|---|---|")
        theirs_at = dict(map(tuple, t["train"]))
        for step, loss in o["train"]:
            print(f"| {step} | {loss:.4f} | {theirs_at.get(step, float('nan')):.4f} |")
        print(f"held-out loss on completion tokens: ours {o['heldout']:.4f}, TRL {t['heldout']:.4f}, "
              f"ratio {o['heldout'] / t['heldout']:.4f}", flush=True)
    ms = results["step_ms"] = step_times(a, w, start, files, log)
    print(f"\nstep time (ms, median over {a.rounds} rounds in turn, rows of {a.batch} x {a.max_length}, fp32): "
          f"run_clm_flax.py {ms['clm']:.1f}, run_sft.py full {ms['sft_full']:.1f} ({ms['sft_full'] / ms['clm']:.2f}x), "
          f"LoRA {ms['sft_lora']:.1f} ({ms['sft_lora'] / ms['sft_full']:.2f}x full)")
    results["norquad"] = norquad_answers(a, w, log)
    print("\nNorQuAD's held-out questions (run_fewshot.py --metric squad):")
    print("| model | exact match | F1 |\n|---|---|---|")
    for name, r in results["norquad"].items():
        print(f"| {name} | {r['exact']:.2f} | {r['f1']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
