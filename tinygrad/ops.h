// The primitive op set and UOp, the one node type of every graph in tinygrad++: the lazy tensor
// graph (ops with shapes and devices) and the kernel graph (index arithmetic, loads, stores).
// UOps are immutable and hash-consed: building the same node twice returns the same object.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tinygrad/dtype.h"

namespace tg {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
// The element count of a shape; throws tg::Error naming the shape when its non-zero dimensions
// multiply past INT64_MAX (Note [shape products] in ops.cpp).
int64_t prod(const Shape& s);
// The shape without its size-1 dims.
Shape without_ones(const Shape& s);

enum class Op : uint8_t {
  // buffer: BUFFER is realized memory, CONST a scalar, COPY moves between devices
  BUFFER, CONST, COPY,
  // unary
  NEG, EXP2, LOG2, SIN, SQRT, RECIP, TRUNC, CAST, BITCAST,
  // binary
  ADD, MUL, IDIV, MOD, MAX, CMPLT, CMPNE, AND, OR, XOR, SHL, SHR,
  // ternary
  WHERE,
  // reduce (lazy graph: REDUCE_AXIS keeps reduced dims as size 1)
  REDUCE_AXIS,
  // movement: views, lowered to index arithmetic
  RESHAPE, PERMUTE, EXPAND, PAD, SHRINK, FLIP,
  // graph markers; CUSTOM_GRAD: src[0] is the value, src[1..] the inputs that its gradient rule
  // (arg: {rule id, rule parameters...}, see gradient.h) differentiates. MULTI: a tensor over a
  // tuple of devices, src[i] the part on device i, arg the sharded axis or -1 (replicated)
  // (Note [multi-device tensors] in multi.cpp)
  CONTIGUOUS, DETACH, CUSTOM_GRAD, MULTI,
  // collectives (run by distributed/ through an interface the core declares; arg: CollectiveArg)
  ALLREDUCE, REDUCE_SCATTER, ALLGATHER,
  // indexed (Note [gather and scatter-add] in lazy.cpp; arg: {axis} and {axis, size}): GATHER
  // src {x, index} reads x along the axis at the positions index holds; SCATTER_ADD src
  // {values, index} adds values into a zero tensor of that size along the axis at those positions
  GATHER, SCATTER_ADD,
  // kernel graph (STORE src {buffer, index, value[, gate]}; with arg ADD it adds value into the
  // element instead: Note [accumulating stores] in schedule/lower.cpp)
  DEFINE_GLOBAL, RANGE, ENDRANGE, SPECIAL, LOAD, STORE, REDUCE, DEFINE_ACC, ASSIGN,
  // a kernel with several stores (after upcasting) is rooted at a SINK of them
  SINK,
  // one result (arg: 0..3) of a warp's tensor-core product (Note [tensor-core contractions] in
  // codegen/tensor_core.cpp): src is the thread's four A values, two B values and four accumulators
  WMMA,
  // a kernel written from a template rather than generated from a graph (Note [template
  // kernels] in codegen/attention_kernel.cpp). Lazy graph: src are the tensors it reads (each a
  // buffer of its own), arg {TemplateKernel id, parameters...}, shape its one output's. The
  // schedule item's graph is the same op without sources or shape: the template and its parameters
  TEMPLATE_KERNEL,
};
const char* op_name(Op op);

enum class OpGroup { Buffer, Unary, Binary, Ternary, Reduce, Movement, Marker, Collective, Indexed, Kernel };
OpGroup op_group(Op op);
bool is_alu(Op op);          // unary, binary or ternary compute op
bool is_comparison(Op op);   // CMPLT, CMPNE: result dtype is bool

class Buffer;

struct ReduceArg {
  Op op;                      // ADD, MAX or MUL
  std::vector<int64_t> axes;  // sorted, unique
  bool operator==(const ReduceArg& o) const { return op == o.op && axes == o.axes; }
};

// Note [collective args]: a collective node names the group that runs it, so that several groups
// (the ranks of a job, the devices of one process) can each have their own runner; the core
// resolves the id through its registry (engine/realize.h). The reduction is ADD or MAX (ALLGATHER:
// ADD, unused). `ranks` is the group's size, which fixes the shapes: REDUCE_SCATTER takes
// [ranks * n] to this rank's block [n], ALLGATHER [n] to [ranks * n], ALLREDUCE keeps the shape.
// Stored in the UOp as the int vector {reduce, group, ranks}.
struct CollectiveArg {
  Op reduce = Op::ADD;
  int64_t group = 0;
  int64_t ranks = 1;
};

// Constants keep their exact value: double for floats, int64 for integers and bool.
using Arg = std::variant<std::monostate, int64_t, double, std::vector<int64_t>, ReduceArg, Op,
                         std::shared_ptr<Buffer>>;

struct UOp;
using UOpPtr = std::shared_ptr<const UOp>;

struct UOp {
  Op op;
  DType dtype;
  std::vector<UOpPtr> src;
  Arg arg;
  Shape shape;         // lazy graph only (kernel-graph nodes are scalars: shape is empty)
  std::string device;  // lazy graph only
  size_t hash = 0;

