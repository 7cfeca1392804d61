// `tg sample RUN_DIR`: text from a trained GPT run. The run's config.yaml gives the model's shape,
// its newest complete checkpoint the weights (vocabulary and context length from their shapes),
// and nn::generate continues the prompt through the KV cache.
#pragma once
#include <string>

#include "tinygrad/nn/gpt.h"

namespace tg::launcher {

struct SampleRequest {
  std::string run_dir;
  std::string prompt;  // text, encoded by the run's tokenizer (byte-level: vocabulary 256)
  nn::SampleOptions options;
};

// The generated text (the prompt not repeated). Errors name the run directory and what is
// missing: a config.yaml, a model other than gpt, a complete checkpoint, a tokenizer for the
// run's vocabulary.
std::string sample_text(const SampleRequest& request);

// `tg sample RUN_DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S]`
// (each also as --key=value): the request, or an error naming the bad argument.
SampleRequest parse_sample_args(int argc, char** argv, int first);

}  // namespace tg::launcher
