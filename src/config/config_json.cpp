// RunConfig <-> JSON, and `a.b.c=value` overrides of the JSON form. Every key is handled
// through the schema table; nothing here names an individual key.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "config/bounded_json.hpp"
#include "config/config_schema.hpp"
#include "pope/config.hpp"

namespace pope {

using nlohmann::json;
using config_schema::describe;
using config_schema::fail;

namespace {

template <class Integer> Integer parse_integer(const json& value, const std::string& path, const std::string& source) {
  constexpr bool is_unsigned = std::is_unsigned_v<Integer>;
  const char* expected = is_unsigned ? "a non-negative integer" : "an integer";
  // A whole number in floating-point form (train.steps=1e3) is that integer where a double holds
  // every integer, up to 2^53; past it, 1e19 may not be the integer that was meant.
  if (value.is_number_float()) {
    constexpr double kLargestExact = 9007199254740992.0;  // 2^53
    const double number = value.get<double>();
    const bool whole = number == std::floor(number);
    if (whole && std::fabs(number) <= kLargestExact) {
      const json integer = number >= 0 ? json(std::uint64_t(number)) : json(std::int64_t(number));
      return parse_integer<Integer>(integer, path, source);
    }
    fail(path,
         fmt::format("expected {}, found {}{}", expected, describe(value),
                     whole ? "; write integers beyond 2^53 in digits" : ""),
         source);
  }
  if (!value.is_number_integer()) fail(path, fmt::format("expected {}, found {}", expected, describe(value)), source);
  // nlohmann stores non-negative integers as unsigned and negative ones as signed.
  if (value.is_number_unsigned()) {
    if (value.get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<Integer>::max())) return value.get<Integer>();
  } else {
    const std::int64_t signed_value = value.get<std::int64_t>();
    if (!is_unsigned && signed_value >= std::int64_t(std::numeric_limits<Integer>::min()) &&
        signed_value <= std::int64_t(std::numeric_limits<Integer>::max())) {
      return Integer(signed_value);
    }
  }
  fail(path,
       fmt::format("expected {} in [{}, {}], found {}", expected, std::numeric_limits<Integer>::min(),
                   std::numeric_limits<Integer>::max(), describe(value)),
       source);
}

// The offset of the first byte that does not continue valid UTF-8 (overlong forms and surrogates
// are invalid too), or nothing.
std::optional<std::size_t> invalid_utf8_at(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char lead = text[i];
    // Continuation bytes after each lead, and the range of the first one (the rest are 80..BF).
    int more = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (lead < 0x80) more = 0;
    else if (lead >= 0xC2 && lead <= 0xDF) more = 1;
    else if (lead == 0xE0) more = 2, low = 0xA0;
    else if (lead == 0xED) more = 2, high = 0x9F;
    else if (lead >= 0xE1 && lead <= 0xEF) more = 2;
    else if (lead == 0xF0) more = 3, low = 0x90;
    else if (lead >= 0xF1 && lead <= 0xF3) more = 3;
    else if (lead == 0xF4) more = 3, high = 0x8F;
    else return i;
    for (int k = 1; k <= more; ++k, low = 0x80, high = 0xBF) {
      if (i + k >= text.size()) return i + k;
      const unsigned char next = text[i + k];
      if (next < low || next > high) return i + k;
    }
    i += more + 1;
  }
  return std::nullopt;
}

template <class T> T parse_value(const json& value, const std::string& path, const std::string& source) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) fail(path, "expected true or false, found " + describe(value), source);
    return value.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) fail(path, "expected a string, found " + describe(value), source);
    // A --set value is taken as given; the resolved config and its hash are JSON, i.e. UTF-8.
    const std::string& text = value.get_ref<const std::string&>();
    if (const std::optional<std::size_t> at = invalid_utf8_at(text)) {
      fail(path,
           *at == text.size() ? std::string("expected UTF-8 text, found text that ends inside a multi-byte character")
                              : fmt::format("expected UTF-8 text, found the byte 0x{:02X} at offset {}, which is not "
                                            "valid UTF-8 there",
                                            static_cast<unsigned char>(text[*at]), *at),
           source);
    }
    return text;
  } else if constexpr (NamedEnum<T>) {
    if (!value.is_string()) fail(path, "expected a string, found " + describe(value), source);
    const std::string name = value.get<std::string>();
    if (const std::optional<T> parsed = enum_from_name<T>(name)) return *parsed;
    fail(path, fmt::format("expected one of {}; found \"{}\"", fmt::join(EnumNames<T>::names, ", "), name), source);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!value.is_number()) fail(path, "expected a number, found " + describe(value), source);
    return value.get<T>();
  } else {
    return parse_integer<T>(value, path, source);
  }
}

std::string join_path(const std::string& section, const std::string& key) {
  return section.empty() ? key : section + "." + key;
}

// Edits (insertions, deletions, substitutions, swaps of neighbours) turning `a` into `b`:
// the optimal string alignment distance, which counts "trian" for "train" as one typo.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string_view last_part(std::string_view path) { return path.substr(path.rfind('.') + 1); }

