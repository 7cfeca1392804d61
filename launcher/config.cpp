// The config schema, YAML loading, typed overrides, validation and the resolved-config writer.
#include "launcher/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "launcher/registry.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/data.h"
#include "tinygrad/nn/tokens.h"

namespace fs = std::filesystem;

namespace tg::launcher {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::Int: return "int";
    case ValueType::Float: return "float";
    case ValueType::Bool: return "bool";
    case ValueType::String: return "string";
    case ValueType::IntList: return "list of ints";
  }
  return "?";
}

namespace {

// The built-in keys, then the registered ones (Note [registered config keys]).
std::vector<ConfigField>& schema_storage() {
  using V = std::vector<int64_t>;
  static std::vector<ConfigField> schema = {
      {"model.name", ValueType::String, std::string("mlp"), "registered model: mlp, cnn, or one of yours"},
      {"model.hidden", ValueType::IntList, V{256}, "mlp: hidden layer widths"},
      {"model.tensor_parallel", ValueType::Int, int64_t{1},
       "split the model's layers over this many devices of the default device's backend (:0..:N-1; with ddp, each "
       "rank's own N, as train.devices), Megatron's layout (mlp: Linear pairs; gpt: attention by heads and the MLP); "
       "1: one device",
       int_at_least(1)},
      {"data.name", ValueType::String, std::string("fashion_mnist"), "registered dataset"},
      {"data.root", ValueType::String, std::string(nn::FASHION_MNIST_ROOT), "dataset directory (fashion_mnist's files; tokens: llm.c's shards)"},
      {"data.batch_size", ValueType::Int, int64_t{128}, "training batch size"},
      {"data.eval_batch_size", ValueType::Int, int64_t{1000}, "evaluation batch size"},
      {"data.shuffle", ValueType::Bool, true, "shuffle the training set every epoch"},
      {"data.seed", ValueType::Int, int64_t{0}, "shuffle seed (epoch e uses seed + e)"},
      {"optim.name", ValueType::String, std::string("adam"), "sgd | adam | adamw | lamb"},
      {"optim.lr", ValueType::Float, 1e-3, "peak learning rate"},
      {"optim.momentum", ValueType::Float, 0.0, "sgd: momentum"},
      {"optim.weight_decay", ValueType::Float, 0.0, "L2 (sgd, adam) or decoupled (adamw: matrices only, lamb) weight decay"},
      {"optim.nesterov", ValueType::Bool, false, "sgd: Nesterov momentum"},
      {"optim.b1", ValueType::Float, 0.9, "adam, adamw, lamb: first-moment decay"},
      {"optim.b2", ValueType::Float, 0.999, "adam, adamw, lamb: second-moment decay"},
      {"optim.eps", ValueType::Float, 1e-8, "adam, adamw, lamb: epsilon"},
      {"optim.clip_grad_norm", ValueType::Float, 0.0, "clip the global gradient norm to this (0: off)"},
      {"schedule.name", ValueType::String, std::string("constant"), "constant | step | cosine"},
      {"schedule.warmup_steps", ValueType::Int, int64_t{0}, "linear warm-up steps before the schedule"},
      {"schedule.step_size", ValueType::Int, int64_t{1000}, "step: decay every this many steps"},
      {"schedule.gamma", ValueType::Float, 0.1, "step: decay factor"},
      {"schedule.min_lr", ValueType::Float, 0.0, "cosine: final learning rate"},
      {"train.epochs", ValueType::Int, int64_t{1}, "epochs to train (when train.steps is 0)"},
      {"train.steps", ValueType::Int, int64_t{0}, "total optimizer steps (0: train.epochs full epochs)"},
      {"train.eval_every", ValueType::Int, int64_t{0}, "evaluate every this many steps (0: each epoch end)"},
      {"train.eval_batches", ValueType::Int, int64_t{0}, "batches of the test or validation split an evaluation reads (0: all)"},
      {"train.grad_accum", ValueType::Int, int64_t{1},
       "micro-batches per step: each rank's batch is split in this many, their gradients summed before the update"},
      {"train.peak_tflops", ValueType::Float, 0.0,
       "the device's peak TFLOP/s at the run's precision, for model FLOPs utilisation in the metrics (0: not reported)"},
      {"train.checkpoint_every", ValueType::Int, int64_t{0}, "checkpoint every this many steps (0: at the end only)"},
      {"train.keep_checkpoints", ValueType::Int, int64_t{0}, "keep only the newest N complete checkpoints (0: keep all)"},
      {"train.log_every", ValueType::Int, int64_t{10}, "metrics record every this many steps"},
      {"train.print_every", ValueType::Int, int64_t{100}, "plain progress line every this many steps (not a terminal)"},
      {"train.progress", ValueType::String, std::string("auto"),
       "auto (a bar on a terminal, plain lines otherwise and under mpirun or another launcher) | bar | plain | off"},
      {"train.tensorboard", ValueType::Bool, false, "also write the metrics as TensorBoard event files into RUN_DIR/tensorboard/"},
      {"train.csv", ValueType::Bool, false, "also write the metrics as a table, RUN_DIR/metrics.csv"},
      {"train.trace", ValueType::Bool, false,
       "write each rank's timeline (kernels, collectives, data, compiles, JIT replays) as RUN_DIR/trace.rank<R>.json "
       "(also TRACE=1); tg trace merge RUN_DIR joins them"},
      {"train.seed", ValueType::Int, int64_t{0}, "model initialisation seed"},
      {"train.devices", ValueType::String, std::string(""),
       "data parallel over the devices of this process (with ddp: of each rank): a count (4: the default device's backend, :0..:3; on GPUs under ranks CUDA:<local rank * 4 + i>) or a list (CPU:0,CPU:1); empty: one device"},
      {"train.device", ValueType::String, std::string(""), "device for the run, e.g. CPU, CL, CUDA:1 (empty: the DEVICE knob)"},
      {"train.precision", ValueType::String, std::string("fp32"), "fp32 | bf16 (matmuls and convolutions in bfloat16, float32 master weights)"},
      {"train.run_dir", ValueType::String, std::string(""), "run directory (empty: runs/<config>-<timestamp>)"},
      {"train.resume", ValueType::Bool, false, "continue from the latest checkpoint in train.run_dir"},
      {"train.init_weights", ValueType::String, std::string(""), "safetensors file to load model weights from"},
      {"train.overwrite", ValueType::Bool, false, "replace an existing run directory"},
      {"distributed.strategy", ValueType::String, std::string("none"), "none | ddp (data parallel over the ranks of mpirun, tg launch or srun) | zero1 (ddp with sharded optimizer state) | fsdp (parameters, gradients and optimizer state sharded)"},
      {"distributed.backend", ValueType::String, std::string("auto"), "auto (nccl when train.device is CUDA, else mpi under mpirun and gloo otherwise) | mpi | nccl | gloo: the process group's backend"},
      {"distributed.grad_dtype", ValueType::String, std::string("fp32"), "fp32 | bf16: the dtype gradients are all-reduced in (averaged and applied in float32)"},
      {"distributed.fsdp_gathers", ValueType::String, std::string("resharded"), "fsdp: resharded (each unit gathered one unit ahead, again for backward) | kept (gathered once, kept for backward) | top (every gather at the top of the step)"},
      {"distributed.bucket_mb", ValueType::Float, 25.0, "ddp: gradient bucket size in MB (one all-reduce per bucket)"},
      {"distributed.timeout_s", ValueType::Float, 300.0, "ddp: a collective not done in this many seconds ends the run"},
      {"distributed.rdzv_port", ValueType::Int, int64_t{0},
       "srun: the port of the rendezvous store that rank 0 serves (0: TG_RDZV_PORT, else MASTER_PORT, else 29500)"},
      {"distributed.skip_nonfinite", ValueType::Bool, true, "ddp: skip a step (on every rank) when a gradient is inf/NaN"},
  };
  return schema;
}

const std::set<std::string>& builtin_keys() {
  static const std::set<std::string> keys = [] {  // taken before anything is registered
    std::set<std::string> k;
    for (const auto& f : schema_storage()) k.insert(f.key);
    return k;
  }();
  return keys;
}

std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

}  // namespace

