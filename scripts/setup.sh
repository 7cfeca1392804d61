#!/usr/bin/env bash
# scripts/setup.sh: installs the system packages tinygrad++ needs to build, test and train.
#
# Target: a fresh Debian 12 machine, run as root (falls back to sudo when not root). Also tolerates
# Ubuntu 24.04 and other apt systems: an optional package the apt sources don't have is skipped
# with a message; a missing required one is an error. Safe to run any number of times.
#
#   TG_SKIP_APT=1   skip the apt step entirely (only print what is there)
set -euo pipefail

# What the build cannot do without.
# libcli11-dev: CLI11, header-only, parses the tg command's arguments (Debian 12: 2.1, Ubuntu 24.04: 2.4).
# libspdlog-dev: spdlog (with libfmt-dev), the launcher's log lines (stderr with rank prefixes, train.log).
REQUIRED=(build-essential cmake ninja-build pkg-config git python3
          libgtest-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev libcli11-dev libspdlog-dev)
# Features that switch off (or tests that skip) when absent. libgmock-dev: GoogleMock, next to GoogleTest.
# clang and libclang-rt-14-dev (libFuzzer): the fuzz targets (scripts/fuzz.sh). jargon-text: the
# Jargon File 4.4.7 (public domain, 1.7 MB of English as gzipped UTF-8 text), the default text of
# the `text` dataset (character-level language models). libpcre2-dev: GPT-2 BPE's split of text
# (`tg tokenize --bpe=DIR`). libboost-dev (Asio) and libssl-dev (libcrypto's HMAC): the
# rendezvous store of `tg launch`; libgloo-dev: the gloo backend (CPU collectives without MPI,
# under `tg launch` or srun); slurmctld, slurmd and slurm-client: the test that starts a one-node
# Slurm (test_slurm). libcairo2-dev: `tg plot` (PNG and SVG pictures of runs' metrics; test_plot).
OPTIONAL=(libgmock-dev
          libopenmpi-dev openmpi-bin iproute2
          ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
          libboost-dev libssl-dev libgloo-dev slurmctld slurmd slurm-client
          clang libclang-rt-14-dev
          dataset-fashion-mnist jargon-text
          libpcre2-dev libcairo2-dev)
# First one the apt sources have wins. LLVM is optional: without it the CPU backend uses the C compiler.
LLVM_CHOICES=(llvm-19-dev llvm-16-dev)
# Debian's llvm-19-dev CMake package calls find_package(zstd) and fails without it, yet doesn't depend on it.
LLVM_EXTRAS=(libzstd-dev)

FMNIST_DIR=/usr/share/datasets/fashion-mnist
TEXT_FILE=/usr/share/doc/jargon-text/jargon.txt.gz

say()  { echo "setup: $*"; }
warn() { echo "setup: warning: $*" >&2; }
die()  { echo "setup: error: $*" >&2; exit 1; }

is_installed() { [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" == installed ]]; }
has_candidate() {
  local c
  c="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2; exit}')"
  [[ -n "$c" && "$c" != "(none)" ]]
}

LOG=""
cleanup() { [[ -n "$LOG" ]] && rm -f "$LOG"; return 0; }
trap cleanup EXIT

# Runs apt-get quietly; its full output is shown only when it fails.
apt_quiet() {
  if ! "${SUDO[@]}" apt-get -qq -y -o DPkg::Lock::Timeout=300 "$@" >"$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    return 1
  fi
}

apt_step() {
  SUDO=()
  if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "not root and no sudo; run as root (or set TG_SKIP_APT=1)"
    SUDO=(sudo -E)
  fi
  export DEBIAN_FRONTEND=noninteractive
  LOG="$(mktemp)"

  say "apt-get update"
  apt_quiet update || warn "apt-get update failed; going on with the package lists already here"

  local required=() optional=() missing_required=() p
  for p in "${REQUIRED[@]}"; do
    if is_installed "$p" || has_candidate "$p"; then required+=("$p"); else missing_required+=("$p"); fi
  done
  ((${#missing_required[@]} == 0)) ||
    die "required packages not in the apt sources: ${missing_required[*]}"

  for p in "${OPTIONAL[@]}"; do
    if is_installed "$p" || has_candidate "$p"; then optional+=("$p")
    else say "skipping optional $p: not in the apt sources"; fi
  done
  local llvm=""
  for p in "${LLVM_CHOICES[@]}"; do
    if is_installed "$p" || has_candidate "$p"; then llvm="$p"; break; fi
  done
  if [[ -n "$llvm" ]]; then
    optional+=("$llvm")
    for p in "${LLVM_EXTRAS[@]}"; do
      if is_installed "$p" || has_candidate "$p"; then optional+=("$p"); else say "skipping optional $p: not in the apt sources"; fi
    done
  else say "skipping optional LLVM: none of ${LLVM_CHOICES[*]} in the apt sources (CPU backend will use the C compiler)"; fi

  local todo=()
  for p in "${required[@]}" "${optional[@]}"; do is_installed "$p" || todo+=("$p"); done
  if ((${#todo[@]} == 0)); then
    say "all $((${#required[@]} + ${#optional[@]})) packages already installed"
    return 0
  fi
  say "installing: ${todo[*]}"

  local todo_required=()
  for p in "${required[@]}"; do is_installed "$p" || todo_required+=("$p"); done
  if ((${#todo_required[@]})); then
    apt_quiet install --no-install-recommends "${todo_required[@]}" ||
      die "could not install required packages: ${todo_required[*]}"
  fi
  local todo_optional=()
  for p in "${optional[@]}"; do is_installed "$p" || todo_optional+=("$p"); done
  if ((${#todo_optional[@]})) && ! apt_quiet install --no-install-recommends "${todo_optional[@]}"; then
    # One bad optional package must not keep the others out: try them one by one.
    for p in "${todo_optional[@]}"; do
      is_installed "$p" || apt_quiet install --no-install-recommends "$p" ||
        warn "could not install optional $p; going on without it"
    done
  fi
}

summary() {
  local v d
  for v in c++ cmake ninja; do
    command -v "$v" >/dev/null 2>&1 || warn "$v not found"
  done
  v="none (CPU backend uses the C compiler)"
  for d in 19 16; do
    if command -v "llvm-config-$d" >/dev/null 2>&1; then
      v="$(llvm-config-$d --version) at $(llvm-config-$d --cmakedir)"; break
    fi
  done
  say "LLVM: $v"
  if command -v mpirun >/dev/null 2>&1; then
    say "MPI: $(mpirun --version 2>/dev/null | head -n 1)"
  else
    say "MPI: none (distributed tests skip)"
  fi
  if compgen -G "/etc/OpenCL/vendors/*.icd" >/dev/null; then
    say "OpenCL ICDs: $(cd /etc/OpenCL/vendors && echo *.icd)"
  else
    say "OpenCL: no ICD installed"
  fi
  if [[ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]]; then
    say "Fashion-MNIST: $FMNIST_DIR"
  else
    warn "Fashion-MNIST not found in $FMNIST_DIR (package dataset-fashion-mnist)"
  fi
  if [[ -f "$TEXT_FILE" ]]; then
    say "text dataset: $TEXT_FILE"
  else
    warn "the text dataset's default file $TEXT_FILE is missing (package jargon-text; a dpkg path-exclude of /usr/share/doc also drops it)"
  fi
}

if [[ "${TG_SKIP_APT:-0}" == 1 ]]; then
  say "TG_SKIP_APT=1: skipping apt"
else
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; this script supports Debian/Ubuntu (TG_SKIP_APT=1 skips it)"
  apt_step
fi
summary
say "done"
