// Model state on disk in the safetensors format (https://github.com/huggingface/safetensors):
// save and load a name -> Tensor map, plus the string -> string "__metadata__" block.
// Files written here are read by the Python safetensors library and the other way round; loading
// validates the header strictly, verifies the per-tensor checksums safe_save records, and names
// the file and the problem in every error.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "tinygrad/tensor.h"

namespace tg::nn {

using StateDict = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

// Writes `tensors` (sorted by name, contiguous, little-endian) and `metadata` to `path`.
// The file is written to path + ".tmp", flushed to disk and renamed over `path`, so a failure
// part way leaves any previous file at `path` untouched. The metadata also gets the CRC-32 of
// every tensor's bytes under checksum_key(name) (checksums given in `metadata` are replaced).
void safe_save(const StateDict& tensors, const std::string& path, const Metadata& metadata = {});

// Reads every tensor of the file onto `device` (empty: the default device). A tensor whose
// bytes do not match the checksum the file records is an error naming it and the file; files
// without checksums (older ones, or written by other libraries) load unchecked.
StateDict safe_load(const std::string& path, const std::string& device = "");

// Reads the whole file as safe_load does, without making tensors, and verifies every checksum;
// returns how many tensors had one. Throws tg::Error naming the file and the damaged tensor.
size_t safe_verify(const std::string& path);

// The "__metadata__" key under which safe_save records the CRC-32 of `tensor`'s bytes, as 8
// lowercase hex digits: "tg.crc32.<tensor>".
std::string checksum_key(const std::string& tensor);

// The "__metadata__" block of the file (empty when it has none); reads only the header.
Metadata safe_metadata(const std::string& path);

// One header entry, as validated by safe_load (offsets are relative to the data section).
struct SafeTensorInfo {
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};
// The validated header: entries by name, without reading the tensor data.
std::map<std::string, SafeTensorInfo> safe_header(const std::string& path);

// Safetensors dtype codes: "F32" <-> float32 etc.; the code of an unsupported name throws.
const char* safetensors_dtype(DType t);
DType dtype_from_safetensors(const std::string& code);  // throws tg::Error naming the code

}  // namespace tg::nn
