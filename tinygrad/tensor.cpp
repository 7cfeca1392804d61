// Tensor core: state, creation, realization, host access, autograd entry points.
#include "tinygrad/tensor.h"

#include <cmath>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "tinygrad/device.h"
#include "tinygrad/engine/jit_in_place.h"
#include "tinygrad/engine/observe.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/engine/trace.h"
#include "tinygrad/gradient.h"
#include "tinygrad/multi.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/tensor_internal.h"

namespace tg {

struct Tensor::State {
  UOpPtr uop;
  bool requires_grad = false;
  std::optional<Tensor> grad;
};

namespace {

// Tensors that require grad, so backward() can find the leaves in a graph.
struct GradRegistry {
  std::mutex mu;
  std::vector<std::weak_ptr<Tensor::State>> states;
};
GradRegistry& grad_registry() {
  static GradRegistry r;
  return r;
}

thread_local bool no_grad_mode = false;

std::string resolve_device(const std::string& d) {
  if (d.empty()) return default_device();
  std::vector<std::string> devices;
  for (auto& one : split_devices(d)) devices.push_back(canonical_device(one));
  return join_devices(devices);
}

// A whole copy of make(device) on each device of a tuple (Note [multi-device tensors]).
template <class Make>
Tensor on_each_device(const std::string& tuple, bool requires_grad, Make make) {
  std::vector<UOpPtr> parts;
  for (auto& d : split_devices(tuple)) parts.push_back(make(d).uop());
  return Tensor(make_multi(parts, -1), requires_grad);
}

// Runs a schedule whose outputs go to `bufs` and whose kept nodes to `kept`, its outputs written
// over dying inputs where they may (Note [dying inputs in a normal run] in jit_in_place.cpp).
void run_realizing(std::vector<ScheduleItem> schedule, const std::vector<std::shared_ptr<Buffer>>& bufs,
                   const KeptBuffers& kept) {
  std::unordered_set<const Buffer*> outlive;
  for (auto& b : bufs) outlive.insert(b.get());
  for (auto& [u, b] : kept) outlive.insert(b.get());
  write_schedule_over_dying_inputs(schedule, outlive);
  run_schedule(std::move(schedule));
}

// Note [multi-device tensors] in multi.cpp: the logical outputs are rewritten into their parts,
// which are scheduled together; each output then keeps the MULTI of its parts' buffers.
void realize_multi(const std::vector<UOpPtr>& outs) {
  auto lowered = lower_multi(outs);
  std::vector<UOpPtr> flat;
  for (auto& l : lowered) flat.insert(flat.end(), l.parts.begin(), l.parts.end());
  std::vector<std::shared_ptr<Buffer>> bufs;
  KeptBuffers kept;
  run_realizing(create_schedule(flat, &bufs, &kept), bufs, kept);
  for (size_t i = 0; i < flat.size(); i++)
    if (!flat[i]->realized && flat[i]->op != Op::BUFFER) flat[i]->realized = bufs[i];
  for (auto& [u, b] : kept)
    if (!u->realized) u->realized = b;
  size_t next = 0;
  for (size_t i = 0; i < outs.size(); i++) {
    std::vector<UOpPtr> parts;
    for (auto& p : lowered[i].parts) {
      parts.push_back(p->op == Op::BUFFER ? p : lazy::buffer(bufs[next], p->shape));
      next++;
    }
    if (!is_device_tuple(outs[i]->device)) {  // the output read a tuple: its rewrite was computed
      if (!outs[i]->realized && outs[i]->op != Op::BUFFER) outs[i]->realized = parts[0]->arg_buffer();
      continue;
    }
    UOpPtr multi = make_multi(parts, lowered[i].axis, lowered[i].groups);
    if (multi != outs[i] && !outs[i]->realized_multi) outs[i]->realized_multi = multi;
  }
}

}  // namespace

NoGradGuard::NoGradGuard() : prev_(no_grad_mode) { no_grad_mode = true; }
NoGradGuard::~NoGradGuard() { no_grad_mode = prev_; }
bool NoGradGuard::enabled() { return no_grad_mode; }

Tensor::Tensor() : Tensor(lazy::constant(0.0, DType::Float32, default_device(), {})) {}

Tensor::Tensor(UOpPtr uop, bool requires_grad) : state_(std::make_shared<State>()) {
  state_->uop = std::move(uop);
  if (requires_grad) requires_grad_(true);
}

Tensor TensorAccess::result(UOpPtr u, std::initializer_list<const Tensor*> inputs) {
  bool track = false;
  for (auto* t : inputs) track |= t->requires_grad();
  if (track && no_grad_mode) return Tensor(lazy::detach(u));
  Tensor out(std::move(u));
  out.state_->requires_grad = track;
  return out;
}

// ---- errors helpers ----

int64_t norm_axis(const char* op, const Tensor& t, int64_t axis, int64_t ndim_extra) {
  int64_t n = t.ndim() + ndim_extra;
  TG_CHECK((axis >= -n && axis < n) || (n == 0 && (axis == 0 || axis == -1)), op, ": axis ", axis,
           " is out of range for ", t.describe(), " (valid: ", -n, "..", n - 1, ")");
  return axis < 0 ? axis + n : axis;
}

std::vector<int64_t> norm_axes(const char* op, const Tensor& t, const std::vector<int64_t>& axes) {
  std::vector<int64_t> out;
  if (axes.empty()) {
    for (int64_t i = 0; i < t.ndim(); i++) out.push_back(i);
    return out;
  }
  for (auto a : axes) out.push_back(norm_axis(op, t, a));
  return out;
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  TG_CHECK(a.device() == b.device(), op, ": tensors are on different devices (a: ", a.describe(), ", b: ",
           b.describe(), ")");
}

Shape broadcast_shape(const char* op, const Tensor& a, const Tensor& b) {
  const Shape &x = a.shape(), &y = b.shape();
  size_t n = std::max(x.size(), y.size());
  Shape out(n);
  for (size_t i = 0; i < n; i++) {
    int64_t dx = i < n - x.size() ? 1 : x[i - (n - x.size())];
    int64_t dy = i < n - y.size() ? 1 : y[i - (n - y.size())];
    TG_CHECK(dx == dy || dx == 1 || dy == 1, op, ": shapes ", shape_str(x), " and ", shape_str(y),
             " cannot broadcast (a: ", a.describe(), ", b: ", b.describe(), ")");
    out[i] = dx == 1 ? dy : dx;
  }
  return out;
}

std::pair<Tensor, Tensor> align(const char* op, const Tensor& a, const Tensor& b) {
  check_same_device(op, a, b);
  Shape s = broadcast_shape(op, a, b);
  DType t = promote(a.dtype(), b.dtype());
  return {a.cast(t).broadcast_to(s), b.cast(t).broadcast_to(s)};
}

// ---- creation ----

Tensor Tensor::from_data(const void* data, DType src_dtype, const Shape& shape, const TensorOptions& opt) {
  for (auto d : shape) TG_CHECK(d >= 0, "from_data: negative dimension in shape ", shape_str(shape));
  std::string dev = resolve_device(opt.device);
  if (is_device_tuple(dev))
    return on_each_device(dev, opt.requires_grad, [&](const std::string& d) {
      return from_data(data, src_dtype, shape, {.dtype = opt.dtype, .device = d});
    });
  int64_t n = tg::prod(shape);
  DType dt = opt.dtype.value_or(src_dtype);
  auto buf = std::make_shared<Buffer>(dev, dt, n);
  std::vector<uint8_t> host(buf->nbytes());
  if (src_dtype == dt) {
    if (n) std::memcpy(host.data(), data, host.size());
  } else {
    auto* src = static_cast<const uint8_t*>(data);
    for (int64_t i = 0; i < n; i++)
      store_as(dt, host.data() + i * itemsize(dt), load_as(src_dtype, src + i * itemsize(src_dtype)));
  }
  buf->copy_in(host.data(), host.size());
  return Tensor(lazy::buffer(buf, shape), opt.requires_grad);
}

namespace {
template <class T>
Tensor from_vec(const std::vector<T>& v, DType dt, const Shape& shape, const TensorOptions& opt) {
  TG_CHECK(static_cast<int64_t>(v.size()) == tg::prod(shape), "from_vector: ", v.size(), " values for shape ",
           shape_str(shape));
  return Tensor::from_data(v.data(), dt, shape, opt);
}
}  // namespace

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& s, const TensorOptions& o) { return from_vec(v, DType::Float32, s, o); }
Tensor Tensor::from_vector(const std::vector<double>& v, const Shape& s, const TensorOptions& o) { return from_vec(v, DType::Float64, s, o); }
Tensor Tensor::from_vector(const std::vector<int32_t>& v, const Shape& s, const TensorOptions& o) { return from_vec(v, DType::Int32, s, o); }
Tensor Tensor::from_vector(const std::vector<int64_t>& v, const Shape& s, const TensorOptions& o) { return from_vec(v, DType::Int64, s, o); }
Tensor Tensor::from_vector(const std::vector<uint8_t>& v, const Shape& s, const TensorOptions& o) { return from_vec(v, DType::UInt8, s, o); }

