// JSON read from users (config files, --set values, checkpoints, data records) parsed with a
// bound on its nesting: nlohmann's parser is iterative, but dump(), copies and comparisons
// recurse once per level, so a value nested 100,000 deep overflows the stack wherever it is
// copied or quoted in a message.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace pope {

// Far deeper than anything the tools read (a config nests 4 objects, a safetensors header 2).
inline constexpr int kMaxJsonDepth = 64;

// The byte offset of the first '[' or '{' (outside strings) that opens level kMaxJsonDepth + 1,
// or nothing when `text` nests no deeper than that. Text that is not JSON is scanned the same way.
std::optional<std::size_t> excess_json_nesting(std::string_view text);

// nlohmann::json::parse that also refuses nesting deeper than kMaxJsonDepth, as a syntax error:
// nlohmann::json::parse_error naming the line and column, or with `allow_exceptions` false a
// discarded value.
nlohmann::json parse_json(std::string_view text, const nlohmann::json::parser_callback_t& callback = nullptr,
                          bool allow_exceptions = true);

}  // namespace pope
