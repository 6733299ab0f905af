#include "data/corpus_reader_tar.hpp"

#include <cstdint>
#include <cstring>

#include "pope/data.hpp"

namespace pope {
namespace {

constexpr std::size_t kBlock = 512;

// Header fields (offset, length) of the ustar format.
struct Field {
  std::size_t offset, length;
};
constexpr Field kName{0, 100}, kSize{124, 12}, kChecksum{148, 8}, kType{156, 1}, kMagic{257, 6}, kPrefix{345, 155};

std::string_view field(std::string_view block, Field f) {
  std::string_view value = block.substr(f.offset, f.length);
  return value.substr(0, std::min(value.find('\0'), value.size()));
}

// Numeric fields are octal text (NUL/space padded), or base-256 big-endian when the first byte
// has its top bit set (GNU tar, for sizes of 8 GiB and more).
std::uint64_t parse_number(std::string_view block, Field f, const std::string& where) {
  const std::string_view raw = block.substr(f.offset, f.length);
  std::uint64_t value = 0;
  if (static_cast<unsigned char>(raw[0]) & 0x80) {
    for (std::size_t i = 1; i < raw.size(); ++i) value = (value << 8) | static_cast<unsigned char>(raw[i]);
    return value;
  }
  std::size_t i = 0;
  while (i < raw.size() && raw[i] == ' ') ++i;
  bool any_digit = false;
  for (; i < raw.size() && raw[i] >= '0' && raw[i] <= '7'; ++i, any_digit = true) value = value * 8 + (raw[i] - '0');
  for (; i < raw.size(); ++i)
    if (raw[i] != ' ' && raw[i] != '\0') any_digit = false;
  if (!any_digit) throw DataError(where + ": corrupt tar header (a numeric field is not octal)");
  return value;
}

void check_checksum(std::string_view block, const std::string& where) {
  // The checksum is the byte sum of the header with its own field read as spaces.
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i) {
    const bool in_checksum = i >= kChecksum.offset && i < kChecksum.offset + kChecksum.length;
    sum += in_checksum ? ' ' : static_cast<unsigned char>(block[i]);
  }
  if (parse_number(block, kChecksum, where) != sum) throw DataError(where + ": corrupt tar header (checksum mismatch)");
}

// The "path" record of a pax extended header ("LENGTH path=VALUE\n" records), or "".
std::string pax_path(std::string_view records) {
  while (!records.empty()) {
    const std::size_t space = records.find(' ');
    if (space == std::string_view::npos) break;
    const std::size_t length = std::strtoul(std::string(records.substr(0, space)).c_str(), nullptr, 10);
    if (length <= space + 1 || length > records.size()) break;
    const std::string_view record = records.substr(space + 1, length - space - 2);  // without "\n"
    if (record.rfind("path=", 0) == 0) return std::string(record.substr(5));
    records.remove_prefix(length);
  }
  return {};
}

bool read_block(ByteSource& in, std::string& block) {
  block.resize(kBlock);
  std::size_t have = 0;
  while (have < kBlock) {
    const std::size_t got = in.read(block.data() + have, kBlock - have);
    if (got == 0) break;
    have += got;
  }
  return have == kBlock;
}

}  // namespace

bool looks_like_tar(std::string_view head) {
  return head.size() >= kBlock && head.substr(kMagic.offset, 5) == "ustar";
}

void for_each_tar_member(ByteSource& archive, const std::string& archive_name,
                         const std::function<void(ByteSource&, const std::string&)>& on_member) {
  std::string block, long_name;
  for (std::uint64_t offset = 0;; offset += kBlock) {
    const std::string where = archive_name + " (tar header at byte " + std::to_string(offset) + ")";
    if (!read_block(archive, block)) return;  // end of stream without the end-of-archive blocks: accepted, as tar does
    if (block.find_first_not_of('\0') == std::string::npos) return;  // end-of-archive marker
    check_checksum(block, where);
    const std::uint64_t size = parse_number(block, kSize, where);
    const char type = block[kType.offset];

    std::string name = long_name;
    long_name.clear();
    if (name.empty()) {
      name = std::string(field(block, kName));
      // POSIX ustar ("ustar\0") keeps a path prefix; GNU tar ("ustar ") uses that area otherwise.
      if (block.compare(kMagic.offset, 6, std::string("ustar\0", 6)) == 0 && !field(block, kPrefix).empty())
        name = std::string(field(block, kPrefix)) + "/" + name;
    }

    BoundedSource contents(archive, size, archive_name + "/" + name);
    if (type == '0' || type == '\0' || type == '7') {
      on_member(contents, archive_name + "/" + name);
    } else if (type == 'L' || type == 'x') {  // the next member's name: GNU long name or pax header
      const std::string data = contents.read_all(where, 1 << 20);
      long_name = type == 'L' ? data.substr(0, data.find('\0')) : pax_path(data);
    }
    contents.drain();
    const std::uint64_t padding = (kBlock - size % kBlock) % kBlock;
    BoundedSource(archive, padding, where).drain();
    offset += size + padding;
  }
}

}  // namespace pope
