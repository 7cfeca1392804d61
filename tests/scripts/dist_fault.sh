#!/bin/bash
# Runs one fault of rank 1 (tests/dist_faults.cpp) under mpirun and checks that the job ends:
# mpirun returns non-zero within MAX_S seconds of the fault, no rank process is left running,
# and the output matches EXPECT (an extended regex naming rank 1).
# Usage: dist_fault.sh MPIEXEC DIST_FAULTS NP MODE WHERE TIMEOUT_S MAX_S EXPECT
set -u
mpiexec=$1 prog=$2 np=$3 mode=$4 where=$5 timeout_s=$6 max_s=$7 expect=$8
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$mpiexec" --oversubscribe -np "$np" "$prog" "$mode" "$where" "$timeout_s" >"$out" 2>&1 &
job=$!
hard_limit=$(awk -v t="$timeout_s" 'BEGIN { print t + 30 }')
start=$(date +%s.%N)
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
while kill -0 "$job" 2>/dev/null && awk -v e="$(elapsed "$start")" -v l="$hard_limit" 'BEGIN { exit !(e < l) }'; do sleep 0.05; done
ended=$(date +%s.%N)
if kill -0 "$job" 2>/dev/null; then
  echo "FAIL: mpirun still running ${hard_limit} s after its start"
  for pid in $(sed -n 's/^rank [0-9]* pid \([0-9]*\)$/\1/p' "$out"); do kill -KILL "$pid" 2>/dev/null; done
  kill -KILL "$job"
  cat "$out"
  exit 1
fi
wait "$job"
rc=$?
cat "$out"
fault_at=$(sed -n 's/^rank 1 faults ([a-z-]*) at \([0-9.]*\)$/\1/p' "$out")
[ -n "$fault_at" ] || { echo "FAIL: rank 1 never reached its fault"; exit 1; }
after=$(awk -v a="$fault_at" -v b="$ended" 'BEGIN { printf "%.2f", b - a }')
alive=""
for pid in $(sed -n 's/^rank [0-9]* pid \([0-9]*\)$/\1/p' "$out"); do
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ] && alive="$alive $pid"
done
echo "dist_fault: mode $mode ($where), mpirun returned $rc ${after} s after the fault"
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: mpirun returned 0"; fail=1; }
awk -v a="$after" -v m="$max_s" 'BEGIN { exit !(a <= m) }' || { echo "FAIL: the job ended ${after} s after the fault (limit ${max_s} s)"; fail=1; }
[ -z "$alive" ] || { echo "FAIL: rank processes still running:$alive"; for pid in $alive; do kill -KILL "$pid"; done; fail=1; }
grep -Eq "$expect" "$out" || { echo "FAIL: no line matches: $expect"; fail=1; }
[ "$fail" -eq 0 ] && echo "dist_fault: PASS"
exit "$fail"
