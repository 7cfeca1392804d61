// Datasets and batching: the IDX file reader (MNIST-style files, plain or gzipped), the
// Fashion-MNIST dataset from the Debian package dataset-fashion-mnist, and DataLoader, which
// shuffles deterministically per epoch and prepares the next batches on a background thread.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tinygrad/tensor.h"

namespace tg::nn {

// ---- IDX files ----

// An IDX array of unsigned bytes: dims from the header (big-endian u32 each), data row-major.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
  int64_t numel() const { return tg::prod(dims); }
};

// Reads an IDX file of unsigned bytes (magic 0x00000801 for 1-d, 0x00000803 for 3-d, ...).
// Gzipped files are detected from their content and inflated through zlib; plain files are read
// as they are. Throws tg::Error naming the file and the problem (missing file, bad magic, a type
// other than unsigned byte, truncated or trailing data, corrupt gzip stream).
IdxArray read_idx(const std::string& path);

// Writes an IDX file of unsigned bytes (gzipped when `gzip`), e.g. for tests and tools.
void write_idx(const std::string& path, const IdxArray& a, bool gzip = false);

// ---- datasets ----

// The values live on the host only (a DataLoader slices batches there); images() and labels()
// copy them to the default device when a whole split is wanted as tensors.
struct Dataset {
  std::vector<uint8_t> host_images;  // N * prod(item_shape), row-major
  std::vector<int32_t> host_labels;  // N
  Shape item_shape;                  // {1, 28, 28}
  int64_t size() const { return static_cast<int64_t>(host_labels.size()); }
  Tensor images() const;  // uint8 [N, item_shape...]
  Tensor labels() const;  // int32 [N]
};

constexpr const char* FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist";

// Fashion-MNIST (60000 train / 10000 test images of 28x28, labels 0..9) from `root`, which holds
// {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (or the same names without .gz), as installed
// by the Debian package dataset-fashion-mnist. A missing file says how to install it.
Dataset fashion_mnist(const std::string& split /* "train" | "test" */, const std::string& root = FASHION_MNIST_ROOT);

// ---- batching ----

struct Batch {
  Tensor x;           // float32 [B, item_shape...], normalised
  Tensor y;           // int32 [B]
  int64_t epoch = 0;  // the epoch this batch belongs to
  int64_t index = 0;  // its position in the epoch (0 .. batches_per_epoch()-1)
};

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;       // epoch e uses the permutation of seed + e
  bool drop_last = false;  // drop the final partial batch
  // x = (pixel * scale - mean) / std, computed in float32.
  double scale = 1.0 / 255.0;
  double mean = 0.0;
  double std = 1.0;
  std::string device;     // where the batch tensors go (empty: the default device)
  int64_t prefetch = 2;   // batches prepared ahead on the background thread
};

// Batches from host arrays. A background thread gathers and normalises the next `prefetch`
// batches on the host; next() turns the oldest into tensors on the calling thread (the tensor
// engine is only ever used from there). Not copyable; the destructor stops the thread.
class DataLoader {
 public:
  // images: N * prod(item_shape) bytes; labels: N values.
  DataLoader(std::vector<uint8_t> images, Shape item_shape, std::vector<int32_t> labels, DataLoaderOptions opt = {});
  // Takes the dataset's host arrays (move a split in when nothing else needs it: a copy of
  // Fashion-MNIST's train split is 47 MB).
  DataLoader(Dataset ds, DataLoaderOptions opt = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts (or restarts) `epoch`; the first `skip_batches` batches are skipped without being
  // built, so a run resumed at step k of an epoch sees the same batches it would have seen.
  void start_epoch(int64_t epoch, int64_t skip_batches = 0);
  // The next batch of the current epoch, or nullopt when it is done. Starts epoch 0 when no
  // epoch was started. Rethrows an error of the background thread.
  std::optional<Batch> next();

  int64_t batches_per_epoch() const;
  int64_t size() const { return n_; }
  int64_t epoch() const;
  const DataLoaderOptions& options() const { return opt_; }
  // The order in which epoch `epoch` visits the samples (identity when shuffle is off).
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  struct HostBatch {
    int64_t index = 0, rows = 0;
    std::vector<float> x;
    std::vector<int32_t> y;
  };
  void worker();
  HostBatch build(int64_t index, const std::vector<int64_t>& order) const;

  DataLoaderOptions opt_;
  std::vector<uint8_t> images_;
  std::vector<int32_t> labels_;
  Shape item_shape_;
  int64_t n_ = 0, item_size_ = 0;
  float lut_[256];  // normalised value of each pixel byte

  mutable std::mutex mu_;
  std::condition_variable produce_cv_, consume_cv_;
  std::deque<HostBatch> queue_;
  std::shared_ptr<const std::vector<int64_t>> order_;
  uint64_t generation_ = 0;  // bumped by start_epoch; stale batches are dropped
  bool started_ = false, stop_ = false;
  int64_t epoch_ = 0, produce_next_ = 0, consume_next_ = 0;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after everything above is set up
};

}  // namespace tg::nn
