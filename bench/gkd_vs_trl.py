#!/usr/bin/env python
"""run_distill.py --mode gkd against TRL's GKDTrainer (trl.experimental.gkd, PyTorch) distilling the same teacher
into the same student on the same prompts with the same settings, on-policy: held-out divergence before and after,
and the time a step takes.

    python bench/gkd_vs_trl.py --work_dir /tmp/gkd-vs-trl      # CPU, ~5 min on 2 cores; needs trl (requirements-dev)

1. Sentences of Norwegian running text (../shared/data/no/ud_bokmaal_texts_{train,dev}.txt, cut at sentence ends,
   --min_words to --max_words words): the train file's for pretraining and GKD's prompts, the dev file's held out.
2. Checkpoints (made once in --work_dir): a BPE of 2,048 tokens (train_tokenizer.py); the teacher a Llama (2 layers,
   width 128) and the student a Llama (1 layer, width 64), each pretrained briefly with run_clm_flax.py on the train
   sentences (one a document, EOS-ended), --teacher_steps and --student_steps. Rotary positions: TRL's collator
   left-pads and its forward passes no position ids, which shifts a learned-position model's (GPT-2's) positions
   but leaves rotary attention (relative) as it is.
3. Conversations: a sentence's first --prompt_words words the user turn, the rest the assistant turn, rendered by a
   plain template (BOS, the turns' text, EOS after the answer): the teacher's pretraining format. Both trainers read
   the template from the checkpoints' tokenizer.
4. GKD from the same two directories, every setting passed to both: lmbda (1: fully on-policy, 0.5), beta, sampling
   temperature, max_new_tokens, batch, steps, AdamW (0.9, 0.999, 1e-8), --learning_rate decayed linearly, no warmup,
   no weight decay, clipping at 1, fp32, seed. The draws (which steps sample, the samples, the order) are each
   trainer's own, so the figures agree in size, not digit for digit.
Prints one table per lmbda: for the student before and after each trainer, on the held-out conversations (one
evaluator, PyTorch, every model read from its exported directory): the generalized JSD (beta) to the teacher on the
data's completions, the same on the student's own completions (one draw at --temperature, seed 0, up to
--max_new_tokens), and the student's next-token loss on the data's completions (run_distill.py's own evaluation of it
beside); then each trainer's median milliseconds per step (steps that sample and steps on the data apart, the first
step left out; PyTorch on --torch_threads threads, JAX at its defaults) and wall time of the whole run.
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

from bench.adapt_vocabulary import done, run  # noqa: E402  -- scripts as subprocesses, logged

# BOS, then every turn's text as it is, the answer ended by EOS: a conversation renders as a pretraining document
PLAIN_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}"
                  "{{ eos_token }}{% endif %}{% endfor %}")


def sentences(path, a):
    """The file's sentences (each paragraph, a line, cut after . ! ?) of --min_words to --max_words words, in order."""
    with open(path, encoding="utf-8") as f:
        found = [s for line in f for s in re.split(r"(?<=[.!?])\s+", line.strip())]
    return [s for s in found if a.min_words <= len(s.split()) <= a.max_words]


def conversation(sentence, prompt_words):
    words = sentence.split()
    return [{"role": "user", "content": " ".join(words[:prompt_words])},
            {"role": "assistant", "content": " " + " ".join(words[prompt_words:])}]


