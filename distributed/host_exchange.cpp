// Host-value collectives for host and device groups (see host_exchange.h).
//
// Note [staged host exchanges]: on a device group the values are copied into a device buffer on
// the compute stream, the collective runs on the communication stream after an event recorded
// behind that copy, the compute stream waits on the collective's event, the host waits for the
// collective (with the group's deadline) and copies the result out. Slow next to a kernel, and
// used only where a host value must cross (never inside a step).
#include "distributed/host_exchange.h"

#include <functional>
#include <optional>

#include "tinygrad/device.h"

namespace tg::dist {

namespace {

// Runs `collective(in, out)` on device buffers holding `in_count` and `out_count` elements; with
// in_place (out_count == in_count), on one buffer that holds the input and receives the result.
void staged(ProcessGroup& pg, const void* in, size_t in_count, void* out, size_t out_count, DType dtype,
            const std::function<std::shared_ptr<Work>(const void*, void*)>& collective, bool in_place = false) {
  const std::string& device = pg.memory_device();
  Device& dev = get_device(device);
  Buffer src(device, dtype, static_cast<int64_t>(in_count));
  std::optional<Buffer> separate;
  if (!in_place) separate.emplace(device, dtype, static_cast<int64_t>(out_count));
  Buffer& dst = in_place ? src : *separate;
  src.copy_in(in, in_count * itemsize(dtype));
  void* d = dst.ensure_allocated();
  if (auto ready = dev.record_event(StreamKind::Compute)) dev.wait_event(StreamKind::Comm, *ready);
  auto work = collective(src.ptr(), d);
  if (auto done = dev.record_event(StreamKind::Comm)) dev.wait_event(StreamKind::Compute, *done);
  work->wait();
  dst.copy_out(out, out_count * itemsize(dtype));
}

}  // namespace

void all_reduce_host(ProcessGroup& pg, void* data, size_t count, DType dtype, ReduceOp op) {
  if (pg.memory_device().empty()) return pg.all_reduce(data, count, dtype, op)->wait();
  staged(pg, data, count, data, count, dtype,
         [&](const void* in, void* out) { return pg.all_reduce_into(in, out, count, dtype, op); });
}

void broadcast_host(ProcessGroup& pg, void* data, size_t count, DType dtype, int root) {
  if (pg.memory_device().empty()) return pg.broadcast(data, count, dtype, root)->wait();
  // in place: the root's buffer holds its values, the others' are overwritten
  staged(pg, data, count, data, count, dtype,
         [&](const void*, void* buf) { return pg.broadcast(buf, count, dtype, root); }, /*in_place=*/true);
}

void all_gather_host(ProcessGroup& pg, const void* in, void* out, size_t count, DType dtype) {
  if (pg.memory_device().empty()) return pg.all_gather(in, out, count, dtype)->wait();
  const size_t total = count * static_cast<size_t>(pg.size());
  staged(pg, in, count, out, total, dtype,
         [&](const void* src, void* dst) { return pg.all_gather(src, dst, count, dtype); });
}

std::string broadcast_string(ProcessGroup& pg, const std::string& s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  broadcast_host(pg, &n, 1, DType::Int64, root);
  std::vector<int32_t> chars(s.begin(), s.end());
  chars.resize(static_cast<size_t>(n));
  broadcast_host(pg, chars.data(), chars.size(), DType::Int32, root);
  return std::string(chars.begin(), chars.end());
}

std::vector<std::string> all_strings(ProcessGroup& pg, const std::string& mine) {
  std::vector<std::string> out;
  for (int r = 0; r < pg.size(); r++) out.push_back(broadcast_string(pg, mine, r));
  return out;
}

}  // namespace tg::dist
