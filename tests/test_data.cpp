// Data: IDX files (plain and gzipped) written here and read back, refusal of corrupt files, the
// real Fashion-MNIST files when the Debian package is installed, and DataLoader's determinism,
// batching, normalisation and resume.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "tinygrad/nn/data.h"
#include "test_util.h"

using namespace tg;
using namespace tg::nn;
using tg::testutil::error_of;
namespace fs = std::filesystem;

namespace {

class DataTest : public tg::testutil::TempDirTest {};

// IDX bytes for u8 data, built by hand: 0x00 0x00 type ndim, big-endian u32 dims, data.
std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data, uint8_t type = 0x08) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int sh = 24; sh >= 0; sh -= 8) s.push_back(static_cast<char>((d >> sh) & 0xFF));
  s.append(data.begin(), data.end());
  return s;
}
void write_plain(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
void write_gz(const std::string& p, const std::string& bytes) {
  gzFile g = gzopen(p.c_str(), "wb");
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(gzwrite(g, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(g), Z_OK);
}
std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}


std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

// N samples of item shape {1, 2, 2}: every pixel of sample i is i % 256, its label is i.
DataLoader make_loader(int64_t n, DataLoaderOptions opt) {
  std::vector<uint8_t> images(static_cast<size_t>(n) * 4);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    std::fill_n(images.begin() + i * 4, 4, static_cast<uint8_t>(i % 256));
    labels[i] = static_cast<int32_t>(i);
  }
  return DataLoader(std::move(images), {1, 2, 2}, std::move(labels), opt);
}
// All labels of one epoch, in order, and the batch sizes.
std::vector<int32_t> epoch_labels(DataLoader& dl, int64_t epoch, int64_t skip = 0, std::vector<int64_t>* sizes = nullptr) {
  dl.start_epoch(epoch, skip);
  std::vector<int32_t> out;
  while (auto b = dl.next()) {
    auto y = b->y.to_vector<int32_t>();
    out.insert(out.end(), y.begin(), y.end());
    if (sizes) sizes->push_back(b->y.shape(0));
  }
  return out;
}

}  // namespace

// ---- IDX ----

TEST_F(DataTest, ReadsPlainAndGzippedIdx) {
  auto data = iota_bytes(2 * 3 * 4);
  std::string bytes = idx_bytes({2, 3, 4}, data);
  write_plain(path("a-idx3-ubyte"), bytes);
  write_gz(path("a-idx3-ubyte.gz"), bytes);
  for (const char* name : {"a-idx3-ubyte", "a-idx3-ubyte.gz"}) {
    IdxArray a = read_idx(path(name));
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4})) << name;
    EXPECT_EQ(a.data, data) << name;
    EXPECT_EQ(a.numel(), 24);
  }
  // 1-d (labels), magic 0x00000801.
  write_gz(path("l.gz"), idx_bytes({5}, {0, 9, 3, 3, 1}));
  EXPECT_EQ(read_idx(path("l.gz")).data, (std::vector<uint8_t>{0, 9, 3, 3, 1}));
  // Zero items.
  write_plain(path("z"), idx_bytes({0, 28, 28}, {}));
  EXPECT_EQ(read_idx(path("z")).dims, (std::vector<int64_t>{0, 28, 28}));
}

TEST_F(DataTest, WriteIdxRoundTrips) {
  IdxArray a{{3, 5}, iota_bytes(15)};
  write_idx(path("p"), a);
  write_idx(path("g.gz"), a, /*gzip=*/true);
  EXPECT_EQ(read_all(path("p")), idx_bytes({3, 5}, a.data));  // the published byte layout
  EXPECT_EQ(static_cast<unsigned char>(read_all(path("g.gz"))[0]), 0x1F);  // gzip magic
  for (const char* name : {"p", "g.gz"}) {
    IdxArray b = read_idx(path(name));
    EXPECT_EQ(b.dims, a.dims);
    EXPECT_EQ(b.data, a.data);
  }
  EXPECT_HAS(error_of([&] { write_idx(path("x"), IdxArray{{4}, {1, 2}}); }), "2 bytes of data for dims [4]");
}

