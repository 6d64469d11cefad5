#!/usr/bin/env python
"""Turn a dense model into a mixture of experts of its family (sparse upcycling), each expert a copy of its MLP.

    python upcycle_moe.py --model_name_or_path runs/qwen3-no --output_dir runs/qwen3-moe-no-init \\
        --num_experts 8 --num_experts_per_tok 2

The output directory holds a Hugging Face model of the family's mixture-of-experts sibling (qwen3 -> qwen3_moe):
every layer's MLP replaced by --num_experts copies of it and a new router (normal(0, --router_init_std) weights)
that sends each token to --num_experts_per_tok of them, their weights renormalized to sum to 1, so the model
computes what the dense one did until continued pretraining (run_clm_flax.py --model_name_or_path OUTPUT_DIR)
makes the experts differ. Everything else and the tokenizer are copied. See flaxlm.adaptation.upcycle.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.config.options import UpcycleArgs  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    (args,) = parse_args(UpcycleArgs, argv=argv, prog="upcycle_moe.py", description=__doc__.splitlines()[0])
    from flaxlm.adaptation.upcycle import upcycle
    summary = upcycle(args)
    print(f"wrote {args.output_dir}: {summary}")
    write_card(args)


def write_card(args):
    """The upcycled model's card (flaxlm.reporting.model_card), the dense model as base_model."""
    from flaxlm.config.cli import parsed_options
    from flaxlm.models import count_config_params, load_config
    from flaxlm.reporting.model_card import write_model_card
    from flaxlm.tokenization.loading import load_tokenizer
    config, dense_type = load_config(args.output_dir), load_config(args.model_name_or_path).model_type
    how = (f"upcycled ({args.num_experts} experts, {args.num_experts_per_tok} per token, each a copy of the dense "
           f"{dense_type} model's MLP)")
    write_model_card(args.output_dir, config=config, tokenizer=load_tokenizer(args.output_dir, local_only=True),
                     auto_class="transformers.AutoModelForCausalLM", script="upcycle_moe.py",
                     options=parsed_options(), n_params=count_config_params(config),
                     base_model=args.model_name_or_path, how=how)


if __name__ == "__main__":
    run_main(main)
