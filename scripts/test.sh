#!/usr/bin/env bash
# scripts/test.sh: sets the machine up, configures a fresh Release build in build/, builds it and runs
# every test through CTest. Exits non-zero when anything fails. Works as root (CI runs it as root).
#
#   bash scripts/test.sh              all tests
#   bash scripts/test.sh -L unit      extra arguments go to ctest (here: only the `unit` label)
#
#   TG_SKIP_APT=1        skip the apt step of setup.sh
#   TG_CMAKE_ARGS="..."  extra arguments for the cmake configure step
#   TG_LLVM_DIR=DIR      the LLVM CMake package to use (default: LLVM 19, else 16, when installed)
#   TG_TEST_TIMEOUT=S    per-test timeout for tests that set none themselves (default 900)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/build.sh

# mpirun refuses to start as root without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Tests start more ranks than the machine has cores.
export OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI wants ssh or rsh even for ranks on this host; without either, tell it to use none.
if ! command -v ssh >/dev/null 2>&1 && ! command -v rsh >/dev/null 2>&1; then
  export OMPI_MCA_plm_rsh_agent=""
fi

ctest --test-dir build --output-on-failure -j2 --no-tests=error --timeout "${TG_TEST_TIMEOUT:-900}" "$@"
