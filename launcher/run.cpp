// run_train, the run directory, `tg info`, `tg tokenize` and the tg command's line: its commands
// and their arguments on CLI11 (see run.h).
#include "launcher/run.h"

#include "launcher/bench.h"
#include "launcher/launch.h"
#include "launcher/log.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "distributed/host_exchange.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "launcher/metric_sinks.h"
#include "launcher/observers.h"
#include "launcher/plot.h"
#include "launcher/rank_agreement.h"
#include "launcher/registry.h"
#include "launcher/run_record.h"
#include "launcher/sample.h"
#include "launcher/trace.h"
#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/multi.h"
#include "tinygrad/nn/bpe.h"
#include "tinygrad/nn/tokens.h"
#include "tinygrad/runtime/cpu.h"

namespace fs = std::filesystem;

namespace tg::launcher {

namespace {

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&now));
  return buf;
}

bool non_empty_dir(const fs::path& p) { return fs::is_directory(p) && !fs::is_empty(p); }

std::string value_text(const Value& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) {
    std::ostringstream os;
    os << *d;
    return os.str();
  }
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v)) return "\"" + *s + "\"";
  std::string out = "[";
  for (int64_t x : std::get<std::vector<int64_t>>(v)) out += (out.size() > 1 ? ", " : "") + std::to_string(x);
  return out + "]";
}

std::string keys_text() {
  std::ostringstream os;
  for (const auto& f : config_schema()) {
    std::string head = f.key + " (" + value_type_name(f.type) + ", " + value_text(f.default_value) + ")";
    os << "  " << head << std::string(head.size() < 52 ? 52 - head.size() : 1, ' ') << f.help << "\n";
  }
  return os.str();
}

// The key=value arguments after the config path, each checked to be one.
const std::vector<std::string>& checked_overrides(const std::vector<std::string>& args) {
  for (const auto& a : args)
    TG_CHECK(a.find('=') != std::string::npos, "unexpected argument '", a, "' (overrides are key=value, e.g. optim.lr=0.01)");
  return args;
}

// The N of `tg bench --reps=N`: a whole number from 1 to 1000000, or an error naming the value.
int parse_reps(const std::string& text) {
  int reps = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), reps);
  TG_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && reps > 0 && reps <= 1000000,
           "tg bench: --reps must be a whole number from 1 to 1000000, got '", text, "'");
  return reps;
}

// The N of `tg tokenize --shard-tokens=N`: a whole number from 1 to 2^31 - 1 (a shard's header
// counts its tokens in an int32).
int64_t parse_shard_tokens(const std::string& text) {
  int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  TG_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && n > 0 && n <= INT32_MAX,
           "tg tokenize: --shard-tokens must be a whole number from 1 to 2147483647, got '", text, "'");
  return n;
}

// Note [errors reach train.log]: an error that ends a run goes to stderr (tg_main) and, once the
// run directory is the run's own (a resumed run's from the start, a new run's once prepared),
// into its train.log too, whole (details on the lines after the first). A new run that fails
// before its directory is prepared leaves no directory behind, so it has no log to write to.
void log_error(const std::string& dir, const std::string& what) {
  try {
    TrainLog((fs::path(dir) / "train.log").string()).line("error: " + what);
  } catch (const std::exception&) {
    // the log is not writable: stderr has the error
  }
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  TG_CHECK(out.good(), "cannot write '", path.string(), "'");
}

// Rank 0's files of this start of the run: its resolved config and its record (run_record.h). A
// resume keeps the config and record of every earlier start and writes its own beside them.
void write_start_files(const std::string& dir, const Config& cfg, RunRecord record, Trainer& trainer,
                       const std::string& init, const std::string& resume_from) {
  RunFiles files = run_files(dir, cfg.get_bool("train.resume"));
  write_text(fs::path(dir) / files.config, "# resolved config of " + cfg.name + " (" + timestamp() + ")\n" + cfg.to_yaml());
  record.config_file = files.config;
  record.resume_index = files.resume_index;
  record.device_description = get_device(default_device()).description();
  if (!resume_from.empty()) record.initial_weights = {"checkpoint", resume_from, trainer.step()};
  else if (!init.empty()) record.initial_weights = {"file", init};
  else record.initial_weights = {"random"};
  write_text(fs::path(dir) / files.record, run_record_json(record, cfg));
}

