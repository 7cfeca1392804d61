#!/usr/bin/env bash
# scripts/run_main.sh: the main job. Sets the machine up, builds (as scripts/test.sh does), then trains
# an MLP on Fashion-MNIST on the CPU from /usr/share/datasets/fashion-mnist.
#
#   bash scripts/run_main.sh                    train with configs/fmnist_mlp.yaml
#   bash scripts/run_main.sh optim.lr=0.01      extra arguments go to the trainer (key=value overrides)
#
#   TG_SKIP_APT=1, TG_CMAKE_ARGS, TG_LLVM_DIR   as in scripts/test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/build.sh

if [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  echo "run_main.sh: error: Fashion-MNIST not in /usr/share/datasets/fashion-mnist" \
       "(install the Debian package dataset-fashion-mnist)" >&2
  exit 1
fi

exec build/launcher/tg train configs/fmnist_mlp.yaml "$@"
