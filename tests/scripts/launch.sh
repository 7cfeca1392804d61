#!/bin/bash
# `tg launch` end to end with `sh -c` workers: the variables each worker sees; a worker that
# exits 3 (the launcher exits 3 naming rank 1, the other worker and what it started are gone); a
# kill -9 of one worker (named, with its signal, within a bound); a worker that ignores SIGTERM
# (SIGKILL after the grace period); SIGTERM and SIGINT to the launcher (no worker left);
# --max-restarts 1 (the group runs once more, with TG_RESTART_COUNT=1, and no more); two nodes on
# the loopback address; the refusals of tg train.
# Usage: launch.sh TG [TRIALS of the kill -9 (default 20)]
set -u
tg=$(realpath "$1")
TRIALS=${2:-20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
no() { echo "FAIL: $*"; fail=1; }
now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
within() { awk -v a="$1" -v m="$2" 'BEGIN { exit !(a <= m) }'; }

# The pids a test's workers wrote (each worker: its own pid and its background child's).
alive_of() {
  local alive=""
  for f in "$1"/pid.*; do
    [ -e "$f" ] || continue
    for pid in $(cat "$f"); do
      state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
      [ -n "$state" ] && [ "$state" != Z ] && alive="$alive $pid"
    done
  done
  echo "$alive"
}
wait_for_files() {  # DIR N: until N pid files exist (at most 10 s)
  for _ in $(seq 200); do [ "$(ls "$1" | grep -c '^pid\.')" -ge "$2" ] && return 0; sleep 0.05; done
  return 1
}
# A worker that records its pid and a child's, then sleeps (the child too).
SLEEPER='sleep 300 & echo "$$ $!" > "$D/pid.$TG_RANK"; wait'

echo "== the workers' variables"
out=$("$tg" launch --nproc-per-node 2 -- sh -c 'echo "vars $TG_RANK $TG_WORLD_SIZE $TG_LOCAL_RANK $TG_LOCAL_WORLD_SIZE $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $TG_RESTART_COUNT ${#TG_RDZV_TOKEN} $TG_RDZV_RUN_ID"; [ "$TG_RDZV_ENDPOINT" = "$MASTER_ADDR:$MASTER_PORT" ] && echo endpoint-ok' 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || no "launcher returned $rc"
if "$tg" info | grep -q '^rendezvous store: built'; then
  echo "$out" | grep -qx '\[rank 0\] vars 0 2 0 2 0 2 0 2 127.0.0.1 0 64 tg/attempt0' || no "rank 0's variables"
  echo "$out" | grep -qx '\[rank 1\] vars 1 2 1 2 1 2 1 2 127.0.0.1 0 64 tg/attempt0' || no "rank 1's variables"
  [ "$(echo "$out" | grep -c 'endpoint-ok')" -eq 2 ] || no "TG_RDZV_ENDPOINT is not MASTER_ADDR:MASTER_PORT"
else  # no store: the ranks alone
  echo "(the build has no rendezvous store: its variables and the two-node checks are skipped)"
  echo "$out" | grep -qx '\[rank 1\] vars 1 2 1 2 1 2 1 2  0 0 ' || no "rank 1's variables"
fi

echo "== a worker exits 3"
D=$work/exit3; mkdir -p "$D"; export D
out=$("$tg" launch --nproc-per-node 2 --grace-s 2 -- sh -c 'if [ $TG_RANK = 1 ]; then echo "pid $$" > "$D/pid.1"; echo "last words"; exit 3; fi; '"$SLEEPER" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 3 ] || no "launcher returned $rc, not 3"
echo "$out" | grep -q 'rank 1 (local rank 1, pid [0-9]*) exited with code 3' || no "rank 1's exit not named"
echo "$out" | grep -A1 'the last lines of rank 1' | grep -q 'last words' || no "rank 1's last lines not shown"
alive=$(alive_of "$D"); [ -z "$alive" ] || { no "processes left: $alive"; kill -9 $alive; }

echo "== kill -9 of one worker, $TRIALS trials"
kill9_trial() {
  D=$work/kill9.$1; mkdir -p "$D"
  "$tg" launch --nproc-per-node 2 --grace-s 2 -- sh -c "$SLEEPER" > "$D/out" 2>&1 &
  launcher=$!
  wait_for_files "$D" 2 || no "the workers did not start"
  victim=$(cut -d' ' -f1 "$D/pid.1")
  start=$(now)
  kill -9 "$victim"
  wait "$launcher"
  rc=$?
  took=$(seconds_since "$start")
  local bad=$fail
  [ $rc -eq 137 ] || no "launcher returned $rc, not 137 (128 + SIGKILL)"
  within "$took" 4 || no "the launcher took ${took} s (limit 4 s: a 2 s grace period + 2 s)"
  grep -q 'rank 1 (local rank 1, pid [0-9]*) was killed by SIGKILL (signal 9)' "$D/out" || no "rank 1's kill not named"
  alive=$(alive_of "$D"); [ -z "$alive" ] || { no "processes left: $alive"; kill -9 $alive; }
  [ $fail -eq $bad ] || cat "$D/out"
  slowest=$(awk -v a="$took" -v b="$slowest" 'BEGIN { print (a > b ? a : b) }')
}
slowest=0
for t in $(seq "$TRIALS"); do kill9_trial "$t"; done
echo "the launcher ended at most ${slowest} s after the kill"

echo "== a worker that ignores SIGTERM is killed after the grace period"
D=$work/stubborn; mkdir -p "$D"
start=$(now)
out=$("$tg" launch --nproc-per-node 2 --grace-s 0.5 -- sh -c 'trap "" TERM; if [ $TG_RANK = 1 ]; then sleep 0.3; exit 5; fi; echo "$$" > "$D/pid.0"; while :; do sleep 0.1; done' 2>&1)
rc=$?
took=$(seconds_since "$start")
echo "$out"
[ $rc -eq 5 ] || no "launcher returned $rc, not 5"
within "$took" 3 || no "the launcher took ${took} s (a 0.5 s grace period)"
alive=$(alive_of "$D"); [ -z "$alive" ] || { no "processes left: $alive"; kill -9 $alive; }

echo "== SIGTERM to the launcher"
D=$work/term; mkdir -p "$D"
"$tg" launch --nproc-per-node 2 --grace-s 2 -- sh -c "$SLEEPER" > "$D/out" 2>&1 &
launcher=$!
wait_for_files "$D" 2 || no "the workers did not start"
kill -TERM "$launcher"
wait "$launcher"
rc=$?
cat "$D/out"
[ $rc -eq 143 ] || no "launcher returned $rc, not 143 (128 + SIGTERM)"
grep -q 'stopped every worker after SIGTERM' "$D/out" || no "no word of the stop"
alive=$(alive_of "$D"); [ -z "$alive" ] || { no "processes left: $alive"; kill -9 $alive; }

echo "== SIGINT to the launcher (as a Ctrl-C would send it)"
D=$work/int; mkdir -p "$D"
"$tg" launch --nproc-per-node 2 --grace-s 2 -- sh -c "$SLEEPER" > "$D/out" 2>&1 &
launcher=$!
wait_for_files "$D" 2 || no "the workers did not start"
kill -INT "$launcher"
wait "$launcher"
rc=$?
[ $rc -eq 130 ] || no "launcher returned $rc after SIGINT, not 130 (128 + SIGINT)"
grep -q 'stopped every worker after SIGINT' "$D/out" || no "no word of the stop after SIGINT"
alive=$(alive_of "$D"); [ -z "$alive" ] || { no "processes left after SIGINT: $alive"; kill -9 $alive; }

echo "== --max-restarts 1"
D=$work/restart; mkdir -p "$D"
out=$("$tg" launch --nproc-per-node 2 --max-restarts 1 -- sh -c 'echo "attempt $TG_RESTART_COUNT" >> "$D/runs.$TG_RANK"; [ "$TG_RESTART_COUNT" = 1 ] || [ $TG_RANK = 0 ] || exit 7' 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || no "launcher returned $rc after a successful restart"
echo "$out" | grep -q 'restarting the group (restart 1 of 1)' || no "no word of the restart"
[ "$(cat "$D/runs.1")" = "$(printf 'attempt 0\nattempt 1')" ] || no "rank 1's runs: $(cat "$D/runs.1")"
out=$("$tg" launch --nproc-per-node 1 --max-restarts 1 -- sh -c 'echo x >> "$D/always"; exit 4' 2>&1)
rc=$?
[ $rc -eq 4 ] || no "an always-failing group returned $rc, not 4"
[ "$(wc -l < "$D/always")" -eq 2 ] || no "an always-failing group ran $(wc -l < "$D/always") times, not 2"
echo "$out" | grep -q 'no restarts left' || no "no word that the restarts ran out"

if "$tg" info | grep -q '^rendezvous store: built'; then
  echo "== two nodes on the loopback address (one store, served by node 0)"
  D=$work/nodes; mkdir -p "$D"
  port=$((20000 + RANDOM % 20000))
  two_nodes() {  # PORT CMD: node 1 in the background, node 0 here; the return codes in $D/rc.K
    TG_RDZV_TOKEN=shared-secret "$tg" launch --nnodes 2 --node-rank 1 --rdzv "127.0.0.1:$1" --nproc-per-node 2 \
      --rdzv-timeout-s 20 -- sh -c "$2" > "$D/out.1" 2>&1 &
    local node1=$!
    TG_RDZV_TOKEN=shared-secret "$tg" launch --nnodes 2 --node-rank 0 --rdzv "127.0.0.1:$1" --nproc-per-node 2 \
      --rdzv-timeout-s 20 -- sh -c "$2" > "$D/out.0" 2>&1
    echo $? > "$D/rc.0"
    wait $node1
    echo $? > "$D/rc.1"
    cat "$D/out.0" "$D/out.1"
  }
  two_nodes "$port" 'echo "node $TG_NODE_RANK rank $TG_RANK of $TG_WORLD_SIZE local $TG_LOCAL_RANK store $MASTER_ADDR:$MASTER_PORT"'
  [ "$(cat "$D/rc.0") $(cat "$D/rc.1")" = "0 0" ] || no "the nodes returned $(cat "$D/rc.0") and $(cat "$D/rc.1")"
  for r in 0 1 2 3; do
    grep -q "\[rank $r\] node $((r / 2)) rank $r of 4 local $((r % 2)) store 127.0.0.1:$port" "$D/out.$((r / 2))" || no "rank $r's variables"
  done
  two_nodes $((port + 1)) 'sleep 0.3; [ $TG_RANK = 3 ] && exit 9; sleep 30'
  [ "$(cat "$D/rc.1")" = 9 ] || no "node 1 returned $(cat "$D/rc.1"), not 9"
  [ "$(cat "$D/rc.0")" != 0 ] || no "node 0 returned 0 after rank 3 failed"
  grep -q 'another node failed: rank 3 on node 1 exited with code 9' "$D/out.0" || no "node 0 did not name rank 3"
  "$tg" launch --nnodes 2 --node-rank 0 --rdzv 127.0.0.1:$((port + 2)) -- true 2>&1 | grep -q 'no token; set TG_RDZV_TOKEN' \
    || no "a multi-node launch without a token"
fi

echo "== refusals"
"$tg" launch --nproc-per-node 0 -- true 2>&1 | grep -q 'from 1 to 1024' || no "--nproc-per-node 0 accepted"
"$tg" launch --nnodes 2 --node-rank 1 -- true 2>&1 | grep -q 'needs --rdzv HOST:PORT' || no "--nnodes 2 without --rdzv accepted"
"$tg" launch --nproc-per-node 1 2>&1 | grep -q 'no command to run' || no "a launch without a command accepted"
"$tg" launch --nproc-per-node 1 -- /nonexistent/cmd 2>&1 | grep -q 'exited with code 127' || no "a command that cannot run"

echo "== tg train refuses a strategy that does not fit how it was started"
src=$(cd "$(dirname "$0")/../.." && pwd)
cfg=$src/configs/fmnist_mlp.yaml
(cd "$work" && "$tg" train "$cfg" distributed.strategy=ddp 2>&1) | grep -q 'distributed.strategy=ddp in a single process that no launcher started: start the ranks with `tg launch' \
  || no "ddp in a single process accepted"
(cd "$work" && "$tg" launch --nproc-per-node 2 -- tg train "$cfg" 2>&1) | grep -q 'strategy=none, but this process is rank [01] of 2 started by tg launch' \
  || no "two ranks with strategy=none accepted"
(cd "$work" && OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 "$tg" train "$cfg" 2>&1) | grep -q 'rank 1 of 2 started by mpirun' \
  || no "strategy=none under mpirun accepted"
if ! "$tg" info 2>/dev/null | grep -q '^process-group backends:.* gloo'; then
  out=$(cd "$work" && timeout 60 "$tg" launch --nproc-per-node 2 -- tg train "$cfg" distributed.strategy=ddp 2>&1)
  rc=$?
  [ $rc -eq 1 ] || no "ddp on the CPU under tg launch without gloo returned $rc, not 1"
  echo "$out" | grep -q 'the gloo backend (CPU collectives without MPI) is not built yet' || no "no word that gloo is missing"
fi

[ $fail -eq 0 ] && echo "launch: all checks passed"
exit $fail
