// Reading a checkpoint of `tg train` whatever strategy and world size wrote it: a plain one (none,
// ddp: full tensors in one file), a zero1 one (the optimizer state in blocks of a flat vector, one
// file per rank) or an fsdp one (parameters and their state in dim-0 shards, one file per rank),
// each with the layout in its metadata, comes back as full tensors of their global shapes, which
// every strategy then cuts its own part from (Note [checkpoints that reshard]); of them, a rank
// reads only the elements its strategy keeps (Note [reading what a rank needs]).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/zero.h"
#include "tinygrad/nn/state.h"

namespace tg::launcher {

struct FullCheckpoint {
  nn::StateDict model;  // every parameter and buffer, of its global shape
  nn::StateDict optim;  // "<i>.<state>" of parameter i's global shape (the model's order), and "step"
};

// What of the full tensors the loading rank keeps, and so reads.
struct RankShare {
  enum class Layout {
    Whole,  // everything (one process, ddp, train.devices, tensor parallel)
    Fsdp,   // its dim-0 rows of the parameters and of their optimizer state (Note [fsdp shards])
    Zero1,  // the parameters, and its block of the flattened optimizer state (Note [zero1 checkpoints])
  };
  Layout layout = Layout::Whole;
  dist::ProcessGroup* group = nullptr;  // the ranks that load together (their rank and size); none for one process
};

// The checkpoint at `path` (its metadata `meta`) as full tensors, of which only the elements
// `share` keeps are read: the others are zeros. `params` are the loading model's parameters in
// order, `buffers` its buffers' names: the checkpoint must hold each parameter with its shape
// and, where it records a layout, in that order, and nothing else but buffers (an error names the
// checkpoint and every difference, before any tensor data is read); `params` are also the
// layout of zero1 checkpoints written before zero1_layout was recorded. Every tensor read is
// verified against its checksum, those read in part by several ranks together; with a group,
// every rank calls this together and an error of any rank is thrown on all.
FullCheckpoint read_full_checkpoint(const std::string& path, const nn::Metadata& meta,
                                    const std::vector<dist::ParamLayout>& params, const std::set<std::string>& buffers,
                                    const RankShare& share = {});

// A non-negative integer of a checkpoint's metadata; an error names the file, the key and the value.
int64_t metadata_int(const nn::Metadata& meta, const std::string& key, const std::string& path);

// The shard file of `rank` next to a zero1 checkpoint (its optimizer block) or an fsdp one
// (its parameter shards and their optimizer state): step_<N>.<strategy>-rank<r>.safetensors.
std::string shard_path(const std::string& checkpoint, int rank, const std::string& strategy = "zero1");

}  // namespace tg::launcher
