#!/usr/bin/env bash
# scripts/fuzz.sh: builds the libFuzzer targets with clang and runs each for a while from its
# checked-in seed corpus. CTest runs it for 15 s a target (test fuzz_parsers, label `fuzz`); run it
# by hand for longer.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]    SECONDS per target (default 60); TARGETs by
#                                                 NAME (default: every tests/fuzz/fuzz_*.cpp)
#   TG_FUZZ_BUILD_DIR=DIR   the clang build (default: build-fuzz at the repository root)
#   TG_FUZZ_JOBS=N          build jobs (default: all cores)
#   TG_FUZZ_ARGS="..."      extra libFuzzer flags for every target (e.g. -jobs=4 -workers=4)
#
# Layout (Note [fuzz build] in CMakeLists.txt):
#   tests/fuzz/fuzz_NAME.cpp      a target: defines LLVMFuzzerTestOneInput; tg::Error is a valid
#                                 outcome, anything else (other exceptions, crashes, ASan) a finding
#   tests/fuzz/corpus/NAME/       its seed corpus: a few small files, checked in, never written to
#   tests/fuzz/CMakeLists.txt     one line per target: tg_fuzz(NAME LIBS <libraries> [SOURCES ...]
#                                 INSTRUMENT <the parser's sources>)
#   tests/fuzz/fuzz_input.h       InputFile: the input as a scratch file, for readers that take a path
# Adding a target is those three things; this script finds it by its file name. The build
# configures the top-level CMakeLists.txt with -DTG_FUZZ=ON and clang, which adds tinygrad/ (with
# tinygrad_nn) and tests/fuzz/ only; the targets and their INSTRUMENT sources carry
# AddressSanitizer and libFuzzer's coverage, the rest is compiled plainly at -O0.
#
# Each run starts from a fresh copy of the seed corpus in DIR/corpus/NAME; a finding is kept in
# DIR/findings/NAME/ and the script prints how to replay it. Exit status: 0 when every target
# ran clean, 1 on a finding or a build failure, 77 when clang or libFuzzer is missing here (CTest
# reports the test as skipped).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_PER_TARGET="${1:-60}"
[[ $# -gt 0 ]] && shift
BUILD="${TG_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${TG_FUZZ_JOBS:-$(nproc)}"

say() { echo "fuzz: $*"; }
skip() { echo "fuzz: SKIPPED: $*" >&2; exit 77; }

[[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ && "$SECONDS_PER_TARGET" -gt 0 ]] ||
  { echo "fuzz: error: SECONDS must be a positive integer, got '$SECONDS_PER_TARGET'" >&2; exit 2; }

TARGETS=("$@")
if ((${#TARGETS[@]} == 0)); then
  for f in "$ROOT"/tests/fuzz/fuzz_*.cpp; do
    n="$(basename "$f" .cpp)"
    TARGETS+=("${n#fuzz_}")
  done
fi
for t in "${TARGETS[@]}"; do
  [[ -f "$ROOT/tests/fuzz/fuzz_$t.cpp" ]] || { echo "fuzz: error: no target '$t' (tests/fuzz/fuzz_$t.cpp)" >&2; exit 2; }
  [[ -d "$ROOT/tests/fuzz/corpus/$t" ]] || { echo "fuzz: error: target '$t' has no seed corpus tests/fuzz/corpus/$t/" >&2; exit 2; }
done

# clang with libFuzzer (Debian 12: packages clang and libclang-rt-14-dev; scripts/setup.sh).
command -v clang >/dev/null 2>&1 && command -v clang++ >/dev/null 2>&1 ||
  skip "clang/clang++ not found (install clang and libclang-rt-14-dev, or run scripts/setup.sh)"
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe_dir/p.cpp"
clang++ -fsanitize=fuzzer,address "$probe_dir/p.cpp" -o "$probe_dir/p" >"$probe_dir/log" 2>&1 ||
  skip "clang++ cannot link a libFuzzer target (install libclang-rt-14-dev, or run scripts/setup.sh): $(head -n 3 "$probe_dir/log")"

GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  say "configuring a clang build in $BUILD"
  mkdir -p "$BUILD"
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O0 -DCMAKE_C_FLAGS=-O0 \
    -DTG_FUZZ=ON -DTG_WITH_LLVM=OFF -DTG_WITH_CUDA=OFF -DTG_BUILD_TESTS=OFF >"$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log" >&2; echo "fuzz: error: configuring $BUILD failed" >&2; exit 1; }
fi
BINS=()
for t in "${TARGETS[@]}"; do BINS+=("fuzz_$t"); done
say "building ${BINS[*]} ($JOBS jobs)"
t0=$(date +%s)
cmake --build "$BUILD" -j "$JOBS" --target "${BINS[@]}"
say "built in $(($(date +%s) - t0)) s"

# AddressSanitizer: a finding aborts with a report; leaks count as findings too.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}"
read -r -a EXTRA <<<"${TG_FUZZ_ARGS:-}"
failed=()
summary=()
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$t" findings="$BUILD/findings/$t" log="$BUILD/fuzz_$t.log"
  rm -rf "$corpus"
  mkdir -p "$corpus" "$findings"
  cp "$ROOT"/tests/fuzz/corpus/"$t"/* "$corpus"/
  say "running fuzz_$t for ${SECONDS_PER_TARGET} s from $(ls "$corpus" | wc -l) seeds"
  # -timeout: an input that takes longer than 10 s is a finding (a hang); -rss_limit_mb: so is
  # one that makes the reader take more than 2 GB.
  if "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$findings/" "${EXTRA[@]}" "$corpus" >"$log" 2>&1; then
    runs="$(awk '/stat::number_of_executed_units:/ {print $2}' "$log" | tail -n 1)"
    cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)"
    summary+=("fuzz_$t: ${runs:-?} executions in ${SECONDS_PER_TARGET} s, ${cov:-cov: ?}, corpus $(ls "$corpus" | wc -l) files, no finding")
  else
    tail -n 60 "$log" >&2
    found="$(ls -t "$findings" 2>/dev/null | head -n 1 || true)"
    summary+=("fuzz_$t: FINDING ${found:+$findings/$found} (replay: $BUILD/tests/fuzz/fuzz_$t ${found:+$findings/$found}; log $log)")
    failed+=("$t")
  fi
done
for line in "${summary[@]}"; do say "$line"; done
if ((${#failed[@]})); then
  echo "fuzz: error: findings in ${failed[*]}" >&2
  exit 1
fi
