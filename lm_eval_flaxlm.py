#!/usr/bin/env python
"""lm-evaluation-harness's command line with the project's JAX models as the model class `flaxlm` (lm-eval finds no
model registered from outside its package, so this registers it, then hands the command line to lm-eval).

    pip install -r requirements-eval.txt
    python lm_eval_flaxlm.py --model flaxlm --model_args pretrained=runs/my-gpt2 --batch_size 8 \
        --tasks noreval --output_path results/          # NorEval's Norwegian tasks (needs the hub)
    python lm_eval_flaxlm.py --model flaxlm --model_args pretrained=DIR,dtype=bfloat16,max_length=2048 \
        --tasks hellaswag --num_fewshot 10

Every lm-eval option works as with `lm_eval`; the model's options (model_args) are flaxlm.tasks.lm_eval_model's.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.errors import UserError, run_main  # noqa: E402


def main(argv=None):
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise UserError("lm-evaluation-harness is not installed; pip install -r requirements-eval.txt") from None
    import flaxlm.tasks.lm_eval_model  # noqa: F401  (registers the model class "flaxlm")
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    run_main(main)
