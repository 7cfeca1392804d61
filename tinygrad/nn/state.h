// Model state on disk in the safetensors format (https://github.com/huggingface/safetensors):
// save and load a name -> Tensor map, plus the string -> string "__metadata__" block.
// Files written here are read by the Python safetensors library and the other way round; loading
// validates the header strictly, verifies the per-tensor checksums safe_save records, and names
// the file and the problem in every error.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
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

// A safetensors file opened to read parts of its tensors (Note [reading parts of tensors] in
// state.cpp): the header is read and validated once, as safe_load does, and read() copies bytes
// of one tensor. A read of a whole tensor verifies its checksum; a read of a part cannot, and
// returns the part's CRC-32 so that the reader can verify the whole from the parts.
class SafeReader {
 public:
  explicit SafeReader(const std::string& path);
  ~SafeReader();
  SafeReader(const SafeReader&) = delete;
  SafeReader& operator=(const SafeReader&) = delete;

  const std::string& path() const;
  const std::map<std::string, SafeTensorInfo>& entries() const;
  const Metadata& metadata() const;
  // The entry of `name`; an error names the file and the tensor when the file has none.
  const SafeTensorInfo& entry(const std::string& name) const;
  // The CRC-32 the file records for `name`'s bytes (none for a file without checksums).
  std::optional<uint32_t> checksum(const std::string& name) const;
  // Copies bytes [begin, end) of tensor `name`'s data (offsets within the tensor) to `out` and
  // returns their CRC-32; reading all of it, it verifies the recorded checksum.
  uint32_t read(const std::string& name, uint64_t begin, uint64_t end, void* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Bytes of tensor data this process has read from safetensors files (safe_load, safe_verify and
// SafeReader; headers not counted) since it started: what a resume reads, for tests and
// measurements.
uint64_t safe_bytes_read();

// The CRC-32 of bytes a and b one after the other, from a's and b's CRC-32 and b's length.
uint32_t crc32_concat(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// Safetensors dtype codes: "F32" <-> float32 etc.; the code of an unsupported name throws.
const char* safetensors_dtype(DType t);
DType dtype_from_safetensors(const std::string& code);  // throws tg::Error naming the code

}  // namespace tg::nn
