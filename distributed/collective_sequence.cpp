// Comparing collective sequences across ranks (see collective_sequence.h).
#include "distributed/collective_sequence.h"

#include <algorithm>
#include <sstream>

#include "distributed/host_exchange.h"
#include "tinygrad/device.h"
#include "tinygrad/error.h"

namespace tg::dist {

namespace {

// The summary each rank sends when hashes differ: count, then SUMMARY_ITEMS descriptors.
constexpr size_t SUMMARY_ITEMS = 8;
constexpr size_t SUMMARY_WORDS = 1 + 4 * SUMMARY_ITEMS;

std::vector<int64_t> summary_of(const std::vector<CollectiveDesc>& seq) {
  std::vector<int64_t> s(SUMMARY_WORDS, -1);
  s[0] = static_cast<int64_t>(seq.size());
  for (size_t i = 0; i < std::min(seq.size(), SUMMARY_ITEMS); i++) {
    s[1 + 4 * i] = seq[i].op;
    s[2 + 4 * i] = seq[i].reduce;
    s[3 + 4 * i] = seq[i].dtype;
    s[4 + 4 * i] = seq[i].count;
  }
  return s;
}

std::string entry_text(const int64_t* summary, size_t i) {
  if (static_cast<int64_t>(i) >= summary[0]) return "no collective";
  if (i >= SUMMARY_ITEMS) return "(beyond the first " + std::to_string(SUMMARY_ITEMS) + ")";
  const int64_t* e = summary + 1 + 4 * i;
  return describe(CollectiveDesc{e[0], e[1], e[2], e[3]});
}

std::string mismatch_message(const std::vector<int64_t>& all, int ranks, int me) {
  auto of = [&](int r) { return all.data() + static_cast<size_t>(r) * SUMMARY_WORDS; };
  size_t first = 0;
  for (; first < SUMMARY_ITEMS; first++) {
    bool same = true;
    for (int r = 1; r < ranks; r++) same = same && entry_text(of(r), first) == entry_text(of(0), first);
    if (!same) break;
  }
  std::ostringstream os;
  os << "distributed: the ranks run different collectives (they would deadlock); this is rank " << me << ". ";
  if (first < SUMMARY_ITEMS) {
    os << "Collective #" << first << " of the schedule is:";
    for (int r = 0; r < ranks; r++) os << (r ? ";" : "") << " rank " << r << ": " << entry_text(of(r), first);
  } else {
    os << "The schedules hold";
    for (int r = 0; r < ranks; r++) os << (r ? "," : "") << " rank " << r << ": " << of(r)[0] << " collectives";
  }
  os << " (model, config and data shapes must be the same on every rank)";
  return os.str();
}

std::vector<int64_t> all_gather_words(ProcessGroup& pg, const std::vector<int64_t>& mine) {
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(pg.size()));
  all_gather_host(pg, mine.data(), all.data(), mine.size(), DType::Int64);
  return all;
}

}  // namespace

std::string describe(const CollectiveDesc& d) {
  Op op = static_cast<Op>(d.op);
  std::string name = op == Op::ALLREDUCE ? "all_reduce" : op == Op::REDUCE_SCATTER ? "reduce_scatter" : "all_gather";
  if (op != Op::ALLGATHER) name += static_cast<Op>(d.reduce) == Op::MAX ? " max" : " sum";
  return name + " of " + dtype_name(static_cast<DType>(d.dtype)) + "[" + std::to_string(d.count) + "]";
}

CollectiveDesc describe_item(const ScheduleItem& item) {
  const UOp& u = *item.ast;
  return CollectiveDesc{static_cast<int64_t>(u.op), static_cast<int64_t>(u.arg_collective().reduce),
                        static_cast<int64_t>(u.dtype), prod(u.src[0]->shape)};
}

uint64_t sequence_hash(const std::vector<CollectiveDesc>& seq) {
  std::ostringstream os;
  for (auto& d : seq) os << d.op << "/" << d.reduce << "/" << d.dtype << "/" << d.count << ";";
  return stable_hash(os.str());
}

void agree_on_sequence(ProcessGroup& pg, const std::vector<CollectiveDesc>& seq, uint64_t hash) {
  const int64_t mine = static_cast<int64_t>(hash);
  std::vector<int64_t> hashes = all_gather_words(pg, {mine});
  if (std::all_of(hashes.begin(), hashes.end(), [&](int64_t h) { return h == mine; })) return;
  throw Error(mismatch_message(all_gather_words(pg, summary_of(seq)), pg.size(), pg.rank()));
}

}  // namespace tg::dist
