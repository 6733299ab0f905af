#include "config/bounded_json.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace pope {

std::optional<std::size_t> excess_json_nesting(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

nlohmann::json parse_json(std::string_view text, const nlohmann::json::parser_callback_t& callback,
                          bool allow_exceptions) {
  if (const std::optional<std::size_t> offset = excess_json_nesting(text)) {
    if (!allow_exceptions) return nlohmann::json(nlohmann::json::value_t::discarded);
    // Line and column as nlohmann's own syntax errors give them (1-based line, column of the byte).
    const std::string_view before = text.substr(0, *offset + 1);
    const std::size_t line_start = before.rfind('\n');
    const nlohmann::detail::position_t position{
        .chars_read_total = *offset + 1,
        .chars_read_current_line = line_start == std::string_view::npos ? *offset + 1 : *offset - line_start,
        .lines_read = std::size_t(std::count(before.begin(), before.end(), '\n'))};
    throw nlohmann::json::parse_error::create(
        101, position, fmt::format("arrays and objects nested deeper than {} levels", kMaxJsonDepth), nullptr);
  }
  return nlohmann::json::parse(text, callback, allow_exceptions);
}

}  // namespace pope