// Keys and sections spelled close to `path` (a typo: at most one edit per three letters of
// its last part, at most two), or ending in the same key (optim.lr for train.lr); nearest first.
std::vector<std::string> close_keys(const std::string& path) {
  std::vector<std::string> candidates;
  for (const config_schema::Field& field : config_schema::fields()) {
    for (std::size_t dot = field.path.find('.'); dot != std::string_view::npos; dot = field.path.find('.', dot + 1))
      candidates.emplace_back(field.path.substr(0, dot));
    candidates.emplace_back(field.path);
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  const std::size_t allowed = std::clamp<std::size_t>(last_part(path).size() / 3, 1, 2);
  std::vector<std::pair<std::size_t, std::string>> close;
  for (const std::string& candidate : candidates) {
    const std::size_t distance = edit_distance(path, candidate);
    if (distance <= allowed || last_part(candidate) == last_part(path)) close.emplace_back(distance, candidate);
  }
  std::sort(close.begin(), close.end());
  std::vector<std::string> names;
  for (const auto& [distance, name] : close)
    if (names.size() < 3) names.push_back(name);
  return names;
}

// The nearest section enclosing `path` ("" for the top level).
std::string enclosing_section(std::string path) {
  for (std::size_t dot = path.rfind('.'); dot != std::string::npos; dot = path.rfind('.')) {
    path.resize(dot);
    if (config_schema::is_section(path)) return path;
  }
  return "";
}

// Why `path` is no key: the close spellings, then the keys of the nearest enclosing section.
std::string unknown_key_message(const std::string& path) {
  const std::vector<std::string> close = close_keys(path);
  const std::string section = enclosing_section(path);
  return fmt::format("unknown key{}; the keys of {} are {}",
                     close.empty() ? "" : fmt::format(" (did you mean {}?)", fmt::join(close, " or ")),
                     section.empty() ? "the top level" : section, fmt::join(config_schema::children_of(section), ", "));
}

// A section given a value: its keys, and how to set one. `found` describes the value, if any.
std::string section_message(const std::string& section, const std::string& found) {
  return fmt::format("is a section (keys: {}){}; set {}.<key>", fmt::join(config_schema::children_of(section), ", "),
                     found.empty() ? "" : ", found " + found, section);
}

// Rejects any key the schema does not know, at any depth, and sections that are not objects.
void check_keys(const json& object, const std::string& section, const std::string& source) {
  for (const auto& [key, value] : object.items()) {
    const std::string path = join_path(section, key);
    // A dotted key would otherwise alias a nested one: {"model.n_head": 8} is not model.n_head.
    if (key.find('.') != std::string::npos) {
      const std::size_t dot = key.find('.');
      fail(path, fmt::format("unknown key; a config file nests its sections: write \"{}\": {{\"{}\": ...}}",
                             key.substr(0, dot), key.substr(dot + 1)),
           source);
    }
    if (!key.empty() && config_schema::find_field(path)) continue;
    if (!key.empty() && config_schema::is_section(path)) {
      if (!value.is_object()) fail(path, section_message(path, describe(value)), source);
      check_keys(value, path, source);
      continue;
    }
    fail(path, unknown_key_message(path), source);
  }
}

}  // namespace

RunConfig config_from_json(const json& json_config, const std::string& source) {
  if (!json_config.is_object()) fail("<root>", "expected a JSON object, found " + describe(json_config), source);
  check_keys(json_config, "", source);
  RunConfig config;
  for (const config_schema::Field& field : config_schema::fields()) {
    const auto pointer = config_schema::pointer_to(field.path);
    if (!json_config.contains(pointer)) continue;
    std::visit(
        [&](auto access) {
          auto& member = access(config);
          member = parse_value<std::decay_t<decltype(member)>>(json_config.at(pointer), std::string(field.path),
                                                                source);
        },
        field.access);
  }
  config_schema::check_config(config, source);
  return config;
}

json config_to_json(const RunConfig& config) {
  json result = json::object();
  for (const config_schema::Field& field : config_schema::fields()) {
    std::visit(
        [&](auto access) {
          const auto& value = config_schema::read(access, config);
          if constexpr (NamedEnum<std::decay_t<decltype(value)>>) {
            result[config_schema::pointer_to(field.path)] = name_of(value);
          } else {
            result[config_schema::pointer_to(field.path)] = value;
          }
        },
        field.access);
  }
  return result;
}

void apply_override(json& json_config, const std::string& assignment) {
  const std::size_t equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw ConfigError(assignment, "expected an override of the form a.b.c=value");
  }
  const std::string path = assignment.substr(0, equals);
  const std::string text = assignment.substr(equals + 1);
  if (config_schema::is_section(path)) throw ConfigError(path, section_message(path, ""));
  if (!config_schema::find_field(path)) {
    throw ConfigError(path, fmt::format("{} (in override '{}'; configs/README.md lists every key)",
                                        unknown_key_message(path), assignment));
  }
  if (!json_config.is_object()) throw ConfigError("<root>", "expected a JSON object, found " + describe(json_config));

  // Create the enclosing sections as needed; a section that is present must be an object.
  json* section = &json_config;
  std::string section_path;
  std::size_t start = 0;
  for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    const std::string key = path.substr(start, dot - start);
    section_path = join_path(section_path, key);
    json& child = (*section)[key];
    if (child.is_null()) child = json::object();
    if (!child.is_object()) throw ConfigError(section_path, "expected an object, found " + describe(child));
    section = &child;
    start = dot + 1;
  }
  // Too deep is refused here: as a plain string it would be reported as a wrong type.
  if (excess_json_nesting(text))
    throw ConfigError(path, fmt::format("expected a --set value nested at most {} levels deep, found deeper arrays "
                                        "or objects",
                                        kMaxJsonDepth));
  // Values are JSON when they parse as JSON (numbers, booleans, "quoted", arrays), otherwise
  // plain strings, so that model.position.kind=rope needs no quotes.
  json value = parse_json(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    // A number too large for a double fails to parse too; it is not meant as a string.
    char* end = nullptr;
    errno = 0;
    std::strtod(text.c_str(), &end);
    if (!text.empty() && *end == '\0' && errno == ERANGE)
      throw ConfigError(path, fmt::format("{} is outside the range of a double (in override '{}')", text, assignment));
  }
  (*section)[path.substr(start)] = value.is_discarded() ? json(text) : value;
}

}  // namespace pope
