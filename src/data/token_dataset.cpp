// TokenDataset: several token files read as one stream of windows that never cross files.
#include <glob.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "data/dataset_marker.hpp"
#include "pope/data.hpp"

namespace pope {

namespace {

bool has_glob_characters(const std::string& spec) { return spec.find_first_of("*?[") != std::string::npos; }

std::vector<std::filesystem::path> bin_files_in(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> paths;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(directory, ec))
    if (entry.path().extension() == ".bin" && !entry.is_directory()) paths.push_back(entry.path());
  if (ec) throw DataError(fmt::format("cannot list token directory {}: {}", directory, ec.message()));
  if (paths.empty()) throw DataError(fmt::format("token directory {} contains no *.bin files", directory));
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::vector<std::filesystem::path> glob_matches(const std::string& pattern) {
  glob_t matches{};
  const int result = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::filesystem::path> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  ::globfree(&matches);
  if (result == GLOB_NOMATCH) throw DataError(fmt::format("token file pattern '{}' matches no files", pattern));
  if (result != 0) throw DataError(fmt::format("cannot expand token file pattern '{}' (glob error {})", pattern, result));
  return paths;  // glob(3) returns them sorted
}

// Windows of `length` tokens that start inside `file` and end inside it too.
std::uint64_t windows_in(const TokenFile& file, int length) {
  const auto needed = static_cast<std::size_t>(length);
  return file.size() >= needed ? file.size() - needed + 1 : 0;
}

void check_window_length(int length) {
  if (length <= 0) throw std::invalid_argument(fmt::format("window length must be positive, got {}", length));
}

}  // namespace

TokenDataset TokenDataset::open(const std::string& spec, int vocab_size) {
  if (spec.empty()) throw DataError("token dataset path is empty, expected a file, directory or glob pattern");
  std::vector<std::filesystem::path> paths;
  const std::filesystem::path path(spec);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    check_dataset_complete(path);  // before listing: a run stopped before its first shard leaves none
    paths = bin_files_in(path);
  } else if (!std::filesystem::exists(path, ec) && has_glob_characters(spec)) {
    paths = glob_matches(spec);
  } else {
    paths = {path};  // a missing plain path gets TokenFile's "does not exist"
  }

  TokenDataset dataset;
  dataset.files_.reserve(paths.size());
  for (const auto& p : paths) {
    check_dataset_complete(p.parent_path().empty() ? "." : p.parent_path());
    dataset.files_.push_back(TokenFile::open(p, vocab_size));
  }
  return dataset;
}

std::size_t TokenDataset::total_tokens() const {
  return std::accumulate(files_.begin(), files_.end(), std::size_t{0},
                         [](std::size_t sum, const TokenFile& file) { return sum + file.size(); });
}

std::uint64_t TokenDataset::window_count(int length) const {
  check_window_length(length);
  std::uint64_t count = 0;
  for (const auto& file : files_) count += windows_in(file, length);
  return count;
}

void TokenDataset::read_window(std::uint64_t start_index, int length, std::int32_t* out) const {
  check_window_length(length);
  std::uint64_t remaining = start_index;
  for (const auto& file : files_) {
    const std::uint64_t windows = windows_in(file, length);
    if (remaining < windows) {
      file.read(static_cast<std::size_t>(remaining), static_cast<std::size_t>(length), out);
      return;
    }
    remaining -= windows;
  }
  throw std::out_of_range(fmt::format("window {} of length {} is out of range: the dataset has {} such windows",
                                      start_index, length, window_count(length)));
}

}  // namespace pope
