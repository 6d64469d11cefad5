"""lm-evaluation-harness on our JAX models (flaxlm.tasks.lm_eval_model): on local tasks of each request kind, every
request's answer equals lm-eval's own `hf` backend's on the same export (transformers, PyTorch), and so does the
task's metric; lm_eval_flaxlm.py runs lm-eval's command line with the model registered."""
import json
import math

import numpy as np
import pytest

pytest.importorskip("lm_eval")

from test_evaluate_lm import hf_export  # noqa: E402
from tpu_compile import tiny_preset  # noqa: E402

TASKS = {
    "flaxlm_choice": """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - metric: acc
  - metric: acc_norm""",
    "flaxlm_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte""",
    "flaxlm_generate": """output_type: generate_until
doc_to_text: "{{source}} ="
doc_to_target: "{{target}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 10
  do_sample: false
metric_list:
  - metric: exact_match""",
}
DOCS = {
    "flaxlm_choice": [{"question": "The index is out of", "choices": [" range", " order", " the list"], "label": 0},
                      {"question": "Raise an", "choices": [" exception", " error"], "label": 1},
                      {"question": "", "choices": ["None", "True", "False"], "label": 2}],
    "flaxlm_rolling": [{"text": "A long line: " + " ".join(f"word{i} and more," for i in range(14))},
                       {"text": "Short text."}],
    "flaxlm_generate": [{"source": "one two three", "target": " four"}, {"source": "the key is", "target": " x"},
                        {"source": "if the value", "target": " is"}],
}


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    """A folder of lm-eval task yamls, each over a local jsonl file (as lm-eval allows)."""
    d = tmp_path_factory.mktemp("lm-eval-tasks")
    for name, body in TASKS.items():
        data = d / f"{name}.jsonl"
        data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS[name]), encoding="utf-8")
        (d / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                        f"    test: {data}\ntest_split: test\n{body}\n", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def export_of(model_dir_for, tmp_path_factory):
    """export_of(family): a tiny model of the family, random noisy weights, saved by transformers with its
    tokenizer (once a module)."""
    made = {}

    def export(family):
        if family not in made:
            made[family] = tmp_path_factory.mktemp(f"{family}-export")
            hf_export(model_dir_for(tiny_preset(family), model_max_length=128), made[family])
        return made[family]
    return export


def evaluate(model, tasks_dir):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    tasks = TaskManager(include_path=str(tasks_dir), include_defaults=False)  # lm-eval's own: 8 s to index
    return simple_evaluate(model=model, tasks=list(TASKS), task_manager=tasks,
                           log_samples=True, bootstrap_iters=0, random_seed=0, numpy_random_seed=0,
                           torch_random_seed=0, fewshot_random_seed=0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_every_request_equals_lm_evals_hf_backend(family, export_of, tasks_dir):
    export = export_of(family)
    from lm_eval.models.huggingface import HFLM
    from flaxlm.tasks.lm_eval_model import FlaxLM
    ours = evaluate(FlaxLM(pretrained=str(export), batch_size=2, max_length=48), tasks_dir)
    theirs = evaluate(HFLM(pretrained=str(export), batch_size=2, max_length=48, dtype="float32", device="cpu"),
                      tasks_dir)
    for task in TASKS:
        a, b = ours["samples"][task], theirs["samples"][task]
        assert len(a) == len(b) == len(DOCS[task])
        for x, y in zip(a, b):
            assert x["arguments"] == y["arguments"]
            for rx, ry in zip(x["resps"], y["resps"]):
                if task == "flaxlm_generate":
                    assert rx == ry  # identical text, so identical tokens
                else:
                    ll_x, ll_y = (r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in (rx, ry))
                    np.testing.assert_allclose(ll_x, ll_y, rtol=1e-4, atol=1e-4)
                    if task == "flaxlm_choice":
                        assert rx[0][1] == ry[0][1]  # is_greedy
        metrics = {k: v for k, v in theirs["results"][task].items() if isinstance(v, float) and "stderr" not in k}
        assert metrics
        for name, value in metrics.items():
            assert math.isclose(ours["results"][task][name], value, rel_tol=1e-4), (task, name)
    assert any(r[0] for x in ours["samples"]["flaxlm_generate"] for r in x["resps"])  # something was generated


def test_the_command_line_runs_lm_eval_with_the_model_registered(export_of, tasks_dir, tmp_path):
    import lm_eval_flaxlm
    export = export_of("gpt2")
    lm_eval_flaxlm.main(["--model", "flaxlm", "--model_args", f"pretrained={export},max_length=48", "--batch_size", "2",
                         "--tasks", "flaxlm_rolling", "--include_path", str(tasks_dir), "--output_path",
                         str(tmp_path / "out")])
    (results,) = (tmp_path / "out").rglob("results_*.json")
    figures = json.loads(results.read_text())["results"]["flaxlm_rolling"]
    assert figures["bits_per_byte,none"] > 0


PLAIN_CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
              "{% if add_generation_prompt %}assistant:{% endif %}")


def test_chat_template_and_multiturn_fewshot_as_lm_evals_hf_backend(export_of, tasks_dir, tmp_path):
    """--apply_chat_template --fewshot_as_multiturn: the requests rendered by the export's chat template (run_sft.py's
    exports carry one) as the hf backend renders them, with the same answers."""
    import shutil
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer
    from flaxlm.tasks.lm_eval_model import FlaxLM
    export = tmp_path / "chat"
    shutil.copytree(export_of("gpt2"), export)
    tok = AutoTokenizer.from_pretrained(export)
    tok.chat_template = PLAIN_CHAT
    tok.save_pretrained(export)
    tasks = ["flaxlm_choice", "flaxlm_generate"]

    def run(model):
        return simple_evaluate(model=model, tasks=tasks, task_manager=TaskManager(include_path=str(tasks_dir),
                                                                                  include_defaults=False),
                               num_fewshot=1, apply_chat_template=True, fewshot_as_multiturn=True,
                               system_instruction="Answer.", log_samples=True, bootstrap_iters=0, random_seed=0,
                               numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    ours = run(FlaxLM(pretrained=str(export), batch_size=2, max_length=96))
    theirs = run(HFLM(pretrained=str(export), batch_size=2, max_length=96, dtype="float32", device="cpu"))
    for task in tasks:
        for x, y in zip(ours["samples"][task], theirs["samples"][task]):
            assert x["arguments"] == y["arguments"] and "assistant:" in str(x["arguments"])
            for rx, ry in zip(x["resps"], y["resps"]):
                if task == "flaxlm_generate":
                    assert rx == ry
                else:
                    np.testing.assert_allclose(rx[0][0], ry[0][0], rtol=1e-4, atol=1e-4)
