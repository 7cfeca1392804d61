// The TensorBoard and CSV sinks of the metrics records (see metric_sinks.h).
#include "launcher/metric_sinks.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "tinygrad/error.h"

namespace tg::launcher {

namespace {

// The keys every record has, in this order; the rest follow sorted.
const std::vector<std::string> LEADING = {"type", "step", "epoch", "time", "elapsed_s"};

std::string csv_cell(const nlohmann::json& v) {
  if (v.is_null()) return "";
  std::string text = v.is_string() ? v.get<std::string>() : v.dump();
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace

std::vector<std::pair<std::string, float>> record_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, float>> out;
  const std::string type = record.value("type", "");
  if (type != "train" && type != "eval" && type != "skip") return out;
  for (const auto& [key, value] : record.items())
    if (value.is_number() && key != "step" && key != "first_step" && key != "time" && key != "elapsed_s")
      out.emplace_back(type + "/" + key, value.get<float>());
  return out;
}

// ---- TensorBoardSink ----

TensorBoardSink::TensorBoardSink(std::string dir) : dir_(std::move(dir)) {}

void TensorBoardSink::begin(int64_t step) {
  file_ = std::make_unique<EventFileWriter>(dir_);
  // The session starts at the first step this start trains: Note [TensorBoard event files]
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  file_->write(Event{.wall_time = now, .step = step + 1, .session_start = true});
}

void TensorBoardSink::write(const nlohmann::json& record) {
  auto scalars = record_scalars(record);
  if (scalars.empty()) return;
  TG_ASSERT(file_, "TensorBoardSink::write before begin");
  file_->write(Event{.wall_time = record.at("time").get<double>(),
                     .step = record.at("step").get<int64_t>(),
                     .scalars = std::move(scalars)});
}

const std::string& TensorBoardSink::path() const {
  TG_ASSERT(file_, "TensorBoardSink::path before begin");
  return file_->path();
}

// ---- CsvSink ----

// Note [metrics.csv]: a CSV header must name every column before the first row, but a run's keys
// appear as it goes (the first evaluation adds eval_accuracy, the first checkpoint path). So the
// table is written from metrics.jsonl, the record of truth, whenever a record brings a key the
// header lacks (a few times a run), and a row is appended otherwise. A resumed run rewrites it
// at the start from metrics.jsonl as that file was trimmed to the checkpoint.

CsvSink::CsvSink(std::string csv_path, std::string jsonl_path)
    : csv_path_(std::move(csv_path)), jsonl_path_(std::move(jsonl_path)) {}

void CsvSink::begin(int64_t) { rewrite_from_jsonl(); }

void CsvSink::write(const nlohmann::json& record) {
  for (const auto& [key, value] : record.items())
    if (std::find(columns_.begin(), columns_.end(), key) == columns_.end()) return rewrite_from_jsonl();
  append_row(record);
}

void CsvSink::rewrite_from_jsonl() {
  std::vector<nlohmann::json> records;
  std::set<std::string> keys;
  std::ifstream in(jsonl_path_);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    for (const auto& [key, value] : j.items()) keys.insert(key);
    records.push_back(std::move(j));
  }
  columns_.clear();
  for (const auto& k : LEADING) columns_.push_back(k), keys.erase(k);
  columns_.insert(columns_.end(), keys.begin(), keys.end());
  out_.close();
  out_.open(csv_path_, std::ios::trunc);
  TG_CHECK(out_, "metrics.csv: cannot write '", csv_path_, "'");
  for (size_t i = 0; i < columns_.size(); i++) out_ << (i ? "," : "") << columns_[i];
  out_ << "\n";
  for (const auto& r : records) append_row(r);
  out_.flush();
}

void CsvSink::append_row(const nlohmann::json& record) {
  for (size_t i = 0; i < columns_.size(); i++)
    out_ << (i ? "," : "") << (record.contains(columns_[i]) ? csv_cell(record.at(columns_[i])) : "");
  out_ << "\n";
  out_.flush();
}

}  // namespace tg::launcher
