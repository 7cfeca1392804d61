#!/usr/bin/env bash
# scripts/bench/fsdp_bench.sh: the fsdp figures of docs/PERFORMANCE.md on this machine, 4 ranks
# under mpirun:
#   1. tg train step time (fmnist_mlp, global batch 128) with distributed.strategy ddp, zero1, fsdp;
#   2. the memory held between steps for parameters, gradients and Adam's state, ddp against fsdp
#      (the device pool's bytes in use, as test_fsdp measures it);
#   3. the arena of the captured step's intermediates (TinyJit, DEBUG=1), which holds what a step
#      needs while it runs: under fsdp the gathered parameters and full gradients too;
#   4. with PREV_TG=<a tg binary of an earlier fsdp> (e.g. one built before gathers ran a unit
#      ahead): fsdp's step time and arena of both binaries, fmnist_mlp and a 4-unit MLP (hidden
#      512 x 3), the two binaries' runs interleaved three times, so their ratio is taken under
#      the same load.
# Needs a build in build/ with tg and test_fsdp.
# Usage: [PREV_TG=path] bash scripts/bench/fsdp_bench.sh [STEPS] [RANKS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
steps="${1:-100}"
ranks="${2:-4}"
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

# 4. this build's fsdp against PREV_TG's, runs interleaved.
[[ -n "${PREV_TG:-}" ]] || exit 0
fsdp_ms() {  # binary model-override tag -> mean step ms
  mpirun --oversubscribe -np "$ranks" "$1" train "${common[@]}" "$2" distributed.strategy=fsdp train.run_dir="$tmp/$3" >/dev/null
  step_ms "$tmp/$3/metrics.jsonl"
}
fsdp_arena() {  # binary model-override tag -> the captured step's arena
  DEBUG=1 mpirun --oversubscribe -np "$ranks" "$1" train "${common[@]}" "$2" train.steps=3 distributed.strategy=fsdp \
    train.run_dir="$tmp/$3" >"$tmp/$3.log" 2>&1
  grep 'captured' "$tmp/$3.log" | head -1 | sed 's/.*collectives;.*intermediates in \(.*\) of arena.*/\1/'
}
for model in "model.hidden=[256]" "model.hidden=[512,512,512]"; do
  echo "fsdp, $model, $ranks ranks: captured step's arena: previous $(fsdp_arena "$PREV_TG" "$model" pa), this build $(fsdp_arena ./build/launcher/tg "$model" na)"
  for i in 1 2 3; do  # the pair's first run alternates
    if ((i % 2)); then a="$(fsdp_ms "$PREV_TG" "$model" "p$i")"; b="$(fsdp_ms ./build/launcher/tg "$model" "n$i")"
    else b="$(fsdp_ms ./build/launcher/tg "$model" "n$i")"; a="$(fsdp_ms "$PREV_TG" "$model" "p$i")"; fi
    echo "fsdp, $model, $ranks ranks, $steps steps, pair $i: previous $a ms, this build $b ms ($(python3 -c "print(f'{$b / $a:.3f}')")x)"
  done
done
