// Tests of what a run leaves behind (training only tiny synthetic runs): run.json and the resumes'
// records and configs, wall-clock time and epoch numbers in the metrics, progress modes, errors
// whole in train.log, the [rank N] log prefixes, `tg --version`, and the TensorBoard event files
// and metrics.csv read back (by the project's own decoder, and by TensorBoard where python3 has it).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "launcher/config.h"
#include "launcher/log.h"
#include "launcher/metric_sinks.h"
#include "launcher/run.h"
#include "launcher/run_record.h"
#include "launcher/tensorboard.h"
#include "launcher/trainer.h"
#include "tests/launcher_models.h"
#include "tests/run_util.h"
#include "tests/test_util.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/state.h"

namespace fs = std::filesystem;
using namespace tg;
using namespace tg::launcher;
using testutil::error_of;
using testutil::tg_run;

namespace {

fs::path temp_dir(const std::string& name) { return testutil::fresh_run_dir("run_record", name); }


std::string file_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

nlohmann::json json_file(const fs::path& p) { return nlohmann::json::parse(file_text(p)); }

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// The run directory records how each start of a run was made (run.json, run.resume-N.json), a
// resume keeps the earlier config.yaml and writes config.resume-N.yaml, every metrics record has
// wall-clock time, and the epochs are numbered the same in metrics, train.log and checkpoints.
TEST(LauncherRunRecord, RecordsEachStartAndKeepsEveryConfig) {
  fs::path dir = temp_dir("run_record");
  std::vector<std::string> o = {"model.name=test_tiny", "data.name=test_synth", "data.batch_size=8", "train.steps=9",
                                "train.checkpoint_every=3", "train.log_every=1", "optim.lr=0.05",
                                "train.run_dir=" + dir.string()};
  const double before = unix_now();
  run_train(parse_config("", "synth.yaml", o), {.progress = false, .command_line = {"tg", "train", "synth.yaml"}});
  const std::string first_config = file_text(dir / "config.yaml");
  nlohmann::json rec = json_file(dir / "run.json");
  EXPECT_EQ(rec["command_line"], nlohmann::json({"tg", "train", "synth.yaml"}));
  EXPECT_EQ(rec["version"], build_version());
  EXPECT_EQ(rec["commit"], build_commit());
  EXPECT_FALSE(build_commit().empty());
  EXPECT_EQ(rec["devices"], nlohmann::json({"CPU"}));
  EXPECT_EQ(rec["world_size"], 1);
  EXPECT_EQ(rec["precision"], "fp32");
  EXPECT_EQ(rec["config_file"], "config.yaml");
  EXPECT_EQ(rec["initial_weights"], nlohmann::json({{"source", "random"}, {"seed", 0}}));
  EXPECT_FALSE(rec["host"].get<std::string>().empty());

  // Resume from step 6 with more steps: the first config stays, the resume's goes beside it.
  fs::remove(dir / "checkpoints" / "step_9.safetensors");
  o[3] = "train.steps=12";
  o.push_back("train.resume=true");
  run_train(parse_config("", "synth.yaml", o), {.progress = false});
  const double after = unix_now();
  EXPECT_EQ(file_text(dir / "config.yaml"), first_config);
  EXPECT_NE(first_config.find("steps: 9"), std::string::npos) << first_config;
  EXPECT_NE(file_text(dir / "config.resume-1.yaml").find("steps: 12"), std::string::npos);
  nlohmann::json resumed = json_file(dir / "run.resume-1.json");
  EXPECT_EQ(resumed["resume_index"], 1);
  EXPECT_EQ(resumed["config_file"], "config.resume-1.yaml");
  EXPECT_EQ(resumed["initial_weights"]["source"], "checkpoint");
  EXPECT_EQ(resumed["initial_weights"]["step"], 6);
  EXPECT_EQ(run_files(dir.string(), true).config, "config.resume-2.yaml");
  EXPECT_TRUE(fs::exists(dir / "run.json"));

  // Wall-clock time on every record; elapsed_s goes on across the resume. Epochs: 6 batches each.
  auto records = testutil::metrics_records(dir, "train");
  ASSERT_EQ(records.size(), 12u);
  double last_elapsed = 0;
  for (const auto& r : records) {
    EXPECT_GE(r["time"].get<double>(), before - 1);
    EXPECT_LE(r["time"].get<double>(), after + 1);
    EXPECT_GE(r["elapsed_s"].get<double>(), last_elapsed);
    last_elapsed = r["elapsed_s"].get<double>();
    EXPECT_EQ(r["epoch"], (r["step"].get<int64_t>() - 1) / 6 + 1) << r;
  }
  for (const char* type : {"eval", "checkpoint"})
    for (const auto& r : testutil::metrics_records(dir, type)) {
      EXPECT_TRUE(r.contains("time") && r.contains("elapsed_s")) << r;
      EXPECT_EQ(r["epoch"], (r["step"].get<int64_t>() - 1) / 6 + 1) << r;
    }
  EXPECT_EQ(nn::safe_metadata((dir / "checkpoints" / "step_6.safetensors").string()).at("epoch"), "1");
  EXPECT_EQ(nn::safe_metadata((dir / "checkpoints" / "step_12.safetensors").string()).at("epoch"), "2");
  const std::string log = file_text(dir / "train.log");
  EXPECT_NE(log.find("epoch 1 step 6/"), std::string::npos) << log;
  EXPECT_NE(log.find("epoch 2 step 7/"), std::string::npos) << log;
  fs::remove_all(dir);
}

// train.progress: auto is a bar on a terminal, plain lines elsewhere and under a launcher (mpirun
// gives rank 0 a pseudo-terminal: its log file used to fill with \r bars).
TEST(LauncherRunRecord, ProgressModeFollowsTheTerminalAndTheLauncher) {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "TG_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"};
  std::map<std::string, std::string> saved;
  for (const char* v : vars)
    if (const char* x = std::getenv(v)) saved[v] = x;
  for (const char* v : vars) ::unsetenv(v);
  EXPECT_EQ(progress_mode("auto", true), ProgressMode::Bar);
  EXPECT_EQ(progress_mode("auto", false), ProgressMode::Plain);
  EXPECT_EQ(progress_mode("bar", false), ProgressMode::Bar);
  EXPECT_EQ(progress_mode("plain", true), ProgressMode::Plain);
  EXPECT_EQ(progress_mode("off", true), ProgressMode::Off);
  for (const char* v : vars) {
    ::setenv(v, "2", 1);
    EXPECT_TRUE(started_by_launcher()) << v;
    EXPECT_EQ(progress_mode("auto", true), ProgressMode::Plain) << v;
    ::unsetenv(v);
  }
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
  EXPECT_NE(error_of([] { parse_config("", "c.yaml", {"train.progress=fancy"}); }).find("train.progress"), std::string::npos);

