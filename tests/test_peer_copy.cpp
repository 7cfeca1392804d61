// Copies between the devices of one process (Note [copies between devices] in
// tinygrad/device.cpp). Without a GPU (suite CopyKind, PeerCopy): which pairs copy on the devices
// and which through host memory, and the whole path on test devices: "DMA", "DMA:1", ... are
// virtual CPU devices with Feature::PeerCopy whose copy_from copies host memory and records each
// call, as CUDA's cuMemcpyPeerAsync would between GPUs. Through them Tensor::to, shards and
// gathers, mixed tuples and TinyJit replays copy on the devices exactly where they should, with
// the values of the host path. On CUDA (label gpu; Note [peer copies between GPUs] in
// runtime/cuda.cpp): a copy between two buffers of one GPU, run alone and replayed by TinyJit as
// a CUDA graph; on two GPUs (skipped with "needs 2 CUDA devices, found N"), CUDA:1 -> CUDA is a
// peer copy with the host's values, and a step that reads a tensor of CUDA:1 on CUDA replays as a
// graph with the peer copy inside.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/multi_util.h"
#include "tests/test_util.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/lazy.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/tensor.h"
#include "tinygrad/tensor_internal.h"

using namespace tg;
using testutil::cuda_devices;
using testutil::expect_near;
using testutil::iota;
using testutil::KnobScope;

namespace {

// ---- the test devices ----

struct SeenCopy {
  std::string from, to;
  size_t bytes;
};
std::vector<SeenCopy>& seen() {
  static std::vector<SeenCopy> s;
  return s;
}

// A virtual CPU device that copies from the other DMA devices itself.
class DmaDevice : public Device {
 public:
  explicit DmaDevice(const std::string& name) : Device(name), cpu_(make_cpu_device(name)) {}
  Allocator& allocator() override { return cpu_->allocator(); }
  const Renderer& renderer() const override { return cpu_->renderer(); }
  Compiler& compiler() override { return cpu_->compiler(); }
  bool supports(Feature f) const override { return f == Feature::PeerCopy || cpu_->supports(f); }
  const DevicePolicy& policy() const override { return cpu_->policy(); }
  Program& get_program(const std::string& name, const std::string& source) override {
    return cpu_->get_program(name, source);
  }
  void copy_from(void* dst, Device& from, const void* src, size_t bytes) override {
    seen().push_back({from.name(), name(), bytes});
    std::memcpy(dst, src, bytes);
  }
  std::string peer_route(Device& from) override { return &from == this ? "" : "host memcpy"; }

 private:
  std::unique_ptr<Device> cpu_;
};

void register_dma_devices() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_device("DMA", [](const std::string& name) { return std::make_unique<DmaDevice>(name); });
  });
}

class PeerCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    register_dma_devices();
    seen().clear();
  }
};

struct Copies {
  uint64_t all, on_devices;
};
Copies copies_now() { return {GlobalCounters::get().copies, GlobalCounters::get().device_copies}; }
Copies copies_since(const Copies& before) {
  Copies now = copies_now();
  return {now.all - before.all, now.on_devices - before.on_devices};
}

// A copy of x to its own device into a buffer of its own: a COPY node the tensor API never makes
// (Tensor::to the same device is x itself), so the scheduler gives it a copy item on that device.
Tensor copy_on_its_device(const Tensor& x) {
  return result(make_uop(Op::COPY, x.dtype(), {x.uop()}, {}, x.shape(), x.device()), {&x});
}

}  // namespace

// ---- which pairs copy on the devices ----

