// The kernel pipeline (codegen/pipeline.h) on the default device: its passes in order under
// DEBUG=5, the optimizer's choice per device kind, realize running exactly what the pipeline
// made, BEAM through the same passes, and the float32 precision policy.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/device_env.h"
#include "tests/test_util.h"
#include "tinygrad/codegen/opt_gpu.h"
#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/engine/beam.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/tensor.h"

namespace tg {
namespace {

using testutil::KnobScope;

Tensor realized_randn(const Shape& s, uint64_t seed) {
  Tensor::manual_seed(seed);
  return Tensor::randn(s).realize();
}

ScheduleItem only_kernel(const Tensor& t) {
  auto items = create_schedule({t.uop()});
  EXPECT_EQ(items.size(), 1u);
  return items.at(0);
}

std::vector<DType> dtypes_of(const ScheduleItem& item) {
  std::vector<DType> d;
  for (auto& b : item.buffers) d.push_back(b->dtype());
  return d;
}

TEST(Pipeline, Debug5PrintsEveryPassInOrder) {
  ScheduleItem item = only_kernel((realized_randn({64, 128}, 1).exp2() * 2).sum(1));  // a reduce loop left
  Device& dev = get_device(item.device);
  std::string log;
  {
    KnobScope debug(knobs::DEBUG, 5);
    testing::internal::CaptureStderr();
    lower_with_choice(item.ast, dtypes_of(item), CodegenTarget::of(dev), heuristic_choice(item, dev));
    log = testing::internal::GetCapturedStderr();
  }
  size_t at = 0;
  std::vector<const char*> passes = {"--- scheduled kernel:", "--- optimize:", "--- map threads:", "--- decompose:",
                                     "--- linearize:", "--- render:"};
  if (!dev.policy().gpu) passes = {"--- scheduled kernel:", "--- optimize:", "--- decompose:", "--- linearize:",
                                   "--- host threads:", "--- render:"};
  for (const char* pass : passes) {
    size_t found = log.find(pass, at);
    ASSERT_NE(found, std::string::npos) << pass << " missing or out of order in:\n" << log;
    at = found + 1;
  }
  EXPECT_NE(log.find("REDUCE"), std::string::npos) << log;       // the kernel graph
  EXPECT_NE(log.find("DEFINE_ACC"), std::string::npos) << log;   // the linearized kernel
}

TEST(Pipeline, NothingPrintedBelowDebug5) {
  ScheduleItem item = only_kernel(realized_randn({8, 8}, 2) + 1);
  Device& dev = get_device(item.device);
  KnobScope debug(knobs::DEBUG, 0);
  testing::internal::CaptureStderr();
  lower_with_choice(item.ast, dtypes_of(item), CodegenTarget::of(dev), heuristic_choice(item, dev));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// The heuristics pick the tiles of the device's kind (its policy), none with NOOPT=1.
TEST(Pipeline, HeuristicChoiceFollowsTheDevicePolicy) {
  ScheduleItem item = only_kernel(realized_randn({64, 96}, 3).matmul(realized_randn({96, 48}, 4)));
  Device& dev = get_device(item.device);
  KernelChoice c = heuristic_choice(item, dev);
  if (c.kind == KernelChoice::Kind::Generated) {
    auto expected =
        dev.policy().gpu ? gpu_hand_coded_opts(item.ast) : hand_coded_opts(item.ast, dev.policy().cpu);
    EXPECT_EQ(opts_str(c.opts), opts_str(expected));
    if (!dev.policy().gpu) {
      EXPECT_FALSE(c.opts.empty());  // a register tile (GPU tiles: larger outputs only)
    }
  } else {
    EXPECT_EQ(c.kind, KernelChoice::Kind::Library);  // cuBLASLt takes the product
  }
  KnobScope noopt(knobs::NOOPT, 1);
  KnobScope lib(knobs::MATMUL_LIB, 0);
  KernelChoice none = heuristic_choice(item, dev);
  EXPECT_EQ(none.kind, KernelChoice::Kind::Generated);
  EXPECT_TRUE(none.opts.empty());
}

// GPU-style devices get thread indices and work-group sizes, CPU-style ones keep their loops.
TEST(Pipeline, MapThreadsFollowsTheDevicePolicy) {
  ScheduleItem item = only_kernel(realized_randn({256, 64}, 5).relu());
  Device& dev = get_device(item.device);
  LoweredKernel k = lower_with_choice(item.ast, dtypes_of(item), CodegenTarget::of(dev), KernelChoice::generated({}));
  size_t specials = 0, ranges = 0;
  for (auto& u : k.kernel.uops) specials += u->op == Op::SPECIAL, ranges += u->op == Op::RANGE;
  if (dev.policy().gpu) {
    EXPECT_GT(specials, 0u);
    EXPECT_EQ(ranges, 0u);
    EXPECT_FALSE(k.kernel.local_size.empty());
  } else {
    EXPECT_EQ(specials, 0u);
    EXPECT_EQ(ranges, 2u);
    EXPECT_TRUE(k.kernel.local_size.empty());
  }
}

// run_schedule launches what lower_kernel_item made: the same kernel name and launch sizes.
TEST(Pipeline, RealizeRunsThePipelinesKernel) {
  KnobScope lib(knobs::MATMUL_LIB, 0);
  Tensor a = realized_randn({128, 64}, 6), b = realized_randn({64, 32}, 7);
  Tensor r = a.matmul(b);
  ScheduleItem item = only_kernel(r);
  LoweredKernel expected = lower_kernel_item(item, get_device(item.device));
  std::vector<KernelLaunch> launched;
  ExecRecorder rec = [&](const ExecItem& e) {
    if (e.item.kind == ScheduleItem::Kind::Kernel) launched.push_back(e.launch);
  };
  ExecRecorder* prev = set_exec_recorder(&rec);
  r.realize();
  set_exec_recorder(prev);
  ASSERT_EQ(launched.size(), 1u);
  EXPECT_EQ(launched[0].name, expected.kernel.name);
  EXPECT_EQ(launched[0].global_size, expected.kernel.global_size);
  EXPECT_EQ(launched[0].local_size, expected.kernel.local_size);
}

TEST(Pipeline, ChoiceTextRoundTrips) {
  KernelChoice g = KernelChoice::generated({{OptOp::UPCAST, 0, 4}, {OptOp::UNROLL, 2, 8}});
  EXPECT_EQ(g.str(), "UPCAST(0,4) UNROLL(2,8)");
  KernelChoice back = parse_choice(g.str() + "\n");
  EXPECT_EQ(back.kind, KernelChoice::Kind::Generated);
  EXPECT_EQ(back.opts, g.opts);
  EXPECT_EQ(parse_choice("tensor cores\n").kind, KernelChoice::Kind::TensorCores);
  EXPECT_EQ(parse_choice("library matmul b1 m2").kind, KernelChoice::Kind::Library);
  EXPECT_TRUE(parse_choice("").opts.empty());
  testutil::expect_error([] { parse_choice("tensor-cores"); }, {"cannot parse"});
}

// Note [float32 precision policy]: one knob, three levels.
TEST(PrecisionPolicy, Tf32Levels) {
  {
    KnobScope exact(knobs::TF32, 0);
    EXPECT_FALSE(tf32_for(Float32Product::Convolution));
    EXPECT_FALSE(tf32_for(Float32Product::Matmul));
  }
  {
    KnobScope conv(knobs::TF32, 1);
    EXPECT_TRUE(tf32_for(Float32Product::Convolution));
    EXPECT_FALSE(tf32_for(Float32Product::Matmul));
  }
  {
    KnobScope all(knobs::TF32, 2);
    EXPECT_TRUE(tf32_for(Float32Product::Convolution));
    EXPECT_TRUE(tf32_for(Float32Product::Matmul));
  }
  EXPECT_EQ(knobs::TF32.get(), 1);  // the default
}

class PipelineBeam : public testutil::TempDirTest {};

// BEAM searches on every device kind, through the pipeline's passes: its winner computes what the
// plain kernel computes, and it is at least as fast as no opts (it is one of the candidates).
TEST_F(PipelineBeam, SearchesOnThisDevice) {
  KnobScope cachedir(knobs::CACHEDIR, dir_.string());
  KnobScope lib(knobs::MATMUL_LIB, 0);
  Tensor a = realized_randn({32, 64}, 8), b = realized_randn({64, 16}, 9);
  std::vector<float> plain;
  {
    KnobScope noopt(knobs::NOOPT, 1);
    plain = a.matmul(b).to_vector<float>();
  }
  KernelChoice choice;
  {
    KnobScope beam(knobs::BEAM, 1);
    Tensor r = a.matmul(b);
    choice = beam_search(only_kernel(r), 1);
    auto searched = r.to_vector<float>();
    ASSERT_EQ(searched.size(), plain.size());
    for (size_t i = 0; i < plain.size(); i++) ASSERT_NEAR(searched[i], plain[i], 1e-3 * (1 + std::abs(plain[i])));
  }
  EXPECT_EQ(choice.kind, KernelChoice::Kind::Generated) << choice.str();
  size_t cached = 0;
  for (auto& e : std::filesystem::directory_iterator(dir_ / "beam")) cached += e.path().extension() == ".txt";
  EXPECT_EQ(cached, 1u);
}

// BEAM times its candidates on scratch outputs: an embedding's gradient (zeroed, then added into)
// is the same with and without the search.
TEST_F(PipelineBeam, AccumulatingKernelsAreSearchedWithoutTouchingTheirOutput) {
  KnobScope cachedir(knobs::CACHEDIR, dir_.string());
  Tensor table = realized_randn({40, 16}, 10);
  Tensor idx = Tensor::from_vector(std::vector<int32_t>{3, 3, 39, 0, 7, 3}, {6});
  auto grad_of_rows = [&] {
    Tensor t = table.detach().requires_grad_();
    (t.index_select(0, idx) * 2.0).sum().backward();
    return t.grad()->to_vector<float>();
  };
  std::vector<float> plain = grad_of_rows(), searched;
  {
    KnobScope beam(knobs::BEAM, 2);
    searched = grad_of_rows();
  }
  EXPECT_EQ(searched, plain);
  EXPECT_EQ(plain[3 * 16], 6.0f);  // three lookups of row 3, each with gradient 2
}

}  // namespace
}  // namespace tg
