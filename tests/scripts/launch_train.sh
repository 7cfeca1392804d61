#!/bin/bash
# `tg launch` with `tg train` on Fashion-MNIST (ddp over the gloo backend, 2 ranks, 60 steps):
#   (a) its parameters equal those of the same run under mpirun (mpi backend) within 1e-5;
#   (b) a kill -9 of rank 1 after the step-20 checkpoint, with --max-restarts 1: the launcher
#       names the rank, restarts the group, which resumes from that checkpoint and ends with the
#       parameters of the uninterrupted run (within 1e-5), and no worker is left.
# Exit 77 (skipped) without Fashion-MNIST or without the gloo backend.
# Usage: launch_train.sh TG SOURCE_DIR [MPIEXEC]
set -u
tg=$(realpath "$1") src=$2 mpiexec=${3:-}
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "launch_train: skipped: no Fashion-MNIST at $DATA"; exit 77; }
"$tg" info | grep -q '^process-group backends:.* gloo' || { echo "launch_train: skipped: no gloo backend"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail=0
no() { echo "FAIL: $*"; fail=1; }
same() { python3 "$src/tests/scripts/compare_checkpoints.py" "$1" "$2" 1e-5 || no "$3"; }
TRAIN=(train "$src/configs/fmnist_mlp.yaml" distributed.strategy=ddp train.steps=60 train.checkpoint_every=20)
FINAL=checkpoints/step_60.safetensors

echo "== (a) tg launch (gloo) against mpirun (mpi)"
"$tg" launch --nproc-per-node 2 -- tg "${TRAIN[@]}" train.run_dir="$work/launch" > launch.out 2>&1 || { cat launch.out; no "tg launch failed"; }
tail -n 3 launch.out
if [ -n "$mpiexec" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  "$mpiexec" --oversubscribe -np 2 "$tg" "${TRAIN[@]}" train.run_dir="$work/mpi" > mpi.out 2>&1 || { cat mpi.out; no "mpirun failed"; }
  same "$work/launch/$FINAL" "$work/mpi/$FINAL" "tg launch and mpirun end with different parameters"
else
  echo "(no mpirun: the comparison with the mpi backend is skipped)"
fi

echo "== (b) kill -9 of rank 1, --max-restarts 1"
"$tg" launch --nproc-per-node 2 --max-restarts 1 -- tg "${TRAIN[@]}" train.run_dir="$work/restart" > restart.out 2>&1 &
launcher=$!
for _ in $(seq 600); do [ -e "$work/restart/checkpoints/step_20.safetensors" ] && break; sleep 0.05; done
victim=""
for pid in $(pgrep -P "$launcher"); do
  grep -qz '^TG_RANK=1$' "/proc/$pid/environ" 2>/dev/null && victim=$pid
done
workers=$(pgrep -P "$launcher" | tr '\n' ' ')
if [ -n "$victim" ] && [ ! -e "$work/restart/$FINAL" ]; then
  kill -9 "$victim"
else
  no "rank 1 was not running when the step-20 checkpoint appeared"
fi
wait "$launcher"
rc=$?
cat restart.out | grep -v '^\[rank [01]\] epoch' | tail -n 12
[ $rc -eq 0 ] || no "the restarted launch returned $rc"
grep -q 'rank 1 (local rank 1, pid [0-9]*) was killed by SIGKILL' restart.out || no "rank 1's kill not named"
grep -q 'restarting the group (restart 1 of 1)' restart.out || no "no restart"
grep -q 'resum' "$work/restart/train.log" || no "train.log does not mention the resume"
same "$work/restart/$FINAL" "$work/launch/$FINAL" "the restarted run ends with other parameters than the uninterrupted one"
alive=""
for pid in $workers $(pgrep -P "$launcher" 2>/dev/null); do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
[ -z "$alive" ] || no "workers left: $alive"

[ $fail -eq 0 ] && echo "launch_train: all checks passed"
exit $fail