Tensor Tensor::scalar(double v, const TensorOptions& opt) { return full({}, v, opt); }

Tensor Tensor::empty(const Shape& shape, const TensorOptions& opt) {
  for (auto d : shape) TG_CHECK(d >= 0, "empty: negative dimension in shape ", shape_str(shape));
  if (std::string dev = resolve_device(opt.device); is_device_tuple(dev))
    return on_each_device(dev, opt.requires_grad,
                          [&](const std::string& d) { return empty(shape, {.dtype = opt.dtype, .device = d}); });
  auto buf = std::make_shared<Buffer>(resolve_device(opt.device), opt.dtype.value_or(DType::Float32), tg::prod(shape));
  buf->ensure_allocated();
  return Tensor(lazy::buffer(buf, shape), opt.requires_grad);
}

Tensor Tensor::full(const Shape& shape, double value, const TensorOptions& opt) {
  for (auto d : shape) TG_CHECK(d >= 0, "full: negative dimension in shape ", shape_str(shape));
  Tensor t(lazy::constant(value, opt.dtype.value_or(DType::Float32), resolve_device(opt.device), shape));
  if (opt.requires_grad) t = t.contiguous().realize().requires_grad_(true);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, const TensorOptions& opt) { return full(shape, 0, opt); }
Tensor Tensor::ones(const Shape& shape, const TensorOptions& opt) { return full(shape, 1, opt); }
Tensor Tensor::zeros_like() const { return full_like(0); }
Tensor Tensor::ones_like() const { return full_like(1); }
Tensor Tensor::full_like(double v) const { return Tensor(lazy::constant(v, dtype(), device(), shape())); }