  // What each mode prints: a bar redrawn with \r and elapsed<ETA, plain lines, nothing.
  std::map<std::string, std::string> printed;
  for (const char* mode : {"bar", "plain", "off"}) {
    fs::path dir = temp_dir(std::string("progress_") + mode);
    Config c = parse_config("", "synth.yaml", {"model.name=test_tiny", "data.name=test_synth", "data.batch_size=8",
                                               "train.steps=4", "train.log_every=1", "train.print_every=2",
                                               std::string("train.progress=") + mode, "train.run_dir=" + dir.string()});
    testing::internal::CaptureStdout();
    run_train(c, {.progress = true, .tty = false});
    printed[mode] = testing::internal::GetCapturedStdout();
    fs::remove_all(dir);
  }
  EXPECT_NE(printed["bar"].find("\r[####"), std::string::npos) << printed["bar"];
  EXPECT_NE(printed["bar"].find("] epoch 1 step 4/4"), std::string::npos) << printed["bar"];
  EXPECT_NE(printed["bar"].find("  [00:00<00:00]"), std::string::npos) << printed["bar"];
  EXPECT_EQ(printed["plain"].find('\r'), std::string::npos) << printed["plain"];
  EXPECT_NE(printed["plain"].find("epoch 1 step 2/4"), std::string::npos) << printed["plain"];
  EXPECT_EQ(printed["plain"].find("epoch 1 step 3/4"), std::string::npos) << printed["plain"];
  EXPECT_EQ(printed["off"], "");
}

