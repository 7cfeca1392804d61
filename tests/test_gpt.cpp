// nn::GPT (tinygrad/nn/gpt.h): shapes and parameter names, the parameter count, causality, the
// tied embedding's gradient from both of its uses, a small model that learns a fixed batch, and
// bad configs and inputs named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "library_device.h"
#include "test_util.h"
#include "tinygrad/device.h"
#include "tinygrad/nn/gpt.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/nn/state.h"
#include "tinygrad/schedule/schedule.h"

using namespace tg;
using namespace tg::nn;
using tg::testutil::expect_error;

namespace {

GPTConfig tiny() {
  GPTConfig c;
  c.vocab_size = 17, c.block_size = 8, c.n_layer = 2, c.n_head = 2, c.n_embd = 8;
  return c;
}

Tensor tokens(const std::vector<int32_t>& v, int64_t b, int64_t t) { return Tensor::from_vector(v, {b, t}); }

// Cross entropy of [B, T, V] logits against [B, T] targets.
Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  int64_t v = logits.shape(2);
  return logits.reshape({-1, v}).sparse_categorical_crossentropy(targets.reshape({targets.numel()}));
}

// Parameters of a GPT-2 model: embeddings, 12 D^2 + 13 D per block, the final norm (the output
// projection is the token embedding). GPT-2 small (V 50257, T 1024, 12 x 768): 124,439,808.
int64_t gpt_parameters(const GPTConfig& c) {
  int64_t d = c.n_embd;
  return c.vocab_size * d + c.block_size * d + c.n_layer * (12 * d * d + 13 * d) + 2 * d;
}

TEST(GPT, ShapesNamesAndParameterCount) {
  Tensor::manual_seed(1);
  GPT m(tiny());
  Tensor logits = m(tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2, 5));
  EXPECT_EQ(logits.shape(), (Shape{2, 5, 17}));
  std::vector<std::string> names;
  for (auto& [n, t] : m.named_parameters()) names.push_back(n);
  for (const char* n : {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                        "transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_proj.bias",
                        "transformer.h.0.mlp.c_fc.weight", "transformer.ln_f.bias"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  for (auto& n : names) EXPECT_EQ(n.find("lm_head"), std::string::npos) << n;  // Note [tied embeddings]
  EXPECT_EQ(m.num_parameters(), gpt_parameters(tiny()));
  GPTConfig small;
  small.vocab_size = 50257;
  EXPECT_EQ(gpt_parameters(small), 124439808);
}

// Note [gpt initialisation]: the residual projections are narrower than the other weights.
TEST(GPT, InitialisationIsGpt2s) {
  Tensor::manual_seed(2);
  GPTConfig c = tiny();
  c.n_embd = 64, c.n_layer = 8, c.n_head = 4;
  GPT m(c);
  auto std_of = [](const Tensor& t) {
    auto v = t.to_vector<float>();
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  auto& block = dynamic_cast<GPTBlock&>(m.transformer.h[0]);
  EXPECT_NEAR(std_of(block.attn.c_attn.weight), 0.02, 0.002);
  EXPECT_NEAR(std_of(block.mlp.c_proj.weight), 0.02 / std::sqrt(16.0), 0.001);
  EXPECT_NEAR(std_of(m.transformer.wte.weight), 0.02, 0.003);
  EXPECT_EQ(std_of(*block.attn.c_attn.bias), 0.0);
}

// Changing token t changes no logit before position t.
TEST(GPT, IsCausal) {
  Tensor::manual_seed(3);
  GPT m(tiny());
  auto a = m(tokens({1, 2, 3, 4, 5, 6}, 1, 6)).to_vector<float>();
  auto b = m(tokens({1, 2, 3, 9, 5, 6}, 1, 6)).to_vector<float>();
  for (size_t i = 0; i < 3 * 17; i++) EXPECT_EQ(a[i], b[i]) << "logit " << i << " saw a later token";
  bool later_changed = false;
  for (size_t i = 3 * 17; i < a.size(); i++) later_changed |= a[i] != b[i];
  EXPECT_TRUE(later_changed);
}

// bfloat16 autocast (set_compute_dtype) covers the attention's products and the tied output
// projection too (the head's weight is cast to bfloat16 for its product): the logits move by
// bfloat16's rounding, not more.
TEST(GPT, ComputesInBfloat16) {
  Tensor::manual_seed(9);
  GPT m(tiny());
  Tensor x = tokens({1, 2, 3, 4, 5, 6, 7, 8}, 1, 8);
  auto f32 = m(x).to_vector<float>();
  m.set_compute_dtype(DType::BFloat16);
  Tensor logits = m(x);
  EXPECT_EQ(logits.dtype(), DType::Float32);
  const Shape head{tiny().n_embd, tiny().vocab_size};  // wte.weight^T
  auto nodes = toposort({logits.uop()});
  EXPECT_TRUE(std::any_of(nodes.begin(), nodes.end(), [&](const UOpPtr& n) {
    return n->op == Op::CAST && n->dtype == DType::BFloat16 && n->shape == head;
  })) << "the output projection's product is not in bfloat16";
  auto bf = logits.to_vector<float>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < f32.size(); i++) diff = std::max(diff, std::abs(static_cast<double>(bf[i] - f32[i]))),
                                          norm = std::max(norm, std::abs(static_cast<double>(f32[i])));
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 0.05 * norm + 1e-3);
}

