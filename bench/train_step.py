#!/usr/bin/env python
"""bench/run.py for one objective, under the name older commands use (no reference unless --reference):

    python bench/train_step.py --task mlm [--config small|tiny] [bench/run.py flags]
    = python bench/run.py --tasks mlm --suite cpu|tiny --reference none [bench/run.py flags]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import run  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402

SUITE_OF_CONFIG = {"small": "cpu", "tiny": "tiny"}

if __name__ == "__main__":
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--task", choices=["mlm", "t5", "clm"], default="mlm")
    p.add_argument("--config", choices=sorted(SUITE_OF_CONFIG), default="small")
    known, rest = p.parse_known_args()
    reference = [] if any(r.startswith("--reference") for r in rest) else ["--reference", "none"]
    run_main(lambda: run.main(["--tasks", known.task, "--suite", SUITE_OF_CONFIG[known.config], *reference, *rest]))