TEST_F(DataTest, RefusesCorruptIdx) {
  auto data = iota_bytes(12);
  auto refuse = [&](const std::string& bytes, bool gz = false) {
    std::string p = path(gz ? "bad.gz" : "bad");
    if (gz) write_gz(p, bytes);
    else write_plain(p, bytes);
    std::string m = error_of([&] { read_idx(p); });
    EXPECT_HAS(m, p);
    return m;
  };
  std::string good = idx_bytes({3, 4}, data);
  EXPECT_HAS(refuse(std::string("\x01\x02\x08\x02", 4) + good.substr(4)), "bad magic 0x01020802");
  EXPECT_HAS(refuse(idx_bytes({3, 4}, data, 0x0D)), "element type 0x0D (float32); only unsigned byte (0x08)");
  EXPECT_HAS(refuse(idx_bytes({}, {})), "declares 0 dimensions");
  EXPECT_HAS(refuse(good.substr(0, 2)), "shorter than the 4-byte IDX magic");
  EXPECT_HAS(refuse(good.substr(0, 9)), "header is truncated");
  EXPECT_HAS(refuse(good.substr(0, good.size() - 5)), "data is truncated: dims [3,4] need 12 bytes, the file has 7");
  EXPECT_HAS(refuse(good.substr(0, good.size() - 5), /*gz=*/true), "data is truncated");
  EXPECT_HAS(refuse(good + "xy"), "trailing data after the 12 bytes");
  // A gzip stream cut in half.
  write_gz(path("full.gz"), idx_bytes({64, 64}, iota_bytes(4096)));
  std::string gz = read_all(path("full.gz"));
  write_plain(path("cut.gz"), gz.substr(0, gz.size() / 2));
  std::string m = error_of([&] { read_idx(path("cut.gz")); });
  EXPECT_TRUE(m.find("gzip stream is truncated") != std::string::npos || m.find("data is truncated") != std::string::npos)
      << m;
  // Garbage after a gzip header.
  write_plain(path("junk.gz"), gz.substr(0, 10) + std::string(200, '\x55'));
  EXPECT_HAS(error_of([&] { read_idx(path("junk.gz")); }), "gzip");
  EXPECT_HAS(error_of([&] { read_idx(path("missing")); }), "no such file");
}

// dims [2^32-1, 2^32-1, 0] hold no byte, but their running product passes INT64_MAX and used to
// overflow tg::prod (IdxArray::numel) after the unsigned size checks let them through.
TEST_F(DataTest, RefusesDimsThatOverflowWithAZeroAmongThem) {
  std::string p = path("overflow");
  write_plain(p, std::string("\0\0\x08\x03\xff\xff\xff\xff\xff\xff\xff\xff\0\0\0\0", 16));
  std::string m = error_of([&] { read_idx(p); });
  EXPECT_HAS(m, "read_idx: '" + p + "': shape [4294967295,4294967295,0]: its dimensions multiply past");
}

// ---- Fashion-MNIST ----

