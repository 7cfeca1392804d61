// The launcher's log lines, through spdlog (or, in a build without it, plain stdio writing the
// same lines): the console's (errors, warnings, `tg launch`'s notes) on stderr, and a run's
// train.log. Progress lines and command output stay on stdout.
#pragma once
#include <memory>
#include <string>

namespace tg::launcher {

// "[rank N] " where a launcher that does not mark its ranks' lines itself started this process
// as rank N (mpirun: OMPI_COMM_WORLD_RANK, srun: SLURM_PROCID, other MPI launchers: PMI_RANK);
// "" in a single process and under `tg launch`, which marks every line of its workers with the
// same prefix (Note [rank prefixes]).
std::string rank_prefix();

// One line (or several: a message with details on indented lines goes out whole) on stderr,
// after rank_prefix(): log_error writes "error: TEXT", log_note TEXT. Stdout is flushed first, so
// what was printed before the line comes before it.
void log_error(const std::string& text);
void log_note(const std::string& text);

// Appends "YYYY-MM-DD HH:MM:SS  TEXT" lines (local time) to the file at `path`, each flushed as
// it is written (train.log). The constructor throws tg::Error when the file cannot be opened.
class FileLog {
 public:
  explicit FileLog(const std::string& path);
  ~FileLog();
  FileLog(const FileLog&) = delete;
  FileLog& operator=(const FileLog&) = delete;
  void line(const std::string& text);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tg::launcher
