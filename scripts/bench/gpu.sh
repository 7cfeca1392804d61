#!/usr/bin/env bash
# scripts/bench/gpu.sh: the GPU benchmark, the project on CUDA beside PyTorch on the same GPU:
# `DEVICE=CUDA tg bench` and `TORCH_DEVICE=cuda torch_cpu.py` over the same workloads (each step
# synchronized), then a table of medians and ratios. Needs a build with the CUDA device
# (build/launcher/tg) and a python3 with a CUDA PyTorch.
#
#   bash scripts/bench/gpu.sh [--reps=N] [WORKLOAD ...]   (default: mlp_step matmul_2048, the
#   8192x8192 float32 workloads copy_8192 elementwise_8192 softmax_8192 layernorm_8192 and the
#   8192^3 products matmul_8192_bf16 matmul_8192_fp16)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
args=("$@")
names=0
for a in "$@"; do [[ $a == --* ]] || names=1; done
[[ $names == 1 ]] || args+=(mlp_step matmul_2048 copy_8192 elementwise_8192 softmax_8192 layernorm_8192 matmul_8192_bf16
  matmul_8192_fp16)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
DEVICE=CUDA build/launcher/tg bench "${args[@]}" | tee "$out/tg.jsonl"
TORCH_DEVICE=cuda python3 scripts/bench/torch_cpu.py "${args[@]}" | tee "$out/torch.jsonl"
# the training steps again through torch.compile with CUDA graphs
steps=()
for a in "${args[@]}"; do [[ $a == --* || $a == *_step ]] && steps+=("$a"); done
[[ ${#steps[@]} -gt 0 ]] && { TORCH_COMPILE=1 TORCH_DEVICE=cuda python3 scripts/bench/torch_cpu.py "${steps[@]}" |
  tee "$out/compiled.jsonl" || echo "torch.compile failed: no compiled column"; }
touch "$out/compiled.jsonl"
python3 - "$out/tg.jsonl" "$out/torch.jsonl" "$out/compiled.jsonl" <<'PY'
import json, sys
load = lambda p: {r["name"]: r for r in map(json.loads, filter(lambda l: l.startswith("{"), open(p)))}
tg, pt, pc = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
print(f"{'workload':<18}{'tinygrad++ ms':>15}{'PyTorch ms':>12}{'ratio':>8}  throughput (tinygrad++ / PyTorch)")
for n in tg:
    a, b = tg[n], pt.get(n)
    unit = "gflops" if "gflops" in a else "gbps" if "gbps" in a else None
    tp = f"{a[unit]:.0f} / {b[unit]:.0f} {'GFLOP/s' if unit == 'gflops' else 'GB/s'}" if unit and b else ""
    if "peak_mb" in a and b and "peak_mb" in b:
        tp = f"peak memory {a['peak_mb']:.1f} / {b['peak_mb']:.1f} MB"
    if n in pc:
        tp += f"; torch.compile {pc[n]['ms']:.3f} ms, ratio {a['ms'] / pc[n]['ms']:.2f}"
    print(f"{n:<18}{a['ms']:>15.3f}{(b['ms'] if b else float('nan')):>12.3f}{(a['ms'] / b['ms'] if b else float('nan')):>8.2f}  {tp}")
PY
