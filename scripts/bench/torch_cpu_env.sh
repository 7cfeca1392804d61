# scripts/bench/torch_cpu_env.sh: how PyTorch runs beside the project on the CPU, sourced by
# cpu.sh and cpu_bf16.sh (from the repository root) so both give it the same fair conditions.
#
# - Huge pages, as the project's large buffers have (Note [huge pages for large buffers] in
#   tinygrad/runtime/cpu.cpp): glibc's malloc returns PyTorch's large tensors to the system when
#   freed and faults them in again at the next step, 4 KB at a time; on a virtual machine whose
#   page faults are slow that dominates (the 2-core AMD EPYC Zen 5: a clone of 64 MB took 210-220
#   ms, 14 ms with glibc.malloc.hugetlb=1).
# - OpenBLAS picks its kernels for this host itself: an OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE
#   inherited from the environment is dropped (one machine here set OPENBLAS_CORETYPE=Haswell for
#   every process, which on its AVX-512 Zen 5 halved OpenBLAS's rate: 206 against 371 GFLOP/s at
#   2048). A caller that restricts the ISA appends its own settings to torch_cpu_env.
torch_cpu_env=(GLIBC_TUNABLES=glibc.malloc.hugetlb=1)

# run_torch_cpu ARGS...: scripts/bench/torch_cpu.py with ARGS, in torch_cpu_env
run_torch_cpu() {
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${torch_cpu_env[@]}" /usr/bin/python3 scripts/bench/torch_cpu.py "$@"
}
