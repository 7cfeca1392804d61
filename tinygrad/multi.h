// Tensors over several devices of one process (tinygrad's shard): the lazy graph carries logical
// nodes whose device is a tuple of devices, and lower_multi rewrites them, at the start of
// realization, into ordinary per-device graphs with the copies and reductions between devices
// that the ops need (Note [multi-device tensors] in multi.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

// A device tuple is written as its devices joined by ',' ("CPU,CPU:1,CPU:2,CPU:3"): the device
// string of every logical node over it.
bool is_device_tuple(const std::string& device);
std::vector<std::string> split_devices(const std::string& device);  // a single device: {device}
// Every tuple string is made here; device_tuples_made() says whether one ever was (so a process
// that never uses several devices skips the rewrite's graph walk).
std::string join_devices(const std::vector<std::string>& devices);
bool device_tuples_made();

// How a logical node is split over its devices: along `axis` (-1: every device holds the whole),
// in `groups` (Note [grouped splits] in multi.cpp; 1: each device holds one contiguous slice).
struct SplitLayout {
  int64_t axis = -1;
  int64_t groups = 1;
  bool operator==(const SplitLayout&) const = default;
};

// The part of a logical node on each device of its tuple, and how it is split.
struct Lowered {
  std::vector<UOpPtr> parts;
  int64_t axis = -1;
  int64_t groups = 1;
  SplitLayout layout() const { return {axis, groups}; }
};

// Rewrites the graphs of `outputs` into per-device graphs: for each output, its parts (one part,
// the output itself or its rewrite, for an output on a single device).
std::vector<Lowered> lower_multi(const std::vector<UOpPtr>& outputs);
// The axis x is split along (-1: replicated, or on one device), without counting in multi_stats.
int64_t multi_axis(const UOpPtr& x);
// The same with its groups (Note [grouped splits] in multi.cpp).
SplitLayout multi_layout(const UOpPtr& x);
// True when some node under `outputs` is on a device tuple (lower_multi has work to do).
bool has_multi(const std::vector<UOpPtr>& outputs);

// `x` (on one device, or a tuple) split along `axis` over `devices` (-1: a whole copy on each),
// in `groups` (Note [grouped splits] in multi.cpp). Throws, naming the sizes, when the axis does
// not split evenly.
UOpPtr shard_uop(const UOpPtr& x, const std::vector<std::string>& devices, int64_t axis, int64_t groups = 1);
// A MULTI node of per-device parts split along axis (-1: replicated) in `groups`.
UOpPtr make_multi(const std::vector<UOpPtr>& parts, int64_t axis, int64_t groups = 1);

// The gradient rule of MULTI: each part's slice of g on its device (replicated: the first part
// takes g, since the parts are one value).
std::vector<UOpPtr> multi_gradient(const UOpPtr& u, const UOpPtr& g);

// What the rewrite inserted since the last reset: the collectives between the devices of a tuple
// (each all-reduce or all-gather counts once, however many devices take part) and the copies
// they are made of. Tests assert on these.
struct MultiStats {
  uint64_t allreduces = 0;
  uint64_t allgathers = 0;
  uint64_t copies = 0;
  uint64_t library = 0;  // the all-reduces and all-gathers run through the devices' library (one call each)
  uint64_t reduce_scatters = 0;  // library all-reduces whose devices keep only their block, made reduce-scatters
};
MultiStats& multi_stats();

}  // namespace tg
