// The four device interfaces (Allocator, Compiler, Program, Device), the caching allocator that
// sits in front of every device allocator, Buffer, and the device registry.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tinygrad/device_policy.h"
#include "tinygrad/dtype.h"

namespace tg {

struct Renderer;

// Raw device memory. Opaque handles: a host pointer on CPU, a device pointer elsewhere.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* ptr, size_t bytes) = 0;
  virtual void copy_in(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_out(void* host_dst, const void* src, size_t bytes) = 0;
  // Host address of a buffer when the device shares host memory (CPU), else nullptr.
  virtual void* host_view(void* /*ptr*/) { return nullptr; }
};

struct PoolStats {
  size_t bytes_in_use = 0;
  size_t peak_bytes = 0;
  size_t bytes_cached = 0;
  uint64_t allocations = 0;
  uint64_t reuse_hits = 0;
};

// Caching allocator: freed blocks wait in size-keyed free lists and are handed out again; the
// memory it holds stays within its peak of live bytes (Note [bounded cache]).
class MemoryPool {
 public:
  explicit MemoryPool(Allocator& backing) : backing_(backing) {}
  ~MemoryPool();
  void* alloc(size_t bytes);
  void free(void* ptr, size_t bytes);
  void release_cached();  // returns every cached block to the device
  void reset_peak();      // peak_bytes starts again from the bytes in use now
  PoolStats stats() const;
  static size_t round_size(size_t bytes);  // Note [pool block sizes] in device.cpp
  static constexpr size_t LARGE_BLOCK_STEP = size_t{2} << 20;

 private:
  void evict_for(size_t size);  // Note [bounded cache] in device.cpp

  Allocator& backing_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;
  PoolStats stats_;
};

// A compiled kernel.
class Program {
 public:
  virtual ~Program() = default;
  // Runs the kernel over its buffers. Returns seconds elapsed when wait is true.
  virtual std::optional<double> launch(const std::vector<void*>& buffers, const std::vector<int64_t>& global_size,
                                       const std::vector<int64_t>& local_size, bool wait) = 0;
};

class Compiler {
 public:
  virtual ~Compiler() = default;
  virtual std::string cache_key() const = 0;  // identifies compiler and target, for caches
  // Compiles source into a loadable program whose entry point is `name`.
  virtual std::unique_ptr<Program> compile(const std::string& name, const std::string& source) = 0;
};

// Note [library matmuls]: a kernel that is a (batched) matrix product, found by
// schedule/match_matmul.h, as a device library runs it (cuBLASLt on CUDA):
//   out[q, i, j] = relu?(sum_p a[q, i, p] * b[q, p, j] + bias?[j])
// accumulated in float32 and cast to out's dtype once. Each operand is read from one kernel
// parameter at an element offset with element strides (rows: i for a and out, p for b; cols: p
// for a, j for b and out; a zero stride broadcasts); the bias is a vector along j (stride_col 1,
// the other strides 0). Float32 operands that the kernel casts to bfloat16 (mixed precision) are
// read as float32 and rounded by the library (`inputs_bf16`).
struct MatmulOperand {
  int param = 0;
  DType dtype = DType::Float32;
  int64_t offset = 0;
  int64_t stride_batch = 0, stride_row = 0, stride_col = 0;
};
struct MatmulSpec {
  int64_t batch = 1, m = 1, n = 1, k = 1;
  MatmulOperand a, b, out;
  std::optional<MatmulOperand> bias;  // the epilogue: + bias[j], then relu when `relu`
  bool relu = false;
  bool allow_tf32 = false;   // float32 operands may be rounded to tf32 (the TF32 knob)
  bool inputs_bf16 = false;  // float32 operands are rounded to bfloat16 (cast in the kernel)
  // "matmul_bfloat16_8192x8192x8192" ([batch x] m x n x k, then _bias, _relu, _to_<out dtype>).
  std::string name() const;
  std::string key() const;  // every field, for caches
};

// NativeTranscendentals: exp2 and friends are fast instructions (GPUs); without it, kernels
// compute them with plain arithmetic (codegen/transcendental.h). MatmulLibrary: matrix-product
// kernels run through a device library (Note [library matmuls]), so the scheduler hands them
// their operands in buffers (Note [product operands] in schedule/schedule.cpp).
// AddressableMemory: a buffer is an address, and the address plus an offset addresses its bytes
// (host memory, CUDA device pointers), so one allocation can hold several buffers (Buffer's view
// constructor; Note [one arena for a captured step's intermediates] in engine/jit_arena.cpp).
// TensorCores: mma.sync tf32 products in generated kernels (codegen/tensor_core.h; CUDA sm_80 and up).
// Streams: a compute and a communication stream with events between them (Note [streams and
// events]). PeerCopy: the device copies from another device of its backend (or from itself) on
// the devices, without the host (Device::copy_from; Note [copies between devices] in device.cpp).
enum class Feature {
  HostMemory,
  Timing,
  Float16,
  BFloat16,
  NativeTranscendentals,
  MatmulLibrary,
  AddressableMemory,
  TensorCores,
  Streams,
  PeerCopy
};

// Note [streams and events]: a device with Feature::Streams runs work on two queues, each in
// order: the compute stream (kernels, copies, allocations) and the communication stream
// (collectives, distributed/). An event recorded on one marks the work queued there so far; a
// stream that waits on it runs nothing queued after the wait before that work is done. Neither
// blocks the host. A collective waits on an event recorded behind the kernels that produce its
// input, and the compute stream waits on the collective's event only before the first kernel
// that reads the result. The memory pool stays ordered by the compute stream alone: a buffer
// that a collective touches is freed only after the compute stream has waited on that
// collective's event (run_schedule keeps it alive until then), so its block is never handed out
// while the communication stream may still use it. Devices without streams run everything in
// order on the host: record_event returns nullptr (already done) and waits are no-ops.
enum class StreamKind { Compute, Comm };

// Note [host waits with a deadline]: a host read (item, a copy out, synchronize) waits for the
// GPU work queued before it, and that may include a collective whose peer is gone: the wait would
// never end. With a limit set (the trainer sets distributed.timeout_s), devices wait by polling
// against it and then throw an error that says so, instead of blocking in the driver for good;
// the distributed watchdog has by then aborted the collective and reports its culprits. 0 (the
// default): no limit, the driver's blocking wait.
void set_host_wait_limit(double seconds);
double host_wait_limit();
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual bool done() = 0;  // the work before it has finished (queries; never blocks)
};

