#include "position/registry.hpp"

#include <algorithm>
#include <stdexcept>

namespace pope {

// The built-in rows (builtin_methods.cpp).
const std::vector<PositionMethod>& builtin_position_methods();

namespace {

struct Registered {
  PositionMethod method;
  std::vector<config_schema::Field> keys;
};

// Filled while the program starts, before main reads it.
std::vector<Registered>& registrations() {
  static std::vector<Registered> rows;
  return rows;
}

std::vector<Registered> sorted_registrations() {
  std::vector<Registered> rows = registrations();
  std::sort(rows.begin(), rows.end(), [](const Registered& a, const Registered& b) { return a.method.name < b.method.name; });
  return rows;
}

}  // namespace

PositionMethodRegistration::PositionMethodRegistration(PositionMethod method, std::vector<config_schema::Field> keys) {
  if (method.name.empty() || method.make == nullptr)
    throw std::logic_error("a position method registers with a name and a factory");
  for (const PositionMethod& builtin : builtin_position_methods())
    if (builtin.name == method.name) throw std::logic_error("position method '" + std::string(method.name) + "' exists");
  for (const Registered& other : registrations())
    if (other.method.name == method.name)
      throw std::logic_error("position method '" + std::string(method.name) + "' is registered twice");
  registrations().push_back({method, std::move(keys)});
}

const std::vector<PositionMethod>& position_methods() {
  static const std::vector<PositionMethod> methods = [] {
    std::vector<PositionMethod> all = builtin_position_methods();
    for (const Registered& row : sorted_registrations()) all.push_back(row.method);
    return all;
  }();
  return methods;
}

std::vector<std::string> position_kinds() {
  std::vector<std::string> names;
  for (const PositionMethod& method : position_methods())
    if (!method.alias) names.emplace_back(method.name);
  return names;
}

std::string position_kind_summary(const std::string& kind) {
  const PositionMethod* method = find_position_method(kind);
  return method == nullptr ? "" : std::string(method->summary);
}

const PositionMethod* find_position_method(std::string_view name) {
  for (const PositionMethod& method : position_methods())
    if (method.name == name) return &method;
  return nullptr;
}

std::string position_method_names() {
  std::string names;
  for (const PositionMethod& method : position_methods()) {
    if (!names.empty()) names += ", ";
    names += method.name;
  }
  return names;
}

std::vector<config_schema::Field> registered_position_keys() {
  std::vector<config_schema::Field> keys;
  for (const Registered& row : sorted_registrations()) keys.insert(keys.end(), row.keys.begin(), row.keys.end());
  return keys;
}

}  // namespace pope
