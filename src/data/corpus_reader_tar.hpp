// A minimal streaming tar reader (POSIX ustar and GNU tar, as `tar` writes them): enough to walk
// the regular files of an archive such as the OpenWebText release.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "data/corpus_reader_sources.hpp"

namespace pope {

// True when `head` (the first 512 bytes of a stream) is a tar header block.
bool looks_like_tar(std::string_view head);

// Calls `on_member(contents, member_name)` for each regular file of the tar stream `archive`,
// in archive order; whatever of a member on_member leaves unread is skipped. Directories, links
// and other entries are skipped. Throws DataError naming `archive_name` on a corrupt header
// (bad checksum, bad size field) or truncation.
void for_each_tar_member(ByteSource& archive, const std::string& archive_name,
                         const std::function<void(ByteSource&, const std::string&)>& on_member);

}  // namespace pope
