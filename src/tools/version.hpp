// What every tool's --version prints, and the one call that adds it along with the help's
// plain type names (tools/version.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace pope::tools {

// "pope-train 0.1.0" and one line each for the commit, the build type, the compilers and the
// CUDA runtime, cuDNN and NCCL versions compiled against ("not built" without them).
std::string version_text(const std::string& tool);

// To call once every option and subcommand of `app` is added: adds --version (printed on
// stdout, exit 0 through app.exit) and makes --help show each option's plain type (INT, FILE,
// {a,b}) instead of CLI11's TYPE:CHECK, which names a validator, not what to type.
void finish_cli(CLI::App& app, const std::string& tool);

}  // namespace pope::tools
