// A tiny image dataset for the launcher's tests (runs, plots, timelines): n 2x2 "images" of 3
// classes in which the bright pixel is the label (pixel 3 is noise), so a small MLP learns it in
// a few steps. `seed` shifts the labels, so two seeds give a train and a test split.
#pragma once
#include <cstdint>

#include "tinygrad/nn/data.h"

namespace tg::testutil {

inline nn::Dataset synth_images(int64_t n, int seed) {
  nn::Dataset d;
  d.item_shape = {1, 2, 2};
  for (int64_t i = 0; i < n; i++) {
    int32_t label = static_cast<int32_t>((i * 7 + seed) % 3);
    for (int j = 0; j < 4; j++) d.host_images.push_back(static_cast<uint8_t>(j == label ? 220 : 20 + (i * 13 + j) % 30));
    d.host_labels.push_back(label);
  }
  return d;
}

}  // namespace tg::testutil