def write_data(a, w):
    """{"text": pretraining sentences file, "train", "heldout": conversations files (TRL's messages)}."""
    paths = {k: os.path.join(w, f) for k, f in (("text", "sentences.txt"), ("train", "train.jsonl"),
                                                 ("heldout", "heldout.jsonl"))}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    train = sentences(os.path.join(a.data_dir, "no", "ud_bokmaal_texts_train.txt"), a)
    heldout = sentences(os.path.join(a.data_dir, "no", "ud_bokmaal_texts_dev.txt"), a)[:a.heldout]
    with open(paths["text"], "w", encoding="utf-8") as f:
        f.writelines(s + "\n" for s in train)
    for key, chosen in (("train", train[::max(1, len(train) // a.prompts)][:a.prompts]), ("heldout", heldout)):
        with open(paths[key], "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"messages": conversation(s, a.prompt_words)}, ensure_ascii=False) + "\n"
                         for s in chosen)
    return paths


def checkpoints(a, w, text, log):
    """{"teacher", "student": directories} (made once): the tokenizer with the plain template, both pretrained."""
    tok = os.path.join(w, "tokenizer")
    if not done(tok, "tokenizer.json"):
        run("train_tokenizer.py", ["--type", "bpe", "--train_file", text, "--vocab_size", "2048",
                                   "--model_max_length", "128", "--output_dir", tok, "--overwrite_output_dir"], log)
    out = {}
    for name, shape, steps in (("teacher", ["num_hidden_layers=2", "hidden_size=128", "intermediate_size=384",
                                            "num_attention_heads=4", "num_key_value_heads=4"], a.teacher_steps),
                               ("student", ["num_hidden_layers=1", "hidden_size=64", "intermediate_size=256",
                                            "num_attention_heads=4", "num_key_value_heads=4"], a.student_steps)):
        config, path = os.path.join(w, f"{name}-config"), os.path.join(w, name)
        if not done(path, "model.safetensors"):
            if not done(config):
                run("create_config.py", ["--preset", "llama-tiny", "--tokenizer_name", tok, "--output_dir", config,
                                         "--set", *shape, "max_position_embeddings=128", "--overwrite_output_dir"],
                    log)
            run("run_clm_flax.py", ["--config_name", config, "--tokenizer_name", tok, "--output_dir", path,
                                    "--train_file", text, "--validation_split_percentage", "2", "--block_size", "64",
                                    "--train_batch_size", "32", "--max_steps", str(steps), "--learning_rate", "3e-3",
                                    "--warmup_steps", str(steps // 10), "--logging_steps", str(steps),
                                    "--eval_steps", str(steps), "--save_steps", str(steps), "--seed", str(a.seed),
                                    "--report_to", "none", "--overwrite_output_dir"], log)
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
            tokenizer.chat_template = PLAIN_TEMPLATE
            tokenizer.save_pretrained(path)
        out[name] = path
    return out


def settings(a, lmbda):
    return dict(lmbda=lmbda, beta=a.beta, temperature=a.temperature, max_new_tokens=a.max_new_tokens, batch=a.batch,
                steps=a.steps, learning_rate=a.learning_rate, seed=a.seed)


def ours(a, w, ckpt, files, lmbda, log):
    """{"dir", "eval": [first, last] held-out loss, "ms": {kind: median ms}, "wall": s} of run_distill.py."""
    out = os.path.join(w, "runs", f"ours-lmbda{lmbda:g}")
    wall_file = os.path.join(out, "bench_wall.json")
    if not os.path.exists(wall_file):
        wall = run("run_distill.py", [
            "--mode", "gkd", "--output_dir", out, "--model_name_or_path", ckpt["student"],
            "--teacher_model_name_or_path", ckpt["teacher"], "--train_file", files["train"], "--validation_file",
            files["heldout"], "--max_length", str(a.max_length), "--lmbda", str(lmbda), "--beta", str(a.beta),
            "--temperature", str(a.temperature), "--max_new_tokens", str(a.max_new_tokens), "--train_batch_size",
            str(a.batch), "--per_device_eval_batch_size", "64", "--max_steps", str(a.steps), "--learning_rate",
            str(a.learning_rate), "--warmup_steps", "0", "--weight_decay", "0", "--max_grad_norm", "1.0",
            "--logging_steps", "1", "--eval_at_start", "--eval_steps", str(a.steps), "--save_steps", "100000",
            "--seed", str(a.seed), "--dtype", "float32", "--param_dtype", "float32", "--report_to", "none",
            "--overwrite_output_dir"], log)
        with open(wall_file, "w") as f:
            json.dump(wall, f)
    with open(wall_file) as f:
        wall = json.load(f)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    train = [r for r in rows if r["split"] == "train" and "step_ms" in r]
    ms = {kind: statistics.median(r["step_ms"] for r in train if r["on_policy"] == flag) if any(
        r["on_policy"] == flag for r in train) else None for kind, flag in (("sampled", 1.0), ("data", 0.0))}
    return {"dir": out, "eval": [r["loss"] for r in rows if r["split"] == "eval"], "ms": ms, "wall": wall}


def theirs(a, w, ckpt, files, lmbda):
    """{"dir", "ms": {kind: median ms}, "wall": s} of TRL's GKDTrainer (the final student saved in --work_dir)."""
    out = os.path.join(w, "runs", f"trl-lmbda{lmbda:g}")
    if os.path.exists(os.path.join(out, "bench_times.json")):
        with open(os.path.join(out, "bench_times.json")) as f:
            return {"dir": out, **json.load(f)}
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    class Timed(GKDTrainer):
        sampled = False

        def generate_on_policy_outputs(self, model, inputs, generation_config):  # TRL's, noting that it sampled
            self.sampled = True
            return GKDTrainer.generate_on_policy_outputs(model, inputs, generation_config)

    steps = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            trainer.sampled, self.t0 = False, time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            steps.append((trainer.sampled, 1000 * (time.perf_counter() - self.t0)))

    tokenizer = AutoTokenizer.from_pretrained(ckpt["student"], trust_remote_code=False)
    args = GKDConfig(output_dir=os.path.join(w, "trl-tmp"), report_to="none", use_cpu=True, bf16=False, seed=a.seed,
                     per_device_train_batch_size=a.batch, max_length=a.max_length, lmbda=lmbda, beta=a.beta,
                     temperature=a.temperature, max_new_tokens=a.max_new_tokens, learning_rate=a.learning_rate,
                     max_steps=a.steps, lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0,
                     max_grad_norm=1.0, logging_steps=a.steps, save_strategy="no", dataloader_num_workers=0)
    trainer = Timed(model=AutoModelForCausalLM.from_pretrained(ckpt["student"], trust_remote_code=False),
                    teacher_model=AutoModelForCausalLM.from_pretrained(ckpt["teacher"], trust_remote_code=False),
                    args=args,
                    processing_class=tokenizer, train_dataset=load_dataset("json", data_files=files["train"])["train"],
                    callbacks=[StepTimes()])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    timed = steps[1:]  # the first step warms up
    figures = {"ms": {kind: statistics.median(ms for s, ms in timed if s == flag) if any(
        s == flag for s, _ in timed) else None for kind, flag in (("sampled", True), ("data", False))},
        "wall": wall}
    with open(os.path.join(out, "bench_times.json"), "w") as f:
        json.dump(figures, f)
    return {"dir": out, **figures}


def heldout_scores(model_dir, teacher, tokenizer, convs, a):
    """{"jsd_data", "jsd_own", "loss"}: token means over the held-out answers (see the module's docstring)."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.experimental.gkd import GKDTrainer
    from flaxlm.data.chat_rows import encode
    from flaxlm.data.conversations import Example
    student = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=False).eval()
    seqs = [encode(tokenizer, PLAIN_TEMPLATE, Example(messages=m)) for m in convs]

    def score(seqs):  # (jsd sum, loss sum, tokens) over each sequence's taught tokens, right-padded batches
        jsd, loss, n = 0.0, 0.0, 0
        for i in range(0, len(seqs), 32):
            chunk = seqs[i:i + 32]
            length = max(len(ids) for ids, _ in chunk)
            ids = torch.tensor([ids + [tokenizer.pad_token_id] * (length - len(ids)) for ids, _ in chunk])
            mask = torch.tensor([[1] * len(x) + [0] * (length - len(x)) for x, _ in chunk])
            labels = torch.where(torch.tensor([t + [0] * (length - len(t)) for _, t in chunk]) > 0, ids, -100)
            with torch.no_grad():
                s, t = (m(input_ids=ids, attention_mask=mask).logits[:, :-1] for m in (student, teacher))
            jsd += float(GKDTrainer.generalized_jsd_loss(s, t, labels[:, 1:], beta=a.beta, reduction="sum"))
            loss += float(torch.nn.functional.cross_entropy(s.reshape(-1, s.shape[-1]), labels[:, 1:].reshape(-1),
                                                            ignore_index=-100, reduction="sum"))
            n += int((labels[:, 1:] != -100).sum())
        return jsd / n, loss / n

    jsd_data, loss = score(seqs)
    own = []  # the student's own completions of the prompts: one draw, seed 0, cut after EOS
    torch.manual_seed(0)
    for i in range(0, len(seqs), 32):
        prompts = [ids[:trained.index(1)] for ids, trained in seqs[i:i + 32]]
        width = max(map(len, prompts))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = student.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=a.temperature,
                                   top_k=0, top_p=1.0, max_new_tokens=a.max_new_tokens,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        for p, completion in zip(prompts, out[:, width:].tolist()):
            if tokenizer.eos_token_id in completion:
                completion = completion[:completion.index(tokenizer.eos_token_id) + 1]
            own.append((p + completion, [0] * len(p) + [1] * len(completion)))
    jsd_own, _ = score(own)
    return {"jsd_data": jsd_data, "jsd_own": jsd_own, "loss": loss}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default="/tmp/flaxlm-gkd-vs-trl")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--min_words", type=int, default=8)
    p.add_argument("--max_words", type=int, default=24)
    p.add_argument("--prompt_words", type=int, default=4)
    p.add_argument("--prompts", type=int, default=1024, help="training conversations")
    p.add_argument("--heldout", type=int, default=128, help="held-out conversations")
    p.add_argument("--teacher_steps", type=int, default=300)
    p.add_argument("--student_steps", type=int, default=100)
    p.add_argument("--lmbdas", type=float, nargs="+", default=[1.0, 0.5])
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--max_new_tokens", type=int, default=32)
    p.add_argument("--max_length", type=int, default=96)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch_threads", type=int, default=1,
                   help="torch's intra-op threads (TRL and the evaluation): one is fastest for models this small on a "
                        "shared CPU (two spin-wait: measured ~10x slower steps on 2 busy cores)")
    a = p.parse_args(argv)
    w = os.path.abspath(a.work_dir)
    os.makedirs(os.path.join(w, "runs"), exist_ok=True)
    log = os.path.join(w, "log.txt")
    print(f"work dir {w} (script output in {log})", flush=True)
    files = write_data(a, w)
    ckpt = checkpoints(a, w, files["text"], log)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(a.torch_threads)
    tokenizer = AutoTokenizer.from_pretrained(ckpt["student"], trust_remote_code=False)
    teacher = AutoModelForCausalLM.from_pretrained(ckpt["teacher"], trust_remote_code=False).eval()
    with open(files["heldout"], encoding="utf-8") as f:
        convs = [json.loads(line)["messages"] for line in f]
    before = heldout_scores(ckpt["student"], teacher, tokenizer, convs, a)
    results = {"before": before}
    for lmbda in a.lmbdas:
        o, t = ours(a, w, ckpt, files, lmbda, log), theirs(a, w, ckpt, files, lmbda)
        o["scores"], t["scores"] = (heldout_scores(r["dir"], teacher, tokenizer, convs, a) for r in (o, t))
        results[f"lmbda {lmbda:g}"] = {"ours": o, "trl": t}
        print(f"\nlmbda {lmbda:g}, beta {a.beta:g}: {a.steps} steps of {a.batch}, lr {a.learning_rate:g}, sampling at "
              f"{a.temperature:g} up to {a.max_new_tokens} tokens; {len(convs)} held-out conversations; torch on "
              f"{a.torch_threads} thread(s)\n"
              "| held-out | student before | run_distill.py after | TRL GKDTrainer after |\n|---|---|---|---|")
        for key, name in (("jsd_data", "generalized JSD to the teacher, data's completions"),
                          ("jsd_own", "generalized JSD to the teacher, student's own completions"),
                          ("loss", "student's next-token loss, data's completions")):
            print(f"| {name} | {before[key]:.4f} | {o['scores'][key]:.4f} | {t['scores'][key]:.4f} |")
        print(f"| (run_distill.py's own evaluation of that loss) | {o['eval'][0]:.4f} | {o['eval'][-1]:.4f} | |")
        for kind, name in (("sampled", "ms per step that samples (median)"), ("data", "ms per step on the data")):
            if o["ms"][kind] is not None or t["ms"][kind] is not None:
                fmt = [f"{r['ms'][kind]:.0f}" if r["ms"][kind] is not None else "-" for r in (o, t)]
                print(f"| {name} | | {fmt[0]} | {fmt[1]} |")
        print(f"| wall time of the run (s; ours: the whole script, TRL: train()) | | {o['wall']:.0f} | "
              f"{t['wall']:.0f} |", flush=True)
    with open(os.path.join(w, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
