// Token data: llm.c shards written here and read back through the memory map, every kind of bad
// shard refused with a message naming the file, windows of T+1 tokens and their contents, the
// ranks' disjoint parts of each global batch, the loader position a resume restores, the text
// dataset's byte tokens and split, `tg tokenize` round trips, the datasets through the registry
// and config (their registered keys), and the Debian-installed default text when it is there.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "launcher/registry.h"
#include "launcher/run.h"
#include "test_util.h"
#include "tinygrad/nn/data.h"
#include "tinygrad/nn/tokens.h"

using namespace tg;
using namespace tg::nn;
using tg::testutil::error_of;
namespace fs = std::filesystem;
namespace L = tg::launcher;

namespace {

class TokensTest : public tg::testutil::TempDirTest {};

std::vector<uint16_t> iota_tokens(int64_t n, uint16_t first = 0) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[i] = static_cast<uint16_t>(first + i * 3);  // distinct, above 255 too
  return v;
}

// A shard built by hand: header ints (the rest zero), then raw token bytes.
void write_raw_shard(const std::string& p, std::vector<int32_t> head, const std::vector<uint16_t>& tokens,
                     size_t extra_bytes = 0) {
  head.resize(256, 0);
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(head.data()), 1024);
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  std::string extra(extra_bytes, '\x7');
  f.write(extra.data(), static_cast<std::streamsize>(extra.size()));
}

void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Example i's x and y as read through gather.
std::pair<std::vector<int32_t>, std::vector<int32_t>> example(const Examples& e, int64_t i) {
  const int64_t t = prod(e.x_shape());
  std::vector<int32_t> x(static_cast<size_t>(t)), y(static_cast<size_t>(t));
  e.gather(&i, 1, x.data(), y.data());
  return {x, y};
}

std::vector<int32_t> slice(const std::vector<uint16_t>& v, int64_t begin, int64_t n) {
  return std::vector<int32_t>(v.begin() + begin, v.begin() + begin + n);
}

// Every batch's window ids of one epoch, for one loader, read through next(): the ids are
// recovered from the x rows (each window's first token is unique in the data these tests use).
std::vector<std::vector<int32_t>> epoch_rows(DataLoader& dl, int64_t epoch, int64_t skip = 0) {
  dl.start_epoch(epoch, skip);
  std::vector<std::vector<int32_t>> out;
  while (auto b = dl.next()) {
    EXPECT_EQ(b->x.dtype(), DType::Int32);
    EXPECT_EQ(b->y.dtype(), DType::Int32);
    EXPECT_EQ(b->x.shape(), b->y.shape());
    auto x = b->x.to_vector<int32_t>();
    const int64_t t = b->x.shape(1);
    std::vector<int32_t> firsts;
    for (size_t r = 0; r * t < x.size(); r++) firsts.push_back(x[r * t]);
    out.push_back(firsts);
  }
  return out;
}

}  // namespace

// ---- shards ----

TEST_F(TokensTest, ShardRoundTripsThroughTheMemoryMap) {
  auto tokens = iota_tokens(1000);
  write_token_shard(path("a.bin"), tokens.data(), 1000);
  EXPECT_EQ(fs::file_size(path("a.bin")), 1024u + 2000u);
  EXPECT_FALSE(fs::exists(path("a.bin.tmp")));
  TokenShard s(path("a.bin"));
  EXPECT_EQ(s.size(), 1000);
  EXPECT_EQ(std::vector<uint16_t>(s.tokens(), s.tokens() + s.size()), tokens);
  // The header is llm.c's: magic, version 1, count, then zeros.
  std::ifstream f(path("a.bin"), std::ios::binary);
  int32_t head[256];
  f.read(reinterpret_cast<char*>(head), sizeof head);
  EXPECT_EQ(head[0], 20240520);
  EXPECT_EQ(head[1], 1);
  EXPECT_EQ(head[2], 1000);
  EXPECT_TRUE(std::all_of(head + 3, head + 256, [](int32_t v) { return v == 0; }));
  // An empty shard is a valid file (it has no window: see below).
  write_token_shard(path("empty.bin"), nullptr, 0);
  EXPECT_EQ(TokenShard(path("empty.bin")).size(), 0);
}