Tensor Tensor::arange(double start, double stop, double step, const TensorOptions& opt) {
  TG_CHECK(step != 0, "arange: step must not be 0");
  auto n = static_cast<int64_t>(std::max(0.0, std::ceil((stop - start) / step)));
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; i++) v[i] = start + static_cast<double>(i) * step;
  return from_data(v.data(), DType::Float64, {n}, with_dtype(opt, DType::Float32));
}
Tensor Tensor::arange(int64_t stop, const TensorOptions& opt) { return arange(0, static_cast<double>(stop), 1, opt); }

Tensor Tensor::linspace(double start, double stop, int64_t steps, const TensorOptions& opt) {
  TG_CHECK(steps >= 0, "linspace: steps must be non-negative, got ", steps);
  std::vector<double> v(steps);
  for (int64_t i = 0; i < steps; i++)
    v[i] = steps == 1 ? start : start + (stop - start) * static_cast<double>(i) / static_cast<double>(steps - 1);
  return from_data(v.data(), DType::Float64, {steps}, with_dtype(opt, DType::Float32));
}

Tensor Tensor::eye(int64_t n, const TensorOptions& opt) {
  TG_CHECK(n >= 0, "eye: n must be non-negative, got ", n);
  std::vector<double> v(n * n, 0.0);
  for (int64_t i = 0; i < n; i++) v[i * n + i] = 1;
  return from_data(v.data(), DType::Float64, {n, n}, with_dtype(opt, DType::Float32));
}

// ---- properties ----

const Shape& Tensor::shape() const { return state_->uop->shape; }
int64_t Tensor::shape(int64_t axis) const { return shape()[norm_axis("shape", *this, axis)]; }
DType Tensor::dtype() const { return state_->uop->dtype; }
const std::string& Tensor::device() const { return state_->uop->device; }
const UOpPtr& Tensor::uop() const { return state_->uop; }
std::string Tensor::describe() const {
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " on " + device();
}

// ---- realization ----

Tensor& Tensor::realize() {
  realize_all({*this});
  return *this;
}

void Tensor::realize_all(const Tensors& ts) {
  std::vector<UOpPtr> outs;
  for (auto& t : ts) outs.push_back(t.uop());
  if (has_multi(outs)) return realize_multi(outs);
  std::vector<std::shared_ptr<Buffer>> bufs;
  KeptBuffers kept;
  std::vector<ScheduleItem> schedule;
  {
    trace::Span span("schedule", "schedule");
    schedule = create_schedule(outs, &bufs, &kept);
  }
  run_realizing(std::move(schedule), bufs, kept);
  for (size_t i = 0; i < outs.size(); i++)
    if (!outs[i]->realized && outs[i]->op != Op::BUFFER) outs[i]->realized = bufs[i];
  for (auto& [u, b] : kept)
    if (!u->realized) u->realized = b;
}

