#!/bin/bash
# `cmake --install` and the out-of-tree example (examples/out_of_tree): installs the build into a
# temporary prefix, then
#   (a) configures and builds the example with find_package(tinygradpp) against that prefix and
#       runs it (it trains a registered model on a registered dataset and checks its accuracy);
#   (b) compiles the same source with `pkg-config --cflags --libs tinygradpp` alone and runs it;
#   (c) runs the installed `tg --version`, and checks that the headers the runtime keeps to
#       itself (they include the CUDA toolkit's) were not installed.
# Usage: install.sh BUILD_DIR SOURCE_DIR CXX [COMPILER_LAUNCHER]
set -u
build=$(realpath "$1") src=$(realpath "$2") cxx=$3 launcher=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
no() { echo "FAIL: $*"; fail=1; }
prefix=$work/prefix

echo "== cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.out" 2>&1 || { cat "$work/install.out"; echo "FAIL: cmake --install"; exit 1; }
[ -f "$prefix/include/tinygradpp/tinygrad/tensor.h" ] || no "include/tinygradpp/tinygrad/tensor.h was not installed"
[ -e "$prefix/include/tinygradpp/tinygrad/runtime/cuda_api.h" ] && no "the runtime's own cuda_api.h was installed"
pcdir=$(dirname "$(find "$prefix" -name tinygradpp.pc | head -n 1)")
[ -f "$pcdir/tinygradpp.pc" ] || no "no tinygradpp.pc under $prefix"
[ -n "$(find "$prefix" -name tinygradppConfig.cmake)" ] || no "no tinygradppConfig.cmake under $prefix"

echo "== (a) find_package(tinygradpp)"
cmake_args=(-S "$src/examples/out_of_tree" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
            -DCMAKE_CXX_COMPILER="$cxx")
command -v ninja > /dev/null && cmake_args+=(-G Ninja)
[ -n "$launcher" ] && cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
if cmake "${cmake_args[@]}" > "$work/configure.out" 2>&1 && cmake --build "$work/build" > "$work/build.out" 2>&1; then
  "$work/build/xor_train" "$work/run_cmake" train.progress=off || no "the example built with CMake failed"
  [ -f "$work/run_cmake/metrics.jsonl" ] || no "the example's run wrote no metrics.jsonl"
else
  cat "$work/configure.out" "$work/build.out" 2>/dev/null | tail -n 40
  no "the example does not configure or build against the installed package"
fi

echo "== (b) pkg-config --cflags --libs tinygradpp"
if ! command -v pkg-config > /dev/null; then
  no "pkg-config is not installed"
else
  flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs tinygradpp) || no "pkg-config does not read tinygradpp.pc"
  echo "pkg-config: $flags"
  # shellcheck disable=SC2086  # the flags are words
  if $launcher "$cxx" -O1 "$src/examples/out_of_tree/xor_train.cpp" -o "$work/xor_pc" $flags > "$work/pc.out" 2>&1; then
    "$work/xor_pc" "$work/run_pc" train.progress=off || no "the example built with pkg-config failed"
  else
    tail -n 40 "$work/pc.out"
    no "the example does not compile and link with pkg-config's flags"
  fi
fi

echo "== (c) the installed tg"
"$prefix/bin/tg" --version || no "the installed tg --version failed"

[ "$fail" = 0 ] && echo "install: all passed"
exit "$fail"