class Device {
 public:
  virtual ~Device() = default;
  const std::string& name() const { return name_; }
  virtual Allocator& allocator() = 0;
  virtual const Renderer& renderer() const = 0;
  virtual Compiler& compiler() = 0;
  virtual void synchronize() {}
  virtual bool supports(Feature f) const = 0;
  // How the scheduler and the kernel optimizer lay out this device's kernels (device_policy.h).
  virtual const DevicePolicy& policy() const = 0;
  virtual std::string description() const { return name_; }
  // Feature::Streams (Note [streams and events]); without it, nullptr (done), no-op, nullptr.
  virtual std::shared_ptr<DeviceEvent> record_event(StreamKind /*stream*/) { return nullptr; }
  virtual void wait_event(StreamKind /*stream*/, const DeviceEvent& /*event*/) {}
  // The stream's handle for a library that queues work itself (a CUstream for NCCL).
  virtual void* native_stream(StreamKind /*stream*/) { return nullptr; }
  // True while the compute stream is being captured into a device graph (work queued then is
  // recorded, not run).
  virtual bool capturing() const { return false; }
  // Makes the device current on this thread for libraries that use the current device (CUDA: its
  // context); a no-op elsewhere.
  virtual void make_current() {}
  // Feature::PeerCopy (Note [copies between devices] in device.cpp): queues a copy of `bytes` from
  // `src`, memory of `from` (this device or another of its backend), into `dst` on this device,
  // after the work queued on both devices before it and before the work queued on both after it.
  // Without the feature: an internal error.
  virtual void copy_from(void* dst, Device& from, const void* src, size_t bytes);
  // How copy_from moves bytes from `from`, for DEBUG output and `tg info` ("direct access").
  virtual std::string peer_route(Device& /*from*/) { return ""; }
  MemoryPool& pool();
  // Compiles through the device compiler, cached by source (virtual CPU devices share CPU's:
  // Note [virtual CPU devices] in runtime/cpu.cpp).
  virtual Program& get_program(const std::string& name, const std::string& source);
  // The device library's program for a matrix product (Note [library matmuls]), cached by spec,
  // or nullptr when the device has no library that runs it. Its launch takes the kernel's
  // buffers and ignores the sizes.
  Program* get_matmul_program(const MatmulSpec& spec);
  size_t compiled_count() const { return programs_.size(); }

 protected:
  explicit Device(std::string name) : name_(std::move(name)) {}
  virtual std::unique_ptr<Program> make_matmul_program(const MatmulSpec& /*spec*/) { return nullptr; }

