// ALLREDUCE nodes and the engine that runs them (see collective_runner.h).
#include "distributed/collective_runner.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>

#include "tinygrad/device.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg::dist {

Tensor all_reduce_node(const Tensor& x, ReduceOp op) {
  TG_CHECK(op != ReduceOp::Avg, "all_reduce_node: use Sum and scale (the division then fuses into the next kernel)");
  check_collective_dtype("all_reduce_node", x.dtype());
  UOpPtr u = make_uop(Op::ALLREDUCE, x.dtype(), {x.uop()}, Arg{op == ReduceOp::Max ? Op::MAX : Op::ADD}, x.shape(),
                      x.device());
  return Tensor(u);
}

CollectiveEngine::CollectiveEngine(ProcessGroup& pg, bool async) : pg_(pg), async_(async) {
  if (async_) thread_ = std::thread([this] { loop(); });
  set_collective_runner([this](const ScheduleItem& item) { return run(item); });
}

CollectiveEngine::~CollectiveEngine() {
  set_collective_runner(nullptr);
  if (async_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

void CollectiveEngine::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

std::function<void()> CollectiveEngine::run(const ScheduleItem& item) {
  TG_CHECK(item.ast && item.ast->op == Op::ALLREDUCE, "collective runner: unsupported collective ",
           item.ast ? op_name(item.ast->op) : "(none)");
  auto out = item.buffers[0], in = item.buffers[1];
  TG_CHECK(out->device().rfind("CPU", 0) == 0, "collective runner: ", pg_.backend(),
           " all-reduces host memory; the buffer is on ", out->device());
  ReduceOp op = std::get<Op>(item.ast->arg) == Op::MAX ? ReduceOp::Max : ReduceOp::Sum;
  void* dst = out->ensure_allocated();  // allocations stay on the scheduling thread
  const void* src = in->ensure_allocated();
  uint64_t id = count_++;
  size_t n = static_cast<size_t>(out->numel());
  if (knobs::DEBUG >= 1)
    std::fprintf(stderr, "*** comm   %4llu all_reduce %s of %zu %s (%.2f MB)%s\n", static_cast<unsigned long long>(id),
                 reduce_op_name(op), n, dtype_name(out->dtype()), out->nbytes() / 1e6, async_ ? " started" : "");
  auto task = [this, out, in, dst, src, n, op, id] {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, out->nbytes());
    pg_.all_reduce(dst, n, out->dtype(), op)->wait();
    if (knobs::DEBUG >= 1 && async_)
      std::fprintf(stderr, "*** comm   %4llu all_reduce done in %.3f ms\n", static_cast<unsigned long long>(id),
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  };
  if (!async_) {
    task();
    return nullptr;
  }
  auto job = std::make_shared<std::packaged_task<void()>>(task);
  std::shared_future<void> done = job->get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back([job] { (*job)(); });
  }
  cv_.notify_one();
  return [done] { done.get(); };
}

}  // namespace tg::dist
