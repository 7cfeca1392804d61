#!/usr/bin/env bash
# scripts/bench/ddp_overhead.sh: what data parallelism costs at world size 1 on one GPU: the CNN
# step of `tg train configs/fmnist_cnn.yaml device=CUDA` alone, and under `mpirun -np 1` with
# distributed.strategy=ddp and =zero1 (nccl: buckets and their all-reduces, the skip check and the
# update, replayed in the step's CUDA graph), in one run, alternating, REPS times each. Prints the
# median step time of each and the ratios to the plain step (target: ddp <= 1.03x).
#   bash scripts/bench/ddp_overhead.sh [STEPS] [REPS] [KEY=VALUE ...]
#   (data from /usr/share/datasets/fashion-mnist or TG_DATA; KEY=VALUE overrides go to the ddp and
#   zero1 runs, e.g. distributed.skip_nonfinite=false; TG_BIN: the tg binary, default
#   build/launcher/tg; DEVICE: default CUDA, CPU for a run without a GPU; LOG_EVERY: the steps
#   per record, default 50; the first two records are left out; MPI_ARGS: more mpirun options,
#   e.g. "--bind-to none")
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
steps="${1:-400}"
reps="${2:-3}"
extra=("${@:3}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
data=/usr/share/datasets/fashion-mnist
[[ -f $data/train-images-idx3-ubyte.gz ]] || data="${TG_DATA:?no Fashion-MNIST: set TG_DATA}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
tg="${TG_BIN:-build/launcher/tg}"
device="${DEVICE:-CUDA}"
common=(configs/fmnist_cnn.yaml "device=$device" "data.root=$data" "train.steps=$steps" "train.log_every=${LOG_EVERY:-50}"
        train.eval_every=1000000 train.eval_batches=1 train.overwrite=true)

batch="$(awk '/batch_size:/ {print $2; exit}' configs/fmnist_cnn.yaml)"

# Median of the per-record step times after the first two records (compilation, capture).
step_ms() {
  python3 - "$batch" "$@" <<'PY'
import json, statistics, sys
batch, out = float(sys.argv[1]), []
for path in sys.argv[2:]:
    recs = [json.loads(l) for l in open(path) if '"examples_per_s"' in l][2:]
    out += [batch / r["examples_per_s"] * 1e3 for r in recs]
print(f"{statistics.median(out):.4f}")
PY
}

for r in $(seq "$reps"); do
  "$tg" train "${common[@]}" train.run_dir="$tmp/plain$r" >/dev/null
  mpirun -np 1 ${MPI_ARGS:-} -x NCCL_NVLS_ENABLE "$tg" train "${common[@]}" distributed.strategy=ddp "${extra[@]}" train.run_dir="$tmp/ddp$r" >/dev/null
  mpirun -np 1 ${MPI_ARGS:-} -x NCCL_NVLS_ENABLE "$tg" train "${common[@]}" distributed.strategy=zero1 "${extra[@]}" train.run_dir="$tmp/zero$r" >/dev/null
done
plain="$(step_ms "$tmp"/plain*/metrics.jsonl)"
ddp="$(step_ms "$tmp"/ddp*/metrics.jsonl)"
zero="$(step_ms "$tmp"/zero*/metrics.jsonl)"
if [[ $device == CUDA* ]]; then where="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"; else where="$device"; fi
echo "CNN step on $where ($tg), $steps steps x $reps: plain $plain ms, ddp $ddp ms ($(python3 -c "print(f'{$ddp/$plain:.3f}')")x), zero1 $zero ms ($(python3 -c "print(f'{$zero/$plain:.3f}')")x)"
