// Collectives between the devices of one process through a device library (Note [collectives
// through a device library] in tinygrad/multi.cpp), without a GPU: which tuples take the library
// (every device's policy names the same one; CPU:n, mixed tuples and MULTI_LIBRARY=0 keep the copy
// and add kernels), and the whole path on test devices: "PEER", "PEER:1", ... are virtual CPU
// devices whose policy names a library, HOSTLIB, whose runner adds and concatenates on the host
// as NCCL would on GPUs. Through it an all-reduce and an all-gather are one item over the tuple
// (Note [one item for a collective between devices] in schedule/schedule.cpp) with no copies, the
// values equal the host's, data-parallel training ends where the kernels' does, and TinyJit
// replays the steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/multi.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/tensor.h"
#include "tests/multi_util.h"
#include "tests/test_util.h"

using namespace tg;
using testutil::expect_near;
using testutil::iota;
using testutil::KnobScope;
using testutil::stats_since;

namespace {

// ---- the test devices and their library ----

// A virtual CPU device whose policy names HOSTLIB as its collective library.
class PeerDevice : public Device {
 public:
  explicit PeerDevice(const std::string& name) : Device(name), cpu_(make_cpu_device(name)) {}
  Allocator& allocator() override { return cpu_->allocator(); }
  const Renderer& renderer() const override { return cpu_->renderer(); }
  Compiler& compiler() override { return cpu_->compiler(); }
  bool supports(Feature f) const override { return cpu_->supports(f); }
  const DevicePolicy& policy() const override {
    std::call_once(once_, [this] {  // CPU's policy, asked after the registry has made this device
      policy_ = cpu_->policy();
      policy_.collective_library = "HOSTLIB";
    });
    return policy_;
  }
  Program& get_program(const std::string& name, const std::string& source) override {
    return cpu_->get_program(name, source);
  }

 private:
  std::unique_ptr<Device> cpu_;
  mutable std::once_flag once_;
  mutable DevicePolicy policy_;
};

// What the library's runners were given.
struct Seen {
  Op kind;
  std::string device;
  size_t buffers, outputs;
};
std::vector<Seen>& seen() {
  static std::vector<Seen> s;
  return s;
}

// HOSTLIB's runner of one tuple: float32 sums and maxima, and concatenations of any dtype, on
// the host, as NCCL's grouped calls compute them on GPUs.
class HostLibrary : public CollectiveRunner {
 public:
  explicit HostLibrary(size_t n) : n_(n) {}
  CollectiveWait start(const ScheduleItem& item) override {
    seen().push_back({item.ast->op, item.device, item.buffers.size(), item.outputs});
    EXPECT_EQ(item.buffers.size(), 2 * n_);
    const Op kind = item.ast->op;
    const size_t bytes = item.buffers[n_]->nbytes(), item_size = itemsize(item.buffers[0]->dtype());
    for (size_t k = 0; k < n_; k++) {
      auto* out = static_cast<char*>(item.buffers[k]->ensure_allocated());
      if (kind == Op::ALLGATHER) {
        for (size_t j = 0; j < n_; j++) std::memcpy(out + j * bytes, item.buffers[n_ + j]->ensure_allocated(), bytes);
        continue;
      }
      EXPECT_EQ(item.buffers[0]->dtype(), DType::Float32);
      const size_t count = item.buffers[k]->nbytes() / item_size;
      const size_t first = kind == Op::REDUCE_SCATTER ? k * count : 0;
      auto* o = reinterpret_cast<float*>(out);
      for (size_t i = 0; i < count; i++) {
        for (size_t j = 0; j < n_; j++) {
          float v = static_cast<const float*>(item.buffers[n_ + j]->ensure_allocated())[first + i];
          o[i] = j == 0 ? v : item.ast->arg_collective().reduce == Op::MAX ? std::max(o[i], v) : o[i] + v;
        }
      }
    }
    return nullptr;
  }

 private:
  size_t n_;
};

void register_peer_devices() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_device("PEER", [](const std::string& name) { return std::make_unique<PeerDevice>(name); });
    register_collective_library("HOSTLIB", [](const std::vector<std::string>& devices) {
      return register_collective_runner(new HostLibrary(devices.size()));  // lives until exit, as NCCL's
    });
  });
}

const std::vector<std::string> kPeers = {"PEER", "PEER:1", "PEER:2", "PEER:3"};
const std::vector<std::string> kCpus = {"CPU", "CPU:1", "CPU:2", "CPU:3"};

class MultiLibrary : public ::testing::Test {
 protected:
  void SetUp() override {
    register_peer_devices();
    seen().clear();
  }
};

// The whole of a tensor, and each device's part of it, on the host.
std::vector<std::vector<float>> parts_of(const Tensor& t) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : t.shards()) out.push_back(p.to_vector<float>());
  return out;
}

}  // namespace

// ---- which tuples take the library ----

