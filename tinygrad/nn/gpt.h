// A GPT-2-class decoder-only transformer (Radford et al. 2019, as nanoGPT and llm.c build it):
// token and position embeddings, pre-LayerNorm blocks of causal self-attention and a GELU (tanh)
// MLP with residuals, a final LayerNorm and an output projection tied to the token embedding.
// Parameter names follow Hugging Face's GPT2LMHeadModel ("transformer.h.0.attn.c_attn.weight"),
// with Linear's [out, in] weight layout (transformers' Conv1D stores [in, out]).
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/module.h"

namespace tg::nn {

struct GPTConfig {
  int64_t vocab_size = 50304;  // GPT-2's 50257 padded to a multiple of 64, as llm.c
  int64_t block_size = 1024;   // the longest sequence (position embeddings)
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  double dropout = 0.0;  // on attention weights, after attention and MLP, after the embeddings
  // Checks the sizes (positive, n_embd divisible by n_head); throws naming the field.
  void check() const;
};

// Multi-head causal self-attention: one Linear to q, k, v ([D] -> [3D]), attention per head
// (Tensor::scaled_dot_product_attention, causal), heads joined and projected ([D] -> [D]).
// The keys and values of the positions seen so far, per layer ([B, H, T, hd] each; empty before
// the first call), for generation one token at a time (Note [kv cache]).
struct KVCache {
  std::optional<Tensor> k, v;
  int64_t length() const { return k ? k->shape(2) : 0; }
};

class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;  // [B, T, D] -> [B, T, D]
  // x holds the positions after those in `cache`, which grows by them.
  Tensor forward(const Tensor& x, KVCache& cache);
  std::string type_name() const override { return "CausalSelfAttention"; }
  // Split by heads (Note [tensor parallel in GPT] in gpt.cpp).
  void tensor_parallel(const std::vector<std::string>& devices) override;
  int64_t n_head;
  double dropout;
  Linear c_attn, c_proj;

 private:
  Tensor attend(const Tensor& x, KVCache* cache);  // null: no cache (training, evaluation)
};

// [D] -> [4D] -> GELU (tanh) -> [D].
class GPTMLP : public Module {
 public:
  explicit GPTMLP(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MLP"; }
  void tensor_parallel(const std::vector<std::string>& devices) override;  // c_fc by columns, c_proj by rows
  double dropout;
  Linear c_fc, c_proj;
};

// x + attn(ln_1(x)), then + mlp(ln_2(x)).
class GPTBlock : public Module {
 public:
  explicit GPTBlock(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;
  Tensor forward(const Tensor& x, KVCache& cache);
  std::string type_name() const override { return "Block"; }
  Tensor forward(const Tensor& x, KVCache* cache);  // null: no cache
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  GPTMLP mlp;
};

// The embeddings, blocks and final norm ("transformer." in the parameter names).
class GPTTrunk : public Module {
 public:
  explicit GPTTrunk(const GPTConfig& c);
  std::string type_name() const override { return "Transformer"; }
  Embedding wte, wpe;
  Sequential h;
  LayerNorm ln_f;
};

// Note [tied embeddings]: the output projection is the token embedding's weight (logits = x @
// wte.weight^T), one tensor registered once, so the optimizer updates it once with the sum of
// both uses' gradients, and a state dict holds it once ("transformer.wte.weight"; no
// "lm_head.weight").
class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& c);
  // Token indices [B, T] (integers, T <= block_size) -> logits [B, T, vocab_size].
  Tensor forward(const Tensor& idx) override;
  // The same for positions after those the caches hold (one cache per layer), which grow by them.
  Tensor forward(const Tensor& idx, std::vector<KVCache>& caches);
  std::string type_name() const override { return "GPT"; }
  Tensor forward(const Tensor& idx, std::vector<KVCache>* caches);  // null: no caches
  // Megatron's layout over the devices (Note [tensor parallel in GPT] in gpt.cpp); refuses a
  // device count that does not divide n_head, naming both.
  void tensor_parallel(const std::vector<std::string>& devices) override;
  GPTConfig config;
  GPTTrunk transformer;
};

// ---- sampling ----

struct SampleOptions {
  int64_t tokens = 100;      // how many to generate
  double temperature = 1.0;  // logits are divided by it; 0: the most likely token every time
  int64_t top_k = 0;         // sample among the k most likely tokens (0: all)
  uint64_t seed = 0;         // the same seed, prompt and model give the same tokens
  int64_t vocabulary = 0;    // draw only ids below it (0: all of the model's); a tokenizer may have
                             // fewer tokens than a vocabulary padded to a multiple of 64
};
// Continues `prompt` (token ids, at least one) by opts.tokens tokens, one forward step per token
// through the KV cache (Note [kv cache]), the context sliding past block_size (Note [sampling]).
// Runs in eval mode and without gradients; returns only the new tokens.
std::vector<int32_t> generate(GPT& model, const std::vector<int32_t>& prompt, const SampleOptions& opts);

// ---- Hugging Face GPT-2 weights ----
//
// Note [hugging face layout]: transformers' GPT2LMHeadModel names its tensors as GPT does here
// ("transformer.h.0.attn.c_attn.weight"; GPT2Model's files lack the "transformer." prefix), but
// its Conv1D layers (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) store weights as [in, out],
// Linear's transpose. Its files may also hold "lm_head.weight" (the tied embedding again) and
// the attention mask buffers "attn.bias" / "attn.masked_bias" of older versions: the first must
// equal the token embedding, the others are not weights and are skipped.

// A transformers state dict (as safe_load reads model.safetensors) as GPT's own: Conv1D weights
// transposed, names given the "transformer." prefix where missing, the tied head checked and
// dropped, mask buffers dropped. What is then missing or unexpected, load_state_dict names.
StateDict gpt2_from_hugging_face(const StateDict& hf);
// GPT's state dict in transformers' layout (Conv1D weights [in, out], "lm_head.weight" tied),
// as GPT2LMHeadModel.from_pretrained reads it from a safetensors file.
StateDict gpt2_to_hugging_face(const StateDict& own);
// Loads a model.safetensors written by transformers into `model` (strict: every weight present,
// shapes checked; errors name the file).
void load_hugging_face_gpt2(GPT& model, const std::string& path);

}  // namespace tg::nn
