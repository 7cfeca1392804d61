// Reading the parts of a checkpoint's full tensors that a rank needs (see checkpoint_pieces.h).
#include "launcher/checkpoint_pieces.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <tuple>

#include "distributed/host_exchange.h"
#include "tinygrad/error.h"

namespace tg::launcher {

namespace {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

uint64_t entry_bytes(const nn::SafeReader& file, const std::string& entry) {
  const nn::SafeTensorInfo& info = file.entry(entry);
  return info.end - info.begin;
}

// One line per part: file, entry, begin, end, crc, tab-separated.
std::string parts_text(const std::vector<PartRead>& parts) {
  std::ostringstream out;
  for (const auto& p : parts) out << p.file << '\t' << p.entry << '\t' << p.begin << '\t' << p.end << '\t' << p.crc << '\n';
  return out.str();
}

std::vector<PartRead> parse_parts(const std::string& text) {
  std::vector<PartRead> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    PartRead p;
    std::getline(fields, p.file, '\t');
    std::getline(fields, p.entry, '\t');
    fields >> p.begin >> p.end >> p.crc;
    TG_ASSERT(fields && !p.file.empty(), "checkpoint: a rank's part record '", line, "' does not parse");
    out.push_back(std::move(p));
  }
  return out;
}

// The CRC-32 of all of `entry` from the parts the ranks read (sorted, disjoint or equal), reading
// what lies between them; nullopt when parts overlap without being equal (the caller reads the
// whole entry instead).
std::optional<uint32_t> joined_crc(nn::SafeReader& file, const std::string& entry, std::vector<PartRead> parts) {
  std::sort(parts.begin(), parts.end(),
            [](const PartRead& a, const PartRead& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  const uint64_t size = entry_bytes(file, entry);
  uint64_t pos = 0;
  uint32_t crc = 0;  // the CRC-32 of no bytes
  std::vector<char> gap;
  auto add_gap = [&](uint64_t end) {
    gap.resize(end - pos);
    crc = nn::crc32_concat(crc, file.read(entry, pos, end, gap.data()), end - pos);
    pos = end;
  };
  for (size_t i = 0; i < parts.size(); i++) {
    const PartRead& p = parts[i];
    if (i > 0 && p.begin == parts[i - 1].begin && p.end == parts[i - 1].end && p.crc == parts[i - 1].crc) continue;
    if (p.begin < pos) return std::nullopt;
    if (p.begin > pos) add_gap(p.begin);
    crc = nn::crc32_concat(crc, p.crc, p.end - p.begin);
    pos = p.end;
  }
  if (pos < size) add_gap(size);
  return crc;
}

}  // namespace

nn::SafeReader& CheckpointFiles::open(const std::string& path) {
  auto& slot = files_[path];
  if (!slot) slot = std::make_unique<nn::SafeReader>(path);
  return *slot;
}

Tensor read_part(const StoredTensor& t, ElementRange want, std::vector<PartRead>& parts) {
  const auto isz = static_cast<int64_t>(itemsize(t.dtype));
  std::vector<char> bytes(static_cast<size_t>(numel_of(t.shape) * isz), 0);
  std::vector<char> whole;
  for (const Piece& p : t.pieces) {
    const int64_t lo = std::max(want.first, p.at), hi = std::min(want.second, p.at + p.count);
    if (lo >= hi) continue;
    char* dst = bytes.data() + lo * isz;
    const auto begin = static_cast<uint64_t>((p.from + lo - p.at) * isz), end = static_cast<uint64_t>((p.from + hi - p.at) * isz);
    if (lo == p.at && hi == p.at + p.count) {  // the whole piece: read its tensor whole (padding rows too) and verify it
      whole.resize(entry_bytes(*p.file, p.entry));
      p.file->read(p.entry, 0, whole.size(), whole.data());
      std::copy(whole.begin() + static_cast<std::ptrdiff_t>(begin), whole.begin() + static_cast<std::ptrdiff_t>(end), dst);
      continue;
    }
    uint32_t crc = p.file->read(p.entry, begin, end, dst);
    parts.push_back({p.file->path(), p.entry, begin, end, crc});
  }
  if (t.dtype == DType::Bool)
    for (auto& b : bytes) b = b != 0;  // the engine's bools are 0 or 1
  return Tensor::from_data(bytes.data(), t.dtype, t.shape);
}

void verify_parts(dist::ProcessGroup& pg, const std::vector<PartRead>& mine, const std::string& error, CheckpointFiles& files) {
  std::vector<std::string> all = dist::all_strings(pg, error.empty() ? "P" + parts_text(mine) : "E" + error);
  for (size_t r = 0; r < all.size(); r++) {
    if (all[r][0] != 'E') continue;
    if (static_cast<int>(r) == pg.rank()) throw Error(error);
    throw Error("rank " + std::to_string(r) + " could not read the checkpoint: " + all[r].substr(1));
  }
  std::map<std::pair<std::string, std::string>, std::vector<PartRead>> by_tensor;
  for (const auto& text : all)
    for (auto& p : parse_parts(text.substr(1))) by_tensor[{p.file, p.entry}].push_back(p);
  for (auto& [key, parts] : by_tensor) {
    nn::SafeReader& file = files.open(key.first);
    auto recorded = file.checksum(key.second);
    if (!recorded) continue;  // a file without checksums
    auto crc = joined_crc(file, key.second, parts);
    if (!crc) {  // parts that overlap: read it whole, which verifies it
      std::vector<char> whole(entry_bytes(file, key.second));
      file.read(key.second, 0, whole.size(), whole.data());
      continue;
    }
    TG_CHECK(*crc == *recorded, "safetensors file '", key.first, "': tensor '", key.second,
             "' is damaged: the CRC-32 of its ", entry_bytes(file, key.second), " bytes, read in parts by the ranks, is ",
             hex8(*crc), ", the file recorded ", hex8(*recorded), " when it was written");
  }
}

}  // namespace tg::launcher
