// `tg sample` (see sample.h).
#include "launcher/sample.h"

#include <CLI/CLI.hpp>
#include <charconv>
#include <filesystem>

#include "launcher/config.h"
#include "launcher/trainer.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/bpe.h"
#include "tinygrad/nn/state.h"

namespace fs = std::filesystem;

namespace tg::launcher {

namespace {

constexpr int64_t BYTE_VOCABULARY = 256;

// The model as the run trained it: sizes from config.yaml and the weights' shapes.
std::unique_ptr<nn::GPT> trained_model(const std::string& run_dir) {
  fs::path cfg_path = fs::path(run_dir) / "config.yaml";
  TG_CHECK(fs::is_regular_file(cfg_path), "tg sample: '", run_dir, "' has no config.yaml (not a run directory of tg train)");
  Config cfg = load_config(cfg_path.string());
  TG_CHECK(cfg.get_string("model.name") == "gpt", "tg sample: the run in '", run_dir, "' trained model '",
           cfg.get_string("model.name"), "'; sampling needs model.name=gpt");
  std::string checkpoint = latest_checkpoint(run_dir);
  TG_CHECK(!checkpoint.empty(), "tg sample: '", run_dir, "' has no complete checkpoint in checkpoints/");
  nn::StateDict weights;
  for (auto& [key, value] : nn::safe_load(checkpoint))
    if (key.rfind("model.", 0) == 0) weights.emplace(key.substr(6), value);
  auto shape_of = [&](const std::string& key) {
    auto it = weights.find(key);
    TG_CHECK(it != weights.end() && it->second.ndim() == 2, "tg sample: checkpoint '", checkpoint, "' has no 2-d ", key);
    return it->second.shape();
  };
  nn::GPTConfig g;
  g.vocab_size = shape_of("transformer.wte.weight")[0];
  g.block_size = shape_of("transformer.wpe.weight")[0];
  g.n_layer = cfg.get_int("model.n_layer");
  g.n_head = cfg.get_int("model.n_head");
  g.n_embd = cfg.get_int("model.n_embd");
  auto model = std::make_unique<nn::GPT>(g);
  model->load_state_dict(weights);
  return model;
}

int64_t whole_number(const std::string& flag, const std::string& text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  TG_CHECK(ec == std::errc() && end == text.data() + text.size() && v >= 0, "tg sample: ", flag,
           " must be a whole number >= 0, got '", text, "'");
  return v;
}

double real_number(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  TG_CHECK(used == text.size() && v >= 0, "tg sample: ", flag, " must be a number >= 0, got '", text, "'");
  return v;
}

// A run on GPT-2 BPE tokens: the prompt encoded, only the tokenizer's ids drawn (the model's
// vocabulary may be padded past them), the new tokens decoded.
std::string sample_bpe_text(nn::GPT& model, const SampleRequest& r) {
  nn::Gpt2Bpe bpe = nn::Gpt2Bpe::load(r.bpe_dir);
  auto size = static_cast<int64_t>(bpe.vocab_size());
  TG_CHECK(size <= model.config.vocab_size, "tg sample: the BPE vocabulary in '", r.bpe_dir, "' has ", size,
           " tokens, more than the run's model (", model.config.vocab_size, ")");
  std::vector<int32_t> prompt = bpe.encode(r.prompt);
  TG_CHECK(!prompt.empty(), "tg sample: the prompt is empty");
  nn::SampleOptions options = r.options;
  options.vocabulary = size;
  return bpe.decode(nn::generate(model, prompt, options));
}

}  // namespace

std::string sample_text(const SampleRequest& r) {
  auto model = trained_model(r.run_dir);
  if (!r.bpe_dir.empty()) return sample_bpe_text(*model, r);
  TG_CHECK(model->config.vocab_size == BYTE_VOCABULARY, "tg sample: the run's vocabulary has ",
           model->config.vocab_size, " tokens, not the 256 of a byte-level run: give the GPT-2 BPE vocabulary "
           "it was tokenized with as --bpe DIR (vocab.json and merges.txt)");
  std::vector<int32_t> prompt;
  for (unsigned char c : r.prompt) prompt.push_back(c);
  std::string out;
  for (int32_t t : nn::generate(*model, prompt, r.options)) out.push_back(static_cast<char>(t));
  return out;
}

const char* SAMPLE_USAGE =
    "tg sample RUN_DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S] [--bpe DIR]";

void define_sample_options(CLI::App& app, SampleArgs& a) {
  app.add_option("RUN_DIR", a.run_dir, "a run directory of tg train with a gpt model")->required();
  app.add_option("--prompt", a.prompt, "the text to continue")->required();
  app.add_option("--tokens", a.tokens, "how many tokens to generate (default 100)")->type_name("N");
  app.add_option("--temperature", a.temperature, "softmax temperature, >= 0 (0: always the most likely; default 1)")->type_name("T");
  app.add_option("--top-k", a.top_k, "sample among the K most likely tokens only (default 0: all)")->type_name("K");
  app.add_option("--seed", a.seed, "random seed (one seed, one text; default 0)")->type_name("S");
  app.add_option("--bpe", a.bpe, "GPT-2 BPE vocabulary (vocab.json, merges.txt) of a run on BPE tokens "
                 "(default: bytes, for runs with a vocabulary of 256)")->type_name("DIR");
}

SampleRequest sample_request(const SampleArgs& a) {
  SampleRequest r{a.run_dir, a.prompt, {}, a.bpe};
  if (!a.tokens.empty()) r.options.tokens = whole_number("--tokens", a.tokens);
  if (!a.temperature.empty()) r.options.temperature = real_number("--temperature", a.temperature);
  if (!a.top_k.empty()) r.options.top_k = whole_number("--top-k", a.top_k);
  if (!a.seed.empty()) r.options.seed = static_cast<uint64_t>(whole_number("--seed", a.seed));
  return r;
}

SampleRequest parse_sample_args(int argc, char** argv, int first) {
  CLI::App app{"continue a prompt with a trained gpt run", "tg sample"};
  SampleArgs a;
  define_sample_options(app, a);
  try {
    app.parse(argc - first + 1, argv + first - 1);  // argv[first - 1] stands for the program name
  } catch (const CLI::ParseError& e) {
    TG_FAIL("tg sample: ", e.what(), " (usage: ", SAMPLE_USAGE, ")");
  }
  return sample_request(a);
}

}  // namespace tg::launcher