TEST_F(PeerCopy, KindFollowsTheFeatureAndTheBackend) {
  EXPECT_EQ(copy_kind("DMA", "DMA:1"), CopyKind::Peer);
  EXPECT_EQ(copy_kind("DMA:3", "DMA"), CopyKind::Peer);
  EXPECT_EQ(copy_kind("DMA", "dma:0"), CopyKind::SameDevice);
  EXPECT_EQ(copy_kind("DMA:2", "DMA:2"), CopyKind::SameDevice);
  // the host path stays for the host and for devices without the feature
  EXPECT_EQ(copy_kind("CPU", "DMA"), CopyKind::ThroughHost);
  EXPECT_EQ(copy_kind("DMA:1", "CPU:1"), CopyKind::ThroughHost);
  EXPECT_EQ(copy_kind("CPU", "CPU:1"), CopyKind::ThroughHost);
  EXPECT_EQ(copy_kind("CPU:2", "CPU:2"), CopyKind::ThroughHost);
  EXPECT_EQ(describe_copy("DMA", "DMA:1"), "peer (host memcpy)");
  EXPECT_EQ(describe_copy("DMA:1", "DMA:1"), "same device");
  EXPECT_EQ(describe_copy("DMA", "CPU"), "through host");
  EXPECT_STREQ(copy_kind_name(CopyKind::ThroughHost), "through host");
  KnobScope off(knobs::PEER_COPY, 0);
  EXPECT_EQ(copy_kind("DMA", "DMA:1"), CopyKind::ThroughHost);
  EXPECT_EQ(copy_kind("DMA", "DMA"), CopyKind::ThroughHost);
}

TEST_F(PeerCopy, ADeviceWithoutTheFeatureRefuses) {
  auto src = std::make_shared<Buffer>("CPU", DType::Float32, 4);
  Buffer dst("CPU:1", DType::Float32, 4);
  src->copy_in(iota(4).data(), 16);
  try {
    dst.copy_from(*src);
    ADD_FAILURE() << "expected an internal error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("CPU:1 cannot copy from CPU on the devices"), std::string::npos) << e.what();
  }
}

// ---- the whole path on the test devices ----

TEST_F(PeerCopy, ToAnotherDeviceCopiesOnTheDevices) {
  const std::vector<float> v = iota(5 * 7);
  Tensor x = Tensor::from_vector(v, {5, 7}).to("DMA").realize();
  ASSERT_EQ(seen().size(), 0u);  // CPU -> DMA went through the host
  Copies before = copies_now();
  std::string log;
  Tensor y;
  {
    KnobScope debug(knobs::DEBUG, 1);
    ::testing::internal::CaptureStderr();
    y = x.to("DMA:1").realize();
    log = ::testing::internal::GetCapturedStderr();
  }
  ASSERT_EQ(seen().size(), 1u);
  EXPECT_EQ(seen()[0].from, "DMA");
  EXPECT_EQ(seen()[0].to, "DMA:1");
  EXPECT_EQ(seen()[0].bytes, v.size() * sizeof(float));
  Copies c = copies_since(before);
  EXPECT_EQ(c.all, 1u);
  EXPECT_EQ(c.on_devices, 1u);
  EXPECT_NE(log.find("*** copy DMA -> DMA:1, 140 bytes, peer (host memcpy)"), std::string::npos) << log;
  EXPECT_EQ(y.device(), "DMA:1");
  expect_near(y.to_vector<float>(), v, 0);
  expect_near((y * 2).to("DMA:2").to_vector<float>(), (Tensor::from_vector(v, {5, 7}) * 2).to_vector<float>(), 0);
  // PEER_COPY=0: the same copy through the host
  KnobScope off(knobs::PEER_COPY, 0);
  const size_t seen_before = seen().size();
  before = copies_now();
  expect_near((y * 3).to("DMA:3").to_vector<float>(), (Tensor::from_vector(v, {5, 7}) * 3).to_vector<float>(), 0);
  EXPECT_EQ(seen().size(), seen_before);
  EXPECT_EQ(copies_since(before).all, 1u);
  EXPECT_EQ(copies_since(before).on_devices, 0u);
}

TEST_F(PeerCopy, ACopyWithinADeviceRunsOnIt) {
  const std::vector<float> v = iota(9);
  Tensor x = Tensor::from_vector(v, {9}).to("DMA:1").realize();
  Copies before = copies_now();
  Tensor y = copy_on_its_device(x).realize();
  ASSERT_EQ(seen().size(), 1u);
  EXPECT_EQ(seen()[0].from, "DMA:1");
  EXPECT_EQ(seen()[0].to, "DMA:1");
  EXPECT_EQ(copies_since(before).on_devices, 1u);
  EXPECT_NE(TensorAccess::buffer(y), TensorAccess::buffer(x));
  expect_near(y.to_vector<float>(), v, 0);
}

