#!/usr/bin/env python3
"""PyTorch's side of scripts/bench/gpt2.sh: the GPT-2 124M training step of `tg bench gpt2_step`
(and gpt2_step_t4096) written as nanoGPT writes it: a pre-LayerNorm GPT with tied embeddings,
attention through F.scaled_dot_product_attention (flash attention on the H200), bf16 autocast,
fused AdamW (weight decay 0.1 on the matrices, betas 0.9 / 0.95, lr 6e-4). Eager, and with the
model and loss through torch.compile. Same batch and sequence length, and the timing rule of
torch_cpu.measure (the CPU and GPU benches' one rule: median after two warm-ups, synchronized). Prints one JSON object per line with
tokens/s, MFU (nanoGPT's estimate: 6N + 12 L H Q T flops per token against the bf16 dense peak,
989 TFLOP/s on an H200; PEAK_TFLOPS overrides) and peak memory.

    python3 scripts/bench/torch_gpt2.py [--reps=N] [gpt2_step] [gpt2_step_t4096]
    python3 scripts/bench/torch_gpt2.py --profile [gpt2_step]

--profile runs torch.compile's step under torch.profiler instead and prints its CUDA kernels
by time a step, largest first: the side-by-side of scripts/bench/kernel_times.py.
"""
import json
import os
import sys

os.environ.setdefault("TORCH_DEVICE", "cuda")  # torch_cpu.measure synchronizes this device

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_cpu

PEAK_TFLOPS = float(os.environ.get("PEAK_TFLOPS", "989"))
SHAPES = {"gpt2_step": (16, 1024), "gpt2_step_t4096": (4, 4096)}


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=50304, block=1024, layers=12, heads=12, d=768):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.layers, self.heads, self.d = layers, heads, d

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def flops_per_token(model, t):
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n + 12 * model.layers * model.heads * (model.d // model.heads) * t


def run(name, reps, compiled, profile=False):
    b, t = SHAPES[name]
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = GPT(block=max(t, 1024)).to(dev)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=True)
    x = torch.randint(0, 50304, (b, t), device=dev)
    y = torch.randint(0, 50304, (b, t), device=dev)

    def loss_fn(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))

    fwd = torch.compile(loss_fn) if compiled else loss_fn

    def step():
        loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if profile:
        return profile_steps(step, reps)
    torch.cuda.reset_peak_memory_stats()
    timed = torch_cpu.measure(name, reps, step)
    ms = timed["ms"]
    tps = b * t / (ms * 1e-3)
    return {"name": name + ("_compiled" if compiled else ""), "ms": ms, "first_ms": timed["first_ms"], "tokens_per_s": tps,
            "mfu": tps * flops_per_token(model, t) / (PEAK_TFLOPS * 1e12),
            "peak_mb": torch.cuda.max_memory_allocated() / 1e6}


def profile_steps(step, reps, top=40):
    """Runs `reps` steps after two warm-ups under torch.profiler; prints CUDA kernel time per step."""
    from torch.profiler import ProfilerActivity, profile
    step(), step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / 1e3 / reps, e.count / reps, e.key) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"{total:.3f} ms of kernels a step, {sum(r[1] for r in rows):.0f} launches")
    for ms, n, key in rows[:top]:
        print(f"{ms:9.3f} ms {n:6.0f}x {100 * ms / total:5.1f}%  {key[:110]}")


def main():
    reps, names, profile = 10, [], False
    for a in sys.argv[1:]:
        if a.startswith("--reps="):
            reps = int(a[7:])
        elif a == "--profile":
            profile = True
        else:
            names.append(a)
    for n in names or ["gpt2_step"]:
        if n not in SHAPES:
            sys.exit(f"torch_gpt2.py: unknown workload '{n}' (workloads: {', '.join(SHAPES)})")
        if profile:
            run(n, reps, True, profile=True)
            continue
        for compiled in (False, True):
            print(json.dumps(run(n, reps, compiled)), flush=True)


if __name__ == "__main__":
    main()
