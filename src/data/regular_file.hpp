// Readers that expect a regular file ask here first, so that a FIFO, a device, a directory or a
// symbolic-link loop is refused with what it is, before open() could block or read forever.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

namespace pope {

// What a non-regular file of this st_mode is: "a directory", "a FIFO (named pipe)", "a character
// device", "a block device", "a socket", else "a special file".
const char* file_kind(mode_t mode);

// Why `path` is not a readable regular file ("does not exist", "is a FIFO (named pipe), not a
// regular file", "is a symbolic link loop", …), or "" when it is one.
std::string why_not_regular_file(const std::filesystem::path& path);

// Opens `path` read-only: refused with DataError "<what> <path> <reason>" when it is no regular
// file, opened with O_NONBLOCK (a FIFO swapped in after the check cannot block) and checked again
// with fstat. Returns the descriptor (close-on-exec, blocking again).
int open_regular_file(const std::filesystem::path& path, const std::string& what);

}  // namespace pope
