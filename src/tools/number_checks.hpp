// Checks of numeric options whose refusals name the bound: CLI11's PositiveNumber and
// NonNegativeNumber refuse with "Value 0 not in range 0.000000 to" and the largest double
// written out in 309 digits. Text that is not a number passes here and is refused by the
// option's conversion ("could not be converted").
//
// Every unsigned option needs at least kNonNegative: CLI11 reads unsigned integers with
// strtoull, which takes "-1" as 2^64 − 1 (an unsigned count of -1 would mean "everything").
#pragma once

#include <CLI/CLI.hpp>

#include "pope/config.hpp"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>

namespace pope::tools {

namespace detail {

// The number `text` holds, or nothing for text that is not a number.
inline std::optional<double> number_in(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0') return std::nullopt;
  return value;
}

// A bound as the user would write it: 1024, not 1024.000000.
inline std::string bound_text(double bound) {
  std::ostringstream out;
  out << bound;
  return out.str();
}

// A validator refusing numbers below `minimum` (or equal to it when `exclusive`) and above
// `maximum` when given. NaN and infinities are refused too: strtod reads "nan" and "inf",
// which no option means.
inline CLI::Validator bounded(double minimum, bool exclusive, std::optional<double> maximum, const std::string& name) {
  std::string expected = "expected a number ";
  if (maximum) expected += "from " + bound_text(minimum) + " to " + bound_text(*maximum);
  else expected += (exclusive ? "> " : ">= ") + bound_text(minimum);
  return CLI::Validator(
      [minimum, exclusive, maximum, expected](std::string& text) -> std::string {
        const std::optional<double> value = number_in(text);
        if (!value) return {};
        const bool below = exclusive ? *value <= minimum : *value < minimum;
        if (!std::isfinite(*value) || below || (maximum && *value > *maximum)) return expected + ", got " + text;
        return {};
      },
      name, expected);
}

}  // namespace detail

inline CLI::Validator at_least(double minimum, const std::string& name) {
  return detail::bounded(minimum, false, std::nullopt, name);
}

inline CLI::Validator above(double minimum, const std::string& name) {
  return detail::bounded(minimum, true, std::nullopt, name);
}

// [minimum, maximum], both included.
inline CLI::Validator in_range(double minimum, double maximum, const std::string& name) {
  return detail::bounded(minimum, false, maximum, name);
}

inline const CLI::Validator kPositive = at_least(1, "POSITIVE");
inline const CLI::Validator kNonNegative = at_least(0, "NONNEGATIVE");
inline const CLI::Validator kThreads = in_range(0, pope::kMaxThreads, "THREADS");

}  // namespace pope::tools
