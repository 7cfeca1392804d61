// The GPT-2 model: construction with GPT-2's initialisation and the forward pass.
//
// Note [gpt initialisation]: as GPT-2 (and nanoGPT, llm.c): every Linear and embedding weight
// ~ N(0, 0.02), the projections that end a residual branch (attn.c_proj, mlp.c_proj) ~ N(0,
// 0.02 / sqrt(2 * n_layer)) so the residual stream's variance does not grow with depth, biases
// 0, LayerNorm weights 1 and biases 0.
#include "tinygrad/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "tinygrad/error.h"
#include "tinygrad/nn/state.h"

namespace tg::nn {

namespace {

void normal_init(Tensor& t, double std) { t.assign((Tensor::randn(t.shape()) * std).realize()); }

void init_linear(Linear& l, double std) {
  normal_init(l.weight, std);
  if (l.bias) l.bias->assign(Tensor::zeros(l.bias->shape()).realize());
}

constexpr double INIT_STD = 0.02;  // Note [gpt initialisation]

double residual_std(const GPTConfig& c) { return INIT_STD / std::sqrt(2.0 * static_cast<double>(c.n_layer)); }

}  // namespace

void GPTConfig::check() const {
  auto positive = [](const char* name, int64_t v) { TG_CHECK(v > 0, "GPT: ", name, " must be positive, got ", v); };
  positive("vocab_size", vocab_size);
  positive("block_size", block_size);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  TG_CHECK(n_embd % n_head == 0, "GPT: n_embd (", n_embd, ") must be divisible by n_head (", n_head, ")");
  TG_CHECK(dropout >= 0 && dropout < 1, "GPT: dropout must be in [0, 1), got ", dropout);
}

// ---- attention ----

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c)
    : n_head(c.n_head), dropout(c.dropout), c_attn(c.n_embd, 3 * c.n_embd), c_proj(c.n_embd, c.n_embd) {
  init_linear(c_attn, INIT_STD);
  init_linear(c_proj, residual_std(c));
  register_module("c_attn", c_attn);
  register_module("c_proj", c_proj);
}

Tensor CausalSelfAttention::forward(const Tensor& x) { return attend(x, nullptr); }

Tensor CausalSelfAttention::forward(const Tensor& x, KVCache& cache) { return attend(x, &cache); }

// Note [kv cache]: generation feeds the prompt once and then one token per step; each layer keeps
// the keys and values of every position so far, and a step computes q, k, v for its new positions
// only, appends k and v, and attends from the new queries to all keys. The new queries are the
// last positions, so the causal mask applies only when the call has more than one of them and the
// cache is empty (the prompt: L = S, masked as in training); a single new query sees every key.
// A prompt after a non-empty cache (several new positions at once) is not supported. Without a
// cache (training, evaluation) nothing is realized here: the keys and values stay in the graph.
Tensor CausalSelfAttention::attend(const Tensor& x, KVCache* cache) {
  TG_CHECK(x.ndim() == 3, "CausalSelfAttention: input must be [B, T, D], got ", x.describe());
  int64_t b = x.shape(0), t = x.shape(1), d = x.shape(2), hd = d / n_head;
  // with a compute dtype the attention's products run in it too (Note [compute dtype] in layers.h;
  // its softmax stays float32: Note [attention as a composition]). q, k and v come from c_attn in
  // the compute dtype, its bias added in the product (Note [bias in the compute dtype]), so the
  // gradient of c_attn's output is assembled from theirs in the compute dtype (the values it would
  // be rounded to for c_attn's products anyway), not in float32 and then rounded again.
  Tensor projected = c_attn.forward_rounded(x);
  // [B, T, 3D] -> three [B, H, T, hd]
  Tensors qkv = projected.reshape({b, t, 3, n_head, hd}).permute({2, 0, 3, 1, 4}).chunk(3, 0);
  auto head = [&](const Tensor& z) { return z.reshape({b, n_head, t, hd}); };
  double p = is_training() ? dropout : 0.0;
  Tensor k = head(qkv[1]), v = head(qkv[2]);
  bool first = !cache || cache->length() == 0;
  TG_CHECK(first || t == 1, "CausalSelfAttention: after a cached prefix, positions come one at a time (got ", t, ")");
  if (!first) k = Tensor::cat({*cache->k, k}, 2), v = Tensor::cat({*cache->v, v}, 2);
  Tensor y = head(qkv[0]).scaled_dot_product_attention(k, v, /*causal=*/first && t > 1, p);
  if (cache) cache->k = k.realize(), cache->v = v.realize();
  y = y.permute({0, 2, 1, 3}).reshape({b, t, d}).cast(x.dtype());
  return c_proj(y).dropout(dropout, is_training());
}

