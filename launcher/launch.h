// `tg launch`: starts the worker processes of a job on this node, the way torchrun does, without
// MPI. It serves (node rank 0) or joins the rendezvous store (distributed/store.h), gives each
// worker its rank through the environment, prefixes its output lines with the rank, stops the
// whole group when one worker fails (naming it, how it ended and its last lines), restarts the
// group up to --max-restarts times, and passes SIGINT / SIGTERM on to every worker.
#pragma once
#include <string>
#include <vector>

#include "launcher/config.h"

namespace tg::launcher {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv;            // HOST:PORT of the store (node 0 serves it there); "" on one node
  std::string run_id = "tg";   // the store's key prefix
  int max_restarts = 0;
  double grace_s = 5.0;        // SIGTERM, then SIGKILL after this long
  double rdzv_timeout_s = 300.0;  // how long the nodes wait for each other
  std::vector<std::string> command;  // what every worker runs (after `--`)
};

// Parses `tg launch` arguments from argv[first] on; an error names the bad argument.
LaunchOptions parse_launch_args(int argc, char** argv, int first);
// Runs the job; returns the launcher's exit status (0, or the failed worker's code, or 128 + the
// signal that ended it or the launcher).
int run_launch(const LaunchOptions& opt);

// Note [restarts resume]: a restarted group (TG_RESTART_COUNT > 0, set by `tg launch`) must not
// start over nor refuse the run directory its first attempt made. So `tg train` under a restart
// with train.run_dir set continues from that directory's latest complete checkpoint
// (train.resume=true), or starts it afresh (train.overwrite=true) when no checkpoint was
// complete yet. The user sets train.run_dir (and train.checkpoint_every for anything to resume
// from); without train.run_dir every attempt makes a run directory of its own.
Config restarted_config(const Config& cfg);

// Note [a strategy that fits the launch]: distributed.strategy=none in a process that is one of
// several ranks (mpirun -np 2 tg train ...) would train the same model twice, racing for one run
// directory; ddp or zero1 in a process that no launcher started has nobody to exchange gradients
// with. Both are errors that say what to do, raised before anything is touched.
void check_strategy_fits_launch(const Config& cfg);

extern const char* LAUNCH_USAGE;
// `tg launch ARGS...` from argv[first] on (--help prints LAUNCH_USAGE): parse, then run.
int launch_main(int argc, char** argv, int first);

}  // namespace tg::launcher
