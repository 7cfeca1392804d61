// TinyJit replays on CUDA as CUDA graphs (Note [CUDA graphs for replays] in cuda_graph.cpp).
#pragma once

namespace tg::cuda {

// Registers the graph factory for "CUDA" with engine/jit (once, when a CUDA device opens).
void register_cuda_graphs();

}  // namespace tg::cuda
