// runtime/cuda_graph: a jitted training step on CUDA replayed as CUDA graphs gives bit-identical
// losses and parameters to the same step replayed kernel by kernel, whether each replay finds its
// instance by buffer addresses, updates one from a fresh capture, or instantiates one; a step
// that copies from the host is replayed kernel by kernel with the reason. Runtime/cuda_staging:
// host copies through pinned staging keep their order with kernels on the stream, at sizes that
// span several staging chunks. Skipped with the reason where there is no GPU.
#include <gtest/gtest.h>

#include <memory>

#include "cuda_test.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/knobs.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"
#include "train_util.h"

namespace tg {
namespace {

using testutil::expect_bit_identical;
using testutil::KnobScope;

class CudaGraph : public testutil::CudaTest {};

struct Trained : testutil::StepResults {
  std::string log;  // stderr at DEBUG=1 during the steps
};

// `steps` SGD-momentum steps of a small MLP under TinyJit with CUDA_GRAPH=graphs. distinct: a new
// input tensor every step, all alive until the end (new addresses on every replay); else one
// input for all steps (the same addresses). host_input: the input lives on the CPU and is
// copied to CUDA inside the step.
Trained train(int graphs, int steps, bool distinct, bool host_input = false) {
  KnobScope g(knobs::CUDA_GRAPH, graphs);
  Tensor::manual_seed(3);
  nn::Sequential model;
  model.emplace<nn::Linear>(24, 32);
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(32, 6);
  nn::SGD opt(model.parameters(), 0.05, 0.9);
  TinyJit step([&](const Tensors& in) {
    Tensor x = host_input ? in[0].to("CUDA") : in[0];
    Tensor loss = model(x).sparse_categorical_crossentropy(in[1]);
    opt.zero_grad();
    loss.backward();
    opt.step({loss});
    return Tensors{loss};
  });
  std::string x_device = host_input ? "CPU" : "CUDA";
  std::vector<Tensors> inputs;
  for (int i = 0; i < (distinct ? steps : 1); i++)
    inputs.push_back({Tensor::randn({16, 24}).to(x_device).realize(), Tensor::randint({16}, 0, 6).realize()});
  Trained r;
  {
    KnobScope d(knobs::DEBUG, 1);
    ::testing::internal::CaptureStderr();
    // each loss is read at once, so its buffer goes back to the pool as a training loop's does
    for (int i = 0; i < steps; i++) r.losses.push_back(step(inputs[distinct ? i : 0])[0].item<float>());
    r.log = ::testing::internal::GetCapturedStderr();
  }
  for (auto& [name, t] : model.state_dict()) r.params.push_back(t.to_vector<float>());
  return r;
}

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) n++;
  return n;
}

TEST_F(CudaGraph, SameInputReplaysFindTheirInstances) {
  Trained plain = train(0, 10, false);
  EXPECT_EQ(count(plain.log, "graph of"), 0u) << plain.log;
  Trained graphed = train(4, 10, false);
  expect_bit_identical(plain, graphed);
  // calls 1 and 2 run normally and capture; the 8 replays launch graphs, and once the pool hands
  // the fresh buffers back in its steady cycle, they are found by address
  EXPECT_EQ(count(graphed.log, "graph of"), 8u) << graphed.log;
  EXPECT_GE(count(graphed.log, "(cached)"), 4u) << graphed.log;
}

TEST_F(CudaGraph, NewAddressesUpdateOrInstantiate) {
  Trained plain = train(0, 8, true);
  for (int graphs : {1, 3}) {
    Trained graphed = train(graphs, 8, true);
    expect_bit_identical(plain, graphed);
    EXPECT_EQ(count(graphed.log, "graph of"), 6u) << graphed.log;
    EXPECT_EQ(count(graphed.log, "captured and instantiated"), static_cast<size_t>(graphs)) << graphed.log;
    EXPECT_EQ(count(graphed.log, "captured and updated"), static_cast<size_t>(6 - graphs)) << graphed.log;
  }
}

TEST_F(CudaGraph, StepWithAHostCopyReplaysKernelByKernel) {
  Trained plain = train(0, 5, true, true);
  Trained graphed = train(4, 5, true, true);
  expect_bit_identical(plain, graphed);
  EXPECT_NE(graphed.log.find("CUDA graph: not used for this capture: it copies CPU -> CUDA"),
            std::string::npos)
      << graphed.log;
  EXPECT_EQ(count(graphed.log, "graph of"), 0u) << graphed.log;
}

TEST_F(CudaGraph, StagedCopiesKeepStreamOrder) {
  // 40 MiB spans five staging chunks; each copy_in overwrites the host vector at once, and the
  // kernel between the copies must see the first one's data, not the second's
  const int64_t n = int64_t{10} << 20;
  std::vector<float> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) host[static_cast<size_t>(i)] = static_cast<float>(i % 1000);
  Tensor a = Tensor::from_vector(host, {n});
  Tensor doubled = (a * 2).realize();
  for (auto& v : host) v = -1;
  Tensor b = Tensor::from_vector(host, {n});
  b.realize();
  std::vector<float> out = doubled.to_vector<float>(), back = b.to_vector<float>();
  for (int64_t i = 0; i < n; i += 9973) {
    ASSERT_EQ(out[static_cast<size_t>(i)], 2.0f * static_cast<float>(i % 1000)) << "element " << i;
    ASSERT_EQ(back[static_cast<size_t>(i)], -1.0f) << "element " << i;
  }
  EXPECT_EQ(out[static_cast<size_t>(n - 1)], 2.0f * static_cast<float>((n - 1) % 1000));
}

}  // namespace
}  // namespace tg
