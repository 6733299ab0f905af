// Checks of options that take a name or a path: an empty value (typically an unset shell
// variable, `--init-from $CKPT`) is refused instead of being read as "not given".
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace pope::tools {

inline const CLI::Validator kNonEmpty(
    [](std::string& text) -> std::string { return text.empty() ? "expected a non-empty value" : std::string(); },
    "", "NonEmpty");

}  // namespace pope::tools
