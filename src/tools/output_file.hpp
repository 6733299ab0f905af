// The check of options naming a file a tool writes once its work is done (--json, --csv, --plot):
// refused when the command line is parsed (exit 2, "usage or config error") if the path is a
// directory or its directory does not exist, rather than after an evaluation or a benchmark that
// may have run for hours and then could not write its numbers.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <string>
#include <system_error>

namespace pope::tools {

inline const CLI::Validator kOutputFile(
    [](std::string& path) -> std::string {
      namespace fs = std::filesystem;
      std::error_code error;
      const fs::path target = fs::absolute(path, error);
      if (error) return "cannot resolve \"" + path + "\": " + error.message();
      if (fs::is_directory(target)) return "\"" + path + "\" is a directory; expected the path of a file to write";
      if (!fs::is_directory(target.parent_path()))
        return "the directory " + target.parent_path().string() + " of \"" + path + "\" does not exist";
      return {};
    },
    "FILE", "OutputFile");

}  // namespace pope::tools
