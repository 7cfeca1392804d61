// Collectives between the GPUs of one process through NCCL (Note [NCCL between the GPUs of a
// process] in cuda_nccl.cpp): the runner of the all-reduces and all-gathers that the
// multi-device rewrite inserts between CUDA devices (Note [collectives through a device library]
// in tinygrad/multi.cpp). Built with the CUDA device when nccl.h is found; libnccl.so.2 is loaded
// at run time (nccl_api.h).
#pragma once
#include <string>

namespace tg::cuda {

// True when libnccl loads here: the CUDA device's policy then names NCCL as its collective library.
bool nccl_available();
// "NCCL 2.28.9 (libnccl.so.2)", or "unavailable: " and the reason.
std::string nccl_description();
// Registers NCCL's runners of device tuples (register_collective_library in device.h); called
// once, when the first CUDA device opens.
void register_nccl_collectives();

}  // namespace tg::cuda
