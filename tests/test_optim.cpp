// tg::nn optimizers, clip_grad_norm and learning-rate schedules: a few steps of each optimizer on
// a small quadratic checked against the same update written in plain C++ doubles, state dicts
// (names, exact resume, load errors), and small models that actually learn.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "tinygrad/engine/realize.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/nn/schedule.h"
#include "host_reads.h"
#include "test_util.h"

using namespace tg;
using namespace tg::nn;

namespace {

using Vec = std::vector<double>;

using tg::testutil::expect_error;

// The quadratic: loss = sum(0.5 * c * p^2 - b * p) over two parameters (a [2,2] and a [3]), so
// grad = c * p - b. Reference optimizers run the same update on doubles.
struct Problem {
  std::vector<Vec> init{{1.0, -2.0, 0.5, 3.0}, {-1.0, 0.25, 2.0}};
  std::vector<Vec> c{{1.0, 2.0, 0.5, 1.5}, {3.0, 1.0, 0.2}};
  std::vector<Vec> b{{0.5, -1.0, 0.0, 2.0}, {1.0, 0.0, -0.5}};
  std::vector<Shape> shapes{{2, 2}, {3}};

  std::vector<Tensor> make() const {
    std::vector<Tensor> ps;
    for (size_t i = 0; i < init.size(); i++) ps.push_back(Tensor::from_vector(init[i], shapes[i], {.dtype = DType::Float32}).requires_grad_());
    return ps;
  }
  Tensor loss(const std::vector<Tensor>& ps) const {
    std::optional<Tensor> l;
    for (size_t i = 0; i < ps.size(); i++) {
      Tensor ci = Tensor::from_vector(c[i], shapes[i], {.dtype = DType::Float32});
      Tensor bi = Tensor::from_vector(b[i], shapes[i], {.dtype = DType::Float32});
      Tensor li = (ci * ps[i] * ps[i] * 0.5 - bi * ps[i]).sum();
      l = l ? *l + li : li;
    }
    return *l;
  }
  Vec grad(size_t i, const Vec& p) const {
    Vec g(p.size());
    for (size_t j = 0; j < p.size(); j++) g[j] = c[i][j] * p[j] - b[i][j];
    return g;
  }
};

std::vector<Tensor*> ptrs(std::vector<Tensor>& ps) {
  std::vector<Tensor*> out;
  for (auto& p : ps) out.push_back(&p);
  return out;
}

// Runs `steps` steps of `opt` on the problem's tensors and of `ref` (which updates one parameter's
// doubles given its index, values and gradient, for step t = 1, 2, ...) and compares after each.
void check_against(Optimizer& opt, std::vector<Tensor>& ps, const Problem& pr, int steps,
                   const std::function<void(size_t i, int t, Vec& p, const Vec& g)>& ref, double tol = 2e-5) {
  std::vector<Vec> want = pr.init;
  for (int t = 1; t <= steps; t++) {
    opt.zero_grad();
    pr.loss(ps).backward();
    opt.step();
    for (size_t i = 0; i < ps.size(); i++) {
      ref(i, t, want[i], pr.grad(i, want[i]));
      auto got = ps[i].to_vector<float>();
      for (size_t j = 0; j < got.size(); j++)
        EXPECT_NEAR(got[j], want[i][j], tol * (1 + std::fabs(want[i][j]))) << "step " << t << " param " << i << "[" << j << "]";
      EXPECT_EQ(ps[i].uop()->op, Op::BUFFER) << "assign leaves a fresh buffer";
    }
  }
  EXPECT_EQ(opt.step_count(), steps);
}

double norm(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

}  // namespace

TEST(Optim, SGDPlain) {
  Problem pr;
  auto ps = pr.make();
  SGD opt(ptrs(ps), 0.1);
  check_against(opt, ps, pr, 3, [](size_t, int, Vec& p, const Vec& g) {
    for (size_t j = 0; j < p.size(); j++) p[j] -= 0.1 * g[j];
  });
  EXPECT_EQ(opt.state_dict().size(), 1u);  // only "step"
}

TEST(Optim, SGDMomentumWeightDecayDampening) {
  for (bool nesterov : {false, true}) {
    double damp = nesterov ? 0.0 : 0.2;
    Problem pr;
    auto ps = pr.make();
    SGD opt(ptrs(ps), 0.05, 0.9, damp, 0.01, nesterov);
    std::vector<Vec> buf(2);
    check_against(opt, ps, pr, 4, [&](size_t i, int, Vec& p, const Vec& g0) {
      Vec g = g0;
      for (size_t j = 0; j < p.size(); j++) g[j] += 0.01 * p[j];
      if (buf[i].empty()) buf[i] = g;  // PyTorch: the first update copies the gradient
      else
        for (size_t j = 0; j < p.size(); j++) buf[i][j] = 0.9 * buf[i][j] + (1 - damp) * g[j];
      for (size_t j = 0; j < p.size(); j++) p[j] -= 0.05 * (nesterov ? g[j] + 0.9 * buf[i][j] : buf[i][j]);
    });
  }
  expect_error([] {
    Tensor p = Tensor::zeros({1}, {.requires_grad = true});
    SGD(std::vector<Tensor*>{&p}, 0.1, 0.0, 0.0, 0.0, true);
  }, {"SGD", "nesterov", "momentum=0"});
}

TEST(Optim, AdamAndAdamW) {
  for (int variant = 0; variant < 3; variant++) {  // Adam, Adam with L2, AdamW
    double wd = variant == 0 ? 0.0 : 0.1, lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-8;
    Problem pr;
    auto ps = pr.make();
    std::unique_ptr<Optimizer> opt;
    if (variant < 2) opt = std::make_unique<Adam>(ptrs(ps), lr, b1, b2, eps, wd);
    else opt = std::make_unique<AdamW>(ptrs(ps), lr, b1, b2, eps, wd);
    EXPECT_EQ(opt->type_name(), variant < 2 ? "Adam" : "AdamW");
    std::vector<Vec> m{Vec(4), Vec(3)}, v{Vec(4), Vec(3)};
    check_against(*opt, ps, pr, 4, [&](size_t i, int t, Vec& p, const Vec& g0) {
      Vec g = g0;
      if (variant == 1)
        for (size_t j = 0; j < p.size(); j++) g[j] += wd * p[j];
      double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      for (size_t j = 0; j < p.size(); j++) {
        if (variant == 2) p[j] *= 1 - lr * wd;
        m[i][j] = b1 * m[i][j] + (1 - b1) * g[j];
        v[i][j] = b2 * v[i][j] + (1 - b2) * g[j] * g[j];
        p[j] -= lr / bc1 * m[i][j] / (std::sqrt(v[i][j]) / std::sqrt(bc2) + eps);
      }
    });
  }
}

// AdamW with parameter groups: each group decays by its own weight decay (nanoGPT's groups:
// matrices decay, biases and norms don't). With zero gradients the Adam update is zero, so what
// changes is the decay alone.
TEST(Optim, AdamWParameterGroups) {
  Tensor w = Tensor::full({2, 3}, 2.0), b = Tensor::full({3}, 2.0), n = Tensor::full({3}, 2.0),
         w2 = Tensor::full({3, 1}, 2.0);
  for (Tensor* t : {&w, &b, &n, &w2}) t->requires_grad_();
  auto groups = decay_matrices_only({&w, &b, &n, &w2}, 0.1);
  ASSERT_EQ(groups.size(), 3u);  // runs of the same decay, in the given order
  EXPECT_EQ(groups[0].params, (std::vector<Tensor*>{&w}));
  EXPECT_EQ(groups[1].params, (std::vector<Tensor*>{&b, &n}));
  EXPECT_EQ(groups[2].params, (std::vector<Tensor*>{&w2}));
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  AdamW opt(groups, 0.5);
  EXPECT_EQ(opt.params(), (std::vector<Tensor*>{&w, &b, &n, &w2}));
  for (int step = 0; step < 2; step++) {
    for (Tensor* t : {&w, &b, &n, &w2}) t->set_grad(t->zeros_like());
    opt.step();
  }
  for (float x : w.to_vector<float>()) EXPECT_FLOAT_EQ(x, 2.0f * 0.95f * 0.95f);
  for (float x : w2.to_vector<float>()) EXPECT_FLOAT_EQ(x, 2.0f * 0.95f * 0.95f);
  for (float x : b.to_vector<float>()) EXPECT_FLOAT_EQ(x, 2.0f);
  for (float x : n.to_vector<float>()) EXPECT_FLOAT_EQ(x, 2.0f);
  expect_error([&] { AdamW bad({{{&w}, -1.0}}); }, {"weight_decay must be non-negative, got -1"});
}

TEST(Optim, LAMBTrustRatio) {
  for (bool adam : {false, true}) {
    double lr = 0.05, b1 = 0.9, b2 = 0.999, eps = 1e-6, wd = 0.01;
    Problem pr;
    auto ps = pr.make();
    LAMB opt(ptrs(ps), lr, b1, b2, eps, wd, adam);
    std::vector<Vec> m{Vec(4), Vec(3)}, v{Vec(4), Vec(3)};
    check_against(opt, ps, pr, 3, [&](size_t i, int t, Vec& p, const Vec& g) {
      Vec up(p.size());
      for (size_t j = 0; j < p.size(); j++) {
        m[i][j] = b1 * m[i][j] + (1 - b1) * g[j];
        v[i][j] = b2 * v[i][j] + (1 - b2) * g[j] * g[j];
        double mh = m[i][j] / (1 - std::pow(b1, t)), vh = v[i][j] / (1 - std::pow(b2, t));
        up[j] = mh / (std::sqrt(vh) + eps) + wd * p[j];
      }
      double r1 = norm(p), r2 = norm(up), r = adam ? 1.0 : (r1 > 0 && r2 > 0 ? r1 / r2 : 1.0);
      for (size_t j = 0; j < p.size(); j++) p[j] -= lr * r * up[j];
    });
  }
}

TEST(Optim, ParamsWithoutGradAreSkipped) {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2}, {2}).requires_grad_();
  Tensor b = Tensor::from_vector(std::vector<float>{3, 4}, {2}).requires_grad_();
  Adam opt({&a, &b}, 0.1);
  (a * a).sum().backward();
  opt.step();
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{3, 4}));
  EXPECT_EQ(opt.state_dict().at("1.exp_avg").to_vector<float>(), (std::vector<float>{0, 0}));
  EXPECT_NE(a.to_vector<float>(), (std::vector<float>{1, 2}));
  opt.zero_grad();
  EXPECT_FALSE(a.grad().has_value());
}

