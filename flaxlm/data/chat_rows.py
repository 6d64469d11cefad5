"""Conversations (flaxlm.data.conversations) as token rows for supervised fine-tuning: each example's tokens and which
of them are trained on, packed whole into rows of --max_length.

    seqs = [encode(tokenizer, template, e) for e in examples]    # (ids, trained 0/1) per example
    rows, report = sft_rows(seqs, 1024, pad_id, packing=True, long="truncate")

What is trained on, as TRL's SFTTrainer computes it: a conversation's assistant turns, a prompt's own excepted
(flaxlm.data.chat_template: a token is trained when its characters overlap an answer's span, which then
includes the turn's end marker); a text prompt's completion, eos appended, after the prompt tokenized alone (its BOS included); every token of
a text, eos appended; with train_on_prompt, every token. Packing lays whole examples into rows best-fit decreasing (as
TRL's 'bfd'), each with its own segment id and positions from 0, so none attends to another (the
--separate_documents machinery). An example longer than a row is cut to it (long="truncate", TRL's) or left out
(long="drop"); report counts them, the cut examples left without a trained token (their whole answer past the
cut: left out) and the trained tokens.
"""
import bisect

import numpy as np

from flaxlm.data.packing import fill_rows
from flaxlm.errors import UserError
from flaxlm.data.chat_template import render_turns


def _trained(offsets, spans):
    """0/1 per token: its characters overlap one of spans (a token of no characters: it stands inside one)."""
    out = []
    for s, e in offsets:
        out.append(int(any((max(s, a) < min(e, b)) if e > s else a <= s < b for a, b in spans)))
    return out


def common_prefix(a, b):
    """How many leading tokens a and b share (TRL's common_prefix_length)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def encode(tokenizer, template, example, train_on_prompt=False):
    """(token ids, 0/1 trained per token) of one Example."""
    eos = tokenizer.eos_token or ""
    if example.messages is not None:
        text, spans = render_turns(tokenizer, template, example.messages, example.answers_from)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)  # any BOS: its own
        ids, trained = enc["input_ids"], _trained(enc["offset_mapping"], spans)
    elif example.prompt is not None:  # TRL: the completion starts where the prompt tokenized alone stops matching
        ids = tokenizer(example.prompt + example.completion + eos, verbose=False)["input_ids"]
        n = common_prefix(tokenizer(example.prompt, verbose=False)["input_ids"], ids)
        trained = [0] * n + [1] * (len(ids) - n)
    else:
        ids = tokenizer(example.text + eos, verbose=False)["input_ids"]
        trained = [1] * len(ids)
    return ids, [1] * len(ids) if train_on_prompt else trained


def best_fit(lengths_S, max_len):
    """(row_S, start_S) of sequences laid into rows best-fit decreasing: longest first, each into the row it fills
    fullest (a new row when none has room). Rows are numbered in the order they were opened."""
    order = sorted(range(len(lengths_S)), key=lambda s: -lengths_S[s])
    room, used = [], []  # (room left, row), sorted; the tokens each row holds
    row_S, start_S = np.zeros(len(lengths_S), np.int64), np.zeros(len(lengths_S), np.int64)
    for s in order:
        n = lengths_S[s]
        k = bisect.bisect_left(room, (n, -1))
        if k == len(room):
            row = len(used)
            used.append(0)
        else:
            row = room.pop(k)[1]
        row_S[s], start_S[s] = row, used[row]
        used[row] += n
        if used[row] < max_len:
            bisect.insort(room, (max_len - used[row], row))
    return row_S, start_S


def sft_rows(seqs, max_len, pad_id, packing=True, long="truncate"):
    """({"input_ids", "trained", "segment_ids", "positions": int32 [N, max_len]}, {"examples", "cut", "dropped",
    "answer_cut", "trained_tokens", "tokens"}) of (ids, trained) sequences. answer_cut: the cut examples whose
    trained tokens all lay past the cut, left out (counted in cut too)."""
    cut = sum(len(ids) > max_len for ids, _ in seqs)
    if long == "drop":
        seqs = [s for s in seqs if len(s[0]) <= max_len]
    answer_cut = sum(any(mask[1:]) and not any(mask[1:max_len]) for _, mask in seqs)
    seqs = [(ids[:max_len], mask[:max_len]) for ids, mask in seqs]
    seqs = [s for s in seqs if any(s[1][1:])]  # something to predict (the first token never is)
    if not seqs:
        raise UserError(f"no example has a trained token within --max_length {max_len}; raise --max_length")
    lengths = [len(ids) for ids, _ in seqs]
    row_S, start_S = best_fit(lengths, max_len) if packing else (np.arange(len(seqs)), np.zeros(len(seqs), np.int64))
    order = np.lexsort((start_S, row_S))  # fill_rows takes the sequences row by row
    ids = [seqs[s][0] for s in order]
    ids_NL, segment_ids_NL = fill_rows(ids, row_S[order], start_S[order], max_len, pad_id)
    trained_NL, _ = fill_rows([seqs[s][1] for s in order], row_S[order], start_S[order], max_len, 0)
    positions_NL, _ = fill_rows([list(range(n)) for n in (len(x) for x in ids)], row_S[order], start_S[order],
                                max_len, 0)
    report = {"examples": len(seqs), "cut": 0 if long == "drop" else cut, "dropped": cut if long == "drop" else 0,
              "answer_cut": answer_cut, "trained_tokens": int(sum(sum(m[1:]) for _, m in seqs)),
              "tokens": int(sum(lengths))}
    return {"input_ids": ids_NL, "trained": trained_NL, "segment_ids": segment_ids_NL,
            "positions": positions_NL}, report


def report_line(split, report, num_rows, max_len):
    """The line run_sft.py prints of one split's sft_rows report: examples, rows, tokens trained on, and the long
    examples cut (those that lost their whole answer with it) or left out."""
    long = ""
    if report["cut"]:
        lost = report["answer_cut"]
        long = (f"; {report['cut']} longer than {max_len} cut to it"
                + (f", {lost} of them losing their whole answer (left out)" if lost else ""))
    elif report["dropped"]:
        long = f"; {report['dropped']} longer than {max_len} left out"
    return (f"{split}: {report['examples']} examples in {num_rows} rows of {max_len}, {report['trained_tokens']} of "
            f"{report['tokens']} tokens trained on{long}")


def placeholder_rows(max_len, vocab_size, n=8):
    """Rows shaped as sft_rows gives them (two examples a row, the second half trained on), for --compile_for."""
    half = max_len // 2
    seqs = [(list(np.random.default_rng(k).integers(8, vocab_size, n_tokens)), [0] * (n_tokens // 2) + [1] * (
        n_tokens - n_tokens // 2)) for k, n_tokens in enumerate([half, max_len - half] * n)]
    return sft_rows(seqs, max_len, 0)[0]
