"""The README's "A new language, end to end" runs as written: every command of its block, read from README.md and
run in order in one folder, each step's output feeding the next, must exit 0.

What the test adds, and only that: files a user would have (no_train.txt and no_valid.txt: CPython's documentation,
the demo's corpus; gpt2-en/: a tiny English GPT-2 built by transformers; conversations.jsonl, pairs.jsonl; the
Norwegian suite's files, a few examples of each task in its format, under --data_dir since CI has no network), and
flags appended to each command that make it tiny (TINY: a later flag wins over the README's). The hub --push_to_hub
sends to is a stand-in (tests/readme_command.py). A command the README breaks (a flag renamed, a step whose output
the next cannot read) fails here with the command and its last lines of output."""
import json
import os
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "## A new language, end to end"

# Appended to each script's command: tiny sizes, few steps. Nothing here may make a broken README command pass.
TINY = {
    "train_tokenizer.py": ["--vocab_size", "512"],
    "create_config.py": ["--set", "n_layer=2", "n_embd=32", "n_head=2"],
    "adapt_vocabulary.py": [],
    "prepare_data.py": ["--block_size", "128"],
    "run_clm_flax.py": ["--block_size", "128", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size",
                        "4", "--max_steps", "3", "--warmup_steps", "1", "--logging_steps", "1"],
    "evaluate_suite.py": ["--data_dir", "suite-data"],
    "run_sft.py": ["--max_length", "128", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
                   "--max_steps", "2"],
    "run_dpo.py": ["--max_length", "128", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
                   "--max_steps", "2"],
    "generate.py": ["--max_new_tokens", "8"],
}


def readme_commands():
    """The `python ...` commands of the section's bash block, as argument lists, in order."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(SECTION):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    commands, line = [], ""
    for raw in block.splitlines():
        if raw.lstrip().startswith("#") and not line:
            continue
        line += raw.rstrip().removesuffix("\\") + " " if raw.rstrip().endswith("\\") else raw
        if not raw.rstrip().endswith("\\"):
            if line.strip():
                commands.append(shlex.split(line))
            line = ""
    return commands


def write_user_files(d):
    """What a user brings to the block: text of the language, an English GPT-2, conversations, preference pairs and
    the suite's files (in --data_dir's layout, configs/suites/norwegian.yaml)."""
    from flaxlm.data.demo_corpus import write_demo_corpus
    paths = write_demo_corpus(str(d / "corpus"))
    lines = open(paths["train"], encoding="utf-8").read().splitlines()
    (d / "no_train.txt").write_text("\n".join(lines[:1500]) + "\n", encoding="utf-8")
    (d / "no_valid.txt").write_text(open(paths["validation"], encoding="utf-8").read(), encoding="utf-8")
    write_english_gpt2(d / "gpt2-en", lines[1500:3000])
    questions = [("Hva er hovedstaden i Norge?", "Oslo."), ("Hva heter den lengste elva?", "Glomma."),
                 ("Hvor mange fylker?", "Femten."), ("Hva spiser vi til frokost?", "Brød med ost.")]
    with open(d / "conversations.jsonl", "w", encoding="utf-8") as f:
        for q, a in questions * 5:
            f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                             {"role": "assistant", "content": a}]}, ensure_ascii=False) + "\n")
    with open(d / "pairs.jsonl", "w", encoding="utf-8") as f:
        for (q, a), (_, worse) in zip(questions * 5, (questions[1:] + questions[:1]) * 5):
            f.write(json.dumps({"prompt": [{"role": "user", "content": q}],
                                "chosen": [{"role": "assistant", "content": a}],
                                "rejected": [{"role": "assistant", "content": worse}]}, ensure_ascii=False) + "\n")
    write_suite_files(d / "suite-data" / "no", lines[3000:3100])


def write_english_gpt2(out, lines):
    """gpt2-en/: a 2-layer GPT-2 of width 32 with its own GPT-2 tokenizer, as transformers saves one."""
    import torch
    import transformers
    from flaxlm.tokenization.trainers import train_gpt2_bpe
    tokenizer = train_gpt2_bpe(iter(lines), vocab_size=400)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=32, n_layer=2, n_head=2,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def write_suite_files(d, texts):
    """A few examples of each task of the Norwegian suite, in its file's format."""
    d.mkdir(parents=True)
    sentences = [{"text": t[:80], "label": "Positive" if k % 3 else "Negative"} for k, t in enumerate(texts[:40])]
    for name, part in (("train", sentences[:30]), ("dev", sentences[30:])):
        (d / f"norec_sentence_binary_{name}.json").write_text(json.dumps(part), encoding="utf-8")
    (d / "nn_nb_dev.jsonl").write_text("".join(json.dumps({"nn": t[:60], "nb": t[:60].lower()}) + "\n"
                                               for t in texts[40:70]), encoding="utf-8")
    (d / "ud_bokmaal_texts_dev.txt").write_text("\n".join(texts[70:100]) + "\n", encoding="utf-8")
    conllu = []
    for k, t in enumerate(texts[:20]):
        words = t.split()[:8]
        rows = [f"{i + 1}\t{w}\t{w}\t{'NOUN' if i % 2 else 'VERB'}\t_\t_\t0\troot\t_\t"
                f"name={'B-PER' if i == 0 and k % 2 else 'O'}" for i, w in enumerate(words)]
        conllu.append(f"# sent_id = {k}\n# text = {' '.join(words)}\n" + "\n".join(rows) + "\n")
    for name in ("ud_bokmaal_dev.conllu", "norne_nob_train.conllu", "norne_nob_dev.conllu"):
        (d / name).write_text("\n".join(conllu) + "\n", encoding="utf-8")


def test_the_readme_block_parses_into_the_pipeline():
    """The block the pipeline test runs: the steps the README shows, each a script TINY knows."""
    scripts = [c[1] for c in readme_commands()]
    assert scripts == ["train_tokenizer.py", "create_config.py", "adapt_vocabulary.py", "prepare_data.py",
                       "run_clm_flax.py", "run_clm_flax.py", "evaluate_suite.py", "run_sft.py", "run_dpo.py",
                       "generate.py"]
    assert all(c[0] == "python" for c in readme_commands())


def test_the_readme_new_language_block_runs_as_written(tmp_path):
    write_user_files(tmp_path)
    os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")  # the commands name the repository's recipes
    (tmp_path / "hub").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a user's laptop has
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for command in readme_commands():
        script, args = command[1], command[2:]
        argv = [sys.executable, os.path.join(ROOT, "tests", "readme_command.py"), str(tmp_path / "hub"),
                os.path.join(ROOT, script), *args, *TINY[script]]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        said = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 0, f"{shlex.join(command)}\nexit {done.returncode}:\n" + "\n".join(said[-25:])
    # What the block promises: an export transformers loads, pushed with its card, that chats.
    import transformers
    export = tmp_path / "runs" / "my-gpt2-dpo"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(export))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer("Hei på deg")["input_ids"] == tokenizer("Hei på deg", add_special_tokens=False)["input_ids"]
    pushed = tmp_path / "hub" / "my-org" / "norsk-gpt2-chat"
    assert {"config.json", "model.safetensors", "README.md"} <= set(os.listdir(pushed))
    results = json.loads((tmp_path / "runs" / "my-gpt2-suite" / "results.json").read_text())
    assert results, "the suite scored no task"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
