// The mark of a token directory that `pope-data tokenize` is still writing, or was stopped
// while writing: created before the first output file changes and removed after the last is
// durable, so a reader can tell a partial shard set from a complete one. Directories written
// by other tools never hold it, so their files stay readable as they are.
#pragma once

#include <filesystem>
#include <string_view>

namespace pope {

inline constexpr std::string_view kIncompleteMarkerName = "tokenize.incomplete";

// Writes `dir`/tokenize.incomplete atomically (fsync'd). Throws DataError.
void mark_dataset_incomplete(const std::filesystem::path& dir);
// Removes the marker and fsyncs `dir`; call once every output file is written. Throws DataError.
void mark_dataset_complete(const std::filesystem::path& dir);
// Throws DataError naming `dir` and telling to tokenize again when `dir` holds the marker.
void check_dataset_complete(const std::filesystem::path& dir);

}  // namespace pope
