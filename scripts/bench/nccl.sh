#!/usr/bin/env bash
# scripts/bench/nccl.sh: all-reduce bus bandwidth of the nccl process group and of the graph's
# ALLREDUCE node beside a plain ncclAllReduce loop, 1 MB to 1 GB, on every GPU count up to the
# machine's (1, 2, 4, 8 as far as there are GPUs), one rank per GPU. Figures for docs/PERFORMANCE.md.
# Needs a build with NCCL in build/ (scripts/build.sh, or the configure line of scripts/gpu_check.sh).
#   bash scripts/bench/nccl.sh [max GPUs]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
[[ -x build/scripts/bench/nccl_bench ]] || cmake --build build --target nccl_bench
gpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
max="${1:-$gpus}"
((gpus > 0)) || { echo "nccl.sh: no GPU (nvidia-smi -L lists none)" >&2; exit 1; }
for n in 1 2 4 8; do
  ((n <= max && n <= gpus)) || break
  mpirun --oversubscribe -np "$n" -x NCCL_NVLS_ENABLE build/scripts/bench/nccl_bench
done
