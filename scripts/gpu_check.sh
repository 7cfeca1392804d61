#!/usr/bin/env bash
# scripts/gpu_check.sh: on a machine with an NVIDIA GPU, builds the CUDA device and what it needs,
# runs the gpu tests on CUDA (test_cuda, test_matmul_lib and the backend suites' _cuda variants), then trains
# configs/fmnist_mlp.yaml on CUDA and on the CPU. Logs go to $OUT (default: gpu_check_out/).
#
#   OUT=dir bash scripts/gpu_check.sh
#   TG_DATA=dir   Fashion-MNIST IDX .gz files when /usr/share/datasets/fashion-mnist is missing
#   CC, CXX       compilers for the build
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTG_WITH_LLVM=OFF > "$OUT/build.log" 2>&1 || { log "configure failed"; tail -20 "$OUT/build.log"; exit 1; }
grep "tinygrad++:" "$OUT/build.log" | tee -a "$OUT/summary.txt"
targets=(tg test_cuda test_matmul_lib test_tensor test_ops test_ops_reduce test_ops_movement test_ops_nn)
t0=$SECONDS
cmake --build build -j"$(nproc)" --target "${targets[@]}" >> "$OUT/build.log" 2>&1 || { log "build failed"; grep -B2 -A8 "error" "$OUT/build.log" | head -60; exit 1; }
log "build: $((SECONDS - t0)) s"
build/launcher/tg info 2>&1 | grep -A1 "^  CUDA" | tee -a "$OUT/summary.txt"

t0=$SECONDS
ctest --test-dir build -R '^test_cuda$|^test_matmul_lib$|_cuda$' -j4 --timeout 300 --output-on-failure > "$OUT/ctest_gpu.log" 2>&1
log "gpu tests: rc $? in $((SECONDS - t0)) s"
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
