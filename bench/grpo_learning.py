#!/usr/bin/env python
"""run_grpo.py against TRL's GRPOTrainer (PyTorch) on the same small SFT'd checkpoint, prompts, reward and
hyperparameters: the reward curves side by side, and the held-out token F1 before and after each.

    python bench/grpo_learning.py --work_dir /tmp/grpo_learning      # CPU, ~30 min; needs trl (requirements-dev.txt)

1. NorQuAD's questions (../shared/data/no/norquad_train.json) as text prompts "Tekst: <the sentence(s) around the
   answer, at most --context_chars>\\nSpørsmål: <question>\\nSvar:" with the gold answer " <span>" as completion.
   Articles shuffled (seed 0) and split: --heldout_articles held out, --grpo_articles for GRPO's prompts, the rest for
   SFT. The reward, and the held-out score, is flaxlm.rl.rewards.token_f1 (SQuAD's normalization, the best F1 over
   every gold answer): the same function is handed to TRL.
2. The checkpoint: a GPT-2 BPE (train_tokenizer.py --type gpt2) and a small GPT-2 (4 layers, width 128, dropout 0:
   the two trainers would draw different masks) pretrained briefly (run_clm_flax.py) on Norwegian Wikipedia and the
   SFT articles' passages, then run_sft.py on the SFT questions (prompt + completion, eos appended). Both GRPO runs
   start from that export.
3. GRPO, the same settings passed to both explicitly: --num_generations completions a prompt at temperature 1,
   --max_completion_length tokens, --batch completions a step (one device, no accumulation), loss dapo, beta 0,
   epsilon 0.2, scale_rewards group, one iteration a batch; AdamW (0.9, 0.999, 1e-8), no weight decay, clipping at 1,
   linear decay from --learning_rate, no warmup; fp32. The prompt order and the sampling are each trainer's own
   (same seed, different samplers), so the curves agree in trend, not step for step.
Prints the mean train reward over windows of --window steps (ours / TRL's), the held-out token F1 of one greedy
completion per prompt (transformers' generate, one prompt at a time, --max_completion_length new tokens, stopping at
eos) for the SFT start, our export and TRL's final model, our own evaluation's figure beside it, and the wall time of
each GRPO run. The raw curves go to WORK_DIR/curves.json.
"""
import argparse
import json
import os
import random
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

from bench.adapt_vocabulary import run  # noqa: E402  -- scripts as subprocesses, logged
from bench.norquad_chat import window  # noqa: E402  -- the sentences around an answer


def prompt_rows(articles, context_chars):
    """[{"prompt", "answer" (every gold answer), "completion" (" " + the first)}] of the articles' answerable
    questions whose passage holds the answer."""
    rows = []
    for article in articles:
        for para in article["paragraphs"]:
            for q in para["qas"]:
                if not q["answers"] or q.get("is_impossible"):
                    continue
                gold = q["answers"][0]
                passage = window(para["context"], gold["answer_start"], gold["answer_end"], context_chars)
                if gold["text"] not in passage or len(passage) > 2 * context_chars:
                    continue
                rows.append({"prompt": f"Tekst: {passage}\nSpørsmål: {q['question'].strip()}\nSvar:",
                             "completion": " " + gold["text"].strip(),
                             "answer": sorted({a["text"].strip() for a in q["answers"]})})
    return rows


def write_data(a, w):
    """{"sft", "grpo", "heldout", "corpus"}: the files, made once. The corpus (tokenizer, pretraining) is the wiki text
    and the passages of the SFT articles."""
    paths = {k: os.path.join(w, "data", f"{k}.{'txt' if k == 'corpus' else 'jsonl'}")
             for k in ("sft", "grpo", "heldout", "corpus")}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    with open(os.path.join(a.data_dir, "no", "norquad_train.json"), encoding="utf-8") as f:
        articles = list(json.load(f)["data"])
    random.Random(0).shuffle(articles)
    cut1, cut2 = a.heldout_articles, a.heldout_articles + a.grpo_articles
    parts = {"heldout": articles[:cut1], "grpo": articles[cut1:cut2], "sft": articles[cut2:]}
    os.makedirs(os.path.dirname(paths["sft"]), exist_ok=True)
    for split, part in parts.items():
        rows = prompt_rows(part, a.context_chars)
        with open(paths[split], "w", encoding="utf-8") as f:
            for r in rows:
                keep = ("prompt", "completion") if split == "sft" else ("prompt", "answer")
                f.write(json.dumps({k: r[k] for k in keep}, ensure_ascii=False) + "\n")
        print(f"  {split}: {len(part)} articles, {len(rows)} questions", flush=True)
    with open(paths["corpus"], "w", encoding="utf-8") as f, \
            open(os.path.join(a.data_dir, "no", "nbailab_wiki_no_100k.txt"), encoding="utf-8") as wiki:
        f.write(wiki.read().rstrip("\n") + "\n")
        for article in parts["sft"]:
            for para in article["paragraphs"]:
                f.write(" ".join(para["context"].split()) + "\n")
    return paths


