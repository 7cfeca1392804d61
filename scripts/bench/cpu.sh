#!/usr/bin/env bash
# scripts/bench/cpu.sh: the CPU benchmark, the project beside PyTorch in one run on this machine.
# Installs PyTorch from Debian (python3-torch, with libopenblas0-pthread so it uses OpenBLAS),
# builds the project when build/ has no tg yet, runs `tg bench` and torch_cpu.py on the same
# workloads, alternating, ROUNDS times, prints the ratios (the median of each round's ratio, and
# their range) and writes them into docs/PERFORMANCE.md; then, when no workload is named, the
# bfloat16 section (scripts/bench/cpu_bf16.sh). On a machine shared with other work a single round
# misleads: a neighbour that takes a core during one side's run and not the other's moves that
# round's ratio by 2x; alternated rounds and their median do not.
#
#   bash scripts/bench/cpu.sh [--reps=N] [WORKLOAD ...]
#   ROUNDS=n        rounds of both sides (default 3)
#   TG_SKIP_APT=1   skip the apt step
#   TG_SKIP_BF16=1  skip the bfloat16 section
#   CPU_ISA=avx2    both sides as on an AVX2 machine: the project's kernels tiled and compiled
#                   for AVX2 (the knob), PyTorch's OpenBLAS on its Haswell kernels, oneDNN and
#                   ATen capped at AVX2 (their own switches); sse2 likewise
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
rounds="${ROUNDS:-3}"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "cpu.sh: ROUNDS must be a positive whole number, got '$rounds'" >&2; exit 2; }

if [[ -z "${TG_SKIP_APT:-}" ]]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch libopenblas0-pthread
fi
[[ -x build/launcher/tg ]] || bash scripts/build.sh

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
source scripts/bench/torch_cpu_env.sh
# PyTorch restricted to the ISA the project's kernels are restricted to: an AVX2 machine
# emulated on an AVX-512 one has no AVX-512 in either side
case "${CPU_ISA:-native}" in
  avx2) torch_cpu_env+=(OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2) ;;
  sse2) torch_cpu_env+=(OPENBLAS_CORETYPE=Nehalem ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 DNNL_MAX_CPU_ISA=SSE41) ;;
esac
for ((round = 1; round <= rounds; round++)); do
  echo "== round $round of $rounds"
  build/launcher/tg bench "$@" | tee -a "$out/tg.jsonl"
  run_torch_cpu "$@" | tee -a "$out/torch.jsonl"
done
# the machine, with the ISA its kernels were compiled for (CPU_ISA restricts it)
isa="$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || (grep -qw avx2 /proc/cpuinfo && echo AVX2 || echo SSE2))"
# and LLVM's name for the core (a model name such as "AMD EPYC" says neither Zen 4 nor Zen 5)
core="$(build/launcher/tg info | sed -n 's/^  CPU: CPU (llvm-[0-9.]*-\([a-z0-9_-]*\)-[0-9a-f]* .*/\1/p')"
machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)${core:+ ($core)}, $isa${CPU_ISA:+, CPU_ISA=$CPU_ISA}), $(date -u +%Y-%m-%d)"
machine="$machine; PyTorch with ${torch_cpu_env[*]}"
/usr/bin/python3 scripts/bench/report.py "$out/tg.jsonl" "$out/torch.jsonl" docs/PERFORMANCE.md \
  "${ROUNDS:+ROUNDS=$ROUNDS }bash scripts/bench/cpu.sh $*" "$machine"
# the bfloat16 section, with the same repetitions, when no workload was named
named=0
for a in "$@"; do [[ "$a" == --* ]] || named=1; done
if [[ -z "${TG_SKIP_BF16:-}" && "$named" == 0 ]]; then
  bash scripts/bench/cpu_bf16.sh "$@"
fi