TEST(TupleCollectives, ALibraryEveryPolicyNames) {
  DevicePolicy nccl, other, none;
  nccl.collective_library = "NCCL";
  other.collective_library = "RCCL";
  EXPECT_EQ(shared_collective_library({&nccl, &nccl}), "NCCL");
  EXPECT_EQ(shared_collective_library({&nccl}), "NCCL");  // a tuple of one device takes it too
  EXPECT_EQ(shared_collective_library({&nccl, &none}), "");
  EXPECT_EQ(shared_collective_library({&none, &nccl}), "");
  EXPECT_EQ(shared_collective_library({&nccl, &other}), "");
  EXPECT_EQ(shared_collective_library({&none, &none}), "");
  EXPECT_EQ(shared_collective_library({}), "");
}

TEST(TupleCollectives, VirtualCpusKeepTheKernels) {
  EXPECT_EQ(get_device("CPU:1").policy().collective_library, "");
  TupleCollectives c = tuple_collectives(kCpus);
  EXPECT_EQ(c.library, "");
  EXPECT_EQ(c.group, 0);
  EXPECT_EQ(c.describe(), "copy and add kernels (CPU has no collective library)");
  MultiStats before = multi_stats();
  Tensor x = Tensor::from_vector(iota(8 * 6), {8, 6}).shard(kCpus, 0);
  expect_near(x.sum(0).to_vector<float>(), Tensor::from_vector(iota(8 * 6), {8, 6}).sum(0).to_vector<float>());
  MultiStats s = stats_since(before);
  EXPECT_EQ(s.allreduces, 1u);
  EXPECT_EQ(s.library, 0u);
  EXPECT_GT(s.copies, 0u);
}

TEST_F(MultiLibrary, TuplesOfTheLibrarysDevicesTakeIt) {
  TupleCollectives c = tuple_collectives(kPeers);
  EXPECT_EQ(c.library, "HOSTLIB");
  EXPECT_GT(c.group, 0);
  EXPECT_EQ(c.describe(), "HOSTLIB (one grouped call over the devices)");
  EXPECT_EQ(tuple_collectives(kPeers).group, c.group);  // one runner per tuple
  EXPECT_NE(tuple_collectives({"PEER", "PEER:1"}).group, c.group);
  TupleCollectives mixed = tuple_collectives({"PEER", "CPU:1"});
  EXPECT_EQ(mixed.library, "");
  EXPECT_EQ(mixed.why, "CPU:1 has no collective library");
  KnobScope off(knobs::MULTI_LIBRARY, 0);
  EXPECT_EQ(tuple_collectives(kPeers).describe(), "copy and add kernels (MULTI_LIBRARY=0)");
}

// ---- the library's path ----

// A reduction over the sharded axis: one all-reduce item over the four devices, no copies.
TEST_F(MultiLibrary, AllReduceIsOneItemOverTheTuple) {
  Tensor whole = Tensor::from_vector(iota(8 * 6), {8, 6});
  MultiStats before = multi_stats();
  Tensor sum = whole.shard(kPeers, 0).sum(0), top = whole.shard(kPeers, 0).max(0);
  auto sums = parts_of(sum), tops = parts_of(top);
  MultiStats s = stats_since(before);
  EXPECT_EQ(s.allreduces, 2u);
  EXPECT_EQ(s.library, 2u);
  EXPECT_EQ(s.copies, 0u);
  for (auto& p : sums) expect_near(p, whole.sum(0).to_vector<float>());
  for (auto& p : tops) expect_near(p, whole.max(0).to_vector<float>(), 0);
  ASSERT_EQ(seen().size(), 2u);
  EXPECT_EQ(seen()[0].kind, Op::ALLREDUCE);
  EXPECT_EQ(seen()[0].device, "PEER,PEER:1,PEER:2,PEER:3");
  EXPECT_EQ(seen()[0].buffers, 8u);
  EXPECT_EQ(seen()[0].outputs, 4u);
}

// Ops that need the whole of a sharded axis all-gather it: the concatenated parts are viewed
// back along the axis they were split on, also inside the groups of a grouped split.
TEST_F(MultiLibrary, AllGatherAssemblesEveryAxis) {
  Tensor whole = Tensor::from_vector(iota(4 * 8 * 6), {4, 8, 6});
  for (int64_t axis : {0, 1, 2}) {
    Tensor want = whole.flip({axis});
    MultiStats before = multi_stats();
    auto got = parts_of(whole.shard({"PEER", "PEER:1"}, axis).flip({axis}));
    EXPECT_EQ(stats_since(before).library, 1u) << "axis " << axis;
    EXPECT_EQ(stats_since(before).copies, 0u) << "axis " << axis;
    for (auto& p : got) expect_near(p, want.to_vector<float>(), 0);
  }
  Tensor grouped = whole.shard({"PEER", "PEER:1"}, 1, 2);  // Note [grouped splits]
  for (auto& p : parts_of(grouped.flip({1}))) expect_near(p, whole.flip({1}).to_vector<float>(), 0);
  EXPECT_EQ(seen().back().kind, Op::ALLGATHER);
}

