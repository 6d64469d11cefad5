"""How far a LoRA run's --merge_lora export lies from peft's base + adapter (issue 56's check), on CPU.

    python bench/lora_merge.py --work_dir /tmp/lora-merge [--base_dtype float32] [--steps 20]

A float32 (or bfloat16) Llama of 2 layers and width 128 is built by transformers with a GPT-2 tokenizer trained on
the demo corpus; run_sft.py trains LoRA (rank 8, alpha 16, no dropout, ChatML's markers added) on conversations
made from the corpus, once exporting the adapter and once with --merge_lora. Printed: the merged export's dtype,
its largest logit difference on random ids from peft's merge_and_unload and from PeftModel(base, adapter), and the
markers' trained rows the adapter carries (peft's trainable tokens).
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def build_base(out, dtype):
    import torch
    import transformers
    from flaxlm.data.demo_corpus import write_demo_corpus
    from flaxlm.tokenization.trainers import train_gpt2_bpe
    paths = write_demo_corpus(os.path.join(out, "corpus"))
    lines = open(paths["train"], encoding="utf-8").read().splitlines()
    tokenizer = train_gpt2_bpe(iter(lines[:3000]), vocab_size=1024)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, tie_word_embeddings=False,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    base = os.path.join(out, "base")
    transformers.LlamaForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(base)
    tokenizer.save_pretrained(base)
    with open(os.path.join(out, "conversations.jsonl"), "w", encoding="utf-8") as f:
        for k in range(0, 400, 2):
            f.write(json.dumps({"messages": [{"role": "user", "content": lines[k][:200]},
                                             {"role": "assistant", "content": lines[k + 1][:200]}]}) + "\n")
    return base


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", required=True)
    p.add_argument("--base_dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import run_sft
    base = build_base(a.work_dir, a.base_dtype)
    common = ["--model_name_or_path", base, "--chat_template", "chatml", "--train_file",
              os.path.join(a.work_dir, "conversations.jsonl"), "--validation_split_percentage", "5", "--max_length",
              "128", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1", "--max_steps",
              str(a.steps), "--learning_rate", "1e-3", "--lora_rank", "8", "--lora_alpha", "16", "--lora_dropout", "0",
              "--report_to", "none", "--overwrite_output_dir"]
    adapter, merged = os.path.join(a.work_dir, "adapter"), os.path.join(a.work_dir, "merged")
    run_sft.main(["--output_dir", adapter, *common])
    run_sft.main(["--output_dir", merged, *common, "--merge_lora"])

    tokenizer = AutoTokenizer.from_pretrained(adapter, trust_remote_code=False)
    ids = torch.randint(0, len(tokenizer), (4, 64), generator=torch.Generator().manual_seed(0))

    def logits(model):
        with torch.no_grad():
            return model.eval()(ids).logits.float().numpy()

    def peft_model():
        hf = AutoModelForCausalLM.from_pretrained(base, trust_remote_code=False)
        hf.resize_token_embeddings(len(tokenizer))
        return PeftModel.from_pretrained(hf, adapter)

    ours = AutoModelForCausalLM.from_pretrained(merged, trust_remote_code=False)
    flat = logits(ours)
    print(f"base {a.base_dtype}; merged export's dtype {ours.dtype} (config.json: "
          f"{json.load(open(os.path.join(merged, 'config.json')))['dtype']})")
    print(f"max |merged - peft merge_and_unload| = {np.abs(flat - logits(peft_model().merge_and_unload())).max():.3g}")
    print(f"max |merged - PeftModel(base, adapter)| = {np.abs(flat - logits(peft_model())).max():.3g} "
          f"(largest |logit| {np.abs(flat).max():.3g})")
    from safetensors.numpy import load_file
    stored = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    marker_ids = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    for name in ("model.embed_tokens", "lm_head"):
        rows = stored[f"base_model.model.{name}.token_adapter.trainable_tokens_delta"]
        print(f"{name}: trained rows of {marker_ids} stored ({rows.shape}); mean |row| {np.abs(rows).mean():.4f}")


if __name__ == "__main__":
    main()
