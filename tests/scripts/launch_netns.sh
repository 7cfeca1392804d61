#!/usr/bin/env bash
# `tg launch --nnodes 2` across two network namespaces joined by a veth pair (10.77.1.1/24 and
# 10.77.1.2/24, private addresses created here and removed afterwards): node 0's launcher serves
# the rendezvous store on 10.77.1.1 alone (checked from the namespace's /proc/net/tcp), node 1's
# registers through it, and the two ranks train a few ddp steps of tg train over gloo.
# Exits 77 (CTest: skipped) with a message where namespaces cannot be made (not root, no ip) or
# the build has no gloo backend.
#
#   launch_netns.sh TG_BINARY SOURCE_DIR
set -euo pipefail
tg="$(realpath "$1")"; src="$2"
skip() { echo "launch_netns: skipped: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
"$tg" info | grep -q '^process-group backends:.* gloo' || skip "no gloo backend"
[ -d /usr/share/datasets/fashion-mnist ] || skip "no Fashion-MNIST"

source "$(dirname "$0")/netns_pair.sh"
netns_pair "tl$$" 10.77.1

export TG_RDZV_TOKEN="netns-$$-$RANDOM"
port=29517
node() {  # NAMESPACE NODE_RANK
  ip netns exec "$1" "$tg" launch --nnodes 2 --node-rank "$2" --rdzv "10.77.1.1:$port" --nproc-per-node 1 \
    --rdzv-timeout-s 60 -- tg train "$src/configs/fmnist_mlp.yaml" distributed.strategy=ddp model.hidden=[32] \
    data.batch_size=32 train.steps=4 train.log_every=2 train.eval_every=1000 data.eval_batch_size=5000 \
    train.run_dir="$work/run" distributed.timeout_s=60
}
node "$nsb" 1 >"$work/node1.out" 2>&1 &
node1=$!
node "$nsa" 0 >"$work/node0.out" 2>&1 &
node0=$!
listening=""
for _ in $(seq 100); do  # the store's socket, from inside node 0's namespace (LISTEN = 0A)
  listening=$(ip netns exec "$nsa" awk -v p=":$(printf '%04X' $port)" '$4 == "0A" && substr($2, 9) == p { print $2 }' /proc/net/tcp)
  [ -n "$listening" ] && break
  sleep 0.05
done
rc0=0; rc1=0
wait "$node0" || rc0=$?
wait "$node1" || rc1=$?
cat "$work/node0.out" "$work/node1.out"
fail=0
[ "$rc0 $rc1" = "0 0" ] || { echo "launch_netns: the launchers returned $rc0 and $rc1"; fail=1; }
# 10.77.1.1 as /proc/net/tcp writes it: 0101 4D0A (little-endian)
[ "$listening" = "01014D0A:$(printf '%04X' $port)" ] || { echo "launch_netns: the store listened on '$listening', not on 10.77.1.1 alone"; fail=1; }
grep '"type":"train"' "$work/run/metrics.jsonl" | grep -q '"step":4,' || { echo "launch_netns: no step-4 record in metrics.jsonl"; fail=1; }
[ $fail -eq 0 ] && echo "launch_netns: 2 nodes in 2 network namespaces trained 4 steps over gloo, the store on 10.77.1.1 alone"
exit $fail