 private:
  std::string name_;
  std::unique_ptr<MemoryPool> pool_;
  std::mutex program_mu_;
  std::map<std::string, std::unique_ptr<Program>> programs_;
  std::map<std::string, std::unique_ptr<Program>> matmul_programs_;  // null: the library cannot
};

// Note [collectives through a device library] in multi.cpp: how the collectives between the
// devices of a tuple run. `library` ("NCCL") and `group`, the id of the collective runner that
// library's backend made for the tuple (engine/realize.h's registry), when every device's policy
// names the library and MULTI_LIBRARY is on; else `library` is "" (copy and add kernels) and
// `why` says why. Decided once per tuple (its devices in tuple order).
struct TupleCollectives {
  std::string library;
  int64_t group = 0;
  std::string why;
  std::string describe() const;  // "NCCL (one grouped call over the devices)" or "copy and add kernels (why)"
};
TupleCollectives tuple_collectives(const std::vector<std::string>& devices);
// A device library's backend registers how to make the collective runner of a tuple of its
// devices (returning the runner's group id); the CUDA device registers NCCL's when it opens.
using TupleRunnerFactory = std::function<int64_t(const std::vector<std::string>& devices)>;
void register_collective_library(const std::string& library, TupleRunnerFactory factory);

// Note [copies between devices] in device.cpp: how a COPY moves its bytes from `src` to `dst`.
// SameDevice and Peer run on the devices (Device::copy_from), ThroughHost copies out to host
// memory and in again.
enum class CopyKind { SameDevice, Peer, ThroughHost };
CopyKind copy_kind(const std::string& src, const std::string& dst);
const char* copy_kind_name(CopyKind kind);  // "same device", "peer", "through host"
// "peer (direct access)", "through host": the kind with the device's route, for `tg info` and DEBUG.
std::string describe_copy(const std::string& src, const std::string& dst);

// Device registry. Names follow tinygrad: "CPU", "CUDA", "CUDA:1", "CL"; "CPU:1", "CPU:2", ... are
// virtual CPU devices (Note [virtual CPU devices] in runtime/cpu.cpp).
using DeviceFactory = std::function<std::unique_ptr<Device>(const std::string& full_name)>;
void register_device(const std::string& base_name, DeviceFactory factory);
Device& get_device(const std::string& name);
std::string canonical_device(const std::string& name);  // "cpu" -> "CPU", "CUDA:0" -> "CUDA"
std::vector<std::string> registered_devices();
// How many devices of a backend this machine has ("CUDA": its GPUs, 0 where CUDA is unavailable;
// every other built backend: 1; an unknown one: 0).
int device_count(const std::string& base_name);
// Registers the backends this build has (runtime/register.cpp); called once, on first lookup.
void register_builtin_devices();
std::string default_device();  // DEVICE knob, else CPU

// On-disk caches (compiled kernels, BEAM results) live under cache_dir(): CACHEDIR, else
// $HOME/.cache/tinygrad++. stable_hash is FNV-1a, the same in every run, for cache file names.
std::string cache_dir();
uint64_t stable_hash(const std::string& s);

// Device memory for one array of `numel` elements of `dtype`. Memory is taken from the pool
// on first use and returned to it when the Buffer dies.
class Buffer {
 public:
  Buffer(std::string device, DType dtype, int64_t numel);
  // A view of `base`'s bytes from `offset` on, on a device with Feature::AddressableMemory; it
  // keeps `base` alive and is allocated when `base` is.
  Buffer(std::shared_ptr<Buffer> base, size_t offset, DType dtype, int64_t numel);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const std::string& device() const { return device_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * itemsize(dtype_); }
  bool allocated() const { return ptr_ != nullptr || numel_ == 0; }
  void* ensure_allocated();
  void* ptr() const { return ptr_; }
  void copy_in(const void* host, size_t bytes);
  void copy_out(void* host, size_t bytes) const;
  // All of `src`'s bytes into this buffer on the devices (copy_kind is not ThroughHost).
  void copy_from(const Buffer& src);
  // A view's base and its byte offset in it (null and 0 for a buffer of its own).
  const std::shared_ptr<Buffer>& view_base() const { return base_; }
  size_t view_offset() const { return offset_; }

 private:
  std::string device_;
  DType dtype_;
  int64_t numel_;
  void* ptr_ = nullptr;
  Device* dev_ = nullptr;
  std::shared_ptr<Buffer> base_;  // views only
  size_t offset_ = 0;
};

}  // namespace tg
