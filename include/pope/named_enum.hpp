// Enums whose values have fixed spellings: a config key that takes one of a few names is an enum
// from the moment it is parsed, and EnumNames<E>::names (in enum order) is the one table that
// parses, prints and lists them (the schema, --help, error messages).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <ostream>
#include <string_view>
#include <type_traits>

namespace pope {

// Specialised next to each enum: static constexpr std::array<std::string_view, N> names.
template <class E>
struct EnumNames;

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires { EnumNames<E>::names; };

template <NamedEnum E>
constexpr std::string_view name_of(E value) {
  return EnumNames<E>::names[static_cast<std::size_t>(value)];
}

// The value spelled `name`, or nothing.
template <NamedEnum E>
constexpr std::optional<E> enum_from_name(std::string_view name) {
  for (std::size_t i = 0; i < EnumNames<E>::names.size(); ++i)
    if (EnumNames<E>::names[i] == name) return static_cast<E>(i);
  return std::nullopt;
}

template <NamedEnum E>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << name_of(value);
}

}  // namespace pope
