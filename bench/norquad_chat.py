#!/usr/bin/env python
"""NorQuAD's training split (../shared/data/no/norquad_train.json: human-written Bokmål questions on Wikipedia and
news passages) as conversations for run_sft.py and preference pairs for run_dpo.py, in TRL's formats.

    python bench/norquad_chat.py --output_dir /tmp/norquad-chat

Articles are split 90/10 (seed 0) into train and test; each question becomes
- a conversation (sft_{train,test}.jsonl): {"prompt": [user turn], "completion": [assistant turn]}, the user turn
  the passage around the answer (its sentence and the ones beside it, at most --context_chars) and the question, the
  assistant turn the gold answer as a sentence-less span ("Rygge"); TRL trains on the completion only;
- a preference pair (dpo_{train,test}.jsonl): the same prompt, `chosen` the gold answer, `rejected` a wrong span of
  the same passage: another question's answer on it when there is one, else the words just before the gold answer.
- a question for run_fewshot.py --metric squad (qa_{train,test}.jsonl): {"question": the user turn, "answer", "answers":
  every gold answer}, scored by exact match and F1 as run_qa.py counts them (SQuAD's).
"""
import argparse
import json
import os
import random
import re

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")
INSTRUCTION = "Svar kort med et utdrag fra teksten."  # "Answer briefly with a span of the text."


def window(context, start, end, limit):
    """The sentence holding context[start:end] and the sentences beside it while they fit in `limit` characters."""
    bounds = [0] + [m.end() for m in re.finditer(r"(?<=[.!?])\s+", context)] + [len(context)]
    spans = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    first = last = next(i for i, (a, b) in enumerate(spans) if a <= start < b)
    while spans[last][1] < end and last + 1 < len(spans):
        last += 1
    while True:
        grown = False
        for i, j in ((first - 1, last), (first, last + 1)):
            if 0 <= i and j < len(spans) and spans[j][1] - spans[i][0] <= limit:
                first, last, grown = i, j, True
                break
        if not grown:
            return context[spans[first][0]:spans[last][1]].strip()


def wrong_span(context, gold, others):
    """A wrong answer from the same passage: another question's answer, else the words before the gold one."""
    for other in others:
        if other["text"].strip() and other["text"].strip().lower() != gold["text"].strip().lower():
            return other["text"].strip()
    words = context[:gold["answer_start"]].split()[-max(1, len(gold["text"].split())):]
    return " ".join(words) if words else context[gold["answer_end"]:].split()[0]


def examples(articles, limit):
    for article in articles:
        for para in article["paragraphs"]:
            context = para["context"]
            qas = [q for q in para["qas"] if q["answers"] and not q.get("is_impossible")]
            for q in qas:
                gold = q["answers"][0]
                passage = window(context, gold["answer_start"], gold["answer_end"], limit)
                if gold["text"] not in passage:
                    continue
                user = f"{passage}\n\nSpørsmål: {q['question'].strip()}\n{INSTRUCTION}"
                others = [o["answers"][0] for o in qas if o is not q]
                yield {"prompt": [{"role": "user", "content": user}],
                       "completion": [{"role": "assistant", "content": gold["text"].strip()}],
                       "rejected_text": wrong_span(context, gold, others),
                       "answers": sorted({a["text"].strip() for a in q["answers"]})}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--context_chars", type=int, default=400, help="the most characters of passage in a prompt")
    a = p.parse_args(argv)
    with open(os.path.join(a.data_dir, "no", "norquad_train.json"), encoding="utf-8") as f:
        articles = list(json.load(f)["data"])
    random.Random(0).shuffle(articles)
    cut = len(articles) // 10
    os.makedirs(a.output_dir, exist_ok=True)
    for split, part in (("test", articles[:cut]), ("train", articles[cut:])):
        rows = list(examples(part, a.context_chars))
        with open(os.path.join(a.output_dir, f"sft_{split}.jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps({"prompt": r["prompt"], "completion": r["completion"], "answers": r["answers"]},
                                   ensure_ascii=False) + "\n")
        with open(os.path.join(a.output_dir, f"qa_{split}.jsonl"), "w", encoding="utf-8") as f:
            for r in rows:  # for run_fewshot.py --metric squad: the user turn, the gold answer, all gold answers
                f.write(json.dumps({"question": r["prompt"][0]["content"], "answer": r["completion"][0]["content"],
                                    "answers": r["answers"]}, ensure_ascii=False) + "\n")
        kept = 0
        with open(os.path.join(a.output_dir, f"dpo_{split}.jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                if r["rejected_text"].lower() == r["completion"][0]["content"].lower():
                    continue
                kept += 1
                f.write(json.dumps({"prompt": r["prompt"], "chosen": r["completion"],
                                    "rejected": [{"role": "assistant", "content": r["rejected_text"]}]},
                                   ensure_ascii=False) + "\n")
        print(f"{split}: {len(part)} articles, {len(rows)} conversations, {kept} preference pairs", flush=True)


if __name__ == "__main__":
    main()
