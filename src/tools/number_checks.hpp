// Checks of numeric options whose refusals name the bound: CLI11's PositiveNumber and
// NonNegativeNumber refuse with "Value 0 not in range 0.000000 to" and the largest double
// written out in 309 digits.
//
// Every integer option takes integer_check: CLI11 reads integers with strtoull/strtoll, which
// take "-1" as 2^64 − 1 for an unsigned option (an unsigned count of -1 would mean
// "everything"), saturate 99999999999999999999 to the type's maximum, and read 010 as octal
// and 0x10 as hexadecimal.
#pragma once

#include <CLI/CLI.hpp>

#include "pope/config.hpp"

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
// which no option means. Text that is not a number passes here and is refused by the option's
// conversion ("could not be converted").
inline CLI::Validator bounded(double minimum, bool exclusive, std::optional<double> maximum) {
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
      "", expected);
}

// The decimal integer `text` spells (digits, optionally after '-'), or nothing. Read as
// std::int64_t when negative and std::uint64_t otherwise, which between them hold every value
// of every integer type; `text` beyond both is nothing too.
template <class Wide> std::optional<Wide> decimal_in(const std::string& text) {
  Wide value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

template <std::integral T> CLI::Validator integer_in(T minimum, T maximum) {
  const std::string expected = "expected an integer from " + std::to_string(minimum) + " to " + std::to_string(maximum);
  return CLI::Validator(
      [minimum, maximum, expected](const std::string& text) -> std::string {
        const auto in_range = [&](auto value) {
          return std::cmp_greater_equal(value, minimum) && std::cmp_less_equal(value, maximum);
        };
        const bool negative = text.starts_with('-');
        bool fits = false;
        if (negative) {
          if (const auto value = decimal_in<std::int64_t>(text)) fits = in_range(*value);
        } else if (const auto value = decimal_in<std::uint64_t>(text)) {
          fits = in_range(*value);
        }
        if (!fits) return expected + ", got " + text;
        // CLI11's conversion reads a leading 0 as octal (010 is 8).
        const std::size_t first_digit = negative ? 1 : 0;
        if (text.size() > first_digit + 1 && text[first_digit] == '0')
          return expected + " without leading zeros, got " + text;
        return {};
      },
      "", expected);
}

}  // namespace detail

// Floating-point options.
inline CLI::Validator at_least(double minimum) { return detail::bounded(minimum, false, std::nullopt); }
inline CLI::Validator above(double minimum) { return detail::bounded(minimum, true, std::nullopt); }
// [minimum, maximum], both included.
inline CLI::Validator in_range(double minimum, double maximum) { return detail::bounded(minimum, false, maximum); }
inline const CLI::Validator kNonNegative = at_least(0);

// The check of an integer option read into `variable` (or each value of a list of them): an
// integer in [minimum, maximum], by default every value of the variable's type.
template <std::integral T>
  requires(!std::same_as<T, bool>)
CLI::Validator integer_check(const T& /*variable*/, std::type_identity_t<T> minimum = std::numeric_limits<T>::min(),
                             std::type_identity_t<T> maximum = std::numeric_limits<T>::max()) {
  return detail::integer_in<T>(minimum, maximum);
}
template <std::integral T>
CLI::Validator integer_check(const std::vector<T>& /*variable*/,
                             std::type_identity_t<T> minimum = std::numeric_limits<T>::min(),
                             std::type_identity_t<T> maximum = std::numeric_limits<T>::max()) {
  return detail::integer_in<T>(minimum, maximum);
}

// --threads of every tool: 0 (every core) to pope::kMaxThreads.
inline CLI::Validator threads_check(const int& threads) { return integer_check(threads, 0, pope::kMaxThreads); }

}  // namespace pope::tools
