#!/usr/bin/env bash
# scripts/faults.sh: fault injection against `tg train` on this machine; prints the counts.
#
#   (a) kill -9 during checkpointing: a short run that checkpoints every step is killed at a random
#       moment, then resumed; it must end bit-identical to an uninterrupted run (the final
#       checkpoints compared byte for byte) or refuse with a clean "no checkpoint yet" error.
#   (b) damaged checkpoints: single bit flips in the tensor data and in the header of a checkpoint,
#       and truncations at a random length; each is offered to `tg train` (train.resume=true with it
#       as the only checkpoint, and for the tensor-data flips every other one as
#       train.init_weights); it must be refused by an error naming the file.
#   (c) rank 1 of `mpirun -np 2 tg train ... distributed.strategy=ddp distributed.timeout_s=5` is
#       stopped (SIGSTOP) or killed (kill -9) mid-training: every rank must be gone within 7 s,
#       mpirun must return non-zero, and the output must name rank 1 as the culprit.
#
# Usage: bash scripts/faults.sh [options]
#   --kill-trials=N     (a) trials (default 40)
#   --flips=N           (b) bit flips in the tensor data (default 450)
#   --header-flips=N    (b) bit flips in the header (default 50)
#   --truncations=N     (b) truncations (default 50)
#   --mpi-trials=N      (c) trials per signal (default 10)
#   --scale=F           multiplies every count above (e.g. 0.1 for a quick look)
#   --only=a,b,c        run only these parts
#   --jobs=N            (a) and (b) trials run N at a time (default 2)
#   --seed=N            random seed (default 1)
#   --keep              keep the work directory
# Environment: TG (default build/launcher/tg), TG_CONFIG (configs/fmnist_mlp.yaml),
# TG_DATA (/usr/share/datasets/fashion-mnist), MPIRUN (mpirun).
# Exit status: 0 when every trial behaved as required, 1 otherwise, 77 when the data set or
# mpirun is missing.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

KILL_TRIALS=40 FLIPS=450 HEADER_FLIPS=50 TRUNCATIONS=50 MPI_TRIALS=10 SCALE=1 ONLY=a,b,c JOBS=2 SEED=1 KEEP=0
for arg in "$@"; do
  case "$arg" in
    --kill-trials=*) KILL_TRIALS=${arg#*=} ;;
    --flips=*) FLIPS=${arg#*=} ;;
    --header-flips=*) HEADER_FLIPS=${arg#*=} ;;
    --truncations=*) TRUNCATIONS=${arg#*=} ;;
    --mpi-trials=*) MPI_TRIALS=${arg#*=} ;;
    --scale=*) SCALE=${arg#*=} ;;
    --only=*) ONLY=${arg#*=} ;;
    --jobs=*) JOBS=${arg#*=} ;;
    --seed=*) SEED=${arg#*=} ;;
    --keep) KEEP=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "faults: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
scaled() { awk -v n="$1" -v s="$SCALE" 'BEGIN { v = int(n * s + 0.5); print (n > 0 && v < 1) ? 1 : v }'; }
KILL_TRIALS=$(scaled "$KILL_TRIALS") FLIPS=$(scaled "$FLIPS") HEADER_FLIPS=$(scaled "$HEADER_FLIPS")
TRUNCATIONS=$(scaled "$TRUNCATIONS") MPI_TRIALS=$(scaled "$MPI_TRIALS")

TG=$(realpath "${TG:-build/launcher/tg}")
CONFIG=$(realpath "${TG_CONFIG:-configs/fmnist_mlp.yaml}")
DATA=${TG_DATA:-/usr/share/datasets/fashion-mnist}
MPIRUN=${MPIRUN:-mpirun}
[ -x "$TG" ] || { echo "faults: no tg at $TG (build it: cmake --build build --target tg)" >&2; exit 2; }
[ -d "$DATA" ] || { echo "faults: skipped: no Fashion-MNIST at $DATA (set TG_DATA)"; exit 77; }
if [[ ",$ONLY," == *",c,"* ]] && ! command -v "$MPIRUN" >/dev/null; then
  echo "faults: skipped: no $MPIRUN for part (c)"; exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
WORK=$(mktemp -d /tmp/tg-faults.XXXXXX)
[ "$KEEP" = 1 ] || trap 'rm -rf "$WORK"' EXIT
RANDOM=$SEED
FAILED=0

