#!/usr/bin/env bash
# scripts/bench/fsdp_bench.sh: the fsdp figures of docs/PERFORMANCE.md on this machine, 4 ranks
# under mpirun:
#   1. tg train step time (fmnist_mlp, global batch 128) with distributed.strategy ddp, zero1, fsdp;
#   2. the memory held between steps for parameters, gradients and Adam's state, ddp against fsdp
#      (the device pool's bytes in use, as test_fsdp measures it);
#   3. the arena of the captured step's intermediates (TinyJit, DEBUG=1), which holds what a step
#      needs while it runs: under fsdp the gathered parameters and full gradients too.
# Needs a build in build/ with tg and test_fsdp. Usage: bash scripts/bench/fsdp_bench.sh [STEPS] [RANKS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
steps="${1:-100}"
ranks="${2:-4}"
source scripts/bench/mlp_mpirun.sh

for s in ddp zero1 fsdp; do
  mpirun --oversubscribe -np "$ranks" ./build/launcher/tg train "${common[@]}" distributed.strategy=$s train.run_dir="$tmp/$s" >/dev/null
  echo "step time, fmnist_mlp, global batch 128, $steps steps, $ranks ranks, $s: $(step_ms "$tmp/$s/metrics.jsonl") ms"
done
mpirun --oversubscribe -np "$ranks" ./build/tests/test_fsdp --gtest_filter='*ResidentMemory*' 2>&1 | grep 'resident parameters' | head -1
for s in ddp zero1 fsdp; do
  DEBUG=1 mpirun --oversubscribe -np "$ranks" ./build/launcher/tg train "${common[@]}" train.steps=3 distributed.strategy=$s \
    train.run_dir="$tmp/a$s" >"$tmp/a$s.log" 2>&1
  arena="$(grep 'captured' "$tmp/a$s.log" | head -1 | sed 's/.*intermediates in \(.*\) of arena.*/\1/')"
  echo "captured step's arena of intermediates, fmnist_mlp, $ranks ranks, $s: $arena"
done
