// Reading a checkpoint of `tg train` whatever strategy and world size wrote it: a plain one (none,
// ddp: full tensors in one file), a zero1 one (the optimizer state in blocks of a flat vector, one
// file per rank) or an fsdp one (parameters and their state in dim-0 shards, one file per rank),
// each with the layout in its metadata, comes back as full tensors of their global shapes, which
// every strategy then cuts its own part from (Note [checkpoints that reshard]).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "distributed/zero.h"
#include "tinygrad/nn/state.h"

namespace tg::launcher {

struct FullCheckpoint {
  nn::StateDict model;  // every parameter and buffer, of its global shape
  nn::StateDict optim;  // "<i>.<state>" of parameter i's global shape (the model's order), and "step"
};

// The checkpoint at `path` (its metadata `meta`) as full tensors. `params` are the loading
// model's parameters in order, `buffers` its buffers' names: the checkpoint must hold each
// parameter with its shape and, where it records a layout, in that order, and nothing else but
// buffers (an error names the checkpoint and every difference); `params` are also the layout of
// zero1 checkpoints written before zero1_layout was recorded. Every shard file is read (each
// rank reads them all).
FullCheckpoint read_full_checkpoint(const std::string& path, const nn::Metadata& meta,
                                    const std::vector<dist::ParamLayout>& params, const std::set<std::string>& buffers);

// A non-negative integer of a checkpoint's metadata; an error names the file, the key and the value.
int64_t metadata_int(const nn::Metadata& meta, const std::string& key, const std::string& path);

// The shard file of `rank` next to a zero1 checkpoint (its optimizer block) or an fsdp one
// (its parameter shards and their optimizer state): step_<N>.<strategy>-rank<r>.safetensors.
std::string shard_path(const std::string& checkpoint, int rank, const std::string& strategy = "zero1");

}  // namespace tg::launcher