say() { echo "faults: $*"; }
part() { [[ ",$ONLY," == *",$1,"* ]]; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# A uniform random number in [lo, hi) with 3 decimals, from bash's seeded RANDOM.
uniform() { awk -v lo="$1" -v hi="$2" -v r="$(((RANDOM << 15) | RANDOM))" 'BEGIN { printf "%.3f", lo + (hi - lo) * r / 1073741824 }'; }
# Runs at most JOBS background trials at a time.
throttle() { while (($(jobs -rp | wc -l) >= JOBS)); do wait -n; done; }
# count FILE PATTERN: lines of FILE equal to PATTERN.
count() { grep -cx "$2" "$1" 2>/dev/null || true; }

# A short run: 40 steps of a small MLP, a checkpoint after every step.
BASE=(train "$CONFIG" train.checkpoint_every=1 model.hidden=[64] data.root="$DATA" train.print_every=1000)
TRAIN=("${BASE[@]}" train.steps=40)
FINAL=checkpoints/step_40.safetensors

# Waits until run directory $1 holds a checkpoint or process $2 has ended.
wait_for_checkpoint() {
  while kill -0 "$2" 2>/dev/null && ! compgen -G "$1/checkpoints/step_*" >/dev/null; do sleep 0.01; done
}

# The uninterrupted run; REF_SECONDS: its length, REF_CHECKPOINTING: from its first checkpoint on.
reference_run() {
  local t0 t1 pid
  t0=$(now)
  "$TG" "${TRAIN[@]}" train.run_dir="$WORK/ref" >"$WORK/ref.out" 2>&1 &
  pid=$!
  wait_for_checkpoint "$WORK/ref" "$pid"
  t1=$(now)
  wait "$pid" || { cat "$WORK/ref.out"; exit 1; }
  REF_SECONDS=$(since "$t0") REF_CHECKPOINTING=$(since "$t1")
  say "reference run: 40 steps, a checkpoint after each, in ${REF_SECONDS} s (${REF_CHECKPOINTING} s from the first checkpoint)"
}

# ---- (a) kill -9 during checkpointing ----

# One trial: kill -9 at a random moment (most after the first checkpoint), resume, compare.
kill_trial() {
  local i=$1 delay=$2 from_checkpoint=$3 dir="$WORK/kill/$1" pid
  mkdir -p "$WORK/kill"
  "$TG" "${TRAIN[@]}" train.run_dir="$dir" >"$WORK/kill/$i.run" 2>&1 &
  pid=$!
  [ "$from_checkpoint" = 1 ] && wait_for_checkpoint "$dir" "$pid"
  sleep "$delay"
  local outcome
  if kill -KILL "$pid" 2>/dev/null; then outcome=killed; else outcome=finished; fi
  wait "$pid" 2>/dev/null
  if "$TG" "${TRAIN[@]}" train.run_dir="$dir" train.resume=true >"$WORK/kill/$i.resume" 2>&1; then
    if cmp -s "$dir/$FINAL" "$WORK/ref/$FINAL"; then echo "identical" >"$WORK/kill/$i.outcome"
    else echo "different" >"$WORK/kill/$i.outcome"; fi
  elif grep -Eq "no complete checkpoint in|no run directory" "$WORK/kill/$i.resume"; then
    echo "no-checkpoint" >"$WORK/kill/$i.outcome"
  else
    echo "resume-failed" >"$WORK/kill/$i.outcome"
  fi
  [ "$outcome" = finished ] && echo "finished-before-kill" >>"$WORK/kill/$i.outcome"
}

part_a() {
  say "(a) kill -9 during checkpointing: $KILL_TRIALS trials, $JOBS at a time"
  for ((i = 0; i < KILL_TRIALS; i++)); do
    throttle
    # one trial in five at any moment of the run (often before the first checkpoint), the rest
    # at a moment after the first checkpoint
    if ((i % 5 == 4)); then kill_trial "$i" "$(uniform 0 "$REF_SECONDS")" 0 &
    else kill_trial "$i" "$(uniform 0 "$(awk -v s="$REF_CHECKPOINTING" 'BEGIN { print 0.8 * s }')")" 1 & fi
  done
  wait
  cat "$WORK"/kill/*.outcome >"$WORK/kill.tally"
  local same none diff bad fin
  same=$(count "$WORK/kill.tally" identical) none=$(count "$WORK/kill.tally" no-checkpoint)
  diff=$(count "$WORK/kill.tally" different) bad=$(count "$WORK/kill.tally" resume-failed)
  fin=$(count "$WORK/kill.tally" finished-before-kill)
  say "(a) kill -9 during checkpointing: $KILL_TRIALS trials: $same resumed bit-identical, $none refused with" \
      "\"no checkpoint yet\", $diff resumed with different parameters, $bad resumes failed otherwise" \
      "(runs that had finished before the kill: $fin)"
  for f in "$WORK"/kill/*.outcome; do
    grep -qx "different\|resume-failed" "$f" && { say "  trial $(basename "$f" .outcome):"; tail -3 "${f%.outcome}.resume"; }
  done
  ((diff + bad == 0)) || FAILED=1
}

# ---- (b) damaged checkpoints ----

HEADER_END=0 FILE_SIZE=0
checkpoint_layout() {
  local f="$WORK/ref/$FINAL"
  HEADER_END=$((8 + $(od -An -tu8 -N8 "$f" | tr -d ' ')))
  FILE_SIZE=$(stat -c %s "$f")
  say "(b) the checkpoint: $FILE_SIZE bytes, header bytes [0, $HEADER_END), tensor data after"
}

# flip_bit SRC DST OFFSET BIT
flip_bit() {
  python3 -c 'import sys
src, dst, off, bit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
b = bytearray(open(src, "rb").read()); b[off] ^= 1 << bit; open(dst, "wb").write(b)' "$@"
}

# One damaged file, offered by resume (how=resume) or as init weights (how=init).
damage_trial() {
  local name=$1 how=$2 kind=$3 a=$4 b=$5 dir="$WORK/dmg/$1" f
  mkdir -p "$dir/checkpoints"
  f="$dir/$FINAL"
  case "$kind" in
    flip) flip_bit "$WORK/ref/$FINAL" "$f" "$a" "$b" ;;
    truncate) head -c "$a" "$WORK/ref/$FINAL" >"$f" ;;
  esac
  local args=("${TRAIN[@]}" train.run_dir="$dir" train.resume=true)
  [ "$how" = init ] && args=("${BASE[@]}" train.steps=1 train.run_dir="$dir/run" train.init_weights="$f")
  if "$TG" "${args[@]}" >"$dir.out" 2>&1; then echo "loaded" >"$dir.outcome"
  elif grep -qF "$f" "$dir.out"; then echo "refused-by-name" >"$dir.outcome"
  else echo "refused-unnamed" >"$dir.outcome"; fi
}

damage_report() {
  local label=$1 glob=$2 n named unnamed loaded
  cat $glob >"$WORK/dmg.tally" 2>/dev/null
  n=$(wc -l <"$WORK/dmg.tally") named=$(count "$WORK/dmg.tally" refused-by-name)
  unnamed=$(count "$WORK/dmg.tally" refused-unnamed) loaded=$(count "$WORK/dmg.tally" loaded)
  say "(b) $label: $n: $named refused naming the file, $unnamed refused without naming it, $loaded loaded"
  ((named == n)) || FAILED=1
}

part_b() {
  checkpoint_layout
  local data=$((FILE_SIZE - HEADER_END))
  say "(b) $FLIPS tensor-data flips, $HEADER_FLIPS header flips, $TRUNCATIONS truncations, $JOBS at a time"
  mkdir -p "$WORK/dmg"
  for ((i = 0; i < FLIPS; i++)); do
    throttle
    local how=resume
    ((i % 2 == 1)) && how=init
    damage_trial "data$i-$how" "$how" flip "$((HEADER_END + ((RANDOM << 15 | RANDOM) % data)))" "$((RANDOM % 8))" &
  done
  for ((i = 0; i < HEADER_FLIPS; i++)); do
    throttle
    damage_trial "header$i-resume" resume flip "$(((RANDOM << 15 | RANDOM) % HEADER_END))" "$((RANDOM % 8))" &
  done
  for ((i = 0; i < TRUNCATIONS; i++)); do
    throttle
    damage_trial "trunc$i-resume" resume truncate "$(((RANDOM << 15 | RANDOM) % FILE_SIZE))" 0 &
  done
  wait
  damage_report "bit flips in the tensor data, by resume" "$WORK/dmg/data*-resume.outcome"
  damage_report "bit flips in the tensor data, as train.init_weights" "$WORK/dmg/data*-init.outcome"
  damage_report "bit flips in the header, by resume" "$WORK/dmg/header*.outcome"
  damage_report "truncations, by resume" "$WORK/dmg/trunc*.outcome"
  for f in "$WORK"/dmg/*.outcome; do
    grep -qx loaded "$f" && say "  loaded: $(basename "$f" .outcome)"
  done | head -20
}

# ---- (c) a stopped or killed rank under mpirun ----

# pid of rank R among the children of mpirun PID (from /proc: no procps needed)
rank_pid() {
  local p
  for p in $(awk -v parent="$1" '$4 == parent { print $1 }' /proc/[0-9]*/stat 2>/dev/null); do
    grep -qz "^OMPI_COMM_WORLD_RANK=$2\$" "/proc/$p/environ" 2>/dev/null && { echo "$p"; return; }
  done
}

