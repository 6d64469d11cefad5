"""run_fewshot.py and the decoder tasks of evaluate_suite.py: prompts built as documented, scores equal to
scikit-learn's, sacrebleu's and SQuAD's on the predictions file, chat prompts as the template renders them, the
suite's decoder rows, and one-line errors."""
import json
import shutil

import numpy as np
import pytest

from flaxlm.errors import run_main
from flaxlm.tasks.fewshot import PromptTemplate, draw_shots

import evaluate_suite
import run_fewshot

WORDS = ["good", "bad", "fine", "awful", "nice", "poor", "great", "weak"]


@pytest.fixture(scope="module")
def gpt2(model_dir_for, tmp_path_factory):
    """A tiny GPT-2 with random weights and our BPE tokenizer."""
    from flaxlm.models import create_model, load_config, split_model
    from flaxlm.models.pretrained import save_pretrained
    d = tmp_path_factory.mktemp("fewshot-gpt2")
    shutil.copytree(model_dir_for("gpt2-tiny", vocab_size=304, model_max_length=256), d, dirs_exist_ok=True)
    config = load_config(str(d))
    save_pretrained(str(d), config, split_model(create_model(config, seed=3))[1])
    return str(d)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A sentiment task (json, labels Positive/Negative) and a copy-the-words task (jsonl), train and validation."""
    d = tmp_path_factory.mktemp("fewshot-data")
    rng = np.random.default_rng(0)
    sentiment = [{"text": f"it was {w} and {WORDS[(i * 3) % 8]}", "label": "Positive" if i % 3 else "Negative"}
                 for i, w in enumerate(rng.choice(WORDS, 30))]
    (d / "train.json").write_text(json.dumps(sentiment[:20]))
    (d / "valid.json").write_text(json.dumps(sentiment[20:]))
    pairs = [{"a": f"{w} one", "b": f"{w} two"} for w in rng.choice(WORDS, 20)]
    (d / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (d / "text.txt").write_text("".join(f"{s['text']} .\n" for s in sentiment))
    return d


def test_the_prompt_is_the_solved_examples_then_the_question():
    template = PromptTemplate("Text: {text}\nSentiment:", separator="\n\n")
    shots = [{"text": "a", "label": 1}, {"text": "b", "label": 0}]
    prompt = template.prompt(shots, {"text": "c", "label": 1}, lambda s: [" no", " yes"][s["label"]])
    assert prompt == "Text: a\nSentiment: yes\n\nText: b\nSentiment: no\n\nText: c\nSentiment:"
    rows = [{"i": i} for i in range(10)]
    drawn = draw_shots(rows, 4, seed=5)
    assert drawn == draw_shots(rows, 4, seed=5) and len({r["i"] for r in drawn}) == 4
    assert drawn != draw_shots(rows, 4, seed=6) and draw_shots(rows, 0, 5) == [] and len(draw_shots(rows, 99, 5)) == 10


class CharLM:
    """A stand-in CausalLM for counting: one token per character, prefix 0, a context of max_length tokens."""
    prefix = 0

    def __init__(self, max_length):
        self.max_length = max_length
        self.tokenizer = type("Decoder", (), {"decode": staticmethod(lambda ids, skip_special_tokens: "")})

    def encode(self, text):
        return [ord(c) for c in text]

    def scorer(self, requests):
        self.requests = requests
        return np.zeros(len(requests)), None

    def generate(self, ids, max_new_tokens):
        self.prompts = ids
        return [[] for _ in ids]


def test_prompts_cut_to_the_context_are_counted_in_one_line(capsys):
    """A prompt longer than the context loses its beginning (lm-eval's cut); the run says how many of them, and the
    fix: each count is the prompts whose tokens did not all reach the model."""
    from flaxlm.tasks.fewshot_runs import answer_choices, answer_generations
    template = PromptTemplate("T: {text}\nS:")
    shots = [{"text": "ab", "label": "p"}]
    questions = [{"text": "x" * n, "label": "pn"[n % 2]} for n in (1, 2, 9, 30)]
    lm = CharLM(max_length=30)
    answer_choices(lm, template, shots, questions, "label", {"p": " yes", "n": " no"})
    # the prefix, "T: ab\nS: yes", the separator, "T: x...\nS:", " yes" (the longer choice): 25 + n tokens
    whole = [1 + len(template.prompt(shots, q, lambda _: " yes") + " yes") for q in questions]
    assert whole == [25 + n for n in (1, 2, 9, 30)] and sum(n > lm.max_length + 1 for n in whole) == 2
    assert max(len(ids) for ids, _ in lm.requests) == lm.max_length + 1  # what the scorer got: cut to the context
    line = capsys.readouterr().out.strip()
    assert line.startswith("warning: 2 of 4 prompts are longer than the 30 tokens of context the model has") and \
        "pass a smaller --num_fewshot, or judge a model with a longer context" in line
    target = PromptTemplate(" {label}")
    answer_generations(lm, template, shots, questions, target, "text", ["\n"], max_new_tokens=10)
    whole = [1 + len(template.prompt(shots, q, target.fill)) for q in questions]  # 19 + n tokens
    assert whole == [19 + n for n in (1, 2, 9, 30)] and [len(ids) for ids in lm.prompts] == [min(n, 20) for n in whole]
    assert "warning: 3 of 4 prompts are longer than the 20 tokens of context the model's 30 leave beside " \
           "--max_new_tokens 10" in capsys.readouterr().out
    answer_generations(CharLM(max_length=100), template, shots, questions, target, "text", ["\n"], 8)
    assert "warning" not in capsys.readouterr().out


def choice_argv(gpt2, data, out):
    return ["--model_name_or_path", gpt2, "--output_dir", str(out), "--train_file", str(data / "train.json"),
            "--validation_file", str(data / "valid.json"), "--prompt", "Text: {text}\\nSentiment:",
            "--choices", '{"Positive": " good", "Negative": " bad"}', "--num_fewshot", "3"]


def test_choice_scores_are_scikit_learns_on_the_predictions(gpt2, data, tmp_path):
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
    from flaxlm.tasks.suite.scores import class_scored
    results = run_fewshot.main(choice_argv(gpt2, data, tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "predictions_validation.jsonl").read_text().splitlines()]
    assert len(rows) == results["questions"] == 10 and results["num_fewshot"] == 3
    golds, preds = [r["gold"] for r in rows], [r["prediction"] for r in rows]
    for r in rows:  # the answer is the choice of the highest log-likelihood; the prompt ends with the question
        assert r["prediction"] == max(r["log_likelihoods"], key=r["log_likelihoods"].get)
        assert r["prompt"].count("\nSentiment:") == 4 and r["prompt"].endswith("\nSentiment:")
    expected = {"accuracy": accuracy_score(golds, preds), "mcc": matthews_corrcoef(golds, preds),
                "macro_f1": f1_score(golds, preds, average="macro", labels=["Positive", "Negative"], zero_division=0)}
    for metric, value in expected.items():
        assert results[metric] == pytest.approx(100 * value)
        assert class_scored(golds, preds, ["Positive", "Negative"], metric).value == pytest.approx(100 * value)
    assert len(set(preds)) == 2 or results["mcc"] == 0  # sklearn's MCC of a constant answer: 0


def test_generation_scores_are_sacrebleus_on_the_predictions(gpt2, data, tmp_path):
    from sacrebleu.metrics import BLEU, CHRF
    results = run_fewshot.main(["--model_name_or_path", gpt2, "--output_dir", str(tmp_path), "--task_type",
                                "generate", "--train_file", str(data / "pairs.jsonl"), "--validation_split_percentage",
                                "25", "--prompt", "A: {a}\\nB:", "--target", " {b}", "--stop", "\\n", "B:",
                                "--num_fewshot", "2", "--max_new_tokens", "12"])
    rows = [json.loads(line) for line in (tmp_path / "predictions_validation.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all("\n" not in r["prediction"] and "B:" not in r["prediction"] for r in rows)
    assert all(r["source"] in r["prompt"] and r["reference"].endswith("two") for r in rows)
    hyps, refs = [r["prediction"] for r in rows], [r["reference"] for r in rows]
    assert results["chrf"] == pytest.approx(CHRF().corpus_score(hyps, [refs]).score)
    assert results["bleu"] == pytest.approx(BLEU().corpus_score(hyps, [refs]).score)


def test_chat_questions_are_the_template_s_turns_and_scored_as_squad(gpt2, data, tmp_path):
    """--chat: each prompt is the tokenizer's chat template over the solved examples as user/assistant turns and the
    question as the last user turn (transformers' apply_chat_template); --metric squad: exact match and F1 of the
    predictions against every gold answer of --answers_column, run_qa.py's scores."""
    from transformers import AutoTokenizer
    from flaxlm.data.chat_template import CHATML
    from flaxlm.tasks.squad_metric import exact_match, f1
    model = tmp_path / "chat-model"
    shutil.copytree(gpt2, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHATML
    tok.save_pretrained(model)
    qa = [{"question": f"what is {w}?", "answer": f"{w} one", "answers": [f"{w} one", w]}
          for w in WORDS]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qa))
    results = run_fewshot.main(["--model_name_or_path", str(model), "--output_dir", str(tmp_path / "out"),
                                "--task_type", "generate", "--chat", "--train_file", str(tmp_path / "qa.jsonl"),
                                "--validation_split_percentage", "50", "--prompt", "{question}", "--target",
                                "{answer}", "--metric", "squad", "--answers_column", "answers", "--num_fewshot", "1",
                                "--max_new_tokens", "6"])
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions_validation.jsonl").read_text().splitlines()]
    assert len(rows) == results["questions"] == 4
    by_question = {q["question"]: q for q in qa}
    shot = next(q for q in qa if f"{q['question']}<|im_end|>\n<|im_start|>assistant\n{q['answer']}<|im_end|>"
                in rows[0]["prompt"])
    exact, f1s = [], []
    for r in rows:
        q = by_question[r["source"]]
        assert r["prompt"] == tok.apply_chat_template(
            [{"role": "user", "content": shot["question"]}, {"role": "assistant", "content": shot["answer"]},
             {"role": "user", "content": q["question"]}], add_generation_prompt=True, tokenize=False)
        exact.append(max(exact_match(r["prediction"], g) for g in q["answers"]))
        f1s.append(max(f1(r["prediction"], g) for g in q["answers"]))
    assert results["exact"] == pytest.approx(100 * np.mean(exact))
    assert results["f1"] == pytest.approx(100 * np.mean(f1s))


@pytest.mark.parametrize("case", ["missing_column", "duplicate_choices", "unknown_label", "encoder", "chat"])
def test_bad_input_is_one_line(case, gpt2, data, model_dir_for, tmp_path, capsys):
    argv = choice_argv(gpt2, data, tmp_path)
    if case == "missing_column":
        argv[argv.index("--prompt") + 1] = "Text: {sentence}"
    elif case == "duplicate_choices":
        argv[argv.index("--choices") + 1] = '{"Positive": " good", "Negative": " good"}'
    elif case == "unknown_label":
        argv[argv.index("--choices") + 1] = '{"Positive": " good", "Neutral": " bad"}'
    elif case == "chat":
        argv += ["--chat", "--task_type", "generate", "--target", "{label}"]
    else:
        argv[argv.index("--model_name_or_path") + 1] = model_dir_for("roberta-tiny")
    with pytest.raises(SystemExit) as e:
        run_main(lambda: run_fewshot.main(argv))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert {"missing_column": "names the column {sentence}, which the data does not have",
            "duplicate_choices": "have the same verbalization ' good'",
            "unknown_label": "label 'Negative' has no verbalization in --choices",
            "encoder": "roberta model, which does not predict text left to right",
            "chat": "--chat needs a chat template"}[case] in err
    assert not (tmp_path / "predictions_validation.jsonl").exists()


def test_the_suite_judges_a_decoder(gpt2, data, model_dir_for, tmp_path, capsys):
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""defaults: {{seed: 1, logging_steps: 5, per_device_eval_batch_size: 2}}
tasks:
  - {{name: sentiment, kind: classification, train_file: train.json, validation_file: valid.json}}
  - name: sentiment_fewshot
    kind: choice
    metric: mcc
    train_file: train.json
    validation_file: valid.json
    prompt: "Text: {{text}}\\nSentiment:"
    choices: {{Positive: " good", Negative: " bad"}}
    num_fewshot: 2
  - {{name: bits, kind: bits_per_byte, validation_file: text.txt, max_length: 64}}
""")
    other = tmp_path / "other"
    shutil.copytree(gpt2, other)
    from flaxlm.models import create_model, load_config, split_model
    from flaxlm.models.pretrained import save_pretrained
    save_pretrained(str(other), load_config(str(other)), split_model(create_model(load_config(str(other)), seed=9))[1])
    evaluate_suite.main(["--model_name_or_path", gpt2, "--suite", str(suite), "--data_dir", str(data),
                         "--output_dir", str(tmp_path / "out"), "--baseline_model", str(other),
                         "--bootstrap_resamples", "50"])
    assert "skipping sentiment: classification tasks are for encoder models" in capsys.readouterr().out
    rows = {r["task"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["results"]}
    assert set(rows) == {"sentiment_fewshot", "bits"}  # generate is scored as seq2seq is (test_suite.py)
    for row in rows.values():
        assert "error" not in row, row
        assert row["low"] <= row["score"] <= row["high"] and row["baseline"] is not None
    bits = json.loads((tmp_path / "out" / "bits" / "results.json").read_text())
    assert rows["bits"]["score"] == pytest.approx(bits["bits_per_byte"])
    baseline = json.loads((tmp_path / "out" / "bits" / "baseline" / "results.json").read_text())
    assert rows["bits"]["baseline"] == pytest.approx(baseline["bits_per_byte"]) != bits["bits_per_byte"]