TEST_F(TokensTest, BadShardsAreNamedWithTheirProblem) {
  auto tokens = iota_tokens(10);
  auto msg = [&](const std::string& name) { return error_of([&] { TokenShard s(path(name)); }); };

  std::string m = msg("missing.bin");
  EXPECT_EQ(m, "tokens: '" + path("missing.bin") + "': no such file");

  fs::create_directories(path("dir.bin"));
  EXPECT_EQ(msg("dir.bin"), "tokens: '" + path("dir.bin") + "': not a regular file");

  write_file(path("short.bin"), std::string(100, '\0'));
  EXPECT_EQ(msg("short.bin"), "tokens: '" + path("short.bin") +
                                  "': 100 bytes, shorter than the 1024-byte header of an llm.c token shard "
                                  "(truncated, or not a shard)");

  write_raw_shard(path("magic.bin"), {12345, 1, 10}, tokens);
  EXPECT_EQ(msg("magic.bin"),
            "tokens: '" + path("magic.bin") +
                "': bad magic 12345 (an llm.c token shard starts with 20240520); not a token shard");

  write_raw_shard(path("v2.bin"), {20240520, 2, 10}, tokens);
  EXPECT_EQ(msg("v2.bin"),
            "tokens: '" + path("v2.bin") +
                "': version 2 is not supported (only version 1, uint16 tokens; version 2 is llm.c's uint32 "
                "LLaMA-3 format)");
  write_raw_shard(path("v7.bin"), {20240520, 7, 10}, tokens);
  EXPECT_EQ(msg("v7.bin"),
            "tokens: '" + path("v7.bin") + "': version 7 is not supported (only version 1, uint16 tokens)");

  write_raw_shard(path("neg.bin"), {20240520, 1, -4}, tokens);
  EXPECT_EQ(msg("neg.bin"), "tokens: '" + path("neg.bin") + "': the header's token count is negative (-4)");

  write_raw_shard(path("cut.bin"), {20240520, 1, 12}, tokens);  // 12 announced, 10 there
  EXPECT_EQ(msg("cut.bin"),
            "tokens: '" + path("cut.bin") +
                "': truncated: the header says 12 tokens (24 bytes after the header), the file has 20 bytes "
                "of tokens");

  write_raw_shard(path("long.bin"), {20240520, 1, 10}, tokens, 3);  // 3 bytes too many (odd, too)
  EXPECT_EQ(msg("long.bin"),
            "tokens: '" + path("long.bin") +
                "': the header says 10 tokens (20 bytes after the header), but the file has 23 bytes of "
                "tokens (3 trailing bytes)");

  write_raw_shard(path("small.bin"), {20240520, 1, 10},
                  tokens);  // sound, but shorter than a window of 10 + 1
  EXPECT_EQ(TokenShard(path("small.bin")).size(), 10);
  EXPECT_EQ(error_of([&] { shard_windows({path("small.bin")}, 10); }),
            "tokens: '" + path("small.bin") +
                "': 10 tokens, fewer than the 11 that one window of data.seq_len=10 needs (T+1)");
  EXPECT_EQ(shard_windows({path("small.bin")}, 9)->size(), 1);
}

// ---- windows ----

TEST_F(TokensTest, WindowsOfTPlusOneTokensNeverCrossAShard) {
  auto a = iota_tokens(20, 0), b = iota_tokens(13, 1000);
  write_token_shard(path("s_train_000.bin"), a.data(), 20);
  write_token_shard(path("s_train_001.bin"), b.data(), 13);
  auto w = shard_windows(glob_files(path("s_train_*.bin"), "test"), 4);
  // (20 - 1) / 4 = 4 windows in the first shard, (13 - 1) / 4 = 3 in the second.
  ASSERT_EQ(w->size(), 7);
  EXPECT_EQ(w->tokens(), 33);
  EXPECT_EQ(w->x_shape(), (Shape{4}));
  EXPECT_EQ(w->y_shape(), (Shape{4}));
  for (int64_t i = 0; i < 7; i++) {
    const auto& src = i < 4 ? a : b;
    const int64_t start = (i < 4 ? i : i - 4) * 4;
    auto [x, y] = example(*w, i);
    EXPECT_EQ(x, slice(src, start, 4)) << "window " << i;
    EXPECT_EQ(y, slice(src, start + 1, 4)) << "window " << i;
    EXPECT_EQ(w->window(i), std::make_pair(static_cast<size_t>(i < 4 ? 0 : 1), start));
  }
  // The last window of the first shard ends at token 16 (y at 17): tokens 17..19 are never read.
  EXPECT_EQ(example(*w, 3).second.back(), a[16]);
  EXPECT_HAS(error_of([&] { w->window(7); }), "window 7 is outside [0, 7)");
  EXPECT_HAS(error_of([&] { TokenWindows({}, 0, nullptr); }), "seq_len must be at least 1, got 0");

  // Batched: int32 [B, T] tensors, shuffle off = window order.
  DataLoader dl(w, {.batch_size = 3, .shuffle = false});
  EXPECT_EQ(dl.batches_per_epoch(), 3);
  auto batch = dl.next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->x.shape(), (Shape{3, 4}));
  EXPECT_EQ(batch->y.shape(), (Shape{3, 4}));
  std::vector<int32_t> want_x, want_y;
  for (int64_t i = 0; i < 3; i++) {
    auto s = slice(a, i * 4, 4), t = slice(a, i * 4 + 1, 4);
    want_x.insert(want_x.end(), s.begin(), s.end());
    want_y.insert(want_y.end(), t.begin(), t.end());
  }
  EXPECT_EQ(batch->x.to_vector<int32_t>(), want_x);
  EXPECT_EQ(batch->y.to_vector<int32_t>(), want_y);
}