TEST_F(PeerCopy, ShardsAndGathersBetweenTheDevicesCopyOnThem) {
  const std::vector<float> v = iota(8 * 6);
  Tensor x = Tensor::from_vector(v, {8, 6}).to("DMA").realize();
  Copies before = copies_now();
  Tensor sharded = x.shard({"DMA", "DMA:1", "DMA:2", "DMA:3"}, 0);
  expect_near((sharded + 1).to("DMA:1").to_vector<float>(), (Tensor::from_vector(v, {8, 6}) + 1).to_vector<float>(), 0);
  Copies c = copies_since(before);
  EXPECT_GT(c.on_devices, 0u);
  EXPECT_EQ(c.on_devices, seen().size());
  EXPECT_EQ(c.all, c.on_devices);  // no copy item went through the host (reading the result is none)
  for (auto& s : seen()) EXPECT_NE(s.from, s.to);
}

TEST_F(PeerCopy, MixedTuplesKeepTheHostPath) {
  const std::vector<float> v = iota(4 * 6);
  Tensor x = Tensor::from_vector(v, {4, 6}).to("DMA").realize();
  Copies before = copies_now();
  Tensor sharded = x.shard({"CPU:1", "DMA:1"}, 0);
  expect_near(sharded.sum(0).to_vector<float>(), Tensor::from_vector(v, {4, 6}).sum(0).to_vector<float>());
  Copies c = copies_since(before);
  EXPECT_GT(c.all - c.on_devices, 0u);  // DMA -> CPU:1 and the exchange between CPU:1 and DMA:1
  for (auto& s : seen()) EXPECT_EQ(s.from.substr(0, 3) + s.to.substr(0, 3), "DMADMA");
}

TEST_F(PeerCopy, TinyJitReplaysCopyOnTheDevices) {
  TinyJit step([](const Tensors& in) { return Tensors{in[0].to("DMA:1") * 3}; });
  for (int call = 0; call < 4; call++) {
    const std::vector<float> v = iota(16, static_cast<float>(call + 1));
    Tensor x = Tensor::from_vector(v, {16}).to("DMA").realize();
    const size_t seen_before = seen().size();
    Tensor y = step({x})[0];
    EXPECT_EQ(seen().size(), seen_before + 1) << "call " << call;
    expect_near(y.to_vector<float>(), (Tensor::from_vector(v, {16}) * 3).to_vector<float>(), 0);
  }
  EXPECT_GE(step.replays(), 2u);
}

// ---- on CUDA (label gpu) ----

namespace {

std::string skip_reason(int need) {
  const int found = cuda_devices();
  if (found >= need) return "";
  return "needs " + std::to_string(need) + " CUDA device" + (need > 1 ? "s" : "") + ", found " + std::to_string(found);
}

class PeerCopyOneGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = skip_reason(1); !why.empty()) GTEST_SKIP() << why;
  }
};
class PeerCopyTwoGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << why;
  }
};

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) n++;
  return n;
}

// `calls` calls of a TinyJit step that copies its input (on `input_device`) to CUDA and doubles
// it, each with a new input that a kernel on the input's device has just written; expects the
// host's values and returns the DEBUG=1 log.
std::string replay_copies(const std::string& input_device, int calls) {
  TinyJit step([&](const Tensors& in) {
    Tensor on_cuda = input_device == "CUDA" ? copy_on_its_device(in[0]) : in[0].to("CUDA");
    return Tensors{on_cuda * 2};
  });
  const int64_t n = 1 << 20;  // large enough that a copy racing its producer would see old bytes
  const std::vector<float> base = iota(n);
  Tensor host = Tensor::from_vector(base, {n});
  Tensor on_input = host.to(input_device).realize();
  KnobScope debug(knobs::DEBUG, 1);
  ::testing::internal::CaptureStderr();
  for (int call = 0; call < calls; call++) {
    Tensor x = (on_input + static_cast<float>(call)).realize();  // queued on the input's device
    Tensor y = step({x})[0];
    std::vector<float> got = y.to_vector<float>();
    size_t wrong = 0;
    for (size_t i = 0; i < got.size(); i++) wrong += got[i] != 2 * (base[i] + static_cast<float>(call));
    EXPECT_EQ(wrong, 0u) << "call " << call;
  }
  return ::testing::internal::GetCapturedStderr();
}

}  // namespace

