// GPT-2's byte-level BPE (tinygrad/nn/bpe.h) on a small vocabulary written here: merges applied
// by rank within GPT-2's pieces and never across them, exact round trips of any UTF-8 text, both
// file layouts, and bad vocabularies refused with the file and the problem named.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "launcher/run.h"
#include "launcher/sample.h"
#include "test_util.h"
#include "tinygrad/nn/bpe.h"
#include "tinygrad/nn/tokens.h"

using namespace tg;
using namespace tg::nn;
using tg::testutil::error_of;

namespace {

// GPT-2's character for a byte (bytes_to_unicode), as UTF-8.
std::string byte_char(int b) {
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int x = 0; x < b; x++)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) cp++;
  }
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

// Bytes are ids 0..255, then the merges' tokens, then <|endoftext|>.
const std::vector<std::pair<std::string, std::string>> MERGES = {
    {"o", byte_char(' ')},  // never applies: a space starts a new piece
    {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {byte_char(' '), "w"}, {"'", "s"}};

class BpeTest : public tg::testutil::TempDirTest {
 protected:
  std::map<std::string, int32_t> vocab() const {
    std::map<std::string, int32_t> v;
    for (int b = 0; b < 256; b++) v[byte_char(b)] = b;
    int32_t id = 256;
    for (auto& [a, b] : MERGES) v[a + b] = id++;
    v["<|endoftext|>"] = id;
    return v;
  }
  void write(const std::string& vocab_name, const std::string& merges_name, const std::map<std::string, int32_t>& v,
             const std::vector<std::pair<std::string, std::string>>& merges) const {
    nlohmann::json j = v;
    std::ofstream(path(vocab_name)) << j.dump();
    std::ofstream m(path(merges_name));
    m << "#version: 0.2\n";
    for (auto& [a, b] : merges) m << a << " " << b << "\n";
  }
};

}  // namespace

TEST_F(BpeTest, MergesApplyByRankWithinGpt2Pieces) {
  if (!Gpt2Bpe::available()) GTEST_SKIP() << "this build has no PCRE2 (libpcre2-dev)";
  write("vocab.json", "merges.txt", vocab(), MERGES);
  Gpt2Bpe bpe = Gpt2Bpe::load(dir_.string());
  const int32_t hello = 256 + 4, space_w = 256 + 5, apostrophe_s = 256 + 6;
  EXPECT_EQ(bpe.encode("hello world"), (std::vector<int32_t>{hello, space_w, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(bpe.encode("hello's"), (std::vector<int32_t>{hello, apostrophe_s}));
  EXPECT_EQ(bpe.encode("hellos"), (std::vector<int32_t>{hello, 's'}));
  // "o" + " " ranks first, but "hello world" splits into "hello" and " world"
  for (int32_t id : bpe.encode("hello world")) EXPECT_NE(id, 256);
  EXPECT_EQ(bpe.end_of_text(), 256 + 7);
  EXPECT_EQ(bpe.vocab_size(), 256u + 8u);
}

TEST_F(BpeTest, AnyUtf8TextRoundTrips) {
  if (!Gpt2Bpe::available()) GTEST_SKIP() << "this build has no PCRE2 (libpcre2-dev)";
  write("encoder.json", "vocab.bpe", vocab(), MERGES);  // GPT-2's own file names
  Gpt2Bpe bpe = Gpt2Bpe::load(dir_.string());
  for (std::string s : {"hello world", "it's 42 apples!!  \n\tend", "naïve café, 東京 — ok?", "   ", "",
                        "hello\n\nhello  world  "}) {
    EXPECT_EQ(bpe.decode(bpe.encode(s)), s) << s;
  }
  EXPECT_EQ(bpe.decode({bpe.end_of_text()}), "<|endoftext|>");
  EXPECT_NE(error_of([&] { bpe.encode(std::string("ab\xff", 3)); }).find("not valid UTF-8 at byte 2"), std::string::npos);
  EXPECT_NE(error_of([&] { bpe.decode({9999}); }).find("token id 9999"), std::string::npos);
}

// `tg tokenize TEXT OUT.bin --bpe=DIR`: <|endoftext|> and the text's tokens, in an llm.c shard.
TEST_F(BpeTest, TokenizeWritesBpeShards) {
  if (!Gpt2Bpe::available()) GTEST_SKIP() << "this build has no PCRE2 (libpcre2-dev)";
  write("vocab.json", "merges.txt", vocab(), MERGES);
  std::ofstream(path("in.txt")) << "hello world's hello";
  auto files = tg::launcher::tokenize_file(path("in.txt"), path("out.bin"), 1000, dir_.string());
  ASSERT_EQ(files.size(), 1u);
  TokenShard shard(files[0]);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < shard.size(); i++) ids.push_back(shard.tokens()[i]);
  Gpt2Bpe bpe = Gpt2Bpe::load(dir_.string());
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], bpe.end_of_text());
  EXPECT_EQ(bpe.decode(std::vector<int32_t>(ids.begin() + 1, ids.end())), "hello world's hello");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 256 + 4), 2);  // "hello" twice, one token each
}