TEST(Optim, StateDictResumesExactly) {
  Problem pr;
  auto run = [&](Optimizer& opt, std::vector<Tensor>& ps, int steps) {
    for (int s = 0; s < steps; s++) {
      opt.zero_grad();
      pr.loss(ps).backward();
      opt.step();
    }
  };
  auto pa = pr.make();
  Adam a(ptrs(pa), 0.02);
  run(a, pa, 2);
  auto sd = a.state_dict();
  std::vector<std::string> keys;
  for (auto& [k, t] : sd) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"0.exp_avg", "0.exp_avg_sq", "1.exp_avg", "1.exp_avg_sq", "step"}));
  EXPECT_EQ(sd.at("step").item<int64_t>(), 2);
  EXPECT_EQ(sd.at("1.exp_avg").shape(), (Shape{3}));

  // a fresh optimizer on copies of the parameters, loaded from the snapshot, continues identically
  auto pb = pr.make();
  for (size_t i = 0; i < pb.size(); i++) pb[i].assign(pa[i].detach());
  Adam b(ptrs(pb), 0.02);
  b.load_state_dict(sd);
  EXPECT_EQ(b.step_count(), 2);
  run(a, pa, 2);
  run(b, pb, 2);
  for (size_t i = 0; i < pa.size(); i++) EXPECT_EQ(pa[i].to_vector<float>(), pb[i].to_vector<float>());
  // the snapshot did not move with the optimizer
  EXPECT_EQ(sd.at("step").item<int64_t>(), 2);

  SGD sgd(ptrs(pb), 0.1, 0.9);
  EXPECT_EQ(sgd.state_dict().count("0.momentum_buffer"), 1u);
  expect_error([&] { sgd.load_state_dict(sd); },
               {"SGD.load_state_dict", "missing key '0.momentum_buffer'", "unexpected key '0.exp_avg'"});
  auto bad = sd;
  bad["1.exp_avg_sq"] = Tensor::zeros({4});
  expect_error([&] { b.load_state_dict(bad); }, {"mismatch for '1.exp_avg_sq'", "expected float32[3]", "got float32[4]"});
}