// Rank 0's observers: checkpoints, progress, metrics.jsonl (and TensorBoard, metrics.csv), train.log.
void add_lead_observers(Trainer& trainer, const Config& cfg, const std::string& dir, ProgressMode progress) {
  const fs::path d(dir);
  // The checkpoint writer goes first, so that the others see its final checkpoint before the end.
  trainer.add_observer(std::make_shared<CheckpointWriter>());
  if (progress != ProgressMode::Off)
    trainer.add_observer(std::make_shared<ProgressPrinter>(stdout, progress == ProgressMode::Bar));
  auto metrics = std::make_shared<MetricsWriter>((d / "metrics.jsonl").string());
  if (cfg.get_bool("train.tensorboard")) metrics->add_sink(std::make_shared<TensorBoardSink>((d / "tensorboard").string()));
  if (cfg.get_bool("train.csv"))
    metrics->add_sink(std::make_shared<CsvSink>((d / "metrics.csv").string(), (d / "metrics.jsonl").string()));
  trainer.add_observer(metrics);
  trainer.add_observer(std::make_shared<TrainLog>((d / "train.log").string()));
}

}  // namespace

std::string choose_run_dir(const Config& cfg) {
  std::string dir = cfg.get_string("train.run_dir");
  if (dir.empty()) {
    std::string base = (fs::path("runs") / (cfg.name + "-" + timestamp())).string();
    dir = base;
    for (int i = 1; fs::exists(dir); i++) dir = base + "-" + std::to_string(i);  // never reuse one
  }
  if (cfg.get_bool("train.resume")) {
    TG_CHECK(fs::is_directory(dir), "train.resume=true: no run directory '", dir, "'");
    return dir;
  }
  if (non_empty_dir(dir) || (fs::exists(dir) && !fs::is_directory(dir))) {
    TG_CHECK(cfg.get_bool("train.overwrite"), "run directory '", dir,
             "' already exists (use train.overwrite=true to replace it or train.resume=true to continue it)");
  }
  return dir;
}

