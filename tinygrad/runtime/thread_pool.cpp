// ThreadPool: workers sleep on a condition variable between launches; each launch bumps a
// generation counter that wakes them, and the last part to finish wakes the caller.
#include "tinygrad/runtime/thread_pool.h"

#include <algorithm>

#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); i++) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::cpu() {
  static ThreadPool* pool = [] {
    int n = knobs::THREADS.get();
    TG_CHECK(n >= 0, "THREADS=", n, ": must be 0 (one per core) or a thread count");
    if (n == 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return new ThreadPool(n);  // lives until exit: kernels may run from static destructors
  }();
  return *pool;
}

void ThreadPool::run(int parts, const std::function<void(int)>& part) {
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (!busy.owns_lock() || parts <= 1 || workers_.empty()) {
    for (int i = 0; i < parts; i++) part(i);
    return;
  }
  parts = std::min(parts, size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &part;
    parts_ = parts;
    pending_ = parts - 1;
    generation_++;
  }
  start_cv_.notify_all();
  part(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= parts_) continue;
      job = job_;
    }
    (*job)(index);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace tg