namespace {
std::shared_ptr<Buffer> realized_buffer(const Tensor& t) {
  Tensor c = t;
  c.realize();
  auto& u = c.uop();
  auto buf = u->op == Op::BUFFER ? u->arg_buffer() : u->realized;
  TG_ASSERT(buf, "realize left no buffer for ", u->str(1));
  return buf;
}
}  // namespace

std::shared_ptr<Buffer> TensorAccess::buffer(const Tensor& t) {
  auto& u = t.state_->uop;
  return u->op == Op::BUFFER ? u->arg_buffer() : u->realized;
}
void TensorAccess::set_buffer(const Tensor& t, std::shared_ptr<Buffer> buf) {
  t.state_->uop = lazy::buffer(std::move(buf), t.shape());
}
const void* TensorAccess::identity(const Tensor& t) { return t.state_.get(); }
bool TensorAccess::holds_buffer_alone(const Tensor& t, long others) {
  const UOpPtr& u = t.state_->uop;  // the state's reference is the node's only one: no graph or tensor shares it
  return u->op == Op::BUFFER && u.use_count() == 1 && u->arg_buffer().use_count() == 1 + others;
}

// The value of a realized tensor over several devices is a MULTI of its parts' buffers (Tensor::
// assign, realize_multi in tensor.cpp); a lazy one may point at that MULTI through realized_multi.
std::vector<std::shared_ptr<Buffer>> TensorAccess::buffers(const Tensor& t) {
  const UOpPtr& u = t.state_->uop->realized_multi ? t.state_->uop->realized_multi : t.state_->uop;
  if (u->op != Op::MULTI) {
    auto b = buffer(t);
    return b ? std::vector<std::shared_ptr<Buffer>>{b} : std::vector<std::shared_ptr<Buffer>>{};
  }
  std::vector<std::shared_ptr<Buffer>> out;
  for (auto& part : u->src) {
    auto b = part->op == Op::BUFFER ? part->arg_buffer() : part->realized;
    if (!b) return {};
    out.push_back(std::move(b));
  }
  return out;
}

