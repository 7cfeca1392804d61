#!/usr/bin/env python3
"""PyTorch's side of the CPU benchmark: the workloads of `tg bench` (launcher/bench.cpp), with the
same shapes, optimizers and timing rule (median of the timed repetitions after two warm-ups).
Prints one JSON object per line, as `tg bench` does. TORCH_DEVICE=cuda runs them on the GPU
(scripts/bench/gpu.sh), synchronizing after every step. TORCH_COMPILE=1 runs the training steps
(mlp_step, cnn_step) with the model and loss through torch.compile with CUDA graphs
(mode="reduce-overhead": forward and backward compiled and graphed), the optimizer step eager.
The *_bf16 workloads (scripts/bench/cpu_bf16.sh) multiply in bfloat16: matmuls of bfloat16
tensors, and training steps under torch.autocast (bfloat16 products, float32 weights), as
train.precision: bf16 does."""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

STREAM_N = 1 << 24
GPU_SIZED = {"matmul_8192_bf16", "matmul_8192_fp16", "copy_8192", "elementwise_8192", "softmax_8192",
             "layernorm_8192", "colsum_16384", "layernorm_bwd_16384"}  # run only when named, as in `tg bench`
BF16 = {"matmul_1024_bf16", "matmul_2048_bf16", "mlp_step_bf16", "cnn_step_bf16"}  # run only when named, too
DEV = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def measure(name, reps, step_fn):
    def step():
        step_fn()
        sync()
    t0 = time.perf_counter()
    step()
    first = (time.perf_counter() - t0) * 1e3
    step()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return {"name": name, "ms": times[len(times) // 2], "first_ms": first}


def train_step(name, reps, model, opt, autocast=False):
    if DEV.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    x = torch.randn(512, 1, 28, 28, device=DEV)
    y = torch.randint(0, 10, (512,), device=DEV)

    compiled = os.environ.get("TORCH_COMPILE") == "1"
    loss_of = lambda x, y: F.cross_entropy(model(x), y)
    if compiled:
        loss_of = torch.compile(loss_of, mode="reduce-overhead")

    def step():
        if compiled:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
    r = measure(name, reps, step)
    if DEV.type == "cuda":  # the step's own memory (model, optimizer, inputs), as tg bench reports it
        r["peak_mb"] = torch.cuda.max_memory_allocated() / 1e6
    return r


def mlp(reps, name="mlp_step"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    model.to(DEV)
    return train_step(name, reps, model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                      name.endswith("_bf16"))


def cnn(reps, name="cnn_step"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.Conv2d(32, 32, 5), nn.ReLU(), nn.BatchNorm2d(32),
                          nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
                          nn.BatchNorm2d(64), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(576, 10))
    model.to(DEV)
    return train_step(name, reps, model, torch.optim.Adam(model.parameters(), lr=1e-3), name.endswith("_bf16"))


class Block(nn.Module):
    """configs/gpt_char.yaml's block (tinygrad/nn/gpt.h): pre-LayerNorm causal self-attention and a
    GELU (tanh) MLP with residuals."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.c_attn, self.attn_proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln_2, self.c_fc, self.mlp_proj = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.c_attn(x).split(d, 2))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.x: the same composition
            s = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = s.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, d):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        return self.ln_f(self.h(x)) @ self.wte.weight.t()  # tied output projection


def gpt_char(reps):
    torch.manual_seed(0)
    model = GPT(256, 128, 4, 4, 128).to(DEV)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.99))
    x = torch.randint(0, 256, (32, 128), device=DEV)
    y = torch.randint(0, 256, (32, 128), device=DEV)

    def step():
        loss = F.cross_entropy(model(x).view(-1, 256), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
    r = measure("gpt_char_step", reps, step)
    r["tokens_per_s"] = 32 * 128 / (r["ms"] * 1e-3)
    return r


def matmul(name, n, reps, dtype=torch.float32):
    a, b = torch.randn(n, n, device=DEV).to(dtype), torch.randn(n, n, device=DEV).to(dtype)
    r = measure(name, reps, lambda: a @ b)
    r["gflops"] = 2.0 * n ** 3 / (r["ms"] * 1e6)
    return r


def stream(name, reps, fn, nbytes):
    r = measure(name, reps, fn)
    r["gbps"] = nbytes / (r["ms"] * 1e6)
    return r


def column_sum(reps):
    x = torch.randn(16384, 768, device=DEV)
    return stream("colsum_16384", reps, lambda: x.sum(0), 4.0 * x.numel())


def layernorm_backward(reps):
    x = torch.randn(16384, 768, device=DEV, requires_grad=True)
    g = torch.randn(16384, 768, device=DEV)
    w = torch.randn(768, device=DEV, requires_grad=True)
    b = torch.randn(768, device=DEV, requires_grad=True)

    def step():
        x.grad = w.grad = b.grad = None
        (F.layer_norm(x, (768,), w, b) * g).sum().backward()
    return stream("layernorm_bwd_16384", reps, step, 3.0 * 4 * x.numel())


def conv2d(reps):
    x = torch.randn(512, 32, 24, 24, device=DEV, requires_grad=True)
    w = (torch.randn(32, 32, 5, 5, device=DEV) * 0.05).requires_grad_()

    def step():
        x.grad = w.grad = None
        F.conv2d(x, w).sum().backward()
    r = measure("conv2d", reps, step)
    r["gflops"] = 3 * 2.0 * 512 * 32 * 20 * 20 * 32 * 25 / (r["ms"] * 1e6)
    return r


def main():
    reps = 10
    names = []
    for a in sys.argv[1:]:
        if a.startswith("--reps="):
            reps = int(a[7:])
        else:
            names.append(a)
    torch.set_num_threads(int(os.environ.get("THREADS") or os.cpu_count()))
    # memory-bound workloads: bytes read plus bytes written, each tensor counted once
    def elementwise(name, *shape):
        x, y, z = (torch.randn(*shape, device=DEV) for _ in range(3))
        return stream(name, reps, lambda: torch.relu(x * y + z), 4.0 * 4 * x.numel())

    def copy(name, *shape):
        x = torch.randn(*shape, device=DEV)
        return stream(name, reps, lambda: x.clone(), 2.0 * 4 * x.numel())

    def rows(name, fn, *shape):
        s = torch.randn(*shape, device=DEV)
        return stream(name, reps, lambda: fn(s), 2.0 * 4 * s.numel())

    softmax = lambda s: torch.softmax(s, -1)
    layernorm = lambda s: F.layer_norm(s, s.shape[-1:])
    workloads = {
        "cnn_step": lambda: cnn(reps),
        "cnn_step_bf16": lambda: cnn(reps, "cnn_step_bf16"),
        "colsum_16384": lambda: column_sum(reps),
        "conv2d": lambda: conv2d(reps),
        "copy": lambda: copy("copy", STREAM_N),
        "copy_8192": lambda: copy("copy_8192", 8192, 8192),
        "elementwise": lambda: elementwise("elementwise", STREAM_N),
        "elementwise_8192": lambda: elementwise("elementwise_8192", 8192, 8192),
        "gpt_char_step": lambda: gpt_char(reps),
        "layernorm": lambda: rows("layernorm", layernorm, 4096, 1024),
        "layernorm_8192": lambda: rows("layernorm_8192", layernorm, 8192, 8192),
        "layernorm_bwd_16384": lambda: layernorm_backward(reps),
        "matmul_1024": lambda: matmul("matmul_1024", 1024, reps),
        "matmul_2048": lambda: matmul("matmul_2048", 2048, max(1, reps // 2)),
        "matmul_1024_bf16": lambda: matmul("matmul_1024_bf16", 1024, reps, torch.bfloat16),
        "matmul_2048_bf16": lambda: matmul("matmul_2048_bf16", 2048, max(1, reps // 2), torch.bfloat16),
        "matmul_8192_bf16": lambda: matmul("matmul_8192_bf16", 8192, reps, torch.bfloat16),
        "matmul_8192_fp16": lambda: matmul("matmul_8192_fp16", 8192, reps, torch.float16),
        "mlp_step": lambda: mlp(reps),
        "mlp_step_bf16": lambda: mlp(reps, "mlp_step_bf16"),
        "softmax": lambda: rows("softmax", softmax, 4096, 1024),
        "softmax_8192": lambda: rows("softmax_8192", softmax, 8192, 8192),
    }
    training = ("mlp_step", "cnn_step", "conv2d", "gpt_char_step", "mlp_step_bf16", "cnn_step_bf16", "layernorm_bwd_16384")
    for n in names or sorted(set(workloads) - GPU_SIZED - BF16):
        with torch.no_grad() if n not in training else torch.enable_grad():
            print(json.dumps(workloads[n]()), flush=True)


if __name__ == "__main__":
    main()
