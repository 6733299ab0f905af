// Config files: finding one by name and loading it with overrides.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "config/bounded_json.hpp"
#include "pope/config.hpp"

namespace pope {

namespace fs = std::filesystem;

namespace {

// `path` itself, then with ".json" appended when it has another (or no) extension.
std::vector<fs::path> spellings(const fs::path& path) {
  std::vector<fs::path> names{path};
  if (path.extension() != ".json") names.push_back(fs::path(path.string() + ".json"));
  return names;
}

// `configs/` directories in `start` and each of its ancestors, nearest first.
void add_configs_dirs_upward(fs::path start, std::vector<fs::path>& dirs) {
  std::error_code ignored;
  start = fs::absolute(start, ignored);
  for (fs::path dir = start; !dir.empty(); dir = dir.parent_path()) {
    fs::path candidate = dir / "configs";
    if (fs::is_directory(candidate, ignored) &&
        std::find(dirs.begin(), dirs.end(), candidate) == dirs.end()) {
      dirs.push_back(candidate);
    }
    if (dir == dir.parent_path()) break;
  }
}

// Where bare names are looked up: configs/ in the working directory or above it (running from
// a build directory inside the source tree), then an installed prefix's share/pope/configs
// beside the executable's bin/ (cmake --install), then configs/ next to the executable or above
// it (an out-of-tree build of a source tree, run from anywhere).
std::vector<fs::path> configs_search_dirs() {
  std::vector<fs::path> dirs;
  std::error_code ignored;
  add_configs_dirs_upward(fs::current_path(ignored), dirs);
  const fs::path executable = fs::read_symlink("/proc/self/exe", ignored);
  if (executable.empty()) return dirs;
  const fs::path installed = executable.parent_path().parent_path() / "share" / "pope" / "configs";
  if (fs::is_directory(installed, ignored) && std::find(dirs.begin(), dirs.end(), installed) == dirs.end())
    dirs.push_back(installed);
  add_configs_dirs_upward(executable.parent_path(), dirs);
  return dirs;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path.string(), fmt::format("cannot open the config file: {}", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The config file's JSON. nlohmann keeps the last of two equal keys in an object, so a file that
// names a key twice (an edit that added "lr" again further down) would silently lose one of the
// values: refused, naming the dotted key.
nlohmann::json parse_config_text(const std::string& text, const fs::path& file) {
  std::vector<std::set<std::string>> keys_of_open_objects;
  std::vector<std::string> path;  // the key that led to each open object ("" for the top level)
  std::string last_key;
  const auto check_keys = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      keys_of_open_objects.emplace_back();
      path.push_back(last_key);
    } else if (event == Event::object_end) {
      keys_of_open_objects.pop_back();
      path.pop_back();
    } else if (event == Event::key) {
      last_key = parsed.get<std::string>();
      if (!keys_of_open_objects.back().insert(last_key).second) {
        std::vector<std::string> dotted;
        for (const std::string& key : path)
          if (!key.empty()) dotted.push_back(key);
        dotted.push_back(last_key);
        throw ConfigError(fmt::format("{}", fmt::join(dotted, ".")),
                          fmt::format("appears twice in {} (one of the two values would be ignored); keep one",
                                      file.string()));
      }
    }
    return true;
  };
  try {
    return parse_json(text, check_keys);
  } catch (const nlohmann::json::exception& error) {
    // nlohmann's message names the line and column of a syntax error, of nesting past
    // kMaxJsonDepth, or the number that overflows a double (1e400).
    throw ConfigError(file.string(), fmt::format("invalid JSON: {}", error.what()));
  }
}

}  // namespace

fs::path resolve_config_path(const fs::path& path) {
  std::error_code ignored;
  for (const fs::path& name : spellings(path)) {
    if (fs::is_regular_file(name, ignored)) return name;
  }
  const bool bare_name = !path.has_parent_path();
  std::vector<std::string> tried;
  for (const fs::path& name : spellings(path)) tried.push_back(name.string());
  if (bare_name) {
    for (const fs::path& dir : configs_search_dirs()) {
      for (const fs::path& name : spellings(path)) {
        if (fs::is_regular_file(dir / name, ignored)) return dir / name;
        tried.push_back((dir / name).string());
      }
    }
  }
  if (fs::exists(path, ignored))  // a directory, a device: there, but no file to read
    throw ConfigError(path.string(), fs::is_directory(path, ignored)
                                         ? "is a directory, not a config file (expected a JSON file)"
                                         : "is not a regular file (expected a JSON config file)");
  std::string looked;
  if (bare_name) {
    // Directories without a configs/ are not in `tried`: the rule says where they were looked for.
    const fs::path executable = fs::read_symlink("/proc/self/exe", ignored);
    looked = fmt::format(" (a bare name is looked for in configs/ of the working directory {} and its parents",
                         fs::current_path(ignored).string());
    if (!executable.empty())
      looked += fmt::format(", in {} and in configs/ of {} and its parents",
                            (executable.parent_path().parent_path() / "share/pope/configs").string(),
                            executable.parent_path().string());
    looked += ")";
  }
  throw ConfigError(path.string(),
                    fmt::format("config file not found; tried {}{}", fmt::join(tried, ", "), looked));
}

RunConfig load_config(const fs::path& path, const std::vector<std::string>& overrides) {
  const fs::path file = resolve_config_path(path);
  const std::string source = overrides.empty() ? file.string() : file.string() + " with --set overrides";
  try {
    nlohmann::json json_config = parse_config_text(read_file(file), file);
    for (const std::string& assignment : overrides) apply_override(json_config, assignment);
    return config_from_json(json_config, source);
  } catch (const nlohmann::json::exception& error) {
    // Every known case is a ConfigError naming its key; this keeps any other from reaching
    // the user as a library message that names no file.
    throw ConfigError(source, fmt::format("unexpected JSON error: {}", error.what()));
  }
}

}  // namespace pope