alive() { local s; s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ]; }

# One trial: SIG to rank 1 mid-training; prints "<seconds to the end> <rc> <named> <network> <logged>".
mpi_trial() {
  local sig=$1 i=$2 dir="$WORK/mpi/$1-$2" job r0 r1 t0
  mkdir -p "$WORK/mpi"
  "$MPIRUN" -np 2 "$TG" train "$CONFIG" distributed.strategy=ddp distributed.timeout_s=5 train.epochs=50 \
    model.hidden=[64] data.root="$DATA" train.run_dir="$dir" train.print_every=1000000 >"$dir.out" 2>&1 &
  job=$!
  for ((k = 0; k < 600; k++)); do  # until training runs (a step line in train.log), at most 60 s
    grep -q " step " "$dir/train.log" 2>/dev/null && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  sleep "$(uniform 0 1)"
  r0=$(rank_pid "$job" 0) r1=$(rank_pid "$job" 1)
  if [ -z "$r1" ]; then echo "nan 0 0 0 0"; kill -KILL "$job" 2>/dev/null; return; fi
  kill -"$sig" "$r1"
  t0=$(now)
  while (kill -0 "$job" 2>/dev/null || alive "$r0" || alive "$r1") && awk -v e="$(since "$t0")" 'BEGIN { exit !(e < 30) }'; do
    sleep 0.02
  done
  local took rc=0
  took=$(since "$t0")
  if kill -0 "$job" 2>/dev/null; then kill -KILL "$job" "$r0" "$r1" 2>/dev/null; fi
  wait "$job" 2>/dev/null || rc=$?
  alive "$r0" && kill -KILL "$r0"
  alive "$r1" && kill -KILL "$r1"
  local named=0 network=0 logged=0
  grep -Eq "not answering \(stopped or dead\?\): rank 1 |never reached it \(stuck or slow\?\): rank 1 |process rank 1 .*exited on signal" \
    "$dir.out" && named=1
  grep -q "network" "$dir.out" && network=1
  grep -q "error: mpi: " "$dir/train.log" 2>/dev/null && logged=1
  echo "$took $rc $named $network $logged"
}

