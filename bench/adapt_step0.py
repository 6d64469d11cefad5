#!/usr/bin/env python
"""What an adapted model's step-0 eval loss is made of (issue 23): the same loss with the output layer's per-token
bias (its prior over the vocabulary) and temperature set from the training text, the rest of the model as
adapt_vocabulary.py wrote it.

    python bench/adapt_step0.py --train_file no_train.txt --eval_file no_eval.txt DIR [DIR ...]

For each model directory (a masked LM or a causal LM, all with the same tokenizer) prints the eval loss
- `as is`: the model as written (the step-0 loss of bench/adapt_vocabulary.py);
- `log-prior`: the bias replaced by the log unigram frequencies of the new tokens in --train_file (add-one);
- `shift` / `shift x2`: the bias moved by log p(token) - log q(token), q the model's mean predicted distribution on
  --train_file (Saerens et al. 2002: a classifier's outputs adjusted to new class priors), once and twice;
- `T, shift x2`: the logits divided by a temperature T (Guo et al. 2017), then shifted twice; T the one of
  TEMPERATURES with the lowest loss on --train_file.
Only --train_file informs the bias; --eval_file is only scored. A causal LM without an output bias (GPT-2) gets
the bias added to its logits here. The masked positions (15%: 80% mask, 10% random, 10% kept) and the rows
(--rows of --seq_len tokens, texts concatenated) are fixed by --seed, the same for every model.
"""
import argparse

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

# "T, shift x2" takes the one whose shifted model fits --train_file best
TEMPERATURES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def text_ids(tok, path, causal):
    """path's texts (one per line) as one id sequence, as the training scripts see them: each text with its
    special tokens (masked LM) or followed by eos (causal LM)."""
    with open(path, encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()]
    ids = []
    for row in tok(texts, add_special_tokens=not causal, verbose=False)["input_ids"]:
        ids.extend(row + [tok.eos_token_id] if causal else row)
    return ids


def masked(tok, x, seed):
    """(inputs, labels) of BERT's masking of x: labels -100 where nothing is predicted."""
    g = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(x.shape, generator=g) < 0.15) & ~torch.isin(x, torch.tensor(tok.all_special_ids))
    r = torch.rand(x.shape, generator=g)
    inputs = x.clone()
    inputs[chosen & (r < 0.8)] = tok.mask_token_id
    swap = chosen & (r >= 0.8) & (r < 0.9)
    inputs[swap] = torch.randint(len(tok), x.shape, generator=g)[swap]
    return inputs, torch.where(chosen, x, -100)


def batch(tok, ids, a, causal):
    """(inputs, labels) of the first --rows rows of ids, labels aligned to the inputs (-100: not scored)."""
    L = a.seq_len
    x = torch.tensor([ids[i:i + L] for i in range(0, len(ids) - L, L)][:a.rows])
    if causal:
        return x, torch.cat([x[:, 1:], torch.full_like(x[:, :1], -100)], dim=1)
    return masked(tok, x, a.seed)


@torch.no_grad()
def head_inputs(model, inputs, labels):
    """(h [N, D], labels [N]) at the scored positions: what the output layer multiplies by its weights."""
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0]))
    hs = []
    for i in range(0, len(inputs), 32):
        seen.clear()
        model(input_ids=inputs[i:i + 32])
        hs.append(seen[0][labels[i:i + 32] != -100])
    hook.remove()
    return torch.cat(hs), labels[labels != -100]


@torch.no_grad()
def score(h, labels, weight, bias):
    """(mean cross-entropy, mean predicted distribution) of logits h @ weight.T + bias."""
    total, mean = 0.0, torch.zeros(weight.shape[0])
    for i in range(0, len(h), 4096):
        logp = torch.log_softmax(h[i:i + 4096] @ weight.T + bias, dim=-1)
        total -= float(logp.gather(-1, labels[i:i + 4096, None]).sum())
        mean += logp.exp().sum(0)
    return total / len(h), mean / len(h)


def shift(h, labels, weight, bias, prior, rounds):
    """The bias moved `rounds` times by prior - log(the mean predicted distribution at h)."""
    for _ in range(rounds):
        bias = bias + prior - torch.log(score(h, labels, weight, bias)[1])
    return bias


def log_prior(tok, ids, causal):
    """Log add-one frequencies of the tokens ids would have as labels (a masked LM never predicts special tokens)."""
    ids = np.asarray(ids)
    if not causal:
        ids = ids[~np.isin(ids, tok.all_special_ids)]
    counts = np.bincount(ids, minlength=len(tok)) + 1.0
    return torch.tensor(np.log(counts / counts.sum()), dtype=torch.float32)


def decompose(model_dir, a):
    """{variant: eval loss} of one model directory."""
    causal = "MaskedLM" not in (AutoConfig.from_pretrained(model_dir, trust_remote_code=False).architectures or [""])[0]
    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model = (AutoModelForCausalLM if causal else AutoModelForMaskedLM).from_pretrained(model_dir, trust_remote_code=False).eval()
    out = model.get_output_embeddings()
    weight = out.weight.detach()
    bias = out.bias.detach() if getattr(out, "bias", None) is not None else torch.zeros(weight.shape[0])
    train_ids = text_ids(tok, a.train_file, causal)
    h_eval, y_eval = head_inputs(model, *batch(tok, text_ids(tok, a.eval_file, causal), a, causal))
    h_train, y_train = head_inputs(model, *batch(tok, train_ids, a, causal))
    prior = log_prior(tok, train_ids, causal)
    losses = {"as is": score(h_eval, y_eval, weight, bias)[0], "log-prior": score(h_eval, y_eval, weight, prior)[0]}
    for name, rounds in (("shift", 1), ("shift x2", 2)):
        losses[name] = score(h_eval, y_eval, weight, shift(h_train, y_train, weight, bias, prior, rounds))[0]
    fits = {t: shift(h_train, y_train, weight / t, bias / t, prior, 2) for t in TEMPERATURES}
    losses["T"] = min(TEMPERATURES, key=lambda t: score(h_train, y_train, weight / t, fits[t])[0])
    losses["T, shift x2"] = score(h_eval, y_eval, weight / losses["T"], fits[losses["T"]])[0]
    return losses


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dirs", nargs="+")
    p.add_argument("--train_file", required=True, help="text of the new language the bias may learn from")
    p.add_argument("--eval_file", required=True, help="text of the new language that is only scored")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(2)
    names = ("as is", "log-prior", "shift", "shift x2", "T", "T, shift x2")
    print(f"{'model':40s}" + "".join(f"{n:>13s}" for n in names))
    for d in a.model_dirs:
        losses = decompose(d, a)
        print(f"{d[-40:]:40s}" + "".join(f"{losses[n]:13.3f}" for n in names), flush=True)


if __name__ == "__main__":
    main()
