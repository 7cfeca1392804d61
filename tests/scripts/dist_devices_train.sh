#!/bin/bash
# `tg train configs/fmnist_mlp.yaml train.devices=2` under `mpirun -np 2` (ddp, each rank over two
# virtual CPU devices, 20 steps): it ends with the parameters of the same global batch over
# 4 ranks of one device (within 1e-5), rank 0 alone writes the run directory, run.json names
# both devices of every rank, and its step-10 checkpoint resumed over 2 ranks x 2 devices ends on the
# same parameters bit for bit. Exit 77 (skipped) without Fashion-MNIST.
# Usage: dist_devices_train.sh TG SOURCE_DIR MPIEXEC
set -u
tg=$(realpath "$1") src=$2 mpiexec=$3
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "dist_devices_train: skipped: no Fashion-MNIST at $DATA"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
no() { echo "FAIL: $*"; fail=1; }
TRAIN=(train "$src/configs/fmnist_mlp.yaml" distributed.strategy=ddp train.steps=20 train.eval_batches=2 train.progress=off)
FINAL=checkpoints/step_20.safetensors

"$mpiexec" --oversubscribe -np 2 "$tg" "${TRAIN[@]}" train.devices=2 train.checkpoint_every=10 train.run_dir="$work/devices" > devices.out 2>&1 ||
  { cat devices.out; no "mpirun -np 2 tg train train.devices=2 failed"; }
tail -n 3 devices.out
"$mpiexec" --oversubscribe -np 4 "$tg" "${TRAIN[@]}" train.run_dir="$work/ranks" > ranks.out 2>&1 ||
  { cat ranks.out; no "mpirun -np 4 tg train failed"; }
python3 "$src/tests/scripts/compare_checkpoints.py" "$work/devices/$FINAL" "$work/ranks/$FINAL" 1e-5 ||
  no "2 ranks x 2 devices and 4 ranks x 1 device end with different parameters"
grep -q '"world_size": 2' "$work/devices/run.json" || no "run.json does not name a world of 2"
[ "$(grep -c '"CPU,CPU:1"' "$work/devices/run.json")" -ge 2 ] || no "run.json does not name both devices of both ranks"
grep -q 'test accuracy' "$work/devices/train.log" || no "train.log has no evaluation"

cp -r "$work/devices" "$work/resumed" && rm "$work/resumed/$FINAL"
"$mpiexec" --oversubscribe -np 2 "$tg" "${TRAIN[@]}" train.devices=2 train.resume=true train.run_dir="$work/resumed" > resumed.out 2>&1 ||
  { cat resumed.out; no "resuming over 2 ranks x 2 devices failed"; }
python3 "$src/tests/scripts/compare_checkpoints.py" "$work/resumed/$FINAL" "$work/devices/$FINAL" 0 ||
  no "the resumed run ends with other parameters than the uninterrupted one"

[ $fail -eq 0 ] && echo "dist_devices_train: all checks passed"
exit $fail
