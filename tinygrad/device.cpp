// Device registry, the caching allocator (memory pool) and Buffer.
#include "tinygrad/device.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg {

// ---- MemoryPool ------------------------------------------------------------------------------

// Note [pool block sizes]: below 1 MiB a block is rounded to 64 bytes; above, to 1/8 of the next
// power of two, so that neighbouring sizes share cached blocks, but by at most 2 MiB. An
// unbounded eighth wasted up to an eighth of the largest blocks, and the largest is a captured
// step's arena: GPT-2 124M's 8.2 GB arena took a 10 GB block. 2 MiB is the granularity of a
// CUDA allocation, and the rounding PyTorch's allocator gives large blocks.
size_t MemoryPool::round_size(size_t bytes) {
  if (bytes <= 64) return 64;
  if (bytes < (1u << 20)) return (bytes + 63) & ~size_t{63};
  size_t p = 1;
  while (p < bytes) p <<= 1;
  const size_t step = std::min(p / 8, LARGE_BLOCK_STEP);
  return (bytes + step - 1) / step * step;
}

MemoryPool::~MemoryPool() { release_cached(); }

void* MemoryPool::alloc(size_t bytes) {
  size_t size = round_size(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocations++;
    auto it = cached_.find(size);
    if (it != cached_.end()) {
      void* p = it->second;
      cached_.erase(it);
      stats_.reuse_hits++;
      stats_.bytes_cached -= size;
      stats_.bytes_in_use += size;
      stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes_in_use);
      return p;
    }
  }
  evict_for(size);
  void* p = backing_.alloc(size);
  if (!p) {  // out of memory: give the cache back and try once more
    release_cached();
    p = backing_.alloc(size);
  }
  TG_CHECK(p, "out of memory allocating ", bytes, " bytes");
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_in_use += size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes_in_use);
  return p;
}

void MemoryPool::free(void* ptr, size_t bytes) {
  size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_in_use -= size;
  stats_.bytes_cached += size;
  cached_.emplace(size, ptr);
}

// Note [bounded cache]: cached blocks only help while later allocations have their sizes. When a
// run changes shape (training at batch 128, evaluation at batch 1000), the blocks of the old
// shapes would stay cached beside the new ones and the process would hold both. So a miss first
// gives back cached blocks, largest first, until the memory held (in use + cached + the new
// block) is within the peak in-use bytes so far: the pool never holds more than its own high-water
// mark of live memory, plus what a new peak itself needs.
void MemoryPool::evict_for(size_t size) {
  std::vector<std::pair<size_t, void*>> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t bound = std::max(stats_.peak_bytes, stats_.bytes_in_use + size);
    while (!cached_.empty() && stats_.bytes_in_use + stats_.bytes_cached + size > bound) {
      auto largest = std::prev(cached_.end());
      evicted.emplace_back(*largest);
      stats_.bytes_cached -= largest->first;
      cached_.erase(largest);
    }
  }
  for (auto& [bytes, p] : evicted) backing_.free(p, bytes);
}

void MemoryPool::release_cached() {
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(cached_);
    stats_.bytes_cached = 0;
  }
  for (auto& [size, p] : blocks) backing_.free(p, size);
}

void MemoryPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.bytes_in_use;
}

PoolStats MemoryPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// ---- Device ----------------------------------------------------------------------------------

MemoryPool& Device::pool() {
  if (!pool_) pool_ = std::make_unique<MemoryPool>(allocator());
  return *pool_;
}

Program& Device::get_program(const std::string& name, const std::string& source) {
  std::lock_guard<std::mutex> lock(program_mu_);
  std::string key = name + "\n" + source;
  auto it = programs_.find(key);
  if (it != programs_.end()) return *it->second;
  auto prog = compiler().compile(name, source);
  return *programs_.emplace(key, std::move(prog)).first->second;
}

Program* Device::get_matmul_program(const MatmulSpec& spec) {
  std::lock_guard<std::mutex> lock(program_mu_);
  std::string key = spec.key();
  auto it = matmul_programs_.find(key);
  if (it == matmul_programs_.end()) it = matmul_programs_.emplace(key, make_matmul_program(spec)).first;
  return it->second.get();
}