ConfigCheck int_at_least(int64_t min) {
  return [min](const Value& v) {
    int64_t i = std::get<int64_t>(v);
    return i >= min ? std::string() : "must be >= " + std::to_string(min) + ", got " + std::to_string(i);
  };
}

ConfigCheck float_in_open_interval(double lo, double hi) {
  return [lo, hi](const Value& v) {
    double d = std::get<double>(v);
    if (d > lo && d < hi) return std::string();
    std::ostringstream os;
    os << "must be in (" << lo << ", " << hi << "), got " << d;
    return os.str();
  };
}

// Note [registered config keys]: the schema is closed to typos (an unknown key is an error with
// a suggestion) but open to extension: a model or dataset registers its own keys with type,
// default, help and an optional check, and from then on they are parsed, typed, validated,
// listed by `tg keys`, written to config.yaml and compared across ranks like built-in keys. A
// registered key is inserted after the last key of its section, so to_yaml's sections stay
// whole. Keys are registered while registries are built (static initialisation or first use),
// before any config is read: the insertion moves the schema's entries, so pointers from
// find_field must not be held across a registration. The built-in registries register theirs
// when first used, and config_schema() uses them first, so their keys are always there.
void register_config_keys(const std::string& owner, const std::vector<ConfigField>& fields) {
  const auto& builtins = builtin_keys();
  auto& schema = schema_storage();
  for (const auto& f : fields) {
    TG_CHECK(f.key.find('.') != std::string::npos && f.key.front() != '.' && f.key.back() != '.', "register ",
             owner, ": config key '", f.key, "' has no section (keys are section.name, e.g. data.seq_len)");
    TG_CHECK(f.default_value.index() == static_cast<size_t>(f.type), "register ", owner, ": the default of ",
             f.key, " is not of type ", value_type_name(f.type));
    auto same =
        std::find_if(schema.begin(), schema.end(), [&](const ConfigField& g) { return g.key == f.key; });
    if (same != schema.end()) {
      TG_CHECK(!builtins.count(f.key), "register ", owner, ": config key '", f.key, "' is built in");
      TG_CHECK(same->type == f.type && same->default_value == f.default_value, "register ", owner,
               ": config key '", f.key, "' is already registered with another type or default");
      continue;  // shared with an earlier registration
    }
    auto last_of_section = std::find_if(schema.rbegin(), schema.rend(), [&](const ConfigField& g) {
      return section_of(g.key) == section_of(f.key);
    });
    schema.insert(last_of_section == schema.rend() ? schema.end() : last_of_section.base(), f);
  }
}

