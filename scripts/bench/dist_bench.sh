#!/usr/bin/env bash
# scripts/bench/dist_bench.sh: the distributed figures of docs/PERFORMANCE.md on this machine.
#   1. tg train step time (fmnist_mlp, global batch 128) at world size 1 and 2 (ddp under mpirun);
#   2. all-reduce throughput of the project (process group, ALLREDUCE node) beside MPI_Allreduce.
# Needs a build in build/ (scripts/build.sh). Usage: bash scripts/bench/dist_bench.sh [STEPS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
steps="${1:-100}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
common=(configs/fmnist_mlp.yaml "train.steps=$steps" train.log_every=10 train.eval_every=100000 train.overwrite=true)

# Mean step time over the records after the first (compilation happens in the first steps).
step_ms() {
  python3 - "$1" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
recs = recs[1:-1] or recs
eps = sum(r["examples_per_s"] for r in recs) / len(recs)
print(f"{128 / eps * 1e3:.2f}")
PY
}

./build/launcher/tg train "${common[@]}" train.run_dir="$tmp/w1" >/dev/null
mpirun --oversubscribe -np 2 ./build/launcher/tg train "${common[@]}" distributed.strategy=ddp train.run_dir="$tmp/w2" >/dev/null
t1="$(step_ms "$tmp/w1/metrics.jsonl")"
t2="$(step_ms "$tmp/w2/metrics.jsonl")"
echo "step time, fmnist_mlp, global batch 128, $steps steps: world 1 ${t1} ms, world 2 ${t2} ms, speed-up $(python3 -c "print(f'{$t1/$t2:.2f}')")x"

mpirun --oversubscribe -np 2 ./build/scripts/bench/allreduce_bench
