"""The demo's default corpus: the documentation text every CPython carries (pydoc_data.topics,
about 465 KB of English), written as train.txt and validation.txt so no download is needed.

    python -m flaxlm.data.demo_corpus --output_dir runs/demo/data
"""
import argparse
import os

from pydoc_data.topics import topics


def write_demo_corpus(output_dir, validation_every=20):
    """One paragraph per line; every `validation_every`-th paragraph goes to validation.txt."""
    paragraphs = []
    for name in sorted(topics):
        for para in topics[name].split("\n\n"):
            line = " ".join(para.split())
            if line:
                paragraphs.append(line)
    os.makedirs(output_dir, exist_ok=True)
    paths = {s: os.path.join(output_dir, f"{s}.txt") for s in ("train", "validation")}
    with open(paths["train"], "w", encoding="utf-8") as tr, open(paths["validation"], "w", encoding="utf-8") as va:
        for i, line in enumerate(paragraphs):
            (va if i % validation_every == 0 else tr).write(line + "\n")
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--output_dir", default="runs/demo/data")
    paths = write_demo_corpus(p.parse_args().output_dir)
    print(f"wrote {paths['train']} and {paths['validation']}")
