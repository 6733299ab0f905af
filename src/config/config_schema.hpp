// The config schema: every key of RunConfig described once (JSON path, member, allowed
// values, whether it enters the hash). Parsing, to_json, range checks, overrides and the
// hash are all driven by this one table, so adding a key means adding one table row
// (and a line in configs/README.md, which a test checks).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "pope/config.hpp"

namespace pope::config_schema {

// Numeric bounds of a key; an unset side is unbounded.
struct Range {
  std::optional<double> min;
  bool min_exclusive = false;
  std::optional<double> max;
  bool max_exclusive = false;
};

// Bounds for table rows.
inline Range at_least(double min) { return {.min = min, .min_exclusive = false, .max = {}, .max_exclusive = false}; }
inline Range above(double min) { return {.min = min, .min_exclusive = true, .max = {}, .max_exclusive = false}; }
// (min, max]: a positive scale with an upper bound.
inline Range above_up_to(double min, double max) {
  return {.min = min, .min_exclusive = true, .max = max, .max_exclusive = false};
}
// (0, 1]: a share of channels or heads.
inline Range fraction() { return above_up_to(0.0, 1.0); }
// [0, 1): an Adam moment decay.
inline Range decay_rate() { return {.min = 0.0, .min_exclusive = false, .max = 1.0, .max_exclusive = true}; }
// [min, max], both included.
inline Range between(double min, double max) {
  return {.min = min, .min_exclusive = false, .max = max, .max_exclusive = false};
}
// Any value of the member's type (integers are still checked to fit it).
inline Range any() { return {}; }

// The JSON path of a key is, by contract, its member path in RunConfig, so one macro argument
// yields both: the stringised path and an accessor for that member. This keeps the two from
// ever disagreeing. A table row starts with POPE_CONFIG_KEY(model.position.xpos.scale_base).
#define POPE_CONFIG_KEY(member) #member, +[](RunConfig& c) -> auto& { return c.member; }

// Reaches one member of a RunConfig; one alternative per C++ type a key can have.
template <class T> using Accessor = T& (*)(RunConfig&);
using FieldAccessor =
    std::variant<Accessor<int>, Accessor<long>, Accessor<std::uint64_t>, Accessor<double>, Accessor<bool>,
                 Accessor<std::string>, Accessor<RopeScalingKind>, Accessor<MagnitudeKind>, Accessor<DeltaInit>,
                 Accessor<DeltaBound>, Accessor<PopeScale>, Accessor<PjRho>, Accessor<PjGateInit>, Accessor<DataKind>,
                 Accessor<LrSchedule>, Accessor<DeviceChoice>, Accessor<AttentionImpl>, Accessor<Precision>>;

// Whether a key enters the config hash, which a resume must match. unless_default: only while
// it differs from its default, so that adding a key leaves the hash of every config that keeps
// the default as it was, and checkpoints written before the key still resume; every hashed key
// added from model.position.pope.delta_bound on takes it. no: may change between a run and
// its resume.
enum class Hashed { yes, unless_default, no };

struct Field {
  std::string_view path;                 // "model.position.kind": also the member path in RunConfig
  FieldAccessor access;
  Range range = {};                      // numeric keys only
  // string keys only; empty: any string (an enum key's names come from its EnumNames)
  std::vector<std::string_view> allowed = {};
  Hashed hashed = Hashed::yes;           // no: may change between a run and its resume
};

// All keys, in README order.
const std::vector<Field>& fields();
// The key at `path`, or nullptr.
const Field* find_field(std::string_view path);
// True for "model", "model.position", …: a prefix of some key that is a JSON object.
bool is_section(std::string_view path);
// The direct children of `section` ("" = top level), for "unknown key" messages.
std::vector<std::string> children_of(std::string_view section);

// Reads a field without modifying the config (accessors are written for the mutable case).
template <class T> const T& read(Accessor<T> access, const RunConfig& config) {
  return access(const_cast<RunConfig&>(config));
}

// The names a key accepts: an enum's, or a string key's `allowed` (empty: any string, or not a
// key that takes names).
std::vector<std::string_view> allowed_names(const Field& field);

// "model.n_head" -> "/model/n_head"
nlohmann::json::json_pointer pointer_to(std::string_view path);

// A JSON value as an error message shows it: the value (shortened) and its kind.
std::string describe(const nlohmann::json& value);

// Throws ConfigError(path, message), naming `source` (a file name) when it is known.
[[noreturn]] void fail(const std::string& path, const std::string& message, const std::string& source);

// count_parameters of the model without laying out every layer, in double: defined for any
// sizes within the per-key bounds, whose products may exceed what the model could hold.
// Expects a model that passes the shape and position rules (it builds the position encoding).
double parameter_count(const ModelConfig& model);

// validate() with the source named in every message.
void check_config(const RunConfig& config, const std::string& source);

}  // namespace pope::config_schema
