#!/usr/bin/env bash
# scripts/bench/fsdp_bench.sh: the fsdp figures of docs/PERFORMANCE.md on this machine, 4 ranks
# under mpirun:
#   1. tg train step time (fmnist_mlp, global batch 128) with distributed.strategy ddp, zero1, fsdp;
#   2. the memory held between steps for parameters, gradients and Adam's state, ddp against fsdp
#      (the device pool's bytes in use, as test_fsdp measures it);
#   3. the arena of the captured step's intermediates (TinyJit, DEBUG=1), which holds what a step
#      needs while it runs: under fsdp the gathered parameters and full gradients too;
#   4. fsdp's gathers (distributed.fsdp_gathers): top (every gather at the top of the step, kept to
#      its end), kept (one unit ahead, kept for backward) and resharded (one unit ahead, gathered
#      again for backward, the default): the captured step's arena and the step time (of the
#      quickest 10-step window), fmnist_mlp and a 4-unit MLP (hidden 512 x 3), the three runs of
#      a round one after the other (the first of them rotating), ROUNDS rounds (default 3), so
#      ratios within a round are under about the same load.
# Needs a build in build/ with tg and test_fsdp. Usage: bash scripts/bench/fsdp_bench.sh [STEPS] [RANKS] [ROUNDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
steps="${1:-100}"
ranks="${2:-4}"
rounds="${3:-3}"
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

# 4. fsdp's gathers against each other.
# The step time of the quickest 10-step window after the first (the least disturbed by the load).
fastest_step_ms() {
  python3 - "$1" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
recs = recs[1:-1] or recs
print(f"{128 / max(r['examples_per_s'] for r in recs) * 1e3:.2f}")
PY
}
fsdp_ms() {  # gathers model-override tag -> step ms
  mpirun --oversubscribe -np "$ranks" ./build/launcher/tg train "${common[@]}" "$2" distributed.strategy=fsdp \
    distributed.fsdp_gathers="$1" train.run_dir="$tmp/$3" >/dev/null
  fastest_step_ms "$tmp/$3/metrics.jsonl"
}
fsdp_arena() {  # gathers model-override -> the captured step's arena
  DEBUG=1 mpirun --oversubscribe -np "$ranks" ./build/launcher/tg train "${common[@]}" "$2" train.steps=3 \
    distributed.strategy=fsdp distributed.fsdp_gathers="$1" train.run_dir="$tmp/arena" >"$tmp/arena.log" 2>&1
  grep 'captured' "$tmp/arena.log" | head -1 | sed 's/.*collectives;.*intermediates in \(.*\) of arena.*/\1/'
}
modes=(top kept resharded)
for model in "model.hidden=[256]" "model.hidden=[512,512,512]"; do
  echo "fsdp, $model, $ranks ranks: captured step's arena: top $(fsdp_arena top "$model"), kept $(fsdp_arena kept "$model"), resharded $(fsdp_arena resharded "$model")"
  for ((round = 0; round < rounds; round++)); do
    declare -A ms=()
    for k in 0 1 2; do
      m="${modes[$(((k + round) % 3))]}"
      ms[$m]="$(fsdp_ms "$m" "$model" "$m$round")"
    done
    echo "fsdp, $model, $ranks ranks, $steps steps, round $((round + 1)): top ${ms[top]} ms, kept ${ms[kept]} ms, resharded ${ms[resharded]} ms;" \
      "/ top: kept $(python3 -c "print(f'{${ms[kept]} / ${ms[top]}:.3f}')"), resharded $(python3 -c "print(f'{${ms[resharded]} / ${ms[top]}:.3f}')")"
  done
done