// Note [tensor parallel in GPT]: Megatron's layout (Note [tensor parallel] in module.cpp), split by
// heads: c_attn is column-parallel in 3 groups (Note [grouped splits] in multi.cpp), so each
// device holds the rows of its n_head / n heads of q, of k and of v, and the forward pass's
// reshape to [B, T, 3, H, hd] leaves the split on the heads: each device attends over its own
// heads, and c_proj, row-parallel, sums their outputs (one all-reduce). The MLP's c_fc is
// column-parallel and its c_proj row-parallel (one all-reduce). The embeddings, LayerNorms and the
// tied output projection are replicated. A step costs two all-reduces per block forward and two
// backward (the gradients of the LayerNorms' outputs, which feed c_attn and c_fc).
void CausalSelfAttention::tensor_parallel(const std::vector<std::string>& devices) {
  if (devices.size() < 2) return;
  TG_CHECK(n_head % static_cast<int64_t>(devices.size()) == 0, "tensor parallel over ", devices.size(),
           " devices: n_head=", n_head, " does not split into whole heads (", n_head, " % ", devices.size(), " = ",
           n_head % static_cast<int64_t>(devices.size()), ")");
  c_attn.shard_columns(devices, "attn.c_attn", 3);
  c_proj.shard_rows(devices, "attn.c_proj");
}

// ---- MLP and block ----

void GPTMLP::tensor_parallel(const std::vector<std::string>& devices) {
  c_fc.shard_columns(devices, "mlp.c_fc");
  c_proj.shard_rows(devices, "mlp.c_proj");
}

GPTMLP::GPTMLP(const GPTConfig& c) : dropout(c.dropout), c_fc(c.n_embd, 4 * c.n_embd), c_proj(4 * c.n_embd, c.n_embd) {
  init_linear(c_fc, INIT_STD);
  init_linear(c_proj, residual_std(c));
  register_module("c_fc", c_fc);
  register_module("c_proj", c_proj);
}

// With a compute dtype the GELU reads c_fc's output rounded to it and its result is rounded to it
// (computed in float32 between: PyTorch's autocast runs it so, on the addmm's bfloat16 output),
// so the gradient that c_fc's bias sum and its products read is one bfloat16 tensor: in float32
// it was written, read by the bias sum and read again to be rounded for the products (a
// [B*T, 4D] float32 pass each, 0.13 ms a layer at GPT-2's 16 x 1024 on an H100).
Tensor GPTMLP::forward(const Tensor& x) {
  Tensor h = c_fc(x);
  if (std::optional<DType> cd = compute_dtype()) h = h.cast(*cd).float_().gelu().cast(*cd);
  else h = h.gelu();
  return c_proj(h).dropout(dropout, is_training());
}

GPTBlock::GPTBlock(const GPTConfig& c) : ln_1({c.n_embd}), attn(c), ln_2({c.n_embd}), mlp(c) {
  register_module("ln_1", ln_1);
  register_module("attn", attn);
  register_module("ln_2", ln_2);
  register_module("mlp", mlp);
}

Tensor GPTBlock::forward(const Tensor& x) { return forward(x, nullptr); }

Tensor GPTBlock::forward(const Tensor& x, KVCache& cache) { return forward(x, &cache); }

Tensor GPTBlock::forward(const Tensor& x, KVCache* cache) {
  Tensor h = x + (cache ? attn.forward(ln_1(x), *cache) : attn.forward(ln_1(x)));
  return h + mlp(ln_2(h));
}

// ---- the model ----

GPTTrunk::GPTTrunk(const GPTConfig& c) : wte(c.vocab_size, c.n_embd), wpe(c.block_size, c.n_embd), ln_f({c.n_embd}) {
  normal_init(wte.weight, INIT_STD);
  normal_init(wpe.weight, INIT_STD);
  for (int64_t i = 0; i < c.n_layer; i++) h.emplace<GPTBlock>(c);
  register_module("wte", wte);
  register_module("wpe", wpe);
  register_module("h", h);
  register_module("ln_f", ln_f);
}