// q, k and v are rounded to the compute dtype before c_attn's output is split into them, so their
// gradients are assembled into that output's gradient in bfloat16 (the values c_attn's products
// read), not in float32 and rounded again (CausalSelfAttention::attend).
TEST(GPT, AssemblesTheGradientOfQKVInTheComputeDtype) {
  Tensor::manual_seed(9);
  GPTConfig c = tiny();
  GPT m(c);
  m.set_compute_dtype(DType::BFloat16);
  Tensor x = tokens({1, 2, 3, 4, 5, 6, 7, 8}, 1, 8);
  Tensor loss = lm_loss(m(x), tokens({2, 3, 4, 5, 6, 7, 8, 9}, 1, 8));
  Tensors params;
  for (Tensor* p : m.parameters()) params.push_back(*p);
  std::vector<UOpPtr> grads;
  for (auto& g : loss.gradients(params)) grads.push_back(g.uop());
  const Shape split{3, 1, c.n_head, 8, c.n_embd / c.n_head};  // [3, B, H, T, hd]
  int assembled = 0;
  for (auto& n : toposort(grads)) {
    if (n->op != Op::ADD || n->shape != split) continue;
    assembled++;
    EXPECT_EQ(n->dtype, DType::BFloat16) << "the gradient of q, k and v is assembled in " << dtype_name(n->dtype);
  }
  EXPECT_EQ(assembled, 2 * c.n_layer);  // three pieces a layer: two additions
}

// With a compute dtype the GELU reads and returns values in it (GPTMLP::forward), so the gradient
// of c_fc's output, which its bias sum and its library products both read, is realized in
// bfloat16: the schedule (on a stand-in for a GPU with a matmul library) writes no float32
// buffer of the hidden activation's size.
TEST(GPT, RealizesTheMLPsHiddenGradientInTheComputeDtype) {
  Tensor::manual_seed(10);
  GPTConfig c = tiny();
  GPT m(c);
  m.set_compute_dtype(DType::BFloat16);
  const std::string& gpu = testutil::library_device();
  for (Tensor* p : m.parameters()) *p = p->to(gpu).realize();
  const int64_t t = 7;  // B*T*4D = 224 elements: no parameter or other activation has as many
  Tensor x = tokens({1, 2, 3, 4, 5, 6, 7}, 1, t).to(gpu);
  Tensor loss = lm_loss(m(x), tokens({2, 3, 4, 5, 6, 7, 8}, 1, t).to(gpu));
  Tensors params;
  for (Tensor* p : m.parameters()) params.push_back(*p);
  std::vector<UOpPtr> grads;
  for (auto& g : loss.gradients(params)) grads.push_back(g.uop());
  int hidden = 0;
  for (auto& item : create_schedule(grads))
    for (size_t o = 0; o < item.outputs; o++) {
      if (item.buffers[o]->numel() != t * 4 * c.n_embd) continue;
      hidden++;
      EXPECT_EQ(item.buffers[o]->dtype(), DType::BFloat16) << "a hidden activation or its gradient is written in "
                                                         << dtype_name(item.buffers[o]->dtype());
    }
  EXPECT_GT(hidden, 0);
}