const std::vector<ConfigField>& config_schema() {
  builtin_keys();
  dataset_registry();  // registers the built-in datasets' keys
  model_registry();
  return schema_storage();
}

const ConfigField* find_field(const std::string& key) {
  for (const auto& f : config_schema())
    if (f.key == key) return &f;
  return nullptr;
}

// Levenshtein distance with adjacent transpositions counted as one edit (optimal string
// alignment): "mpl" is one edit from "mlp", as a typist would count it.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) prev[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

// The key part after the section ("lr" of "optim.lr").
std::string leaf(const std::string& key) {
  auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string suggestion(const std::string& key) {
  std::string near = nearest_key(key);
  return near.empty() ? "" : " (did you mean '" + near + "'?)";
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool parse_int(const std::string& s, int64_t& out) {
  std::string t = trim(s);
  if (!t.empty() && t[0] == '+') t = t.substr(1);
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  return !t.empty() && ec == std::errc() && p == t.data() + t.size();
}

bool parse_float(const std::string& s, double& out) {
  std::string t = trim(s);
  if (t.empty()) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() && std::isfinite(out);
}

bool parse_bool(const std::string& s, bool& out) {
  std::string t = trim(s);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "true" || t == "yes" || t == "on" || t == "1") return out = true, true;
  if (t == "false" || t == "no" || t == "off" || t == "0") return out = false, true;
  return false;
}

// Note [config strings are UTF-8]: YAML text is Unicode, and yaml-cpp's emitter writes a byte
// that is not part of valid UTF-8 as U+FFFD, so a string value with such bytes (a Latin-1 path,
// say) would come back changed from the resolved config.yaml that a run directory keeps. Such a
// value is refused, naming the key and the offset of the first bad byte, in files and overrides.
// The check is nn::first_invalid_utf8 (tinygrad/nn/tokens.h).

std::string shown(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "nothing";
}

// Converts a YAML node to the field's type; throws naming the key, the type and the value.
Value convert(const ConfigField& f, const YAML::Node& n, const std::string& origin) {
  auto bad = [&]() {
    return Error(origin + ": " + f.key + " must be " + (f.type == ValueType::Int ? "an " : "a ") +
                 value_type_name(f.type) + ", got " + shown(n));
  };
  if (f.type == ValueType::IntList) {
    std::vector<int64_t> out;
    if (n.IsSequence()) {
      for (const auto& item : n) {
        int64_t v = 0;
        if (!item.IsScalar() || !parse_int(item.Scalar(), v)) throw bad();
        out.push_back(v);
      }
      return out;
    }
    int64_t v = 0;  // a single int is a list of one
    if (n.IsScalar() && parse_int(n.Scalar(), v)) return std::vector<int64_t>{v};
    throw bad();
  }
  if (f.type == ValueType::String && n.IsNull()) return std::string();
  if (!n.IsScalar()) throw bad();
  const std::string& s = n.Scalar();
  switch (f.type) {
    case ValueType::Int: {
      int64_t v = 0;
      if (!parse_int(s, v)) throw bad();
      return v;
    }
    case ValueType::Float: {
      double v = 0;
      if (!parse_float(s, v)) throw bad();
      return v;
    }
    case ValueType::Bool: {
      bool v = false;
      if (!parse_bool(s, v)) throw bad();
      return v;
    }
    default: {
      // Note [config strings are UTF-8]
      size_t bad = nn::first_invalid_utf8(s);
      TG_CHECK(bad == std::string::npos, origin, ": ", f.key, " must be UTF-8 text, got an invalid byte at offset ", bad);
      return s;
    }
  }
}

YAML::Node parse_yaml(const std::string& text, const std::string& origin) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(origin + ": invalid YAML at line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

std::string format_float(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, p);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a float when read back
  return s;
}

}  // namespace

