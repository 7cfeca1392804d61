// The entry points behind the `tg` command, callable from tests and other programs:
// run_train (one experiment: run directory, observers, resume, training), info (build and
// device report), tokenize_file (`tg tokenize`) and tg_main (the commands, their arguments
// parsed by CLI11; returns the exit status, prints `error: ...`).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "launcher/trainer.h"

namespace tg::launcher {

struct RunOptions {
  bool progress = true;   // print progress to stdout (as train.progress says; false: none)
  bool tty = false;       // stdout is a terminal (train.progress=auto draws a bar there; set by tg_main)
  std::vector<std::string> command_line;  // recorded in run.json (tg_main: its argv)
};

// Chooses the run directory: train.run_dir, or runs/<config name>-<timestamp> (a free name).
// An existing non-empty directory is an error unless train.overwrite or train.resume; with
// train.resume it must exist. Touches nothing.
std::string choose_run_dir(const Config& cfg);
// choose_run_dir, then makes the directory (emptied first under train.overwrite).
std::string prepare_run_dir(const Config& cfg);

// Runs one experiment: prepares the run directory, writes config.yaml and run.json (a resume:
// config.resume-N.yaml and run.resume-N.json beside the earlier ones; run_record.h), attaches the
// observers (progress, metrics.jsonl, train.log, checkpoints), loads train.init_weights, resumes
// from the latest checkpoint when train.resume, trains, and returns the summary. An error that
// ends the run also goes into train.log once the directory is the run's (Note [errors reach
// train.log] in run.cpp).
TrainSummary run_train(const Config& cfg, const RunOptions& opt = {});

// `tg info`: build features, devices, memory pools, versions and knobs.
std::string info_text();

// `tg tokenize TEXT OUT.bin`: the text as llm.c token shards, at most shard_tokens a file
// (nn::write_token_shards): its bytes (byte-level tokenizer, vocabulary 256), or with bpe_dir
// GPT-2's BPE of the vocabulary there (nn::Gpt2Bpe, <|endoftext|> first). Returns the paths.
std::vector<std::string> tokenize_file(const std::string& text_path, const std::string& out_path,
                                       int64_t shard_tokens = 100'000'000, const std::string& bpe_dir = "");

// The whole command line: `tg train CONFIG [key=value ...]`, `tg config CONFIG [key=value ...]`,
// `tg keys`, `tg info`, `tg bench`, `tg tokenize TEXT OUT.bin`, `tg sample`, `tg help [COMMAND]`,
// `tg COMMAND --help`, `tg --version`. Errors print `error: ` and the whole message (details on
// indented lines after the first) to stderr and return 1.
int tg_main(int argc, char** argv);

}  // namespace tg::launcher