// What a resume of test_tiny's checkpoint in `dir` by test_mlp says (Note [checkpoints that
// reshard] in launcher/checkpoint.cpp): every parameter that differs, one per line.
std::string misfit_error(const fs::path& dir) {
  return "checkpoint '" + (dir / "checkpoints" / "step_2.safetensors").string() + "' does not fit this model:\n"
         "  parameter '1.weight' [16,4] is not in the checkpoint\n  parameter '1.bias' [16] is not in the checkpoint\n"
         "  parameter '3.weight' [3,16] is not in the checkpoint\n  parameter '3.bias' [3] is not in the checkpoint\n"
         "  the checkpoint's 'fc.bias' [3] is not in this model\n  the checkpoint's 'fc.weight' [3,4] is not in this model";
}

// A resume with another model: the whole message (every parameter that differs) on stderr and
// in train.log.
TEST(LauncherRunRecord, ErrorsGoWholeIntoTrainLog) {
  fs::path dir = temp_dir("error_log");
  std::vector<std::string> args = {"tg", "train", std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml",
                                   "data.name=test_synth", "data.batch_size=8", "model.name=test_tiny", "train.steps=2",
                                   "train.progress=off", "train.run_dir=" + dir.string()};
  ASSERT_EQ(tg_run(args).rc, 0);
  args[5] = "model.name=test_mlp";
  args.push_back("train.resume=true");
  args[6] = "train.steps=4";
  auto [rc, out, err] = tg_run(args);
  EXPECT_EQ(rc, 1);
  const std::string want = misfit_error(dir);
  EXPECT_EQ(err, "error: " + want + "\n");
  const std::string log = file_text(dir / "train.log");
  EXPECT_NE(log.find("  error: " + want + "\n"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir / "config.resume-1.yaml"));  // the failed resume wrote no config
  fs::remove_all(dir);
}

// Note [rank prefixes] in launcher/log.cpp: under mpirun, srun (or another MPI launcher) an error
// line names its rank; in one process, and under `tg launch` (TG_RANK), which marks its workers'
// lines itself, it does not. train.log (rank 0's) keeps its lines as they were, a multi-line
// error whole.
TEST(LauncherLog, RankPrefixUnderMpirunAndSrunOnly) {
  const char* vars[] = {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "TG_RANK"};
  std::map<std::string, std::string> saved;
  for (const char* v : vars)
    if (const char* x = std::getenv(v)) saved[v] = x;
  for (const char* v : vars) ::unsetenv(v);
  auto err_of = [] { return tg_run({"tg", "train", "/nonexistent/config.yaml"}).err; };
  const std::string plain = err_of();
  EXPECT_EQ(rank_prefix(), "");
  EXPECT_EQ(plain.rfind("error: ", 0), 0u) << plain;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"}) {
    ::setenv(v, "3", 1);
    EXPECT_EQ(rank_prefix(), "[rank 3] ") << v;
    EXPECT_EQ(err_of(), "[rank 3] " + plain) << v;
    ::setenv("TG_RANK", "3", 1);
    EXPECT_EQ(err_of(), plain) << v << " under tg launch";
    ::unsetenv("TG_RANK");
    ::unsetenv(v);
  }

  // A resume with another model, as rank 0 of mpirun would see it (one process: strategy none).
  fs::path dir = temp_dir("rank_log");
  std::vector<std::string> args = {"tg", "train", std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml",
                                   "data.name=test_synth", "data.batch_size=8", "model.name=test_tiny", "train.steps=2",
                                   "train.progress=off", "train.run_dir=" + dir.string()};
  ASSERT_EQ(tg_run(args).rc, 0);
  args[5] = "model.name=test_mlp";
  args.push_back("train.resume=true");
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  auto [rc, out, err] = tg_run(args);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(rc, 1);
  const std::string want = misfit_error(dir);
  EXPECT_EQ(err, "[rank 0] error: " + want + "\n");
  const std::string log = file_text(dir / "train.log");
  EXPECT_NE(log.find("  error: " + want + "\n"), std::string::npos) << log;
  EXPECT_EQ(log.find("[rank"), std::string::npos) << log;
  // every line of train.log: "YYYY-MM-DD HH:MM:SS  text", or a detail of the error
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("  ", 0) != 0) {
      EXPECT_TRUE(std::regex_search(line, std::regex("^\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d  \\S"))) << line;
    }
  fs::remove_all(dir);
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}

