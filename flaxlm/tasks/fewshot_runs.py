"""run_fewshot.py's questions answered by a causal LM: by the log-likelihood of each choice, or by generation.

    lm = CausalLM(path, tokenizer_path, "--model_name_or_path DIR").load("float32", per_device_batch=8)
    rows, figures = answer_choices(lm, template, shots, questions, "label", {"Positive": " positiv", ...})
    rows, figures = answer_generations(lm, template, shots, questions, target, "nn", ["\\n"], 64)
    rows, figures = answer_generations(lm, template, [], questions, target, "question", ["\\n"], 32,
                                       metric="squad", chat=True, answers_column="answers")

A choice is scored as lm-eval scores a continuation: the prompt's trailing spaces moved to the continuation, the
prompt + continuation encoded whole after the prefix token (BOS, else EOS), the continuation's tokens those past the
prompt's; a prompt too long for the context loses its beginning (as lm-eval cuts it), and the run says so in one line
(how many of the prompts, and the fix). The figures are scikit-learn's (accuracy, macro F1,
MCC), sacrebleu's (chrF, BLEU) or SQuAD's (exact match, F1), in percent.
"""
import numpy as np


def choice_request(lm, prompt, continuation):
    """(ids, first) for lm.scorer: continuation's log-likelihood after prompt (see the module's docstring), and
    whether the prompt lost its beginning to the context."""
    spaces = len(prompt) - len(prompt.rstrip())
    if spaces:
        prompt, continuation = prompt[:-spaces], prompt[-spaces:] + continuation
    context = [lm.prefix] + lm.encode(prompt)
    whole = [lm.prefix] + lm.encode(prompt + continuation)
    n = len(whole) - len(context)
    ids = whole[-(lm.max_length + 1):]
    return (ids, max(len(ids) - n, 1)), len(whole) > len(ids)


def report_cut(cut, total, room, what):
    """One line when `cut` of `total` prompts were longer than the `room` tokens the context leaves them (`what`
    says what takes the rest) and lost their beginning: a silent cut would score only the model's guesses."""
    if cut:
        print(f"warning: {cut} of {total} prompts are longer than the {room} tokens of context {what} and lose their "
              f"beginning (the first solved examples, or the question itself); pass a smaller --num_fewshot, or "
              f"judge a model with a longer context", flush=True)


def answer_choices(lm, template, shots, questions, label_column, choices):
    """([{"prompt", "gold", "prediction", "log_likelihoods"}], {accuracy, macro_f1, mcc})."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    from flaxlm.errors import UserError
    labels, answer = list(choices), choices
    requests, prompts, golds, cut = [], [], [], 0
    for q in [*shots, *questions]:
        if str(q[label_column]) not in answer:
            raise UserError(f"label {q[label_column]!r} has no verbalization in --choices ({', '.join(labels)}); "
                            f"give every label of the data one")
    for q in questions:
        prompt = template.prompt(shots, q, lambda shot: answer[str(shot[label_column])])
        prompts.append(prompt)
        golds.append(str(q[label_column]))
        asked = [choice_request(lm, prompt, answer[label]) for label in labels]
        cut += any(was_cut for _, was_cut in asked)
        requests += [request for request, _ in asked]
    report_cut(cut, len(questions), lm.max_length, "the model has (with each choice)")
    ll, _ = lm.scorer(requests)
    ll_QC = np.asarray(ll).reshape(len(questions), len(labels))
    preds = [labels[i] for i in ll_QC.argmax(-1)]
    rows = [{"prompt": p, "gold": g, "prediction": y, "log_likelihoods": dict(zip(labels, map(float, row)))}
            for p, g, y, row in zip(prompts, golds, preds, ll_QC)]
    figures = {"accuracy": 100 * accuracy_score(golds, preds),
               "macro_f1": 100 * f1_score(golds, preds, labels=labels, average="macro", zero_division=0),
               "mcc": 100 * matthews_corrcoef(golds, preds)}
    return rows, figures


def cut_at_stop(text, stop):
    """The text before the first of the stop strings (lm-eval's postprocessing), stripped."""
    for s in stop:
        if s:
            text = text.split(s)[0]
    return text.strip()


def answer_generations(lm, template, shots, questions, target, source_column, stop, max_new_tokens, metric="chrf",
                       chat=False, answers_column=None):
    """([{"prompt", "source", "reference", "prediction"}], figures): greedy generation after each prompt; figures
    {chrf, bleu} (sacrebleu), or with metric "squad" {exact, f1} (run_qa.py's SQuAD scores; the gold answers the
    reference, or the list in answers_column). chat: the prompt is the model's chat template over the solved examples
    as user and assistant turns and the question as the last user turn, with the generation prompt."""
    budget = lm.max_length - max_new_tokens
    if budget < 1:
        from flaxlm.errors import UserError
        raise UserError(f"--max_new_tokens {max_new_tokens} leaves no room for a prompt within the context of "
                        f"{lm.max_length} tokens; lower it")
    if chat:
        prompts = [chat_prompt(lm.tokenizer, template, shots, q, target) for q in questions]
        whole = [lm.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    else:
        prompts = [template.prompt(shots, q, target.fill) for q in questions]
        whole = [[lm.prefix] + lm.encode(p) for p in prompts]
    ids = [tokens[-budget:] for tokens in whole]
    report_cut(sum(len(tokens) > budget for tokens in whole), len(questions), budget,
               f"the model's {lm.max_length} leave beside --max_new_tokens {max_new_tokens}")
    texts = [cut_at_stop(lm.tokenizer.decode(tokens, skip_special_tokens=True), stop)
             for tokens in lm.generate(ids, max_new_tokens)]
    refs = [target.fill(q).strip() for q in questions]
    rows = [{"prompt": p, "source": str(q[source_column]), "reference": r, "prediction": t}
            for p, q, r, t in zip(prompts, questions, refs, texts)]
    if metric == "squad":
        from flaxlm.tasks.squad_metric import squad_scores
        golds = [list(q[answers_column]) if answers_column else [r] for q, r in zip(questions, refs)]
        return rows, squad_scores(dict(enumerate(texts)), dict(enumerate(golds)))
    from sacrebleu.metrics import BLEU, CHRF
    return rows, {"chrf": CHRF().corpus_score(texts, [refs]).score, "bleu": BLEU().corpus_score(texts, [refs]).score}


def chat_prompt(tokenizer, template, shots, question, target):
    """The question rendered by the tokenizer's chat template: each solved example a user turn (its filled prompt)
    and an assistant turn (its answer), the question the last user turn, then the generation prompt."""
    from flaxlm.data.chat_template import render
    turns = []
    for shot in shots:
        turns += [{"role": "user", "content": template.fill(shot)},
                  {"role": "assistant", "content": target.fill(shot).strip()}]
    turns.append({"role": "user", "content": template.fill(question)})
    return render(tokenizer, tokenizer.chat_template, turns, add_generation_prompt=True)
