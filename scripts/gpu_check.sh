#!/usr/bin/env bash
# scripts/gpu_check.sh: on a machine with an NVIDIA GPU, builds everything (without LLVM), runs every
# test labelled gpu (the CUDA suites, the backend suites' _cuda variants, the nccl suites under mpirun,
# NCCL between the GPUs of the process: test_multi_cuda_1gpu, and test_multi_cuda with 2+ GPUs;
# copies within a GPU and peer copies between GPUs, alone and in CUDA graphs: test_peer_copy_cuda_1gpu,
# and test_peer_copy_cuda with 2+ GPUs),
# trains configs/fmnist_mlp.yaml on CUDA and on the CPU, and trains the CNN data-parallel over NCCL at
# world size 1 (ddp and zero1 under mpirun: replayed CUDA graphs with the NCCL work inside; ddp under
# tg launch, NCCL bootstrapped through the rendezvous store; parameters against the run without
# DDP). Logs go to $OUT (default: gpu_check_out/).
#
#   OUT=dir bash scripts/gpu_check.sh
#   TG_DATA=dir   Fashion-MNIST IDX .gz files when /usr/share/datasets/fashion-mnist is missing
#   GPU_TESTS=re  only the gpu tests whose names match (ctest -R), for a short check when device
#                 time is scarce; the summary says so, and only a full run stands for the whole
#   CC, CXX       compilers for the build
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTG_WITH_LLVM=OFF > "$OUT/build.log" 2>&1 || { log "configure failed"; tail -20 "$OUT/build.log"; exit 1; }
grep "tinygrad++:" "$OUT/build.log" | tee -a "$OUT/summary.txt"
t0=$SECONDS
cmake --build build -j"$(nproc)" >> "$OUT/build.log" 2>&1 || { log "build failed"; grep -B2 -A8 "error" "$OUT/build.log" | head -60; exit 1; }
log "build: $((SECONDS - t0)) s"
build/launcher/tg info 2>&1 | grep -E -A1 "^  CUDA|^NCCL|^process-group" | tee -a "$OUT/summary.txt"
build/launcher/tg info 2>&1 | grep -E -A2 "^collectives between" | tee -a "$OUT/summary.txt"
build/launcher/tg info 2>&1 | grep -E "^copies between|^  (CPU|CUDA)(:[0-9]+)? -> " | tee -a "$OUT/summary.txt"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
t0=$SECONDS
ctest --test-dir build -L gpu ${GPU_TESTS:+-R "$GPU_TESTS"} -j4 --timeout 300 --output-on-failure > "$OUT/ctest_gpu.log" 2>&1
log "gpu tests${GPU_TESTS:+ matching '$GPU_TESTS' only}: rc $? in $((SECONDS - t0)) s"
grep -E "tests passed|tests failed|Test +#|\*\*\*" "$OUT/ctest_gpu.log" | tee -a "$OUT/summary.txt"

data=/usr/share/datasets/fashion-mnist
[[ -f $data/train-images-idx3-ubyte.gz ]] || data="${TG_DATA:-$PWD/fmnist}"
log "data: $data"
for dev in CUDA CPU; do
  t0=$SECONDS
  DEVICE=$dev timeout 240 build/launcher/tg train configs/fmnist_mlp.yaml data.root="$data" \
    train.run_dir=/tmp/tg_runs/$dev train.overwrite=true > "$OUT/train_$dev.log" 2>&1
  log "train $dev: rc $? in $((SECONDS - t0)) s"
  grep -iE "acc|error" "$OUT/train_$dev.log" | tail -4 | tee -a "$OUT/summary.txt"
done
# a few steps at DEBUG=2: per-kernel GPU time and memory
DEVICE=CUDA DEBUG=2 timeout 60 build/launcher/tg train configs/fmnist_mlp.yaml data.root="$data" train.steps=2 \
  train.run_dir=/tmp/tg_runs/debug train.overwrite=true > "$OUT/debug2.log" 2>&1
log "DEBUG=2 run: rc $?"
grep "\*\*\* CUDA" "$OUT/debug2.log" | tail -8 | tee -a "$OUT/summary.txt"

# Data parallel over NCCL at world size 1: DEBUG=1 shows the replayed graphs with their collectives;
# the parameters after 30 steps against the run without DDP (float32, within 1e-6 relative).
runs=/tmp/tg_runs
common=(configs/fmnist_cnn.yaml device=CUDA data.root="$data" train.steps=30 train.overwrite=true)
timeout 240 build/launcher/tg train "${common[@]}" train.run_dir=$runs/plain > "$OUT/cnn_plain.log" 2>&1
log "cnn plain: rc $?"
# The parameters of run $1 after 30 steps against the plain run's.
compare_to_plain() {
  python3 - "$runs/plain/checkpoints/step_30.safetensors" "$runs/$1/checkpoints/step_30.safetensors" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
keys = [k for k in a if k.startswith("model.")]
worst = max(float(abs(a[k] - b[k]).max() / (abs(a[k]).max() + 1e-12)) for k in keys)
print(f"  {len(keys)} parameters, max relative difference to the run without DDP: {worst:.3g}")
PY
}
for s in ddp zero1; do
  DEBUG=1 timeout 240 mpirun -np 1 -x DEBUG -x NCCL_NVLS_ENABLE build/launcher/tg train "${common[@]}" \
    distributed.strategy=$s train.run_dir=$runs/$s > "$OUT/cnn_$s.log" 2>&1
  log "cnn $s over nccl: rc $?"
  grep -E "graph of [0-9]+ kernels and [0-9]+ collectives|jit train_step: captured|error" "$OUT/cnn_$s.log" | sort | uniq -c | head -6 | tee -a "$OUT/summary.txt"
  compare_to_plain $s
done
# Under tg launch (no MPI) NCCL's unique id goes through the rendezvous store.
timeout 240 build/launcher/tg launch --nproc-per-node 1 -- build/launcher/tg train "${common[@]}" \
  distributed.strategy=ddp train.run_dir=$runs/launch > "$OUT/cnn_launch.log" 2>&1
log "cnn ddp under tg launch (nccl bootstrapped through the store): rc $?"
grep -iE "error|nccl" "$OUT/cnn_launch.log" | head -4 | tee -a "$OUT/summary.txt"
compare_to_plain launch