TEST(LauncherRunRecord, VersionNamesCommitAndFeatures) {
  std::string v = version_text();
  EXPECT_EQ(v.rfind("tinygrad++ " + build_version() + " (commit " + build_commit() + ")\n", 0), 0u) << v;
  EXPECT_NE(v.find("CPU kernels: "), std::string::npos) << v;
  EXPECT_NE(v.find("process-group backends: local"), std::string::npos) << v;
}

namespace {

// A reader of TensorBoard event files written for this test from the format's description (Note
// [TensorBoard event files]): every record's two CRCs are checked and its Event decoded.
struct ProtoReader {
  std::string_view in;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (in.empty()) throw std::runtime_error("varint runs past the message");
      auto b = static_cast<uint8_t>(in.front());
      in.remove_prefix(1);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  template <class T>
  T fixed() {
    if (in.size() < sizeof(T)) throw std::runtime_error("fixed field runs past the message");
    T v;
    std::memcpy(&v, in.data(), sizeof(T));
    in.remove_prefix(sizeof(T));
    return v;
  }
  std::string_view bytes() {
    uint64_t n = varint();
    if (in.size() < n) throw std::runtime_error("length-delimited field runs past the message");
    std::string_view b = in.substr(0, n);
    in.remove_prefix(n);
    return b;
  }
};

Event decode_event(std::string_view data) {
  Event e;
  ProtoReader r{data};
  while (!r.in.empty()) {
    uint64_t key = r.varint();
    switch (key) {
      case (1 << 3 | 1): e.wall_time = r.fixed<double>(); break;
      case (2 << 3 | 0): e.step = static_cast<int64_t>(r.varint()); break;
      case (3 << 3 | 2): e.file_version = std::string(r.bytes()); break;
      case (5 << 3 | 2): {
        ProtoReader summary{r.bytes()};
        while (!summary.in.empty()) {
          if (summary.varint() != (1 << 3 | 2)) throw std::runtime_error("Summary: unexpected field");
          ProtoReader value{summary.bytes()};
          std::string tag;
          float simple = NAN;
          while (!value.in.empty()) {
            uint64_t k = value.varint();
            if (k == (1 << 3 | 2)) tag = std::string(value.bytes());
            else if (k == (2 << 3 | 5)) simple = value.fixed<float>();
            else throw std::runtime_error("Summary.Value: unexpected field");
          }
          e.scalars.emplace_back(tag, simple);
        }
        break;
      }
      case (7 << 3 | 2): e.session_start = r.bytes() == std::string_view("\x08\x01", 2); break;  // Event.session_log
      default: throw std::runtime_error("Event: unexpected field key " + std::to_string(key));
    }
  }
  return e;
}

std::vector<Event> read_event_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string all(std::istreambuf_iterator<char>(in), {});
  std::string_view rest = all;
  std::vector<Event> out;
  auto u32 = [](std::string_view b) { uint32_t v; std::memcpy(&v, b.data(), 4); return v; };
  while (!rest.empty()) {
    if (rest.size() < 12) throw std::runtime_error("truncated record header");
    std::string_view len_bytes = rest.substr(0, 8);
    uint64_t len;
    std::memcpy(&len, len_bytes.data(), 8);
    if (u32(rest.substr(8, 4)) != masked_crc32c(len_bytes)) throw std::runtime_error("length CRC mismatch");
    if (rest.size() < 16 + len) throw std::runtime_error("truncated record");
    std::string_view data = rest.substr(12, len);
    if (u32(rest.substr(12 + len, 4)) != masked_crc32c(data)) throw std::runtime_error("data CRC mismatch");
    out.push_back(decode_event(data));
    rest.remove_prefix(16 + len);
  }
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(LauncherTensorBoard, Crc32cAndEventEncodingMatchTheFormat) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // CRC-32C's check value
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720, B.4
  // The first record of every TensorBoard file: Event{wall_time, file_version: "brain.Event:2"}.
  Event first{.wall_time = 1.5, .file_version = "brain.Event:2"};
  std::string bytes = encode_event(first);
  EXPECT_EQ(bytes, std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x1a\x0d", 11) + "brain.Event:2");
  Event back = decode_event(bytes);
  EXPECT_EQ(back.wall_time, 1.5);
  EXPECT_EQ(back.file_version, "brain.Event:2");
  Event scalars{.wall_time = 2, .step = 300, .scalars = {{"train/loss", 0.25f}, {"eval/val_loss", -1e-3f}}};
  back = decode_event(encode_event(scalars));
  EXPECT_EQ(back.step, 300);
  EXPECT_EQ(back.scalars, scalars.scalars);
  // A restart: Event{wall_time, step: 5, session_log (field 7): SessionLog{status: START}}, the
  // field TensorBoard's EventAccumulator purges on (field 6 is the deprecated log_message).
  Event start{.wall_time = 1.5, .step = 5, .session_start = true};
  EXPECT_EQ(encode_event(start), std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x10\x05\x3a\x02\x08\x01", 15));
  std::string rec = tfrecord("abc");
  ASSERT_EQ(rec.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(rec.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
}

// train.tensorboard=true and train.csv=true: the event files and metrics.csv hold metrics.jsonl's
// values (the event file read back here, its CRCs checked and its protocol buffers decoded).
TEST(LauncherTensorBoard, EventFilesAndCsvHoldTheMetrics) {
  fs::path dir = temp_dir("tensorboard");
  std::vector<std::string> o = {"model.name=test_tiny", "data.name=test_synth", "data.batch_size=8", "train.steps=8",
                                "train.log_every=2", "train.eval_every=4", "train.checkpoint_every=4", "optim.lr=0.05",
                                "train.tensorboard=true", "train.csv=true", "train.run_dir=" + dir.string()};
  run_train(parse_config("", "synth.yaml", o), {.progress = false});
  auto files = event_files(dir / "tensorboard");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u) << files[0];
  std::vector<Event> events = read_event_file(files[0]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  std::vector<nlohmann::json> records;
  for (const char* type : {"train", "eval"})
    for (auto& r : testutil::metrics_records(dir, type)) records.push_back(r);
  std::stable_sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a["time"] < b["time"]; });
  EXPECT_TRUE(events[1].session_start);  // the session begins at step 1
  EXPECT_EQ(events[1].step, 1);
  ASSERT_EQ(events.size(), 2 + records.size());  // 4 train records, 2 evaluations
  ASSERT_EQ(records.size(), 6u);
  for (size_t i = 0; i < records.size(); i++) {
    const Event& e = events[i + 2];
    const auto& r = records[i];
    EXPECT_EQ(e.step, r["step"].get<int64_t>());
    EXPECT_NEAR(e.wall_time, r["time"].get<double>(), 1e-6);
    std::map<std::string, float> got(e.scalars.begin(), e.scalars.end());
    const std::string type = r["type"];
    if (type == "train") {
      EXPECT_GT(r.value("grad_norm", 0.0), 0) << "one process's train records carry grad_norm";
    }
    for (const char* key : {"loss", "lr", "examples_per_s", "epoch", "eval_accuracy", "grad_norm"}) {
      if (!r.contains(key)) continue;
      ASSERT_TRUE(got.count(type + "/" + key)) << type << "/" << key;
      EXPECT_EQ(got[type + "/" + key], r[key].get<float>()) << key;
    }
    EXPECT_EQ(e.scalars, record_scalars(r));
  }

  // metrics.csv: the union of the keys as its header, one row per metrics.jsonl record.
  std::ifstream csv(dir / "metrics.csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  std::ifstream jsonl(dir / "metrics.jsonl");
  std::vector<nlohmann::json> all;
  for (std::string line; std::getline(jsonl, line);) all.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 1 + all.size());
  EXPECT_EQ(lines[0], "type,step,epoch,time,elapsed_s,eval_accuracy,eval_seconds,examples_per_s,grad_norm,loss,lr,path");
  std::vector<std::string> header;
  std::stringstream hs(lines[0]);
  for (std::string cell; std::getline(hs, cell, ',');) header.push_back(cell);
  for (size_t i = 0; i < all.size(); i++) {
    std::vector<std::string> cells;
    std::stringstream rs(lines[i + 1]);
    for (std::string cell; std::getline(rs, cell, ',');) cells.push_back(cell);
    cells.resize(header.size());
    for (size_t c = 0; c < header.size(); c++) {
      const auto& r = all[i];
      std::string want = !r.contains(header[c]) ? "" : r[header[c]].is_string() ? r[header[c]].get<std::string>() : r[header[c]].dump();
      EXPECT_EQ(cells[c], want) << "row " << i << " column " << header[c];
    }
  }

  // A resume from step 4: a second event file that restarts at step 5, and metrics.csv rewritten
  // from the trimmed metrics.jsonl.
  fs::remove(dir / "checkpoints" / "step_8.safetensors");
  o.push_back("train.resume=true");
  run_train(parse_config("", "synth.yaml", o), {.progress = false});
  files = event_files(dir / "tensorboard");
  ASSERT_EQ(files.size(), 2u);
  std::vector<Event> resumed = read_event_file(files[1]);
  ASSERT_GE(resumed.size(), 2u);
  EXPECT_TRUE(resumed[1].session_start);
  EXPECT_EQ(resumed[1].step, 5);
  EXPECT_EQ(resumed[2].step, 6);
  std::ifstream csv2(dir / "metrics.csv");
  size_t rows = 0;
  for (std::string line; std::getline(csv2, line);) rows++;
  std::ifstream jsonl2(dir / "metrics.jsonl");
  size_t records2 = 0;
  for (std::string line; std::getline(jsonl2, line);) records2++;
  EXPECT_EQ(rows, 1 + records2);

  fs::remove_all(dir);
}

// TensorBoard's own reader (EventAccumulator) gives metrics.jsonl's values for a run that was
// resumed (the restart event drops the first file's values after the checkpoint), where python3
// has TensorBoard (the GPU machine; Note [python interop] in test_state.cpp).
TEST(LauncherTensorBoard, TensorBoardReadsTheRunBack) {
  if (std::system("python3 -c 'import tensorboard' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 has no tensorboard module: TensorBoard's EventAccumulator not checked here";
  fs::path dir = temp_dir("tensorboard_python");
  std::vector<std::string> o = {"model.name=test_tiny", "data.name=test_synth", "data.batch_size=8", "train.steps=8",
                                "train.log_every=2", "train.eval_every=4", "train.checkpoint_every=4", "optim.lr=0.05",
                                "train.tensorboard=true", "train.run_dir=" + dir.string()};
  run_train(parse_config("", "synth.yaml", o), {.progress = false});
  fs::remove(dir / "checkpoints" / "step_8.safetensors");
  o.push_back("train.resume=true");
  run_train(parse_config("", "synth.yaml", o), {.progress = false});
  std::string cmd = "python3 " + std::string(TG_SOURCE_DIR) + "/tests/scripts/tensorboard_read.py " + dir.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove_all(dir);
}