TEST(Optim, ClipGradNorm) {
  Tensor a = Tensor::from_vector(std::vector<float>{0, 0}, {2}).requires_grad_();
  Tensor b = Tensor::from_vector(std::vector<float>{0}, {1}).requires_grad_();
  Tensor c = Tensor::from_vector(std::vector<float>{5}, {1}).requires_grad_();  // no grad: skipped
  ((a * Tensor::from_vector(std::vector<float>{3, 4}, {2})).sum() + (b * 12.0).sum()).backward();  // grads [3,4], [12]
  EXPECT_NEAR(clip_grad_norm({&a, &b, &c}, 100.0), 13.0, 1e-5);
  EXPECT_EQ(a.grad()->to_vector<float>(), (std::vector<float>{3, 4}));
  EXPECT_NEAR(clip_grad_norm({&a, &b, &c}, 6.5), 13.0, 1e-5);
  double k = 6.5 / (13 + 1e-6);
  auto ga = a.grad()->to_vector<float>();
  EXPECT_NEAR(ga[0], 3 * k, 1e-6);
  EXPECT_NEAR(ga[1], 4 * k, 1e-6);
  EXPECT_NEAR(b.grad()->item<float>(), 12 * k, 1e-5);
  EXPECT_FALSE(c.grad().has_value());
  EXPECT_NEAR(clip_grad_norm({&a, &b}, 100.0), 6.5, 1e-5);
  EXPECT_EQ(clip_grad_norm({&c}, 1.0), 0.0);
}

