// Observers of the tensor front end: the engine-level hook through which a layer above the
// tensor (engine/jit) learns of every Tensor::assign and every host read of device data, so
// that tensor.cpp reports these events without knowing who listens.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace tg {

class Buffer;
class Tensor;

// Note [tensor observers]: Tensor::assign and the host reads (Tensor::to_vector, item) call
// notify_assign (notify_assign_parts for a tensor over several devices) and notify_host_read; every registered observer is told, on the thread that
// assigned or read, one notification at a time (a mutex orders those of different threads).
// With no observer registered a notification is one atomic load. This is the counterpart of
// set_exec_recorder (engine/realize.h), which shows a thread the items run_schedule runs while
// it captures; observers differ in being process-wide and staying registered, because the JIT
// must see assigns outside its captures too: an assign on any thread, between calls, to a
// tensor whose buffer a capture reads as fixed makes that capture stale (Note [what a captured
// step is] in engine/jit.h). So engine/jit registers one observer when its first capture
// begins and keeps it; the observer files a capturing thread's assigns and host reads into that
// thread's recording, and checks every assign, on any thread, against the live captures. An
// observer must outlive its registration and must not assign tensors, read them on the host, or
// add or remove observers from inside a notification.
class TensorObserver {
 public:
  virtual ~TensorObserver() = default;
  // Tensor::assign: `target` held `before` (null when it was not realized) and now holds `after`.
  virtual void on_assign(const Tensor& target, const std::shared_ptr<Buffer>& before,
                         const std::shared_ptr<Buffer>& after) = 0;
  // Tensor::assign of a tensor over several devices: the buffers of its parts, one per device of
  // its tuple, before (empty when it was not realized) and after. By default each part is told
  // as an on_assign of its own.
  virtual void on_assign_parts(const Tensor& target, const std::vector<std::shared_ptr<Buffer>>& before,
                               const std::vector<std::shared_ptr<Buffer>>& after) {
    for (size_t i = 0; i < after.size(); i++) on_assign(target, i < before.size() ? before[i] : nullptr, after[i]);
  }
  // A host read of `t`'s device data (Tensor::to_vector, item), before the data is read.
  virtual void on_host_read(const Tensor& t) = 0;
};

namespace detail {
struct TensorObservers {
  std::mutex mu;
  std::vector<TensorObserver*> list;
  std::atomic<bool> any{false};
};
inline TensorObservers& tensor_observers() {
  static auto* o = new TensorObservers();  // never destroyed: notifications may come during exit
  return *o;
}
}  // namespace detail

inline void add_tensor_observer(TensorObserver* observer) {
  auto& o = detail::tensor_observers();
  std::lock_guard<std::mutex> lock(o.mu);
  o.list.push_back(observer);
  o.any.store(true, std::memory_order_release);
}

inline void remove_tensor_observer(TensorObserver* observer) {
  auto& o = detail::tensor_observers();
  std::lock_guard<std::mutex> lock(o.mu);
  std::erase(o.list, observer);
  o.any.store(!o.list.empty(), std::memory_order_release);
}

inline void notify_assign(const Tensor& target, const std::shared_ptr<Buffer>& before,
                          const std::shared_ptr<Buffer>& after) {
  auto& o = detail::tensor_observers();
  if (!o.any.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(o.mu);
  for (auto* x : o.list) x->on_assign(target, before, after);
}

inline void notify_assign_parts(const Tensor& target, const std::vector<std::shared_ptr<Buffer>>& before,
                                const std::vector<std::shared_ptr<Buffer>>& after) {
  auto& o = detail::tensor_observers();
  if (!o.any.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(o.mu);
  for (auto* x : o.list) x->on_assign_parts(target, before, after);
}

inline void notify_host_read(const Tensor& t) {
  auto& o = detail::tensor_observers();
  if (!o.any.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(o.mu);
  for (auto* x : o.list) x->on_host_read(t);
}

}  // namespace tg