// Note [tied embeddings]: a token that is never an input still gets a gradient through the output
// projection, and the optimizer holds the tensor once.
TEST(GPT, TiedEmbeddingGetsBothGradients) {
  Tensor::manual_seed(4);
  GPT m(tiny());
  Tensor loss = lm_loss(m(tokens({1, 2, 3, 4}, 1, 4)), tokens({2, 3, 4, 5}, 1, 4));
  loss.backward();
  auto g = m.transformer.wte.weight.grad()->to_vector<float>();
  double row16 = 0;  // token 16 is in no input
  for (int64_t j = 0; j < 8; j++) row16 += std::abs(g[16 * 8 + j]);
  EXPECT_GT(row16, 0.0);
  auto params = m.parameters();
  EXPECT_EQ(std::count(params.begin(), params.end(), &m.transformer.wte.weight), 1);
}

TEST(GPT, LearnsAFixedBatch) {
  Tensor::manual_seed(5);
  GPT m(tiny());
  Tensor x = tokens({1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1}, 2, 8);
  Tensor y = tokens({2, 3, 4, 5, 6, 7, 8, 9, 7, 6, 5, 4, 3, 2, 1, 0}, 2, 8);
  AdamW opt(m.parameters(), 1e-2, 0.9, 0.95, 1e-8, 0.0);
  float first = 0, last = 0;
  for (int step = 0; step < 40; step++) {
    Tensor loss = lm_loss(m(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step({loss});
    (step == 0 ? first : last) = loss.item<float>();
  }
  EXPECT_NEAR(first, std::log(17.0), 0.3);  // about uniform at the start
  EXPECT_LT(last, 0.25 * first);
}

// Note [kv cache]: the prompt at once and then one position per call give the logits of one
// call over the whole sequence.
TEST(GPT, KVCacheGivesTheFullSequencesLogits) {
  Tensor::manual_seed(10);
  GPT m(tiny());
  std::vector<int32_t> seq{5, 1, 16, 2, 9, 4};
  auto full = m(tokens(seq, 1, 6)).to_vector<float>();
  std::vector<KVCache> caches(2);
  std::vector<float> stepped = m.forward(tokens({5, 1, 16}, 1, 3), caches).to_vector<float>();
  for (size_t i = 3; i < seq.size(); i++) {
    auto next = m.forward(tokens({seq[i]}, 1, 1), caches).to_vector<float>();
    stepped.insert(stepped.end(), next.begin(), next.end());
  }
  EXPECT_EQ(caches[1].length(), 6);
  ASSERT_EQ(stepped.size(), full.size());
  for (size_t i = 0; i < full.size(); i++) EXPECT_NEAR(stepped[i], full[i], 1e-5) << "logit " << i;
}

// Note [sampling]: greedy decoding through the cache picks what the full model's argmax picks; a
// seed gives the same tokens every time.
TEST(GPT, GenerateIsGreedyOrSeeded) {
  Tensor::manual_seed(11);
  GPT m(tiny());
  std::vector<int32_t> prompt{3, 7};
  auto greedy = generate(m, prompt, {.tokens = 5, .temperature = 0});
  std::vector<int32_t> seq = prompt;
  for (int i = 0; i < 5; i++) {
    auto logits = m(tokens(seq, 1, static_cast<int64_t>(seq.size()))).to_vector<float>();
    auto last = logits.end() - 17;
    seq.push_back(static_cast<int32_t>(std::max_element(last, logits.end()) - last));
  }
  EXPECT_EQ(greedy, std::vector<int32_t>(seq.begin() + 2, seq.end()));
  EXPECT_EQ(generate(m, prompt, {.tokens = 5, .temperature = 1, .top_k = 1, .seed = 3}), greedy);
  SampleOptions o{.tokens = 6, .temperature = 1.5, .top_k = 0, .seed = 42};
  auto a = generate(m, prompt, o);
  EXPECT_EQ(generate(m, prompt, o), a);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 17);
  bool differs = false;
  for (uint64_t seed = 1; seed < 6 && !differs; seed++) differs = generate(m, prompt, {6, 1.5, 0, seed}) != a;
  EXPECT_TRUE(differs);
  expect_error([&] { generate(m, {}, o); }, {"at least one token"});
  // past block_size (8) the context slides: the first 6 new tokens are those of the short run
  auto longer = generate(m, prompt, {.tokens = 20, .temperature = 0});
  ASSERT_EQ(longer.size(), 20u);
  EXPECT_EQ(std::vector<int32_t>(longer.begin(), longer.begin() + 5), greedy);
  EXPECT_EQ(generate(m, prompt, {.tokens = 20, .temperature = 0}), longer);
  expect_error([&] { generate(m, {17}, o); }, {"prompt token 17 is outside the vocabulary of 17"});
}

class GPTHuggingFace : public tg::testutil::TempDirTest {};

// Note [hugging face layout]: a file in transformers' layout (Conv1D weights [in, out], the tied
// head, a mask buffer, with or without the "transformer." prefix) loads into a model that then
// computes what the model that wrote it computes.
TEST_F(GPTHuggingFace, WeightsRoundTripThroughTransformersLayout) {
  Tensor::manual_seed(6);
  GPT a(tiny());
  StateDict hf = gpt2_to_hugging_face(a.state_dict());
  EXPECT_EQ(hf.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{8, 24}));  // [in, out]
  EXPECT_EQ(hf.at("transformer.h.1.mlp.c_proj.weight").shape(), (Shape{32, 8}));
  EXPECT_EQ(hf.at("transformer.ln_f.weight").shape(), (Shape{8}));
  EXPECT_TRUE(hf.count("lm_head.weight"));
  hf["transformer.h.0.attn.bias"] = Tensor::ones({1, 1, 8, 8});  // an older version's mask buffer
  std::string path = (dir_ / "model.safetensors").string();
  safe_save(hf, path);
  Tensor x = tokens({3, 1, 4, 1, 5, 9, 2, 6}, 1, 8);
  auto expected = a(x).to_vector<float>();
  Tensor::manual_seed(7);
  GPT b(tiny());
  EXPECT_NE(b(x).to_vector<float>(), expected);
  load_hugging_face_gpt2(b, path);
  EXPECT_EQ(b(x).to_vector<float>(), expected);
  // GPT2Model's names, without the prefix
  StateDict bare;
  for (auto& [k, v] : gpt2_to_hugging_face(a.state_dict()))
    if (k != "lm_head.weight") bare[k.substr(std::string("transformer.").size())] = v;
  GPT c(tiny());
  c.load_state_dict(gpt2_from_hugging_face(bare));
  EXPECT_EQ(c(x).to_vector<float>(), expected);
}

