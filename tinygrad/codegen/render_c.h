// C-style source renderers. CStyleRenderer prints the kernel body (types, literals, loops,
// expressions) and leaves device specifics to hooks: kernel signature and buffer qualifiers,
// thread indices (special registers), local memory, barriers, half-type loads and stores.
// CRenderer writes C99 for CPU kernels compiled by the system compiler; the OpenCL renderer
// (render_opencl.h) and a CUDA renderer reuse the rest.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "tinygrad/codegen/renderer.h"

namespace tg {

class CStyleRenderer : public Renderer {
 public:
  std::string render(const LinearKernel& k) const override;

 protected:
  virtual std::string type_name(DType t) const;
  // CPU renderers: the first loop runs over the kernel arguments [lo, hi) (thread splitting).
  virtual bool split_first_loop() const { return false; }
  // A line before a loop of a constant number of trips (CUDA: Note [unrolled short loops]).
  virtual std::string loop_prefix(int64_t /*trips*/) const { return ""; }
  virtual std::string prelude(const LinearKernel& k) const = 0;
  virtual std::string signature(const LinearKernel& k) const = 0;
  // Declares parameter i: a line in the body, or "" when the signature names it.
  virtual std::string param_decl(const LinearKernel& k, size_t i) const = 0;
  virtual std::string math(Op op, DType t, const std::string& x) const;
  // MAX of two values of type t, as an expression.
  virtual std::string max_expr(DType t, const std::string& a, const std::string& b) const;
  virtual std::string literal(const UOp& c) const;
  // A float literal holding v rounded to float16, for devices that keep halves as storage only.
  static std::string half_as_float_literal(double v);
  // Value conversion (CAST) as an expression.
  virtual std::string cast(DType to, DType from, const std::string& x) const;
  // BITCAST: statements that declare `v` of type `to` holding the bits of x.
  virtual std::string bitcast(DType to, DType from, const std::string& x, const std::string& v) const;
  // Element access of a buffer of `t`.
  virtual std::string load(DType t, const std::string& buf, const std::string& idx) const;
  virtual std::string store(DType t, const std::string& buf, const std::string& idx, const std::string& val) const;
  // A statement that asks for the cache line of element idx + distance of buf (Note [prefetched
  // panels] in codegen/opt_block.cpp); empty where the device has no such hint (the GPUs).
  virtual std::string prefetch(const std::string& buf, const std::string& idx, int64_t distance) const;
  // A STORE with arg ADD (Note [accumulating stores] in schedule/lower.cpp): a plain `+=` here,
  // for kernels on one thread; GPU renderers add atomically.
  virtual std::string accumulate(DType t, const std::string& buf, const std::string& idx, const std::string& val) const;
  // GPU hooks: a thread index (SPECIAL arg), a work-group barrier, a local-memory array.
  virtual std::string special(int64_t arg) const;
  virtual std::string barrier() const;
  virtual std::string local_array(DType t, const std::string& name, int64_t size) const;
  // Local-memory slots that the combine of a group of `threads` uses.
  virtual int64_t group_slots(int64_t threads) const { return threads; }
  // The combine of a group reduction, after its loop: a tree through local memory (Note [group
  // combine]); a renderer with faster means (CUDA's warp shuffles) overrides it.
  virtual std::string group_combine(const GroupReduce& g, const std::string& acc, const std::string& lid, int id,
                                    const std::string& indent) const;
  // A warp's tensor-core product (the WMMA op): a statement that declares out0..out3 from the
  // ten operands (four A values, two B values, four accumulators). Only CUDA has one.
  virtual std::string mma(const std::string& out, const std::vector<std::string>& operands) const;
  // Vector accesses (Note [vector accesses] in codegen/vector_access.cpp): the widest in bytes
  // (0: none), the type of one of `bytes` (4, 8 or 16), and a buffer's element type as the
  // kernel declares it.
  virtual int64_t max_vector_bytes() const { return 0; }
  virtual std::string vector_type(int64_t /*bytes*/) const { return ""; }
  virtual std::string storage_type(DType t) const { return type_name(t); }

 private:
  // The lines of one wide access of `buf` at the elements first, first + 1, ...: loads into the
  // variables `names` of type t, or stores of `values`, with an element-by-element path for a
  // buffer whose address is not aligned to the access.
  std::vector<std::string> vector_load(DType buffer, DType t, const std::string& buf, int64_t bytes, const std::string& first,
                                       const std::vector<std::string>& names) const;
  std::string vector_store(DType buffer, const std::string& buf, int64_t bytes, const std::string& first,
                           const std::vector<std::string>& values) const;
  static std::string element(const std::string& first, size_t m);
  std::string vector_union(DType buffer, const std::string& vector, size_t n) const;
  static std::string aligned(const std::string& buf, int64_t bytes);
};

class CRenderer : public CStyleRenderer {
 public:
  // Keeps global_size only for kernels worth splitting across threads (launch_size).

 protected:
  bool split_first_loop() const override { return true; }
  std::string prelude(const LinearKernel& k) const override;
  std::string signature(const LinearKernel& k) const override;
  std::string param_decl(const LinearKernel& k, size_t i) const override;
  std::string prefetch(const std::string& buf, const std::string& idx, int64_t distance) const override;
};

// The reduce op of an accumulator's update, as C (x op y).
std::string c_binary(Op op, const std::string& a, const std::string& b);

}  // namespace tg