std::string nearest_key(const std::string& key) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& f : config_schema()) {
    // Compare whole keys, and leaves too, so "lr" or "data.lr" both find "optim.lr".
    size_t d = std::min(edit_distance(key, f.key), edit_distance(leaf(key), leaf(f.key)) + 1);
    if (d < best_d) best_d = d, best = f.key;
  }
  size_t limit = std::max<size_t>(2, leaf(key).size() / 2);
  return best_d <= limit ? best : "";
}

Config::Config() {
  for (const auto& f : config_schema()) values_[f.key] = f.default_value;
}

const Value& Config::at(const std::string& key, ValueType want) const {
  const ConfigField* f = find_field(key);
  TG_CHECK(f, "config: unknown key '", key, "'", suggestion(key));
  TG_CHECK(f->type == want, "config: ", key, " is a ", value_type_name(f->type), ", not a ", value_type_name(want));
  auto it = values_.find(key);
  return it != values_.end() ? it->second : f->default_value;  // a key registered after this config was made
}

int64_t Config::get_int(const std::string& key) const { return std::get<int64_t>(at(key, ValueType::Int)); }
double Config::get_float(const std::string& key) const { return std::get<double>(at(key, ValueType::Float)); }
bool Config::get_bool(const std::string& key) const { return std::get<bool>(at(key, ValueType::Bool)); }
const std::string& Config::get_string(const std::string& key) const {
  return std::get<std::string>(at(key, ValueType::String));
}
const std::vector<int64_t>& Config::get_ints(const std::string& key) const {
  return std::get<std::vector<int64_t>>(at(key, ValueType::IntList));
}

