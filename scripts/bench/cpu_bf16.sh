#!/usr/bin/env bash
# scripts/bench/cpu_bf16.sh: the CPU benchmark's bfloat16 section (train.precision: bf16), in one
# run on this machine: matmul 1024 and 2048 in bfloat16 against float32, the MLP and CNN training
# steps with bfloat16 products against float32, and PyTorch's bfloat16 matmuls and autocast steps
# (scripts/bench/torch_cpu.py). On a CPU with AVX512-BF16 the products run through vdpbf16ps
# (Note [bf16 dot tiles] in tinygrad/codegen/cpu_dot.cpp); CPU_ISA=avx2 measures the float32 path.
# Writes the table into docs/PERFORMANCE.md (scripts/bench/report_bf16.py). scripts/bench/cpu.sh
# runs it after its own workloads; it needs PyTorch and a build (as cpu.sh).
#
#   bash scripts/bench/cpu_bf16.sh [--reps=N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

[[ -x build/launcher/tg ]] || bash scripts/build.sh
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
float32=(matmul_1024 matmul_2048 mlp_step cnn_step)
bf16=(matmul_1024_bf16 matmul_2048_bf16 mlp_step_bf16 cnn_step_bf16)
build/launcher/tg bench "$@" "${float32[@]}" "${bf16[@]}" | tee "$out/tg.jsonl"
source scripts/bench/torch_cpu_env.sh
run_torch_cpu "$@" "${bf16[@]}" | tee "$out/torch.jsonl"
bf16_flag="$(grep -qw avx512_bf16 /proc/cpuinfo && echo ", AVX512-BF16" || echo ", no AVX512-BF16")"
isa="$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || (grep -qw avx2 /proc/cpuinfo && echo AVX2 || echo SSE2))"
machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $isa$bf16_flag${CPU_ISA:+, CPU_ISA=$CPU_ISA}), $(date -u +%Y-%m-%d)"
/usr/bin/python3 scripts/bench/report_bf16.py "$out/tg.jsonl" "$out/torch.jsonl" docs/PERFORMANCE.md \
  "bash scripts/bench/cpu_bf16.sh $*" "$machine"
