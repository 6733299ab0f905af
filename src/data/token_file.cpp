// TokenFile: opening, validating and writing llm.c / nanoGPT token files.
#include <fcntl.h>
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
#include <stdexcept>

#include "checkpoint/atomic_file.hpp"
#include "data/regular_file.hpp"
#include "pope/data.hpp"

namespace pope {

// Both formats store little-endian integers, copied as they are from the file.
static_assert(std::endian::native == std::endian::little, "token files are read as stored: little-endian hosts only");

namespace {

constexpr std::size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(std::int32_t);
constexpr std::size_t kScanTokens = std::size_t{1} << 20;  // scan()'s chunk: 2 MiB, whatever the file's size

// Reads up to `bytes` at `offset`, retrying short reads; returns how many there were (fewer only
// at the end of the file).
std::size_t pread_full(int fd, const std::filesystem::path& path, void* out, std::size_t bytes, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd, static_cast<std::byte*>(out) + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw DataError(fmt::format("cannot read token file {}: {}", path, std::strerror(errno)));
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

std::uint64_t current_size(int fd) {
  struct stat info {};
  return ::fstat(fd, &info) == 0 ? static_cast<std::uint64_t>(info.st_size) : 0;
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

}  // namespace

TokenFile TokenFile::open(const std::filesystem::path& path, int vocab_size) {
  TokenFile file;
  file.path_ = path;
  file.vocab_size_ = vocab_size;
  const int fd = open_regular_file(path, "token file");
  file.fd_ = std::shared_ptr<const int>(new int(fd), [](const int* p) {
    ::close(*p);
    delete p;
  });
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    throw DataError(fmt::format("cannot stat token file {}: {}", path, std::strerror(errno)));
  const auto size = static_cast<std::size_t>(info.st_size);
  if (size == 0) throw DataError(fmt::format("token file {} is empty", path));
  file.file_bytes_ = size;

  std::array<std::byte, kLlmcHeaderBytes> head{};  // the header checks look at most this far
  const std::size_t head_bytes = std::min(size, head.size());
  if (pread_full(fd, path, head.data(), head_bytes, 0) != head_bytes)
    throw DataError(fmt::format("token file {} shrank while it was being opened (truncated while in use?)", path));
  // A file that carries the magic is an llm.c shard, broken or not: reading a damaged
  // shard as nanoGPT tokens would silently train on its header.
  if (starts_with_llmc_magic(head.data(), size)) {
    file.format_ = TokenFileFormat::llmc;
    file.offset_ = kLlmcHeaderBytes;
    file.count_ = llmc_token_count(path, head.data(), size);
  } else {
    file.format_ = TokenFileFormat::nanogpt;
    reject_damaged_llmc_header(path, head.data(), size);
    if (size % sizeof(std::uint16_t) != 0)
      throw DataError(fmt::format("nanoGPT token file {} has an odd size of {} bytes, expected 2 bytes per token "
                                  "(truncated?)",
                                  path, size));
    file.count_ = size / sizeof(std::uint16_t);
  }
  if (vocab_size > 0) file.scan([](std::size_t, std::span<const std::uint16_t>) {});  // read_checked checks every id
  return file;
}

void TokenFile::read_checked(std::size_t first, std::size_t count, std::uint16_t* out) const {
  if (first > count_ || count > count_ - first)
    throw std::out_of_range(fmt::format("tokens [{}, {}) of token file {} are out of range: it has {} tokens", first,
                                        first + count, path_, count_));
  const std::size_t bytes = count * sizeof(std::uint16_t);
  const std::uint64_t offset = offset_ + std::uint64_t{first} * sizeof(std::uint16_t);
  if (pread_full(*fd_, path_, out, bytes, offset) != bytes)
    throw DataError(fmt::format("token file {} shrank while in use: it had {} bytes when opened, now {}, so tokens "
                                "[{}, {}) are gone (was it truncated or rewritten?); restore the file",
                                path_, file_bytes_, current_size(*fd_), first, first + count));
  if (vocab_size_ <= 0) return;
  const auto limit = static_cast<unsigned>(vocab_size_);
  for (std::size_t i = 0; i < count; ++i)
    if (out[i] >= limit)
      throw DataError(fmt::format("token file {}: token at index {} has id {}, expected an id below the vocabulary "
                                  "size {}",
                                  path_, first + i, out[i], vocab_size_));
}

void TokenFile::read(std::size_t first, std::size_t count, std::uint16_t* out) const {
  read_checked(first, count, out);
}

void TokenFile::read(std::size_t first, std::size_t count, std::int32_t* out) const {
  std::array<std::uint16_t, 4096> chunk;  // on the stack: a training window costs no allocation
  for (std::size_t done = 0; done < count; done += chunk.size()) {
    const std::size_t n = std::min(chunk.size(), count - done);
    read_checked(first + done, n, chunk.data());
    std::copy_n(chunk.data(), n, out + done);
  }
}

std::vector<std::uint16_t> TokenFile::read(std::size_t first, std::size_t count) const {
  std::vector<std::uint16_t> tokens(count);
  read_checked(first, count, tokens.data());
  return tokens;
}

void TokenFile::scan(const std::function<void(std::size_t, std::span<const std::uint16_t>)>& on_chunk) const {
  std::vector<std::uint16_t> chunk(std::min(count_, kScanTokens));
  for (std::size_t first = 0; first < count_; first += chunk.size()) {
    const std::size_t n = std::min(chunk.size(), count_ - first);
    read_checked(first, n, chunk.data());
    on_chunk(first, std::span<const std::uint16_t>(chunk.data(), n));
  }
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
