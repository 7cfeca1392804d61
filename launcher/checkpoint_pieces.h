// Where the full tensors of a checkpoint lie in its files, and reading the parts of them that a
// rank needs: a full tensor (a parameter, a buffer, a parameter's optimizer state, of its global
// shape) is a list of pieces, each a run of its elements held by one tensor of one file (a whole
// tensor of the main file, an fsdp shard's rows, a stretch of a zero1 block). read_part copies
// the pieces' bytes that fall in a range of the full tensor's elements and nothing else; the
// checksums of tensors read in part are verified from the parts every rank read (verify_parts).
// Note [reading what a rank needs] in checkpoint.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/process_group.h"
#include "tinygrad/nn/state.h"

namespace tg::launcher {

// Elements [at, at + count) of a full tensor (row-major) are elements [from, from + count) of
// tensor `entry` of `file`.
struct Piece {
  nn::SafeReader* file = nullptr;
  std::string entry;
  int64_t at = 0, count = 0, from = 0;
};

// A full tensor of a checkpoint: its dtype, global shape and the pieces that hold its elements.
struct StoredTensor {
  DType dtype = DType::Float32;
  Shape shape;
  std::vector<Piece> pieces;
};

// Elements [first, second) of a full tensor, row-major.
using ElementRange = std::pair<int64_t, int64_t>;

// Bytes [begin, end) of a file's tensor that this rank read, not all of it, and their CRC-32.
struct PartRead {
  std::string file, entry;
  uint64_t begin = 0, end = 0;
  uint32_t crc = 0;
};

// The files of a checkpoint, each opened once (its header read and validated, no data).
class CheckpointFiles {
 public:
  nn::SafeReader& open(const std::string& path);

 private:
  std::map<std::string, std::unique_ptr<nn::SafeReader>> files_;
};

// The full tensor `t` with the elements of `want` read from its files and zeros elsewhere. A
// piece read whole has its checksum verified; one read in part is appended to `parts`.
Tensor read_part(const StoredTensor& t, ElementRange want, std::vector<PartRead>& parts);

// Every rank calls this after its reads, with the parts it read (`mine`) and the error its reads
// or checks threw ("" if none): the ranks exchange both; a rank's error is then thrown on every
// rank (the lowest rank's, naming it), and so is a checksum that the parts of a tensor, read by
// whichever ranks and joined in order, do not give. What no rank read of such a tensor (the
// padding of shards) every rank reads here.
void verify_parts(dist::ProcessGroup& pg, const std::vector<PartRead>& mine, const std::string& error, CheckpointFiles& files);

}  // namespace tg::launcher
