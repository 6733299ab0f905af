// TokenFile: opening, validating and writing llm.c / nanoGPT token files.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "checkpoint/atomic_file.hpp"
#include "data/regular_file.hpp"
#include "pope/data.hpp"

namespace pope {

// Both formats store little-endian integers and are read in place from the mapping.
static_assert(std::endian::native == std::endian::little, "token files are read in place: little-endian hosts only");

namespace {

constexpr std::size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(std::int32_t);

// Maps the whole file read-only; the shared_ptr's deleter unmaps it when the last
// TokenFile copy goes away.
std::shared_ptr<const void> map_file(const std::filesystem::path& path, std::size_t& size_out) {
  const int fd = open_regular_file(path, "token file");
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int saved = errno;
    ::close(fd);
    throw DataError(fmt::format("cannot stat token file {}: {}", path, std::strerror(saved)));
  }
  const auto size = static_cast<std::size_t>(info.st_size);
  if (size == 0) {
    ::close(fd);
    throw DataError(fmt::format("token file {} is empty", path));
  }
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int saved = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (address == MAP_FAILED) throw DataError(fmt::format("cannot map token file {}: {}", path, std::strerror(saved)));
  size_out = size;
  return std::shared_ptr<const void>(address, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
}

bool starts_with_llmc_magic(const std::byte* bytes, std::size_t size) {
  if (size < sizeof(std::int32_t)) return false;
  std::int32_t first = 0;
  std::memcpy(&first, bytes, sizeof first);
  return first == kLlmcMagic;
}

// A file without the magic whose first 1024 bytes are still mostly an llm.c header (the reserved
// words nearly all zero, or version and count matching the size) is a shard whose magic was
// damaged; no text gives that as tokens (hundreds of id 0 in a row), so it is never nanoGPT data.
void reject_damaged_llmc_header(const std::filesystem::path& path, const std::byte* bytes, std::size_t size) {
  if (size < kLlmcHeaderBytes) return;
  std::array<std::int32_t, kLlmcHeaderInts> header{};
  std::memcpy(header.data(), bytes, sizeof header);
  const auto zeros = std::count(header.begin() + 3, header.end(), 0);
  constexpr std::ptrdiff_t kMostReserved = (kLlmcHeaderInts - 3) * 9 / 10;
  const bool size_matches = header[1] == kLlmcVersion && header[2] > 0 &&
                            kLlmcHeaderBytes + static_cast<std::size_t>(header[2]) * sizeof(std::uint16_t) == size;
  if (zeros < kMostReserved && !size_matches) return;
  throw DataError(fmt::format("token file {} has a damaged llm.c header: its first int32 is {}, not the magic {}, but "
                              "its first {} bytes are otherwise an llm.c header ({}); it is not read as headerless "
                              "tokens, re-create it",
                              path, header[0], kLlmcMagic, kLlmcHeaderBytes,
                              size_matches ? fmt::format("version {}, {} tokens as its size implies", header[1], header[2])
                                           : fmt::format("{} of the {} reserved int32 are 0", zeros,
                                                         kLlmcHeaderInts - 3)));
}

// Validates the llm.c header and returns the token count it declares.
std::size_t llmc_token_count(const std::filesystem::path& path, const std::byte* bytes, std::size_t size) {
  if (size < kLlmcHeaderBytes)
    throw DataError(fmt::format("token file {} starts with the llm.c magic {} but has only {} bytes, less than the "
                                "{}-byte header (truncated?)",
                                path, kLlmcMagic, size, kLlmcHeaderBytes));
  std::array<std::int32_t, kLlmcHeaderInts> header{};  // magic, version, token count, reserved
  std::memcpy(header.data(), bytes, sizeof header);
  if (header[1] != kLlmcVersion)
    throw DataError(fmt::format("llm.c token file {} has version {}, expected {}", path, header[1], kLlmcVersion));
  if (header[2] <= 0)
    throw DataError(fmt::format("llm.c token file {} declares {} tokens in its header, expected a positive count", path,
                                header[2]));
  for (std::size_t i = 3; i < kLlmcHeaderInts; ++i)
    if (header[i] != 0)
      throw DataError(fmt::format("llm.c token file {} has a damaged header: int32 [{}] is {}, expected 0 (int32 "
                                  "[3..255] are reserved)",
                                  path, i, header[i]));
  const auto count = static_cast<std::size_t>(header[2]);
  const std::size_t expected = kLlmcHeaderBytes + count * sizeof(std::uint16_t);
  if (size != expected)
    throw DataError(fmt::format("llm.c token file {} declares {} tokens, so its size should be {} bytes, but it has {} "
                                "bytes ({})",
                                path, count, expected, size,
                                size < expected ? fmt::format("truncated by {} bytes", expected - size)
                                                : fmt::format("{} extra bytes", size - expected)));
  return count;
}

void check_token_ids(const std::filesystem::path& path, std::span<const std::uint16_t> tokens, int vocab_size) {
  if (vocab_size <= 0) return;
  const auto limit = static_cast<unsigned>(vocab_size);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= limit)
      throw DataError(fmt::format("token file {}: token at index {} has id {}, expected an id below the vocabulary "
                                  "size {}",
                                  path, i, tokens[i], vocab_size));
}

}  // namespace

TokenFile TokenFile::open(const std::filesystem::path& path, int vocab_size) {
  TokenFile file;
  file.path_ = path;
  std::size_t size = 0;
  file.mapping_ = map_file(path, size);
  const auto* bytes = static_cast<const std::byte*>(file.mapping_.get());

  std::size_t offset = 0;
  std::size_t count = 0;
  // A file that carries the magic is an llm.c shard, broken or not: reading a damaged
  // shard as nanoGPT tokens would silently train on its header.
  if (starts_with_llmc_magic(bytes, size)) {
    file.format_ = TokenFileFormat::llmc;
    offset = kLlmcHeaderBytes;
    count = llmc_token_count(path, bytes, size);
  } else {
    file.format_ = TokenFileFormat::nanogpt;
    reject_damaged_llmc_header(path, bytes, size);
    if (size % sizeof(std::uint16_t) != 0)
      throw DataError(fmt::format("nanoGPT token file {} has an odd size of {} bytes, expected 2 bytes per token "
                                  "(truncated?)",
                                  path, size));
    count = size / sizeof(std::uint16_t);
  }
  // The mapping is page-aligned and the llm.c header is 1024 bytes, so the tokens are aligned.
  file.tokens_ = std::span(reinterpret_cast<const std::uint16_t*>(bytes + offset), count);
  check_token_ids(path, file.tokens_, vocab_size);
  return file;
}

void write_llmc_shard(const std::filesystem::path& path, std::span<const std::uint16_t> tokens) {
  if (tokens.empty()) throw DataError(fmt::format("cannot write llm.c shard {}: no tokens", path));
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw DataError(fmt::format("cannot write llm.c shard {}: {} tokens exceed the int32 count of the header", path,
                                tokens.size()));
  std::array<std::int32_t, kLlmcHeaderInts> header{};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<std::int32_t>(tokens.size());
  const std::array<std::span<const std::byte>, 2> pieces{std::as_bytes(std::span(header)), std::as_bytes(tokens)};
  try {
    write_bytes_atomic(path, pieces);
  } catch (const AtomicWriteError& error) {
    throw DataError(error.what());
  }
}

}  // namespace pope