  // The buffer this lazy node was computed into, once realized. Buffers are never written twice,
  // so a cached result stays valid for as long as the node lives.
  mutable std::shared_ptr<Buffer> realized;
  // The same for a node on a tuple of devices: the MULTI of the buffers it was computed into.
  mutable std::shared_ptr<const UOp> realized_multi;

  ~UOp();
  // Accessors for typed args; TG_ASSERT on the wrong kind.
  int64_t arg_int() const;
  double arg_float() const;
  const std::vector<int64_t>& arg_ints() const;
  const ReduceArg& arg_reduce() const;
  const std::shared_ptr<Buffer>& arg_buffer() const;
  CollectiveArg arg_collective() const;  // ALLREDUCE, REDUCE_SCATTER, ALLGATHER (Note [collective args])
  double const_value() const;  // CONST as double, whatever its dtype
  std::string str(int depth = 2) const;

  // Integer bounds of a kernel-graph index expression (cached).
  int64_t vmin() const;
  int64_t vmax() const;

 private:
  mutable bool bounds_known_ = false;
  mutable int64_t vmin_ = 0, vmax_ = 0;
  void compute_bounds() const;
};

// The sources a node's value is computed from: a CUSTOM_GRAD's value is its first source, the
// others are there for its gradient rule only.
inline size_t value_src_count(const UOp& u) { return u.op == Op::CUSTOM_GRAD ? 1 : u.src.size(); }

// The one constructor: returns the existing node when an equal one is alive.
UOpPtr make_uop(Op op, DType dtype, std::vector<UOpPtr> src = {}, Arg arg = {}, Shape shape = {},
                std::string device = {});
size_t live_uop_count();

// A collective node of x (Note [collective args]); checks x's shape against the op.
UOpPtr make_collective(Op op, const UOpPtr& x, const CollectiveArg& arg);
// Device k's result of a collective between the devices of one process (Note [collectives
// through a device library] in multi.cpp): its sources are every device's operand, in tuple
// order (arg.ranks of them, of one shape and dtype, each on its own device), and it lies on
// parts[k]'s device. Shapes as for make_collective.
UOpPtr make_device_collective(Op op, const std::vector<UOpPtr>& parts, const CollectiveArg& arg, size_t k);

// Kernel-graph constructors.
UOpPtr kconst(DType dtype, double v);
UOpPtr kint(int64_t v);  // index constant
UOpPtr kalu(Op op, const UOpPtr& a, const UOpPtr& b);
UOpPtr kalu(Op op, const UOpPtr& a);
UOpPtr kwhere(const UOpPtr& c, const UOpPtr& a, const UOpPtr& b);
UOpPtr kcast(const UOpPtr& x, DType dtype);
bool is_const(const UOpPtr& u, double v);
bool is_const(const UOpPtr& u);
// A STORE that adds its value into the element (Note [accumulating stores] in schedule/lower.cpp).
bool is_accumulating_store(const UOp& u);

// Walk a graph from its roots, sources first.
std::vector<UOpPtr> toposort(const std::vector<UOpPtr>& roots,
                             const std::function<bool(const UOp&)>& descend = nullptr);

}  // namespace tg