TEST_F(DataTest, FashionMnistFromTheDebianPackage) {
  if (!fs::exists(std::string(FASHION_MNIST_ROOT) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << FASHION_MNIST_ROOT
                 << " (apt-get install dataset-fashion-mnist)";
  for (auto [split, n] : {std::pair<const char*, int64_t>{"train", 60000}, {"test", 10000}}) {
    Dataset ds = fashion_mnist(split);
    EXPECT_EQ(ds.size(), n);
    EXPECT_EQ(ds.images().shape(), (Shape{n, 1, 28, 28}));
    EXPECT_EQ(ds.images().dtype(), DType::UInt8);
    EXPECT_EQ(ds.labels().shape(), (Shape{n}));
    EXPECT_EQ(ds.labels().dtype(), DType::Int32);
    EXPECT_EQ(static_cast<int64_t>(ds.host_images.size()), n * 784);
    EXPECT_EQ(ds.item_shape, (Shape{1, 28, 28}));
    std::vector<int64_t> counts(10, 0);
    for (int32_t l : ds.host_labels) {
      ASSERT_GE(l, 0);
      ASSERT_LE(l, 9);
      counts[l]++;
    }
    for (int c = 0; c < 10; c++) EXPECT_EQ(counts[c], n / 10) << split << " class " << c;  // balanced
    EXPECT_EQ(ds.labels().to_vector<int32_t>(), ds.host_labels);
    auto first = ds.images()[0].to_vector<uint8_t>();
    EXPECT_TRUE(std::equal(first.begin(), first.end(), ds.host_images.begin()));
    EXPECT_GT(*std::max_element(ds.host_images.begin(), ds.host_images.begin() + 784), 0);
    if (n == 10000) {
      // A real batch through the loader.
      DataLoader dl(ds, {.batch_size = 512, .shuffle = true, .seed = 1, .drop_last = true, .mean = 0.2860, .std = 0.3530});
      EXPECT_EQ(dl.batches_per_epoch(), 19);
      auto b = dl.next();
      ASSERT_TRUE(b);
      EXPECT_EQ(b->x.shape(), (Shape{512, 1, 28, 28}));
      EXPECT_EQ(b->x.dtype(), DType::Float32);
      auto x = b->x.to_vector<float>();
      EXPECT_NEAR(*std::min_element(x.begin(), x.end()), -0.2860 / 0.3530, 1e-5);
      EXPECT_NEAR(*std::max_element(x.begin(), x.end()), (1 - 0.2860) / 0.3530, 1e-5);
    }
  }
}

TEST_F(DataTest, FashionMnistErrors) {
  std::string m = error_of([&] { fashion_mnist("train", path("nowhere")); });
  EXPECT_HAS(m, "train-images-idx3-ubyte.gz' not found");
  EXPECT_HAS(m, "install the Debian package dataset-fashion-mnist");
  EXPECT_HAS(m, "apt-get install dataset-fashion-mnist");
  EXPECT_HAS(error_of([&] { fashion_mnist("validation", path("")); }), "split must be \"train\" or \"test\", got \"validation\"");
  // A root of our own (plain files), with a bad label and then mismatched counts.
  write_idx(path("t10k-images-idx3-ubyte"), IdxArray{{2, 28, 28}, std::vector<uint8_t>(2 * 784, 1)});
  write_idx(path("t10k-labels-idx1-ubyte.gz"), IdxArray{{2}, {3, 12}}, true);
  EXPECT_HAS(error_of([&] { fashion_mnist("test", dir_.string()); }), "label 12 at index 1 is outside 0..9");
  write_idx(path("t10k-labels-idx1-ubyte.gz"), IdxArray{{3}, {3, 1, 2}}, true);
  EXPECT_HAS(error_of([&] { fashion_mnist("test", dir_.string()); }), "expected [2] to match the images");
  write_idx(path("t10k-labels-idx1-ubyte.gz"), IdxArray{{2}, {3, 1}}, true);
  Dataset ds = fashion_mnist("test", dir_.string());
  EXPECT_EQ(ds.host_labels, (std::vector<int32_t>{3, 1}));
}

// ---- DataLoader ----

TEST(DataLoader, ShuffleOffIsIdentityOrderAndBatchCounts) {
  DataLoader dl = make_loader(10, {.batch_size = 3, .shuffle = false});
  EXPECT_EQ(dl.batches_per_epoch(), 4);
  std::vector<int64_t> sizes;
  std::vector<int32_t> all = epoch_labels(dl, 0, 0, &sizes);
  std::vector<int32_t> want(10);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(all, want);
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(epoch_labels(dl, 5), want) << "no shuffle: every epoch in order";

  DataLoader dd = make_loader(10, {.batch_size = 3, .shuffle = false, .drop_last = true});
  EXPECT_EQ(dd.batches_per_epoch(), 3);
  sizes.clear();
  EXPECT_EQ(epoch_labels(dd, 0, 0, &sizes).size(), 9u);
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(make_loader(9, {.batch_size = 3, .drop_last = false}).batches_per_epoch(), 3);
  EXPECT_EQ(make_loader(9, {.batch_size = 3, .drop_last = true}).batches_per_epoch(), 3);
  EXPECT_EQ(make_loader(2, {.batch_size = 3, .drop_last = true}).batches_per_epoch(), 0);
  EXPECT_EQ(make_loader(0, {.batch_size = 3}).batches_per_epoch(), 0);
}

TEST(DataLoader, ShuffleIsDeterministicPerSeedAndEpoch) {
  DataLoaderOptions opt{.batch_size = 16, .shuffle = true, .seed = 1234};
  DataLoader a = make_loader(1000, opt), b = make_loader(1000, opt);
  auto a0 = epoch_labels(a, 0), b0 = epoch_labels(b, 0), a1 = epoch_labels(a, 1), b1 = epoch_labels(b, 1);
  EXPECT_EQ(a0, b0) << "same seed, same epoch: same order";
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, a1) << "another epoch: another order";
  EXPECT_EQ(epoch_labels(a, 0), a0) << "an epoch replayed gives its order again";
  std::vector<int32_t> sorted = a0;
  std::sort(sorted.begin(), sorted.end());
  for (int32_t i = 0; i < 1000; i++) ASSERT_EQ(sorted[i], i) << "each sample exactly once per epoch";
  std::vector<int32_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a0, identity);
  auto perm = a.permutation(1);
  EXPECT_TRUE(std::equal(perm.begin(), perm.end(), a1.begin()));
  opt.seed = 1235;
  DataLoader c = make_loader(1000, opt);
  EXPECT_NE(epoch_labels(c, 0), a0) << "another seed: another order";
  // The documented rule is "the permutation of seed + epoch": seed+1 at epoch 0 is seed at epoch 1.
  EXPECT_EQ(epoch_labels(c, 0), a1);
}