TEST_F(TokensTest, ShuffleIsDeterministicPerSeedAndEpoch) {
  auto a = iota_tokens(401);
  write_token_shard(path("t.bin"), a.data(), 401);
  auto w = shard_windows({path("t.bin")}, 4);  // 100 windows
  DataLoader one(w, {.batch_size = 10, .seed = 5}), two(w, {.batch_size = 10, .seed = 5}),
      other(w, {.batch_size = 10, .seed = 6});
  auto e0 = epoch_rows(one, 0), e1 = epoch_rows(one, 1);
  EXPECT_EQ(e0, epoch_rows(two, 0));
  EXPECT_EQ(e1, epoch_rows(two, 1));
  EXPECT_NE(e0, e1) << "epochs shuffle differently";
  EXPECT_NE(e0, epoch_rows(other, 0)) << "seeds shuffle differently";
  std::vector<int32_t> all;
  for (auto& r : e1) all.insert(all.end(), r.begin(), r.end());
  std::sort(all.begin(), all.end());
  std::vector<int32_t> want;
  for (int64_t i = 0; i < 100; i++) want.push_back(a[i * 4]);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(all, want) << "an epoch visits every window once";
}

TEST_F(TokensTest, RanksTakeDisjointPartsOfEveryGlobalBatch) {
  auto a = iota_tokens(23 * 4 + 1);
  write_token_shard(path("t.bin"), a.data(), static_cast<int64_t>(a.size()));
  auto w = shard_windows({path("t.bin")}, 4);  // 23 windows: global batches of 6, 6, 6, 5
  ASSERT_EQ(w->size(), 23);
  const int world = 3;
  DataLoader global(w, {.batch_size = 6, .seed = 11});
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < world; r++)
    ranks.push_back(std::make_unique<DataLoader>(
        w, DataLoaderOptions{.batch_size = 6, .seed = 11, .rank = r, .world = world}));
  for (int64_t epoch : {0, 1}) {
    auto whole = epoch_rows(global, epoch);
    ASSERT_EQ(whole.size(), 4u);
    std::vector<std::vector<std::vector<int32_t>>> parts;
    for (auto& dl : ranks) {
      EXPECT_EQ(dl->batches_per_epoch(), 4) << "every rank has as many batches";
      parts.push_back(epoch_rows(*dl, epoch));
    }
    std::set<int32_t> seen;
    for (size_t k = 0; k < whole.size(); k++) {
      std::vector<int32_t> joined;
      for (int r = 0; r < world; r++) {
        const auto& mine = parts[r][k];
        if (k < 3) {
          EXPECT_EQ(mine.size(), 2u) << "a full batch of 6 gives each of 3 ranks 2 rows";
        }
        joined.insert(joined.end(), mine.begin(), mine.end());
        for (int32_t id : mine)
          EXPECT_TRUE(seen.insert(id).second) << "window starting with " << id << " served twice";
      }
      EXPECT_EQ(joined, whole[k]) << "rank parts in rank order make the global batch " << k;
    }
    EXPECT_EQ(seen.size(), 23u) << "together the ranks see every window of the epoch";
    // The short last batch of 5: rows [0, 1), [1, 3), [3, 5).
    EXPECT_EQ(parts[0][3].size(), 1u);
    EXPECT_EQ(parts[1][3].size(), 2u);
    EXPECT_EQ(parts[2][3].size(), 2u);
  }
  EXPECT_EQ(ranks[1]->batch_ids(0, 0).size(), 2u);
  EXPECT_HAS(error_of([&] { DataLoader(w, {.batch_size = 6, .rank = 3, .world = 3}); }),
             "rank 3 is outside a world of 3");
  EXPECT_HAS(error_of([&] { DataLoader(w, {.batch_size = 7, .world = 3}); }),
             "the global batch of 7 examples does not split evenly over 3 ranks");
}