TEST_F(PeerCopyOneGpu, ACopyWithinTheGpuIsRight) {
  EXPECT_EQ(copy_kind("CUDA", "CUDA:0"), CopyKind::SameDevice);
  EXPECT_EQ(copy_kind("CPU", "CUDA"), CopyKind::ThroughHost);
  EXPECT_EQ(copy_kind("CUDA", "CPU"), CopyKind::ThroughHost);
  const std::vector<float> v = iota(3 << 20);
  Tensor x = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to("CUDA").realize();
  Copies before = copies_now();
  Tensor y = copy_on_its_device(x).realize();
  EXPECT_EQ(copies_since(before).on_devices, 1u);
  EXPECT_NE(TensorAccess::buffer(y), TensorAccess::buffer(x));
  expect_near(y.to_vector<float>(), v, 0);
  // the host path around it is unchanged
  const int64_t n = static_cast<int64_t>(v.size());
  expect_near((y + 1).to("CPU").to_vector<float>(), (Tensor::from_vector(v, {n}) + 1).to_vector<float>(), 0);
}

TEST_F(PeerCopyOneGpu, AGraphWithACopyWithinTheGpuReplaysRight) {
  KnobScope graphs(knobs::CUDA_GRAPH, 4);
  std::string log = replay_copies("CUDA", 6);
  EXPECT_EQ(count(log, "graph of 1 kernels and 0 collectives, 1 copies on the devices"), 4u) << log;
  EXPECT_EQ(count(log, "not used for this capture"), 0u) << log;
}

TEST_F(PeerCopyTwoGpus, CudaOneToCudaIsAPeerCopy) {
  EXPECT_EQ(copy_kind("CUDA", "CUDA:1"), CopyKind::Peer);
  EXPECT_EQ(copy_kind("CUDA:1", "CUDA"), CopyKind::Peer);
  const std::string route = describe_copy("CUDA", "CUDA:1");
  EXPECT_TRUE(route == "peer (direct access)" || route == "peer (staged by the driver)") << route;
  const std::vector<float> v = iota(5 << 20);
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor x = (Tensor::from_vector(v, {n}).to("CUDA") * 3).realize();
  Copies before = copies_now();
  std::string log;
  Tensor y, back;
  {
    KnobScope debug(knobs::DEBUG, 1);
    ::testing::internal::CaptureStderr();
    y = x.to("CUDA:1").realize();
    back = (y + 1).to("CUDA").realize();
    log = ::testing::internal::GetCapturedStderr();
  }
  Copies c = copies_since(before);
  EXPECT_EQ(c.all, 2u);
  EXPECT_EQ(c.on_devices, 2u);
  EXPECT_NE(log.find("*** copy CUDA -> CUDA:1, " + std::to_string(n * 4) + " bytes, peer"), std::string::npos) << log;
  expect_near(y.to_vector<float>(), (Tensor::from_vector(v, {n}) * 3).to_vector<float>(), 0);
  expect_near(back.to_vector<float>(), (Tensor::from_vector(v, {n}) * 3 + 1).to_vector<float>(), 0);
  // shards of CUDA gathered on CUDA:1
  Tensor sharded = Tensor::from_vector(v, {n}).shard({"CUDA", "CUDA:1"}, 0);
  expect_near((sharded * 2).to("CUDA:1").to_vector<float>(), (Tensor::from_vector(v, {n}) * 2).to_vector<float>(), 0);
}

TEST_F(PeerCopyTwoGpus, AGraphWithAPeerCopyReplaysRight) {
  KnobScope graphs(knobs::CUDA_GRAPH, 4);
  std::string log = replay_copies("CUDA:1", 6);
  EXPECT_EQ(count(log, "graph of 1 kernels and 0 collectives, 1 copies on the devices"), 4u) << log;
  EXPECT_EQ(count(log, "not used for this capture"), 0u) << log;
}