// A reduction's result sharded again over the same devices: each device receives its block of
// the sum, one reduce-scatter (the copy and add kernels all-reduce and keep the block).
TEST_F(MultiLibrary, AReductionShardedAgainIsAReduceScatter) {
  Tensor whole = Tensor::from_vector(iota(8 * 12), {8, 12});
  Tensor want = whole.sum(0);
  for (const auto* devices : {&kPeers, &kCpus}) {
    const bool library = devices == &kPeers;
    seen().clear();
    MultiStats before = multi_stats();
    Tensor blocks = whole.shard(*devices, 0).sum(0).shard(*devices, 0);
    Tensors parts = blocks.shards();
    EXPECT_EQ(stats_since(before).reduce_scatters, library ? 1u : 0u);
    for (size_t k = 0; k < parts.size(); k++)
      expect_near(parts[k].to_vector<float>(), want.shrink({{3 * int64_t(k), 3 * int64_t(k) + 3}}).to_vector<float>());
    ASSERT_EQ(seen().size(), library ? 1u : 0u);
    if (library) {
      EXPECT_EQ(seen()[0].kind, Op::REDUCE_SCATTER);
    }
  }
}

// A reduce-scatter between the devices, as the library runs it: device k gets block k of the sum.
TEST_F(MultiLibrary, ReduceScatterGivesEachDeviceItsBlock) {
  const std::vector<std::string> two = {"PEER", "PEER:1"};
  std::vector<UOpPtr> parts;
  for (size_t k = 0; k < 2; k++) parts.push_back(Tensor::from_vector(iota(8, float(k + 1)), {8}).to(two[k]).uop());
  const CollectiveArg arg{Op::ADD, tuple_collectives(two).group, 2};
  std::vector<UOpPtr> blocks;
  for (size_t k = 0; k < 2; k++) blocks.push_back(make_device_collective(Op::REDUCE_SCATTER, parts, arg, k));
  Tensor scattered(make_multi(blocks, 0));
  Tensor want = Tensor::from_vector(iota(8, 1), {8}) + Tensor::from_vector(iota(8, 2), {8});
  expect_near(scattered.to_vector<float>(), want.to_vector<float>(), 0);
  ASSERT_EQ(seen().size(), 1u);  // both blocks in one item
  EXPECT_EQ(seen()[0].kind, Op::REDUCE_SCATTER);
}

namespace {

struct Mlp {
  nn::Linear l1{12, 16}, l2{16, 4};
  Tensor forward(const Tensor& x) { return l2.forward(l1.forward(x).relu()); }
  std::vector<Tensor*> params() { return {&l1.weight, &*l1.bias, &l2.weight, &*l2.bias}; }
};

// `steps` SGD steps of the MLP, data parallel over `devices`, under a TinyJit; the parameters
// (device 0's) and the most library calls a step inserted.
std::vector<std::vector<float>> train(const std::vector<std::string>& devices, int steps, uint64_t* library,
                                      int64_t* replays) {
  Tensor::manual_seed(7);
  Mlp m;
  auto params = m.params();
  for (Tensor* p : params) p->shard_(devices);
  nn::SGD opt(params, 0.1, 0.9);
  TinyJit step([&](const Tensors& in) {
    Tensor loss = m.forward(in[0].shard(devices, 0)).sparse_categorical_crossentropy(in[1].shard(devices, 0));
    opt.zero_grad();
    loss.backward();
    opt.step({loss});
    return Tensors{loss};
  });
  std::vector<int32_t> labels(16);
  for (size_t i = 0; i < labels.size(); i++) labels[i] = static_cast<int32_t>((i * 3) % 4);
  for (int s = 0; s < steps; s++) {
    MultiStats before = multi_stats();
    step({Tensor::from_vector(iota(16 * 12, 0.05f * float(s + 1)), {16, 12}), Tensor::from_vector(labels, {16})});
    *library = std::max(*library, stats_since(before).library);  // replays rewrite nothing
  }
  *replays = step.replays();
  std::vector<std::vector<float>> out;
  for (Tensor* p : params) out.push_back(p->shards()[0].to_vector<float>());
  return out;
}

}  // namespace

// Data parallel through the library ends where the copy and add kernels do, and the steps replay.
TEST_F(MultiLibrary, DataParallelMatchesTheKernelsAndReplays) {
  uint64_t library = 0, none = 0;
  int64_t replays = 0, kernel_replays = 0;
  auto through_library = train(kPeers, 4, &library, &replays);
  auto kernels = train(kCpus, 4, &none, &kernel_replays);
  ASSERT_EQ(through_library.size(), kernels.size());
  for (size_t i = 0; i < kernels.size(); i++) expect_near(through_library[i], kernels[i]);
  EXPECT_EQ(none, 0u);
  EXPECT_GT(library, 0u);
  EXPECT_EQ(replays, 2);
  EXPECT_EQ(kernel_replays, 2);
  size_t reduces = 0;
  for (auto& s : seen()) reduces += s.kind == Op::ALLREDUCE && s.device == "PEER,PEER:1,PEER:2,PEER:3";
  EXPECT_GT(reduces, 0u);
  EXPECT_EQ(seen().back().outputs, 4u);
}