void Config::set_text(const std::string& key, const std::string& text, const std::string& origin) {
  const ConfigField* f = find_field(key);
  TG_CHECK(f, origin, ": unknown config key '", key, "'", suggestion(key));
  YAML::Node n;
  if (f->type == ValueType::String) {
    n = YAML::Node(text);  // taken as it is: "runs/x", "" and "a: b" are all strings
  } else {
    n = parse_yaml(text, origin + " " + key);
  }
  values_[key] = convert(*f, n, origin);
}

void Config::set(const std::string& key, Value v) {
  const ConfigField* f = find_field(key);
  TG_CHECK(f, "config: unknown key '", key, "'", suggestion(key));
  TG_CHECK(v.index() == static_cast<size_t>(f->type), "config: ", key, " must be a ", value_type_name(f->type));
  values_[key] = std::move(v);
}

namespace {

// An override may name a key by its last part alone when no other key ends the same way:
// `device=CUDA` is `train.device=CUDA`, `lr=0.01` is `optim.lr=0.01`.
std::string full_key(const std::string& key) {
  if (key.find('.') != std::string::npos) return key;
  std::string found;
  for (const auto& f : config_schema()) {
    if (leaf(f.key) != key) continue;
    if (!found.empty()) return key;  // ambiguous: reported as unknown, with a suggestion
    found = f.key;
  }
  return found.empty() ? key : found;
}

}  // namespace

void Config::apply_override(const std::string& assignment) {
  auto eq = assignment.find('=');
  TG_CHECK(eq != std::string::npos && eq > 0, "override '", assignment, "' is not of the form key=value (e.g. optim.lr=0.01)");
  set_text(full_key(trim(assignment.substr(0, eq))), assignment.substr(eq + 1), "override");
}