std::string MatmulSpec::name() const {
  DType inputs = inputs_bf16 ? DType::BFloat16 : a.dtype;
  std::string s = "matmul_" + std::string(dtype_name(inputs)) + "_";
  if (batch > 1) s += std::to_string(batch) + "x";
  s += std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  if (bias) s += "_bias";
  if (relu) s += "_relu";
  if (out.dtype != inputs) s += "_to_" + std::string(dtype_name(out.dtype));
  return s;
}

std::string MatmulSpec::key() const {
  std::string s = name() + (allow_tf32 ? " tf32" : "") + (inputs_bf16 ? " from_float32" : "");
  auto add = [&](const char* what, const MatmulOperand& o) {
    s += detail::cat(" ", what, ":", o.param, ":", dtype_name(o.dtype), "@", o.offset, "/", o.stride_batch, ",",
                     o.stride_row, ",", o.stride_col);
  };
  add("a", a);
  add("b", b);
  add("out", out);
  if (bias) add("bias", *bias);
  return s;
}

// ---- registry --------------------------------------------------------------------------------

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, DeviceFactory> factories;
  std::map<std::string, std::unique_ptr<Device>> devices;
};
Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose: devices outlive static destructors
  return *r;
}
void ensure_builtin_devices() {
  static std::once_flag once;
  std::call_once(once, register_builtin_devices);
}
}  // namespace

void register_device(const std::string& base_name, DeviceFactory factory) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().factories[base_name] = std::move(factory);
}

std::string canonical_device(const std::string& name) {
  std::string up = name;
  std::transform(up.begin(), up.end(), up.begin(), [](unsigned char c) { return std::toupper(c); });
  if (up.size() > 2 && up.substr(up.size() - 2) == ":0") up = up.substr(0, up.size() - 2);
  return up;
}

namespace {
Device& look_up_device(const std::string& name) {
  ensure_builtin_devices();
  std::string full = canonical_device(name);
  std::string base = full.substr(0, full.find(':'));
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.devices.find(full);
  if (it != r.devices.end()) return *it->second;
  auto f = r.factories.find(base);
  if (f == r.factories.end()) {
    std::string known;
    for (auto& [k, v] : r.factories) known += (known.empty() ? "" : ", ") + k;
    TG_FAIL("unknown device '", name, "' (this build has: ", known, ")");
  }
  auto dev = f->second(full);
  return *r.devices.emplace(full, std::move(dev)).first->second;
}
}  // namespace

// Note [the last device looked up]: the scheduler asks for a node's device by name for every
// reduce and kernel of every realize. Devices live until exit, so each thread keeps the last name
// it asked for with its device, and asking again skips the name's canonical form and the locked
// registry.
Device& get_device(const std::string& name) {
  thread_local std::string last_name;
  thread_local Device* last = nullptr;
  if (last && name == last_name) return *last;
  Device& d = look_up_device(name);
  last_name = name;
  last = &d;
  return d;
}

std::vector<std::string> registered_devices() {
  ensure_builtin_devices();
  std::lock_guard<std::mutex> lock(registry().mu);
  std::vector<std::string> out;
  for (auto& [k, v] : registry().factories) out.push_back(k);
  return out;
}

namespace {
std::atomic<double>& wait_limit() {
  static std::atomic<double> limit{0.0};
  return limit;
}
}  // namespace

void set_host_wait_limit(double seconds) { wait_limit().store(seconds > 0 ? seconds : 0.0); }
double host_wait_limit() { return wait_limit().load(); }

std::string default_device() { return canonical_device(knobs::DEVICE.get()); }

// ---- collectives between the devices of a tuple (Note [collectives through a device library]) ----

std::string shared_collective_library(const std::vector<const DevicePolicy*>& policies) {
  if (policies.empty()) return "";
  const std::string& library = policies[0]->collective_library;
  for (const DevicePolicy* p : policies)
    if (p->collective_library != library) return "";
  return library;
}