void TensorAccess::set_buffers(const Tensor& t, const std::vector<std::shared_ptr<Buffer>>& bufs) {
  const UOpPtr& u = t.state_->uop->realized_multi ? t.state_->uop->realized_multi : t.state_->uop;
  if (u->op != Op::MULTI) {
    TG_ASSERT(bufs.size() == 1, "set_buffers: ", bufs.size(), " buffers for ", t.describe());
    return set_buffer(t, bufs[0]);
  }
  TG_ASSERT(bufs.size() == u->src.size(), "set_buffers: ", bufs.size(), " buffers for ", t.describe());
  std::vector<UOpPtr> parts;
  for (size_t i = 0; i < bufs.size(); i++) parts.push_back(lazy::buffer(bufs[i], u->src[i]->shape));
  const auto& split = u->arg_ints();
  t.state_->uop = make_multi(parts, split[0], split[1]);
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  if (is_device_tuple(device())) return Tensor(lazy::copy_to(uop(), devices()[0])).to_vector<T>();
  notify_host_read(*this);  // Note [tensor observers] in engine/observe.h
  auto buf = realized_buffer(*this);
  std::vector<uint8_t> bytes(buf->nbytes());
  if (!bytes.empty()) buf->copy_out(bytes.data(), bytes.size());
  std::vector<T> out(numel());
  for (int64_t i = 0; i < numel(); i++)
    out[i] = static_cast<T>(load_as(dtype(), bytes.data() + i * itemsize(dtype())));
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

template <class T>
T Tensor::item() const {
  TG_CHECK(numel() == 1, "item: tensor must have one element, got ", describe());
  return to_vector<T>()[0];
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;

Tensor Tensor::to(const std::string& device) const {
  std::string d = resolve_device(device);
  if (is_device_tuple(d)) return to(split_devices(d));
  get_device(d);  // fails early, naming the device, when it is not built
  return result(lazy::copy_to(uop(), d), {this});
}

Tensor Tensor::contiguous() const { return result(lazy::contiguous(uop()), {this}); }

Tensor& Tensor::assign(const Tensor& v) {
  TG_CHECK(v.shape() == shape() && v.dtype() == dtype() && v.device() == device(),
           "assign: value ", v.describe(), " does not match target ", describe());
  if (is_device_tuple(device())) {  // the MULTI of v's buffers
    Tensor value = v;
    value.realize();
    auto before = TensorAccess::buffers(*this);
    const UOpPtr& u = value.uop();
    state_->uop = u->realized_multi ? u->realized_multi : u;  // a MULTI of buffers is its own value
    notify_assign_parts(*this, before, TensorAccess::buffers(*this));  // Note [tensor observers]
    return *this;
  }
  auto buf = realized_buffer(v);
  notify_assign(*this, TensorAccess::buffer(*this), buf);  // Note [tensor observers]
  state_->uop = lazy::buffer(buf, shape());
  return *this;
}

Tensor& Tensor::shard_(const std::vector<std::string>& devices, std::optional<int64_t> axis, int64_t groups) {
  Tensor v = detach().shard(devices, axis, groups);
  v.realize();
  const UOpPtr& u = v.uop();
  state_->uop = u->realized_multi ? u->realized_multi : u->realized ? lazy::buffer(u->realized, u->shape) : u;
  return *this;
}

Tensor& Tensor::write_(const void* data, DType src_dtype) {
  if (is_device_tuple(device())) {
    for (auto& part : shards()) part.write_(data, src_dtype);
    return *this;
  }
  auto buf = TensorAccess::buffer(*this);
  TG_CHECK(buf, "write_: tensor ", describe(), " is not realized");
  std::vector<uint8_t> bytes(buf->nbytes());
  for (int64_t i = 0; i < numel(); i++)
    store_as(dtype(), bytes.data() + i * itemsize(dtype()),
             load_as(src_dtype, static_cast<const uint8_t*>(data) + i * itemsize(src_dtype)));
  if (!bytes.empty()) buf->copy_in(bytes.data(), bytes.size());
  return *this;
}

// ---- autograd ----

bool Tensor::requires_grad() const { return state_->requires_grad; }

Tensor& Tensor::requires_grad_(bool on) {
  if (on) TG_CHECK(is_float(dtype()), "requires_grad: only floating-point tensors can require gradients, got ", describe());
  if (on && !state_->requires_grad) {
    auto& r = grad_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.states.push_back(state_);
  }
  state_->requires_grad = on;
  return *this;
}

std::optional<Tensor> Tensor::grad() const { return state_->grad; }
void Tensor::set_grad(std::optional<Tensor> g) { state_->grad = std::move(g); }

Tensor Tensor::detach() const { return Tensor(lazy::detach(uop())); }

Tensors Tensor::gradients(const Tensors& wrt, std::optional<Tensor> gradient) const {
  if (!gradient) {
    TG_CHECK(numel() == 1, "backward: implicit gradient needs a scalar, got ", describe(), "; pass a gradient");
    gradient = full_like(1);
  }
  TG_CHECK(gradient->shape() == shape(), "backward: gradient ", gradient->describe(), " does not match ", describe());
  std::unordered_set<const UOp*> targets;
  for (auto& t : wrt) targets.insert(t.uop().get());
  auto grads = compute_gradients(uop(), gradient->cast(dtype()).uop(), targets);
  Tensors out;
  for (auto& t : wrt) {
    auto it = grads.find(t.uop().get());
    out.push_back(it == grads.end() ? t.zeros_like() : Tensor(it->second));
  }
  return out;
}

void Tensor::backward(std::optional<Tensor> gradient) const {
  std::vector<std::shared_ptr<State>> leaves;
  {
    auto& r = grad_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    std::unordered_set<const UOp*> in_graph;
    for (auto& n : toposort({uop()}, [](const UOp& u) { return u.op != Op::DETACH; })) in_graph.insert(n.get());
    std::vector<std::weak_ptr<State>> alive;
    for (auto& w : r.states) {
      auto s = w.lock();
      if (!s) continue;
      alive.push_back(w);
      if (s->requires_grad && in_graph.count(s->uop.get())) leaves.push_back(s);
    }
    r.states.swap(alive);
  }
  Tensors wrt;
  for (auto& s : leaves) wrt.push_back(Tensor(s->uop));
  Tensors grads = gradients(wrt, std::move(gradient));
  for (size_t i = 0; i < leaves.size(); i++) {
    auto& s = leaves[i];
    s->grad = s->grad ? Tensor(lazy::alu(Op::ADD, s->grad->uop(), grads[i].uop())) : grads[i];
  }
}

}  // namespace tg
