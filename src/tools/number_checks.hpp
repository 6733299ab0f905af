// Checks of numeric options whose refusals name the bound: CLI11's PositiveNumber and
// NonNegativeNumber refuse with "Value 0 not in range 0.000000 to" and the largest double
// written out in 309 digits. Text that is not a number passes here and is refused by the
// option's conversion ("could not be converted").
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

namespace pope::tools {

inline CLI::Validator at_least(int minimum, const std::string& name) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') return {};
        if (value < minimum) return "expected a number >= " + std::to_string(minimum) + ", got " + text;
        return {};
      },
      name, "AtLeast" + std::to_string(minimum));
}

inline const CLI::Validator kPositive = at_least(1, "POSITIVE");
inline const CLI::Validator kNonNegative = at_least(0, "NONNEGATIVE");

}  // namespace pope::tools
