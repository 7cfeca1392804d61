// The models and datasets that the launcher's test binaries train, registered under test_* names
// as a user's own would be (one TG_REGISTER_* line each). Include it in exactly one source file
// of a test binary: the registrations are global.
#pragma once
#include <memory>

#include "launcher/registry.h"
#include "tests/synth_images.h"
#include "tinygrad/nn/layers.h"

namespace tg::launcher::testmodels {

// A Linear from 4 inputs to 3 classes over flattened 2x2 images.
class TinyNet : public nn::Module {
 public:
  TinyNet() { register_module("fc", fc); }
  Tensor forward(const Tensor& x) override { return fc(x.flatten(1)); }
  nn::Linear fc{4, 3};
};

TG_REGISTER_MODEL("test_tiny", [](const Config&) { return std::make_unique<TinyNet>(); });
TG_REGISTER_MODEL("test_mlp", [](const Config&) { return make_mlp({16}, 4, 3); });
// An MLP whose hidden width is a config key of its own, registered with it.
TG_REGISTER_MODEL("test_wide", [](const Config& c) { return make_mlp({c.get_int("model.test_width")}, 4, 3); },
                  {{"model.test_width", ValueType::Int, int64_t{8}, "test_wide: the hidden layer's width", int_at_least(2)}});
TG_REGISTER_DATASET("test_empty", [](const Config&) { return DataSplits{}; });
TG_REGISTER_DATASET("test_synth", [](const Config&) {
  return image_splits(testutil::synth_images(48, 0), testutil::synth_images(24, 1), 0.3, 0.3, 3);
});

}  // namespace tg::launcher::testmodels
