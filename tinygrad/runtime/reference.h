// The float64 reference interpreter: evaluates a lazy UOp graph directly, node by node, with
// plain loops over multi-indices and no kernels. It is the oracle the backend tests compare
// every device against, so it is written to be obviously correct, not fast.
#pragma once
#include <vector>

#include "tinygrad/dtype.h"
#include "tinygrad/ops.h"

namespace tg {

// A dense, contiguous (row-major) array of values held as double, with the dtype they have.
// Integer and bool values are exact (int64 up to 2^53); half-type values are the ones the
// device would store.
struct RefArray {
  Shape shape;
  std::vector<double> data;
  DType dtype = DType::Float32;
};

struct RefOptions {
  // true: a node with UOp::realized set is read from its buffer (as the scheduler does).
  // false: only BUFFER nodes are read; everything else is recomputed from its sources, so a
  // comparison against the device stays meaningful after the device realized the graph.
  bool use_realized = true;
};

// Note [reference semantics]: ALU ops compute in float64. Results of integer dtypes wrap like
// C (int32 mod 2^32, uint8 mod 256); IDIV truncates and MOD takes the dividend's sign (C);
// AND/OR/XOR are bitwise on integers and logical on bool; CMPLT/CMPNE give 0/1; CAST to an
// integer truncates toward zero and wraps, CAST to bool is != 0, CAST to float16, bfloat16 and
// float32 rounds through the host conversions of dtype.h (what real hardware stores). MAX is
// `a > b ? a : b`, as the kernels compute it. REDUCE_AXIS keeps reduced dims as size 1.
// Movement ops move values; PAD fills zeros. DETACH, CONTIGUOUS and COPY pass values through.
RefArray reference_eval(const UOpPtr& root, const RefOptions& opt = {});

}  // namespace tg
