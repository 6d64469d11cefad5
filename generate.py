#!/usr/bin/env python
"""Continue prompts with a causal LM (GPT-2, OPT, Llama, Mistral, Qwen2/3, Gemma 1/2/3, GPT-Neo, GPT-J, BLOOM:
config.json + safetensors, sharded or not), in JAX.

    python generate.py --model_name_or_path runs/clm-demo/run --prompt "def main(" --max_new_tokens 40
    python generate.py --model_name_or_path DIR --prompt_file prompts.txt --do_sample --top_p 0.9 --seed 1

    python generate.py --model_name_or_path runs/sft --chat --prompt "Hva er hovedstaden i Norge?"

All prompts go in one left-padded batch; greedy unless --do_sample; --chat renders each as a user turn of the
tokenizer's chat template (run_sft.py's export) and the answer ends with the turn. Prints each prompt with its
continuation, then the generation speed (compilation excluded).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import GenerateArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, decode_utf8_line, run_main  # noqa: E402


def read_prompts(args):
    """The prompt texts: every --prompt, then the non-blank lines of --prompt_file."""
    prompts = list(args.prompt or [])
    if args.prompt_file:
        if not os.path.isfile(args.prompt_file):
            what = "is a directory" if os.path.isdir(args.prompt_file) else "does not exist"
            raise UserError(f"--prompt_file {args.prompt_file} {what}; pass a text file, one prompt per line")
        with open(args.prompt_file, "rb") as f:
            lines = [decode_utf8_line(raw, f"--prompt_file {args.prompt_file}", n) for n, raw in enumerate(f, 1)]
        prompts += [line.rstrip("\r\n") for line in lines if line.strip()]
    if not prompts:
        raise UserError("no prompt given; pass --prompt TEXT (repeatable) or --prompt_file FILE")
    for i, text in enumerate(prompts):
        if not text.strip():
            raise UserError(f"prompt {i + 1} is empty; give every --prompt some text")
    return prompts


def load_causal_lm(path, dtype):
    """(config, model), or a UserError naming the supported families when path holds another kind of model."""
    from flaxlm.models import check_causal_lm, load_config, load_pretrained
    check_causal_lm(load_config(path), path, does="generate")
    return load_pretrained(path, dtype)


def encode(tokenizer, text, chat=False, system=None):
    """Token ids of a prompt with the tokenizer's special tokens (e.g. a BOS), less a trailing EOS; with chat, the
    prompt as a user turn (after a system one) rendered by the tokenizer's chat template, the generation prompt
    added, its special tokens the template's own."""
    if chat:
        from flaxlm.data.chat_template import render
        turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        return tokenizer(render(tokenizer, tokenizer.chat_template, turns, add_generation_prompt=True),
                         add_special_tokens=False)["input_ids"]
    ids = tokenizer(text)["input_ids"]
    if ids and tokenizer.eos_token_id is not None and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    return ids


def main(argv=None):
    (args,) = parse_args(GenerateArgs, argv=argv, prog="generate.py", description=__doc__)
    prompts = read_prompts(args)
    if args.do_sample and args.temperature <= 0:
        raise UserError(f"--temperature must be > 0 with --do_sample, not {args.temperature}")
    from flaxlm.models.generation import generate
    from flaxlm.tokenization.loading import check_fits, load_tokenizer

    config, model = load_causal_lm(args.model_name_or_path, args.dtype)
    if args.adapter:  # a LoRA run's export on its base
        from flaxlm.models.lora import load_adapter
        load_adapter(model, config, args.adapter)
    tokenizer = load_tokenizer(args.tokenizer_name or args.model_name_or_path, local_only=True)
    check_fits(tokenizer, config)
    if args.chat and not tokenizer.chat_template:
        source = args.tokenizer_name or args.model_name_or_path
        raise UserError(f"--chat needs a chat template, which the tokenizer of {source} has not; pass a model "
                        f"run_sft.py exported, or drop --chat")
    ids = [encode(tokenizer, text, args.chat, args.system) for text in prompts]
    for i, prompt_ids in enumerate(ids):
        if not prompt_ids:
            raise UserError(f"prompt {i + 1} encodes to no tokens; give it some text")
    eos = tokenizer.eos_token_id
    pad = next((t for t in (tokenizer.pad_token_id, eos) if t is not None), 0)
    out = generate(model, ids, args.max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                   temperature=args.temperature if args.do_sample else 0.0, top_k=args.top_k, top_p=args.top_p,
                   seed=args.seed)

    for text, tokens in zip(prompts, out.tokens):
        print(f"{text}\n  -> {tokenizer.decode(tokens, skip_special_tokens=True)!r}", flush=True)
    new = sum(len(t) for t in out.tokens)
    seconds = out.prefill_seconds + out.decode_seconds
    print(f"generated {new} tokens for {len(ids)} prompt(s) in {seconds:.3f} s: {new / seconds:.1f} tokens/s "
          f"(prefill {out.prefill_seconds:.3f} s, decode {out.decode_tokens_per_second:.1f} tokens/s; "
          f"compilation {out.compile_seconds:.1f} s not counted)", flush=True)


if __name__ == "__main__":
    run_main(main)
