// gpt2_parity: GPT-2 from a checkpoint that transformers wrote (GPT2LMHeadModel.save_pretrained),
// beside transformers itself (scripts/gpt2_parity.py runs both and compares): the logits of one
// batch in float32, then the loss of each of N AdamW steps on that batch (weight decay on the
// matrices only, betas 0.9 and 0.95, as nanoGPT and llm.c train GPT-2).
//
//   gpt2_parity HF_DIR BATCH.safetensors OUT.safetensors [STEPS] [LR]
//
// HF_DIR holds config.json and model.safetensors; BATCH.safetensors holds "tokens", int32
// [B, T + 1] (inputs are the first T columns, targets the last T). OUT.safetensors receives
// "logits" [B, T, V] (before any step) and "losses" [STEPS]. The device is DEVICE's (CPU by default).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/gpt.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/nn/state.h"

using namespace tg;

namespace {

nn::GPTConfig config_of(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  TG_CHECK(in, "gpt2_parity: cannot open ", dir, "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  nn::GPTConfig c;
  c.vocab_size = j.at("vocab_size").get<int64_t>();
  c.block_size = j.at("n_positions").get<int64_t>();
  c.n_layer = j.at("n_layer").get<int64_t>();
  c.n_head = j.at("n_head").get<int64_t>();
  c.n_embd = j.at("n_embd").get<int64_t>();
  return c;
}

Tensor loss_of(nn::GPT& model, const Tensor& x, const Tensor& y) {
  Tensor logits = model(x);
  int64_t v = logits.shape(2);
  return logits.reshape({-1, v}).sparse_categorical_crossentropy(y.reshape({-1}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: gpt2_parity HF_DIR BATCH.safetensors OUT.safetensors [STEPS] [LR]\n");
    return 2;
  }
  try {
    const std::string dir = argv[1];
    const int64_t steps = argc > 4 ? std::atoll(argv[4]) : 20;
    const double lr = argc > 5 ? std::atof(argv[5]) : 6e-4;
    nn::GPT model(config_of(dir));
    nn::load_hugging_face_gpt2(model, dir + "/model.safetensors");
    Tensor tokens = nn::safe_load(argv[2]).at("tokens").to(default_device());
    const int64_t t = tokens.shape(1) - 1;
    Tensor x = tokens.shrink({{0, tokens.shape(0)}, {0, t}}).contiguous().realize();
    Tensor y = tokens.shrink({{0, tokens.shape(0)}, {1, t + 1}}).contiguous().realize();

    nn::StateDict out;
    {
      NoGradGuard no_grad;
      model.eval();
      out["logits"] = model(x).realize();
    }
    model.train();
    nn::AdamW opt(nn::decay_matrices_only(model.parameters(), 0.1), lr, 0.9, 0.95, 1e-8);
    std::vector<float> losses;
    for (int64_t s = 0; s < steps; s++) {
      Tensor loss = loss_of(model, x, y);
      opt.zero_grad();
      loss.backward();
      opt.step({loss});
      losses.push_back(loss.item<float>());
      std::printf("{\"step\": %lld, \"loss\": %.7f}\n", static_cast<long long>(s), static_cast<double>(losses.back()));
    }
    out["losses"] = Tensor::from_vector(losses, {static_cast<int64_t>(losses.size())});
    nn::safe_save(out, argv[3]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
