// A bootstrap over a host process group (see bootstrap.h).
#include "distributed/bootstrap.h"

#include <cstring>
#include <vector>

#include "tinygrad/error.h"

namespace tg::dist {

namespace {

class GroupBootstrap : public Bootstrap {
 public:
  explicit GroupBootstrap(ProcessGroup& pg) : pg_(pg) {
    TG_CHECK(pg_.memory_device().empty(), "bootstrap: the ", pg_.backend(), " group runs on device memory; a ",
             "bootstrap needs a host group (mpi)");
  }
  int rank() const override { return pg_.rank(); }
  int size() const override { return pg_.size(); }
  void broadcast(void* bytes, size_t n, int root) override {
    std::vector<int64_t> words((n + 7) / 8, 0);
    if (pg_.rank() == root) std::memcpy(words.data(), bytes, n);
    pg_.broadcast(words.data(), words.size(), DType::Int64, root)->wait();
    std::memcpy(bytes, words.data(), n);
  }

 private:
  ProcessGroup& pg_;
};

}  // namespace

std::unique_ptr<Bootstrap> group_bootstrap(ProcessGroup& pg) { return std::make_unique<GroupBootstrap>(pg); }

}  // namespace tg::dist