TEST(DataLoader, NormalisesIntoFloatBatches) {
  DataLoader dl = make_loader(300, {.batch_size = 64, .shuffle = true, .seed = 7, .mean = 0.5, .std = 0.25});
  dl.start_epoch(3);
  int64_t seen = 0;
  while (auto b = dl.next()) {
    EXPECT_EQ(b->epoch, 3);
    EXPECT_EQ(b->index, seen);
    EXPECT_EQ(b->x.dtype(), DType::Float32);
    EXPECT_EQ(b->y.dtype(), DType::Int32);
    int64_t rows = b->y.shape(0);
    EXPECT_EQ(b->x.shape(), (Shape{rows, 1, 2, 2}));
    auto x = b->x.to_vector<float>();
    auto y = b->y.to_vector<int32_t>();
    for (int64_t r = 0; r < rows; r++)
      for (int k = 0; k < 4; k++) {
        float want = static_cast<float>(((y[r] % 256) / 255.0 - 0.5) / 0.25);
        ASSERT_FLOAT_EQ(x[r * 4 + k], want) << "row " << r << " label " << y[r];
      }
    seen++;
  }
  EXPECT_EQ(seen, 5);
  // Defaults: pixels / 255.
  DataLoader d2 = make_loader(256, {.batch_size = 256, .shuffle = false});
  auto x = d2.next()->x.to_vector<float>();
  EXPECT_FLOAT_EQ(x[0], 0.f);
  EXPECT_FLOAT_EQ(x[255 * 4], 1.f);
  EXPECT_FLOAT_EQ(x[51 * 4 + 2], 0.2f);
}

TEST(DataLoader, SkipBatchesResumesMidEpoch) {
  DataLoaderOptions opt{.batch_size = 10, .shuffle = true, .seed = 99};
  DataLoader full = make_loader(95, opt), resumed = make_loader(95, opt);
  auto all = epoch_labels(full, 2);
  ASSERT_EQ(all.size(), 95u);
  std::vector<int64_t> sizes;
  auto rest = epoch_labels(resumed, 2, 4, &sizes);
  EXPECT_EQ(rest, std::vector<int32_t>(all.begin() + 40, all.end()));
  EXPECT_EQ(sizes, (std::vector<int64_t>{10, 10, 10, 10, 10, 5}));
  resumed.start_epoch(2, 4);
  EXPECT_EQ(resumed.next()->index, 4);
  resumed.start_epoch(2, resumed.batches_per_epoch());
  EXPECT_FALSE(resumed.next()) << "skipping every batch leaves an empty epoch";
  EXPECT_HAS(error_of([&] { resumed.start_epoch(2, 11); }), "skip_batches=11 is outside [0, 10]");
  EXPECT_HAS(error_of([&] { resumed.start_epoch(-1); }), "epoch must be non-negative");
}

TEST(DataLoader, RestartsAndEndsCleanly) {
  DataLoader dl = make_loader(50, {.batch_size = 5, .shuffle = true, .seed = 3, .prefetch = 2});
  // next() before start_epoch: epoch 0.
  auto first = dl.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->epoch, 0);
  EXPECT_EQ(dl.epoch(), 0);
  auto perm0 = dl.permutation(0);
  EXPECT_EQ(first->y.to_vector<int32_t>(), std::vector<int32_t>(perm0.begin(), perm0.begin() + 5));
  // Restart in the middle of an epoch, while the queue is full: no stale batch leaks through.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  dl.start_epoch(1);
  auto perm1 = dl.permutation(1);
  std::vector<int32_t> got;
  while (auto b = dl.next()) {
    EXPECT_EQ(b->epoch, 1);
    auto y = b->y.to_vector<int32_t>();
    got.insert(got.end(), y.begin(), y.end());
  }
  EXPECT_EQ(got, std::vector<int32_t>(perm1.begin(), perm1.end()));
  EXPECT_FALSE(dl.next()) << "an ended epoch stays ended";
  EXPECT_FALSE(dl.next());
  // Many loaders destroyed with full queues or mid-epoch: the destructor joins the thread.
  for (int i = 0; i < 20; i++) {
    DataLoader t = make_loader(100, {.batch_size = 4});
    if (i % 2) t.next();
  }
}

TEST(DataLoader, RefusesBadArguments) {
  EXPECT_HAS(error_of([] { DataLoader({1, 2, 3}, {1}, {0, 1}); }), "3 image bytes, but 2 labels of item shape [1] need 2");
  EXPECT_HAS(error_of([] { make_loader(4, {.batch_size = 0}); }), "batch_size must be positive, got 0");
  EXPECT_HAS(error_of([] { make_loader(4, {.std = 0}); }), "std must be positive");
  EXPECT_HAS(error_of([] { make_loader(4, {.prefetch = 0}); }), "prefetch must be at least 1");
}