std::string TupleCollectives::describe() const {
  if (!library.empty()) return library + " (one grouped call over the devices)";
  return "copy and add kernels (" + why + ")";
}

namespace {

struct CollectiveLibraries {
  std::mutex mu;
  std::map<std::string, TupleRunnerFactory> factories;  // by library
  std::map<std::string, TupleCollectives> tuples;       // by tuple, joined by ','
};
CollectiveLibraries& collective_libraries() {
  static CollectiveLibraries* c = new CollectiveLibraries();  // leaked: runners live until exit
  return *c;
}

// Why a tuple's devices share no library: the first device that names none, or two that differ.
std::string why_no_library(const std::vector<std::string>& devices, const std::vector<const DevicePolicy*>& policies) {
  for (size_t i = 0; i < devices.size(); i++)
    if (policies[i]->collective_library.empty()) return devices[i] + " has no collective library";
  for (size_t i = 1; i < devices.size(); i++)
    if (policies[i]->collective_library != policies[0]->collective_library)
      return devices[0] + " runs " + policies[0]->collective_library + ", " + devices[i] + " runs " +
             policies[i]->collective_library;
  return "no device";
}

}  // namespace

void register_collective_library(const std::string& library, TupleRunnerFactory factory) {
  auto& c = collective_libraries();
  std::lock_guard<std::mutex> lock(c.mu);
  c.factories[library] = std::move(factory);
}

TupleCollectives tuple_collectives(const std::vector<std::string>& named) {
  if (!knobs::MULTI_LIBRARY) return TupleCollectives{"", 0, "MULTI_LIBRARY=0"};
  std::vector<std::string> devices;
  std::string key;
  for (auto& d : named) {
    devices.push_back(canonical_device(d));
    key += (key.empty() ? "" : ",") + devices.back();
  }
  auto& c = collective_libraries();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto it = c.tuples.find(key); it != c.tuples.end()) return it->second;
  }
  std::vector<const DevicePolicy*> policies;
  for (auto& d : devices) policies.push_back(&get_device(d).policy());  // opens them, outside the lock
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto it = c.tuples.find(key); it != c.tuples.end()) return it->second;
  TupleCollectives out;
  out.library = shared_collective_library(policies);
  auto f = c.factories.find(out.library);
  if (out.library.empty()) {
    out.why = why_no_library(devices, policies);
  } else if (f == c.factories.end()) {
    out.why = out.library + " has no registered runner";
    out.library.clear();
  } else {
    out.group = f->second(devices);
  }
  if (knobs::DEBUG >= 1) std::fprintf(stderr, "*** multi  collectives between %s: %s\n", key.c_str(), out.describe().c_str());
  return c.tuples[key] = out;
}

// ---- copies between devices (Note [copies between devices]) -------------------------------------

// Note [copies between devices]: a COPY item (Tensor::to, the multi-device rewrite's gathers and
// exchanges, a shard from one device) moves a buffer's bytes to another device. Between two
// devices of one backend that both have Feature::PeerCopy (the GPUs of a process: CUDA, CUDA:1)
// the destination copies on the devices (Device::copy_from): on CUDA, cuMemcpyPeerAsync on its
// stream, through the GPUs' peer access where they have it and staged by the driver where not;
// the host neither waits nor touches the bytes. A copy between two buffers of one such device is
// the device's own copy. Every other pair (CPU <-> CUDA, CPU:n among themselves, CUDA and OpenCL) goes through
// host memory: copy_out, which waits for the source device, then copy_in. A copy on the devices
// keeps the order a host copy had: the destination waits for the work queued on the source
// before it, and the source's later work waits for the copy (that work may reuse the source's
// memory: the pool hands freed blocks out again). A device graph that records a peer copy
// (runtime/cuda_graph.cpp) makes those two waits around its launch instead, since a capture
// cannot wait on work queued outside it. DEBUG=1 prints each copy with its kind; `tg info`
// lists the kind between the machine's devices; PEER_COPY=0 sends every copy through the host.