void Config::validate() const {
  auto oneof = [&](const std::string& key, const std::vector<std::string>& names) {
    const std::string& v = get_string(key);
    if (std::find(names.begin(), names.end(), v) != names.end()) return;
    std::string list, near;
    size_t best = SIZE_MAX;
    for (const auto& n : names) {
      list += (list.empty() ? "" : ", ") + n;
      if (size_t d = edit_distance(v, n); d < best) best = d, near = n;
    }
    throw Error("config: " + key + "='" + v + "' is not one of " + list +
                (best <= std::max<size_t>(2, v.size() / 2) ? " (did you mean '" + near + "'?)" : ""));
  };
  auto positive = [&](const std::string& key) {
    TG_CHECK(get_int(key) > 0, "config: ", key, " must be > 0, got ", get_int(key));
  };
  auto nonneg_int = [&](const std::string& key) {
    TG_CHECK(get_int(key) >= 0, "config: ", key, " must be >= 0, got ", get_int(key));
  };
  auto nonneg = [&](const std::string& key) {
    TG_CHECK(get_float(key) >= 0, "config: ", key, " must be >= 0, got ", format_float(get_float(key)));
  };
  oneof("model.name", model_registry().names());
  oneof("data.name", dataset_registry().names());
  oneof("optim.name", {"sgd", "adam", "adamw", "lamb"});
  oneof("schedule.name", {"constant", "step", "cosine"});
  oneof("distributed.strategy", {"none", "ddp", "zero1", "fsdp"});
  oneof("distributed.backend", {"auto", "mpi", "nccl", "gloo"});
  oneof("distributed.grad_dtype", {"fp32", "bf16"});
  oneof("distributed.fsdp_gathers", {"resharded", "kept", "top"});
  oneof("train.precision", {"fp32", "bf16"});
  oneof("train.progress", {"auto", "bar", "plain", "off"});
  TG_CHECK(get_float("distributed.bucket_mb") > 0, "config: distributed.bucket_mb must be > 0, got ",
           format_float(get_float("distributed.bucket_mb")));
  TG_CHECK(get_int("distributed.rdzv_port") >= 0 && get_int("distributed.rdzv_port") <= 65535,
           "config: distributed.rdzv_port must be a port from 1 to 65535 (or 0: from the environment), got ",
           get_int("distributed.rdzv_port"));
  TG_CHECK(get_float("distributed.timeout_s") > 0, "config: distributed.timeout_s must be > 0, got ",
           format_float(get_float("distributed.timeout_s")));
  for (const auto& f : config_schema()) {
    if (!f.check) continue;
    std::string why = f.check(values_.count(f.key) ? values_.at(f.key) : f.default_value);
    TG_CHECK(why.empty(), "config: ", f.key, " ", why);
  }
  for (int64_t h : get_ints("model.hidden")) TG_CHECK(h > 0, "config: model.hidden widths must be > 0, got ", h);
  positive("data.batch_size");
  positive("data.eval_batch_size");
  nonneg_int("data.seed");
  nonneg("optim.lr");
  nonneg("optim.weight_decay");
  nonneg("optim.clip_grad_norm");
  nonneg("optim.eps");
  double m = get_float("optim.momentum");
  TG_CHECK(m >= 0 && m < 1, "config: optim.momentum must be in [0, 1), got ", format_float(m));
  TG_CHECK(!get_bool("optim.nesterov") || m > 0, "config: optim.nesterov=true needs optim.momentum > 0");
  for (const char* b : {"optim.b1", "optim.b2"}) {
    double v = get_float(b);
    TG_CHECK(v >= 0 && v < 1, "config: ", b, " must be in [0, 1), got ", format_float(v));
  }
  nonneg_int("schedule.warmup_steps");
  positive("schedule.step_size");
  TG_CHECK(get_float("schedule.gamma") > 0, "config: schedule.gamma must be > 0, got ", format_float(get_float("schedule.gamma")));
  nonneg("schedule.min_lr");
  nonneg_int("train.epochs");
  nonneg_int("train.steps");
  TG_CHECK(get_int("train.epochs") > 0 || get_int("train.steps") > 0, "config: train.epochs or train.steps must be > 0");
  nonneg_int("train.eval_every");
  nonneg_int("train.eval_batches");
  positive("train.grad_accum");
  TG_CHECK(get_float("train.peak_tflops") >= 0, "config: train.peak_tflops must be >= 0, got ", get_float("train.peak_tflops"));
  nonneg_int("train.checkpoint_every");
  nonneg_int("train.keep_checkpoints");
  positive("train.log_every");
  positive("train.print_every");
  nonneg_int("train.seed");
  TG_CHECK(!get_bool("train.resume") || !get_string("train.run_dir").empty(),
           "config: train.resume=true needs train.run_dir (the run to continue)");
  TG_CHECK(!(get_bool("train.resume") && get_bool("train.overwrite")),
           "config: train.resume=true and train.overwrite=true contradict each other");
}

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const auto& f : config_schema()) {
    std::string sec = f.key.substr(0, f.key.find('.'));
    if (sec != section) {
      if (!section.empty()) out << YAML::EndMap;
      out << YAML::Key << sec << YAML::Value << YAML::BeginMap;
      section = sec;
    }
    out << YAML::Key << leaf(f.key) << YAML::Value;
    const Value& v = at(f.key, f.type);
    switch (f.type) {
      case ValueType::Int: out << std::get<int64_t>(v); break;
      case ValueType::Float: out << format_float(std::get<double>(v)); break;
      case ValueType::Bool: out << (std::get<bool>(v) ? "true" : "false"); break;
      case ValueType::String: out << YAML::DoubleQuoted << std::get<std::string>(v); break;
      case ValueType::IntList:
        out << YAML::Flow << YAML::BeginSeq;
        for (int64_t x : std::get<std::vector<int64_t>>(v)) out << x;
        out << YAML::EndSeq;
        break;
    }
  }
  if (!section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {

// Note [duplicate keys]: YAML says the keys of a map are unique, but yaml-cpp keeps every pair
// of a map with a repeated key, in file order, so a second `lr:` in a section silently replaced
// the first. The config's maps are two levels deep (sections, then keys; deeper values are
// refused by convert), so both levels remember where each key first appeared and a repeat is
// an error naming the key and both lines.
class KeyLines {
 public:
  KeyLines(std::string origin, std::string what) : origin_(std::move(origin)), what_(std::move(what)) {}
  void add(const std::string& key, const YAML::Node& key_node) {
    int line = key_node.Mark().line + 1;
    auto [it, fresh] = first_line_.emplace(key, line);
    TG_CHECK(fresh, origin_, ": duplicate ", what_, " '", key, "' at line ", line, " (first at line ", it->second, ")");
  }

 private:
  std::string origin_, what_;
  std::map<std::string, int> first_line_;
};

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& origin, const std::vector<std::string>& overrides) {
  Config cfg;
  YAML::Node root = parse_yaml(yaml_text, origin);
  if (root && !root.IsNull()) {
    TG_CHECK(root.IsMap(), origin, ": a config is a map of sections (model, data, optim, schedule, train, distributed)");
    KeyLines sections(origin, "section"), keys(origin, "key");  // Note [duplicate keys]
    for (const auto& sec : root) {
      std::string name = sec.first.Scalar();
      // "lr: 0.01" at the top level: say where it belongs.
      TG_CHECK(sec.second.IsMap(), origin, ": '", name, "' is not a section with keys", suggestion(name));
      sections.add(name, sec.first);
      for (const auto& kv : sec.second) {
        std::string key = name + "." + kv.first.Scalar();
        keys.add(key, kv.first);
        const ConfigField* f = find_field(key);
        TG_CHECK(f, origin, ": unknown config key '", key, "'", suggestion(key));
        cfg.set(key, convert(*f, kv.second, origin));
      }
    }
  }
  for (const auto& o : overrides) cfg.apply_override(o);
  cfg.validate();
  return cfg;
}

namespace {

// Note [config files are regular files]: an ifstream opens a directory without complaint (and
// reads nothing, so `tg train /tmp` trained the defaults), and opening a FIFO blocks until a
// writer comes. The path's type is therefore checked before it is opened; a symbolic link is
// followed, so a link to a file is fine.
void check_regular_file(const std::string& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  TG_CHECK(fs::exists(st), "cannot read config file '", path, "'");
  TG_CHECK(!fs::is_directory(st), "config file '", path, "' is a directory (give a YAML file, e.g. configs/fmnist_mlp.yaml)");
  const char* kind = fs::is_fifo(st) ? "a FIFO" : fs::is_socket(st) ? "a socket"
                     : fs::is_block_file(st) || fs::is_character_file(st) ? "a device" : "not a regular file";
  TG_CHECK(fs::is_regular_file(st), "config file '", path, "' is ", kind, " (a config must be a regular YAML file)");
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  check_regular_file(path);  // Note [config files are regular files]
  std::ifstream in(path);
  TG_CHECK(in, "cannot read config file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  Config cfg = parse_config(ss.str(), path, overrides);
  cfg.name = fs::path(path).stem().string();
  return cfg;
}

}  // namespace tg::launcher
