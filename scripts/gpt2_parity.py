#!/usr/bin/env python3
"""GPT-2 in tinygrad++ beside transformers, from the same weights (run where transformers is
installed: the GPU machine). A GPT2LMHeadModel with seeded random weights is written with
save_pretrained (safetensors), a batch of random tokens is drawn, and both sides compute the
logits of the batch in float32 (targets: within 1e-4 relative to the largest logit) and then take
STEPS AdamW steps on it (weight decay 0.1 on the matrices, betas 0.9 / 0.95; targets: every
step's loss within 1e-3 relative). tinygrad++'s side is build/examples/gpt2_parity, which loads
the file save_pretrained wrote. TF32 is off on both sides and attention is transformers' eager
one, so the comparison is of float32 arithmetic. Prints one JSON summary; exit code 1 when a
target is missed.

    python3 scripts/gpt2_parity.py [--size 124m|tiny] [--batch 4] [--seq 64] [--steps 20] [--device cuda|cpu]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

SIZES = {"124m": dict(n_layer=12, n_head=12, n_embd=768), "tiny": dict(n_layer=2, n_head=2, n_embd=64)}


def reference(model, x, y, steps, lr):
    model.eval()
    with torch.no_grad():
        logits = model(x).logits.float().cpu()
    model.train()
    named = list(model.named_parameters())
    groups = [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for _ in range(steps):
        out = model(x).logits
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return logits, losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="124m", choices=SIZES)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bin", default="build/examples/gpt2_parity")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50257, n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     **SIZES[a.size])
    try:
        model = GPT2LMHeadModel(cfg, attn_implementation="eager")
    except TypeError:  # transformers before 4.36: attention is the eager one
        model = GPT2LMHeadModel(cfg)
    model = model.to(a.device)
    tmp = tempfile.mkdtemp(prefix="gpt2_parity_")
    model.save_pretrained(tmp, safe_serialization=True)
    tokens = torch.randint(0, cfg.vocab_size, (a.batch, a.seq + 1), dtype=torch.int32)
    save_file({"tokens": tokens}, os.path.join(tmp, "batch.safetensors"))
    x, y = tokens[:, :-1].long().to(a.device), tokens[:, 1:].long().to(a.device)
    ref_logits, ref_losses = reference(model, x, y, a.steps, a.lr)

    out = os.path.join(tmp, "ours.safetensors")
    env = dict(os.environ, DEVICE="CUDA" if a.device.startswith("cuda") else "CPU", TF32="0")
    subprocess.run([a.bin, tmp, os.path.join(tmp, "batch.safetensors"), out, str(a.steps), str(a.lr)], check=True,
                   env=env, stdout=subprocess.DEVNULL)
    ours = load_file(out)
    logit_rel = float((ours["logits"] - ref_logits).abs().max() / ref_logits.abs().max())
    loss_rel = [abs(o - r) / abs(r) for o, r in zip(ours["losses"].tolist(), ref_losses)]
    ok = logit_rel <= 1e-4 and max(loss_rel) <= 1e-3 and len(loss_rel) == a.steps
    print(json.dumps({"size": a.size, "batch": a.batch, "seq": a.seq, "device": a.device,
                      "logits_max_rel_diff": logit_rel, "losses_max_rel_diff": max(loss_rel),
                      "first_loss": [ours["losses"][0].item(), ref_losses[0]],
                      "last_loss": [ours["losses"][-1].item(), ref_losses[-1]], "ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
