#!/usr/bin/env python
"""nanoGPT's GPT-2 trained on the causal-LM setup of bench/setups.py: the yardstick that llm.c and nanoGPT set,
beside bench/run.py --suite gpu's GPT-2 row. Written here from the published architecture, not copied.

    python bench/nanogpt_reference.py --suite gpu --task clm --compile --dropout 0   # GPT-2 124M, seq 1024, batch 32
    python bench/nanogpt_reference.py --suite tiny --task clm --device cpu --dtype float32 --steps 2   # a quick check

The model (GPT-2, as nanoGPT's model.py builds it): token (wte) and position (wpe) embeddings, dropout; n_layer
pre-LayerNorm blocks, x + attn(ln_1(x)) then x + mlp(ln_2(x)), each sublayer's output through dropout; attention
as one c_attn projection to q, k, v, F.scaled_dot_product_attention(is_causal=True) (flash attention on CUDA),
c_proj; the MLP c_fc to the setup's FF width (4x), GELU (tanh), c_proj; ln_f; lm_head tied to wte. The vocabulary
is padded to a multiple of 64 (50257 -> 50304) as nanoGPT runs GPT-2; biases on (GPT-2's). Init N(0, 0.02), the
c_proj weights N(0, 0.02 / sqrt(2 n_layer)), biases 0. Trained as nanoGPT's train.py trains: TF32 matmuls
allowed, the forward and loss under torch.autocast(bfloat16), float32 parameters, fused AdamW (lr 6e-4, betas
0.9 / 0.95, weight decay 0.1 on matrices and embeddings, none on biases and norms); the loss is the
cross-entropy at every one of the seq positions (random ids; the targets are the next ids). Dropout: the GPT-2
config's rate (0.1), or 0 with --dropout 0 (nanoGPT's pretraining). Tokens counted per step: batch x seq.
Command line, timing and output as bench/torch_reference.py's (warm-up 3 steps, median of --steps; the JSON
{"nanogpt[-compile] gpt2-clm": tokens/s or "error: ..."}).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench.setups import REFERENCE_TASK, hf_config  # noqa: E402
from bench.torch_reference import median_step, reference_args, report  # noqa: E402


def padded_vocab(vocab, multiple=64):
    """The embedding rows nanoGPT allocates: the vocabulary rounded up (50257 -> 50304), for faster matmuls."""
    return -(-vocab // multiple) * multiple


def gpt2_model(vocab, hidden, layers, heads, ff, seq, dropout):
    """nanoGPT's GPT-2 as a torch.nn.Module: model(ids_BT) -> logits_BTV (V: the padded vocabulary);
    model(ids_BT, targets_BT) -> the mean cross-entropy (in the forward, so torch.compile compiles it too)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(hidden, 3 * hidden)
            self.c_proj = nn.Linear(hidden, hidden)
            self.resid_dropout = nn.Dropout(dropout)

        def forward(self, x_BTD):
            B, T, D = x_BTD.shape
            q, k, v = (t.view(B, T, heads, D // heads).transpose(1, 2) for t in self.c_attn(x_BTD).split(D, dim=2))
            o_BNTH = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout if self.training else 0.0,
                                                    is_causal=True)
            return self.resid_dropout(self.c_proj(o_BNTH.transpose(1, 2).reshape(B, T, D)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(hidden), SelfAttention(), nn.LayerNorm(hidden)
            self.mlp = nn.Sequential()
            self.mlp.add_module("c_fc", nn.Linear(hidden, ff))
            self.mlp.add_module("gelu", nn.GELU(approximate="tanh"))
            self.mlp.add_module("c_proj", nn.Linear(ff, hidden))
            self.mlp.add_module("dropout", nn.Dropout(dropout))

        def forward(self, x_BTD):
            x_BTD = x_BTD + self.attn(self.ln_1(x_BTD))
            return x_BTD + self.mlp(self.ln_2(x_BTD))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(padded_vocab(vocab), hidden), nn.Embedding(seq, hidden)
            self.drop = nn.Dropout(dropout)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)
            self.lm_head = nn.Linear(hidden, padded_vocab(vocab), bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):  # residual projections: scaled for depth, as GPT-2
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))
                elif p.dim() >= 2:
                    nn.init.normal_(p, std=0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, ids_BT, targets_BT=None):
            positions_T = torch.arange(ids_BT.shape[1], device=ids_BT.device)
            x_BTD = self.drop(self.wte(ids_BT) + self.wpe(positions_T))
            for block in self.h:
                x_BTD = block(x_BTD)
            logits_BTV = self.lm_head(self.ln_f(x_BTD))
            if targets_BT is None:
                return logits_BTV
            return F.cross_entropy(logits_BTV.view(-1, logits_BTV.shape[-1]), targets_BT.reshape(-1))

    return GPT()


def adamw(model, fused):
    """nanoGPT's optimizer: AdamW, weight decay 0.1 on the matrices and embeddings only."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=fused)


def time_steps(a, c):
    """(median step seconds, peak memory bytes or None) of a.steps train steps of nanoGPT's GPT-2 on setup c."""
    import torch
    if a.task != "clm":
        raise ValueError(f"nanoGPT is a GPT-2; task {a.task} is not the GPT-2 causal LM (clm)")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available to torch")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as nanoGPT's train.py
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rate = hf_config(a.task, c).resid_pdrop  # the GPT-2 config's (0.1); 0 at --dropout 0
    model = gpt2_model(c["vocab"], c["hidden"], c["layers"], c["heads"], c["ff"], c["seq"], rate).to(device).train()
    opt = adamw(model, fused=device.type == "cuda")
    forward = torch.compile(model) if a.compile else model
    ids = np.random.default_rng(0).integers(5, c["vocab"] - 100, size=(c["batch"], c["seq"] + 1))
    x_BT, y_BT = (torch.tensor(t, device=device) for t in (ids[:, :-1], ids[:, 1:]))

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
            loss = forward(x_BT, y_BT)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return median_step(step, device, a.steps)


def main():
    a, c = reference_args(__doc__)
    report(f"nanogpt{'-compile' if a.compile else ''} {REFERENCE_TASK[a.task]}", a, c, time_steps)


if __name__ == "__main__":
    main()
