#!/usr/bin/env python3
"""Turns the JSON lines of `tg bench` and torch_cpu.py into the CPU section of
docs/PERFORMANCE.md (between its bench markers), with ratios against PyTorch. Each file may hold
several rounds (a workload's lines in round order); a workload's figure is its median round, its
ratio the median of the rounds' ratios (round i of one side against round i of the other), with
their range. Its load, figure and write_section serve report_bf16.py too.

  report.py TG.jsonl TORCH.jsonl PERFORMANCE.md COMMAND MACHINE"""
import json
import sys

MARKERS = ("<!-- bench:cpu begin -->", "<!-- bench:cpu end -->")

# workload -> (what it is, target: the project's time over PyTorch's, at most)
WORKLOADS = {
    "mlp_step": ("MLP 784-512-512-10 training step, batch 512, SGD momentum 0.9", 0.5),
    "cnn_step": ("CNN (configs/fmnist_cnn.yaml's model) training step, batch 512, Adam", 0.8),
    "gpt_char_step": ("configs/gpt_char.yaml's GPT training step, 32 x 128 tokens, AdamW", 0.8),
    "matmul_1024": ("matmul 1024x1024x1024 float32", 1 / 0.9),  # issue 27: at least 0.9x OpenBLAS's GFLOP/s
    "matmul_2048": ("matmul 2048x2048x2048 float32", 1 / 0.9),
    "elementwise": ("relu(x*y+z) over 2^24 float32 (fused)", None),
    "copy": ("copy of 2^24 float32", None),
    "softmax": ("softmax over (4096, 1024)", None),
    "layernorm": ("layernorm over (4096, 1024)", None),
    "conv2d": ("conv2d 32->32 5x5 on (512,32,24,24), forward + backward", None),
}


def load_rounds(path):
    """Each workload's records, in the order of the rounds."""
    rounds = {}
    with open(path) as f:
        for r in map(json.loads, filter(lambda line: line.startswith("{"), f)):
            rounds.setdefault(r["name"], []).append(r)
    return rounds


def median(values):
    v = sorted(values)
    return v[(len(v) - 1) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def load(path):
    """Each workload's median round (by time)."""
    return {name: sorted(rs, key=lambda r: r["ms"])[(len(rs) - 1) // 2] for name, rs in load_rounds(path).items()}


def figure(r):
    s = f"{r['ms']:.2f} ms"
    if "gflops" in r:
        s += f" ({r['gflops']:.1f} GFLOP/s)"
    if "gbps" in r:
        s += f" ({r['gbps']:.1f} GB/s)"
    if "tokens_per_s" in r:
        s += f" ({r['tokens_per_s']:.0f} tokens/s)"
    return s


def write_section(doc_path, markers, heading, command, machine, rows, notes=None):
    """Puts a table (with its notes, if any) between the begin and end markers of doc_path, or
    appends it under heading where the markers are missing; prints it."""
    begin, end = markers
    section = "\n".join([begin, "", f"Measured on {machine} with", "", "```sh", command, "```", ""] + rows +
                        ([""] + notes if notes is not None else []) + ["", end])
    with open(doc_path) as f:
        doc = f.read()
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin)] + section + doc[doc.index(end) + len(end):]
    else:
        doc = doc.rstrip() + f"\n\n## {heading}\n\n" + section + "\n"
    with open(doc_path, "w") as f:
        f.write(doc)
    print(section)


def main():
    tg_path, torch_path, doc_path, command, machine = sys.argv[1:6]
    tg_rounds, pt_rounds = load_rounds(tg_path), load_rounds(torch_path)
    tg, pt = load(tg_path), load(torch_path)
    rows = ["| workload | tinygrad++ | PyTorch | time ratio (tinygrad++ / PyTorch): median (range) of rounds | target |",
            "| --- | --- | --- | --- | --- |"]
    for name, (what, target) in WORKLOADS.items():
        if name not in tg or name not in pt:
            continue
        ratios = [a["ms"] / b["ms"] for a, b in zip(tg_rounds[name], pt_rounds[name])]
        ratio = median(ratios)
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} rounds)" if len(ratios) > 1 else ""
        goal = "" if target is None else (f"<= {target:.2f}" + (" (met)" if ratio <= target else " (not met)"))
        rows.append(f"| {what} | {figure(tg[name])} | {figure(pt[name])} | {ratio:.2f}{spread} | {goal} |")
    notes = []
    if "elementwise" in tg and "copy" in tg:
        r = tg["elementwise"]["gbps"] / tg["copy"]["gbps"]
        notes.append(f"- Fused elementwise bandwidth over the project's own copy bandwidth: {r:.2f} (target >= 0.8).")
    if "cnn_step" in tg:
        notes.append(f"- CNN first step, compilation included: {tg['cnn_step']['first_ms'] / 1e3:.2f} s (target < 10 s).")
    if "mlp_step" in tg:
        notes.append(f"- MLP first step, compilation included: {tg['mlp_step']['first_ms'] / 1e3:.2f} s.")
    write_section(doc_path, MARKERS, "CPU, beside PyTorch", command, machine, rows, notes)


if __name__ == "__main__":
    main()
