// TensorBoard event files without TensorFlow: a writer of scalar summaries in the format
// TensorBoard reads (TFRecord framing with masked CRC-32C checksums around Event protocol
// buffers), and the few pieces it is made of (CRC-32C, the protobuf encoding of Event), exposed
// so that tests can read the files back. Note [TensorBoard event files] in tensorboard.cpp.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tg::launcher {

// CRC-32C (Castagnoli) of bytes, continuing from `crc` (0 to start).
uint32_t crc32c(std::string_view bytes, uint32_t crc = 0);
// TFRecord's masked CRC: rotate right by 15 bits, add 0xa282ead8.
uint32_t masked_crc32c(std::string_view bytes);

// One Event message: wall_time (1, double), step (2, int64), and one of file_version (3, string),
// summary (5: Summary{repeated Value{tag = 1, simple_value = 2 (float)}}) or session_log (6:
// SessionLog{status = 1}; START = 1).
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                            // the first event of a file: "brain.Event:2"
  std::vector<std::pair<std::string, float>> scalars;  // summary values: tag, simple_value
  bool session_start = false;                          // SessionLog START: a restart at `step`
};
// The protobuf encoding of an Event.
std::string encode_event(const Event& e);
// One TFRecord: length (uint64 LE), masked CRC of the length, data, masked CRC of the data.
std::string tfrecord(std::string_view data);

// Writes <dir>/events.out.tfevents.<unix seconds>.<host>, beginning with the file_version event;
// every event is flushed when written, so TensorBoard sees a run as it trains.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& dir);
  const std::string& path() const { return path_; }
  void write(const Event& e);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace tg::launcher
