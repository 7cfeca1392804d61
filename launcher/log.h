// The launcher's log lines, through spdlog: the console's (errors, warnings, `tg launch`'s
// notes) on stderr, and a run's train.log. Progress lines and command output stay on stdout.
#pragma once
#include <memory>
#include <string>

namespace spdlog {
class logger;
}

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

// A logger that appends "YYYY-MM-DD HH:MM:SS  TEXT" lines (local time) to the file at `path`,
// each flushed as it is written (train.log). Throws tg::Error when the file cannot be opened.
std::shared_ptr<spdlog::logger> file_log(const std::string& path);

}  // namespace tg::launcher
