# scripts/bench/mlp_mpirun.sh, sourced by dist_bench.sh and fsdp_bench.sh (after they set $steps
# and cd to the repository root): mpirun allowed as root, a scratch directory $tmp removed at
# exit, the arguments of their `tg train` runs ($common: fmnist_mlp, global batch 128, $steps
# steps) and step_ms, the mean step time of a run's metrics.jsonl.
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