TEST_F(TokensTest, PositionIsWhatAResumeRestores) {
  auto a = iota_tokens(50 * 8 + 1);
  write_token_shard(path("t.bin"), a.data(), static_cast<int64_t>(a.size()));
  auto w = shard_windows({path("t.bin")}, 8);
  DataLoaderOptions opt{.batch_size = 4, .seed = 3, .rank = 1, .world = 2};
  DataLoader first(w, opt);
  first.start_epoch(2);
  EXPECT_EQ(first.position(), (LoaderPosition{2, 0}));
  std::vector<std::vector<int32_t>> seen;
  for (int i = 0; i < 5; i++) seen.push_back(first.next()->x.to_vector<int32_t>());
  const LoaderPosition at = first.position();
  EXPECT_EQ(at, (LoaderPosition{2, 5}));
  std::vector<std::vector<int32_t>> rest_first, rest_resumed;
  while (auto b = first.next()) rest_first.push_back(b->x.to_vector<int32_t>());
  EXPECT_EQ(first.position(), (LoaderPosition{2, first.batches_per_epoch()}));

  DataLoader resumed(w, opt);  // a new process: restores the position and goes on
  resumed.seek(at);
  EXPECT_EQ(resumed.position(), at);
  auto b = resumed.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->epoch, 2);
  EXPECT_EQ(b->index, 5);
  rest_resumed.push_back(b->x.to_vector<int32_t>());
  while (auto c = resumed.next()) rest_resumed.push_back(c->x.to_vector<int32_t>());
  EXPECT_EQ(rest_resumed, rest_first);
  EXPECT_EQ(rest_first.size(), static_cast<size_t>(first.batches_per_epoch() - 5));
  EXPECT_HAS(error_of([&] { resumed.seek({2, 99}); }), "skip_batches=99 is outside [0, 13]");
}

// ---- text ----

TEST_F(TokensTest, TextIsBytesSplitAtTheEnd) {
  // 40 bytes, two of them a UTF-8 "é" (0xC3 0xA9): byte tokens, not code points.
  const std::string text = "Caf\xc3\xa9 society met at noon; nobody came!!";
  ASSERT_EQ(text.size(), 40u);
  write_file(path("t.txt"), text);
  auto tokens = byte_tokens(text);
  EXPECT_EQ(tokens[3], 0xC3);
  EXPECT_EQ(tokens[4], 0xA9);
  EXPECT_EQ(byte_text(tokens.data(), 40), text);
  auto s = text_windows(path("t.txt"), 4, 0.25);
  // val: the last round(40 * 0.25) = 10 bytes; train the first 30.
  ASSERT_EQ(s.train->spans().size(), 1u);
  EXPECT_EQ(s.train->tokens(), 30);
  EXPECT_EQ(s.val->tokens(), 10);
  EXPECT_EQ(s.train->size(), (30 - 1) / 4);
  EXPECT_EQ(s.val->size(), (10 - 1) / 4);
  auto [x, y] = example(*s.val, 1);
  EXPECT_EQ(x, slice(tokens, 30 + 4, 4));
  EXPECT_EQ(y, slice(tokens, 30 + 5, 4));
  auto [x0, y0] = example(*s.train, 0);
  EXPECT_EQ(x0, (std::vector<int32_t>{'C', 'a', 'f', 0xC3}));
  EXPECT_EQ(y0, (std::vector<int32_t>{'a', 'f', 0xC3, 0xA9}));

  // Gzipped text reads the same.
  gzFile g = gzopen(path("t.txt.gz").c_str(), "wb");
  ASSERT_NE(g, nullptr);
  gzwrite(g, text.data(), static_cast<unsigned>(text.size()));
  gzclose(g);
  EXPECT_EQ(read_text_file(path("t.txt.gz")), text);

  // Refusals name the file and the problem.
  EXPECT_EQ(error_of([&] { text_windows(path("t.txt"), 10, 0.25); }),
            "text: the validation split of '" + path("t.txt") +
                "' (its last 25%, 10 bytes): 10 tokens, fewer than the 11 that one window of data.seq_len=10 "
                "needs (T+1)");
  EXPECT_HAS(error_of([&] { text_windows(path("t.txt"), 4, 1.0); }),
             "validation fraction must be in (0, 1), got 1");
  write_file(path("bad.txt"), "ok\xff no");
  EXPECT_EQ(error_of([&] { read_text_file(path("bad.txt")); }),
            "text: '" + path("bad.txt") + "': not UTF-8 text (an invalid byte at offset 2)");
  EXPECT_EQ(error_of([&] { read_text_file(path("none.txt")); }),
            "text: '" + path("none.txt") + "': no such file");
  EXPECT_EQ(first_invalid_utf8("\xed\xa0\x80"), 0u) << "a surrogate";
  EXPECT_EQ(first_invalid_utf8("a\xc0\xaf"), 1u) << "an overlong form";
  EXPECT_EQ(first_invalid_utf8("\xf0\x9d\x84\x9e"), std::string::npos);
}

