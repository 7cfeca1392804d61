// What a run directory records about the run itself, beside its metrics: the build (version,
// git commit, features), run.json (command line, host, devices of every rank, precision, world
// size, where the initial weights came from) and the names a resumed run writes under so that
// nothing of an earlier run is overwritten (config.resume-N.yaml, run.resume-N.json). Also how
// progress is shown (train.progress) and whether a launcher such as mpirun started this process.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "launcher/config.h"

namespace tg::launcher {

// The version of tinygrad++ ("0.13.0") and the git commit of the build (`git describe` at
// configure time, "unknown" outside a git checkout).
std::string build_version();
std::string build_commit();
// The features this build has, one short line each ("CPU kernels: LLVM ORC JIT", ...).
std::vector<std::string> build_features();
// `tg --version`: "tinygrad++ 0.13.0 (commit ...)" and the features, one per line.
std::string version_text();

// True when a launcher started this process as one of several (mpirun: OMPI_COMM_WORLD_SIZE,
// tg launch: TG_WORLD_SIZE, Slurm: SLURM_NTASKS; PMI_SIZE of other MPI launchers).
bool started_by_launcher();

enum class ProgressMode { Off, Bar, Plain };
// train.progress (auto | bar | plain | off) on this process: auto is a bar on a terminal and plain
// lines otherwise, and plain under a launcher (Note [progress under a launcher] in run_record.cpp).
ProgressMode progress_mode(const std::string& setting, bool stdout_is_tty);

// The names one start of a run writes its config and record under: config.yaml and run.json for
// the first, config.resume-N.yaml and run.resume-N.json for its N-th resume (N: the first free).
struct RunFiles {
  int resume_index = 0;  // 0: the first start of the run
  std::string config, record;
};
RunFiles run_files(const std::string& run_dir, bool resume);

// Where the model's first weights came from, for run.json.
struct InitialWeights {
  std::string source;  // "random" (train.seed), "file" (train.init_weights) or "checkpoint" (resume)
  std::string path;
  int64_t step = 0;  // a checkpoint's step
};

// One start of a run, as run.json records it.
struct RunRecord {
  std::vector<std::string> command_line;  // argv as given (empty when run_train was called directly)
  std::string config_name, config_file;   // the config's name; the resolved config written beside
  int resume_index = 0;
  std::vector<std::string> devices;  // each rank's devices (comma-separated: Trainer::rank_devices), rank 0 first
  std::string device_description;    // rank 0's device, described
  int world_size = 1;
  InitialWeights initial_weights;
};
// The record as JSON text (pretty-printed), with the start time, host, working directory, version,
// commit and build features added, and the run's precision, strategy and seed from the config.
std::string run_record_json(const RunRecord& r, const Config& cfg);

}  // namespace tg::launcher
