// `tg sample RUN_DIR`: text from a trained GPT run. The run's config.yaml gives the model's shape,
// its newest complete checkpoint the weights (vocabulary and context length from their shapes),
// and nn::generate continues the prompt through the KV cache.
#pragma once
#include <string>

#include "tinygrad/nn/gpt.h"

namespace CLI {
class App;
}

namespace tg::launcher {

struct SampleRequest {
  std::string run_dir;
  std::string prompt;  // text, encoded by the run's tokenizer (byte-level: vocabulary 256)
  nn::SampleOptions options;
  std::string bpe_dir;  // GPT-2 BPE's vocabulary (vocab.json + merges.txt) for runs on BPE tokens
};

// The generated text (the prompt not repeated). The tokenizer is bytes for a vocabulary of 256,
// else GPT-2's BPE from request.bpe_dir (the files `tg tokenize --bpe` used). Errors name the run
// directory and what is missing: a config.yaml, a model other than gpt, a complete checkpoint, a
// tokenizer for the run's vocabulary.
std::string sample_text(const SampleRequest& request);

// The arguments of `tg sample` as typed; sample_request parses the numbers (an error names the
// option and the text).
struct SampleArgs {
  std::string run_dir, prompt, tokens, temperature, top_k, seed, bpe;
};
extern const char* SAMPLE_USAGE;  // "tg sample RUN_DIR --prompt TEXT [--tokens N] ..."
// Adds `tg sample`'s positional and options (with their help) to a CLI11 app, bound to `args`.
void define_sample_options(CLI::App& app, SampleArgs& args);
SampleRequest sample_request(const SampleArgs& args);

// `tg sample RUN_DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S] [--bpe DIR]`
// (each also as --key=value) from argv[first] on, through CLI11: the request, or an error naming
// the bad argument and the usage.
SampleRequest parse_sample_args(int argc, char** argv, int first);

}  // namespace tg::launcher
