#!/usr/bin/env bash
# `srun tg train` on a one-node Slurm that this test starts (slurmctld and slurmd from Debian's
# slurm-wlm packages, auth/none, a configuration of its own in a temporary directory, ports of
# its own): two tasks train 20 ddp steps of Fashion-MNIST, their ranks from SLURM_PROCID /
# SLURM_NTASKS / SLURM_LOCALID and the store served by rank 0 at the first node of the node list,
# and end with the parameters of the same run under `tg launch` within 1e-5. Both daemons are
# stopped afterwards. Exits 77 (skipped) with the reason where Slurm cannot start here (not root,
# no slurmctld/slurmd, a host name that does not resolve, daemons that do not come up) or where
# Fashion-MNIST or the gloo backend is missing.
#
#   slurm.sh TG_BINARY SOURCE_DIR
set -u
tg="$(realpath "$1")"; src="$2"
skip() { echo "slurm: skipped: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root to run slurmd"
for b in slurmctld slurmd srun sinfo; do command -v "$b" >/dev/null || skip "no $b (install slurmctld slurmd slurm-client)"; done
"$tg" info | grep -q '^process-group backends:.* gloo' || skip "no gloo backend"
[ -d /usr/share/datasets/fashion-mnist ] || skip "no Fashion-MNIST"
host=$(hostname -s)
getent hosts "$host" >/dev/null || skip "this host's name '$host' does not resolve"

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done; kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/state" "$work/spool"
base=$((26000 + RANDOM % 2000 * 2))
cat >"$work/slurm.conf" <<EOF
ClusterName=tgtest$$
SlurmctldHost=$host
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldPort=$base
SlurmdPort=$((base + 1))
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=tg Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$work/slurm.conf
slurmctld -D -i >"$work/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >"$work/slurmd.out" 2>&1 &
pids+=($!)
up=""
for _ in $(seq 100); do sinfo -h -o %t 2>/dev/null | grep -q idle && { up=1; break; }; sleep 0.1; done
[ -n "$up" ] || { tail -n 5 "$work"/*.log "$work"/*.out 2>/dev/null; skip "slurmctld/slurmd did not come up within 10 s"; }

cd "$work" || exit 1
fail=0
TRAIN=(train "$src/configs/fmnist_mlp.yaml" distributed.strategy=ddp train.steps=20)
export TG_RDZV_TOKEN="slurm-$$-$RANDOM"
# the store's port from the config (distributed.rdzv_port, before TG_RDZV_PORT and MASTER_PORT: the
# invalid MASTER_PORT would fail the run if it were read)
MASTER_PORT=0 timeout 120 srun -n 2 "$tg" "${TRAIN[@]}" train.run_dir="$work/srun" distributed.rdzv_port=$((base + 2)) \
  >srun.out 2>&1
rc=$?
tail -n 3 srun.out
[ $rc -eq 0 ] || { cat srun.out; echo "FAIL: srun returned $rc"; fail=1; }
"$tg" launch --nproc-per-node 2 -- tg "${TRAIN[@]}" train.run_dir="$work/launch" >launch.out 2>&1 || { cat launch.out; echo "FAIL: tg launch failed"; fail=1; }
python3 "$src/tests/scripts/compare_checkpoints.py" "$work/srun/checkpoints/step_20.safetensors" \
  "$work/launch/checkpoints/step_20.safetensors" 1e-5 || { echo "FAIL: srun and tg launch end with different parameters"; fail=1; }
[ $fail -eq 0 ] && echo "slurm: srun -n 2 tg train (ranks from Slurm, the store at $host) equals tg launch"
exit $fail