GPT::GPT(const GPTConfig& c) : config((c.check(), c)), transformer(c) { register_module("transformer", transformer); }

// Note [tensor parallel in GPT]: checked here first, so that no parameter is split before a refusal.
void GPT::tensor_parallel(const std::vector<std::string>& devices) {
  if (devices.size() < 2) return;
  auto n = static_cast<int64_t>(devices.size());
  TG_CHECK(config.n_head % n == 0, "tensor parallel over ", n, " devices: n_head=", config.n_head,
           " does not split into whole heads (", config.n_head, " % ", n, " = ", config.n_head % n, ")");
  Module::tensor_parallel(devices);
}

Tensor GPT::forward(const Tensor& idx) { return forward(idx, nullptr); }

Tensor GPT::forward(const Tensor& idx, std::vector<KVCache>& caches) { return forward(idx, &caches); }

// Note [tied embeddings]
Tensor GPT::forward(const Tensor& idx, std::vector<KVCache>* caches) {
  TG_CHECK(idx.ndim() == 2 && is_int(idx.dtype()), "GPT: input must be integer token indices [B, T], got ",
           idx.describe());
  TG_ASSERT(!caches || caches->size() == static_cast<size_t>(config.n_layer), "GPT: one KV cache per layer");
  int64_t t = idx.shape(1), past = caches ? (*caches)[0].length() : 0;
  TG_CHECK(past + t <= config.block_size, "GPT: sequence of ", past + t, " tokens is longer than block_size ",
           config.block_size);
  Tensor pos = Tensor::arange(static_cast<double>(past), static_cast<double>(past + t), 1,
                              {.dtype = DType::Int32, .device = idx.device()});
  Tensor x = (transformer.wte(idx) + transformer.wpe(pos)).dropout(config.dropout, is_training());
  for (size_t i = 0; i < transformer.h.size(); i++)
    x = dynamic_cast<GPTBlock&>(transformer.h[i]).forward(x, caches ? &(*caches)[i] : nullptr);
  x = transformer.ln_f(x);
  // with a compute dtype the head's product runs in it too, like a Linear's (Note [compute dtype]
  // in layers.h): the logits come back in float32 for the loss
  return at_compute_dtype(compute_dtype(), x, transformer.wte.weight.transpose(0, 1),
                          [](const Tensor& a, const Tensor& w) { return a.matmul(w); });
}

// ---- sampling ----