def sft_checkpoint(a, w, paths, log):
    """The small GPT-2: tokenizer, config (dropout 0), brief pretraining, SFT; the SFT export's directory."""
    tok, pre, sft = (os.path.join(w, n) for n in ("tokenizer", "pretrained", "sft"))
    if not os.path.exists(os.path.join(tok, "config.json")):
        run("train_tokenizer.py", ["--type", "gpt2", "--train_file", paths["corpus"], "--vocab_size",
                                   str(a.vocab_size), "--model_max_length", "256", "--output_dir", tok,
                                   "--overwrite_output_dir"], log)
        run("create_config.py", ["--preset", "gpt2", "--set", "n_layer=4", "n_embd=128", "n_head=4",
                                 "n_positions=256", "resid_pdrop=0.0", "embd_pdrop=0.0", "attn_pdrop=0.0",
                                 "--output_dir", tok], log)
    if not os.path.exists(os.path.join(pre, "model.safetensors")):
        run("run_clm_flax.py", ["--config_name", tok, "--tokenizer_name", tok, "--output_dir", pre, "--train_file",
                                paths["corpus"], "--validation_split_percentage", "2", "--block_size", "128",
                                "--train_batch_size", "32", "--max_steps", str(a.pretrain_steps), "--learning_rate",
                                "3e-3", "--warmup_steps", str(a.pretrain_steps // 10), "--logging_steps", "100",
                                "--eval_steps", str(a.pretrain_steps), "--save_steps", str(a.pretrain_steps),
                                "--dtype", "float32", "--report_to", "none", "--overwrite_output_dir"], log)
    if not os.path.exists(os.path.join(sft, "model.safetensors")):
        run("run_sft.py", ["--model_name_or_path", pre, "--output_dir", sft, "--train_file", paths["sft"],
                           "--validation_split_percentage", "5", "--max_length", "256", "--train_batch_size", "16",
                           "--num_train_epochs", str(a.sft_epochs), "--learning_rate", "1e-3", "--warmup_steps",
                           "50", "--logging_steps", "50", "--save_steps", "100000", "--dtype", "float32",
                           "--report_to", "none", "--overwrite_output_dir"], log)
    return sft


def read_rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def ours(a, w, start, paths, log):
    """{"reward": [(step, mean reward)], "heldout_f1": our last evaluation's, "seconds", "dir"}."""
    out = os.path.join(w, "runs", f"ours-{a.seed}")
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"  # one device, as TRL's one process
        seconds = run("run_grpo.py", [
            "--model_name_or_path", start, "--output_dir", out, "--train_file", paths["grpo"], "--validation_file",
            paths["heldout"], "--reward_funcs", "token_f1", "--num_generations", str(a.num_generations),
            "--max_completion_length", str(a.max_completion_length), "--temperature", "1.0", "--loss_type", "dapo",
            "--beta", "0", "--epsilon", "0.2", "--scale_rewards", "group", "--num_iterations", "1",
            "--per_device_train_batch_size", str(a.batch), "--gradient_accumulation_steps", "1",
            "--per_device_eval_batch_size", "32", "--learning_rate", str(a.learning_rate), "--warmup_steps", "0",
            "--weight_decay", "0", "--adam_beta1", "0.9", "--adam_beta2", "0.999", "--adam_epsilon", "1e-8",
            "--max_grad_norm", "1.0", "--max_steps", str(a.steps), "--logging_steps", "1", "--eval_steps",
            str(a.steps), "--save_steps", "100000", "--seed", str(a.seed), "--dtype", "float32", "--report_to",
            "none", "--overwrite_output_dir"], log)
        with open(os.path.join(out, "wall_seconds.json"), "w") as f:
            json.dump(seconds, f)
    with open(os.path.join(out, "wall_seconds.json")) as f:
        seconds = json.load(f)
    rows = read_rows(os.path.join(out, "metrics.jsonl"))
    evals = [r for r in rows if r.get("split") == "eval" and "rewards/token_f1/mean" in r]
    return {"reward": [(r["step"], r["reward"]) for r in rows if r.get("split") == "train" and "reward" in r],
            "heldout_f1": evals[-1]["rewards/token_f1/mean"] if evals else None, "seconds": seconds, "dir": out}


def theirs(a, w, start, paths):
    """The same for TRL's GRPOTrainer, its final model saved to WORK_DIR/runs/trl-SEED."""
    out = os.path.join(w, "runs", f"trl-{a.seed}")
    figures = os.path.join(out, "figures.json")
    if os.path.exists(figures):
        with open(figures) as f:
            return json.load(f)
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from flaxlm.rl.rewards import token_f1
    torch.set_num_threads(a.threads)
    data = load_dataset("json", data_files={"train": paths["grpo"]})["train"]
    args = GRPOConfig(
        output_dir=os.path.join(w, "trl-tmp"), report_to="none", use_cpu=True, bf16=False, seed=a.seed,
        num_generations=a.num_generations, max_completion_length=a.max_completion_length, temperature=1.0,
        top_p=1.0, top_k=0, loss_type="dapo", beta=0.0, epsilon=0.2, scale_rewards="group", num_iterations=1,
        per_device_train_batch_size=a.batch, gradient_accumulation_steps=1, learning_rate=a.learning_rate,
        lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, optim="adamw_torch", max_grad_norm=1.0, max_steps=a.steps, logging_steps=1,
        save_strategy="no", gradient_checkpointing=False, dataloader_num_workers=0)
    model = AutoModelForCausalLM.from_pretrained(start, trust_remote_code=False, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(start, trust_remote_code=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[token_f1], args=args, train_dataset=data,
                          processing_class=tokenizer)
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    trainer.save_model(out)
    result = {"reward": [(h["step"], h["reward"]) for h in trainer.state.log_history if "reward" in h],
              "heldout_f1": None, "seconds": seconds, "dir": out}
    with open(figures, "w") as f:
        json.dump(result, f)
    return result


def heldout_f1(model_dir, rows, max_new_tokens, threads):
    """Mean token_f1 of one greedy completion per held-out prompt (transformers' generate, one prompt at a time: no
    padding), and the first few completions."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flaxlm.rl.rewards import token_f1
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=False, dtype=torch.float32).eval()
    completions = []
    with torch.no_grad():
        for r in rows:
            ids = tokenizer(r["prompt"], return_tensors="pt").input_ids
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.eos_token_id)
            completions.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    scores = token_f1([r["prompt"] for r in rows], completions, answer=[r["answer"] for r in rows])
    return sum(scores) / len(scores), completions[:5]


def windows(curve, size):
    """[(first step, last step, mean reward)] over consecutive windows of `size` logged steps."""
    return [(curve[i][0], curve[min(i + size, len(curve)) - 1][0],
             sum(r for _, r in curve[i:i + size]) / len(curve[i:i + size])) for i in range(0, len(curve), size)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/grpo_learning")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--context_chars", type=int, default=300, help="the most characters of passage in a prompt")
    p.add_argument("--heldout_articles", type=int, default=40)
    p.add_argument("--grpo_articles", type=int, default=150)
    p.add_argument("--vocab_size", type=int, default=6000)
    p.add_argument("--pretrain_steps", type=int, default=500)
    p.add_argument("--sft_epochs", type=int, default=4)
    p.add_argument("--num_generations", type=int, default=8)
    p.add_argument("--max_completion_length", type=int, default=16)
    p.add_argument("--batch", type=int, default=64, help="completions a step (a multiple of --num_generations)")
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--window", type=int, default=10, help="steps averaged in each row of the reward table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    a = p.parse_args(argv)
    w = os.path.abspath(a.work_dir)
    os.makedirs(w, exist_ok=True)
    log = os.path.join(w, "log.txt")
    paths = write_data(a, w)
    start = sft_checkpoint(a, w, paths, log)
    o = ours(a, w, start, paths, log)
    t = theirs(a, w, start, paths)
    heldout = read_rows(paths["heldout"])
    f1 = {name: heldout_f1(d, heldout, a.max_completion_length, a.threads)
          for name, d in (("sft", start), ("ours", o["dir"]), ("trl", t["dir"]))}

    print(f"GRPO (dapo, beta 0) on {sum(1 for _ in open(paths['grpo']))} NorQuAD prompts: {a.num_generations} "
          f"completions of <= {a.max_completion_length} tokens a prompt, {a.batch} completions a step, lr "
          f"{a.learning_rate:g} linear decay, {a.steps} steps; reward token_f1\n"
          f"| steps | mean reward: run_grpo.py | TRL GRPOTrainer |\n|---|---|---|")
    for (s0, s1, ro), (_, _, rt) in zip(windows(o["reward"], a.window), windows(t["reward"], a.window)):
        print(f"| {s0}-{s1} | {ro:.3f} | {rt:.3f} |")
    print(f"held-out token F1 ({len(heldout)} prompts, greedy, transformers): SFT start {f1['sft'][0]:.3f}, after "
          f"run_grpo.py {f1['ours'][0]:.3f} (its own evaluation: {o['heldout_f1']:.3f}), after TRL {f1['trl'][0]:.3f}")
    print(f"wall time of the GRPO run ({a.steps} steps, CPU): run_grpo.py {o['seconds']:.0f} s (the whole script: "
          f"start-up, compilation, evaluation, export), TRL {t['seconds']:.0f} s (train() only)")
    for name in f1:
        print(f"  {name} greedy samples: {f1[name][1][:3]}")
    with open(os.path.join(w, "curves.json"), "w") as f:
        json.dump({"ours": o, "trl": t, "heldout_f1": {k: v[0] for k, v in f1.items()}, "args": vars(a)}, f,
                  indent=1)


if __name__ == "__main__":
    main()