TEST_F(TokensTest, TokenizeWritesShardsThatReadBack) {
  std::string text;
  for (int i = 0; i < 30; i++) text += "line " + std::to_string(i) + ": \xe2\x98\x95 coffee\n";
  write_file(path("in.txt"), text);
  auto written = L::tokenize_file(path("in.txt"), path("out.bin"));
  ASSERT_EQ(written, std::vector<std::string>{path("out.bin")});
  TokenShard s(path("out.bin"));
  EXPECT_EQ(byte_text(s.tokens(), s.size()), text);
  // Read back through the tokens dataset: every window is the text's bytes.
  auto w = shard_windows({path("out.bin")}, 16);
  EXPECT_EQ(w->size(), static_cast<int64_t>((text.size() - 1) / 16));
  auto tokens = byte_tokens(text);
  for (int64_t i : {int64_t{0}, int64_t{7}, w->size() - 1}) {
    auto [x, y] = example(*w, i);
    EXPECT_EQ(x, slice(tokens, i * 16, 16));
    EXPECT_EQ(y, slice(tokens, i * 16 + 1, 16));
  }

  // More tokens than a shard holds: numbered shards in order, together the whole text.
  const int64_t n = static_cast<int64_t>(text.size());
  auto parts = L::tokenize_file(path("in.txt"), path("many.bin"), 300);
  ASSERT_EQ(parts.size(), static_cast<size_t>((n + 299) / 300));
  EXPECT_EQ(parts[0], path("many_000000.bin"));
  EXPECT_EQ(parts[1], path("many_000001.bin"));
  std::string joined;
  for (const auto& p : parts) {
    TokenShard part(p);
    EXPECT_LE(part.size(), 300);
    joined += byte_text(part.tokens(), part.size());
  }
  EXPECT_EQ(joined, text);

  // The command line.
  auto cli = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    testing::internal::CaptureStderr();
    testing::internal::CaptureStdout();
    int rc = L::tg_main(static_cast<int>(argv.size()), argv.data());
    std::string out = testing::internal::GetCapturedStdout();
    return std::make_tuple(rc, out, testing::internal::GetCapturedStderr());
  };
  auto [rc, out, err] = cli({"tg", "tokenize", path("in.txt"), path("cli.bin")});
  EXPECT_EQ(rc, 0) << err;
  EXPECT_EQ(out, "wrote " + std::to_string(n) + " tokens to " + path("cli.bin") + "\n");
  EXPECT_EQ(TokenShard(path("cli.bin")).size(), n);
  auto [rc2, out2, err2] = cli({"tg", "tokenize", path("in.txt")});
  EXPECT_EQ(rc2, 1);
  EXPECT_EQ(err2,
            "error: tg tokenize: OUT is required (usage: tg tokenize TEXT OUT.bin [--shard-tokens=N] [--bpe=DIR]; tg help "
            "tokenize)\n");
  auto [rc3, out3, err3] = cli({"tg", "tokenize", path("in.txt"), path("x.bin"), "--shard-tokens=0"});
  EXPECT_EQ(rc3, 1);
  EXPECT_HAS(err3, "--shard-tokens must be a whole number from 1 to 2147483647, got '0'");
  auto [rc4, out4, err4] = cli({"tg", "help", "tokenize"});
  EXPECT_HAS(out4, "or GPT-2 BPE with --bpe=DIR");
}

