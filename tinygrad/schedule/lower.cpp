// Lowering one kernel's lazy subgraph into a kernel graph.
//
// Note [views are index arithmetic]: every lazy node is evaluated at an index vector (one
// integer expression per dimension of its shape) under a gate (a bool expression, or none).
// Movement ops transform the index vector on the way down and cost nothing at run time beyond
// that arithmetic: RESHAPE goes through the linear offset, PERMUTE reorders, EXPAND pins
// broadcast dims to 0, SHRINK adds the start, FLIP mirrors, and PAD shifts and adds a validity
// condition that gates every load below it and selects 0 outside. A fused REDUCE_AXIS opens a
// RANGE per reduced axis. Realized nodes become LOADs at their contiguous offsets.
//
// Note [lowering cache]: lowering (index arithmetic through every view, simplified by the
// symbolic rules) is most of an eager op's host time: about half of the 50 us a softmax over a
// small matrix costs on the CPU. Each call of the same op lowers the same kernel again, only its
// buffers differ (every training step outside the JIT, every evaluation batch). So lower_kernel
// keys a kernel by its structure: the lazy subgraph written out node by node, each input as a
// placeholder numbered by the first appearance of its buffer (two reads of one buffer are one
// parameter, as in the lowering). The cache keeps the kernel graph and which placeholder each
// parameter is; a hit only fills the parameters from this call's buffers. Keys hold no buffers,
// so the cache keeps no memory alive; it is emptied when it reaches LOWERING_CACHE_ENTRIES.
//
// Note [accumulating stores]: a SCATTER_ADD kernel (Note [gather and scatter-add] in lazy.cpp)
// runs over its values, not over its output: at each position it evaluates the value and the
// index, and its STORE (arg ADD, gated by the index's validity) adds the value into the output
// element at the index. Several positions can add into one element, so the scheduler zeroes the
// buffer in a kernel before it, and devices render the store as an atomic add where threads share
// a kernel's loops (GPU-style devices), as a plain load-add-store where the kernel runs on one
// thread (the CPU, whose host-threads pass keeps such a kernel on the calling thread: that is
// also deterministic, where atomic float adds are not).
#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/rewrite.h"
#include "tinygrad/schedule/schedule.h"

namespace tg {

namespace {

class Lowerer {
 public:
  Lowerer(const std::vector<UOpPtr>& roots, const std::function<std::shared_ptr<Buffer>(const UOp*)>& input_of,
          std::vector<std::shared_ptr<Buffer>>& inputs)
      : roots_(roots), root_(roots.front()), input_of_(input_of), inputs_(inputs) {}

  // Root i is stored into parameter i; the roots share the loops (Note [kernels with several
  // outputs] in schedule.cpp).
  UOpPtr run() {
    if (root_->op == Op::SCATTER_ADD) return run_scatter();
    std::vector<UOpPtr> idx;
    for (auto d : root_->shape) idx.push_back(d == 1 ? kint(0) : make_range(d));
    std::vector<UOpPtr> stores;
    for (size_t i = 0; i < roots_.size(); i++) {
      TG_ASSERT(roots_[i]->shape == root_->shape, "the outputs of one kernel differ in shape");
      UOpPtr value = emit(roots_[i], idx, nullptr);
      auto out = make_uop(Op::DEFINE_GLOBAL, roots_[i]->dtype, {}, Arg{static_cast<int64_t>(i)});
      stores.push_back(make_uop(Op::STORE, roots_[i]->dtype, {out, offset(idx, root_->shape), value}));
    }
    return stores.size() == 1 ? stores[0] : make_uop(Op::SINK, DType::Float32, stores);
  }

  // Note [accumulating stores]
  UOpPtr run_scatter() {
    const UOpPtr& values = root_->src[0];
    int64_t axis = root_->arg_ints()[0], size = root_->arg_ints()[1];
    std::vector<UOpPtr> idx;
    for (auto d : values->shape) idx.push_back(d == 1 ? kint(0) : make_range(d));
    UOpPtr value = emit(values, idx, nullptr);
    UOpPtr at = kcast(emit(root_->src[1], idx, nullptr), dtypes::index);
    std::vector<UOpPtr> out_idx = idx;
    out_idx[static_cast<size_t>(axis)] = at;
    auto out = make_uop(Op::DEFINE_GLOBAL, root_->dtype, {}, Arg{int64_t{0}});
    return make_uop(Op::STORE, root_->dtype, {out, offset(out_idx, root_->shape), value, within(at, size)}, Arg{Op::ADD});
  }