part_c() {
  local sig name
  for sig in STOP KILL; do
    name=$([ "$sig" = STOP ] && echo "SIGSTOP" || echo "kill -9")
    say "(c) $name of rank 1 under mpirun -np 2, distributed.timeout_s=5: $MPI_TRIALS trials"
    : >"$WORK/mpi-$sig.tally"
    for ((i = 0; i < MPI_TRIALS; i++)); do mpi_trial "$sig" "$i" | tee -a "$WORK/mpi-$sig.tally" | sed 's/^/faults:   seconds rc named network logged: /'; done
    awk -v name="$name" -v n="$MPI_TRIALS" '
      { if ($1 != "nan" && $1 <= 7) fast++; if ($2 != 0) nonzero++; if ($3) named++; if ($4) network++; if ($5) logged++
        if ($1 != "nan" && $1 > max) max = $1 }
      END { printf "faults: (c) %s of rank 1: %d trials: %d ended within 7 s (slowest %.2f s), %d non-zero exits, %d named rank 1, %d blamed the network, %d with the error in train.log\n",
                   name, n, fast, max, nonzero, named, network, logged
            exit !(fast == n && nonzero == n && named == n && network == 0) }' "$WORK/mpi-$sig.tally" || FAILED=1
  done
}

say "tg: $TG; machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; work directory $WORK"
START=$(now)
if part a || part b; then reference_run; fi
part a && part_a
part b && part_b
part c && part_c
say "done in $(since "$START") s: $([ "$FAILED" = 0 ] && echo "every trial as required" || echo "SOME TRIALS FAILED")"
exit "$FAILED"