// ---- the registry and the config ----

TEST_F(TokensTest, TokensDatasetThroughTheConfig) {
  auto a = iota_tokens(81), b = iota_tokens(41, 2000);
  write_token_shard(path("d_train_000000.bin"), a.data(), 81);
  write_token_shard(path("d_val_000000.bin"), b.data(), 41);
  // llm.c's names in data.root.
  L::Config c =
      L::parse_config("data:\n  name: tokens\n  seq_len: 8\n", "c.yaml", {"data.root=" + dir_.string()});
  L::DataSplits s = L::make_dataset(c);
  EXPECT_EQ(s.train->size(), 10);
  EXPECT_EQ(s.test->size(), 5);
  EXPECT_EQ(s.num_classes, 50257);
  EXPECT_EQ(example(*s.test, 0).first, slice(b, 0, 8));
  // Globs.
  L::Config g =
      L::parse_config("", "c.yaml",
                      {"data.name=tokens", "data.seq_len=4", "data.train_files=" + path("*_train_*.bin"),
                       "data.val_files=" + path("d_val_000000.bin")});
  EXPECT_EQ(L::make_dataset(g).train->size(), 20);
  // Mistakes.
  L::Config none = L::parse_config("", "c.yaml", {"data.name=tokens", "data.root=" + path("nowhere")});
  EXPECT_EQ(error_of([&] { L::make_dataset(none); }),
            "dataset tokens: data.train_files is empty, so llm.c's train shards in data.root: '" +
                path("nowhere") + "/*_train_*.bin' matches no file");
  L::Config both =
      L::parse_config("", "c.yaml",
                      {"data.name=tokens", "data.seq_len=4", "data.train_files=" + path("d_*.bin"),
                       "data.val_files=" + path("d_val_*.bin")});
  EXPECT_EQ(error_of([&] { L::make_dataset(both); }),
            "dataset tokens: '" + path("d_val_000000.bin") +
                "' is both a training and a validation shard (data.train_files and data.val_files must match "
                "different files)");
  EXPECT_EQ(error_of([] { L::parse_config("", "c.yaml", {"data.seq_len=0"}); }),
            "config: data.seq_len must be >= 1, got 0");
  EXPECT_EQ(error_of([] { L::parse_config("", "c.yaml", {"data.val_fraction=1.5"}); }),
            "config: data.val_fraction must be in (0, 1), got 1.5");
  EXPECT_EQ(error_of([] { L::parse_config("", "c.yaml", {"data.seq_len=long"}); }),
            "override: data.seq_len must be an int, got 'long'");
  EXPECT_EQ(error_of([] { L::parse_config("", "c.yaml", {"data.seq_lne=8"}); }),
            "override: unknown config key 'data.seq_lne' (did you mean 'data.seq_len'?)");
}

TEST_F(TokensTest, TextDatasetThroughTheConfig) {
  std::string text(1000, 'a');
  for (size_t i = 0; i < text.size(); i++) text[i] = static_cast<char>('a' + i % 26);
  write_file(path("abc.txt"), text);
  L::Config c = L::parse_config(
      "", "c.yaml",
      {"data.name=text", "data.seq_len=10", "data.val_fraction=0.2", "data.text_file=" + path("abc.txt")});
  L::DataSplits s = L::make_dataset(c);
  EXPECT_EQ(s.num_classes, 256);
  EXPECT_EQ(s.train->size(), (800 - 1) / 10);
  EXPECT_EQ(s.test->size(), (200 - 1) / 10);
  DataLoader dl(s.train, {.batch_size = 8, .shuffle = true, .seed = 1});
  auto b = dl.next();
  ASSERT_TRUE(b);
  auto x = b->x.to_vector<int32_t>(), y = b->y.to_vector<int32_t>();
  for (size_t i = 0; i < x.size(); i++)
    EXPECT_EQ(y[i], 'a' + (x[i] - 'a' + 1) % 26) << "y is x shifted by one";
}

