// `tg train` under mpirun with a different command line per rank (MPMD: `mpirun -np 1 tg ... :
// -np 1 tg ...`): ranks whose configs differ (model.hidden, the model, the learning rate, the
// batch size) are refused before they train, with a non-zero exit status and a message naming
// the key on every rank (Note [ranks agree before they train] in launcher/rank_agreement.cpp);
// ranks that differ only in a per-rank key train. Each rank's stderr and exit status go to files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct RankResult {
  int exit_status = -1;
  std::string stderr_text;
};

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs rank 0 with `rank0_args` and rank 1 with `rank1_args` (after the shared arguments) and
// returns what each left.
std::vector<RankResult> run_two_ranks(const std::string& name, const std::string& rank0_args, const std::string& rank1_args) {
  fs::path dir = fs::temp_directory_path() / ("tg_test_rank_agreement_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string shared = std::string(TG_BIN) + " train " + TG_SOURCE_DIR + "/configs/fmnist_mlp.yaml" +
                             " distributed.strategy=ddp train.steps=2 train.eval_every=1000 data.eval_batch_size=5000" +
                             " train.run_dir=" + (dir / "run").string();
  auto rank = [&](const std::string& args) {
    return "-np 1 sh -c 'set -f; " + shared + " " + args + " 2>" + dir.string() + "/rank$OMPI_COMM_WORLD_RANK.err >/dev/null; echo $? >" +
           dir.string() + "/rank$OMPI_COMM_WORLD_RANK.rc'";
  };
  std::string cmd = "timeout 120 " + std::string(MPIEXEC) + " --oversubscribe " + rank(rank0_args) + " : " + rank(rank1_args) +
                    " >" + dir.string() + "/mpirun.out 2>&1";
  int rc = std::system(cmd.c_str());
  EXPECT_NE(WEXITSTATUS(rc), 124) << "mpirun timed out: " << cmd;
  std::vector<RankResult> out(2);
  for (int r = 0; r < 2; r++) {
    std::string status = read(dir / ("rank" + std::to_string(r) + ".rc"));
    out[static_cast<size_t>(r)] = {status.empty() ? -1 : std::stoi(status), read(dir / ("rank" + std::to_string(r) + ".err"))};
  }
  fs::remove_all(dir);
  return out;
}

// Both ranks exit 1 and name the difference, on a line that names the rank (Note [rank prefixes]
// in launcher/log.cpp) with the details after it.
void expect_refused(const std::vector<RankResult>& ranks, const std::string& difference) {
  for (int r = 0; r < 2; r++) {
    const RankResult& rr = ranks[static_cast<size_t>(r)];
    EXPECT_EQ(rr.exit_status, 1) << "rank " << r << ": " << rr.stderr_text;
    EXPECT_NE(rr.stderr_text.find("[rank " + std::to_string(r) + "] error: the ranks disagree on the config before training: rank 1 differs from rank 0 "
                                  "(this is rank " + std::to_string(r) + " of 2)\n  " + difference + "\n"),
              std::string::npos)
        << "rank " << r << ": " << rr.stderr_text;
  }
}

}  // namespace

TEST(RankAgreement, DifferentHiddenWidthsAreRefusedOnEveryRank) {
  expect_refused(run_two_ranks("hidden", "model.hidden=[256]", "model.hidden=[128]"),
                 "model.hidden: [128] on rank 1, [256] on rank 0");
}

TEST(RankAgreement, MlpAgainstCnnIsRefusedOnEveryRank) {
  expect_refused(run_two_ranks("model", "model.name=mlp", "model.name=cnn"), "model.name: \"cnn\" on rank 1, \"mlp\" on rank 0");
}

TEST(RankAgreement, DifferentLearningRatesAreRefusedOnEveryRank) {
  expect_refused(run_two_ranks("lr", "optim.lr=0.001", "optim.lr=0.01"), "optim.lr: 0.01 on rank 1, 0.001 on rank 0");
}

TEST(RankAgreement, DifferentBatchSizesAreRefusedUnderZero1) {
  expect_refused(run_two_ranks("batch", "distributed.strategy=zero1 data.batch_size=128",
                               "distributed.strategy=zero1 data.batch_size=64"),
                 "data.batch_size: 64 on rank 1, 128 on rank 0");
}

// train.run_dir is rank 0's alone (Note [keys that may differ per rank]): the ranks train.
TEST(RankAgreement, PerRankKeysMayDiffer) {
  auto ranks = run_two_ranks("per_rank", "model.hidden=[32]", "model.hidden=[32] train.run_dir=/nonexistent/ignored");
  for (int r = 0; r < 2; r++)
    EXPECT_EQ(ranks[static_cast<size_t>(r)].exit_status, 0) << "rank " << r << ": " << ranks[static_cast<size_t>(r)].stderr_text;
}
