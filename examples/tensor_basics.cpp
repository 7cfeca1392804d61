// A first look at tinygrad++: lazy tensors, fusion into kernels, autograd.
// Run with DEBUG=1 to see the kernels, DEBUG=4 to see their generated source.
#include <cstdio>

#include "tinygrad/tensor.h"

int main() {
  using tg::Tensor;
  Tensor::manual_seed(0);
  Tensor w = Tensor::randn({3, 4}).requires_grad_();
  Tensor x = Tensor::rand({2, 3});
  Tensor loss = x.matmul(w).relu().sum();  // nothing has run yet
  loss.backward();
  std::printf("loss = %f\n", loss.item<float>());
  auto g = w.grad()->to_vector<float>();
  std::printf("dloss/dw[0,:] = %f %f %f %f\n", g[0], g[1], g[2], g[3]);
  return 0;
}