// A user's dataset with its own key, registered as a user would.
TG_REGISTER_DATASET("test_counting",
                    [](const L::Config& c) {
                      auto n = c.get_int("data.count_to");
                      auto tokens = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(n));
                      std::iota(tokens->begin(), tokens->end(), uint16_t{0});
                      auto w = std::make_shared<TokenWindows>(
                          std::vector<TokenSpan>{{tokens->data(), n, "counting"}}, 2, tokens);
                      return L::DataSplits{w, w, n};
                    },
                    {{"data.count_to", L::ValueType::Int, int64_t{9}, "test_counting: how many tokens",
                      L::int_at_least(3)}});

TEST(TokensConfig, DatasetsRegisterTheirOwnKeys) {
  L::Config c = L::parse_config("data:\n  name: test_counting\n  count_to: 21\n", "c.yaml");
  EXPECT_EQ(c.get_int("data.count_to"), 21);
  EXPECT_EQ(L::make_dataset(c).train->size(), 10);
  EXPECT_EQ(L::Config().get_int("data.count_to"), 9) << "the registered default";
  EXPECT_EQ(error_of([] { L::parse_config("", "c.yaml", {"data.count_to=2"}); }),
            "config: data.count_to must be >= 3, got 2");
  // Registered keys sit in their section: config.yaml keeps one data section, and reads back.
  std::string yaml = c.to_yaml();
  size_t first = yaml.find("data:");
  EXPECT_NE(first, std::string::npos);
  EXPECT_EQ(yaml.find("data:", first + 1), std::string::npos) << yaml;
  EXPECT_HAS(yaml, "count_to: 21");
  EXPECT_HAS(yaml, "seq_len: 1024");
  EXPECT_EQ(L::parse_config(yaml, "back.yaml").get_int("data.count_to"), 21);
  const auto& schema = L::config_schema();
  auto pos = [&](const std::string& k) {
    return std::find_if(schema.begin(), schema.end(), [&](const L::ConfigField& f) { return f.key == k; }) -
           schema.begin();
  };
  EXPECT_LT(pos("data.count_to"), pos("optim.name"));
  EXPECT_GT(pos("data.count_to"), pos("data.seed"));

  // Registration mistakes.
  using L::ValueType;
  EXPECT_EQ(error_of([] {
              L::register_config_keys("dataset 'x'", {{"optim.lr", ValueType::Float, 0.1, ""}});
            }),
            "register dataset 'x': config key 'optim.lr' is built in");
  EXPECT_EQ(
      error_of([] {
        L::register_config_keys("dataset 'x'", {{"data.seq_len", ValueType::Int, int64_t{64}, ""}});
      }),
      "register dataset 'x': config key 'data.seq_len' is already registered with another type or default");
  EXPECT_EQ(
      error_of([] {
        L::register_config_keys("dataset 'x'", {{"seq", ValueType::Int, int64_t{1}, ""}});
      }),
      "register dataset 'x': config key 'seq' has no section (keys are section.name, e.g. data.seq_len)");
  EXPECT_EQ(error_of([] {
              L::register_config_keys("dataset 'x'", {{"data.k", ValueType::Int, 1.5, ""}});
            }),
            "register dataset 'x': the default of data.k is not of type int");
  // The same type and default: shared, listed once.
  L::register_config_keys("dataset 'y'", {{"data.seq_len", ValueType::Int, int64_t{1024}, "again"}});
  EXPECT_EQ(std::count_if(schema.begin(), schema.end(),
                          [](const L::ConfigField& f) { return f.key == "data.seq_len"; }),
            1);
}

// ---- the Debian-installed text ----

TEST(TokensDefaultText, JargonFileWhenInstalled) {
  if (!fs::exists(DEFAULT_TEXT_FILE))
    GTEST_SKIP() << DEFAULT_TEXT_FILE
                 << " is absent: install the Debian package jargon-text (scripts/setup.sh does)";
  std::string text = read_text_file(DEFAULT_TEXT_FILE);
  EXPECT_GT(text.size(), 1'500'000u);
  EXPECT_HAS(text.substr(0, 200), "The Jargon File");
  L::Config c = L::parse_config("", "c.yaml", {"data.name=text", "data.seq_len=256"});
  L::DataSplits s = L::make_dataset(c);
  const auto n = static_cast<int64_t>(text.size());
  const int64_t n_val = std::llround(n * 0.1);
  EXPECT_EQ(s.train->size(), (n - n_val - 1) / 256);
  EXPECT_EQ(s.test->size(), (n_val - 1) / 256);
  auto [x, y] = example(*s.test, 0);
  auto tokens = byte_tokens(text);
  EXPECT_EQ(x, slice(tokens, n - n_val, 256));
}
