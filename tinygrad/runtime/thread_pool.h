// The persistent thread pool that CPU kernels run on: a launch splits a kernel's first loop into
// one part per thread; the calling thread runs part 0 and waits for the rest.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tg {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads in all, the caller included
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The pool CPU kernels use: THREADS threads (0: one per core).
  static ThreadPool& cpu();
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs part(i) for i in [0, parts), parts <= size(), and returns when all are done. A call made
  // while the pool is busy (from another thread) runs every part on the calling thread.
  void run(int parts, const std::function<void(int)>& part);

 private:
  void worker(int index);

  std::vector<std::thread> workers_;
  std::mutex busy_;  // one run at a time
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace tg
