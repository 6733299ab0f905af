#include "data/dataset_marker.hpp"

#include <fmt/format.h>
#include <fmt/std.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <span>
#include <string>

#include <unistd.h>

#include "checkpoint/atomic_file.hpp"
#include "pope/data.hpp"

namespace pope {

namespace {

std::filesystem::path marker_path(const std::filesystem::path& dir) { return dir / kIncompleteMarkerName; }

}  // namespace

void mark_dataset_incomplete(const std::filesystem::path& dir) {
  const std::string text = fmt::format("pope-data tokenize (pid {}) is writing this directory, or was stopped before "
                                       "it finished; its token files are incomplete\n",
                                       ::getpid());
  const std::array<std::span<const std::byte>, 1> pieces{std::as_bytes(std::span(text))};
  try {
    write_bytes_atomic(marker_path(dir), pieces);
  } catch (const AtomicWriteError& error) {
    throw DataError(error.what());
  }
}

void mark_dataset_complete(const std::filesystem::path& dir) {
  if (::unlink(marker_path(dir).c_str()) != 0)
    throw DataError(fmt::format("cannot remove {}: {}", marker_path(dir), std::strerror(errno)));
  try {
    fsync_directory(dir);
  } catch (const AtomicWriteError& error) {
    throw DataError(error.what());
  }
}

void check_dataset_complete(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(marker_path(dir), ec))) return;
  throw DataError(fmt::format("token dataset {} is incomplete: {} exists, so pope-data tokenize did not finish "
                              "writing it (it was stopped or failed); run pope-data tokenize again with --overwrite",
                              dir, marker_path(dir)));
}

}  // namespace pope