TEST(Schedule, Values) {
  ConstantLR constant(0.1);
  EXPECT_DOUBLE_EQ(constant.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(constant.lr_at(1000), 0.1);
  StepLR step(1.0, 10, 0.5);
  EXPECT_DOUBLE_EQ(step.lr_at(0), 1.0);
  EXPECT_DOUBLE_EQ(step.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(step.lr_at(10), 0.5);
  EXPECT_DOUBLE_EQ(step.lr_at(25), 0.25);
  CosineLR cos(1.0, 100, 0.1);
  EXPECT_DOUBLE_EQ(cos.lr_at(0), 1.0);
  EXPECT_NEAR(cos.lr_at(50), 0.55, 1e-12);
  EXPECT_NEAR(cos.lr_at(25), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-12);
  EXPECT_DOUBLE_EQ(cos.lr_at(100), 0.1);
  EXPECT_DOUBLE_EQ(cos.lr_at(150), 0.1);
  WarmupLR warm(std::make_unique<CosineLR>(1.0, 100, 0.0), 4);
  EXPECT_DOUBLE_EQ(warm.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(warm.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(warm.lr_at(4), 1.0);
  EXPECT_NEAR(warm.lr_at(54), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(warm.lr_at(104), 0.0);
  expect_error([&] { step.lr_at(-1); }, {"StepLR", "step must be non-negative", "-1"});
  expect_error([] { StepLR(1.0, 0); }, {"step_size must be positive"});
  expect_error([] { WarmupLR(nullptr, 3); }, {"WarmupLR"});
}

// y = 2 x0 - 3 x1 + 1 learned by Linear(2, 1) with SGD + momentum under a cosine schedule.
TEST(Learn, LinearRegression) {
  Tensor::manual_seed(0);
  Tensor x = Tensor::uniform({32, 2}, -1, 1);
  Tensor y = x.matmul(Tensor::from_vector(std::vector<float>{2, -3}, {2, 1})) + 1.0;
  y.realize();
  Linear model(2, 1);
  SGD opt(model.parameters(), 0.1, 0.9);
  WarmupLR sched(std::make_unique<CosineLR>(0.1, 150, 0.01), 5);
  float loss = 0;
  for (int s = 0; s < 150; s++) {
    opt.lr = sched.lr_at(s);
    opt.zero_grad();
    Tensor l = model(x).mse(y);
    l.backward();
    opt.step();
    if (s == 149) loss = l.item<float>();
  }
  EXPECT_LT(loss, 1e-4);
  auto w = model.weight.to_vector<float>();
  EXPECT_NEAR(w[0], 2, 1e-2);
  EXPECT_NEAR(w[1], -3, 1e-2);
  EXPECT_NEAR(model.bias->item<float>(), 1, 1e-2);
}

// XOR with a 2-8-1 tanh MLP and AdamW, gradients clipped every step.
TEST(Learn, XorMlp) {
  Tensor::manual_seed(42);
  Tensor x = Tensor::from_vector(std::vector<float>{0, 0, 0, 1, 1, 0, 1, 1}, {4, 2});
  Tensor y = Tensor::from_vector(std::vector<float>{0, 1, 1, 0}, {4, 1});
  Sequential net(std::make_unique<Linear>(2, 8), std::make_unique<Tanh>(), std::make_unique<Linear>(8, 1));
  AdamW opt(net.parameters(), 0.05, 0.9, 0.999, 1e-8, 0.0);
  float first = 0, loss = 0;
  for (int s = 0; s < 200; s++) {
    opt.zero_grad();
    Tensor l = net(x).binary_crossentropy_logits(y);
    l.backward();
    clip_grad_norm(net.parameters(), 5.0);
    opt.step();
    if (s == 0) first = l.item<float>();
    if (s == 199) loss = l.item<float>();
  }
  EXPECT_GT(first, 0.5);
  EXPECT_LT(loss, 0.05);
  auto p = net(x).sigmoid().to_vector<float>();
  EXPECT_LT(p[0], 0.5);
  EXPECT_GT(p[1], 0.5);
  EXPECT_GT(p[2], 0.5);
  EXPECT_LT(p[3], 0.5);
}

// Note [a step skipped on the device] (optim.h): step_if(true) is step() bit for bit, in as many
// kernels (one per parameter: p, m and v of Adam together, and the skip count in the kernel of
// ok, which the caller realizes as the data-parallel steps do: Note [the skip count's kernel])
// but one, the bias corrections of Adam and LAMB (Note [bias corrections after a skip]), and
// step_if(false) changes nothing. A data-parallel run at one rank then equals the plain run
// exactly: gating the finished values instead split each update into three kernels whose float
// contractions differed in the last bit, and 30 Adam steps of the CNN turned that into
// parameters 15% apart.
TEST(Optim, StepIfTrueIsStepBitForBitInTheSameKernels) {
  for (int kind = 0; kind < 4; kind++) {  // SGD with momentum, Adam, AdamW, LAMB
    auto make = [&](std::vector<Tensor>& ps) -> std::unique_ptr<Optimizer> {
      if (kind == 0) return std::make_unique<SGD>(ptrs(ps), 0.05, 0.9);
      if (kind == 1) return std::make_unique<Adam>(ptrs(ps), 0.01, 0.9, 0.99, 1e-8, 0.1);
      if (kind == 2) return std::make_unique<AdamW>(ptrs(ps), 0.01, 0.9, 0.99, 1e-8, 0.1);
      return std::make_unique<LAMB>(ptrs(ps), 0.01, 0.9, 0.99, 1e-6, 0.01);
    };
    Problem pr;
    auto plain = pr.make(), gated = pr.make();
    auto a = make(plain), b = make(gated);
    Tensor no = Tensor::from_vector(std::vector<float>{0}, {}) > 0.0;
    auto one = [] { return Tensor::from_vector(std::vector<float>{1}, {}) > 0.0; };  // lazy: a kernel makes it
    auto& counters = GlobalCounters::get();
    for (int t = 1; t <= 3; t++) {
      a->zero_grad();
      pr.loss(plain).backward();
      b->zero_grad();
      pr.loss(gated).backward();
      for (auto& p : plain) p.grad()->realize();
      for (auto& p : gated) p.grad()->realize();
      uint64_t before = counters.kernels_run;
      a->step({one()});
      uint64_t plain_kernels = counters.kernels_run - before;
      before = counters.kernels_run;
      Tensor yes = one();
      b->step_if(yes, {yes});
      const uint64_t corrections = kind == 0 ? 0 : 1;  // Adam's and LAMB's bias corrections: one small kernel
      EXPECT_EQ(counters.kernels_run - before, plain_kernels + corrections) << b->type_name() << " step " << t;
      for (size_t i = 0; i < plain.size(); i++)
        EXPECT_EQ(plain[i].to_vector<float>(), gated[i].to_vector<float>()) << b->type_name() << " step " << t;
    }
    auto before = b->state_dict();
    b->zero_grad();
    pr.loss(gated).backward();
    b->step_if(no);
    b->settle();
    for (auto& [key, value] : b->state_dict()) {
      if (value.dtype() != DType::Float32) continue;
      EXPECT_EQ(value.to_vector<float>(), before.at(key).to_vector<float>()) << b->type_name() << " " << key;
    }
  }
}

// Note [bias corrections after a skip] (optim.h): steps that step_if skips are counted on the
// device, and with no host read in between the later steps use the bias corrections of the steps
// actually taken: the parameters equal, within 1e-6 relative, those of an optimizer that ran the
// taken steps alone, the state dict's step count is already that optimizer's, and settle()
// returns the skips and takes them back. From step 0 (1 - b2^n with b2 = 0.999 keeps few digits
// in float32 unless computed as expm1), from 300 and from 5000 (a loaded count).
TEST(Optim, SkippedStepsAreCountedOnTheDevice) {
  const std::vector<bool> oks = {true, false, true, false, false, true, true, false, true};
  const int64_t taken = std::count(oks.begin(), oks.end(), true);
  for (int kind = 0; kind < 3; kind++) {  // Adam, AdamW, LAMB
    for (int64_t start : {0, 300, 5000}) {
      auto make = [&](std::vector<Tensor>& ps) -> std::unique_ptr<Optimizer> {
        if (kind == 0) return std::make_unique<Adam>(ptrs(ps), 0.01, 0.9, 0.999, 1e-8, 0.1);
        if (kind == 1) return std::make_unique<AdamW>(ptrs(ps), 0.01, 0.9, 0.999, 1e-8, 0.1);
        return std::make_unique<LAMB>(ptrs(ps), 0.01, 0.9, 0.999, 1e-6, 0.01);
      };
      Problem pr;
      auto ref_ps = pr.make(), gated_ps = pr.make();
      auto ref = make(ref_ps), gated = make(gated_ps);
      StateDict sd = ref->state_dict();
      sd["step"] = Tensor::from_vector(std::vector<int64_t>{start}, {});
      ref->load_state_dict(sd);
      gated->load_state_dict(sd);
      const std::string what = gated->type_name() + " from step " + std::to_string(start);
      int64_t reads = 0;
      for (bool ok : oks) {
        gated->zero_grad();
        pr.loss(gated_ps).backward();
        testutil::HostReads counter;
        gated->step_if(Tensor::from_vector(std::vector<float>{ok ? 1.0f : 0.0f}, {}) > 0.0);
        reads += counter.count();
        if (!ok) continue;
        ref->zero_grad();
        pr.loss(ref_ps).backward();
        ref->step();
      }
      EXPECT_EQ(reads, 0) << what << ": a gated step read the device";
      EXPECT_EQ(gated->step_count(), start + static_cast<int64_t>(oks.size())) << what;
      EXPECT_EQ(gated->state_dict().at("step").item<int64_t>(), start + taken) << what;
      double worst = 0;
      for (size_t i = 0; i < ref_ps.size(); i++) {
        auto a = gated_ps[i].to_vector<float>(), b = ref_ps[i].to_vector<float>();
        for (size_t j = 0; j < a.size(); j++) {
          EXPECT_NEAR(a[j], b[j], 1e-6 * std::max(std::abs(b[j]), 0.1f)) << what << ", parameter " << i << "[" << j << "]";
          worst = std::max(worst, std::abs(double(a[j]) - b[j]) / std::max(std::abs(double(b[j])), 0.1));
        }
      }
      std::printf("%s: after %lld skipped steps, parameters within %.3g relative of the taken steps' alone\n",
                  what.c_str(), static_cast<long long>(oks.size()) - static_cast<long long>(taken), worst);
      EXPECT_EQ(gated->settle(), static_cast<int64_t>(oks.size()) - taken) << what;
      EXPECT_EQ(gated->step_count(), ref->step_count()) << what;
      EXPECT_EQ(gated->settle(), 0) << what << ": settle() set the device's count back to zero";
      // settled, the corrections are the host's again: one more taken step moves both alike
      for (auto* o : {gated.get(), ref.get()}) o->zero_grad();
      pr.loss(gated_ps).backward();
      pr.loss(ref_ps).backward();
      gated->step_if(Tensor::from_vector(std::vector<float>{1.0f}, {}) > 0.0);
      ref->step();
      EXPECT_EQ(gated->settle(), 0) << what;
      EXPECT_EQ(gated->step_count(), ref->step_count()) << what;
      for (size_t i = 0; i < ref_ps.size(); i++) {
        auto a = gated_ps[i].to_vector<float>(), b = ref_ps[i].to_vector<float>();
        for (size_t j = 0; j < a.size(); j++) EXPECT_NEAR(a[j], b[j], 1e-6 * std::max(std::abs(b[j]), 0.1f)) << what;
      }
    }
  }
}
