// Datasets and batching: the IDX file reader (MNIST-style files, plain or gzipped), the
// Fashion-MNIST dataset from the Debian package dataset-fashion-mnist, Examples (what a loader
// batches: pairs x, y of any dtype and shape, e.g. normalised images and labels, or windows of
// tokens, tinygrad/nn/tokens.h) and DataLoader, which shuffles deterministically per epoch,
// serves each rank its part of every global batch and prepares the next batches on a background
// thread.
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
#include <utility>
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

// ---- examples ----

// A dataset as a loader sees it: `size()` examples, example i a pair of arrays x_i, y_i whose
// dtypes and shapes are the same for every i. gather() copies examples to host memory; it runs
// on the loader's background thread, so it must be safe to call concurrently with itself and
// must not touch the tensor engine.
class Examples {
 public:
  virtual ~Examples() = default;
  virtual int64_t size() const = 0;
  virtual DType x_dtype() const = 0;
  virtual Shape x_shape() const = 0;  // of one example
  virtual DType y_dtype() const = 0;
  virtual Shape y_shape() const = 0;  // of one example ({} for a label)
  // Writes examples ids[0..n) one after another: x gets n * prod(x_shape()) values of x_dtype(),
  // y gets n * prod(y_shape()) values of y_dtype(). Throws tg::Error for a bad id.
  virtual void gather(const int64_t* ids, int64_t n, void* x, void* y) const = 0;
};

// Images and labels as examples: x = (pixel * scale - mean) / std in float32 [item_shape...],
// y = the int32 label.
class ImageExamples : public Examples {
 public:
  // Checks that the images fill `labels.size()` items of `ds.item_shape` and that the
  // normalisation is finite (std > 0).
  ImageExamples(Dataset ds, double scale, double mean, double std);
  int64_t size() const override { return static_cast<int64_t>(ds_.host_labels.size()); }
  DType x_dtype() const override { return DType::Float32; }
  Shape x_shape() const override { return ds_.item_shape; }
  DType y_dtype() const override { return DType::Int32; }
  Shape y_shape() const override { return {}; }
  void gather(const int64_t* ids, int64_t n, void* x, void* y) const override;

 private:
  Dataset ds_;
  int64_t item_size_ = 0;
  float lut_[256];  // normalised value of each pixel byte
};

// ---- batching ----

struct Batch {
  Tensor x;           // [B, x_shape...] of the examples' x dtype (images: float32, normalised)
  Tensor y;           // [B, y_shape...] (labels: int32 [B])
  int64_t epoch = 0;  // the epoch this batch belongs to
  int64_t index = 0;  // its position in the epoch (0 .. batches_per_epoch()-1)
};

// Where a loader stands: the epoch and the index of the next batch it serves. Resuming a run
// restores it (DataLoader::seek) so the resumed run sees exactly the batches it would have seen.
struct LoaderPosition {
  int64_t epoch = 0, index = 0;
  bool operator==(const LoaderPosition&) const = default;
};

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;       // epoch e uses the permutation of seed + e
  bool drop_last = false;  // drop the final partial batch
  // Under data parallelism: batch_size is the global batch, and this loader serves rank `rank`
  // of `world` its rows of each one (Note [a rank's rows of a global batch] in data.cpp).
  int rank = 0, world = 1;
  // Image constructors only: x = (pixel * scale - mean) / std, computed in float32.
  double scale = 1.0 / 255.0;
  double mean = 0.0;
  double std = 1.0;
  std::string device;     // where the batch tensors go (empty: the default device)
  int64_t prefetch = 2;   // batches prepared ahead on the background thread
};

// Batches of examples. A background thread gathers the next `prefetch` batches on the host;
// next() turns the oldest into tensors on the calling thread (the tensor engine is only ever
// used from there). Not copyable; the destructor stops the thread.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Examples> data, DataLoaderOptions opt = {});
  // Images and labels (ImageExamples with opt's scale, mean and std). images: N *
  // prod(item_shape) bytes; labels: N values.
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

  // The position of the next batch next() serves (after an epoch's last batch: its index is
  // batches_per_epoch()); seek(p) is start_epoch(p.epoch, p.index).
  LoaderPosition position() const;
  void seek(LoaderPosition p) { start_epoch(p.epoch, p.index); }

  int64_t batches_per_epoch() const;
  int64_t size() const { return n_; }
  int64_t epoch() const;
  const Examples& examples() const { return *data_; }
  // The examples of batch `index` of `epoch` that this rank serves, in order.
  std::vector<int64_t> batch_ids(int64_t epoch, int64_t index) const;
  const DataLoaderOptions& options() const { return opt_; }
  // The order in which epoch `epoch` visits the samples (identity when shuffle is off).
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  struct HostBatch {
    int64_t index = 0, rows = 0;
    std::vector<uint8_t> x, y;  // rows examples' values, as Examples::gather writes them
  };
  void worker();
  HostBatch build(int64_t index, const std::vector<int64_t>& order) const;
  std::pair<int64_t, int64_t> rank_rows(int64_t index) const;  // into the epoch's order

  DataLoaderOptions opt_;
  std::shared_ptr<const Examples> data_;
  int64_t n_ = 0;
  DType x_dtype_, y_dtype_;
  Shape x_shape_, y_shape_;
  int64_t x_bytes_ = 0, y_bytes_ = 0;  // of one example

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