TEST_F(GPTHuggingFace, BadFilesAreNamed) {
  Tensor::manual_seed(8);
  GPT a(tiny());
  StateDict hf = gpt2_to_hugging_face(a.state_dict());
  hf.erase("transformer.h.1.ln_2.bias");
  std::string path = (dir_ / "missing.safetensors").string();
  safe_save(hf, path);
  expect_error([&] { load_hugging_face_gpt2(a, path); }, {path, "transformer.h.1.ln_2.bias"});
  hf = gpt2_to_hugging_face(a.state_dict());
  hf["lm_head.weight"] = hf["lm_head.weight"] * 2;
  expect_error([&] { gpt2_from_hugging_face(hf); }, {"lm_head.weight differs from the token embedding"});
  GPTConfig wider = tiny();
  wider.n_embd = 16;
  GPT w(wider);
  safe_save(gpt2_to_hugging_face(w.state_dict()), path);
  expect_error([&] { load_hugging_face_gpt2(a, path); }, {path, "transformer.wte.weight"});
}

TEST(GPT, BadConfigsAndInputsAreNamed) {
  GPTConfig c = tiny();
  c.n_head = 3;
  expect_error([&] { GPT m(c); }, {"n_embd (8) must be divisible by n_head (3)"});
  c = tiny();
  c.n_layer = 0;
  expect_error([&] { GPT m(c); }, {"n_layer must be positive"});
  GPT m(tiny());
  expect_error([&] { m(Tensor::zeros({1, 9}, {.dtype = DType::Int32})); }, {"longer than block_size 8"});
  expect_error([&] { m(Tensor::zeros({1, 4})); }, {"integer token indices [B, T]"});
}

}  // namespace