TEST_F(BpeTest, BadVocabulariesAreNamed) {
  EXPECT_NE(error_of([&] { Gpt2Bpe::load(dir_.string()); }).find("holds neither vocab.json"), std::string::npos);
  auto v = vocab();
  v.erase(byte_char('a'));
  write("vocab.json", "merges.txt", v, MERGES);
  EXPECT_NE(error_of([&] { Gpt2Bpe::load(dir_.string()); }).find("lacks the token of a byte ('a')"), std::string::npos);
  auto merges = MERGES;
  merges.push_back({"x", "yz"});
  write("vocab.json", "merges.txt", vocab(), merges);
  EXPECT_NE(error_of([&] { Gpt2Bpe::load(dir_.string()); }).find("merge 8 ('x yz') makes a token the vocabulary lacks"),
            std::string::npos);
  auto sparse = vocab();
  sparse["<|endoftext|>"] = 2000000000;  // an id far past the vocabulary's size: refused, not allocated
  write("vocab.json", "merges.txt", sparse, MERGES);
  EXPECT_NE(error_of([&] { Gpt2Bpe::load(dir_.string()); }).find("gives token id 2000000000 among 264 tokens"),
            std::string::npos);
  std::ofstream(path("merges.txt")) << "#version: 0.2\nh e\nnot-a-merge\n";
  EXPECT_NE(error_of([&] { Gpt2Bpe::load(dir_.string()); }).find("line 3 is not a merge of two tokens"),
            std::string::npos);
  std::ofstream(path("merges.txt")) << "#version: 0.2\nh e\n";
  std::ofstream(path("vocab.json")) << "{\"a\": ";
  EXPECT_NE(error_of([&] { Gpt2Bpe::load(dir_.string()); }).find("vocab.json' is not JSON"), std::string::npos);
}

// Note [sampling a BPE run]: a tiny GPT trained on BPE shards of a repeated sentence (vocabulary
// padded to 320 past the tokenizer's 264) samples through --bpe: the prompt is encoded, only the
// tokenizer's ids are drawn, the text is decoded, and one seed gives one text. Without --bpe the
// run's vocabulary is named.
TEST_F(BpeTest, SampleDecodesARunOnBpeTokens) {
  if (!Gpt2Bpe::available()) GTEST_SKIP() << "this build has no PCRE2 (libpcre2-dev)";
  write("vocab.json", "merges.txt", vocab(), MERGES);
  std::string text;
  for (int i = 0; i < 100; i++) text += "hello world's hello. ";
  std::ofstream(path("in.txt")) << text;
  tg::launcher::tokenize_file(path("in.txt"), path("t_train.bin"), 100000, dir_.string());
  tg::launcher::tokenize_file(path("in.txt"), path("t_val.bin"), 100000, dir_.string());
  std::string run = path("run");
  tg::launcher::Config cfg = tg::launcher::parse_config(
      "", "c.yaml",
      {"model.name=gpt", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.vocab_size=320",
       "model.block_size=16", "data.name=tokens", "data.seq_len=16", "data.batch_size=8", "data.eval_batch_size=8",
       "data.train_files=" + path("t_train*.bin"), "data.val_files=" + path("t_val*.bin"), "optim.name=adamw",
       "optim.lr=0.01", "train.steps=30", "train.eval_every=30", "train.eval_batches=1", "train.progress=off",
       "train.run_dir=" + run});
  tg::launcher::run_train(cfg);

  tg::launcher::SampleRequest r{run, "hello world", {.tokens = 6, .temperature = 0.7, .top_k = 0, .seed = 3}, dir_.string()};
  std::string a = tg::launcher::sample_text(r);
  std::cout << "sampled: '" << a << "'\n";
  EXPECT_EQ(a, tg::launcher::sample_text(r));
  Gpt2Bpe bpe = Gpt2Bpe::load(dir_.string());
  EXPECT_EQ(bpe.decode(bpe.encode(a)), a);  // a text the tokenizer wrote: it round-trips
  EXPECT_NE(a.find("hello"), std::string::npos) << a;  // 30 steps on one sentence learn its words
  r.bpe_dir.clear();
  EXPECT_NE(error_of([&] { tg::launcher::sample_text(r); }).find("vocabulary has 320 tokens, not the 256"),
            std::string::npos);
}
