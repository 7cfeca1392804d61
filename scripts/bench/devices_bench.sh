#!/usr/bin/env bash
# scripts/bench/devices_bench.sh: step time of ddp over 2 ranks x 2 devices (train.devices=2)
# against 4 ranks x 1 device, `tg train configs/fmnist_mlp.yaml` (global batch 128), the two
# interleaved ROUNDS times so that both see the same load; prints each pair's ratio and the median.
# Needs a build in build/ and mpirun. Usage: bash scripts/bench/devices_bench.sh [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
steps="${1:-100}" rounds="${2:-3}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
common=(configs/fmnist_mlp.yaml "train.steps=$steps" train.log_every=10 train.eval_every=100000 train.eval_batches=1
        train.overwrite=true train.progress=off distributed.strategy=ddp)

# Median step time over the records after the first (compilation happens in the first steps).
step_ms() {
  python3 - "$1" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
recs = recs[1:-1] or recs
print(f"{statistics.median(128 / r['examples_per_s'] * 1e3 for r in recs):.2f}")
PY
}

ratios=()
for round in $(seq "$rounds"); do
  mpirun --oversubscribe -np 2 ./build/launcher/tg train "${common[@]}" train.devices=2 train.run_dir="$tmp/d$round" >/dev/null
  mpirun --oversubscribe -np 4 ./build/launcher/tg train "${common[@]}" train.run_dir="$tmp/r$round" >/dev/null
  a="$(step_ms "$tmp/d$round/metrics.jsonl")" b="$(step_ms "$tmp/r$round/metrics.jsonl")"
  ratios+=("$(python3 -c "print(f'{$a/$b:.2f}')")")
  echo "round $round: 2 ranks x 2 devices ${a} ms, 4 ranks x 1 device ${b} ms, ratio ${ratios[-1]}"
done
echo "median ratio (2x2 / 4x1): $(python3 -c "import statistics; print(statistics.median([$(IFS=,; echo "${ratios[*]}")]))")"
