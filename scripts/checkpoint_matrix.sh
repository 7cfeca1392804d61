#!/usr/bin/env bash
# scripts/checkpoint_matrix.sh: which checkpoints resume under which strategy, world size and devices.
#
# For every source (strategy none on one process; ddp, zero1 and fsdp under mpirun with 1, 2 and 4
# ranks; one process over 2 and 4 virtual CPU devices, data parallel (devices@N: train.devices=N)
# or tensor parallel (tp@N: model.tensor_parallel=N)) a short fmnist MLP run of 6 steps writes
# checkpoints at steps 3 and 6. Its step-3 checkpoint is then resumed by every target (the same
# fourteen) up to step 6, and the resumed run's parameters are compared with the source's own
# step-6 checkpoint: "=" bit for bit, a number the largest |a - b| / (|b| + 0.01), or the first
# line of the error. A failed resume must leave the
# checkpoint files as they were (checked by checksum: "CHANGED" otherwise).
#
# The MLP is 28 wide (tensor parallel over 4 devices splits it; at 32, Adam's division of tiny
# moments makes even uninterrupted runs of different summation orders end 2e-2 apart).
#
# Usage: bash scripts/checkpoint_matrix.sh [SOURCE ...]   (e.g. zero1@2 tp@2; default: all fourteen)
# Environment: TG (default build/launcher/tg), MPIRUN (mpirun), WORK (a temporary directory).
# Needs Fashion-MNIST (/usr/share/datasets/fashion-mnist). Prints one table row per source.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
TG=${TG:-$src/build/launcher/tg}
MPIRUN=${MPIRUN:-mpirun}
WORK=${WORK:-$(mktemp -d /tmp/ckpt_matrix.XXXXXX)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
CELLS=(none@1 ddp@1 ddp@2 ddp@4 zero1@1 zero1@2 zero1@4 fsdp@1 fsdp@2 fsdp@4 devices@2 devices@4 tp@2 tp@4)
SOURCES=("$@")
[ ${#SOURCES[@]} -eq 0 ] && SOURCES=("${CELLS[@]}")
OPTS=(model.hidden=[28] data.batch_size=32 train.steps=6 train.log_every=2 train.eval_every=1000
      data.eval_batch_size=5000 train.checkpoint_every=3 optim.clip_grad_norm=0.5 train.progress=off)

# train CELL DIR [key=value ...]: tg train under CELL's strategy and world size (devices and tp:
# one process over that many devices).
train() {
  local cell=$1 dir=$2 strategy=${1%@*} ranks=${1#*@}
  shift 2
  if [ "$strategy" = none ]; then
    nice -n 19 "$TG" train "$src/configs/fmnist_mlp.yaml" "${OPTS[@]}" train.run_dir="$dir" "$@"
  elif [ "$strategy" = devices ]; then
    nice -n 19 "$TG" train "$src/configs/fmnist_mlp.yaml" "${OPTS[@]}" train.devices="$ranks" train.run_dir="$dir" "$@"
  elif [ "$strategy" = tp ]; then
    nice -n 19 "$TG" train "$src/configs/fmnist_mlp.yaml" "${OPTS[@]}" model.tensor_parallel="$ranks" \
      train.run_dir="$dir" "$@"
  else
    nice -n 19 "$MPIRUN" -np "$ranks" "$TG" train "$src/configs/fmnist_mlp.yaml" "${OPTS[@]}" \
      distributed.strategy="$strategy" train.run_dir="$dir" "$@"
  fi
}

# The parameters of two checkpoints (fsdp ones unsharded): "=" when equal, else the largest difference.
compare() {
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        b = data[v["data_offsets"][0]:v["data_offsets"][1]]
        out[k] = (v["shape"], list(struct.unpack("<%df" % (len(b) // 4), b)) if v["dtype"] == "F32" else b)
    return meta, out
def model(path):
    meta, sd = load(path)
    params = {k[6:]: v[1] for k, v in sd.items() if k.startswith("model.")}
    if "fsdp_ranks" in meta:
        parts = [load(path[:-len(".safetensors")] + ".fsdp-rank%d.safetensors" % r)[1] for r in range(int(meta["fsdp_ranks"]))]
        for line in meta["fsdp_layout"].splitlines():
            name, rows, shape = line.split()
            numel = 1
            for d in shape.split(","): numel *= int(d)
            params[name] = sum((p["model." + name][1] for p in parts), [])[:numel]
    return params
a, b = model(sys.argv[1]), model(sys.argv[2])
if a.keys() != b.keys(): sys.exit("parameters differ: %s" % sorted(set(a) ^ set(b)))
worst = max((abs(x - y) / (abs(y) + 0.01) for k in a for x, y in zip(a[k], b[k])), default=0.0)
print("=" if all(a[k] == b[k] for k in a) else "%.1e" % worst)
EOF
}

mkdir -p "$WORK"
printf '%-9s' "from\\to"
for t in "${CELLS[@]}"; do printf ' %-9s' "$t"; done
echo
for s in "${SOURCES[@]}"; do
  sdir=$WORK/src_${s/@/_}
  if ! train "$s" "$sdir" train.overwrite=true >"$sdir.log" 2>&1; then
    echo "$s: the source run failed ($sdir.log)"
    continue
  fi
  row=$(printf '%-9s' "$s")
  for t in "${CELLS[@]}"; do
    tdir=$WORK/to_${s/@/_}_${t/@/_}
    rm -rf "$tdir" && mkdir -p "$tdir/checkpoints"
    cp "$sdir"/checkpoints/step_3.* "$tdir/checkpoints/"
    cp "$sdir/config.yaml" "$tdir/"
    before=$(cd "$tdir/checkpoints" && sha1sum step_3.* | sha1sum)
    if train "$t" "$tdir" train.resume=true >"$tdir.log" 2>&1; then
      cell=$(compare "$tdir/checkpoints/step_6.safetensors" "$sdir/checkpoints/step_6.safetensors" 2>&1 | tail -1)
    else
      cell="ERR"
      after=$(cd "$tdir/checkpoints" && sha1sum step_3.* | sha1sum)
      [ "$before" = "$after" ] || cell="CHANGED"
      echo "  $s -> $t: $(grep -m1 -o 'error.*' "$tdir.log" | cut -c1-220)" >>"$WORK/errors.txt"
    fi
    row+=$(printf ' %-9s' "$cell")
  done
  echo "$row"
done
[ -f "$WORK/errors.txt" ] && { echo "errors:"; cat "$WORK/errors.txt"; }
echo "(work directory: $WORK)"
