#!/usr/bin/env bash
# scripts/build.sh: sets the machine up (scripts/setup.sh) and builds a fresh Release configure in
# build/ with warnings as errors. scripts/test.sh and scripts/run_main.sh start with it.
#
#   TG_SKIP_APT=1        skip the apt step of setup.sh
#   TG_CMAKE_ARGS="..."  extra arguments for the cmake configure step
#   TG_LLVM_DIR=DIR      the LLVM CMake package to use (default: LLVM 19, else 16, when installed)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

[[ -f CMakeLists.txt ]] || { echo "build.sh: error: no CMakeLists.txt in $PWD; nothing to build" >&2; exit 1; }

cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DTG_WERROR=ON)
# Debian can have several LLVMs side by side, and a bare find_package(LLVM) takes whichever it meets
# first (LLVM 15 on a stock Debian 12 dev machine): point it at the one setup.sh installed.
llvm_dir="${TG_LLVM_DIR:-}"
if [[ -z "$llvm_dir" ]]; then
  for v in 19 16; do
    if command -v "llvm-config-$v" >/dev/null 2>&1; then llvm_dir="$(llvm-config-$v --cmakedir)"; break; fi
  done
fi
[[ -n "$llvm_dir" ]] && cmake_args+=("-DLLVM_DIR=$llvm_dir")
read -r -a extra_cmake_args <<<"${TG_CMAKE_ARGS:-}"

cmake --fresh -S . -B build "${cmake_args[@]}" "${extra_cmake_args[@]}"
cmake --build build -j"$(nproc)"
