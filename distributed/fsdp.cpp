// Fully sharded data parallelism (see fsdp.h).
#include "distributed/fsdp.h"

#include <cmath>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "distributed/collective_runner.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/error.h"
#include "tinygrad/lazy.h"

namespace tg::dist {

// Note [fsdp shards]: a parameter of global shape [d0, d1, ...] (a 0-d one is seen as [1]) is cut
// along dim 0 into world equal shards of rows = ceil(d0 / world) rows each: the parameter is
// padded with zero rows at the end to rows * world, and rank r holds rows [r * rows, (r + 1) *
// rows) of the padded tensor, shape [rows, d1, ...]. A bias of 10 over 4 ranks: ranks 0-2 hold 3
// rows each, rank 3 holds row 9 and two zero rows. The padding stays zero: its gradient is zero
// (the reduce-scatter pads the full gradient with zero rows), and SGD, Adam and AdamW leave a zero
// value with a zero gradient at zero, weight decay included; the gather drops it anyway. Each
// shard keeps its parameter's number of dimensions, so AdamW's decay of matrices only (chosen by
// ndim) and every element-wise rule treat a shard as the whole parameter's rows.
Shape FsdpParam::shard_shape() const {
  Shape s = shape.empty() ? Shape{1} : shape;
  s[0] = rows;
  return s;
}

namespace {

Shape rows_first(const Shape& s) { return s.empty() ? Shape{1} : s; }

// The module that owns a parameter: its dotted name without the last part.
std::string owner_of(const std::string& name) {
  auto dot = name.rfind('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

// t ([d0, ...]) with zero rows appended up to `rows` rows.
Tensor pad_rows(const Tensor& t, int64_t rows) {
  if (rows == t.shape(0)) return t;
  std::vector<std::pair<int64_t, int64_t>> pads(static_cast<size_t>(t.ndim()), {0, 0});
  pads[0] = {0, rows - t.shape(0)};
  return t.pad(pads);
}

// "<i>.<state>" -> i; -1 for other keys ("step").
int64_t state_param_index(const std::string& key) {
  auto dot = key.find('.');
  if (dot == std::string::npos || dot == 0) return -1;
  for (size_t i = 0; i < dot; i++)
    if (key[i] < '0' || key[i] > '9') return -1;
  return std::stoll(key.substr(0, dot));
}

}  // namespace

int64_t fsdp_shard_rows(const Shape& shape, int64_t world) { return (rows_first(shape)[0] + world - 1) / world; }

FsdpGathers fsdp_gathers(const std::string& name) {
  if (name == "kept") return FsdpGathers::KeptForBackward;
  if (name == "top") return FsdpGathers::AllAtTop;
  TG_CHECK(name == "resharded", "fsdp: gathers are resharded, kept or top, not '", name, "'");
  return FsdpGathers::Resharded;
}

Fsdp::Fsdp(ProcessGroup& pg, nn::Module& model, const OptimizerFactory& make_optimizer, FsdpOptions opt)
    : pg_(pg), opt_(opt) {
  TG_CHECK(opt_.grad_dtype == DType::Float32 || opt_.grad_dtype == DType::BFloat16, "fsdp: gradients travel in ",
           "float32 or bfloat16, not ", dtype_name(opt_.grad_dtype));
  for (auto& [name, p] : model.named_parameters()) add_parameter(name, p);
  TG_CHECK(!params_.empty(), "fsdp: the model has no parameters");
  for (auto& p : params_) shards_.push_back(std::make_unique<Tensor>(Tensor::zeros(p.shard_shape(), {.device = p.param->device()})));
  reload_parameters();
  optim_ = make_optimizer(shards());
  TG_CHECK(optim_->type_name() != "LAMB", "fsdp: LAMB needs per-parameter norms; use sgd, adam or adamw");
}

// A parameter joins the unit of the module before it when they have the same owner (a module's
// own parameters are listed together, before its children's).
void Fsdp::add_parameter(const std::string& name, Tensor* p) {
  TG_CHECK(p->dtype() == DType::Float32, "fsdp: parameter '", name, "' is ", p->describe(),
           " (the sharded parameters are float32)");
  const int64_t n = pg_.size();
  FsdpParam fp{name, p, p->shape(), 0, 0};
  fp.rows = fsdp_shard_rows(fp.shape, n);
  std::string owner = owner_of(name);
  if (units_.empty() || units_.back().module != owner) units_.push_back(FsdpUnit{owner, {}, 0});
  fp.offset = units_.back().shard_numel;
  units_.back().shard_numel += fp.numel();
  units_.back().params.push_back(params_.size());
  params_.push_back(std::move(fp));
}

std::vector<Tensor*> Fsdp::shards() {
  std::vector<Tensor*> out;
  for (auto& s : shards_) out.push_back(s.get());
  return out;
}

Tensor Fsdp::placeholder(const FsdpParam& p) const {
  return Tensor::zeros(p.shape, {.dtype = DType::Float32, .device = shards_[0]->device()});
}

Tensor Fsdp::slice_shard(const FsdpParam& p, const Tensor& full) const {
  const int64_t n = pg_.size(), r = pg_.rank();
  Tensor t = pad_rows(full.detach().reshape(rows_first(p.shape)), p.rows * n);
  std::vector<std::pair<int64_t, int64_t>> bounds;
  for (int64_t d = 0; d < t.ndim(); d++) bounds.push_back({0, t.shape(d)});
  bounds[0] = {p.rows * r, p.rows * (r + 1)};
  return t.shrink(bounds).contiguous();
}

void Fsdp::reload_parameters() {
  NoGradGuard no_grad;
  Tensors values;
  for (auto& p : params_) values.push_back(slice_shard(p, *p.param));
  Tensor::realize_all(values);
  for (size_t i = 0; i < params_.size(); i++) shards_[i]->assign(values[i]);  // the optimizer holds pointers to them
  release();
}

// Note [fsdp placeholders]: between steps a model parameter holds a lazy zero constant of its
// global shape (no memory), so the model keeps its shapes (state_dict keys, agreement checks)
// while only the shards are resident. unshard() replaces each by a leaf view of its unit's
// ALLGATHER for one step; materialize() by a realized full copy (every rank takes part in the
// gathers) for an evaluation on rank 0; release() puts the placeholders back. A model read
// between steps without materialize() sees zeros. The step's ALLGATHERs are intermediates of
// its schedule (Note [gathers layer by layer]); under FsdpGathers::AllAtTop they are outputs,
// and their buffers are dropped after the step, since every lazy node that reads them (the
// loss's graph, which a caller may keep) is realized already or reads them no more.
void Fsdp::release() {
  for (auto& p : params_) *p.param = placeholder(p);
}

// Note [a second gather of the same shards]: graph nodes are hash-consed, so a gather built
// again from the same shards would be the forward's node itself. The backward's gather reads
// each shard through one more DETACH (no kernel: existing_buffer looks through it), which makes
// its input, and so the gather, nodes of their own.
Tensor Fsdp::gathered(const std::vector<size_t>& params, bool again) {
  Tensors flat;
  for (size_t i : params) {
    Tensor shard = again ? shards_[i]->detach().detach() : shards_[i]->detach();
    flat.push_back(shard.reshape({params_[i].numel()}));
  }
  return all_gather_node(pg_, flat.size() == 1 ? flat[0] : Tensor::cat(flat, 0));
}

namespace {
// Parameter p's full value from a gather of [world * numel] (rank r's flat shard at r * numel,
// p's part of it at `offset`): its columns of the [world, numel] view, rows stacked, padding dropped.
Tensor full_view(const FsdpParam& p, const Tensor& gathered, int64_t world, int64_t numel, int64_t offset) {
  Shape rows = rows_first(p.shape);
  Tensor t = gathered.reshape({world, numel}).shrink({{0, world}, {offset, offset + p.numel()}});
  Shape stacked = rows;
  stacked[0] = p.rows * world;
  t = t.reshape(stacked);
  if (stacked[0] > rows[0]) {
    std::vector<std::pair<int64_t, int64_t>> bounds;
    for (int64_t d : rows) bounds.push_back({0, d});
    t = t.shrink(bounds);
  }
  return t.reshape(p.shape);
}
}  // namespace

void Fsdp::unshard() {
  NoGradGuard no_grad;
  gathered_.clear();
  for (auto& u : units_) {
    Tensor g = gathered(u.params);
    gathered_.push_back(g);
    for (size_t i : u.params) {
      Tensor leaf = full_view(params_[i], g, pg_.size(), u.shard_numel, params_[i].offset).detach();
      leaf.requires_grad_(true);
      *params_[i].param = leaf;
    }
  }
}

void Fsdp::materialize() {
  NoGradGuard no_grad;
  Tensors values;
  for (auto& u : units_) {
    Tensor g = gathered(u.params);
    for (size_t i : u.params)
      values.push_back(full_view(params_[i], g, pg_.size(), u.shard_numel, params_[i].offset).contiguous());
  }
  Tensor::realize_all(values);
  for (size_t i = 0; i < params_.size(); i++) *params_[i].param = values[i];
}

Tensor Fsdp::reduced_unit(const FsdpUnit& u, const std::vector<std::optional<Tensor>>& grads) {
  const int64_t n = pg_.size();
  Tensors cols;
  for (size_t i : u.params) {
    const FsdpParam& p = params_[i];
    const auto& g = grads[i];
    Tensor t = (g ? g->detach().cast(DType::Float32) : placeholder(p)).reshape(rows_first(p.shape));
    t = pad_rows(t, p.rows * n);
    cols.push_back(t.reshape({n, p.numel()}));
  }
  Tensor grad = (cols.size() == 1 ? cols[0] : Tensor::cat(cols, 1)).reshape({n * u.shard_numel});
  if (opt_.grad_dtype == DType::Float32) return reduce_scatter_node(pg_, grad) * (1.0 / static_cast<double>(n));
  // Note [bfloat16 gradients] in data_parallel.cpp
  return reduce_scatter_node(pg_, grad.cast(opt_.grad_dtype)).cast(DType::Float32) * (1.0 / static_cast<double>(n));
}

// Note [an fsdp step on the graph]: a training step is one schedule. Its outputs come in this
// order: the units' REDUCE_SCATTERs in reverse order (each scheduled right after the backward
// kernels that make its gradients, overlapping the rest of backward), the caller's tensors (the
// loss), the decision, and the shard updates. The units' ALLGATHERs are not outputs but
// intermediates, which the scheduler issues one unit ahead of their readers and frees after
// their last reader (Note [gathers layer by layer]). After the step the model holds
// placeholders again and no full parameter or gradient is left (Note [fsdp placeholders]); each
// shard keeps its averaged gradient (keep_gradients), as a data-parallel parameter keeps its full one.
// The decision is zero1's: an ALLREDUCE sum of [non-finite flag, this rank's shards' sum of
// squares] (padding rows add zero), ok when no rank was non-finite, the global norm the root of
// the sum; clipping scales the shard gradients by min(1, max_norm / (norm + 1e-6)) on the device.
LazyStepOutcome Fsdp::step_lazy(const Tensors& also_realize, const StepOptions& opt) {
  TG_CHECK(opt.max_norm >= 0, "fsdp: max_norm must be non-negative, got ", opt.max_norm);
  TG_CHECK(gathered_.size() == units_.size(), "fsdp: step without unshard() before the forward pass");
  NoGradGuard no_grad;
  const auto grads_in = backward_gradients(also_realize);
  Tensors reduced(units_.size());
  for (size_t k = units_.size(); k-- > 0;) reduced[k] = reduced_unit(units_[k], grads_in);
  Tensors values;
  if (opt_.gathers == FsdpGathers::AllAtTop) values = gathered_;  // outputs first: issued at the top, kept
  for (size_t k = units_.size(); k-- > 0;) values.push_back(reduced[k]);
  values.insert(values.end(), also_realize.begin(), also_realize.end());
  Tensors grads = shard_gradients(reduced);
  LazyStepOutcome out = decide(grads, opt, values);
  for (size_t i = 0; i < params_.size(); i++) shards_[i]->set_grad(grads[i]);
  if (out.ok) optim_->step_if(*out.ok, values);
  else optim_->step(values);
  for (auto& g : gathered_) g.uop()->realized.reset();  // Note [fsdp placeholders]: nothing full stays
  gathered_.clear();
  if (!jit_capturing()) keep_gradients(reduced);
  for (auto& p : params_) p.param->set_grad(std::nullopt);
  release();
  return out;
}

// Note [gathers layer by layer]: a unit's gathered parameters are needed from its first
// forward kernel on, so the step does not issue every unit's ALLGATHER at its top (which held
// every unit's full parameters through the whole forward pass): the gathers are intermediates of
// the step's schedule, and the scheduler issues each one unit ahead (Note [gathers one reader
// ahead] in tinygrad/schedule/schedule.cpp): unit k+1's gather runs on the communication thread
// while unit k's kernels run, unit k+1's first kernel waits for it, and a gathered buffer goes
// back to the pool after its last reader. Backward needs parameters again (a product's input
// gradient reads its weight; an activation's gradient reads its pre-activation, which reads the
// bias). FsdpGathers says what it reads:
//  - KeptForBackward: the forward's gathered buffers, which then live from their unit's forward
//    to its backward: at the turn from forward to backward every unit's are alive.
//  - Resharded (the default, FSDP's reshard_after_forward): every unit but the last is gathered
//    again (Note [a second gather of the same shards]) and the gradients read that gather, so a
//    forward gather dies after its unit's forward kernels and the backward gathers run one unit
//    ahead of backward as the forward's did. The gradients are rewritten: every node of their
//    graphs that reads a unit's parameter leaf reads the backward gather's view instead, except
//    the forward's kernel ends (reductions, contiguous and collective nodes, and the rest of
//    Note [where kernels end]'s list that the forward computes, found from `also_realize`), which
//    backward shares with the forward as before. Elementwise forward nodes between a leaf and a
//    kernel end (a bias added to a product, an activation of it) are computed again, inline, in
//    the backward kernels that read them. The backward gather holds only the unit's parameters
//    that the rewritten gradients read: of the first Linear, whose input needs no gradient, only
//    the bias (its activation's gradient recomputes the pre-activation); of the others, weight
//    and bias. A unit's weight gradient reads the activation below it, which it recomputes
//    from the unit below's backward gather, so backward holds about three units at a time (the
//    unit, the one below, the next one prefetched). The last unit's forward gather serves its
//    backward, which follows at once. The cost is one more ALLGATHER per unit but the last,
//    overlapped with backward; the gain, about two units' gathered parameters alive in the
//    forward pass instead of all (test_fsdp measures it, docs/PERFORMANCE.md has the figures).
//  - AllAtTop: the layout before: every gather an output, at the top, kept to the step's end.
namespace {

bool forward_kernel_end(const UOp& u) {
  return u.op == Op::REDUCE_AXIS || u.op == Op::CONTIGUOUS || u.op == Op::COPY || u.op == Op::CUSTOM_GRAD ||
         u.op == Op::SCATTER_ADD || u.op == Op::TEMPLATE_KERNEL || op_group(u.op) == OpGroup::Collective;
}

bool is_resident(const UOp& u) { return u.op == Op::BUFFER || u.realized; }

// `roots` with `subst` applied everywhere under them but under the nodes of `kept`.
std::vector<UOpPtr> substitute_outside(const std::vector<UOpPtr>& roots,
                                       const std::unordered_map<const UOp*, UOpPtr>& subst,
                                       const std::unordered_set<const UOp*>& kept) {
  auto descend = [&](const UOp& u) { return !is_resident(u) && !kept.count(&u) && !subst.count(&u); };
  std::unordered_map<const UOp*, UOpPtr> now;
  for (const UOpPtr& u : toposort(roots, descend)) {
    if (auto it = subst.find(u.get()); it != subst.end()) {
      now[u.get()] = it->second;
      continue;
    }
    if (!descend(*u)) continue;
    std::vector<UOpPtr> src;
    bool changed = false;
    for (const UOpPtr& s : u->src) {
      auto it = now.find(s.get());
      src.push_back(it == now.end() ? s : it->second);
      changed = changed || src.back() != s;
    }
    if (changed) now[u.get()] = make_uop(u->op, u->dtype, std::move(src), u->arg, u->shape, u->device);
  }
  std::vector<UOpPtr> out;
  for (const UOpPtr& r : roots) {
    auto it = now.find(r.get());
    out.push_back(it == now.end() ? r : it->second);
  }
  return out;
}

// The nodes of `leaves` that `roots` read outside the nodes of `kept`.
std::unordered_set<const UOp*> leaves_read(const std::vector<UOpPtr>& roots, const std::unordered_set<const UOp*>& leaves,
                                           const std::unordered_set<const UOp*>& kept) {
  auto descend = [&](const UOp& u) { return !is_resident(u) && !kept.count(&u) && !leaves.count(&u); };
  std::unordered_set<const UOp*> read;
  for (const UOpPtr& u : toposort(roots, descend))
    if (leaves.count(u.get())) read.insert(u.get());
  return read;
}

// The forward's kernel ends, found from the tensors it computes.
std::unordered_set<const UOp*> kernel_ends_under(const Tensors& forward) {
  std::vector<UOpPtr> roots;
  for (auto& t : forward) roots.push_back(t.uop());
  std::unordered_set<const UOp*> ends;
  for (auto& u : toposort(roots, [](const UOp& u) { return !is_resident(u); }))
    if (forward_kernel_end(*u)) ends.insert(u.get());
  return ends;
}

}  // namespace

// For each parameter leaf of `read` (of a unit but the last): its view of its unit's backward
// gather, which holds the unit's parameters of `read` only.
std::unordered_map<const UOp*, UOpPtr> Fsdp::backward_leaves(const std::unordered_set<const UOp*>& read) {
  std::unordered_map<const UOp*, UOpPtr> leaves;
  for (size_t k = 0; k + 1 < units_.size(); k++) {
    std::vector<size_t> needed;
    int64_t numel = 0;
    for (size_t i : units_[k].params)
      if (read.count(params_[i].param->uop().get())) {
        needed.push_back(i);
        numel += params_[i].numel();
      }
    if (needed.empty()) continue;
    Tensor again = gathered(needed, true);
    int64_t offset = 0;
    for (size_t i : needed) {
      leaves[params_[i].param->uop().get()] = full_view(params_[i], again, pg_.size(), numel, offset).detach().uop();
      offset += params_[i].numel();
    }
  }
  return leaves;
}

std::vector<std::optional<Tensor>> Fsdp::backward_gradients(const Tensors& forward) {
  std::vector<std::optional<Tensor>> grads;
  for (auto& p : params_) grads.push_back(p.param->grad());
  if (opt_.gathers != FsdpGathers::Resharded || units_.size() < 2) return grads;
  const std::unordered_set<const UOp*> kept = kernel_ends_under(forward);
  std::vector<UOpPtr> roots;
  for (auto& g : grads)
    if (g) roots.push_back(g->uop());
  std::unordered_set<const UOp*> forward_leaves;
  for (size_t k = 0; k + 1 < units_.size(); k++)
    for (size_t i : units_[k].params) forward_leaves.insert(params_[i].param->uop().get());
  auto subst = backward_leaves(leaves_read(roots, forward_leaves, kept));
  std::vector<UOpPtr> rewritten = substitute_outside(roots, subst, kept);
  for (size_t i = 0, j = 0; i < grads.size(); i++)
    if (grads[i]) grads[i] = Tensor(rewritten[j++]);
  return grads;
}

Tensors Fsdp::shard_gradients(const Tensors& reduced) const {
  Tensors grads(params_.size());
  for (size_t k = 0; k < units_.size(); k++)
    for (size_t i : units_[k].params) {
      const FsdpParam& p = params_[i];
      grads[i] = reduced[k].shrink({{p.offset, p.offset + p.numel()}}).reshape(p.shard_shape());
    }
  return grads;
}

// The decision of Note [an fsdp step on the graph]; clips `grads` in place and appends the 0-d
// outcome to `values`.
LazyStepOutcome Fsdp::decide(Tensors& grads, const StepOptions& opt, Tensors& values) {
  Tensor sq = grads[0].square().sum();
  for (size_t i = 1; i < grads.size(); i++) sq = sq + grads[i].square().sum();
  LazyStepOutcome out;
  if (opt.max_norm > 0 || opt.skip_nonfinite) {
    Tensor zero = sq.zeros_like(), one = sq.ones_like();
    Tensor finite = sq.isnan().logical_or(sq.isinf()).logical_not();
    Tensor stats = all_reduce_node(pg_, Tensor::stack({finite.where(zero, one), finite.where(sq, zero)}));
    Tensor ok = stats[0].eq(zero);
    Tensor norm = stats[1].sqrt();
    if (opt.max_norm > 0) {
      Tensor coef = (Tensor::scalar(opt.max_norm, {.device = norm.device()}) / (norm + 1e-6)).minimum(one);
      for (auto& g : grads) g = g * coef;
    }
    out.ok = ok;
    out.grad_norm = stats[0].ne(zero).where(one * INFINITY, norm);  // not from ok: Note [the skip count's kernel] in nn/optim.h
    values.push_back(*out.ok);
    values.push_back(*out.grad_norm);
  } else if (opt.report_norm) {
    out.grad_norm = all_reduce_node(pg_, sq).sqrt();
    values.push_back(*out.grad_norm);
  }
  return out;
}

// Each shard keeps its averaged gradient (before clipping) after the step, as a view of its unit's
// REDUCE_SCATTER buffer alone: a view of the lazy node would hold the step's whole graph, and
// with it the shards' previous buffers.
void Fsdp::keep_gradients(const Tensors& reduced) {
  for (size_t k = 0; k < units_.size(); k++) {
    auto buf = reduced[k].uop()->realized;
    if (!buf) continue;
    Tensor plain(lazy::buffer(buf, reduced[k].shape()));
    for (size_t i : units_[k].params) {
      const FsdpParam& p = params_[i];
      shards_[i]->set_grad(plain.shrink({{p.offset, p.offset + p.numel()}}).reshape(p.shard_shape()));
    }
  }
}

StepOutcome Fsdp::step(const Tensors& also_realize, const StepOptions& opt) {
  return settle_step(*optim_, step_lazy(also_realize, opt));
}

// Note [fsdp checkpoints]: every rank writes its part (the shards under "model.<name>", its
// optimizer's state under "optim.<key>", whose tensors have the shards' shapes), and the metadata
// file records the layout: fsdp_ranks (the world size) and fsdp_layout, one line per parameter in
// the model's order, "<name> <rows per shard> <global shape, comma-separated>". A reader of any
// world size or strategy rebuilds the full tensors by stacking the ranks' shards along dim 0 and
// dropping the padding rows (unshard_checkpoint), and takes its own layout from them: full
// tensors for ddp or one process, its own rows for fsdp of another world size.
nn::StateDict Fsdp::shard_state_dict() const {
  nn::StateDict sd;
  for (size_t i = 0; i < params_.size(); i++) sd.emplace("model." + params_[i].name, shards_[i]->detach());
  for (auto& [k, v] : optim_->state_dict()) sd.emplace("optim." + k, v);
  return sd;
}

nn::Metadata Fsdp::layout_metadata() const {
  std::string layout;
  for (auto& p : params_) layout += p.name + " " + std::to_string(p.rows) + " " + shape_csv(p.shape) + "\n";
  return {{"fsdp_ranks", std::to_string(pg_.size())}, {"fsdp_layout", layout}};
}

void Fsdp::load_full_optimizer_state(const nn::StateDict& optim_sd) {
  NoGradGuard no_grad;
  nn::StateDict mine;
  for (auto& [k, v] : optim_sd) {
    int64_t i = state_param_index(k);
    TG_CHECK(i < static_cast<int64_t>(params_.size()), "fsdp: optimizer state '", k, "' names parameter ", i, " of ",
             params_.size());
    if (i >= 0 && v.shape() == params_[static_cast<size_t>(i)].shape)
      mine.emplace(k, slice_shard(params_[static_cast<size_t>(i)], v));
    else mine.emplace(k, v);  // the step count (and anything misshapen, which load_state_dict names)
  }
  optim_->load_state_dict(mine);
}

std::pair<nn::StateDict, nn::StateDict> unshard_checkpoint(const std::vector<nn::StateDict>& ranks,
                                                            const nn::Metadata& layout) {
  TG_CHECK(layout.count("fsdp_layout") && !ranks.empty(), "fsdp checkpoint: no layout in the metadata file");
  struct Entry {
    std::string name;
    int64_t rows;
    Shape shape;
  };
  std::vector<Entry> entries;
  std::stringstream lines(layout.at("fsdp_layout"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::stringstream ls(line);
    Entry e;
    std::string shape;
    ls >> e.name >> e.rows >> shape;
    e.shape = parse_shape_csv(shape, "fsdp checkpoint: layout of '" + e.name + "'");
    entries.push_back(e);
  }
  auto assemble = [&](const Entry& e, const std::string& key) {
    Tensors parts;
    for (size_t r = 0; r < ranks.size(); r++) {
      auto it = ranks[r].find(key);
      TG_CHECK(it != ranks[r].end(), "fsdp checkpoint: rank ", r, "'s file has no '", key, "'");
      TG_CHECK(it->second.ndim() > 0 && it->second.shape(0) == e.rows, "fsdp checkpoint: rank ", r, "'s '", key, "' is ",
               it->second.describe(), "; the layout gives it ", e.rows, " rows");
      parts.push_back(it->second);
    }
    Tensor full = parts.size() == 1 ? parts[0] : Tensor::cat(parts, 0);
    Shape rows = rows_first(e.shape);
    std::vector<std::pair<int64_t, int64_t>> bounds;
    for (int64_t d : rows) bounds.push_back({0, d});
    return full.shrink(bounds).reshape(e.shape).contiguous();
  };
  nn::StateDict model, optim;
  for (auto& e : entries) model.emplace(e.name, assemble(e, "model." + e.name));
  for (auto& [k, v] : ranks[0]) {
    if (k.rfind("optim.", 0) != 0) continue;
    std::string key = k.substr(6);
    int64_t i = state_param_index(key);
    TG_CHECK(i < static_cast<int64_t>(entries.size()), "fsdp checkpoint: optimizer state '", key, "' names parameter ",
             i, " of ", entries.size());
    optim.emplace(key, i >= 0 ? assemble(entries[static_cast<size_t>(i)], k) : v);
  }
  return {model, optim};
}

}  // namespace tg::dist
