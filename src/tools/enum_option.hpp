// Options whose values are the names of a config enum (pope/config.hpp's EnumNames): the
// accepted names come from the enum's one table.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "pope/named_enum.hpp"

namespace pope::tools {

template <NamedEnum E>
std::vector<std::string> names_of() {
  return {EnumNames<E>::names.begin(), EnumNames<E>::names.end()};
}

// Refuses a value that is not one of E's names, listing them.
template <NamedEnum E>
CLI::IsMember one_of_names() {
  return CLI::IsMember(names_of<E>());
}

}  // namespace pope::tools
