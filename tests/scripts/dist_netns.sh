#!/usr/bin/env bash
# Multi-node data parallel across two network namespaces joined by a veth pair (10.77.0.1/24 and
# 10.77.0.2/24, private addresses created here and removed afterwards): mpirun starts inside the
# first namespace and reaches the second through an rsh agent that runs the command under
# `ip netns exec`; Open MPI talks TCP over the veth only. Trains a few ddp steps of tg train.
# Exits 77 (CTest: skipped) with a message where namespaces cannot be made (not root, no ip).
#
#   dist_netns.sh TG_BINARY SOURCE_DIR
set -euo pipefail
tg="$1"; src="$2"
skip() { echo "dist_netns: skipped: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
command -v mpirun >/dev/null || skip "no mpirun"

source "$(dirname "$0")/netns_pair.sh"
netns_pair "tg$$" 10.77.0

# The rsh agent: "agent HOST COMMAND..." runs COMMAND in HOST's namespace.
cat >"$work/agent" <<AGENT
#!/bin/sh
host="\$1"; shift
case "\$host" in
  10.77.0.1) ns="$nsa" ;;
  10.77.0.2) ns="$nsb" ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
echo "\$host" >>"$work/agent.log"
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$work/agent"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' >"$work/hosts"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ip netns exec "$nsa" mpirun --allow-run-as-root -np 2 --hostfile "$work/hosts" \
  --mca plm_rsh_agent "$work/agent" --mca btl tcp,self \
  --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
  -x CACHEDIR -x PATH \
  "$tg" train "$src/configs/fmnist_mlp.yaml" distributed.strategy=ddp model.hidden=[32] data.batch_size=32 \
  train.steps=4 train.log_every=2 train.eval_every=1000 data.eval_batch_size=5000 train.run_dir="$work/run" \
  distributed.timeout_s=120
grep '"type":"train"' "$work/run/metrics.jsonl" | grep -q '"step":4,' || { echo "dist_netns: no step-4 record in metrics.jsonl" >&2; exit 1; }
grep -q '^10.77.0.2$' "$work/agent.log" || { echo "dist_netns: the agent never started a rank in $nsb" >&2; exit 1; }
echo "dist_netns: 2 ranks in 2 network namespaces trained 4 steps over TCP"