std::string prepare_run_dir(const Config& cfg) {
  std::string dir = choose_run_dir(cfg);
  if (cfg.get_bool("train.resume")) return dir;
  if (fs::exists(dir) && cfg.get_bool("train.overwrite")) fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TrainSummary run_train(const Config& cfg, const RunOptions& opt) {
  cfg.validate();
  // Everything that can fail on the user's input fails before the run directory is touched.
  const std::string& init = cfg.get_string("train.init_weights");
  TG_CHECK(init.empty() || fs::is_regular_file(init), "train.init_weights: no file '", init, "'");
  const ProgressMode progress = opt.progress ? progress_mode(cfg.get_string("train.progress"), opt.tty) : ProgressMode::Off;
  // distributed.strategy=ddp: every rank (of mpirun, tg launch or srun) trains; rank 0 alone
  // picks the run directory, writes into it and prints.
  std::unique_ptr<dist::ProcessGroup> group;
  if (cfg.get_string("distributed.strategy") != "none") {
    group = dist::world_group_for(cfg.get_string("distributed.backend"), group_device(cfg),
                                  dist::Seconds(cfg.get_float("distributed.timeout_s")),
                                  static_cast<int>(cfg.get_int("distributed.rdzv_port")));
    check_ranks_agree(*group, "config", config_agreement_text(cfg, *group));  // before anything else is exchanged
  }
  const bool lead = !group || group->rank() == 0;
  std::string dir = lead ? choose_run_dir(cfg) : std::string(), resume_from;
  if (group) dir = dist::broadcast_string(*group, dir);
  bool dir_is_ours = cfg.get_bool("train.resume");  // Note [errors reach train.log]
  std::optional<RunTrace> timeline;  // Note [trace files] in trace.h
  if (trace_requested(cfg))
    timeline.emplace(dir, group ? group->rank() : 0, group ? group->size() : 1, default_device());
  try {
    if (cfg.get_bool("train.resume")) {
      std::vector<std::string> passed_over;
      resume_from = latest_checkpoint(dir, &passed_over, /*verify_data=*/false);  // the load verifies what it reads
      if (lead)
        for (const auto& why : passed_over) log_note("resume: passing over " + why);
      TG_CHECK(!resume_from.empty(), "train.resume=true: no complete checkpoint in '", dir, "/checkpoints'",
               passed_over.empty() ? "" : " (" + std::to_string(passed_over.size()) + " passed over, reasons above)");
    }
    Trainer trainer(cfg, dir, group.get());  // loads the data and builds the model: fails before anything is written
    if (!init.empty()) trainer.load_weights(init);
    if (!resume_from.empty()) trainer.load_checkpoint(resume_from);
    RunRecord record{.command_line = opt.command_line, .config_name = cfg.name, .world_size = trainer.world_size()};
    record.devices = group ? dist::all_strings(*group, trainer.rank_devices()) : std::vector<std::string>{trainer.rank_devices()};
    if (!lead) {
      // zero1, fsdp: every rank writes its shard whenever rank 0 writes a checkpoint
      const std::string& strategy = cfg.get_string("distributed.strategy");
      if (strategy == "zero1" || strategy == "fsdp") trainer.add_observer(std::make_shared<CheckpointWriter>());
      return trainer.fit();
    }
    Config named = cfg;
    named.set("train.run_dir", dir);  // the directory chosen above, even when a second has passed since
    prepare_run_dir(named);
    dir_is_ours = true;
    write_start_files(dir, cfg, record, trainer, init, resume_from);
    add_lead_observers(trainer, cfg, dir, progress);
    return trainer.fit();
  } catch (const std::exception& e) {
    if (lead && dir_is_ours) log_error(dir, e.what());
    throw;
  }
}

std::vector<std::string> tokenize_file(const std::string& text_path, const std::string& out_path,
                                       int64_t shard_tokens, const std::string& bpe_dir) {
  std::string text = nn::read_text_file(text_path);
  std::vector<uint16_t> tokens =
      bpe_dir.empty() ? nn::byte_tokens(text) : nn::gpt2_document_tokens(nn::Gpt2Bpe::load(bpe_dir), text);
  return nn::write_token_shards(out_path, tokens, shard_tokens);
}

namespace {
// The tuples `tg info` says the collectives of: two virtual CPU devices, and the GPUs of this
// machine (one GPU: the one-device tuple, which takes the same path).
std::vector<std::vector<std::string>> info_tuples() {
  std::vector<std::vector<std::string>> out{{"CPU", "CPU:1"}};
  const auto built = registered_devices();
  if (std::find(built.begin(), built.end(), "CUDA") == built.end()) return out;
  std::vector<std::string> gpus;
  for (int i = 0; i < device_count("CUDA"); i++) gpus.push_back(i == 0 ? "CUDA" : "CUDA:" + std::to_string(i));
  if (!gpus.empty()) out.push_back(gpus);
  return out;
}

// The device pairs `tg info` says the copies of: two virtual CPU devices, the host and the first
// GPU, and every pair of GPUs (Note [copies between devices]).
std::vector<std::pair<std::string, std::string>> info_copy_pairs() {
  std::vector<std::pair<std::string, std::string>> out{{"CPU", "CPU:1"}};
  const auto tuples = info_tuples();
  if (tuples.size() < 2) return out;
  const auto& gpus = tuples[1];
  out.emplace_back("CPU", gpus[0]);
  for (size_t i = 0; i < gpus.size(); i++)
    for (size_t j = i + 1; j < gpus.size(); j++) out.emplace_back(gpus[i], gpus[j]);
  return out;
}
}  // namespace

std::string info_text() {
  std::ostringstream os;
  os << "tinygrad++ (tg) built " << __DATE__ << " with " <<
#if defined(__clang__)
      "clang " << __clang_version__
#elif defined(__GNUC__)
      "gcc " << __VERSION__
#else
      "an unknown compiler"
#endif
     << ", C++ " << __cplusplus << "\n";
  os << "libraries: yaml-cpp " << TG_YAML_CPP_VERSION << ", nlohmann-json " << NLOHMANN_JSON_VERSION_MAJOR << "."
     << NLOHMANN_JSON_VERSION_MINOR << "." << NLOHMANN_JSON_VERSION_PATCH << "\n";
  os << "CPU kernels: " << cpu_compiler_kind() << " (LLVM backend " << (built_with_llvm() ? "built" : "not built") << ")\n";
  os << "default device: " << default_device() << "\n";
  os << "devices:\n";
  for (const auto& name : registered_devices()) {
    os << "  " << name;
    try {
      Device& d = get_device(name);
      os << ": " << d.description() << "\n";
      PoolStats s = d.pool().stats();
      os << "    memory pool: " << s.bytes_in_use << " B in use, peak " << s.peak_bytes << " B, " << s.bytes_cached
         << " B cached, " << s.allocations << " allocations, " << s.reuse_hits << " reuse hits\n";
    } catch (const std::exception& e) {
      os << ": unavailable (" << e.what() << ")\n";
    }
  }
  os << "collectives between the devices of a process (Note [collectives through a device library]):\n";
  for (const auto& tuple : info_tuples()) {
    os << "  " << join_devices(tuple) << ": ";
    try {
      os << tuple_collectives(tuple).describe() << "\n";
    } catch (const std::exception& e) {
      os << "unavailable (" << e.what() << ")\n";
    }
  }
  os << "copies between the devices of a process (Note [copies between devices]):\n";
  for (const auto& [src, dst] : info_copy_pairs()) {
    os << "  " << src << " -> " << dst << ": ";
    try {
      os << describe_copy(src, dst) << "\n";
    } catch (const std::exception& e) {
      os << "unavailable (" << e.what() << ")\n";
    }
  }
  os << "process-group backends:";
  for (const auto& b : dist::built_backends()) os << " " << b;
  os << "\nNCCL: " << dist::nccl_status() << "\n";
  os << "rendezvous store: " << (dist::built_with_store() ? "built" : "not built (needs Boost.Asio and OpenSSL)") << "\n";
  os << "models:";
  for (const auto& n : model_registry().names()) os << " " << n;
  os << "\ndatasets:";
  for (const auto& n : dataset_registry().names()) os << " " << n;
  os << "\nknobs (environment variables):\n";
  for (const auto& k : all_knobs()) {
    const char* env = std::getenv(k.name.c_str());
    os << "  " << k.name << "=" << (env ? env : k.default_value) << (env ? "" : " (default)") << "  " << k.help << "\n";
  }
  return os.str();
}

namespace {

// Note [tg's command line]: each command of `tg` is a row of commands(): its name, its usage
// line, a line of help, and `define`, which adds the command's positionals and options (with
// their help) to a CLI11 app and returns what runs the command once CLI11 has parsed them.
// tg_main picks the row by argv[1] and parses the rest with CLI11, so every command has
// `tg help COMMAND` and `tg COMMAND --help`, an argument no command takes is an error (CLI11's
// message, the command and its usage), and `--key value` and `--key=value` both work. Numbers
// are taken as text and parsed by the command, so that an error names the option and the value
// (`tg bench: --reps must be a whole number from 1 to 1000000, got 'abc'`). A command that
// parses its own arguments (a launcher passing a whole command line on) gives `own_main`
// instead of `define` and receives argv from its first argument on; its row is all it needs.
using Runner = std::function<int(const std::vector<std::string>& command_line)>;

struct Command {
  std::string name, usage, summary;
  std::function<Runner(CLI::App&)> define;
  int (*own_main)(int argc, char** argv, int first) = nullptr;
};

Runner define_train(CLI::App& app, bool train) {
  auto config = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  app.add_option("CONFIG", *config, "the experiment's YAML config (configs/*.yaml)")->required();
  app.add_option("OVERRIDES", *overrides,
                 "key=value overrides of config keys (tg keys lists them), e.g. optim.lr=3e-4 train.steps=300; "
                 "a key's last part alone where it is unique: lr=3e-4");
  app.footer("The config keys, their types and defaults: tg keys. Example: tg train configs/fmnist_mlp.yaml lr=3e-4 "
             "train.steps=300 train.tensorboard=true");
  return [=](const std::vector<std::string>& command_line) {
    const std::vector<std::string>& checked = checked_overrides(*overrides);
    Config cfg = restarted_config(load_config(*config, checked));
    if (!train) {
      std::cout << cfg.to_yaml();
      return 0;
    }
    check_strategy_fits_launch(cfg);  // the command's check: tests train ranks both ways in one job
    RunOptions opt;
    opt.tty = isatty(fileno(stdout)) != 0;
    opt.command_line = command_line;
    TrainSummary s;
    try {
      s = run_train(cfg, opt);
    } catch (...) {
      if (progress_mode(cfg.get_string("train.progress"), opt.tty) == ProgressMode::Bar)
        std::fputs("\n", stdout);  // end a progress bar line before the error
      throw;
    }
    if (dist::env_rank() == 0) std::cout << "run directory: " << s.run_dir << "\n";  // rank 0 alone prints
    return 0;
  };
}

Runner define_no_arguments(const std::function<std::string()>& text) {
  return [text](const std::vector<std::string>&) {
    std::cout << text();
    return 0;
  };
}

Runner define_bench(CLI::App& app) {
  auto reps = std::make_shared<std::string>("10");
  auto names = std::make_shared<std::vector<std::string>>();
  app.add_option("--reps", *reps, "timed repetitions of each workload, 1 to 1000000 (default 10)")->type_name("N");
  app.add_option("WORKLOAD", *names, "workloads to time (default: all of them)");
  return [=](const std::vector<std::string>&) {
    const int n = parse_reps(*reps);
    for (auto& name : names->empty() ? default_bench_names() : *names)
      for (auto& r : run_bench({name}, n)) std::cout << bench_json(r) << std::endl;
    return 0;
  };
}

Runner define_tokenize(CLI::App& app) {
  auto text = std::make_shared<std::string>(), out = std::make_shared<std::string>();
  auto shard_tokens = std::make_shared<std::string>(std::to_string(nn::TOKEN_SHARD_DEFAULT_TOKENS));
  app.add_option("TEXT", *text, "a UTF-8 text file, plain or gzipped")->required();
  app.add_option("OUT", *out, "the token shard to write (OUT_000000.bin, OUT_000001.bin, ... past --shard-tokens)")
      ->required();
  auto bpe = std::make_shared<std::string>();
  app.add_option("--shard-tokens", *shard_tokens, "tokens per shard file, 1 to 2^31 - 1 (default 10^8)")->type_name("N");
  app.add_option("--bpe", *bpe,
                 "GPT-2's BPE with the vocabulary in DIR (vocab.json and merges.txt, or encoder.json and vocab.bpe); "
                 "<|endoftext|> first")
      ->type_name("DIR");
  app.footer("Byte-level (token = byte, vocabulary 256), or GPT-2 BPE with --bpe=DIR. Past N tokens: "
             "OUT_000000.bin, OUT_000001.bin, ...");
  return [=](const std::vector<std::string>&) {
    for (const auto& p : tokenize_file(*text, *out, parse_shard_tokens(*shard_tokens), *bpe))
      std::cout << "wrote " << nn::TokenShard(p).size() << " tokens to " << p << "\n";
    return 0;
  };
}

Runner define_sample(CLI::App& app) {
  auto args = std::make_shared<SampleArgs>();
  define_sample_options(app, *args);
  return [=](const std::vector<std::string>&) {
    SampleRequest r = sample_request(*args);
    std::cout << r.prompt << sample_text(r) << std::endl;
    return 0;
  };
}

// `--metric loss,val_loss`: the names, none empty.
std::vector<std::string> metric_list(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::stringstream ss(text);
  for (std::string name; std::getline(ss, name, ',');) {
    TG_CHECK(!name.empty(), "tg plot: --metric '", text, "' has an empty name (metrics are separated by one comma)");
    out.push_back(name);
  }
  TG_CHECK(text.back() != ',', "tg plot: --metric '", text, "' has an empty name (metrics are separated by one comma)");
  return out;
}

Runner define_plot(CLI::App& app) {
  auto req = std::make_shared<PlotRequest>();
  auto metrics = std::make_shared<std::string>();
  app.add_option("RUN_DIR", req->run_dirs, "run directories of tg train (their metrics.jsonl), one curve each")->required();
  app.add_option("--metric", *metrics,
                 "metrics to draw, one panel each, e.g. loss,val_loss,tokens_per_s (default: loss, val_loss and "
                 "eval_accuracy, those the runs have)")
      ->type_name("M[,M...]");
  app.add_option("-o,--output", req->out, "the picture: FILE.png or FILE.svg (default plot.png)")->type_name("FILE");
  app.footer("x: the step; each run's curves in its colour, labelled by the run directory's name. Needs a build with "
             "cairo (libcairo2-dev).");
  return [=](const std::vector<std::string>&) {
    req->metrics = metric_list(*metrics);
    std::vector<std::string> drawn = plot_runs(*req);
    std::string names;
    for (const auto& m : drawn) names += (names.empty() ? "" : ", ") + m;
    std::cout << "wrote " << req->out << " (" << names << " of " << req->run_dirs.size() << " run"
              << (req->run_dirs.size() == 1 ? "" : "s") << ")\n";
    return 0;
  };
}

// The N of `tg trace plot --step=N`: a whole number from 1 on.
int64_t parse_step(const std::string& text) {
  int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  TG_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && n > 0,
           "tg trace plot: --step must be a whole number from 1, got '", text, "'");
  return n;
}

Runner define_trace(CLI::App& app) {
  auto dir = std::make_shared<std::string>(), out = std::make_shared<std::string>();
  auto step = std::make_shared<std::string>();
  app.require_subcommand(1);
  CLI::App* merge = app.add_subcommand("merge", "join the ranks' timelines (RUN_DIR/trace.rank<R>.json of the newest "
                                                "traced start) into one file that Perfetto opens");
  merge->add_option("RUN_DIR", *dir, "a run directory of tg train with train.trace=true (or TRACE=1)")->required();
  merge->add_option("-o,--output", *out, "the merged file (default RUN_DIR/trace.json)")->type_name("FILE");
  CLI::App* plot = app.add_subcommand("plot", "draw one step of the ranks' timelines (a lane per thread or stream) "
                                              "into a PNG or SVG (needs cairo)");
  plot->add_option("RUN_DIR", *dir, "a run directory of tg train with train.trace=true (or TRACE=1)")->required();
  plot->add_option("--step", *step, "the step to draw (default: the last one traced)")->type_name("N");
  plot->add_option("-o,--output", *out, "the picture: FILE.png or FILE.svg (default trace.png)")->type_name("FILE");
  app.footer("Record a timeline with tg train ... train.trace=true (or TRACE=1): each rank writes "
             "RUN_DIR/trace.rank<R>.json. Open the merged file in https://ui.perfetto.dev or chrome://tracing.");
  return [=](const std::vector<std::string>&) {
    if (plot->parsed()) {
      const std::string path = out->empty() ? "trace.png" : *out;
      std::string title = plot_trace(*dir, step->empty() ? 0 : parse_step(*step), path);
      std::cout << "wrote " << path << " (" << title << ")\n";
      return 0;
    }
    MergedTrace m = merge_traces(*dir, *out);
    for (const auto& note : m.notes) std::cerr << "tg trace: " << note << "\n";
    std::cout << "wrote " << m.path << " (" << m.events << " events of " << m.ranks << " rank"
              << (m.ranks == 1 ? "" : "s") << ")\n";
    return 0;
  };
}

const std::vector<Command>& commands() {
  static const std::vector<Command> all = {
      {"train", "tg train CONFIG.yaml [key=value ...]", "train an experiment (e.g. optim.lr=0.01 train.steps=300)",
       [](CLI::App& app) { return define_train(app, true); }},
      {"config", "tg config CONFIG.yaml [key=value ...]", "print the resolved config (defaults, file, overrides)",
       [](CLI::App& app) { return define_train(app, false); }},
      {"keys", "tg keys", "list every config key with its type, default and help",
       [](CLI::App&) { return define_no_arguments([] { return "config keys (type, default):\n" + keys_text(); }); }},
      {"info", "tg info", "build features, devices, memory pools, versions, knobs",
       [](CLI::App&) { return define_no_arguments(info_text); }},
      {"bench", "tg bench [--reps=N] [WORKLOAD ...]", "time the benchmark workloads (JSON lines; all by default)",
       define_bench},
      {"tokenize", "tg tokenize TEXT OUT.bin [--shard-tokens=N] [--bpe=DIR]",
       "a UTF-8 text (plain or gzipped) as llm.c token shards (byte-level or GPT-2 BPE) for data.name=tokens",
       define_tokenize},
      {"sample", SAMPLE_USAGE, "continue a prompt with a trained gpt run's newest checkpoint (byte-level runs)",
       define_sample},
      {"plot", "tg plot RUN_DIR... [--metric loss,val_loss,tokens_per_s] [-o FILE.png|FILE.svg]",
       "draw runs' metrics (one panel per metric, x: step) into a PNG or SVG", define_plot},
      {"trace", "tg trace merge RUN_DIR [-o FILE] | tg trace plot RUN_DIR [--step N] [-o FILE.png|FILE.svg]",
       "join the ranks' timelines of a run (train.trace=true) into one Chrome-trace file, or draw a step of them",
       define_trace},
      {"launch", "tg launch --nproc-per-node N [--nnodes M --node-rank K --rdzv HOST:PORT] [--max-restarts R] -- CMD ARGS...",
       "start N workers (e.g. tg train ...) with their ranks; tg launch --help", nullptr, launch_main},
  };
  return all;
}

const Command* find_command(const std::string& name) {
  for (const auto& c : commands())
    if (c.name == name) return &c;
  return nullptr;
}

std::string command_names() {
  std::string out;
  for (const auto& c : commands()) out += c.name + ", ";
  return out + "help";
}

std::string usage_text() {
  std::ostringstream os;
  os << "usage: tg <command> [args]   (tg help COMMAND or tg COMMAND --help: its arguments; tg --version)\n";
  for (const auto& c : commands()) {
    os << "  " << c.usage;
    if (c.usage.size() < 40) os << std::string(41 - c.usage.size(), ' ') << c.summary << "\n";
    else os << "\n" << std::string(43, ' ') << c.summary << "\n";
  }
  os << "  tg help [COMMAND]" << std::string(41 - 17, ' ') << "this text, or a command's arguments\n";
  return os.str();
}

// A command's CLI11 app: its line of help, its usage and its arguments.
std::string app_description(const Command& c) { return c.summary; }

// `--reps=` with nothing after the `=`: CLI11 would take the next argument as the value.
void check_no_empty_values(const Command& c, int argc, char** argv) {
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--") break;
    TG_CHECK(!(a.rfind("--", 0) == 0 && a.back() == '='), "tg ", c.name, ": ", a, " has no value (usage: ", c.usage,
             "; tg help ", c.name, ")");
  }
}