  // 0 <= at < size
  UOpPtr within(const UOpPtr& at, int64_t size) {
    return simplify(kalu(Op::AND, kalu(Op::CMPLT, kint(-1), at), kalu(Op::CMPLT, at, kint(size))));
  }

 private:
  const std::vector<UOpPtr>& roots_;
  const UOpPtr& root_;
  const std::function<std::shared_ptr<Buffer>(const UOp*)>& input_of_;
  std::vector<std::shared_ptr<Buffer>>& inputs_;
  std::map<const Buffer*, int64_t> param_of_;
  std::map<std::vector<const void*>, UOpPtr> memo_;
  RewriteMemo simplify_memo_;
  int64_t next_range_ = 0;

  UOpPtr simplify(const UOpPtr& x) { return graph_rewrite(x, symbolic(), simplify_memo_); }
  UOpPtr make_range(int64_t n) { return make_uop(Op::RANGE, dtypes::index, {kint(n)}, Arg{next_range_++}); }

  UOpPtr offset(const std::vector<UOpPtr>& idx, const Shape& shape) {
    UOpPtr off = kint(0);
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      off = kalu(Op::ADD, off, kalu(Op::MUL, idx[i], kint(stride)));
      stride *= shape[i];
    }
    return simplify(off);
  }

  UOpPtr param(const std::shared_ptr<Buffer>& buf, DType dtype) {
    auto it = param_of_.find(buf.get());
    int64_t i;
    if (it != param_of_.end()) {
      i = it->second;
    } else {
      i = static_cast<int64_t>(inputs_.size());
      inputs_.push_back(buf);
      param_of_[buf.get()] = i;
    }
    return make_uop(Op::DEFINE_GLOBAL, dtype, {}, Arg{i});
  }

  UOpPtr emit(const UOpPtr& node, const std::vector<UOpPtr>& idx, const UOpPtr& gate) {
    std::vector<const void*> key{node.get(), gate.get()};
    for (auto& i : idx) key.push_back(i.get());
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    UOpPtr r = emit_uncached(node, idx, gate);
    memo_[key] = r;
    return r;
  }

