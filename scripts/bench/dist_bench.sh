#!/usr/bin/env bash
# scripts/bench/dist_bench.sh: the distributed figures of docs/PERFORMANCE.md on this machine.
#   1. tg train step time (fmnist_mlp, global batch 128) at world size 1 and 2 (ddp under mpirun);
#   2. all-reduce throughput of the project (process group, ALLREDUCE node) beside MPI_Allreduce.
# Needs a build in build/ (scripts/build.sh). Usage: bash scripts/bench/dist_bench.sh [STEPS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
steps="${1:-100}"
source scripts/bench/mlp_mpirun.sh

./build/launcher/tg train "${common[@]}" train.run_dir="$tmp/w1" >/dev/null
mpirun --oversubscribe -np 2 ./build/launcher/tg train "${common[@]}" distributed.strategy=ddp train.run_dir="$tmp/w2" >/dev/null
t1="$(step_ms "$tmp/w1/metrics.jsonl")"
t2="$(step_ms "$tmp/w2/metrics.jsonl")"
echo "step time, fmnist_mlp, global batch 128, $steps steps: world 1 ${t1} ms, world 2 ${t2} ms, speed-up $(python3 -c "print(f'{$t1/$t2:.2f}')")x"

mpirun --oversubscribe -np 2 ./build/scripts/bench/allreduce_bench
