// The check of options naming a file a tool writes once its work is done (--json, --csv, --plot):
// refused when the command line is parsed (exit 2, "usage or config error") if the path is a
// directory or a device, or its directory does not exist or is not writable, rather than after
// an evaluation or a benchmark that may have run for hours and then could not write its numbers.
#pragma once

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>
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
      if (fs::exists(target) && !fs::is_regular_file(target))
        return "\"" + path + "\" is not a regular file (a device, FIFO or socket); expected the path of a file to write";
      // A symbolic link is written through (atomic_file.hpp): the file it names must be writable.
      const fs::path written = fs::weakly_canonical(target, error);
      const fs::path directory = (error ? target : written).parent_path();
      if (!fs::is_directory(directory))
        return "the directory " + directory.string() + " of \"" + path + "\" does not exist";
      if (::access(directory.c_str(), W_OK | X_OK) != 0)
        return "cannot write in the directory " + directory.string() + " of \"" + path + "\": " + std::strerror(errno);
      return {};
    },
    "FILE", "OutputFile");

}  // namespace pope::tools