  UOpPtr emit_uncached(const UOpPtr& node, const std::vector<UOpPtr>& idx, const UOpPtr& gate) {
    if (std::find(roots_.begin(), roots_.end(), node) == roots_.end()) {
      if (auto buf = input_of_(node.get())) {
        std::vector<UOpPtr> src{param(buf, node->dtype), offset(idx, node->shape)};
        if (gate) {
          src[1] = simplify_under_gate(src[1], gate);  // Note [indices under a gate] in rewrite.cpp
          src.push_back(gate);
        }
        return simplify(make_uop(Op::LOAD, node->dtype, src));
      }
    }
    const Shape& in = node->src.empty() ? node->shape : node->src[0]->shape;
    switch (node->op) {
      case Op::CONST:
        return kconst(node->dtype, node->const_value());
      case Op::DETACH:
      case Op::CONTIGUOUS:
      case Op::CUSTOM_GRAD:
        return emit(node->src[0], idx, gate);
      case Op::CAST:
      case Op::BITCAST:
        return make_uop(node->op, node->dtype, {emit(node->src[0], idx, gate)});
      case Op::RESHAPE: {
        UOpPtr flat = offset(idx, node->shape);
        std::vector<UOpPtr> out(in.size());
        int64_t stride = 1;
        for (size_t i = in.size(); i-- > 0;) {
          out[i] = in[i] == 1 ? kint(0) : simplify(kalu(Op::MOD, kalu(Op::IDIV, flat, kint(stride)), kint(in[i])));
          stride *= in[i];
        }
        return emit(node->src[0], out, gate);
      }
      case Op::PERMUTE: {
        auto& order = node->arg_ints();
        std::vector<UOpPtr> out(idx.size());
        for (size_t i = 0; i < order.size(); i++) out[order[i]] = idx[i];
        return emit(node->src[0], out, gate);
      }
      case Op::EXPAND: {
        std::vector<UOpPtr> out = idx;
        for (size_t i = 0; i < in.size(); i++)
          if (in[i] == 1) out[i] = kint(0);
        return emit(node->src[0], out, gate);
      }
      case Op::SHRINK: {
        auto& b = node->arg_ints();
        std::vector<UOpPtr> out = idx;
        for (size_t i = 0; i < in.size(); i++) out[i] = simplify(kalu(Op::ADD, idx[i], kint(b[2 * i])));
        return emit(node->src[0], out, gate);
      }
      case Op::FLIP: {
        std::vector<UOpPtr> out = idx;
        for (auto a : node->arg_ints())
          out[a] = simplify(kalu(Op::ADD, kalu(Op::MUL, idx[a], kint(-1)), kint(in[a] - 1)));
        return emit(node->src[0], out, gate);
      }
      case Op::PAD: {
        auto& p = node->arg_ints();
        std::vector<UOpPtr> out = idx;
        UOpPtr valid;
        for (size_t i = 0; i < in.size(); i++) {
          if (p[2 * i] == 0 && p[2 * i + 1] == 0) continue;
          out[i] = simplify(kalu(Op::ADD, idx[i], kint(-p[2 * i])));
          UOpPtr lo = kalu(Op::CMPLT, kint(p[2 * i] - 1), idx[i]);
          UOpPtr hi = kalu(Op::CMPLT, idx[i], kint(p[2 * i] + in[i]));
          UOpPtr v = kalu(Op::AND, lo, hi);
          valid = valid ? kalu(Op::AND, valid, v) : v;
        }
        valid = simplify(valid);
        UOpPtr inner_gate = gate ? simplify(kalu(Op::AND, gate, valid)) : valid;
        UOpPtr v = emit(node->src[0], out, inner_gate);
        return simplify(kwhere(valid, v, kconst(node->dtype, 0)));
      }
      case Op::GATHER: {  // Note [gather and scatter-add] in lazy.cpp
        auto axis = static_cast<size_t>(node->arg_ints()[0]);
        UOpPtr at = kcast(emit(node->src[1], idx, gate), dtypes::index);
        UOpPtr valid = within(at, in[axis]);
        std::vector<UOpPtr> out = idx;
        out[axis] = at;
        UOpPtr v = emit(node->src[0], out, gate ? simplify(kalu(Op::AND, gate, valid)) : valid);
        return simplify(kwhere(valid, v, kconst(node->dtype, 0)));
      }
      case Op::REDUCE_AXIS: {
        auto& ra = node->arg_reduce();
        std::vector<UOpPtr> out = idx;
        std::vector<UOpPtr> src;
        for (auto a : ra.axes) out[a] = in[a] == 1 ? kint(0) : make_range(in[a]);
        src.push_back(emit(node->src[0], out, gate));
        for (auto a : ra.axes)
          if (in[a] != 1) src.push_back(out[a]);
        return make_uop(Op::REDUCE, node->dtype, src, Arg{ra.op});
      }
      case Op::COPY:
      case Op::ALLREDUCE:
      case Op::REDUCE_SCATTER:
      case Op::ALLGATHER:
      case Op::SCATTER_ADD:
      case Op::BUFFER:
        TG_ASSERT(false, op_name(node->op), " reached a kernel unrealized");
      default:
        break;
    }
    TG_ASSERT(is_alu(node->op), "cannot lower ", op_name(node->op));
    std::vector<UOpPtr> src;
    for (auto& s : node->src) src.push_back(emit(s, idx, gate));
    return simplify(make_uop(node->op, node->dtype, src));
  }
};

}  // namespace

namespace {

constexpr size_t LOWERING_CACHE_ENTRIES = 8192;

using InputOf = std::function<std::shared_ptr<Buffer>(const UOp*)>;

// A kernel's structure as bytes (Note [lowering cache]), and its inputs' buffers, distinct, in
// the order the key numbers them.
class KernelKey {
 public:
  KernelKey(const std::vector<UOpPtr>& roots, const InputOf& input_of, size_t first_param)
      : roots_(roots), input_of_(input_of) {
    put(first_param);
    put(roots.size());
    for (auto& r : roots) visit(r.get());
  }
  bool cacheable() const { return cacheable_; }
  const std::string& bytes() const { return bytes_; }
  const std::vector<std::shared_ptr<Buffer>>& buffers() const { return buffers_; }

 private:
  const std::vector<UOpPtr>& roots_;  // a kernel's outputs: one, or a few (several outputs)
  const InputOf& input_of_;
  std::string bytes_;
  std::vector<std::shared_ptr<Buffer>> buffers_;
  std::unordered_map<const UOp*, uint32_t> id_;
  std::vector<uint32_t> src_ids_;  // a stack of the sources' numbers of the nodes being written
  bool cacheable_ = true;

