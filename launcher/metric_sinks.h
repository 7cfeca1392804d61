// Where metrics.jsonl's records also go, each a MetricsWriter::Sink: TensorBoard event files
// (train.tensorboard: RUN_DIR/tensorboard/) and a CSV table (train.csv: RUN_DIR/metrics.csv).
#pragma once
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "launcher/observers.h"
#include "launcher/tensorboard.h"

namespace tg::launcher {

// The scalars of a record as TensorBoard shows them: "<type>/<key>" for every number of a train,
// eval or skip record but its step, first_step, time and elapsed_s ("train/loss", "eval/val_loss",
// "skip/skipped", ...).
std::vector<std::pair<std::string, float>> record_scalars(const nlohmann::json& record);

// A new event file per start of the run in `dir`, opened by a session start at the first step it
// trains; every record's scalars become one event at the record's step and wall-clock time (Note
// [TensorBoard event files] in tensorboard.cpp).
class TensorBoardSink : public MetricsWriter::Sink {
 public:
  explicit TensorBoardSink(std::string dir);
  void begin(int64_t step) override;
  void write(const nlohmann::json& record) override;
  const std::string& path() const;

 private:
  std::string dir_;
  std::unique_ptr<EventFileWriter> file_;
};

// metrics.jsonl as a table: a header of the union of the records' keys (type, step, epoch,
// time, elapsed_s first, the others sorted), a row per record, empty cells for keys a record
// lacks. Note [metrics.csv].
class CsvSink : public MetricsWriter::Sink {
 public:
  CsvSink(std::string csv_path, std::string jsonl_path);
  void begin(int64_t step) override;
  void write(const nlohmann::json& record) override;

 private:
  void rewrite_from_jsonl();
  void append_row(const nlohmann::json& record);
  std::string csv_path_, jsonl_path_;
  std::vector<std::string> columns_;
  std::ofstream out_;
};

}  // namespace tg::launcher
