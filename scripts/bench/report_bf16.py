#!/usr/bin/env python3
"""Turns the JSON lines of scripts/bench/cpu_bf16.sh (`tg bench` at float32 and bfloat16, and
torch_cpu.py's bfloat16 workloads) into the bfloat16 section of docs/PERFORMANCE.md (between its
bench markers): each workload's time at bfloat16 against the project's float32 and PyTorch's
bfloat16.

  report_bf16.py TG.jsonl TORCH.jsonl PERFORMANCE.md COMMAND MACHINE"""
import sys

from report import figure, load, write_section

MARKERS = ("<!-- bench:cpu-bf16 begin -->", "<!-- bench:cpu-bf16 end -->")

# bfloat16 workload -> (what it is, its float32 counterpart)
WORKLOADS = {
    "matmul_1024_bf16": ("matmul 1024x1024x1024, bfloat16 operands and result", "matmul_1024"),
    "matmul_2048_bf16": ("matmul 2048x2048x2048, bfloat16 operands and result", "matmul_2048"),
    "mlp_step_bf16": ("MLP 784-512-512-10 training step, batch 512, SGD momentum 0.9", "mlp_step"),
    "cnn_step_bf16": ("CNN (configs/fmnist_cnn.yaml's model) training step, batch 512, Adam", "cnn_step"),
}


def main():
    tg_path, torch_path, doc_path, command, machine = sys.argv[1:6]
    tg, pt = load(tg_path), load(torch_path)
    rows = ["| workload | tinygrad++ bf16 | tinygrad++ float32 | bf16 speed-up | PyTorch bf16 | "
            "time ratio (tinygrad++ / PyTorch, bf16) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, (what, float32) in WORKLOADS.items():
        if name not in tg or float32 not in tg:
            continue
        speedup = tg[float32]["ms"] / tg[name]["ms"]
        torch = figure(pt[name]) if name in pt else "-"
        ratio = f"{tg[name]['ms'] / pt[name]['ms']:.2f}" if name in pt else "-"
        rows.append(f"| {what} | {figure(tg[name])} | {figure(tg[float32])} | {speedup:.2f}x | {torch} | {ratio} |")
    write_section(doc_path, MARKERS, "CPU, bfloat16 (train.precision: bf16)", command, machine, rows)


if __name__ == "__main__":
    main()
