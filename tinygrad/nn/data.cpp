// IDX reading/writing through zlib, Fashion-MNIST loading, image examples, and DataLoader's
// permutation, rank split, host-side batch building and prefetch thread.
#include "tinygrad/nn/data.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "tinygrad/engine/trace.h"
#include "tinygrad/error.h"

namespace tg::nn {

namespace fs = std::filesystem;

namespace {

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

const char* idx_type_name(int t) {
  switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

// A gzFile that closes itself.
struct GzFile {
  gzFile f = nullptr;
  ~GzFile() {
    if (f) gzclose(f);
  }
};

// Reads up to n bytes; returns how many were read (fewer only at the end of the data). A corrupt
// or cut-off gzip stream is an error.
size_t gz_read(gzFile f, void* dst, size_t n, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    unsigned want = static_cast<unsigned>(std::min<size_t>(n - done, INT_MAX / 2));
    int got = gzread(f, p + done, want);
    int errnum = Z_OK;
    const char* msg = gzerror(f, &errnum);
    TG_CHECK(got >= 0 && errnum == Z_OK, "read_idx: '", path, "': ",
             errnum == Z_BUF_ERROR ? "gzip stream is truncated" : "corrupt gzip data", " (zlib: ",
             errnum == Z_ERRNO ? std::strerror(errno) : msg, ")");
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

std::string dims_str(const std::vector<int64_t>& d) { return shape_str(d); }

// splitmix64's finaliser: neighbouring seeds (seed + epoch) give unrelated generator states.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform integer in [0, n) by rejection; unlike std::uniform_int_distribution its results are
// the same with every standard library.
uint64_t bounded(std::mt19937_64& rng, uint64_t n) {
  uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  while (true) {
    uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

}  // namespace

// ---- IDX ----

IdxArray read_idx(const std::string& path) {
  std::error_code ec;
  TG_CHECK(fs::exists(path, ec), "read_idx: '", path, "': no such file");
  TG_CHECK(fs::is_regular_file(path, ec), "read_idx: '", path, "': not a regular file");
  GzFile g;
  g.f = gzopen(path.c_str(), "rb");  // reads plain files as they are (zlib's transparent mode)
  TG_CHECK(g.f, "read_idx: '", path, "': cannot open: ", std::strerror(errno));
  gzbuffer(g.f, 1 << 20);

  unsigned char head[4];
  size_t got = gz_read(g.f, head, 4, path);
  TG_CHECK(got == 4, "read_idx: '", path, "': ", got, " bytes, shorter than the 4-byte IDX magic");
  uint32_t magic = (uint32_t{head[0]} << 24) | (uint32_t{head[1]} << 16) | (uint32_t{head[2]} << 8) | head[3];
  TG_CHECK(head[0] == 0 && head[1] == 0, "read_idx: '", path, "': bad magic ", hex32(magic),
           " (an IDX file starts with 0x0000TTDD: type TT, DD dimensions); not an IDX file");
  TG_CHECK(head[2] == 0x08, "read_idx: '", path, "': magic ", hex32(magic), " has element type ",
           "0x", hex32(head[2]).substr(8), " (", idx_type_name(head[2]),
           "); only unsigned byte (0x08) is supported");
  int ndim = head[3];
  TG_CHECK(ndim >= 1, "read_idx: '", path, "': magic ", hex32(magic), " declares 0 dimensions");

  std::vector<unsigned char> dim_bytes(4 * ndim);
  got = gz_read(g.f, dim_bytes.data(), dim_bytes.size(), path);
  TG_CHECK(got == dim_bytes.size(), "read_idx: '", path, "': header is truncated (", ndim,
           " dimensions need ", dim_bytes.size(), " bytes after the magic, file has ", got, ")");
  IdxArray out;
  for (int i = 0; i < ndim; i++) {
    const unsigned char* b = &dim_bytes[4 * i];
    out.dims.push_back((int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3]);
  }
  uint64_t numel = 0;
  try {
    numel = static_cast<uint64_t>(tg::prod(out.dims));
  } catch (const Error& e) {
    throw Error("read_idx: '" + path + "': " + e.what());
  }
  TG_CHECK(numel < (uint64_t{1} << 48), "read_idx: '", path, "': dims ", dims_str(out.dims), " are absurd");

  // Grow as the data arrives (doubling from 64 KiB, at most 16 MiB a step), so a corrupt header
  // cannot make us allocate terabytes, or even megabytes for a tiny file, up front.
  constexpr size_t MIN_CHUNK = size_t{1} << 16, MAX_CHUNK = size_t{1} << 24;
  while (out.data.size() < numel) {
    size_t old = out.data.size();
    size_t want = std::min<size_t>(std::clamp(old, MIN_CHUNK, MAX_CHUNK), numel - old);
    out.data.resize(old + want);
    got = gz_read(g.f, out.data.data() + old, want, path);
    TG_CHECK(got == want, "read_idx: '", path, "': data is truncated: dims ", dims_str(out.dims), " need ", numel,
             " bytes, the file has ", old + got);
  }
  unsigned char extra;
  TG_CHECK(gz_read(g.f, &extra, 1, path) == 0, "read_idx: '", path, "': trailing data after the ", numel,
           " bytes that dims ", dims_str(out.dims), " describe");
  return out;
}

void write_idx(const std::string& path, const IdxArray& a, bool gzip) {
  TG_CHECK(!a.dims.empty() && a.dims.size() <= 255, "write_idx: '", path, "': ", a.dims.size(),
           " dimensions (IDX holds 1 to 255)");
  for (auto d : a.dims)
    TG_CHECK(d >= 0 && d <= 0xFFFFFFFFll, "write_idx: '", path, "': dim ", d, " does not fit an IDX u32");
  TG_CHECK(static_cast<int64_t>(a.data.size()) == a.numel(), "write_idx: '", path, "': ", a.data.size(),
           " bytes of data for dims ", dims_str(a.dims));
  GzFile g;
  g.f = gzopen(path.c_str(), gzip ? "wb6" : "wbT");  // T: plain, uncompressed output
  TG_CHECK(g.f, "write_idx: cannot create '", path, "': ", std::strerror(errno));
  std::vector<unsigned char> head = {0, 0, 0x08, static_cast<unsigned char>(a.dims.size())};
  for (auto d : a.dims)
    for (int s = 24; s >= 0; s -= 8) head.push_back(static_cast<unsigned char>(static_cast<uint64_t>(d) >> s));
  auto put = [&](const void* p, size_t n) {
    auto* c = static_cast<const char*>(p);
    while (n > 0) {
      unsigned want = static_cast<unsigned>(std::min<size_t>(n, INT_MAX / 2));
      int w = gzwrite(g.f, c, want);
      TG_CHECK(w > 0, "write_idx: cannot write '", path, "'");
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  put(head.data(), head.size());
  put(a.data.data(), a.data.size());
  int rc = gzclose(g.f);
  g.f = nullptr;
  TG_CHECK(rc == Z_OK, "write_idx: cannot finish '", path, "' (zlib error ", rc, ")");
}

// ---- Fashion-MNIST ----

Dataset fashion_mnist(const std::string& split, const std::string& root) {
  TG_CHECK(split == "train" || split == "test", "fashion_mnist: split must be \"train\" or \"test\", got \"", split,
           "\"");
  const std::string prefix = split == "train" ? "train" : "t10k";
  auto find = [&](const std::string& name) {
    std::error_code ec;
    for (const std::string& candidate : {name + ".gz", name}) {
      fs::path p = fs::path(root) / candidate;
      if (fs::exists(p, ec)) return p.string();
    }
    TG_FAIL("fashion_mnist: '", (fs::path(root) / (name + ".gz")).string(),
            "' not found; install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)"
            ", or pass as root a directory that holds ", name, ".gz");
  };
  const std::string images_path = find(prefix + "-images-idx3-ubyte");
  const std::string labels_path = find(prefix + "-labels-idx1-ubyte");
  IdxArray im = read_idx(images_path), lb = read_idx(labels_path);
  TG_CHECK(im.dims.size() == 3 && im.dims[1] == 28 && im.dims[2] == 28, "fashion_mnist: '", images_path,
           "' holds dims ", dims_str(im.dims), ", expected [N,28,28]");
  TG_CHECK(lb.dims.size() == 1 && lb.dims[0] == im.dims[0], "fashion_mnist: '", labels_path, "' holds dims ",
           dims_str(lb.dims), ", expected [", im.dims[0], "] to match the images");
  const int64_t n = im.dims[0];
  Dataset ds;
  ds.item_shape = {1, 28, 28};
  ds.host_labels.resize(n);
  for (int64_t i = 0; i < n; i++) {
    TG_CHECK(lb.data[i] <= 9, "fashion_mnist: '", labels_path, "': label ", int{lb.data[i]}, " at index ", i,
             " is outside 0..9");
    ds.host_labels[i] = lb.data[i];
  }
  ds.host_images = std::move(im.data);
  return ds;
}

Tensor Dataset::images() const {
  Shape s = {size()};
  s.insert(s.end(), item_shape.begin(), item_shape.end());
  return Tensor::from_data(host_images.data(), DType::UInt8, s);
}

Tensor Dataset::labels() const { return Tensor::from_data(host_labels.data(), DType::Int32, {size()}); }

// ---- image examples ----

ImageExamples::ImageExamples(Dataset ds, double scale, double mean, double std) : ds_(std::move(ds)) {
  TG_CHECK(std::isfinite(std) && std > 0, "DataLoader: std must be positive and finite, got ", std);
  TG_CHECK(std::isfinite(mean) && std::isfinite(scale), "DataLoader: mean (", mean, ") and scale (", scale,
           ") must be finite");
  for (auto d : ds_.item_shape) TG_CHECK(d >= 0, "DataLoader: negative dim in item shape ", shape_str(ds_.item_shape));
  item_size_ = tg::prod(ds_.item_shape);
  const int64_t n = size();
  TG_CHECK(static_cast<int64_t>(ds_.host_images.size()) == n * item_size_, "DataLoader: ", ds_.host_images.size(),
           " image bytes, but ", n, " labels of item shape ", shape_str(ds_.item_shape), " need ", n * item_size_);
  for (int v = 0; v < 256; v++) lut_[v] = static_cast<float>((v * scale - mean) / std);
}

void ImageExamples::gather(const int64_t* ids, int64_t n, void* x, void* y) const {
  auto* xf = static_cast<float*>(x);
  auto* yi = static_cast<int32_t*>(y);
  for (int64_t r = 0; r < n; r++) {
    const int64_t s = ids[r];
    TG_ASSERT(s >= 0 && s < size(), "ImageExamples: example ", s, " of ", size());
    const uint8_t* src = ds_.host_images.data() + s * item_size_;
    float* dst = xf + r * item_size_;
    for (int64_t k = 0; k < item_size_; k++) dst[k] = lut_[src[k]];
    yi[r] = ds_.host_labels[s];
  }
}

// ---- DataLoader ----

DataLoader::DataLoader(std::shared_ptr<const Examples> data, DataLoaderOptions opt)
    : opt_(std::move(opt)), data_(std::move(data)) {
  TG_CHECK(data_, "DataLoader: no examples");
  TG_CHECK(opt_.batch_size > 0, "DataLoader: batch_size must be positive, got ", opt_.batch_size);
  TG_CHECK(opt_.prefetch >= 1, "DataLoader: prefetch must be at least 1, got ", opt_.prefetch);
  TG_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "DataLoader: rank ", opt_.rank,
           " is outside a world of ", opt_.world);
  TG_CHECK(opt_.batch_size % opt_.world == 0, "DataLoader: the global batch of ", opt_.batch_size,
           " examples does not split evenly over ", opt_.world, " ranks");
  n_ = data_->size();
  x_dtype_ = data_->x_dtype();
  y_dtype_ = data_->y_dtype();
  x_shape_ = data_->x_shape();
  y_shape_ = data_->y_shape();
  x_bytes_ = tg::prod(x_shape_) * static_cast<int64_t>(itemsize(x_dtype_));
  y_bytes_ = tg::prod(y_shape_) * static_cast<int64_t>(itemsize(y_dtype_));
  thread_ = std::thread(&DataLoader::worker, this);
}

DataLoader::DataLoader(std::vector<uint8_t> images, Shape item_shape, std::vector<int32_t> labels, DataLoaderOptions opt)
    : DataLoader(Dataset{std::move(images), std::move(labels), std::move(item_shape)}, std::move(opt)) {}

DataLoader::DataLoader(Dataset ds, DataLoaderOptions opt)
    : DataLoader(std::make_shared<ImageExamples>(std::move(ds), opt.scale, opt.mean, opt.std), opt) {}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  produce_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t DataLoader::batches_per_epoch() const {
  const int64_t b = opt_.batch_size;
  return opt_.drop_last ? n_ / b : (n_ + b - 1) / b;
}

int64_t DataLoader::epoch() const {
  std::lock_guard<std::mutex> lk(mu_);
  return epoch_;
}

LoaderPosition DataLoader::position() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {epoch_, consume_next_};
}

// Note (determinism): epoch e shuffles with a Fisher-Yates pass driven by mt19937_64 seeded
// with splitmix64(seed + e). mt19937_64's output is fixed by the C++ standard and `bounded` is
// ours, so the order is the same on every platform and standard library, and a resumed run
// (start_epoch(e, k)) sees exactly the batches the original run saw.
std::vector<int64_t> DataLoader::permutation(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!opt_.shuffle || n_ < 2) return order;
  std::mt19937_64 rng(splitmix64(opt_.seed + static_cast<uint64_t>(epoch)));
  for (int64_t i = n_ - 1; i > 0; i--) {
    auto j = static_cast<int64_t>(bounded(rng, static_cast<uint64_t>(i + 1)));
    std::swap(order[i], order[j]);
  }
  return order;
}

// Note [a rank's rows of a global batch]: with world w, batch k of an epoch is the global batch
// order[k*B, k*B + B) (B = batch_size, the last one shorter without drop_last), and rank r serves
// its r-th contiguous part: rows [r*R/w, (r+1)*R/w) of the R rows, rounded down. For a full
// batch that is dist::shard_range's split, so the ranks together see every example of the epoch
// exactly once, each its own, and every rank has the same number of batches (a rank's part of a
// short last batch may be smaller, or empty).
std::pair<int64_t, int64_t> DataLoader::rank_rows(int64_t index) const {
  const int64_t begin = index * opt_.batch_size;
  const int64_t rows = std::min(opt_.batch_size, n_ - begin);
  return {begin + rows * opt_.rank / opt_.world, begin + rows * (opt_.rank + 1) / opt_.world};
}

std::vector<int64_t> DataLoader::batch_ids(int64_t epoch, int64_t index) const {
  TG_CHECK(index >= 0 && index < batches_per_epoch(), "DataLoader.batch_ids: batch ", index, " is outside [0, ",
           batches_per_epoch(), ")");
  auto order = permutation(epoch);
  auto [b, e] = rank_rows(index);
  return std::vector<int64_t>(order.begin() + b, order.begin() + e);
}

DataLoader::HostBatch DataLoader::build(int64_t index, const std::vector<int64_t>& order) const {
  HostBatch hb;
  auto [begin, end] = rank_rows(index);
  hb.index = index;
  hb.rows = end - begin;
  hb.x.resize(static_cast<size_t>(hb.rows * x_bytes_));
  hb.y.resize(static_cast<size_t>(hb.rows * y_bytes_));
  data_->gather(order.data() + begin, hb.rows, hb.x.data(), hb.y.data());
  return hb;
}

void DataLoader::worker() {
  std::unique_lock<std::mutex> lk(mu_);
  const int64_t nb = batches_per_epoch();
  while (true) {
    produce_cv_.wait(lk, [&] {
      return stop_ || (started_ && !error_ && produce_next_ < nb && static_cast<int64_t>(queue_.size()) < opt_.prefetch);
    });
    if (stop_) return;
    const int64_t index = produce_next_++;
    const uint64_t gen = generation_;
    auto order = order_;
    lk.unlock();
    HostBatch hb;
    std::exception_ptr err;
    try {
      if (trace::enabled()) trace::thread_id("data loader");
      trace::Span span("data", "gather batch");
      span.arg("batch", static_cast<double>(index));
      hb = build(index, *order);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    if (gen != generation_) continue;  // start_epoch ran meanwhile: this batch is stale
    if (err) error_ = err;
    else queue_.push_back(std::move(hb));
    consume_cv_.notify_all();
  }
}

void DataLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  const int64_t nb = batches_per_epoch();
  TG_CHECK(epoch >= 0, "DataLoader.start_epoch: epoch must be non-negative, got ", epoch);
  TG_CHECK(skip_batches >= 0 && skip_batches <= nb, "DataLoader.start_epoch: skip_batches=", skip_batches,
           " is outside [0, ", nb, "] (batches per epoch)");
  auto order = std::make_shared<const std::vector<int64_t>>(permutation(epoch));
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_++;
    queue_.clear();
    order_ = std::move(order);
    epoch_ = epoch;
    produce_next_ = consume_next_ = skip_batches;
    started_ = true;
    error_ = nullptr;
  }
  produce_cv_.notify_all();
}

std::optional<Batch> DataLoader::next() {
  std::unique_lock<std::mutex> lk(mu_);
  if (!started_) {
    lk.unlock();
    start_epoch(0);
    lk.lock();
  }
  if (consume_next_ >= batches_per_epoch()) return std::nullopt;
  consume_cv_.wait(lk, [&] { return error_ || !queue_.empty(); });
  if (error_) std::rethrow_exception(error_);
  HostBatch hb = std::move(queue_.front());
  queue_.pop_front();
  TG_ASSERT(hb.index == consume_next_, "DataLoader: batch ", hb.index, " arrived when ", consume_next_,
            " was expected");
  consume_next_++;
  const int64_t epoch = epoch_;
  lk.unlock();
  produce_cv_.notify_all();

  Shape xs = {hb.rows}, ys = {hb.rows};
  xs.insert(xs.end(), x_shape_.begin(), x_shape_.end());
  ys.insert(ys.end(), y_shape_.begin(), y_shape_.end());
  Batch b;
  b.x = Tensor::from_data(hb.x.data(), x_dtype_, xs, {.device = opt_.device});
  b.y = Tensor::from_data(hb.y.data(), y_dtype_, ys, {.device = opt_.device});
  b.epoch = epoch;
  b.index = hb.index;
  return b;
}

}  // namespace tg::nn