namespace {

// The next token from the last position's logits (Note [sampling]).
int32_t pick_token(std::vector<float> logits, const SampleOptions& o, std::mt19937_64& gen) {
  if (o.vocabulary > 0 && static_cast<size_t>(o.vocabulary) < logits.size()) logits.resize(static_cast<size_t>(o.vocabulary));
  if (o.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  size_t k = o.top_k > 0 ? std::min(order.size(), static_cast<size_t>(o.top_k)) : order.size();
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  double top = logits[order[0]];
  std::vector<double> weights(k);
  for (size_t i = 0; i < k; i++) weights[i] = std::exp((logits[order[i]] - top) / o.temperature);
  std::discrete_distribution<size_t> dist(weights.begin(), weights.end());
  return order[dist(gen)];
}

}  // namespace

// Note [sampling]: the probabilities are softmax(logits / temperature) over the top_k logits (all
// with top_k 0) among the first opts.vocabulary ids (a padded vocabulary's extra ids are no
// tokenizer's, so they are never drawn), drawn on the host from std::mt19937_64 seeded with opts.seed, so a seed gives the
// same tokens on every device; temperature 0 takes the largest logit (greedy decoding). Past the
// model's block_size the context slides: when the caches are full, they are rebuilt from the last
// block_size / 2 tokens (one forward pass over them), so every token still sees at least half a
// block of context and a refill happens once per half block (nanoGPT crops the context to the
// last block_size tokens and recomputes every step).
std::vector<int32_t> generate(GPT& model, const std::vector<int32_t>& prompt, const SampleOptions& opts) {
  TG_CHECK(!prompt.empty(), "generate: the prompt needs at least one token");
  TG_CHECK(opts.tokens >= 0 && opts.top_k >= 0 && opts.temperature >= 0 && opts.vocabulary >= 0,
           "generate: tokens, top_k, temperature and vocabulary must not be negative");
  TG_CHECK(opts.vocabulary <= model.config.vocab_size, "generate: a tokenizer of ", opts.vocabulary,
           " tokens does not fit the model's vocabulary of ", model.config.vocab_size);
  for (int32_t tok : prompt)
    TG_CHECK(tok >= 0 && tok < model.config.vocab_size, "generate: prompt token ", tok, " is outside the vocabulary of ",
             model.config.vocab_size);
  bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  std::mt19937_64 gen(opts.seed);
  const int64_t block = model.config.block_size;
  std::vector<KVCache> caches(static_cast<size_t>(model.config.n_layer));
  std::vector<int32_t> context = prompt, out;
  auto last = [&](int64_t n) {
    std::vector<int32_t> tail(context.end() - std::min<int64_t>(n, static_cast<int64_t>(context.size())), context.end());
    return Tensor::from_vector(tail, {1, static_cast<int64_t>(tail.size())});
  };
  Tensor step = last(block);
  for (int64_t i = 0; i < opts.tokens; i++) {
    if (caches[0].length() + step.shape(1) > block) {  // the caches are full: slide (Note [sampling])
      for (auto& c : caches) c = KVCache{};
      step = last(std::max<int64_t>(1, block / 2));
    }
    Tensor logits = model.forward(step, caches);
    int64_t t = logits.shape(1), v = logits.shape(2);
    int32_t next = pick_token(logits.shrink({{0, 1}, {t - 1, t}, {0, v}}).reshape({v}).to_vector<float>(), opts, gen);
    out.push_back(next);
    context.push_back(next);
    step = Tensor::from_vector(std::vector<int32_t>{next}, {1, 1});
  }
  model.train(was_training);
  return out;
}

// ---- Hugging Face GPT-2 weights (Note [hugging face layout]) ----

namespace {

const std::string PREFIX = "transformer.";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_conv1d_weight(const std::string& name) {
  for (const char* layer : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (ends_with(name, layer)) return true;
  return false;
}

bool is_mask_buffer(const std::string& name) { return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"); }

Tensor transposed(const Tensor& t, const std::string& name) {
  TG_CHECK(t.ndim() == 2, "GPT-2 weights: ", name, " must be 2-d, got ", t.describe());
  return t.transpose(0, 1).contiguous().realize();
}

}  // namespace

StateDict gpt2_from_hugging_face(const StateDict& hf) {
  StateDict own;
  for (auto& [key, value] : hf) {
    if (key == "lm_head.weight" || is_mask_buffer(key)) continue;
    std::string name = key.rfind(PREFIX, 0) == 0 ? key : PREFIX + key;
    own[name] = is_conv1d_weight(name) ? transposed(value, key) : value;
  }
  if (auto head = hf.find("lm_head.weight"); head != hf.end()) {
    auto wte = own.find(PREFIX + "wte.weight");
    TG_CHECK(wte != own.end(), "GPT-2 weights: lm_head.weight without transformer.wte.weight");
    TG_CHECK(head->second.shape() == wte->second.shape() &&
                 head->second.to_vector<float>() == wte->second.to_vector<float>(),
             "GPT-2 weights: lm_head.weight differs from the token embedding (an untied head; GPT ties them, "
             "Note [tied embeddings])");
  }
  return own;
}

StateDict gpt2_to_hugging_face(const StateDict& own) {
  StateDict hf;
  for (auto& [name, value] : own) hf[name] = is_conv1d_weight(name) ? transposed(value, name) : value;
  if (auto wte = own.find(PREFIX + "wte.weight"); wte != own.end()) hf["lm_head.weight"] = wte->second;
  return hf;
}

void load_hugging_face_gpt2(GPT& model, const std::string& path) {
  try {
    model.load_state_dict(gpt2_from_hugging_face(safe_load(path)), /*strict=*/true);
  } catch (const Error& e) {
    TG_FAIL("loading GPT-2 weights from ", path, ": ", e.what());
  }
}

}  // namespace tg::nn