void Device::copy_from(void* /*dst*/, Device& from, const void* /*src*/, size_t /*bytes*/) {
  TG_ASSERT(false, name(), " cannot copy from ", from.name(), " on the devices (it has no Feature::PeerCopy)");
}

CopyKind copy_kind(const std::string& src, const std::string& dst) {
  if (!knobs::PEER_COPY) return CopyKind::ThroughHost;
  const std::string s = canonical_device(src), d = canonical_device(dst);
  if (!get_device(s).supports(Feature::PeerCopy) || !get_device(d).supports(Feature::PeerCopy))
    return CopyKind::ThroughHost;
  if (s == d) return CopyKind::SameDevice;
  return s.substr(0, s.find(':')) == d.substr(0, d.find(':')) ? CopyKind::Peer : CopyKind::ThroughHost;
}

const char* copy_kind_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::SameDevice: return "same device";
    case CopyKind::Peer: return "peer";
    case CopyKind::ThroughHost: return "through host";
  }
  return "?";
}

std::string describe_copy(const std::string& src, const std::string& dst) {
  const CopyKind kind = copy_kind(src, dst);
  std::string route = kind == CopyKind::ThroughHost ? "" : get_device(dst).peer_route(get_device(src));
  return std::string(copy_kind_name(kind)) + (route.empty() ? "" : " (" + route + ")");
}

// ---- Buffer ----------------------------------------------------------------------------------

Buffer::Buffer(std::string device, DType dtype, int64_t numel)
    : device_(canonical_device(device)), dtype_(dtype), numel_(numel) {
  TG_ASSERT(numel >= 0, "negative buffer size");
}

Buffer::Buffer(std::shared_ptr<Buffer> base, size_t offset, DType dtype, int64_t numel)
    : device_(base->device()), dtype_(dtype), numel_(numel), base_(std::move(base)), offset_(offset) {
  TG_ASSERT(numel >= 0, "negative buffer size");
  TG_ASSERT(offset + nbytes() <= base_->nbytes(), "a view of ", nbytes(), " bytes at ", offset, " overruns its base of ",
            base_->nbytes());
  TG_ASSERT(get_device(device_).supports(Feature::AddressableMemory), "views need addressable memory, which ", device_,
            " does not have");
}

Buffer::~Buffer() {
  if (ptr_ && !base_) dev_->pool().free(ptr_, nbytes());
}

void* Buffer::ensure_allocated() {
  if (!ptr_ && numel_ > 0) {
    dev_ = &get_device(device_);
    ptr_ = base_ ? static_cast<char*>(base_->ensure_allocated()) + offset_ : dev_->pool().alloc(nbytes());
  }
  return ptr_;
}

void Buffer::copy_in(const void* host, size_t bytes) {
  TG_ASSERT(bytes == nbytes(), "copy_in of ", bytes, " bytes into a buffer of ", nbytes());
  if (bytes == 0) return;
  ensure_allocated();
  dev_->allocator().copy_in(ptr_, host, bytes);
}

void Buffer::copy_from(const Buffer& src) {
  TG_ASSERT(src.nbytes() == nbytes(), "copy of ", src.nbytes(), " bytes into a buffer of ", nbytes());
  if (nbytes() == 0) return;
  TG_ASSERT(src.ptr_, "copy from an unallocated buffer of ", src.device_);
  ensure_allocated();
  dev_->copy_from(ptr_, get_device(src.device_), src.ptr_, nbytes());
}

void Buffer::copy_out(void* host, size_t bytes) const {
  TG_ASSERT(bytes == nbytes(), "copy_out of ", bytes, " bytes from a buffer of ", nbytes());
  if (bytes == 0) return;
  TG_ASSERT(ptr_, "copy_out of an unallocated buffer");
  dev_->synchronize();
  dev_->allocator().copy_out(host, ptr_, bytes);
}

std::string cache_dir() {
  std::string dir = knobs::CACHEDIR.get();
  if (!dir.empty()) return dir;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/tinygrad++";
}

uint64_t stable_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace tg