  template <class T>
  void put(const T& v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void put_ints(const std::vector<int64_t>& v) {
    put(v.size());
    for (auto x : v) put(x);
  }

  void put_arg(const Arg& a) {
    put(a.index());
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double> || std::is_same_v<T, Op>)
            put(v);
          else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
            put_ints(v);
          else if constexpr (std::is_same_v<T, ReduceArg>) {
            put(v.op);
            put_ints(v.axes);
          } else if constexpr (std::is_same_v<T, std::shared_ptr<Buffer>>)
            cacheable_ = false;
        },
        a);
  }

  uint32_t placeholder(const std::shared_ptr<Buffer>& buf) {
    for (size_t i = 0; i < buffers_.size(); i++)
      if (buffers_[i] == buf) return static_cast<uint32_t>(i);
    buffers_.push_back(buf);
    return static_cast<uint32_t>(buffers_.size() - 1);
  }

  // Writes the nodes under n (children first) and returns n's number. Mirrors Lowerer::emit: a
  // root is never an input, and a CUSTOM_GRAD is its value (src[0]) alone.
  uint32_t visit(const UOp* n) {
    if (auto it = id_.find(n); it != id_.end()) return it->second;
    bool root = std::any_of(roots_.begin(), roots_.end(), [n](const UOpPtr& r) { return r.get() == n; });
    std::shared_ptr<Buffer> buf = root ? nullptr : input_of_(n);
    const size_t first_src = src_ids_.size();  // n's sources' numbers go on src_ids_ above this
    if (!buf) {
      size_t count = n->op == Op::CUSTOM_GRAD ? 1 : n->src.size();
      for (size_t i = 0; i < count; i++) {
        uint32_t id = visit(n->src[i].get());
        src_ids_.push_back(id);
      }
    }
    put(buf ? 'I' : 'N');
    if (buf)
      put(placeholder(buf));
    else
      put(n->op);
    put(n->dtype);
    put_ints(n->shape);
    if (!buf) {
      put_arg(n->arg);
      put(src_ids_.size() - first_src);
      for (size_t i = first_src; i < src_ids_.size(); i++) put(src_ids_[i]);
    }
    src_ids_.resize(first_src);
    uint32_t id = static_cast<uint32_t>(id_.size());
    id_[n] = id;
    return id;
  }
};

struct LoweredKernel {
  UOpPtr ast;
  std::vector<uint32_t> params;  // the key's buffer for each parameter after the first ones
};

struct LoweringCache {
  std::mutex mu;
  std::unordered_map<std::string, LoweredKernel> kernels;
  LoweringCacheStats stats;
};
LoweringCache& lowering_cache() {
  static LoweringCache* c = new LoweringCache();
  return *c;
}

}  // namespace

LoweringCacheStats lowering_cache_stats() {
  auto& c = lowering_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

UOpPtr lower_kernel(const UOpPtr& root, const InputOf& input_of, std::vector<std::shared_ptr<Buffer>>& inputs) {
  return lower_kernel(std::vector<UOpPtr>{root}, input_of, inputs);
}

// Note [lowering cache]
UOpPtr lower_kernel(const std::vector<UOpPtr>& roots, const InputOf& input_of,
                    std::vector<std::shared_ptr<Buffer>>& inputs) {
  KernelKey key(roots, input_of, inputs.size());
  if (!key.cacheable()) return Lowerer(roots, input_of, inputs).run();
  auto& cache = lowering_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (auto it = cache.kernels.find(key.bytes()); it != cache.kernels.end()) {
      for (auto p : it->second.params) inputs.push_back(key.buffers()[p]);
      cache.stats.hits++;
      return it->second.ast;
    }
  }
  size_t first = inputs.size();
  LoweredKernel lowered{Lowerer(roots, input_of, inputs).run(), {}};
  for (size_t i = first; i < inputs.size(); i++) {
    auto& bufs = key.buffers();
    auto at = std::find(bufs.begin(), bufs.end(), inputs[i]);
    TG_ASSERT(at != bufs.end(), "lowering read a buffer its key does not name");
    lowered.params.push_back(static_cast<uint32_t>(at - bufs.begin()));
  }
  std::lock_guard<std::mutex> lock(cache.mu);
  cache.stats.misses++;
  if (cache.kernels.size() >= LOWERING_CACHE_ENTRIES) cache.kernels.clear();
  cache.kernels.emplace(key.bytes(), lowered);
  return lowered.ast;
}

}  // namespace tg
