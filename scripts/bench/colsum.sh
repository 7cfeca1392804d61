#!/usr/bin/env bash
# scripts/bench/colsum.sh: GPT-2's column sums on CUDA (Note [split column sums] in
# schedule/split_reduce.cpp, Note [column sums] in codegen/opt_gpu.cpp), before and after, in one
# run on one GPU: the `tg bench` workloads colsum_16384 (a bias gradient, [16384, 768] summed over
# its rows) and layernorm_bwd_16384 (LayerNorm's backward pass over [16384, 768]) with
# SPLIT_REDUCE=0 (the earlier layout: one work-group per column, its threads striding down the
# rows) and the default, PyTorch's eager time beside them, each kernel's time at DEBUG=2, and the
# GPT-2 step with and without. Needs build/launcher/tg with the CUDA device and a CUDA PyTorch.
#
#   bash scripts/bench/colsum.sh [REPS]   (default 50; the GPT-2 steps run REPS/10, at least 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
reps=${1:-50}
steps=$(( reps / 10 > 2 ? reps / 10 : 2 ))
workloads=(colsum_16384 layernorm_bwd_16384)
for split in 0 1; do
  SPLIT_REDUCE=$split DEVICE=CUDA build/launcher/tg bench --reps="$reps" "${workloads[@]}" | sed "s/^/SPLIT_REDUCE=$split /"
done
TORCH_DEVICE=cuda python3 scripts/bench/torch_cpu.py --reps="$reps" "${workloads[@]}" | sed "s/^/torch /" ||
  echo "no CUDA PyTorch: no torch column"
# every kernel of one step of each, with its time (the last step's lines: after the warm-ups)
for split in 0 1; do
  echo "--- kernels, SPLIT_REDUCE=$split"
  for w in "${workloads[@]}"; do
    SPLIT_REDUCE=$split DEVICE=CUDA DEBUG=3 JIT=0 build/launcher/tg bench --reps=1 "$w" 2>&1 |
      grep -E '^(split|opts|\*\*\* CUDA)'
  done
done
for split in 0 1; do
  SPLIT_REDUCE=$split DEVICE=CUDA build/launcher/tg bench --reps="$steps" gpt2_step | sed "s/^/SPLIT_REDUCE=$split /"
done
