// The experiment config of `tg train`: a typed schema (every key with its type, default and a
// line of help; built-in keys plus those a model or dataset registers), loading from YAML plus
// dotted `key=value` overrides, validation with one-line errors (an unknown key suggests the
// nearest known one), and writing the resolved config back.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace tg::launcher {

enum class ValueType { Int, Float, Bool, String, IntList };
const char* value_type_name(ValueType t);  // "int", "float", "bool", "string", "list of ints"

using Value = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

// A registered key's own check of a value of its type: why the value is wrong ("must be >= 1,
// got 0"), or empty when it is fine. Config::validate runs it.
using ConfigCheck = std::function<std::string(const Value&)>;
ConfigCheck int_at_least(int64_t min);
ConfigCheck float_in_open_interval(double lo, double hi);

struct ConfigField {
  std::string key;  // dotted: "optim.lr"
  ValueType type;
  Value default_value;
  std::string help;
  ConfigCheck check = nullptr;  // registered keys: a range check (built-in keys: Config::validate)
};

// Every key `tg train` understands, in display order (sections model, data, optim, schedule,
// train, distributed; a registered key comes after the others of its section).
const std::vector<ConfigField>& config_schema();
const ConfigField* find_field(const std::string& key);

// Adds a model's or a dataset's own keys to the schema (Note [registered config keys] in
// config.cpp); `owner` names it in errors ("dataset 'tokens'"). Throws for a key without a
// section, a default of another type than the key's, a built-in key, or a key registered before
// with another type or default (the same type and default share it: data.seq_len serves both
// datasets tokens and text).
void register_config_keys(const std::string& owner, const std::vector<ConfigField>& fields);

// The known key nearest to `key` by edit distance (empty when none is reasonably close).
std::string nearest_key(const std::string& key);
// Edit distance (Levenshtein, an adjacent transposition counting one), exposed for tests.
size_t edit_distance(const std::string& a, const std::string& b);

// A resolved config: every schema key has a value of its type.
class Config {
 public:
  Config();  // all defaults
  std::string name = "config";  // the config file's stem, used for the default run directory

  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;

  // Sets a key from text ("0.01", "true", "[256, 128]"), typed by the schema; `origin` names
  // where the text came from in error messages ("override", "configs/x.yaml").
  void set_text(const std::string& key, const std::string& text, const std::string& origin = "override");
  // Sets a key to a value of its schema type (throws on an unknown key or another type).
  void set(const std::string& key, Value v);
  // Applies one "key=value" override.
  void apply_override(const std::string& assignment);
  // Checks ranges and names (lr >= 0, batch_size > 0, registered model, each registered key's
  // check, ...); throws tg::Error.
  void validate() const;

  // The resolved config as YAML, one section per top-level name.
  std::string to_yaml() const;
  const std::map<std::string, Value>& values() const { return values_; }

 private:
  const Value& at(const std::string& key, ValueType want) const;
  std::map<std::string, Value> values_;
};

// Parses YAML text (a map of sections, each a map of keys to scalars or lists of ints) over the
// defaults, then applies the overrides, then validates. `origin` names the text in errors; a
// section or key given twice is an error naming it and both lines.
Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});
// Reads a config file (its stem becomes Config::name) and applies the overrides. The path must
// be a regular file (or a link to one): a directory or a FIFO is refused before it is opened.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace tg::launcher