// `tg help COMMAND`: its arguments and options.
int print_command_help(const std::string& name, char** argv) {
  const Command* c = find_command(name);
  TG_CHECK(c, "tg help: unknown command '", name, "' (commands: ", command_names(), ")");
  if (c->own_main) {
    std::string command = name, flag = "--help";
    std::vector<char*> args = {argv[0], command.data(), flag.data()};
    return c->own_main(3, args.data(), 2);
  }
  CLI::App app{app_description(*c), "tg " + name};
  c->define(app);
  std::cout << app.help();
  return 0;
}

}  // namespace

int tg_main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd.empty() || cmd == "help" || cmd == "--help" || cmd == "-h") {
      if (cmd == "help" && argc > 2) return print_command_help(argv[2], argv);
      std::cout << usage_text();
      return cmd.empty() ? 1 : 0;
    }
    if (cmd == "--version") {
      std::cout << version_text();
      return 0;
    }
    const Command* c = find_command(cmd);
    TG_CHECK(c, "unknown command '", cmd, "' (commands: ", command_names(), ")");
    if (c->own_main) return c->own_main(argc, argv, 2);
    check_no_empty_values(*c, argc, argv);
    CLI::App app{app_description(*c), "tg " + cmd};
    Runner run = c->define(app);
    try {
      app.parse(argc - 1, argv + 1);  // argv[1], the command, stands for the program name
    } catch (const CLI::CallForHelp&) {
      std::cout << app.help();
      return 0;
    } catch (const CLI::ParseError& e) {
      TG_FAIL("tg ", cmd, ": ", e.what(), " (usage: ", c->usage, "; tg help ", cmd, ")");
    }
    return run(std::vector<std::string>(argv, argv + argc));
  } catch (const std::exception& e) {
    // The whole message: some errors list their details on indented lines after the first
    // (load_state_dict's missing and unexpected keys, the ranks that disagree).
    log_error(e.what());
    return 1;
  } catch (...) {
    log_error("unexpected failure (not a std::exception)");
    return 1;
  }
}

}  // namespace tg::launcher
