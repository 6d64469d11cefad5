"""run_fewshot.py's questions answered by a causal LM: by the log-likelihood of each choice, or by generation.

    model = FewShotModel(path, tokenizer_path, "float32", max_length=None, per_device_batch=8)
    rows, figures = answer_choices(model, template, shots, questions, "label", {"Positive": " positiv", ...})
    rows, figures = answer_generations(model, template, shots, questions, target, "nn", ["\\n"], 64)

A choice is scored as lm-eval scores a continuation: the prompt's trailing spaces moved to the continuation, the
prompt + continuation encoded whole after the prefix token (BOS, else EOS), the continuation's tokens those past the
prompt's; a prompt too long for the context loses its beginning. The figures are scikit-learn's (accuracy, macro F1,
MCC) and sacrebleu's (chrF, BLEU), in percent.
"""
import numpy as np


class FewShotModel:
    def __init__(self, path, tokenizer_path, dtype, max_length, per_device_batch):
        from flaxlm.models import load_config, load_pretrained
        from flaxlm.tasks.lm_scoring import Scorer, context_length
        from flaxlm.tokenization.loading import check_fits, load_tokenizer
        from flaxlm.training.mesh import make_mesh
        from flaxlm.training.sharding import state_shardings
        config = load_config(path)
        self.tokenizer = load_tokenizer(tokenizer_path, local_only=True)
        check_fits(self.tokenizer, config)
        self.max_length = context_length(config, max_length)
        mesh = make_mesh()
        _, self.model = load_pretrained(path, dtype, shardings=lambda a: state_shardings(a, mesh, "data"))
        tok = self.tokenizer
        self.prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.pad = next((t for t in (tok.pad_token_id, tok.eos_token_id) if t is not None), 0)
        self.batch = per_device_batch * mesh.size
        self.scorer = Scorer(self.model, mesh, per_device_batch, self.max_length, self.pad, desc="choices")

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def request(self, prompt, continuation):
        """(ids, first) scoring continuation after prompt (see the module's docstring)."""
        spaces = len(prompt) - len(prompt.rstrip())
        if spaces:
            prompt, continuation = prompt[:-spaces], prompt[-spaces:] + continuation
        context = [self.prefix] + self.encode(prompt)
        whole = [self.prefix] + self.encode(prompt + continuation)
        n = len(whole) - len(context)
        ids = whole[-(self.max_length + 1):]
        return ids, max(len(ids) - n, 1)


def answer_choices(model, template, shots, questions, label_column, choices):
    """([{"prompt", "gold", "prediction", "log_likelihoods"}], {accuracy, macro_f1, mcc})."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    from flaxlm.errors import UserError
    labels, answer = list(choices), choices
    requests, prompts, golds = [], [], []
    for q in [*shots, *questions]:
        if str(q[label_column]) not in answer:
            raise UserError(f"label {q[label_column]!r} has no verbalization in --choices ({', '.join(labels)}); "
                            f"give every label of the data one")
    for q in questions:
        prompt = template.prompt(shots, q, lambda shot: answer[str(shot[label_column])])
        prompts.append(prompt)
        golds.append(str(q[label_column]))
        requests += [model.request(prompt, answer[label]) for label in labels]
    ll, _ = model.scorer(requests)
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


def answer_generations(model, template, shots, questions, target, source_column, stop, max_new_tokens):
    """([{"prompt", "source", "reference", "prediction"}], {chrf, bleu}): greedy generation after each prompt."""
    from sacrebleu.metrics import BLEU, CHRF

    from flaxlm.models.generation import generate
    prompts = [template.prompt(shots, q, target.fill) for q in questions]
    budget = model.max_length - max_new_tokens
    if budget < 1:
        from flaxlm.errors import UserError
        raise UserError(f"--max_new_tokens {max_new_tokens} leaves no room for a prompt within the context of "
                        f"{model.max_length} tokens; lower it")
    ids = [([model.prefix] + model.encode(p))[-budget:] for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    texts = [None] * len(ids)
    for start in range(0, len(order), model.batch):
        chunk = order[start:start + model.batch]
        out = generate(model.model, [ids[i] for i in chunk], max_new_tokens, eos_token_id=model.tokenizer.eos_token_id,
                       pad_token_id=model.pad)
        for i, tokens in zip(chunk, out.tokens):
            texts[i] = cut_at_stop(model.tokenizer.decode(tokens, skip_special_tokens=True), stop)
    refs = [target.fill(q).strip() for q in questions]
    rows = [{"prompt": p, "source": str(q[source_column]), "reference": r, "prediction": t}
            for p, q, r, t in zip(prompts, questions, refs, texts)]
    return rows, {"chrf": CHRF().corpus_score(texts, [refs]).score, "bleu": BLEU().corpus_score(texts, [refs]).score}
